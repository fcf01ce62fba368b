"""Tests of the transit API's metrics."""
