"""The network derived from one static feed: lines, routes, patterns, stops, shapes, schedules.

Built once per feed version off the request path and never mutated afterwards (apart from the
memo of encoded bodies), so a request only reads it. How a plain GTFS feed maps to the API
(sidecars/transit/README.md has the long form):

- line: Carris Metropolitana `routes.line_id` when present, else the route's short name;
- pattern: `trips.pattern_id` when present, else one pattern per distinct (route, direction,
  shape, stop sequence), with the id `<route_id>_<direction_id>_<8 hex of the stop list>` so it
  stays the same across feed versions while the stops do;
- pattern version: the trips of a pattern sharing headsign, shape and colours (the real
  service's key), `version_id` being the sha256 of the same JSON the real service hashes;
- trip group: the trips of a version with identical times at every stop.
"""

from __future__ import annotations

import hashlib
import math
import re
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date
from typing import TypeVar
from zoneinfo import ZoneInfo

import msgspec

from .bodies import Body, BodyCache
from .gtfs import NO_DROP_OFF, NO_PICKUP, RawFeed
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
)
from .times import time_24h, yyyymmdd

EARTH_RADIUS_M = 6371008.8
DAY_MEMO_ENTRIES = 2048
# Budget of encoded pattern bodies kept per worker (shapes get a quarter of it).
BODY_CACHE_BYTES = 256 * 1024 * 1024
T = TypeVar("T")
_DIGITS = re.compile(r"(\d+)")
_version_encoder = msgspec.json.Encoder()


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders embedded numbers by value (`2` before `10`), like the real API."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _DIGITS.split(text) if p)


def _ordered(values: Iterable[str]) -> list[str]:
    return sorted({v for v in values if v}, key=natural_key)


def haversine_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in metres."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(a)))


class _VersionKey(msgspec.Struct):
    """The JSON whose sha256 the real service uses as a pattern's version_id (field order kept)."""

    color: str
    direction_id: int
    headsign: str
    id: str
    line_id: str
    route_id: str
    shape_id: str
    short_name: str
    text_color: str


@dataclass(slots=True)
class _Group:
    first_trip: int
    trip_ids: list[str]
    services: list[int]


@dataclass(slots=True)
class _Version:
    pattern_id: str
    route: int
    direction: int
    headsign: str
    shape_id: str
    first_trip: int
    version_id: str = ""
    services: set[int] = field(default_factory=set)
    groups: dict[bytes, _Group] = field(default_factory=dict)
    stops: set[int] = field(default_factory=set)


def _prepend(values: list[str], value: str) -> None:
    # The real service builds these lists as `new Set([new, ...old])`: newest first.
    if value not in values:
        values.insert(0, value)


class Network:
    """Everything the static endpoints serve for one feed version."""

    def __init__(self, raw: RawFeed, version: str, loaded_at: float, timezone: str | None) -> None:
        self.raw = raw
        self.version = version
        self.loaded_at = loaded_at
        self.tz = ZoneInfo(timezone or raw.timezone)
        self.agency_id = next((a for a in raw.agency_ids if a), "")
        self.stop_index = raw.stop_index
        self.trip_index = raw.trip_index
        self._times_24h: list[str] | None = None
        self._active: dict[date, bytearray] = {}
        self._pattern_bodies = BodyCache(BODY_CACHE_BYTES)
        self._shape_bodies = BodyCache(BODY_CACHE_BYTES // 4)
        self._gtfs_body: Body | None = None
        self._day_memo: dict[tuple, object] = {}
        self._derive()
        self._index_stops()
        self._encode_lists()

    # -- derivation -------------------------------------------------------------------------

    def _route_line(self, route: int) -> str:
        row = self.raw.routes[route]
        return row.line_id or row.short_name or row.route_id

    def _derive(self) -> None:
        raw = self.raw
        st_stop, st_time = raw.st_stop, raw.st_time
        derived_ids: dict[tuple[int, int, str, bytes], str] = {}
        versions: dict[tuple[str, int, int, str, str], _Version] = {}
        self.patterns: dict[str, list[_Version]] = {}
        self.pattern_trips: dict[str, list[int]] = {}
        self.trip_pattern: list[str] = [""] * len(raw.trip_ids)
        self.trip_line: list[str] = [self._route_line(r) for r in raw.trip_route]
        route_patterns: dict[int, list[str]] = {}
        stop_sets: dict[tuple[str, bytes], tuple[int, str]] = {}
        for ti, trip_id in enumerate(raw.trip_ids):
            first, count = raw.trip_first[ti], raw.trip_count[ti]
            if count == 0:
                continue
            stops = st_stop[first : first + count]
            stops_key = stops.tobytes()
            route = raw.trip_route[ti]
            direction = raw.trip_direction[ti]
            shape = raw.trip_shape[ti]
            pattern_id = raw.trip_pattern[ti] if raw.trip_pattern is not None else ""
            if not pattern_id:
                dkey = (route, direction, shape, stops_key)
                pattern_id = derived_ids.get(dkey, "")
                if not pattern_id:
                    digest = hashlib.sha1(
                        ("\x1f".join(raw.stop_ids[s] for s in stops) + "\x1e" + shape).encode(),
                        usedforsecurity=False,
                    ).hexdigest()[:8]
                    pattern_id = f"{raw.routes[route].route_id}_{direction}_{digest}"
                    derived_ids[dkey] = pattern_id
            self.trip_pattern[ti] = pattern_id
            self.pattern_trips.setdefault(pattern_id, []).append(ti)
            headsign = raw.trip_headsign[ti]
            vkey = (pattern_id, route, direction, headsign, shape)
            version = versions.get(vkey)
            if version is None:
                version = versions[vkey] = _Version(
                    pattern_id, route, direction, headsign, shape, ti
                )
                self.patterns.setdefault(pattern_id, []).append(version)
                _prepend(route_patterns.setdefault(route, []), pattern_id)
            service = raw.trip_service[ti]
            version.services.add(service)
            gkey = stops_key + st_time[first : first + count].tobytes()
            group = version.groups.get(gkey)
            if group is None:
                version.groups[gkey] = _Group(ti, [trip_id], [service])
            else:
                group.trip_ids.insert(0, trip_id)
                if service not in group.services:
                    group.services.insert(0, service)
            skey = (pattern_id, stops_key)
            if skey not in stop_sets:
                stop_sets[skey] = (route, pattern_id)
                version.stops.update(stops)
        self._route_patterns = route_patterns
        self._stop_sets = stop_sets
        for version in versions.values():
            version.version_id = self._version_id(version)

    def _colors(self, route: int, text_default: str) -> tuple[str, str]:
        row = self.raw.routes[route]
        color = "#" + row.color if row.color else "#000000"
        text = "#" + row.text_color if row.text_color else text_default
        return color, text

    def _version_id(self, v: _Version) -> str:
        row = self.raw.routes[v.route]
        key = _VersionKey(
            color=self._colors(v.route, "")[0],
            direction_id=v.direction,
            headsign=v.headsign,
            id=v.pattern_id,
            line_id=self._route_line(v.route),
            route_id=row.route_id,
            shape_id=v.shape_id,
            short_name=row.short_name,
            text_color=row.text_color,
        )
        return hashlib.sha256(_version_encoder.encode(key)).hexdigest()

    def _index_stops(self) -> None:
        """Per stop: the lines/routes/patterns serving it and its stop_times (CSR arrays)."""
        raw = self.raw
        nstops = len(raw.stop_ids)
        lines: list[set[str]] = [set() for _ in range(nstops)]
        routes: list[set[str]] = [set() for _ in range(nstops)]
        patterns: list[set[str]] = [set() for _ in range(nstops)]
        for (pattern_id, stops_key), (route, _) in self._stop_sets.items():
            stops = array("i")
            stops.frombytes(stops_key)
            line_id, route_id = self._route_line(route), raw.routes[route].route_id
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
            stop = Stop(
                district_id=srow.district_id,
                facilities=list(srow.facilities),
                id=raw.stop_ids[i],
                lat=srow.lat,
                line_ids=_ordered(self.stop_lines[i]),
                locality_id=srow.locality_id,
                lon=srow.lon,
                long_name=srow.name,
                municipality_id=srow.municipality_id,
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
        self.stops_body = Body(json_encoder.encode(stops))

        route_stops: dict[int, set[int]] = {}
        for versions in self.patterns.values():
            for v in versions:
                route_stops.setdefault(v.route, set()).update(v.stops)
        routes: list[Route] = []
        line_acc: dict[str, dict] = {}
        for route, pattern_ids in self._route_patterns.items():
            row = raw.routes[route]
            color, text_color = self._colors(route, "#FFFFFF")
            loc = self._locations(route_stops.get(route, set()))
            line_id = self._route_line(route)
            routes.append(
                Route(
                    color=color,
                    district_ids=loc[0],
                    facilities=loc[1],
                    id=row.route_id,
                    line_id=line_id,
                    locality_ids=loc[2],
                    long_name=row.long_name,
                    municipality_ids=loc[3],
                    pattern_ids=list(pattern_ids),
                    region_ids=loc[4],
                    route_ids=[row.route_id],
                    short_name=row.short_name,
                    stop_ids=[],
                    text_color=text_color,
                    tts_name=row.long_name,
                )
            )
            acc = line_acc.get(line_id)
            if acc is None:
                acc = line_acc[line_id] = {
                    "route": route,
                    "route_ids": [],
                    "pattern_ids": [],
                    "stops": set(),
                }
            _prepend(acc["route_ids"], row.route_id)
            for pattern_id in reversed(pattern_ids):
                _prepend(acc["pattern_ids"], pattern_id)
            acc["stops"].update(route_stops.get(route, set()))
        routes.sort(key=lambda r: natural_key(r.id))
        lines: list[Line] = []
        for line_id, acc in line_acc.items():
            row = raw.routes[acc["route"]]
            color, text_color = self._colors(acc["route"], "#FFFFFF")
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
        self.routes_body = Body(json_encoder.encode(routes))
        self.lines_body = Body(json_encoder.encode(lines))
        self.line_count, self.route_count = len(lines), len(routes)

    def _locations(
        self, stops: Iterable[int]
    ) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
        """District, facility, locality, municipality and region ids of a set of stops."""
        rows = [self.raw.stops[s] for s in stops]
        facilities: dict[str, None] = {}
        for row in rows:
            for f in row.facilities:
                facilities[f] = None
        return (
            _ordered(r.district_id for r in rows),
            list(facilities),
            _ordered(r.locality_id for r in rows),
            _ordered(r.municipality_id for r in rows),
            _ordered(r.region_id for r in rows),
        )

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

    def _pattern(self, v: _Version) -> Pattern:
        raw = self.raw
        row = raw.routes[v.route]
        color, text_color = self._colors(v.route, "#000000")
        loc = self._locations(v.stops)
        first, count = raw.trip_first[v.first_trip], raw.trip_count[v.first_trip]
        path = []
        previous = 0.0
        dist = raw.st_dist
        for pos in range(first, first + count):
            distance = float(dist[pos]) if dist is not None else 0.0
            flags = raw.st_flags[pos]
            path.append(
                PathItem(
                    allow_drop_off=not flags & NO_DROP_OFF,
                    allow_pickup=not flags & NO_PICKUP,
                    distance=distance,
                    distance_delta=distance - previous if pos > first else 0.0,
                    stop_id=raw.stop_ids[raw.st_stop[pos]],
                    stop_sequence=raw.st_seq[pos],
                )
            )
            previous = distance
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
        line_id = self._route_line(v.route)
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
            route_id=row.route_id,
            shape_id=v.shape_id,
            short_name=row.line_short_name or row.short_name or line_id,
            text_color=text_color,
            trips=groups,
            tts_headsign=v.headsign,
            valid_on=self.dates_of(v.services),
            version_id=v.version_id,
        )

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
        length = 0.0
        cumulative = [0.0]
        for i in range(1, len(seq)):
            length += haversine_m(lat[i - 1], lon[i - 1], lat[i], lon[i])
            cumulative.append(length)
        # Without shape_dist_traveled the feed's unit is unknown: give metres along the line.
        dists = list(dist) if dist is not None else cumulative
        return Shape(
            extension=math.floor(length),
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
