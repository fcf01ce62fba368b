"""The network derived from one static feed: lines, routes, patterns, stops, shapes, schedules.

Built once per feed version off the request path and never mutated afterwards (apart from the
memo of encoded bodies), so a request only reads it. How a plain GTFS feed maps to the API's
lines, routes and patterns is in patterns.py (sidecars/transit/README.md has the long form);
distances are metres (geometry.py).
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Callable, Iterable
from datetime import date
from typing import Protocol, TypeVar
from zoneinfo import ZoneInfo

from .bodies import Body, BodyCache
from .geometry import Line as GeoLine
from .geometry import cumulative_m, stop_distances
from .gtfs import NO_DROP_OFF, NO_PICKUP, RawFeed
from .gtfs.tables import StopRow
from .patterns import Patterns, Version, prepend, route_colors, route_line
from .places.geo import GridIndex
from .places.names import locality_id
from .schemas import (
    GeoFeature,
    Line,
    LineString,
    PathItem,
    Pattern,
    Route,
    ScheduleItem,
    Shape,
    ShapePoint,
    Stop,
    TripGroup,
    json_encoder,
    sorted_encoder,
)
from .times import time_24h, yyyymmdd

DAY_MEMO_ENTRIES = 2048
# Budget of encoded pattern bodies kept per worker (shapes get a quarter of it).
BODY_CACHE_BYTES = 256 * 1024 * 1024
T = TypeVar("T")
_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders embedded numbers by value (`2` before `10`), like the real API."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _DIGITS.split(text) if p)


def _ordered(values: Iterable[str]) -> list[str]:
    return sorted({v for v in values if v}, key=natural_key)


class StopLocations(Protocol):
    """Resolves a stop's location columns to the ids of `/v2/locations/*`."""

    def resolve_stop(self, row: StopRow) -> tuple[str, str, str, bool]:
        """(district_id, municipality_id, locality_id, whether every place the stop names was
        found); a place the lists do not have is served as an empty id."""


class Network:
    """Everything the static endpoints serve for one feed version."""

    def __init__(
        self,
        raw: RawFeed,
        version: str,
        loaded_at: float,
        timezone: str | None,
        locations: StopLocations | None = None,
    ) -> None:
        self.raw = raw
        self.version = version
        self.loaded_at = loaded_at
        self.tz = ZoneInfo(timezone or raw.timezone)
        # The API's agency ids (a single agency without agency_id is "1").
        self.agency_ids = raw.agency_ids
        self.agency_id = raw.agency_ids[0]
        self.stop_index = raw.stop_index
        self.trip_index = raw.trip_index
        self._times_24h: list[str] | None = None
        self._active: dict[date, bytearray] = {}
        self._pattern_bodies = BodyCache(BODY_CACHE_BYTES)
        self._shape_bodies = BodyCache(BODY_CACHE_BYTES // 4)
        self._gtfs_body: Body | None = None
        self._day_memo: dict[tuple, object] = {}
        # Whole days a trip can run past its service day's start (25:30 -> 1): how many
        # service days before the operational day can still have departures in it.
        self.span_days = max(raw.time_seconds, default=0) // 86400
        derived = Patterns(raw)
        self.patterns = derived.patterns
        self.pattern_trips = derived.pattern_trips
        self.trip_pattern = derived.trip_pattern
        self.trip_line = derived.trip_line
        # pattern id -> the API route it belongs to (the GTFS route's id), and back
        self.pattern_route = derived.pattern_route
        self.route_patterns: dict[str, list[str]] = {
            route.id: route.pattern_ids for route in derived.routes
        }
        self._routes = derived.routes
        self._stop_sets = derived.stop_sets
        self._stop_places = self._resolve_places(locations)
        self._index_stops()
        self._encode_lists()

    def route_line(self, route: int) -> str:
        """The line id of a GTFS route (by index)."""
        return route_line(self.raw, route)

    # -- derivation -------------------------------------------------------------------------

    def _resolve_places(self, locations: StopLocations | None) -> list[tuple[str, str, str]]:
        """Per stop: district, municipality and locality ids that join `/v2/locations/*`."""
        raw = self.raw
        if locations is None:
            # No location lists: the feed's ids as they are, and a locality known by name the
            # id of the lists derived from the stops (places/locations.py, derived_lists).
            return [
                (
                    r.district_id,
                    r.municipality_id,
                    r.locality_id
                    or (locality_id(r.municipality_id, r.locality) if r.locality else ""),
                )
                for r in raw.stops
            ]
        out = []
        for i, row in enumerate(raw.stops):
            district, municipality, locality, complete = locations.resolve_stop(row)
            if not complete:
                raw.report.add(
                    "location_not_found",
                    "stops.txt",
                    None,
                    f"stop {raw.stop_ids[i]!r}: district {row.district_id!r}, municipality "
                    f"{row.municipality_id or row.municipality_name!r}, locality "
                    f"{row.locality_id or row.locality!r}",
                )
            out.append((district, municipality, locality))
        return out

    def _index_stops(self) -> None:
        """Per stop: the lines/routes/patterns serving it and its stop_times (CSR arrays)."""
        raw = self.raw
        nstops = len(raw.stop_ids)
        lines: list[set[str]] = [set() for _ in range(nstops)]
        routes: list[set[str]] = [set() for _ in range(nstops)]
        patterns: list[set[str]] = [set() for _ in range(nstops)]
        for (pattern_id, stops_key), route in self._stop_sets.items():
            stops = array("i")
            stops.frombytes(stops_key)
            line_id, route_id = self.route_line(route), self.pattern_route[pattern_id]
            for s in set(stops):
                lines[s].add(line_id)
                routes[s].add(route_id)
                patterns[s].add(pattern_id)
        self.stop_lines, self.stop_routes, self.stop_patterns = lines, routes, patterns
        # Counting sort of stop_time positions by stop: two linear passes, no per-row objects.
        counts = array("i", [0]) * (nstops + 1)
        for s in raw.st_stop:
            counts[s + 1] += 1
        for i in range(nstops):
            counts[i + 1] += counts[i]
        fill = array("i", counts)
        positions = array("i", [0]) * len(raw.st_stop)
        for pos, s in enumerate(raw.st_stop):
            positions[fill[s]] = pos
            fill[s] += 1
        self.stop_offsets, self.stop_positions = counts, positions

    def _encode_lists(self) -> None:
        raw = self.raw
        stops = []
        for i, srow in enumerate(raw.stops):
            district, municipality, locality = self._stop_places[i]
            stop = Stop(
                district_id=district,
                facilities=list(srow.facilities),
                id=raw.stop_ids[i],
                lat=srow.lat,
                line_ids=_ordered(self.stop_lines[i]),
                locality_id=locality,
                lon=srow.lon,
                long_name=srow.name,
                municipality_id=municipality,
                pattern_ids=_ordered(self.stop_patterns[i]),
                region_id=srow.region_id,
                route_ids=_ordered(self.stop_routes[i]),
                short_name=srow.short_name,
                tts_name=srow.tts_name,
                wheelchair_boarding=srow.wheelchair_boarding,
            )
            # Feeds without Carris Metropolitana's status column list stops in operation.
            stop.operational_status = srow.operational_status or "active"
            stops.append(stop)
        stops.sort(key=lambda s: natural_key(s.id))
        # Each stop encoded once: the whole list, and any subset a query asks for, is these
        # bytes joined (msgspec writes a list as its items joined by commas).
        self.stop_json = [json_encoder.encode(s) for s in stops]
        self.stops_body = Body(b"[" + b",".join(self.stop_json) + b"]")
        self.stop_grid = GridIndex([(s.lat, s.lon) for s in stops], cell_meters=500.0)

        pattern_stops: dict[str, set[int]] = {}
        for pattern_id, versions in self.patterns.items():
            served = pattern_stops.setdefault(pattern_id, set())
            for v in versions:
                served.update(v.stops)
        routes: list[Route] = []
        line_acc: dict[str, dict] = {}
        for api in self._routes:
            row = raw.routes[api.route]
            color, text_color = route_colors(raw, api.route, "#FFFFFF")
            stops_of = set().union(*(pattern_stops[p] for p in api.pattern_ids))
            loc = self._locations(stops_of)
            routes.append(
                Route(
                    color=color,
                    district_ids=loc[0],
                    facilities=loc[1],
                    id=api.id,
                    line_id=api.line_id,
                    locality_ids=loc[2],
                    long_name=row.long_name,
                    municipality_ids=loc[3],
                    pattern_ids=list(api.pattern_ids),
                    region_ids=loc[4],
                    route_ids=[api.id],
                    short_name=row.short_name,
                    stop_ids=[],
                    text_color=text_color,
                    tts_name=row.long_name,
                )
            )
            acc = line_acc.get(api.line_id)
            if acc is None:
                acc = line_acc[api.line_id] = {
                    "route": api.route,
                    "route_ids": [],
                    "pattern_ids": [],
                    "stops": set(),
                }
            prepend(acc["route_ids"], api.id)
            for pattern_id in reversed(api.pattern_ids):
                prepend(acc["pattern_ids"], pattern_id)
            acc["stops"].update(stops_of)
        routes.sort(key=lambda r: natural_key(r.id))
        lines: list[Line] = []
        for line_id, acc in line_acc.items():
            row = raw.routes[acc["route"]]
            color, text_color = route_colors(raw, acc["route"], "#FFFFFF")
            loc = self._locations(acc["stops"])
            long_name = row.line_long_name or row.long_name
            lines.append(
                Line(
                    color=color,
                    district_ids=loc[0],
                    facilities=loc[1],
                    id=line_id,
                    locality_ids=loc[2],
                    long_name=long_name,
                    municipality_ids=loc[3],
                    pattern_ids=acc["pattern_ids"],
                    region_ids=loc[4],
                    route_ids=acc["route_ids"],
                    short_name=row.line_short_name or row.short_name or line_id,
                    stop_ids=[],
                    text_color=text_color,
                    tts_name=long_name,
                )
            )
        lines.sort(key=lambda line: natural_key(line.id))
        self.routes_body = Body(sorted_encoder.encode(routes))
        self.lines_body = Body(json_encoder.encode(lines))
        self.line_count, self.route_count = len(lines), len(routes)

    def _locations(
        self, stops: Iterable[int]
    ) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
        """District, facility, locality, municipality and region ids of a set of stops."""
        stops = list(stops)
        rows = [self.raw.stops[s] for s in stops]
        places = [self._stop_places[s] for s in stops]
        facilities: dict[str, None] = {}
        for row in rows:
            for f in row.facilities:
                facilities[f] = None
        return (
            _ordered(p[0] for p in places),
            list(facilities),
            _ordered(p[2] for p in places),
            _ordered(p[1] for p in places),
            _ordered(r.region_id for r in rows),
        )

    def stops_near(self, lat: float, lon: float, meters: float) -> bytes:
        """`/v2/stops?lat&lon&radius`: the stops within `meters`, nearest first."""
        hits = self.stop_grid.within(lat, lon, meters)
        return b"[" + b",".join(self.stop_json[i] for _, i in hits) + b"]"

    # -- calendars --------------------------------------------------------------------------

    def dates_of(self, services: Iterable[int]) -> list[str]:
        """Sorted union of the service dates (`YYYYMMDD`) of some services."""
        dates: set[str] = set()
        for s in services:
            dates |= self.raw.service_dates[s]
        return sorted(dates)

    def active_services(self, day: date) -> bytearray:
        """Flags, by service index, of the services running on a day."""
        flags = self._active.get(day)
        if flags is None:
            text = yyyymmdd(day)
            flags = bytearray(text in dates for dates in self.raw.service_dates)
            if len(self._active) > 8:
                self._active.clear()
            self._active[day] = flags
        return flags

    def day_memo(self, key: tuple, factory: Callable[[], T]) -> T:
        """Memoise a value derived from this feed version for one day (schedules of a stop or
        a pattern, encoded bodies); bounded so a crawl over every stop cannot grow it forever."""
        try:
            return self._day_memo[key]  # type: ignore[return-value]
        except KeyError:
            pass
        value = factory()
        if len(self._day_memo) >= DAY_MEMO_ENTRIES:
            self._day_memo.clear()
        self._day_memo[key] = value
        return value

    @property
    def times_24h(self) -> list[str]:
        """`arrival_time_24h` of every interned time string."""
        if self._times_24h is None or len(self._times_24h) != len(self.raw.time_strings):
            self._times_24h = [time_24h(t) for t in self.raw.time_strings]
        return self._times_24h

    # -- encoded bodies ---------------------------------------------------------------------

    def pattern_body(self, pattern_id: str) -> Body | None:
        """`/v2/patterns/:id` body, encoded on first request and kept for this feed version."""
        found, body = self._pattern_bodies.get(pattern_id)
        if found:
            return body
        versions = self.patterns.get(pattern_id)
        if versions is not None:
            body = Body(json_encoder.encode([self._pattern(v) for v in versions]))
        self._pattern_bodies.put(pattern_id, body)
        return body

    def _pattern(self, v: Version) -> Pattern:
        raw = self.raw
        row = raw.routes[v.route]
        color, text_color = route_colors(raw, v.route, "#000000")
        loc = self._locations(v.stops)
        first, count = raw.trip_first[v.first_trip], raw.trip_count[v.first_trip]
        distances = self._path_distances(v)
        path = []
        for k, pos in enumerate(range(first, first + count)):
            flags = raw.st_flags[pos]
            path.append(
                PathItem(
                    allow_drop_off=not flags & NO_DROP_OFF,
                    allow_pickup=not flags & NO_PICKUP,
                    distance=distances[k],
                    distance_delta=round(distances[k] - distances[k - 1], 1) if k else 0.0,
                    stop_id=raw.stop_ids[raw.st_stop[pos]],
                    stop_sequence=raw.st_seq[pos],
                )
            )
        times, times_24h = raw.time_strings, self.times_24h
        groups = []
        for g in v.groups.values():
            gfirst, gcount = raw.trip_first[g.first_trip], raw.trip_count[g.first_trip]
            schedule = [
                ScheduleItem(
                    arrival_time=times[raw.st_time[p]],
                    arrival_time_24h=times_24h[raw.st_time[p]],
                    stop_id=raw.stop_ids[raw.st_stop[p]],
                    stop_sequence=raw.st_seq[p],
                )
                for p in range(gfirst, gfirst + gcount)
            ]
            groups.append(
                TripGroup(
                    schedule=schedule,
                    service_ids=[raw.service_ids[s] for s in g.services],
                    trip_ids=list(g.trip_ids),
                    valid_on=self.dates_of(g.services),
                    version_id=v.version_id,
                )
            )
        line_id = self.route_line(v.route)
        return Pattern(
            color=color,
            direction_id=v.direction,
            district_ids=loc[0],
            facilities=loc[1],
            headsign=v.headsign,
            id=v.pattern_id,
            line_id=line_id,
            locality_ids=loc[2],
            long_name=row.line_long_name or row.long_name,
            municipality_ids=loc[3],
            path=path,
            region_ids=loc[4],
            route_id=v.route_id,
            shape_id=v.shape_id,
            short_name=row.line_short_name or row.short_name or line_id,
            text_color=text_color,
            trips=groups,
            tts_headsign=v.headsign,
            valid_on=self.dates_of(v.services),
            version_id=v.version_id,
        )

    def _path_distances(self, v: Version) -> list[float]:
        """Metres along the trip to each stop of a version's path (0.1 m precision): the
        feed's shape_dist_traveled when its unit is known and the trip has it at every stop,
        else the stops placed on the shape, else the straight lines between the stops."""
        raw = self.raw
        first, count = raw.trip_first[v.first_trip], raw.trip_count[v.first_trip]
        factor, dist = raw.dist_factor, raw.st_dist
        if factor is not None and dist is not None:
            values = dist[first : first + count]
            if all(d == d for d in values):  # no NaN (blank, or reset by validation)
                return [round(d * factor, 1) for d in values]
        cols = raw.shapes.get(v.shape_id)
        line = GeoLine(cols.lat, cols.lon) if cols is not None else None
        stops = [raw.stops[raw.st_stop[p]] for p in range(first, first + count)]
        return [round(d, 1) for d in stop_distances([(s.lat, s.lon) for s in stops], line)]

    def shape_body(self, shape_id: str) -> Body | None:
        """`/v2/shapes/:id` body, encoded on first request."""
        found, body = self._shape_bodies.get(shape_id)
        if found:
            return body
        cols = self.raw.shapes.get(shape_id)
        if cols is not None:
            body = Body(json_encoder.encode(self._shape(shape_id, cols)))
        self._shape_bodies.put(shape_id, body)
        return body

    def _shape(self, shape_id: str, cols) -> Shape:  # type: ignore[no-untyped-def]
        seq, lat, lon, dist = cols
        cumulative = cumulative_m(lat, lon)
        factor = self.raw.dist_factor
        # Metres: the feed's distances in their unit, or measured along the line.
        if dist is not None and factor is not None:
            dists = [round(d * factor, 1) for d in dist]
        else:
            dists = [round(d, 1) for d in cumulative]
        return Shape(
            extension=math.floor(cumulative[-1]) if cumulative else 0,
            geojson=GeoFeature(
                geometry=LineString(coordinates=[(lon[i], lat[i]) for i in range(len(seq))])
            ),
            points=[
                ShapePoint(
                    shape_dist_traveled=dists[i],
                    shape_pt_lat=lat[i],
                    shape_pt_lon=lon[i],
                    shape_pt_sequence=seq[i],
                )
                for i in range(len(seq))
            ],
            shape_id=shape_id,
        )

    def gtfs_body(self) -> Body:
        """The feed zip as served by `/v2/gtfs`."""
        if self._gtfs_body is None:
            self._gtfs_body = Body(self.raw.files.zip_bytes())
        return self._gtfs_body

    # -- schedules for one day --------------------------------------------------------------

    def stop_arrivals(self, stop: int, day: date) -> list[int]:
        """Positions (in the stop_times columns) of the stop's arrivals on a service day."""
        active = self.active_services(day)
        trip_service, st_trip = self.raw.trip_service, self.raw.st_trip
        positions = self.stop_positions[self.stop_offsets[stop] : self.stop_offsets[stop + 1]]
        return [p for p in positions if active[trip_service[st_trip[p]]]]

    def pattern_arrivals(self, pattern_id: str, day: date) -> list[int] | None:
        """Positions of every stop of every trip of the pattern running on a day; None if the
        pattern is unknown."""
        trips = self.pattern_trips.get(pattern_id)
        if trips is None:
            return None
        active = self.active_services(day)
        raw = self.raw
        out: list[int] = []
        for ti in trips:
            if active[raw.trip_service[ti]]:
                first = raw.trip_first[ti]
                out.extend(range(first, first + raw.trip_count[ti]))
        return out
