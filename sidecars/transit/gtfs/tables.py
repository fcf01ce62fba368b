"""The parts every GTFS file reader shares: the validated feed as columns (`Trips`, `RawFeed`),
the problem report (`FeedError`) and a CSV table with its header resolved."""

from __future__ import annotations

import csv
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, NamedTuple

from ..schemas import FeedProblem
from ..source import FeedFiles

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
    shapes: dict[str, ShapeColumns] = field(default_factory=dict)


class Problems:
    """Collects problems, keeping the first MAX_PROBLEMS and counting the rest."""

    def __init__(self) -> None:
        self.items: list[FeedProblem] = []
        self.total = 0

    def add(self, file: str, line: int | None, message: str) -> None:
        """Record one problem."""
        self.total += 1
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(FeedProblem(file=file, line=line, message=message))

    def raise_if_any(self) -> None:
        """Reject the feed when anything was recorded."""
        if self.total:
            raise FeedError(self.items, self.total)


class Table:
    """A csv reader over one file with its header resolved to column indexes."""

    def __init__(self, name: str, fh: IO[str], problems: Problems) -> None:
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
        """The line number of the row being read."""
        return self.reader.line_num


def get(row: list[str], index: int) -> str:
    """A stripped cell; "" for an absent column."""
    return row[index].strip() if index >= 0 else ""
