"""Distances in metres: great-circle lengths, the unit of a feed's `shape_dist_traveled`, and
the distance of each stop of a trip along its shape.

The GTFS reference leaves the unit of `shape_dist_traveled` to the producer (Carris
Metropolitana writes kilometres, many feeds metres or feet). The API serves metres, so the unit
is told from the geometry: the feed's distance along a shape, divided by the shape's length in
metres, is close to 1 m, 1 km, 1 mile or 1 foot per unit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

EARTH_RADIUS_M = 6371008.8
# Metres per unit of shape_dist_traveled, for TRANSIT_SHAPE_DIST_UNIT.
UNITS = {"m": 1.0, "km": 1000.0, "mi": 1609.344, "ft": 0.3048}
# A unit is taken when the feed's distances times its factor are within this ratio of the
# measured length (roads run longer than straight lines between stops, never 3 times).
UNIT_TOLERANCE = 3.0
# Lines shorter than this say little about the unit.
MIN_SAMPLE_M = 200.0


def haversine_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in metres."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(a)))


def cumulative_m(lat: Sequence[float], lon: Sequence[float]) -> list[float]:
    """Metres from the first point to each point along the line through them."""
    out = [0.0]
    total = 0.0
    for i in range(1, len(lat)):
        total += haversine_m(lat[i - 1], lon[i - 1], lat[i], lon[i])
        out.append(total)
    return out


def detect_unit(samples: list[tuple[float, float]]) -> float | None:
    """Metres per unit from (feed distance, measured metres) pairs, or None when no unit fits.

    The median ratio is matched to the nearest unit on a log scale, and taken if within
    UNIT_TOLERANCE of it.
    """
    ratios = [metres / dist for dist, metres in samples if dist > 0 and metres >= MIN_SAMPLE_M]
    if not ratios:
        return None
    ratio = statistics.median(ratios)
    factor = min(UNITS.values(), key=lambda f: abs(math.log(ratio / f)))
    return factor if abs(math.log(ratio / factor)) <= math.log(UNIT_TOLERANCE) else None


class Line:
    """A shape as a polyline in local metres, with the distance along it of every vertex."""

    def __init__(self, lat: Sequence[float], lon: Sequence[float]) -> None:
        self.along = cumulative_m(lat, lon)
        # Equirectangular projection around the shape: good to a few metres over a city.
        self.lat0 = lat[0] if len(lat) else 0.0
        self.kx = math.cos(math.radians(self.lat0)) * EARTH_RADIUS_M * math.pi / 180
        self.ky = EARTH_RADIUS_M * math.pi / 180
        self.x = [v * self.kx for v in lon]
        self.y = [v * self.ky for v in lat]

    def locate(self, lat: float, lon: float, start: int) -> tuple[float, int]:
        """(metres along the line, segment index) of the point of the line nearest to a stop,
        looking at segments from `start` on (stops come in order along a trip).

        Where the line passes the stop twice (loops, out-and-back), the earliest pass within
        25 m of the closest one is taken; the search ends 5 km past a pass within 100 m.
        """
        n = len(self.x)
        if n < 2:
            return 0.0, 0
        px, py = lon * self.kx, lat * self.ky
        xs, ys, along = self.x, self.y, self.along
        best_d, best_i = math.inf, start
        found: list[tuple[float, int, float]] = []
        for i in range(start, n - 1):
            x1, y1 = xs[i], ys[i]
            dx, dy = xs[i + 1] - x1, ys[i + 1] - y1
            length2 = dx * dx + dy * dy
            t = ((px - x1) * dx + (py - y1) * dy) / length2 if length2 else 0.0
            t = 0.0 if t < 0 else 1.0 if t > 1 else t
            d = math.hypot(x1 + t * dx - px, y1 + t * dy - py)
            found.append((d, i, t))
            if d < best_d:
                best_d, best_i = d, i
            elif best_d < 100 and along[i] - along[best_i] > 5000:
                break
        for d, i, t in found:
            if d <= best_d + 25:
                return along[i] + t * (along[i + 1] - along[i]), i
        return 0.0, start  # not reached: found is never empty when n >= 2


def stop_distances(stops: Sequence[tuple[float, float]], line: Line | None) -> list[float]:
    """Metres along the trip of each stop: projected on the shape when there is one, else
    along the straight lines between the stops."""
    if line is None or len(line.x) < 2:
        if not stops:
            return []
        return cumulative_m([s[0] for s in stops], [s[1] for s in stops])
    out: list[float] = []
    segment = 0
    previous = 0.0
    for lat, lon in stops:
        along, segment = line.locate(lat, lon, segment)
        # Never backwards: a stop placed slightly before the previous one's projection.
        previous = max(previous, along)
        out.append(previous)
    return out
