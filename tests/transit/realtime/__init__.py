"""Tests of the transit API's realtime."""
