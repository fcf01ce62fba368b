"""msgspec Structs of the transit API's network and realtime bodies, its health and its errors.

Declared once; the encoder and decoder live at module level so every request reuses them.
Field order is the order on the wire: the structs are declared alphabetically because the real
Carris Metropolitana API (a Node service that serialises sorted objects) sends its keys in that
order, and clients diff responses. The metrics and places bodies are declared with their
packages (`metrics/schemas.py`, `places/schemas.py`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

# -- errors: the real service's bodies --------------------------------------------------------


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


# -- network ----------------------------------------------------------------------------------


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


class Route(Line):
    """One route of `/v2/routes`: the fields of a line plus `line_id` (encoded with
    `sorted_encoder`)."""

    line_id: str


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


# -- arrivals, vehicles, alerts, passenger information panels ---------------------------------


class Arrival(Struct):
    """One arrival of `/v2/arrivals/by_stop/:id` (encoded with `sorted_encoder`)."""

    estimated_arrival: str | None
    estimated_arrival_unix: int | None
    headsign: str
    line_id: str
    observed_arrival: str | None
    observed_arrival_unix: int | None
    # null for an added trip that matches no pattern
    pattern_id: str | None
    route_id: str
    # SCHEDULED, CANCELED (the trip), SKIPPED (this stop), ADDED / DUPLICATED / UNSCHEDULED (a
    # trip the schedule does not list at this time: new, a copy of a scheduled one, or
    # running without a timetable), as GTFS-RT names them; the real service has no such field.
    schedule_relationship: str
    scheduled_arrival: str
    scheduled_arrival_unix: int
    stop_sequence: int
    trip_id: str
    vehicle_id: str | None


class PatternArrival(Arrival):
    """One arrival of `/v2/arrivals/by_pattern/:id` (an Arrival plus the stop)."""

    stop_id: str


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


# -- health -----------------------------------------------------------------------------------


class FeedProblem(Struct, omit_defaults=True):
    """One notice of a validation report: where, what, and the rows of other files that were
    left out with this one (a route's trips and their stop times), per file."""

    file: str
    line: int | None
    message: str
    dropped: dict[str, int] | None = None


class FileRows(Struct):
    """Rows of one feed file: read, and skipped for row-level problems."""

    file: str
    rows: int
    skipped: int


class NoticeSummary(Struct):
    """One notice code of a validation report: how often, and the first examples."""

    code: str
    severity: str
    count: int
    description: str
    examples: list[FeedProblem]
    # Rows of other files left out with this code's rows (not counted as notices of their own).
    dropped: dict[str, int] = {}


class ValidationReport(Struct):
    """What validating one feed found (`/status/feed`, `python -m sidecars.transit validate`)."""

    source: str
    version: str | None
    validated_at: int
    accepted: bool
    fatal: int
    errors: int
    warnings: int
    infos: int
    files: list[FileRows]
    notices: list[NoticeSummary]


class FeedStatus(Struct):
    """Body of `/status/feed`: the report of the feed being served and of the last attempt
    (the same one unless a later version was rejected or is unchanged)."""

    serving: ValidationReport | None
    last_attempt: ValidationReport | None


class FeedHealth(Struct):
    """State of the static GTFS feed in `/health`; `problems` are the fatal notices (file,
    line, message) of the last rejected attempt, empty once a feed is accepted."""

    status: str
    source: str
    version: str | None
    loaded_at: int | None
    load_seconds: float | None
    last_attempt_at: int | None
    last_error: str | None
    problems: list[FeedProblem]
    problem_count: int
    skipped_rows: int
    # Whether any service of the served feed runs on today's operational day.
    service_today: bool


class RealtimeHealth(Struct):
    """State of one GTFS-RT source in `/health`."""

    status: str
    source: str | None
    fetched_at: int | None
    entities: int
    last_error: str | None
    # Why some of the last good message is not served as current (too old), or why its
    # trips do not join the served feed (status "mismatch").
    reason: str | None
    # Trips it names that the served feed does not have (added trips aside).
    unknown_trips: int = 0


class AgencyHealth(Struct):
    """Realtime of one agency in `/health`: "ok" (current positions or trip updates),
    "silent" (its trips are running and nothing current is heard of them: degraded), "idle"
    (nothing running, nothing heard)."""

    status: str
    trips_running: int
    vehicles: int
    trip_updates: int
    # The newest position or trip update of the agency this worker has seen (Unix time).
    last_heard: int | None


class TransitHealth(Struct):
    """Body of `/health`: one component per data source, and where each data family comes
    from (`sources`: None when not configured, so served empty)."""

    status: str
    demo: bool
    # Why the status is not ok, one line per cause.
    reasons: list[str]
    sources: dict[str, str | None]
    feed: FeedHealth
    vehicles: RealtimeHealth
    trip_updates: RealtimeHealth
    alerts: RealtimeHealth
    vehicle_metadata: RealtimeHealth
    # Per agency of the served feed, when vehicle positions or trip updates are configured.
    agencies: dict[str, AgencyHealth]


json_encoder = msgspec.json.Encoder()
# For bodies whose Structs extend a shared base (a subclass's fields follow its base's): the
# real service lists their keys alphabetically, as each Struct here declares them.
sorted_encoder = msgspec.json.Encoder(order="sorted")
pip_request_decoder = msgspec.json.Decoder(Any)
