"""The parts every GTFS file reader shares: the validated feed as columns (`Trips`, `RawFeed`),
a CSV table with its header resolved, and the field checks that skip a bad row."""

from __future__ import annotations

import csv
from array import array
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import IO, NamedTuple

from ..source import FeedFiles
from .notices import ERROR, Cause, Report

REQUIRED_FILES = ("agency.txt", "stops.txt", "routes.txt", "trips.txt", "stop_times.txt")
# Columns whose absence rejects the feed. The GTFS reference makes some of them conditional
# (stop_name/stop_lat/stop_lon for location_type 0-2, arrival/departure_time for timepoints);
# a feed this API can serve always has them.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "agency.txt": ("agency_name", "agency_url", "agency_timezone"),
    "stops.txt": ("stop_id", "stop_name", "stop_lat", "stop_lon"),
    "routes.txt": ("route_id", "route_type"),
    "trips.txt": ("route_id", "service_id", "trip_id"),
    "stop_times.txt": ("trip_id", "arrival_time", "departure_time", "stop_id", "stop_sequence"),
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
    "frequencies.txt": ("trip_id", "start_time", "end_time", "headway_secs"),
    "feed_info.txt": ("feed_publisher_name", "feed_publisher_url", "feed_lang"),
}
# Files the API does not serve from: a missing column there costs their rows only (an error,
# as MobilityData's), not the feed.
UNSERVED_FILES = frozenset(("feed_info.txt",))
# Every file of the GTFS reference (anything else is `unknown_file`, for information).
GTFS_FILES = frozenset(
    f"{name}.txt"
    for name in (
        "agency",
        "stops",
        "routes",
        "trips",
        "stop_times",
        "calendar",
        "calendar_dates",
        "fare_attributes",
        "fare_rules",
        "timeframes",
        "rider_categories",
        "fare_media",
        "fare_products",
        "fare_leg_rules",
        "fare_leg_join_rules",
        "fare_transfer_rules",
        "areas",
        "stop_areas",
        "networks",
        "route_networks",
        "shapes",
        "frequencies",
        "transfers",
        "pathways",
        "levels",
        "location_groups",
        "location_group_stops",
        "booking_rules",
        "translations",
        "feed_info",
        "attributions",
    )
)
# Of each group, at least one column.
REQUIRED_ONE_OF: dict[str, tuple[tuple[str, ...], ...]] = {
    "routes.txt": (("route_short_name", "route_long_name"),),
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
NO_PICKUP = 1
NO_DROP_OFF = 2


class StopRow(NamedTuple):
    """The stop columns the API exposes, and the location columns it resolves ids from."""

    name: str
    lat: float
    lon: float
    short_name: str
    tts_name: str
    district_id: str
    locality_id: str
    locality: str
    municipality_id: str
    municipality_name: str
    region_id: str
    facilities: tuple[str, ...]
    wheelchair_boarding: bool
    operational_status: str | None
    # Names that come with the ids (Carris Metropolitana's columns): the location lists are
    # derived from them when none is configured.
    district_name: str = ""
    region_name: str = ""
    parish_id: str = ""
    parish_name: str = ""


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
class Trips:
    """trips.txt as columns; a row index is a trip's number everywhere else."""

    trip_ids: list[str]
    trip_index: dict[str, int]
    trip_route: array
    trip_service: array
    trip_direction: array
    trip_headsign: list[str]
    trip_shape: list[str]
    trip_block: list[str]
    trip_pattern: list[str] | None

    def clone(self, ti: int, trip_id: str) -> int:
        """Add a copy of trip `ti` named `trip_id` (one departure of a frequency-based trip)."""
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


@dataclass(slots=True)
class RawFeed(Trips):
    """A validated feed as columns: the trips, and the rest. Row indexes are the positions in
    these lists."""

    files: FeedFiles
    timezone: str
    # The API's agency ids: a single agency without agency_id is "1".
    agency_ids: list[str]
    stop_ids: list[str]
    stop_index: dict[str, int]
    stops: list[StopRow]
    routes: list[RouteRow]
    route_index: dict[str, int]
    service_ids: list[str]
    service_dates: list[frozenset[str]]
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
    report: Report
    shapes: dict[str, ShapeColumns] = field(default_factory=dict)
    # Small files served as read (CM's dates.txt and periods.txt, feed_info.txt): their rows
    # as {column: value}.
    extras: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    # Metres per unit of shape_dist_traveled (shapes and stop_times), None when unknown.
    dist_factor: float | None = None


class RowError(ValueError):
    """A row is skipped: `code` is its notice, the message says which field and why."""

    def __init__(self, code: str, message: str, severity: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.severity = severity


class Table:
    """A csv reader over one file with its header resolved to column indexes.

    A missing required column is a fatal notice; the table then yields no rows (the other
    files are still read, so the report lists every missing column at once).
    """

    def __init__(self, name: str, fh: IO[str], report: Report) -> None:
        self.name = name
        self.reader = csv.reader(fh, strict=True)
        self.report = report
        self.columns: dict[str, int] = {}
        self.width = 0
        try:
            header = next(self.reader, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise report.fatal("csv_parsing_failed", name, 1, f"bad header: {exc}") from exc
        report.rows.setdefault(name, 0)
        if not header:
            report.add("empty_file", name, 1, "empty file, no header")
            return
        # Some producers pad header names (" exact_times"); the spec names are unpadded.
        columns = {h.strip(): i for i, h in enumerate(header)}
        missing = [c for c in REQUIRED_COLUMNS.get(name, ()) if c not in columns]
        self.columns = columns
        self.width = len(header)
        for choices in REQUIRED_ONE_OF.get(name, ()):
            if not any(c in columns for c in choices):
                missing.append(" or ".join(choices))
        if missing:
            message = f"missing required column(s): {', '.join(missing)}"
            severity = ERROR if name in UNSERVED_FILES else None
            report.add("missing_required_column", name, 1, message, severity)
            self.width = 0

    def index(self, column: str) -> int:
        """Index of a column, -1 when absent."""
        return self.columns.get(column, -1)

    def rows(self) -> Iterator[list[str]]:
        """Data rows padded to the header width; short rows pad with blanks like most readers,
        long rows are skipped. Blank lines are skipped. Bad CSV or UTF-8 is fatal."""
        width = self.width
        if not width:
            return
        reader = self.reader
        report = self.report
        name = self.name
        count = 0
        # Rows this file may still have before the feed passes TRANSIT_FEED_MAX_ROWS.
        left = report.max_rows - sum(report.rows.values()) if report.max_rows else -1
        try:
            for row in reader:
                n = len(row)
                if n == 0 or (n == 1 and not row[0].strip()):
                    continue
                count += 1
                if count == left + 1:
                    raise report.fatal(
                        "too_many_rows",
                        name,
                        reader.line_num,
                        f"the feed's files hold more than {report.max_rows:,} rows "
                        "(TRANSIT_FEED_MAX_ROWS)",
                    )
                if n == width:
                    yield row
                elif n < width:
                    yield row + [""] * (width - n)
                else:
                    report.skip(
                        "invalid_row_length",
                        name,
                        reader.line_num,
                        f"{n} fields but the header has {width}",
                    )
        except csv.Error as exc:
            raise report.fatal(
                "csv_parsing_failed", name, reader.line_num, f"bad CSV: {exc}"
            ) from exc
        except UnicodeDecodeError as exc:
            raise report.fatal(
                "csv_parsing_failed", name, reader.line_num, f"not UTF-8: {exc.reason}"
            ) from exc
        finally:
            report.rows[name] = report.rows.get(name, 0) + count

    @property
    def line(self) -> int:
        """The line number of the row being read."""
        return self.reader.line_num

    def skip(self, exc: RowError) -> Cause:
        """Record a skipped row; its rows in other files can depend on the cause returned."""
        return self.report.skip(exc.code, self.name, self.reader.line_num, str(exc))

    def drop(
        self, exc: RowError, key: str, dropped: dict[str, Cause], kept: Container[str]
    ) -> None:
        """Record a skipped row whose key (unless a kept row has it) is then the cause of the
        rows of other files that refer to it."""
        cause = self.skip(exc)
        if key and key not in kept:
            dropped.setdefault(key, cause)

    def warn(self, code: str, message: str, severity: str | None = None) -> None:
        """Record a notice about a row that is served."""
        self.report.add(code, self.name, self.reader.line_num, message, severity)

    def require(self) -> None:
        """A required file without a usable row is fatal (unless the feed is rejected
        already: an empty routes.txt empties trips.txt too, which says nothing new)."""
        if self.width and not self.report.fatal_count and not self.report.accepted(self.name):
            self.report.add("no_usable_rows", self.name, None, "no usable row")


def get(row: list[str], index: int) -> str:
    """A stripped cell; "" for an absent column."""
    return row[index].strip() if index >= 0 else ""


def required(row: list[str], index: int, field: str) -> str:
    """A cell that must not be empty."""
    value = row[index].strip() if index >= 0 else ""
    if not value:
        raise RowError("missing_required_field", f"{field} is empty")
    return value


def new_key(row: list[str], index: int, field: str, seen: Container[str]) -> str:
    """A required key that no earlier row had (`duplicate_key` otherwise)."""
    value = required(row, index, field)
    if value in seen:
        raise RowError("duplicate_key", f"{field} {value!r} repeated")
    return value


def number(text: str, field: str, low: float, high: float) -> float:
    """A float within [low, high]."""
    try:
        value = float(text)
    except ValueError:
        raise RowError("invalid_float", f"{field} {text!r} is not a number") from None
    if not low <= value <= high:  # also false for NaN
        raise RowError("number_out_of_range", f"{field} {text} is outside [{low:g}, {high:g}]")
    return value


def integer(text: str, field: str, low: int = 0) -> int:
    """An integer >= low."""
    try:
        value = int(text)
    except ValueError:
        raise RowError("invalid_integer", f"{field} {text!r} is not an integer") from None
    if value < low:
        raise RowError("number_out_of_range", f"{field} {value} is below {low}")
    return value


def enum(text: str, field: str, allowed: frozenset[str]) -> str:
    """One of the values the reference defines ("" when the field is optional and empty)."""
    if text not in allowed:
        raise RowError("unexpected_enum_value", f"{field} {text!r} is not one of "
                       f"{', '.join(sorted(v for v in allowed if v))}")  # fmt: skip
    return text


def color(text: str, field: str) -> str:
    """A colour: six hexadecimal digits (empty allowed)."""
    if text and (len(text) != 6 or not all(c in HEX for c in text)):
        raise RowError("invalid_color", f"{field} {text!r} is not six hexadecimal digits")
    return text


HEX = frozenset("0123456789abcdefABCDEF")
