"""Lines, routes, patterns and pattern versions derived from a feed's trips.

- line: Carris Metropolitana `routes.line_id` when present, else the GTFS route's short name
  (else its id);
- pattern: `trips.pattern_id` when present, else one pattern per GTFS route and direction,
  id `<route_id>_<direction_id>`: Carris Metropolitana's API gives a route at most two
  patterns, one per direction, and clients rely on it, so a plain feed's variants of a
  direction (other stops, another shape) are versions of that direction's pattern, as CM's
  versions of a pattern differ by headsign and shape;
- route: the GTFS route, under its own id, with every pattern of its trips (an id the operator
  does not publish would not join its feed, GTFS-RT or alerts);
- pattern version: the trips of a pattern sharing headsign, shape and colours (the real
  service's key) and, for a derived pattern, stop sequence (so each variant's `path` is its
  own), `version_id` being the sha256 of the same JSON the real service hashes (a derived
  variant's stop list added to it);
- trip group: the trips of a version with identical times at every stop.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import msgspec

from .gtfs import RawFeed

_version_encoder = msgspec.json.Encoder()


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
class Group:
    """Trips of one version with identical times at every stop."""

    first_trip: int
    trip_ids: list[str]
    services: list[int]


@dataclass(slots=True)
class Version:
    """One version of a pattern: the trips sharing headsign, shape and colours."""

    pattern_id: str
    route: int  # the GTFS route (names, colours, agency)
    direction: int
    headsign: str
    shape_id: str
    first_trip: int
    route_id: str = ""  # the API route
    version_id: str = ""
    services: set[int] = field(default_factory=set)
    groups: dict[bytes, Group] = field(default_factory=dict)
    stops: set[int] = field(default_factory=set)
    # A derived pattern's variant: its stop sequence is part of its identity.
    variant: bytes = b""


@dataclass(slots=True)
class ApiRoute:
    """A route of `/v2/routes`: a GTFS route, or one variant of it, with at most one pattern
    per direction when derived."""

    id: str
    route: int  # the GTFS route
    line_id: str
    pattern_ids: list[str] = field(default_factory=list)  # newest first


def prepend(values: list[str], value: str) -> None:
    """Add a value in front unless present: the real service builds these lists as
    `new Set([new, ...old])`, newest first."""
    if value not in values:
        values.insert(0, value)


def route_line(raw: RawFeed, route: int) -> str:
    """The line id of a GTFS route."""
    row = raw.routes[route]
    return row.line_id or row.short_name or row.route_id


def route_colors(raw: RawFeed, route: int, text_default: str) -> tuple[str, str]:
    """`#`-prefixed colour and text colour of a GTFS route (black when absent)."""
    row = raw.routes[route]
    color = "#" + row.color if row.color else "#000000"
    text = "#" + row.text_color if row.text_color else text_default
    return color, text


class Patterns:
    """The derivation of one feed version."""

    def __init__(self, raw: RawFeed) -> None:
        self.raw = raw
        self.patterns: dict[str, list[Version]] = {}
        self.pattern_trips: dict[str, list[int]] = {}
        self.trip_pattern: list[str] = [""] * len(raw.trip_ids)
        self.trip_line: list[str] = [route_line(raw, r) for r in raw.trip_route]
        # (pattern, stop list) -> GTFS route: the stops each pattern serves.
        self.stop_sets: dict[tuple[str, bytes], int] = {}
        self._scan()
        self.routes = self._pair_routes()
        self.pattern_route: dict[str, str] = {
            p: route.id for route in self.routes for p in route.pattern_ids
        }
        for versions in self.patterns.values():
            for v in versions:
                v.route_id = self.pattern_route[v.pattern_id]
                v.version_id = self._version_id(v)

    def _scan(self) -> None:
        raw = self.raw
        st_stop, st_time = raw.st_stop, raw.st_time
        versions: dict[tuple[str, int, int, str, str, bytes], Version] = {}
        # Patterns in order of discovery, with their GTFS route, direction, trip count and
        # whether the feed named them.
        self._found: dict[str, list] = {}
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
            named = bool(pattern_id)
            if not named:
                pattern_id = f"{raw.routes[route].route_id}_{direction}"
            self.trip_pattern[ti] = pattern_id
            self.pattern_trips.setdefault(pattern_id, []).append(ti)
            found = self._found.get(pattern_id)
            if found is None:
                self._found[pattern_id] = [route, direction, 1, named]
            else:
                found[2] += 1
            headsign = raw.trip_headsign[ti]
            variant = b"" if named else stops_key
            vkey = (pattern_id, route, direction, headsign, shape, variant)
            version = versions.get(vkey)
            if version is None:
                version = versions[vkey] = Version(
                    pattern_id, route, direction, headsign, shape, ti, variant=variant
                )
                self.patterns.setdefault(pattern_id, []).append(version)
            service = raw.trip_service[ti]
            version.services.add(service)
            gkey = stops_key + st_time[first : first + count].tobytes()
            group = version.groups.get(gkey)
            if group is None:
                version.groups[gkey] = Group(ti, [trip_id], [service])
            else:
                group.trip_ids.insert(0, trip_id)
                if service not in group.services:
                    group.services.insert(0, service)
            skey = (pattern_id, stops_key)
            if skey not in self.stop_sets:
                self.stop_sets[skey] = route
                version.stops.update(stops)

    def _pair_routes(self) -> list[ApiRoute]:
        """The API routes: one per GTFS route, with the GTFS route's id (so every route id the
        API names joins `/v2/gtfs` and GTFS-RT) and all its patterns, newest first."""
        raw = self.raw
        order = {p: i for i, p in enumerate(self._found)}
        by_route: dict[int, list[str]] = {}
        for pattern_id, (route, *_rest) in self._found.items():
            by_route.setdefault(route, []).append(pattern_id)
        out: list[ApiRoute] = []
        for route, pattern_ids in by_route.items():
            api = ApiRoute(raw.routes[route].route_id, route, route_line(raw, route))
            for p in sorted(pattern_ids, key=order.__getitem__):
                prepend(api.pattern_ids, p)
            out.append(api)
        return out

    def _version_id(self, v: Version) -> str:
        raw = self.raw
        row = raw.routes[v.route]
        key = _VersionKey(
            color=route_colors(raw, v.route, "")[0],
            direction_id=v.direction,
            headsign=v.headsign,
            id=v.pattern_id,
            line_id=route_line(raw, v.route),
            route_id=v.route_id,
            shape_id=v.shape_id,
            short_name=row.short_name,
            text_color=row.text_color,
        )
        digest = hashlib.sha256(_version_encoder.encode(key))
        if v.variant:
            # Variants of a derived pattern may share headsign and shape: their stops
            # tell them apart.
            stops = memoryview(v.variant).cast("i")
            digest.update(("\x1e" + "\x1f".join(raw.stop_ids[s] for s in stops)).encode())
        return digest.hexdigest()
