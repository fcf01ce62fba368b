"""Tests of the transit sidecar."""
