"""Tests of the transit API's places."""
