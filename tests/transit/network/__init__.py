"""Tests of the transit API's network."""
