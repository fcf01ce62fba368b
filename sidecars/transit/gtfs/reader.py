"""Parse and validate a static GTFS feed into compact columns.

The small files (agency, stops, routes, calendars, shapes, trips) are read here; stop_times and
frequencies, the large part, in stop_times.py. Any problem (missing file or column, malformed
row, dangling reference) is collected with its file and line; a feed with problems is rejected
as a whole.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from array import array
from collections.abc import Callable
from datetime import timedelta
from zoneinfo import ZoneInfo

from ..schemas import FeedProblem
from ..source import FeedFiles
from ..times import parse_yyyymmdd, yyyymmdd
from .stop_times import StopTimes
from .tables import (
    FACILITY_COLUMNS,
    OPERATIONAL_STATUSES,
    REQUIRED_COLUMNS,
    REQUIRED_FILES,
    WEEKDAYS,
    FeedError,
    Problems,
    RawFeed,
    RouteRow,
    ShapeColumns,
    StopRow,
    Table,
    Trips,
    get,
)


def read_feed(files: FeedFiles) -> RawFeed:
    """Parse and validate every file the API needs; FeedError lists what is wrong."""
    problems = Problems()
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
    """Reads the files in dependency order; each table method fills its columns."""

    def __init__(self, files: FeedFiles, problems: Problems) -> None:
        self.files = files
        self.problems = problems

    def table(self, name: str, fn: Callable[[Table], None]) -> None:
        with self.files.open_text(name) as fh:
            fn(Table(name, fh, self.problems))

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
        trips = Trips(
            self.trip_ids,
            self.trip_index,
            self.trip_route,
            self.trip_service,
            self.trip_direction,
            self.trip_headsign,
            self.trip_shape,
            self.trip_block,
            self.trip_pattern,
        )
        st = StopTimes(trips, self.stop_index, self.problems)
        self.table("stop_times.txt", st.read)
        self.problems.raise_if_any()
        st.group()
        self.problems.raise_if_any()
        if "frequencies.txt" in self.files.names():
            self.table("frequencies.txt", st.expand_frequencies)
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
            trip_ids=trips.trip_ids,
            trip_index=trips.trip_index,
            trip_route=trips.trip_route,
            trip_service=trips.trip_service,
            trip_direction=trips.trip_direction,
            trip_headsign=trips.trip_headsign,
            trip_shape=trips.trip_shape,
            trip_block=trips.trip_block,
            trip_pattern=trips.trip_pattern,
            trip_first=st.trip_first,
            trip_count=st.trip_count,
            st_trip=st.st_trip,
            st_stop=st.st_stop,
            st_seq=st.st_seq,
            st_time=st.st_time,
            st_flags=st.st_flags,
            st_dist=st.st_dist,
            time_strings=st.time_strings,
            time_seconds=st.time_seconds,
            shapes=self.shapes,
        )

    # -- small files ------------------------------------------------------------------------

    def _agency(self, t: Table) -> None:
        i_id, i_tz = t.index("agency_id"), t.index("agency_timezone")
        self.agency_ids: list[str] = []
        timezones: list[str] = []
        for row in t.rows():
            self.agency_ids.append(get(row, i_id))
            timezones.append(get(row, i_tz))
        if not timezones:
            self.problems.add(t.name, None, "no agency")
            self.timezone = "UTC"
            return
        self.timezone = timezones[0]
        try:
            ZoneInfo(self.timezone)
        except (ValueError, KeyError, OSError):
            self.problems.add(t.name, 2, f"unknown agency_timezone {self.timezone!r}")

    def _stops(self, t: Table) -> None:
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
                lat = float(get(row, idx["stop_lat"]) or "nan")
                lon = float(get(row, idx["stop_lon"]) or "nan")
            except ValueError:
                self.problems.add(t.name, t.line, f"stop {stop_id!r}: bad stop_lat/stop_lon")
                continue
            name = get(row, idx["stop_name"])
            status = OPERATIONAL_STATUSES.get(get(row, idx["operational_status"]).upper())
            self.stop_index[stop_id] = len(self.stop_ids)
            self.stop_ids.append(stop_id)
            self.stops.append(
                StopRow(
                    name=name,
                    lat=0.0 if math.isnan(lat) else lat,
                    lon=0.0 if math.isnan(lon) else lon,
                    short_name=get(row, idx["stop_short_name"]) or get(row, idx["stop_code"]),
                    tts_name=get(row, idx["tts_stop_name"]) or name,
                    district_id=get(row, idx["district_id"]),
                    locality_id=get(row, idx["locality_id"]) or get(row, idx["locality"]),
                    municipality_id=get(row, idx["municipality_id"]),
                    region_id=get(row, idx["region_id"]),
                    facilities=tuple(name for i, name in facility_idx if row[i].strip() == "1"),
                    wheelchair_boarding=get(row, idx["wheelchair_boarding"]) == "1",
                    operational_status=status,
                )
            )

    def _routes(self, t: Table) -> None:
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
            values = [get(row, i) for i in idx]
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

    def _calendar(self, t: Table) -> None:
        idx = {c: t.index(c) for c in REQUIRED_COLUMNS["calendar.txt"]}
        for row in t.rows():
            service_id = get(row, idx["service_id"])
            try:
                start = parse_yyyymmdd(get(row, idx["start_date"]))
                end = parse_yyyymmdd(get(row, idx["end_date"]))
                flags = [get(row, idx[d]) == "1" for d in WEEKDAYS]
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

    def _calendar_dates(self, t: Table) -> None:
        i_sid, i_date, i_type = t.index("service_id"), t.index("date"), t.index("exception_type")
        for row in t.rows():
            service_id = get(row, i_sid)
            text = get(row, i_date)
            kind = get(row, i_type)
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

    def _shapes(self, t: Table) -> None:
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

    def _trips(self, t: Table) -> None:
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
            shape = get(row, i_shape)
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
            direction = get(row, i_dir)
            if direction not in ("", "0", "1"):
                self.problems.add(t.name, t.line, f"trip {trip_id!r}: direction_id {direction!r}")
                continue
            self.trip_index[trip_id] = len(self.trip_ids)
            self.trip_ids.append(trip_id)
            self.trip_route.append(route)
            self.trip_service.append(service)
            self.trip_direction.append(1 if direction == "1" else 0)
            self.trip_headsign.append(intern(get(row, i_head), get(row, i_head)))
            self.trip_shape.append(intern(shape, shape))
            block = get(row, i_block)
            self.trip_block.append(intern(block, block))
            if self.trip_pattern is not None:
                pattern = get(row, i_pattern)
                self.trip_pattern.append(intern(pattern, pattern))
