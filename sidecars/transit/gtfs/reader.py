"""Parse and validate a static GTFS feed into compact columns.

The small files (agency, stops, routes, calendars, shapes, trips) are read here; stop_times and
frequencies, the large part, in stop_times.py. Every problem is a notice of the report
(notices.py): a missing file or column, or a file that is not CSV, rejects the feed; a bad row
is skipped, and the rows of other files that refer to it too.
"""

from __future__ import annotations

import zipfile
import zlib
from array import array
from collections.abc import Callable
from datetime import date, datetime
from zoneinfo import ZoneInfo

from ..geometry import MIN_SAMPLE_M, UNITS, cumulative_m, detect_unit
from ..source import FeedFiles
from .calendars import ServiceDays
from .notices import Cause, Report
from .stop_times import StopTimes
from .tables import (
    FACILITY_COLUMNS,
    GTFS_FILES,
    OPERATIONAL_STATUSES,
    REQUIRED_FILES,
    UNSERVED_FILES,
    RawFeed,
    RouteRow,
    RowError,
    ShapeColumns,
    StopRow,
    Table,
    Trips,
    color,
    enum,
    get,
    integer,
    new_key,
    number,
    required,
)

LOCATION_TYPES = frozenset(("", "0", "1", "2", "3", "4"))
DIRECTIONS = frozenset(("", "0", "1"))
# The single agency of a feed without agency_id is named this in the API (vehicle ids, metrics).
DEFAULT_AGENCY_ID = "1"
# Carris Metropolitana's own files, served by `/v2/dates` and `/v2/periods` as they are.
CM_FILES = ("dates.txt", "periods.txt")


def read_feed(
    files: FeedFiles,
    *,
    max_skipped_share: float = 0.1,
    examples: int = 10,
    dist_unit: str = "auto",
    now: float | None = None,
    max_rows: int | None = None,
) -> RawFeed:
    """Parse and validate every file the API needs; FeedError carries the report when the
    feed cannot be served. The served feed's report (row-level notices) is `RawFeed.report`.
    With `now` (Unix time), dates are checked against it too: expired calendars, no service
    today, feed_info's end date. With `max_rows`, a feed whose files hold more rows in all is
    refused as soon as it passes that many (TRANSIT_FEED_MAX_ROWS), before parsing the rest."""
    report = Report(examples)
    report.max_rows = max_rows
    names = files.names()
    for name in REQUIRED_FILES:
        if name not in names:
            report.add("missing_required_file", name, None, "required file missing")
    if "calendar.txt" not in names and "calendar_dates.txt" not in names:
        report.add(
            "missing_calendar_and_calendar_date_files",
            "calendar.txt",
            None,
            "neither calendar.txt nor calendar_dates.txt is present",
        )
    report.raise_if_fatal()
    try:
        raw = _Reader(files, report, dist_unit, now).read()
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        # A truncated or corrupt member only shows up when it is read.
        raise report.fatal(
            "unreadable_file", files.origin, None, f"cannot read archive member: {exc}"
        ) from exc
    report.check_skipped_share(max_skipped_share, UNSERVED_FILES)
    report.raise_if_fatal()
    return raw


class _Reader(ServiceDays):
    """Reads the files in dependency order; each table method fills its columns."""

    def __init__(self, files: FeedFiles, report: Report, dist_unit: str, now: float | None) -> None:
        self.files = files
        self.report = report
        self.dist_unit = dist_unit
        self.now = now
        self.today: date | None = None
        self.extras: dict[str, list[dict[str, str]]] = {}
        # Rows skipped for a problem of their own, by key: what refers to them is dropped
        # with them and counted under that notice.
        self.dropped_stops: dict[str, Cause] = {}
        self.dropped_routes: dict[str, Cause] = {}
        self.dropped_services: dict[str, Cause] = {}
        self.dropped_trips: dict[str, Cause] = {}

    def table(self, name: str, fn: Callable[[Table], None], needed: bool = False) -> None:
        with self.files.open_text(name) as fh:
            t = Table(name, fh, self.report)
            if self.report.fatal_count:
                # Rejected already: only the header is checked (so every missing column is
                # reported); its rows would only repeat the problem (trips of a broken
                # routes.txt) and are not read.
                return
            fn(t)
            if needed:
                t.require()

    def read(self) -> RawFeed:
        names = self.files.names()
        for name in sorted(names - GTFS_FILES):
            served = " (served by /v2/dates and /v2/periods)" if name in CM_FILES else ""
            self.report.add("unknown_file", name, None, f"not a GTFS file{served}")
        self.table("agency.txt", self._agency, needed=True)
        if self.now is not None and not self.report.fatal_count:
            self.today = datetime.fromtimestamp(self.now, ZoneInfo(self.timezone)).date()
        if "feed_info.txt" in names:
            self.table("feed_info.txt", self._feed_info)
        else:
            self.report.add(
                "missing_recommended_file",
                "feed_info.txt",
                None,
                "feed_info.txt is missing (the feed's version, validity dates and contact)",
            )
        for name in CM_FILES:
            if name in names:
                self.extras[name] = self._plain(name)
        self.table("stops.txt", self._stops, needed=True)
        self.table("routes.txt", self._routes, needed=True)
        self.service_ids: list[str] = []
        self.service_index: dict[str, int] = {}
        self.service_sets: list[set[str]] = []
        if "calendar.txt" in names:
            self.table("calendar.txt", self._calendar)
        if "calendar_dates.txt" in names:
            self.table("calendar_dates.txt", self._calendar_dates)
        if not self.service_ids and not self.report.fatal_count:
            # Both calendars read, neither gave a usable service.
            self.report.add("no_usable_rows", "calendar.txt", None, "no usable service")
        self._check_service_dates(names)
        self.shapes: dict[str, ShapeColumns] = {}
        if "shapes.txt" in names:
            self.table("shapes.txt", self._shapes)
        self.table("trips.txt", self._trips, needed=True)
        # Stop here when the small files are unusable: their notices are the useful report.
        self.report.raise_if_fatal()
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
        st = StopTimes(trips, self.stop_index, self.report, self.dropped_trips, self.dropped_stops)
        self.table("stop_times.txt", st.read, needed=True)
        self.report.raise_if_fatal()
        st.group()
        if "frequencies.txt" in names:
            self.table("frequencies.txt", st.expand_frequencies)
        st.check_unused()
        raw = RawFeed(
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
            report=self.report,
            shapes=self.shapes,
            extras=self.extras,
        )
        raw.dist_factor = self._dist_factor(raw)
        return raw

    # -- small files ------------------------------------------------------------------------

    def _agency(self, t: Table) -> None:
        i_id, i_name, i_url, i_tz = (
            t.index("agency_id"),
            t.index("agency_name"),
            t.index("agency_url"),
            t.index("agency_timezone"),
        )
        rows: list[tuple[str, str, int]] = []
        for row in t.rows():
            try:
                agency_id = get(row, i_id)
                required(row, i_name, "agency_name")
                required(row, i_url, "agency_url")
                tz = required(row, i_tz, "agency_timezone")
                try:
                    ZoneInfo(tz)
                except (ValueError, KeyError, OSError):
                    raise RowError(
                        "invalid_timezone", f"agency_timezone {tz!r} is unknown"
                    ) from None
                if any(agency_id == r[0] for r in rows):
                    raise RowError("duplicate_key", f"agency_id {agency_id!r} repeated")
            except RowError as exc:
                t.skip(exc)
                continue
            rows.append((agency_id, tz, t.line))
        if len(rows) > 1:
            # agency_id is required as soon as there is more than one agency.
            for agency_id, _, line in rows:
                if not agency_id:
                    self.report.skip(
                        "missing_required_field",
                        t.name,
                        line,
                        "agency_id is empty (required when the feed has several agencies)",
                    )
            rows = [r for r in rows if r[0]]
        self.agency_ids = [r[0] or DEFAULT_AGENCY_ID for r in rows]
        self.timezone = rows[0][1] if rows else "UTC"

    def _stops(self, t: Table) -> None:
        idx = {
            c: t.index(c)
            for c in (
                "stop_id",
                "stop_name",
                "stop_lat",
                "stop_lon",
                "location_type",
                "parent_station",
                "stop_code",
                "stop_short_name",
                "tts_stop_name",
                "district_id",
                "locality",
                "locality_id",
                "municipality_id",
                "municipality_name",
                "region_id",
                "wheelchair_boarding",
                "operational_status",
                "district_name",
                "region_name",
                "parish_id",
                "parish_name",
            )
        }
        facility_idx = [(t.index(col), name) for col, name in FACILITY_COLUMNS if t.index(col) >= 0]
        self.stop_ids: list[str] = []
        self.stop_index: dict[str, int] = {}
        self.stops: list[StopRow] = []
        seen: set[str] = set()
        for row in t.rows():
            stop_id = get(row, idx["stop_id"])
            try:
                new_key(row, idx["stop_id"], "stop_id", seen)
                kind = enum(get(row, idx["location_type"]), "location_type", LOCATION_TYPES)
                if kind in ("2", "3", "4"):
                    required(row, idx["parent_station"], "parent_station")
                if kind in ("3", "4"):
                    # Generic nodes and boarding areas: no position needed, nothing to publish.
                    seen.add(stop_id)
                    continue
                name = required(row, idx["stop_name"], "stop_name")
                lat = number(required(row, idx["stop_lat"], "stop_lat"), "stop_lat", -90, 90)
                lon = number(required(row, idx["stop_lon"], "stop_lon"), "stop_lon", -180, 180)
                if abs(lat) <= 1 and abs(lon) <= 1:
                    raise RowError("point_near_origin", f"stop {stop_id!r} is at {lat}, {lon}")
            except RowError as exc:
                t.drop(exc, stop_id, self.dropped_stops, seen)
                continue
            seen.add(stop_id)
            status = OPERATIONAL_STATUSES.get(get(row, idx["operational_status"]).upper())
            self.stop_index[stop_id] = len(self.stop_ids)
            self.stop_ids.append(stop_id)
            self.stops.append(
                StopRow(
                    name=name,
                    lat=lat,
                    lon=lon,
                    short_name=get(row, idx["stop_short_name"]) or get(row, idx["stop_code"]),
                    tts_name=get(row, idx["tts_stop_name"]) or name,
                    district_id=get(row, idx["district_id"]),
                    locality_id=get(row, idx["locality_id"]),
                    locality=get(row, idx["locality"]),
                    municipality_id=get(row, idx["municipality_id"]),
                    municipality_name=get(row, idx["municipality_name"]),
                    region_id=get(row, idx["region_id"]),
                    facilities=tuple(name for i, name in facility_idx if row[i].strip() == "1"),
                    wheelchair_boarding=get(row, idx["wheelchair_boarding"]) == "1",
                    operational_status=status,
                    district_name=get(row, idx["district_name"]),
                    region_name=get(row, idx["region_name"]),
                    parish_id=get(row, idx["parish_id"]),
                    parish_name=get(row, idx["parish_name"]),
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
        i_type = t.index("route_type")
        self.routes: list[RouteRow] = []
        self.route_index: dict[str, int] = {}
        # agency_id as written in agency.txt; the single agency of a feed without ids is "1".
        agencies = set(self.agency_ids)
        single = self.agency_ids[0] if len(self.agency_ids) == 1 else None
        for row in t.rows():
            values = [get(row, i) for i in idx]
            route_id = values[0]
            try:
                new_key(row, idx[0], "route_id", self.route_index)
                agency = values[1]
                if not agency:
                    if single is None:
                        raise RowError(
                            "missing_required_field",
                            "agency_id is empty (required when the feed has several agencies)",
                        )
                    values[1] = single
                elif agency not in agencies:
                    raise RowError(
                        "foreign_key_violation", f"agency_id {agency!r} is not a usable agency"
                    )
                if not values[2] and not values[3]:
                    raise RowError(
                        "route_both_short_and_long_name_missing",
                        f"route {route_id!r} has neither route_short_name nor route_long_name",
                    )
                kind = integer(required(row, i_type, "route_type"), "route_type")
            except RowError as exc:
                t.drop(exc, route_id, self.dropped_routes, self.route_index)
                continue
            if not (kind <= 7 or kind in (11, 12) or 100 <= kind <= 1702):
                # The API serves no route_type: the route is served.
                t.warn(
                    "unexpected_enum_value",
                    f"route {route_id!r}: route_type {kind} is not defined; served anyway "
                    "(the API does not serve route_type)",
                )
            for k, field in ((4, "route_color"), (5, "route_text_color")):
                try:
                    color(values[k], field)
                except RowError as exc:
                    t.warn(exc.code, f"route {route_id!r}: {exc}; the default colour is served")
                    values[k] = ""
            self.route_index[route_id] = len(self.routes)
            self.routes.append(RouteRow(*values))

    def _shapes(self, t: Table) -> None:
        i_id = t.index("shape_id")
        i_lat, i_lon = t.index("shape_pt_lat"), t.index("shape_pt_lon")
        i_seq, i_dist = t.index("shape_pt_sequence"), t.index("shape_dist_traveled")
        points: dict[str, dict[int, tuple[float, float, float]]] = {}
        nan = float("nan")
        for row in t.rows():
            try:
                shape_id = required(row, i_id, "shape_id")
                seq = integer(required(row, i_seq, "shape_pt_sequence"), "shape_pt_sequence")
                lat = number(required(row, i_lat, "shape_pt_lat"), "shape_pt_lat", -90, 90)
                lon = number(required(row, i_lon, "shape_pt_lon"), "shape_pt_lon", -180, 180)
                if abs(lat) <= 1 and abs(lon) <= 1:
                    raise RowError("point_near_origin", f"shape point at {lat}, {lon}")
                dist_text = get(row, i_dist)
                dist = number(dist_text, "shape_dist_traveled", 0, 1e12) if dist_text else nan
                shape = points.setdefault(shape_id, {})
                if seq in shape:
                    raise RowError(
                        "duplicate_key", f"shape {shape_id!r}: shape_pt_sequence {seq} repeated"
                    )
            except RowError as exc:
                t.skip(exc)
                continue
            shape[seq] = (lat, lon, dist)
        for shape_id, by_seq in points.items():
            seqs = sorted(by_seq)
            dists = array("d", (by_seq[s][2] for s in seqs))
            has_dist = all(d == d for d in dists)  # no NaN
            self.shapes[shape_id] = ShapeColumns(
                array("i", seqs),
                array("d", (by_seq[s][0] for s in seqs)),
                array("d", (by_seq[s][1] for s in seqs)),
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
            trip_id = get(row, i_trip)
            try:
                new_key(row, i_trip, "trip_id", self.trip_index)
                route_text = required(row, i_route, "route_id")
                route = self.route_index.get(route_text)
                service_text = required(row, i_service, "service_id")
                service = self.service_index.get(service_text)
                parent = self.dropped_routes.get(route_text) if route is None else None
                if parent is None and service is None:
                    parent = self.dropped_services.get(service_text)
                if parent is not None:
                    # Its route or service was skipped: counted under that notice.
                    self.report.dependant(parent, t.name)
                    self.dropped_trips.setdefault(trip_id, parent)
                    continue
                if route is None:
                    raise RowError(
                        "foreign_key_violation",
                        f"trip {trip_id!r}: route_id {route_text!r} is not a usable route",
                    )
                if service is None:
                    raise RowError(
                        "foreign_key_violation",
                        f"trip {trip_id!r}: service_id {service_text!r} is not a usable service "
                        "of calendar.txt or calendar_dates.txt",
                    )
                direction = enum(get(row, i_dir), "direction_id", DIRECTIONS)
            except RowError as exc:
                t.drop(exc, trip_id, self.dropped_trips, self.trip_index)
                continue
            shape = get(row, i_shape)
            if shape and shape not in self.shapes:
                t.warn("trip_shape_not_found", f"trip {trip_id!r}: shape_id {shape!r}")
                shape = ""
            self.trip_index[trip_id] = len(self.trip_ids)
            self.trip_ids.append(trip_id)
            self.trip_route.append(route)
            self.trip_service.append(service)
            self.trip_direction.append(1 if direction == "1" else 0)
            headsign = get(row, i_head)
            self.trip_headsign.append(intern(headsign, headsign))
            self.trip_shape.append(intern(shape, shape))
            block = get(row, i_block)
            self.trip_block.append(intern(block, block))
            if self.trip_pattern is not None:
                pattern = get(row, i_pattern)
                self.trip_pattern.append(intern(pattern, pattern))

    # -- units ------------------------------------------------------------------------------

    def _dist_factor(self, raw: RawFeed) -> float | None:
        """Metres per unit of shape_dist_traveled: configured, or told from the shapes (else
        from trips' straight-line lengths between stops)."""
        if self.dist_unit != "auto":
            return UNITS[self.dist_unit]
        samples: list[tuple[float, float]] = []
        for cols in raw.shapes.values():
            if cols.dist is not None and len(cols.seq) > 1:
                samples.append((cols.dist[-1] - cols.dist[0], cumulative_m(cols.lat, cols.lon)[-1]))
        if not samples and raw.st_dist is not None:
            stops = raw.stops
            step = max(1, len(raw.trip_ids) // 500)
            for ti in range(0, len(raw.trip_ids), step):
                first, count = raw.trip_first[ti], raw.trip_count[ti]
                if count < 2:
                    continue
                rows = [stops[raw.st_stop[p]] for p in range(first, first + count)]
                length = cumulative_m([r.lat for r in rows], [r.lon for r in rows])[-1]
                samples.append((raw.st_dist[first + count - 1] - raw.st_dist[first], length))
        # Blank distances are NaN, which no comparison accepts.
        samples = [(d, m) for d, m in samples if d > 0 and m >= MIN_SAMPLE_M]
        if not samples:
            return None
        factor = detect_unit(samples)
        if factor is None:
            self.report.add(
                "shape_dist_traveled_unit_unknown",
                "shapes.txt" if raw.shapes else "stop_times.txt",
                None,
                "shape_dist_traveled matches none of m, km, mi, ft "
                "(set TRANSIT_SHAPE_DIST_UNIT if it is one of them)",
            )
        return factor
