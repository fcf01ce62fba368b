"""Points near a position: a uniform latitude/longitude grid over haversine distances.

A facility asks for the stops within a walking distance; comparing it with every stop of a
12 000-stop feed is 12 000 haversines, while the grid only measures the few cells around it.
"""

from __future__ import annotations

import math

from ..geometry import haversine_m

METERS_PER_DEGREE = 111_320.0


class GridIndex:
    """Indexes points by grid cell; queries measure only the cells a radius can reach."""

    def __init__(self, points: list[tuple[float, float]], cell_meters: float = 250.0) -> None:
        self.points = points
        self.lat_step = cell_meters / METERS_PER_DEGREE
        # Longitude degrees shrink with latitude: size cells for the most poleward point so a
        # cell is never narrower than `cell_meters` anywhere in the data.
        top = max((abs(lat) for lat, _ in points), default=0.0)
        self.lon_step = self.lat_step / max(math.cos(math.radians(min(top, 89.0))), 0.01)
        self._cells: dict[tuple[int, int], list[int]] = {}
        for i, (lat, lon) in enumerate(points):
            self._cells.setdefault(self._cell(lat, lon), []).append(i)

    def _cell(self, lat: float, lon: float) -> tuple[int, int]:
        return (math.floor(lat / self.lat_step), math.floor(lon / self.lon_step))

    def within(self, lat: float, lon: float, meters: float) -> list[tuple[float, int]]:
        """(distance, index) of the points within `meters`, nearest first (ties by index)."""
        if not self.points:
            return []
        dlat = meters / METERS_PER_DEGREE
        cos = max(math.cos(math.radians(min(abs(lat) + dlat, 89.0))), 0.01)
        dlon = dlat / cos
        lat0, lon0 = self._cell(lat - dlat, lon - dlon)
        lat1, lon1 = self._cell(lat + dlat, lon + dlon)
        found: list[tuple[float, int]] = []
        cells = self._cells
        for a in range(lat0, lat1 + 1):
            for b in range(lon0, lon1 + 1):
                for i in cells.get((a, b), ()):
                    plat, plon = self.points[i]
                    d = haversine_m(lat, lon, plat, plon)
                    if d <= meters:
                        found.append((d, i))
        found.sort()
        return found

    def nearest(self, lat: float, lon: float, meters: float) -> int | None:
        """Index of the nearest point within `meters`, or None."""
        hits = self.within(lat, lon, meters)
        return hits[0][1] if hits else None
