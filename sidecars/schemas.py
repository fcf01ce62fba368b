"""msgspec Structs for every body the HTTP sidecars send or receive.

Declared once and shared by both sidecars; encoders and decoders live at module level so
every request reuses them. Field order is the order on the wire: the transit structs are
declared alphabetically because the real Carris Metropolitana API (a Node service that
serialises sorted objects) sends its keys in that order, and clients diff responses.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

# --------------------------------------------------------------------------------------------
# Shared error bodies
# --------------------------------------------------------------------------------------------


class RouteNotFound(Struct):
    """Body of a 404 for a path no resource serves (the Fastify default the real API sends)."""

    message: str
    error: str = "Not Found"
    statusCode: int = 404


class ServerError(Struct):
    """Body of every 5xx: the real service's error-handler envelope."""

    message: str
    status: str = "error"
    timestamp: int = 0


# --------------------------------------------------------------------------------------------
# Transit API (sidecars/transit)
# --------------------------------------------------------------------------------------------


class Stop(Struct, kw_only=True):
    """One stop of `/v2/stops`."""

    district_id: str
    facilities: list[str]
    id: str
    lat: float
    line_ids: list[str]
    locality_id: str
    lon: float
    long_name: str
    municipality_id: str
    # Omitted, as by the real service, when the feed does not say.
    operational_status: str | UnsetType = UNSET
    pattern_ids: list[str]
    region_id: str
    route_ids: list[str]
    short_name: str
    tts_name: str
    wheelchair_boarding: bool


class Line(Struct):
    """One line of `/v2/lines` (a line groups the routes sharing a public short name)."""

    color: str
    district_ids: list[str]
    facilities: list[str]
    id: str
    locality_ids: list[str]
    long_name: str
    municipality_ids: list[str]
    pattern_ids: list[str]
    region_ids: list[str]
    route_ids: list[str]
    short_name: str
    stop_ids: list[str]
    text_color: str
    tts_name: str


class Route(Struct):
    """One route of `/v2/routes`: the fields of a line plus `line_id`."""

    color: str
    district_ids: list[str]
    facilities: list[str]
    id: str
    line_id: str
    locality_ids: list[str]
    long_name: str
    municipality_ids: list[str]
    pattern_ids: list[str]
    region_ids: list[str]
    route_ids: list[str]
    short_name: str
    stop_ids: list[str]
    text_color: str
    tts_name: str


class PathItem(Struct):
    """One stop of a pattern's path."""

    allow_drop_off: bool
    allow_pickup: bool
    distance: float
    distance_delta: float
    stop_id: str
    stop_sequence: int


class ScheduleItem(Struct):
    """One scheduled arrival of a trip group."""

    arrival_time: str
    arrival_time_24h: str
    stop_id: str
    stop_sequence: int


class TripGroup(Struct):
    """All GTFS trips of one pattern version with identical arrival times at every stop."""

    schedule: list[ScheduleItem]
    service_ids: list[str]
    trip_ids: list[str]
    valid_on: list[str]
    version_id: str


class Pattern(Struct):
    """One version of a pattern; `/v2/patterns/:id` answers a list of them."""

    color: str
    direction_id: int
    district_ids: list[str]
    facilities: list[str]
    headsign: str
    id: str
    line_id: str
    locality_ids: list[str]
    long_name: str
    municipality_ids: list[str]
    path: list[PathItem]
    region_ids: list[str]
    route_id: str
    shape_id: str
    short_name: str
    text_color: str
    trips: list[TripGroup]
    tts_headsign: str
    valid_on: list[str]
    version_id: str


class ShapePoint(Struct):
    """One point of a shape."""

    shape_dist_traveled: float
    shape_pt_lat: float
    shape_pt_lon: float
    shape_pt_sequence: int


class LineString(Struct):
    """GeoJSON LineString geometry; coordinates are `[lon, lat]`."""

    coordinates: list[tuple[float, float]]
    type: str = "LineString"


class GeoFeature(Struct):
    """GeoJSON Feature wrapping a shape's line."""

    geometry: LineString
    properties: dict[str, Any] = {}
    type: str = "Feature"


class Shape(Struct):
    """Body of `/v2/shapes/:id`; `extension` is the haversine length in whole metres."""

    extension: int
    geojson: GeoFeature
    points: list[ShapePoint]
    shape_id: str


class Arrival(Struct):
    """One arrival of `/v2/arrivals/by_stop/:id`."""

    estimated_arrival: str | None
    estimated_arrival_unix: int | None
    headsign: str
    line_id: str
    observed_arrival: str | None
    observed_arrival_unix: int | None
    pattern_id: str
    route_id: str
    scheduled_arrival: str
    scheduled_arrival_unix: int
    stop_sequence: int
    trip_id: str
    vehicle_id: str | None


class PatternArrival(Struct):
    """One arrival of `/v2/arrivals/by_pattern/:id` (an Arrival plus the stop)."""

    estimated_arrival: str | None
    estimated_arrival_unix: int | None
    headsign: str
    line_id: str
    observed_arrival: str | None
    observed_arrival_unix: int | None
    pattern_id: str
    route_id: str
    scheduled_arrival: str
    scheduled_arrival_unix: int
    stop_id: str
    stop_sequence: int
    trip_id: str
    vehicle_id: str | None


class Vehicle(Struct):
    """One vehicle of `/v2/vehicles`; metadata fields are null when no metadata is known."""

    agency_id: str
    bearing: float | None
    bikes_allowed: bool | None
    block_id: str | None
    capacity_seated: int | None
    capacity_standing: int | None
    capacity_total: int | None
    current_status: str | None
    door_status: str | None
    event_id: str
    id: str
    lat: float | None
    license_plate: str | None
    line_id: str | None
    lon: float | None
    make: str | None
    model: str | None
    owner: str | None
    pattern_id: str | None
    propulsion: str | None
    registration_date: str | None
    route_id: str | None
    schedule_relationship: str | None
    shift_id: str | None
    speed: float | None
    stop_id: str | None
    timestamp: int | None
    trip_id: str | None
    wheelchair_accessible: bool | None


# GTFS-RT Service Alerts as JSON: the GTFS-RT field names (snake_case), enums as strings.


class TimeRange(Struct, omit_defaults=True):
    """A GTFS-RT TimeRange with integer Unix seconds."""

    end: int | UnsetType = UNSET
    start: int | UnsetType = UNSET


class Translation(Struct, omit_defaults=True):
    """One language of a GTFS-RT TranslatedString."""

    text: str
    language: str | UnsetType = UNSET


class TranslatedString(Struct):
    """A GTFS-RT TranslatedString."""

    translation: list[Translation] = []


class Alert(Struct, omit_defaults=True):
    """One alert of `/v2/alerts`: the GTFS-RT Alert plus `alert_id` (the feed entity id)."""

    active_period: list[TimeRange] = []
    alert_id: str = ""
    cause: str | UnsetType = UNSET
    cause_detail: TranslatedString | UnsetType = UNSET
    communication_period: list[TimeRange] | UnsetType = UNSET
    description_text: TranslatedString | UnsetType = UNSET
    effect: str | UnsetType = UNSET
    effect_detail: TranslatedString | UnsetType = UNSET
    header_text: TranslatedString | UnsetType = UNSET
    image: dict[str, Any] | UnsetType = UNSET
    image_alternative_text: TranslatedString | UnsetType = UNSET
    impact_period: list[TimeRange] | UnsetType = UNSET
    informed_entity: list[dict[str, Any]] = []
    severity_level: str | UnsetType = UNSET
    tts_description_text: TranslatedString | UnsetType = UNSET
    tts_header_text: TranslatedString | UnsetType = UNSET
    url: TranslatedString | UnsetType = UNSET


class PipEstimate(Struct):
    """One row of a passenger information panel (`POST /v2/pips/estimates`)."""

    estimatedArrivalTime: str = "23:59:59"
    estimatedDepartureTime: str = "23:59:59"
    estimatedTimeString: str = "1 min"
    estimatedTimeUnixSeconds: int = 0
    journeyId: str | None = "0000_0_0|teste"
    lineId: str = "0000"
    observedArrivalTime: str | None = None
    observedDepartureTime: str | None = None
    observedDriverId: str = ""
    observedVehicleId: str | None = "0000"
    operatorId: str = ""
    patternId: str = "0000_0_0"
    stopHeadsign: str = "Olá :)"
    stopId: str = ""
    timetabledArrivalTime: str = "23:59:59"
    timetabledDepartureTime: str = "23:59:59"


class PipMessage(Struct):
    """Body of `/v2/pips/:pip/message`."""

    message: str


class FeedProblem(Struct):
    """One reason a static feed was rejected."""

    file: str
    line: int | None
    message: str


class FeedHealth(Struct):
    """State of the static GTFS feed in `/health`."""

    status: str
    source: str
    version: str | None
    loaded_at: int | None
    load_seconds: float | None
    last_attempt_at: int | None
    last_error: str | None
    problems: list[FeedProblem]
    problem_count: int


class RealtimeHealth(Struct):
    """State of one GTFS-RT source in `/health`."""

    status: str
    source: str | None
    fetched_at: int | None
    entities: int
    last_error: str | None


class TransitHealth(Struct):
    """Body of `/health`: one component per data source."""

    status: str
    feed: FeedHealth
    vehicles: RealtimeHealth
    trip_updates: RealtimeHealth
    alerts: RealtimeHealth
    vehicle_metadata: RealtimeHealth


json_encoder = msgspec.json.Encoder()
pip_request_decoder = msgspec.json.Decoder(Any)


# --------------------------------------------------------------------------------------------
# Transit API part 2: metrics, locations, facilities (sidecars/transit/{metrics,places})
# Fields alphabetical like the rest of the transit structs (the real API sends sorted keys).
# --------------------------------------------------------------------------------------------


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


class DemandRecord(Struct):
    """`/v2/metrics/demand/*` by day: valid validations per day of one agency, line or stop."""

    _id: str
    data: dict[str, DemandDay]
    description: str
    generated_at: str
    metric: str
    properties: dict[str, str]


class DemandMonthRecord(Struct):
    """`/v2/metrics/demand/by_agency/month`: valid validations per month of one agency."""

    _id: str
    data: dict[str, DemandMonth]
    description: str
    generated_at: str
    metric: str
    properties: dict[str, str]


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
    # A number in the real API; a line id that is not all digits is kept as a string.
    line_id: int | str
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


class District(Struct):
    """A district (or autonomous region) of `/v2/locations/districts`."""

    id: str
    name: str


class Municipality(Struct):
    """A municipality of `/v2/locations/municipalities`."""

    district_id: str
    id: str
    name: str


class Parish(Struct):
    """A parish of `/v2/locations/parishes`."""

    district_id: str
    id: str
    municipality_id: str
    name: str


class Locality(Struct):
    """A locality of `/v2/locations/localities`."""

    display: str
    district_id: str
    id: str
    municipality_id: str
    name: str
    parish_id: str


class LocationEnvelope(Struct):
    """Body of every `/v2/locations/*` endpoint."""

    # One of the four item types above; a list union cannot be typed more precisely.
    data: list[Any]
    status: str
    timestamp: int


class Contacts(Struct):
    """Contacts of a store or school."""

    address: str
    email: str
    google_place_id: str | None
    phone: str
    postal_code: str
    url: str


class OpeningHours(Struct):
    """Opening hours of a store: `HH:MM-HH:MM` intervals per weekday."""

    friday: list[str]
    monday: list[str]
    saturday: list[str]
    special: str
    sunday: list[str]
    thursday: list[str]
    tuesday: list[str]
    wednesday: list[str]


class Station(Struct):
    """A boat, light-rail, subway or train station, or a helpdesk."""

    district_id: str
    district_name: str
    id: str
    lat: float
    locality: str
    lon: float
    municipality_id: str
    municipality_name: str
    name: str
    parish_id: str
    parish_name: str
    region_id: str
    region_name: str
    stop_ids: list[str]


class PipLocation(Struct):
    """A passenger information panel (`/v2/facilities/pips`; no parish fields)."""

    district_id: str
    district_name: str
    id: str
    lat: float
    locality: str
    lon: float
    municipality_id: str
    municipality_name: str
    name: str
    region_id: str
    region_name: str
    stop_ids: list[str]


class TicketStore(Struct):
    """A ticket store (`/v2/facilities/stores`); `realtime` stays null (no queue feed)."""

    brand_name: str
    contacts: Contacts
    district_id: str
    district_name: str
    hours: OpeningHours
    id: str
    lat: float
    locality: str
    lon: float
    municipality_id: str
    municipality_name: str
    name: str
    parish_id: str
    parish_name: str
    realtime: dict[str, Any] | None
    region_id: str
    region_name: str
    short_name: str
    stop_ids: list[str]


class School(Struct):
    """A school (`/v2/facilities/schools`)."""

    contacts: Contacts
    district_id: str
    district_name: str
    grouping: str
    id: str
    lat: float
    locality: str
    lon: float
    municipality_id: str
    municipality_name: str
    name: str
    nature: str
    parish_id: str
    parish_name: str
    region_id: str
    region_name: str
    stop_ids: list[str]


class AvailableFacilities(Struct):
    """Body of `/v2/facilities`."""

    available_facilities: list[str]


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


# --------------------------------------------------------------------------------------------
# Usage API (sidecars/usage) and the shared rate-limit middleware (sidecars/ratelimit_middleware)
# camelCase like the usage endpoint's documented fields. The imports below sit here, not at the
# top, so that this section is a pure append to the transit part of the file.
# --------------------------------------------------------------------------------------------

import datetime as _dt  # noqa: E402
from typing import Annotated, Literal  # noqa: E402

PlanName = Literal["free", "startup", "pro"]
UsageWindowKind = Literal["billing_cycle", "rolling_30_days"]
_Count = Annotated[int, msgspec.Meta(ge=0)]


class SubscriptionPeriod(Struct):
    """The account's subscription term as UTC calendar dates; `end` is exclusive, null = open."""

    start: Annotated[
        _dt.date, msgspec.Meta(description="First UTC day of the subscription (ISO 8601 date).")
    ]
    end: Annotated[
        _dt.date | None,
        msgspec.Meta(
            description="UTC day the subscription ends (exclusive: it ends at 00:00Z of that "
            "day); null while it renews with no end date."
        ),
    ]


class UsagePeriod(Struct):
    """The instants the current counting window covers, half-open [start, end), in UTC."""

    start: Annotated[_dt.datetime, msgspec.Meta(description="Window start, 00:00Z of a UTC day.")]
    end: Annotated[
        _dt.datetime,
        msgspec.Meta(
            description="When this window ends: the next billing cycle's start, or for "
            "rolling_30_days the next 00:00Z, when the window slides by one day."
        ),
    ]


class UsageResponse(Struct):
    """Body of `GET /api/v2/user/usage`."""

    planName: Annotated[PlanName, msgspec.Meta(description="The account's current plan.")]
    planLimit: Annotated[_Count, msgspec.Meta(description="Requests the plan allows per window.")]
    currentUsage: Annotated[
        _Count, msgspec.Meta(description="Requests counted in the current window.")
    ]
    remainingUsage: Annotated[_Count, msgspec.Meta(description="max(planLimit - currentUsage, 0).")]
    usageWindow: Annotated[
        UsageWindowKind,
        msgspec.Meta(
            description="billing_cycle: the monthly cycle anchored on the subscription start "
            "day; rolling_30_days: the 30 UTC days ending now, today included."
        ),
    ]
    subscriptionPeriod: SubscriptionPeriod
    usagePeriod: UsagePeriod


class ApiError(Struct, omit_defaults=True):
    """Body of every error the usage API and the rate-limit middleware answer."""

    status: Annotated[int, msgspec.Meta(ge=400, le=599, description="The HTTP status code.")]
    error: Annotated[
        str,
        msgspec.Meta(
            description="Machine-readable code: invalid_request, invalid_format, unauthorized, "
            "invalid_token, not_found, method_not_allowed, rate_limited, quota_exceeded, "
            "store_unavailable, rate_limiter_unavailable, internal_error."
        ),
    ]
    message: str
    supportedValues: list[str] | None = None


class UsageHealth(Struct):
    """Body of the usage sidecar's `/health`."""

    status: Literal["ok", "unavailable"]
    store: Literal["ok", "unavailable"]
