"""msgspec Structs of the `/v2/metrics/*` bodies and of an ingest report.

Fields are alphabetical like the rest of the transit structs (the real API sends sorted keys).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from msgspec import Struct

Entry = TypeVar("Entry")  # a day or a month of a record


class DemandDay(Struct):
    """One day of a demand record: calendar attributes plus the count of valid validations."""

    day_type: str
    holiday: str
    notes: str
    period: str
    qty: int


class DemandMonth(Struct):
    """One month of a demand record."""

    qty: int


class _Record(Struct, Generic[Entry]):
    """A demand record: one agency's, line's or stop's counts by day or by month."""

    _id: str
    data: dict[str, Entry]
    description: str
    generated_at: str
    metric: str
    properties: dict[str, str]


class DemandRecord(_Record[DemandDay]):
    """`/v2/metrics/demand/*` by day: valid validations per day of one agency, line or stop."""


class DemandMonthRecord(_Record[DemandMonth]):
    """`/v2/metrics/demand/by_agency/month`: valid validations per month of one agency."""


class DatedQty(Struct):
    """The highest day or month of a series: its key and count."""

    date: str
    qty: int


class PeakDayMonth(Struct):
    """Highest day and highest month of one agency (or of the network)."""

    day: DatedQty
    month: DatedQty


class DemandPeaks(Struct):
    """`data` of the `/v2/metrics/demand/by_agency/records` record."""

    agencies: dict[str, PeakDayMonth]
    total: PeakDayMonth


class DemandPeaksRecord(Struct):
    """The single record of `/v2/metrics/demand/by_agency/records`."""

    _id: str
    data: DemandPeaks
    description: str
    generated_at: str
    metric: str
    properties: dict[str, str]


class TopLines(Struct):
    """One agency's entry of `/v2/metrics/demand/top_lines/by_agency`."""

    lines: list[DemandRecord]


class TopLinesByAgency(Struct):
    """Body of `/v2/metrics/demand/top_lines/by_agency`."""

    lastUpdated: str | None
    topLinesByAgency: dict[str, TopLines]


class ServiceDay(Struct):
    """Rides of one line of one agency on one operational day (`/v2/metrics/service/all`)."""

    agency_id: str
    # A number in the real API; a string here, as every other id (and ids like `110N` are
    # not numbers), so the field has one type.
    line_id: str
    operational_date: str
    pass_trip_count: int
    pass_trip_percentage: float
    total_trip_count: int


class ServiceAll(Struct):
    """Body of `/v2/metrics/service/all`."""

    data: list[ServiceDay]


class ComplaintCounts(Struct):
    """One entry of `/v2/metrics/complaints`: counts by category and channel."""

    _id: str
    complaints: int
    email: int
    filter_value: str
    info_requests: int
    last_update: str
    other: int
    phone: int
    total: int
    type: str


class Videowall(Struct):
    """`/v2/metrics/videowall/*`: `_<agency>_<measure>` keys, `_cm_` for the network."""

    data: dict[str, float | int]
    timestamp_resource: int


class IngestReject(Struct):
    """One rejected input row of a metrics ingest."""

    file: str
    line: int
    reason: str


class IngestReport(Struct):
    """Outcome of one metrics ingest run (CLI JSON output and the metrics health)."""

    files: int
    accepted: dict[str, int]
    rejected: int
    duplicates: int
    seconds: float
    refresh_seconds: float
    rejects: list[IngestReject]
