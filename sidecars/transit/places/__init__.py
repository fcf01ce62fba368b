"""Locations and facilities of the transit API: `/v2/locations/*` and `/v2/facilities*`."""
