"""Parse and validate a static GTFS feed into compact columns.

A Carris-Metropolitana-sized feed has about four million stop_times, so stop_times are kept
as parallel `array` columns of small integers (trip, stop, sequence, interned time, flags)
instead of one object per row: the whole table costs tens of megabytes, and the derivations in
network.py work on slices of it. Any problem (missing file or column, malformed row, dangling
reference) is collected with its file and line; a feed with problems is rejected as a whole.
"""

from __future__ import annotations

import csv
import io
import math
import zipfile
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .schemas import FeedProblem
from .source import FeedFiles, SourceError
from .times import BadTime, format_time, parse_time, parse_yyyymmdd, yyyymmdd

REQUIRED_FILES = ("agency.txt", "stops.txt", "routes.txt", "trips.txt", "stop_times.txt")
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "agency.txt": ("agency_name", "agency_timezone"),
    "stops.txt": ("stop_id",),
    "routes.txt": ("route_id",),
    "trips.txt": ("route_id", "service_id", "trip_id"),
    "stop_times.txt": ("trip_id", "stop_id", "stop_sequence", "arrival_time"),
    "calendar.txt": (
        "service_id",
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
        "start_date",
        "end_date",
    ),
    "calendar_dates.txt": ("service_id", "date", "exception_type"),
    "shapes.txt": ("shape_id", "shape_pt_lat", "shape_pt_lon", "shape_pt_sequence"),
}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# Carris Metropolitana's 0/1 stop columns, in the order the real API lists facilities.
FACILITY_COLUMNS = (
    ("near_health_clinic", "health_clinic"),
    ("near_hospital", "hospital"),
    ("near_university", "university"),
    ("near_school", "school"),
    ("near_police_station", "police_station"),
    ("near_fire_station", "fire_station"),
    ("near_shopping", "shopping"),
    ("near_historic_building", "historic_building"),
    ("near_transit_office", "transit_office"),
    ("subway", "subway"),
    ("light_rail", "light_rail"),
    ("train", "train"),
    ("boat", "boat"),
    ("airport", "airport"),
    ("bike_sharing", "bike_sharing"),
    ("bike_parking", "bike_parking"),
    ("car_parking", "car_parking"),
)
OPERATIONAL_STATUSES = {"ACTIVE": "active", "SEASONAL": "seasonal", "VOIDED": "voided"}
MAX_PROBLEMS = 50
NO_PICKUP = 1
NO_DROP_OFF = 2


class FeedError(Exception):
    """The feed was rejected; `problems` says where and why (capped, `total` counts all)."""

    def __init__(self, problems: list[FeedProblem], total: int | None = None) -> None:
        self.problems = problems
        self.total = len(problems) if total is None else total
        first = problems[0] if problems else None
        where = f"{first.file}:{first.line}" if first and first.line else (first and first.file)
        summary = f"{where}: {first.message}" if first else "invalid feed"
        super().__init__(f"{self.total} problem(s); first: {summary}")


class StopRow(NamedTuple):
    """The stop columns the API exposes."""

    name: str
    lat: float
    lon: float
    short_name: str
    tts_name: str
    district_id: str
    locality_id: str
    municipality_id: str
    region_id: str
    facilities: tuple[str, ...]
    wheelchair_boarding: bool
    operational_status: str | None


class RouteRow(NamedTuple):
    """The route columns the API exposes, with Carris Metropolitana's line columns if any."""

    route_id: str
    agency_id: str
    short_name: str
    long_name: str
    color: str
    text_color: str
    line_id: str
    line_short_name: str
    line_long_name: str


class ShapeColumns(NamedTuple):
    """One shape's points, sorted by sequence; `dist` is None when the feed gives none."""

    seq: array
    lat: array
    lon: array
    dist: array | None


@dataclass(slots=True)
class RawFeed:
    """A validated feed as columns. Row indexes are the positions in these lists."""

    files: FeedFiles
    timezone: str
    agency_ids: list[str]
    stop_ids: list[str]
    stop_index: dict[str, int]
    stops: list[StopRow]
    routes: list[RouteRow]
    route_index: dict[str, int]
    service_ids: list[str]
    service_dates: list[frozenset[str]]
    trip_ids: list[str]
    trip_index: dict[str, int]
    trip_route: array
    trip_service: array
    trip_direction: array
    trip_headsign: list[str]
    trip_shape: list[str]
    trip_block: list[str]
    trip_pattern: list[str] | None
    # stop_times, grouped by trip and ordered by stop_sequence within a trip
    trip_first: array
    trip_count: array
    st_trip: array
    st_stop: array
    st_seq: array
    st_time: array
    st_flags: array
    st_dist: array | None
    time_strings: list[str]
    time_seconds: array
    shapes: dict[str, ShapeColumns] = field(default_factory=dict)


class _Problems:
    """Collects problems, keeping the first MAX_PROBLEMS and counting the rest."""

    def __init__(self) -> None:
        self.items: list[FeedProblem] = []
        self.total = 0

    def add(self, file: str, line: int | None, message: str) -> None:
        self.total += 1
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(FeedProblem(file=file, line=line, message=message))

    def raise_if_any(self) -> None:
        if self.total:
            raise FeedError(self.items, self.total)


class _Table:
    """A csv reader over one file with its header resolved to column indexes."""

    def __init__(self, name: str, fh: IO[str], problems: _Problems) -> None:
        self.name = name
        self.reader = csv.reader(fh, strict=True)
        self.problems = problems
        try:
            header = next(self.reader, None)
        except csv.Error as exc:
            raise FeedError([FeedProblem(file=name, line=1, message=f"bad CSV: {exc}")]) from exc
        if not header:
            raise FeedError([FeedProblem(file=name, line=1, message="empty file, no header")])
        # Some producers pad header names (" exact_times"); the spec names are unpadded.
        self.columns = {h.strip(): i for i, h in enumerate(header)}
        missing = [c for c in REQUIRED_COLUMNS.get(name, ()) if c not in self.columns]
        if missing:
            raise FeedError(
                [
                    FeedProblem(
                        file=name,
                        line=1,
                        message=f"missing required column(s): {', '.join(missing)}",
                    )
                ]
            )
        self.width = len(header)

    def index(self, column: str) -> int:
        """Index of a column, -1 when absent."""
        return self.columns.get(column, -1)

    def rows(self) -> Iterator[list[str]]:
        """Data rows padded to the header width; short rows pad with blanks like most readers,
        long rows are problems. Blank lines are skipped."""
        width = self.width
        reader = self.reader
        try:
            for row in reader:
                n = len(row)
                if n == width:
                    yield row
                elif n == 0 or (n == 1 and not row[0].strip()):
                    continue
                elif n < width:
                    yield row + [""] * (width - n)
                else:
                    self.problems.add(
                        self.name, reader.line_num, f"{n} fields but the header has {width}"
                    )
        except csv.Error as exc:
            self.problems.add(self.name, reader.line_num, f"bad CSV: {exc}")
        except UnicodeDecodeError as exc:
            self.problems.add(self.name, reader.line_num, f"not UTF-8: {exc.reason}")

    @property
    def line(self) -> int:
        return self.reader.line_num


def _get(row: list[str], index: int) -> str:
    return row[index].strip() if index >= 0 else ""


def read_feed(files: FeedFiles) -> RawFeed:
    """Parse and validate every file the API needs; FeedError lists what is wrong."""
    problems = _Problems()
    names = files.names()
    missing = [name for name in REQUIRED_FILES if name not in names]
    if "calendar.txt" not in names and "calendar_dates.txt" not in names:
        missing.append("calendar.txt or calendar_dates.txt")
    if missing:
        raise FeedError(
            [FeedProblem(file=name, line=None, message="required file missing") for name in missing]
        )
    try:
        return _Reader(files, problems).read()
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        # A truncated or corrupt member only shows up when it is read.
        problems.add(files.origin, None, f"cannot read archive member: {exc}")
        raise FeedError(problems.items, problems.total) from exc


class _Reader:
    def __init__(self, files: FeedFiles, problems: _Problems) -> None:
        self.files = files
        self.problems = problems

    def table(self, name: str, fn: Callable[[_Table], None]) -> None:
        with self.files.open_text(name) as fh:
            fn(_Table(name, fh, self.problems))

    def read(self) -> RawFeed:
        self.table("agency.txt", self._agency)
        self.table("stops.txt", self._stops)
        self.table("routes.txt", self._routes)
        self.service_ids: list[str] = []
        self.service_index: dict[str, int] = {}
        self.service_sets: list[set[str]] = []
        if "calendar.txt" in self.files.names():
            self.table("calendar.txt", self._calendar)
        if "calendar_dates.txt" in self.files.names():
            self.table("calendar_dates.txt", self._calendar_dates)
        self.shapes: dict[str, ShapeColumns] = {}
        if "shapes.txt" in self.files.names():
            self.table("shapes.txt", self._shapes)
        self.table("trips.txt", self._trips)
        # Stop here when the small files are broken: their problems are the useful report.
        self.problems.raise_if_any()
        self.table("stop_times.txt", self._stop_times)
        self.problems.raise_if_any()
        self._group_stop_times()
        self.problems.raise_if_any()
        if "frequencies.txt" in self.files.names():
            self.table("frequencies.txt", self._frequencies)
            self.problems.raise_if_any()
        return RawFeed(
            files=self.files,
            timezone=self.timezone,
            agency_ids=self.agency_ids,
            stop_ids=self.stop_ids,
            stop_index=self.stop_index,
            stops=self.stops,
            routes=self.routes,
            route_index=self.route_index,
            service_ids=self.service_ids,
            service_dates=[frozenset(s) for s in self.service_sets],
            trip_ids=self.trip_ids,
            trip_index=self.trip_index,
            trip_route=self.trip_route,
            trip_service=self.trip_service,
            trip_direction=self.trip_direction,
            trip_headsign=self.trip_headsign,
            trip_shape=self.trip_shape,
            trip_block=self.trip_block,
            trip_pattern=self.trip_pattern,
            trip_first=self.trip_first,
            trip_count=self.trip_count,
            st_trip=self.st_trip,
            st_stop=self.st_stop,
            st_seq=self.st_seq,
            st_time=self.st_time,
            st_flags=self.st_flags,
            st_dist=self.st_dist,
            time_strings=self.time_strings,
            time_seconds=self.time_seconds,
            shapes=self.shapes,
        )

    # -- small files ------------------------------------------------------------------------

    def _agency(self, t: _Table) -> None:
        i_id, i_tz = t.index("agency_id"), t.index("agency_timezone")
        self.agency_ids: list[str] = []
        timezones: list[str] = []
        for row in t.rows():
            self.agency_ids.append(_get(row, i_id))
            timezones.append(_get(row, i_tz))
        if not timezones:
            self.problems.add(t.name, None, "no agency")
            self.timezone = "UTC"
            return
        self.timezone = timezones[0]
        try:
            from zoneinfo import ZoneInfo

            ZoneInfo(self.timezone)
        except (ValueError, KeyError, OSError):
            self.problems.add(t.name, 2, f"unknown agency_timezone {self.timezone!r}")

    def _stops(self, t: _Table) -> None:
        idx = {
            c: t.index(c)
            for c in (
                "stop_id",
                "stop_name",
                "stop_lat",
                "stop_lon",
                "stop_code",
                "stop_short_name",
                "tts_stop_name",
                "district_id",
                "locality",
                "locality_id",
                "municipality_id",
                "region_id",
                "wheelchair_boarding",
                "operational_status",
            )
        }
        facility_idx = [(t.index(col), name) for col, name in FACILITY_COLUMNS if t.index(col) >= 0]
        self.stop_ids: list[str] = []
        self.stop_index: dict[str, int] = {}
        self.stops: list[StopRow] = []
        for row in t.rows():
            stop_id = row[idx["stop_id"]].strip()
            if not stop_id:
                self.problems.add(t.name, t.line, "empty stop_id")
                continue
            if stop_id in self.stop_index:
                self.problems.add(t.name, t.line, f"duplicate stop_id {stop_id!r}")
                continue
            try:
                lat = float(_get(row, idx["stop_lat"]) or "nan")
                lon = float(_get(row, idx["stop_lon"]) or "nan")
            except ValueError:
                self.problems.add(t.name, t.line, f"stop {stop_id!r}: bad stop_lat/stop_lon")
                continue
            name = _get(row, idx["stop_name"])
            status = OPERATIONAL_STATUSES.get(_get(row, idx["operational_status"]).upper())
            self.stop_index[stop_id] = len(self.stop_ids)
            self.stop_ids.append(stop_id)
            self.stops.append(
                StopRow(
                    name=name,
                    lat=0.0 if math.isnan(lat) else lat,
                    lon=0.0 if math.isnan(lon) else lon,
                    short_name=_get(row, idx["stop_short_name"]) or _get(row, idx["stop_code"]),
                    tts_name=_get(row, idx["tts_stop_name"]) or name,
                    district_id=_get(row, idx["district_id"]),
                    locality_id=_get(row, idx["locality_id"]) or _get(row, idx["locality"]),
                    municipality_id=_get(row, idx["municipality_id"]),
                    region_id=_get(row, idx["region_id"]),
                    facilities=tuple(name for i, name in facility_idx if row[i].strip() == "1"),
                    wheelchair_boarding=_get(row, idx["wheelchair_boarding"]) == "1",
                    operational_status=status,
                )
            )

    def _routes(self, t: _Table) -> None:
        cols = (
            "route_id",
            "agency_id",
            "route_short_name",
            "route_long_name",
            "route_color",
            "route_text_color",
            "line_id",
            "line_short_name",
            "line_long_name",
        )
        idx = [t.index(c) for c in cols]
        self.routes: list[RouteRow] = []
        self.route_index: dict[str, int] = {}
        for row in t.rows():
            values = [_get(row, i) for i in idx]
            if not values[0]:
                self.problems.add(t.name, t.line, "empty route_id")
                continue
            if values[0] in self.route_index:
                self.problems.add(t.name, t.line, f"duplicate route_id {values[0]!r}")
                continue
            self.route_index[values[0]] = len(self.routes)
            self.routes.append(RouteRow(*values))

    def _service(self, service_id: str) -> int:
        index = self.service_index.get(service_id)
        if index is None:
            index = self.service_index[service_id] = len(self.service_ids)
            self.service_ids.append(service_id)
            self.service_sets.append(set())
        return index

    def _calendar(self, t: _Table) -> None:
        idx = {c: t.index(c) for c in REQUIRED_COLUMNS["calendar.txt"]}
        for row in t.rows():
            service_id = _get(row, idx["service_id"])
            try:
                start = parse_yyyymmdd(_get(row, idx["start_date"]))
                end = parse_yyyymmdd(_get(row, idx["end_date"]))
                flags = [_get(row, idx[d]) == "1" for d in WEEKDAYS]
            except ValueError as exc:
                self.problems.add(t.name, t.line, f"service {service_id!r}: {exc}")
                continue
            if end < start:
                self.problems.add(
                    t.name, t.line, f"service {service_id!r}: end_date before start_date"
                )
                continue
            if (end - start).days > 3660:
                self.problems.add(t.name, t.line, f"service {service_id!r}: spans over ten years")
                continue
            dates = self.service_sets[self._service(service_id)]
            day = start
            one = timedelta(days=1)
            while day <= end:
                if flags[day.weekday()]:
                    dates.add(yyyymmdd(day))
                day += one

    def _calendar_dates(self, t: _Table) -> None:
        i_sid, i_date, i_type = t.index("service_id"), t.index("date"), t.index("exception_type")
        for row in t.rows():
            service_id = _get(row, i_sid)
            text = _get(row, i_date)
            kind = _get(row, i_type)
            try:
                parse_yyyymmdd(text)
            except ValueError as exc:
                self.problems.add(t.name, t.line, str(exc))
                continue
            dates = self.service_sets[self._service(service_id)]
            if kind == "1":
                dates.add(text)
            elif kind == "2":
                dates.discard(text)
            else:
                self.problems.add(t.name, t.line, f"exception_type must be 1 or 2, not {kind!r}")

    def _shapes(self, t: _Table) -> None:
        i_id = t.index("shape_id")
        i_lat, i_lon = t.index("shape_pt_lat"), t.index("shape_pt_lon")
        i_seq, i_dist = t.index("shape_pt_sequence"), t.index("shape_dist_traveled")
        points: dict[str, list[tuple[int, float, float, float]]] = {}
        for row in t.rows():
            try:
                dist_text = row[i_dist].strip() if i_dist >= 0 else ""
                point = (
                    int(row[i_seq]),
                    float(row[i_lat]),
                    float(row[i_lon]),
                    float(dist_text) if dist_text else math.nan,
                )
            except ValueError:
                self.problems.add(
                    t.name, t.line, "bad shape point (sequence, lat, lon or distance)"
                )
                continue
            points.setdefault(row[i_id].strip(), []).append(point)
        for shape_id, pts in points.items():
            pts.sort()
            dists = array("d", (p[3] for p in pts))
            has_dist = not any(math.isnan(d) for d in dists)
            self.shapes[shape_id] = ShapeColumns(
                array("i", (p[0] for p in pts)),
                array("d", (p[1] for p in pts)),
                array("d", (p[2] for p in pts)),
                dists if has_dist else None,
            )

    def _trips(self, t: _Table) -> None:
        i_route, i_service, i_trip = t.index("route_id"), t.index("service_id"), t.index("trip_id")
        i_head, i_dir = t.index("trip_headsign"), t.index("direction_id")
        i_shape, i_block, i_pattern = (
            t.index("shape_id"),
            t.index("block_id"),
            t.index("pattern_id"),
        )
        self.trip_ids: list[str] = []
        self.trip_index: dict[str, int] = {}
        self.trip_route = array("i")
        self.trip_service = array("i")
        self.trip_direction = array("b")
        self.trip_headsign: list[str] = []
        self.trip_shape: list[str] = []
        self.trip_block: list[str] = []
        self.trip_pattern: list[str] | None = [] if i_pattern >= 0 else None
        interned: dict[str, str] = {}
        intern = interned.setdefault
        for row in t.rows():
            trip_id = row[i_trip].strip()
            route = self.route_index.get(row[i_route].strip())
            service = self.service_index.get(row[i_service].strip())
            shape = _get(row, i_shape)
            if not trip_id or trip_id in self.trip_index:
                self.problems.add(t.name, t.line, f"empty or duplicate trip_id {trip_id!r}")
                continue
            if route is None:
                self.problems.add(
                    t.name, t.line, f"trip {trip_id!r}: route_id {row[i_route]!r} not in routes.txt"
                )
                continue
            if service is None:
                self.problems.add(
                    t.name,
                    t.line,
                    f"trip {trip_id!r}: service_id {row[i_service]!r} not in calendar.txt "
                    "or calendar_dates.txt",
                )
                continue
            if shape and shape not in self.shapes:
                self.problems.add(
                    t.name, t.line, f"trip {trip_id!r}: shape_id {shape!r} not in shapes.txt"
                )
                continue
            direction = _get(row, i_dir)
            if direction not in ("", "0", "1"):
                self.problems.add(t.name, t.line, f"trip {trip_id!r}: direction_id {direction!r}")
                continue
            self.trip_index[trip_id] = len(self.trip_ids)
            self.trip_ids.append(trip_id)
            self.trip_route.append(route)
            self.trip_service.append(service)
            self.trip_direction.append(1 if direction == "1" else 0)
            self.trip_headsign.append(intern(_get(row, i_head), _get(row, i_head)))
            self.trip_shape.append(intern(shape, shape))
            block = _get(row, i_block)
            self.trip_block.append(intern(block, block))
            if self.trip_pattern is not None:
                pattern = _get(row, i_pattern)
                self.trip_pattern.append(intern(pattern, pattern))

    # -- stop_times: the hot loop -----------------------------------------------------------

    def _stop_times(self, t: _Table) -> None:
        i_trip, i_stop = t.index("trip_id"), t.index("stop_id")
        i_seq, i_arr, i_dep = (
            t.index("stop_sequence"),
            t.index("arrival_time"),
            t.index("departure_time"),
        )
        i_pu, i_do, i_dist = (
            t.index("pickup_type"),
            t.index("drop_off_type"),
            t.index("shape_dist_traveled"),
        )
        ntrips = len(self.trip_ids)
        st_trip, st_stop, st_seq = array("i"), array("i"), array("i")
        st_time, st_flags = array("i"), array("B")
        st_dist = array("f") if i_dist >= 0 else None
        trip_first = array("i", [-1]) * ntrips
        trip_count = array("i", [0]) * ntrips
        time_ids: dict[str, int] = {"": -1}
        self._time_ids = time_ids
        self.time_strings: list[str] = []
        self.time_seconds = array("i")
        add_trip, add_stop, add_seq = st_trip.append, st_stop.append, st_seq.append
        add_time, add_flags = st_time.append, st_flags.append
        add_dist = st_dist.append if st_dist is not None else None
        trip_get, stop_get, time_get = self.trip_index.get, self.stop_index.get, time_ids.get
        problem = self.problems.add
        name = t.name
        grouped = True
        last_trip: str | None = None
        ti = -1
        last_seq = -1
        n = 0
        for row in t.rows():
            trip_id = row[i_trip]
            if trip_id != last_trip:
                last_trip = trip_id
                ti = trip_get(trip_id.strip(), -1)
                if ti < 0:
                    problem(name, t.line, f"trip_id {trip_id!r} not in trips.txt")
                    continue
                if trip_first[ti] >= 0:
                    grouped = False
                else:
                    trip_first[ti] = n
                last_seq = -1
            elif ti < 0:
                problem(name, t.line, f"trip_id {trip_id!r} not in trips.txt")
                continue
            stop = stop_get(row[i_stop])
            if stop is None:
                stop = stop_get(row[i_stop].strip())
                if stop is None:
                    problem(name, t.line, f"stop_id {row[i_stop]!r} not in stops.txt")
                    continue
            try:
                seq = int(row[i_seq])
            except ValueError:
                problem(name, t.line, f"stop_sequence {row[i_seq]!r} is not an integer")
                continue
            if seq <= last_seq:
                grouped = False
            last_seq = seq
            text = row[i_arr]
            tid = time_get(text)
            if tid is None or tid < 0:
                if tid is None:
                    tid = self._intern_time(text, time_ids, t)
                if tid == -1 and i_dep >= 0:
                    text = row[i_dep]
                    tid = time_get(text)
                    if tid is None:
                        tid = self._intern_time(text, time_ids, t)
                if tid == -2:
                    continue
            flags = 0
            if i_pu >= 0 and row[i_pu] == "1":
                flags = NO_PICKUP
            if i_do >= 0 and row[i_do] == "1":
                flags |= NO_DROP_OFF
            if add_dist is not None:
                dist = row[i_dist]
                try:
                    add_dist(float(dist) if dist else 0.0)
                except ValueError:
                    problem(name, t.line, f"shape_dist_traveled {dist!r} is not a number")
                    add_dist(0.0)
            add_trip(ti)
            add_stop(stop)
            add_seq(seq)
            add_time(tid)
            add_flags(flags)
            trip_count[ti] += 1
            n += 1
        self.st_trip, self.st_stop, self.st_seq = st_trip, st_stop, st_seq
        self.st_time, self.st_flags, self.st_dist = st_time, st_flags, st_dist
        self.trip_first, self.trip_count = trip_first, trip_count
        self._grouped = grouped

    def _intern_time(self, text: str, time_ids: dict[str, int], t: _Table) -> int:
        """Id of a time string; -1 for blank, -2 (after reporting) for a malformed one."""
        clean = text.strip()
        if not clean:
            time_ids[text] = -1
            return -1
        try:
            seconds = parse_time(clean)
        except BadTime:
            self.problems.add(t.name, t.line, f"bad time {text!r} (want H:MM:SS)")
            return -2
        tid = time_ids.get(clean)
        if tid is None:
            tid = len(self.time_strings)
            self.time_strings.append(clean)
            self.time_seconds.append(seconds)
            time_ids[clean] = tid
        time_ids[text] = tid
        return tid

    def _group_stop_times(self) -> None:
        """Make each trip's rows contiguous and ordered by stop_sequence, and fill blank times."""
        n = len(self.st_trip)
        if not self._grouped:
            # Rare (most producers write stop_times sorted): a full reorder.
            st_trip, st_seq = self.st_trip, self.st_seq
            order = sorted(range(n), key=lambda i: (st_trip[i], st_seq[i]))
            for attr in ("st_trip", "st_stop", "st_seq", "st_time", "st_flags", "st_dist"):
                column = getattr(self, attr)
                if column is not None:
                    setattr(self, attr, array(column.typecode, [column[i] for i in order]))
            del order
            trip_first = self.trip_first
            for i in range(len(trip_first)):
                trip_first[i] = -1
            last = -1
            for pos, ti in enumerate(self.st_trip):
                if ti != last:
                    trip_first[ti] = pos
                    last = ti
            seqs = self.st_seq
            for ti, first in enumerate(trip_first):
                if first < 0:
                    continue
                end = first + self.trip_count[ti]
                for pos in range(first + 1, end):
                    if seqs[pos] == seqs[pos - 1]:
                        self.problems.add(
                            "stop_times.txt",
                            None,
                            f"trip {self.trip_ids[ti]!r}: stop_sequence {seqs[pos]} repeated",
                        )
                        break
        if self.st_time.count(-1):
            self._fill_blank_times()

    def _frequencies(self, t: _Table) -> None:
        """Expand frequency-based trips into one trip per departure.

        A trip listed in frequencies.txt is a template: its stop_times give times relative to
        its first stop. Each departure `start_time, start_time + headway, ... < end_time`
        becomes a trip `<trip_id>@<HH:MM:SS>` (TripUpdates naming the template and that
        start_time are matched to it); the template itself is dropped.
        """
        i_trip, i_start = t.index("trip_id"), t.index("start_time")
        i_end, i_headway = t.index("end_time"), t.index("headway_secs")
        missing = [
            name for name, i in (("trip_id", i_trip), ("start_time", i_start),
                                 ("end_time", i_end), ("headway_secs", i_headway)) if i < 0
        ]  # fmt: skip
        if missing:
            self.problems.add(t.name, 1, f"missing required column(s): {', '.join(missing)}")
            return
        runs: dict[int, list[tuple[int, int, int]]] = {}
        for row in t.rows():
            trip_id = row[i_trip].strip()
            ti = self.trip_index.get(trip_id)
            if ti is None:
                self.problems.add(t.name, t.line, f"trip_id {trip_id!r} not in trips.txt")
                continue
            try:
                start, end = parse_time(row[i_start]), parse_time(row[i_end])
                headway = int(row[i_headway])
            except (BadTime, ValueError):
                self.problems.add(t.name, t.line, "bad start_time, end_time or headway_secs")
                continue
            if headway <= 0 or end < start:
                self.problems.add(t.name, t.line, "headway_secs must be > 0 and end >= start")
                continue
            if self.trip_count[ti] == 0:
                continue
            runs.setdefault(ti, []).append((start, end, headway))
        if not runs or self.problems.total:
            return
        old = {
            name: getattr(self, name)
            for name in ("st_trip", "st_stop", "st_seq", "st_time", "st_flags", "st_dist")
        }
        new = {name: array(col.typecode) for name, col in old.items() if col is not None}
        old_first, old_count = self.trip_first, self.trip_count
        first, count = array("i", old_first), array("i", old_count)
        seconds = self.time_seconds

        def copy(src: int, dst: int, shift: int) -> None:
            a, n = old_first[src], old_count[src]
            first[dst], count[dst] = len(new["st_trip"]), n
            new["st_trip"].extend(array("i", [dst]) * n)
            for name in ("st_stop", "st_seq", "st_flags", "st_dist"):
                if name in new:
                    new[name].extend(old[name][a : a + n])
            times = old["st_time"][a : a + n]
            if shift:
                times = array("i", (self._shifted_time(tid, shift) for tid in times))
            new["st_time"].extend(times)

        for ti in range(len(old_first)):
            if ti not in runs:
                if old_count[ti]:
                    copy(ti, ti, 0)
                continue
            base = seconds[old["st_time"][old_first[ti]]]
            for start, end, headway in runs[ti]:
                departure = start
                while departure < end:
                    clone = self._clone_trip(ti, f"{self.trip_ids[ti]}@{format_time(departure)}")
                    first.append(-1)
                    count.append(0)
                    copy(ti, clone, departure - base)
                    departure += headway
            first[ti], count[ti] = -1, 0
        for name, col in new.items():
            setattr(self, name, col)
        self.trip_first, self.trip_count = first, count

    def _shifted_time(self, tid: int, shift: int) -> int:
        text = format_time(self.time_seconds[tid] + shift)
        shifted = self._time_ids.get(text)
        if shifted is None:
            shifted = self._time_ids[text] = len(self.time_strings)
            self.time_strings.append(text)
            self.time_seconds.append(self.time_seconds[tid] + shift)
        return shifted

    def _clone_trip(self, ti: int, trip_id: str) -> int:
        clone = len(self.trip_ids)
        self.trip_ids.append(trip_id)
        self.trip_index[trip_id] = clone
        self.trip_route.append(self.trip_route[ti])
        self.trip_service.append(self.trip_service[ti])
        self.trip_direction.append(self.trip_direction[ti])
        self.trip_headsign.append(self.trip_headsign[ti])
        self.trip_shape.append(self.trip_shape[ti])
        self.trip_block.append(self.trip_block[ti])
        if self.trip_pattern is not None:
            self.trip_pattern.append(self.trip_pattern[ti])
        return clone

    def _fill_blank_times(self) -> None:
        """Interpolate blank (non-timepoint) times linearly between the timed stops around them."""
        times, seconds = self.st_time, self.time_seconds
        ids = {s: i for i, s in enumerate(self.time_strings)}
        for ti, first in enumerate(self.trip_first):
            count = self.trip_count[ti]
            if first < 0 or count == 0:
                continue
            end = first + count
            if -1 not in times[first:end]:
                continue
            if times[first] < 0 or times[end - 1] < 0:
                self.problems.add(
                    "stop_times.txt",
                    None,
                    f"trip {self.trip_ids[ti]!r}: first and last stop need arrival/departure times",
                )
                continue
            prev = first
            for pos in range(first + 1, end):
                if times[pos] < 0:
                    continue
                gap = pos - prev
                if gap > 1:
                    a, b = seconds[times[prev]], seconds[times[pos]]
                    for k in range(1, gap):
                        text = format_time(a + (b - a) * k // gap)
                        tid = ids.get(text)
                        if tid is None:
                            tid = ids[text] = len(self.time_strings)
                            self.time_strings.append(text)
                            seconds.append(parse_time(text))
                        times[prev + k] = tid
                prev = pos


def feed_timezone(source: str) -> ZoneInfo:
    """The agency timezone of a local GTFS zip or directory, read without parsing the feed
    (the metrics CLI has no loaded feed)."""
    path = Path(source)
    try:
        if path.is_dir():
            data = (path / "agency.txt").read_bytes()
        else:
            with zipfile.ZipFile(path) as z:
                name = next(n for n in z.namelist() if n.rsplit("/", 1)[-1] == "agency.txt")
                data = z.read(name)
    except (OSError, zipfile.BadZipFile, StopIteration) as exc:
        raise SourceError(f"{source}: no readable agency.txt ({exc})") from exc
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"))))
    tz = next((r.get("agency_timezone", "").strip() for r in rows if r.get("agency_timezone")), "")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise SourceError(f"{source}: no usable agency_timezone ({tz!r})") from None
