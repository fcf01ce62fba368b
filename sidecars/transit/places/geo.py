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
        """(distance, index) of the points within `meters`, nearest first (ties by index).

        The cells looked at wrap across the antimeridian (a stop at 179.99 is 1 km from
        -179.99 on the equator) and take every longitude when the circle reaches a pole."""
        if not self.points:
            return []
        dlat = meters / METERS_PER_DEGREE
        lat0 = math.floor((lat - dlat) / self.lat_step)
        lat1 = math.floor((lat + dlat) / self.lat_step)
        cells = self._cells
        if abs(lat) + dlat >= 89.0:
            # Near a pole every meridian is close: look at every cell of the latitude band.
            keys = [key for key in cells if lat0 <= key[0] <= lat1]
        else:
            dlon = dlat / math.cos(math.radians(abs(lat) + dlat))
            spans = [(lon - dlon, lon + dlon)]
            if lon - dlon < -180.0:
                spans.append((lon - dlon + 360.0, 180.0))
            if lon + dlon > 180.0:
                spans.append((-180.0, lon + dlon - 360.0))
            keys = [
                (a, b)
                for west, east in spans
                for a in range(lat0, lat1 + 1)
                for b in range(
                    math.floor(west / self.lon_step), math.floor(east / self.lon_step) + 1
                )
            ]
        found: list[tuple[float, int]] = []
        for key in dict.fromkeys(keys):
            for i in cells.get(key, ()):
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
