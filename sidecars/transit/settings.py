"""Settings of the transit sidecar: one frozen `TransitSettings` in sections, built from the
`TRANSIT_*` variables (and the usage API's `USAGE_*` ones when TRANSIT_RATE_LIMIT is on).

This is the only module of the sidecar that reads its environment (through the sidecars' one
reader, `sidecars.common.environment`); see the settings tables in
sidecars/transit/README.md, metrics/README.md and places/README.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sidecars.common.environment import Environment, SettingsError
from sidecars.common.server import Server

from .source import Bounds, redact

if TYPE_CHECKING:
    from sidecars.usage.settings import Settings as UsageSettings

# The bundled demo data (TRANSIT_DEMO=true); see data/SOURCE.md and places/data/SOURCE.md.
DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_GTFS = str(DATA_DIR / "cairns_gtfs.zip")
# Synthetic positions on the Cairns trips under way at the demo's clock (demo.py).
DEFAULT_VEHICLES = str(DATA_DIR / "cairns_vehicle_positions.pb")
# The shipped CAOP lists and the facility files (sidecars/transit/places/data/SOURCE.md).
DEFAULT_LOCATIONS = str(Path(__file__).resolve().parent / "places" / "data")
DEFAULT_FACILITIES = str(Path(DEFAULT_LOCATIONS) / "facilities")
DEFAULT_METRICS_SINCE = date(2024, 1, 1)


# Identifier rules per profile: the stop ids the arrivals and PIP endpoints accept and the line
# ids of `/v2/metrics/demand/by_line/:id`, matched against the whole id in ASCII. None: any id
# the feed (or the metrics) has; unknown ids are 404, not 400.
PROFILES: dict[str, dict[str, str | None]] = {
    "gtfs": {"stop_id_pattern": None, "line_id_pattern": None},
    # Carris Metropolitana: 6-digit stop ids, 4-digit line ids (the real service's checks).
    "cm": {"stop_id_pattern": r"\d{6}", "line_id_pattern": r"\d{4}"},
}
DIST_UNITS = ("auto", "m", "km", "mi", "ft")
# Settings that were replaced: set, they stop the start with the line saying what to use.
RETIRED = {
    "REALTIME_MAX_AGE_SECONDS": "one age limit per kind now, TRANSIT_VEHICLES_MAX_AGE_SECONDS, "
    "TRANSIT_TRIP_UPDATES_MAX_AGE_SECONDS and TRANSIT_ALERTS_MAX_AGE_SECONDS",
    "VEHICLES_PB_MAX_AGE_SECONDS": "/v2/vehicles and /v2/vehicles.pb share "
    "TRANSIT_VEHICLES_MAX_AGE_SECONDS",
}
STATUS_STYLES = ("info", "warning", "error", "ok")


def id_matcher(pattern: str | None) -> Callable[[str], bool]:
    """Whether an id matches a pattern as a whole, in ASCII (`750000\\n` and full-width digits
    do not match `\\d{6}`); no pattern accepts every id."""
    if pattern is None:
        return lambda value: True
    compiled = re.compile(pattern, re.ASCII)
    return lambda value: compiled.fullmatch(value) is not None


# The default bounds of a static feed (0 in the setting: none).
FEED_MAX_BYTES = 128 << 20
FEED_MAX_UNCOMPRESSED_BYTES = 512 << 20
FEED_MAX_ROWS = 8_000_000


@dataclass(frozen=True, slots=True)
class FeedSettings:
    """The static GTFS feed, how it is validated, and the service day its arrivals and
    metrics are counted in."""

    source: str = ""
    refresh_seconds: float = 3600.0
    filename: str = "CMET.zip"
    # None: the first agency's agency_timezone.
    timezone: str | None = None
    operational_day_start_hour: int = 4
    # None: any stop id of the feed (the "gtfs" profile); the "cm" profile: 6 digits.
    stop_id_pattern: str | None = None
    # Row-level problems may skip at most this share of any file's rows.
    max_skipped_share: float = 0.1
    # A refresh may lose at most this share of the served feed's stops, routes, trips or
    # stop_times.
    max_drop_share: float = 0.25
    # Unit of shape_dist_traveled: told from the geometry ("auto") or one of m, km, mi, ft.
    shape_dist_unit: str = "auto"
    # Examples kept per notice code in the validation report.
    report_examples: int = 10
    # HTTP headers sent when the source is a URL (credentials: never shown).
    headers: dict[str, str] = field(default_factory=dict)
    # How large a feed may be before it is refused unread: the bytes fetched (the zip),
    # the bytes of its files uncompressed, and the rows of all its files together. Carris
    # Metropolitana's feed (about 4 million stop_times and 300 MB of text) fits each with
    # room to grow by half again. The bounds are also what a bad feed may cost: reading is
    # roughly linear in rows (bench/results/transit_scale.md: 4 million stop_times in 15 s
    # at a 315 MB peak).
    max_bytes: int = FEED_MAX_BYTES
    max_uncompressed_bytes: int = FEED_MAX_UNCOMPRESSED_BYTES
    max_rows: int = FEED_MAX_ROWS

    @property
    def bounds(self) -> Bounds:
        """The size bounds of a fetch."""
        return Bounds(self.max_bytes or None, self.max_uncompressed_bytes or None)


@dataclass(frozen=True, slots=True)
class RealtimeSettings:
    """The GTFS-Realtime sources (None: off, served empty), polled together."""

    vehicles_source: str | None = None
    trip_updates_source: str | None = None
    alerts_source: str | None = None
    vehicle_metadata_source: str | None = None
    refresh_seconds: float = 10.0
    # What is current, per entity kind, for every endpoint alike (JSON, .pb, arrivals,
    # panels): a vehicle position, a trip update, or a whole message of that kind (its
    # header timestamp) older than this is not served as current, and `/health` says
    # degraded (0: no limit). Positions and trip updates go stale in 90 s; alerts are
    # announced and kept for longer, so their messages may be 10 minutes old.
    vehicles_max_age_seconds: float = 90.0
    trip_updates_max_age_seconds: float = 90.0
    alerts_max_age_seconds: float = 600.0
    # HTTP headers per source kind (vehicles, trip_updates, alerts, vehicle_metadata).
    headers: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def max_ages(self) -> dict[str, float]:
        """The age limit per entity kind (0: none)."""
        return {
            "vehicles": self.vehicles_max_age_seconds,
            "trip_updates": self.trip_updates_max_age_seconds,
            "alerts": self.alerts_max_age_seconds,
        }


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Where metrics records arrive and where their SQLite store lives (default
    `<records_dir>/metrics.sqlite`). Neither set: the metrics endpoints answer 404 `[]`."""

    records_dir: str | None = None
    db: str | None = None
    since: date = DEFAULT_METRICS_SINCE
    dates_file: str | None = None
    ingest_interval: float = 300.0
    refresh_interval: float = 30.0
    # None: any line id (the "gtfs" profile); the "cm" profile: 4 digits.
    line_id_pattern: str | None = None
    # 0: `/demand/by_stop` is the spec's empty list.
    by_stop_days: int = 0

    @property
    def db_path(self) -> Path | None:
        """The store file, or None when metrics are off."""
        if self.db:
            return Path(self.db)
        if self.records_dir:
            return Path(self.records_dir) / "metrics.sqlite"
        return None


@dataclass(frozen=True, slots=True)
class PlacesSettings:
    """The location lists (None: empty lists) and the facility files (None: no facilities,
    every kind 404 `[]`)."""

    locations_dir: str | None = None
    facilities_dir: str | None = None
    walk_meters: float = 400.0
    place_match_meters: float = 1500.0


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """What one request may ask for."""

    # Request bodies above this are answered 413.
    max_body_bytes: int = 16384
    # Stop ids per `POST /v2/pips/estimates` (more: 400 naming the cap).
    pip_max_stops: int = 50
    # The largest `radius` of `/v2/stops?lat&lon&radius`.
    max_radius_meters: float = 5000.0


@dataclass(frozen=True, slots=True)
class ServerSettings(Server):
    """How `python -m sidecars.transit` runs gunicorn, and its own endpoints."""

    # Bearer token of `POST /status/feed/refresh`; None: only local callers may refresh.
    refresh_token: str | None = None
    # A JSON object {title, body, style, more_info} served by `/v2/status/message`; None:
    # the message follows `/health`.
    status_message: str | None = None


@dataclass(frozen=True, slots=True)
class TransitSettings:
    """How the transit sidecar runs: one section per part of the API, plus what they share."""

    feed: FeedSettings = field(default_factory=FeedSettings)
    realtime: RealtimeSettings = field(default_factory=RealtimeSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    places: PlacesSettings = field(default_factory=PlacesSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    # TRANSIT_DEMO=true: the bundled demo data (Cairns GTFS, Bull Runner vehicles, synthetic
    # facilities, the Portuguese location lists) instead of an operator's sources.
    demo: bool = False
    # Timeout of every URL fetch (static feed and realtime sources).
    http_timeout_seconds: float = 30.0
    # A pinned clock (demos and benchmarks on old feeds).
    now: datetime | None = None
    # TRANSIT_RATE_LIMIT=true: public requests go through the usage API's rate limiter,
    # configured by its USAGE_* settings (ratelimitd address, Redis, failure policy).
    rate_limit: UsageSettings | None = None

    def sources(self) -> dict[str, str | None]:
        """Where each data family comes from (None: not configured, served empty), as it may
        be shown: URLs without their credentials, files and directories by name."""
        return {
            "gtfs": redact(self.feed.source or None),
            "vehicles": redact(self.realtime.vehicles_source),
            "trip_updates": redact(self.realtime.trip_updates_source),
            "alerts": redact(self.realtime.alerts_source),
            "vehicle_metadata": redact(self.realtime.vehicle_metadata_source),
            "facilities": redact(self.places.facilities_dir),
            "locations": redact(self.places.locations_dir),
            "metrics": redact(str(self.metrics.db_path)) if self.metrics.db_path else None,
        }

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, feed_required: bool = True
    ) -> TransitSettings:
        """Build the settings from `TRANSIT_*` variables.

        An operator names their feed (`TRANSIT_GTFS_SOURCE`) and each other source they have;
        the rest is served empty. `TRANSIT_DEMO=true` serves the bundled demo data instead.
        Tools that do not read the feed (the metrics CLI) pass `feed_required=False`.
        """
        env = Environment(environ, "TRANSIT_")
        for old, new in RETIRED.items():
            if env.is_set(old):
                raise SettingsError(f"TRANSIT_{old} is no longer read: {new}")
        demo = env.flag("DEMO", False)
        gtfs = env.text("GTFS_SOURCE", "")
        if demo and gtfs:
            raise SettingsError(
                "TRANSIT_DEMO=true serves the bundled demo feed; unset TRANSIT_GTFS_SOURCE "
                "or TRANSIT_DEMO"
            )
        if not demo and not gtfs and feed_required:
            raise SettingsError(
                "TRANSIT_GTFS_SOURCE is not set: point it at your GTFS feed (URL, zip or "
                "directory), or set TRANSIT_DEMO=true to serve the bundled demo data"
            )
        profile = PROFILES[env.choice("PROFILE", "gtfs", tuple(PROFILES))]
        now = env.instant("NOW")
        start_hour = int(env.number("OPERATIONAL_DAY_START_HOUR", 4))
        if start_hour > 23:
            raise SettingsError("TRANSIT_OPERATIONAL_DAY_START_HOUR must be 0..23")
        unit = env.choice("SHAPE_DIST_UNIT", "auto", DIST_UNITS)
        feed = FeedSettings(
            source=DEFAULT_GTFS if demo else gtfs,
            refresh_seconds=env.number("GTFS_REFRESH_SECONDS", 3600.0),
            filename=env.text("GTFS_FILENAME", "CMET.zip"),
            timezone=env.optional("TIMEZONE", None),
            operational_day_start_hour=start_hour,
            stop_id_pattern=env.pattern("STOP_ID_PATTERN", profile["stop_id_pattern"]),
            max_skipped_share=env.share("FEED_MAX_SKIPPED_SHARE", 0.1),
            max_drop_share=env.share("FEED_MAX_DROP_SHARE", 0.25),
            shape_dist_unit=unit,
            report_examples=int(env.number("FEED_REPORT_EXAMPLES", 10)),
            headers=env.headers("GTFS_SOURCE_HEADERS"),
            max_bytes=env.integer("FEED_MAX_BYTES", FEED_MAX_BYTES),
            max_uncompressed_bytes=env.integer(
                "FEED_MAX_UNCOMPRESSED_BYTES", FEED_MAX_UNCOMPRESSED_BYTES
            ),
            max_rows=env.integer("FEED_MAX_ROWS", FEED_MAX_ROWS),
        )
        realtime = RealtimeSettings(
            vehicles_source=env.optional("VEHICLES_SOURCE", DEFAULT_VEHICLES if demo else None),
            trip_updates_source=env.optional("TRIP_UPDATES_SOURCE", None),
            alerts_source=env.optional("ALERTS_SOURCE", None),
            vehicle_metadata_source=env.optional("VEHICLE_METADATA_SOURCE", None),
            refresh_seconds=env.number("REALTIME_REFRESH_SECONDS", 10.0),
            vehicles_max_age_seconds=env.number("VEHICLES_MAX_AGE_SECONDS", 90.0),
            trip_updates_max_age_seconds=env.number("TRIP_UPDATES_MAX_AGE_SECONDS", 90.0),
            alerts_max_age_seconds=env.number("ALERTS_MAX_AGE_SECONDS", 600.0),
            headers={
                kind: headers
                for kind in ("vehicles", "trip_updates", "alerts", "vehicle_metadata")
                if (headers := env.headers(f"{kind.upper()}_SOURCE_HEADERS"))
            },
        )
        metrics = MetricsSettings(
            records_dir=env.optional("RECORDS_DIR", None),
            db=env.optional("METRICS_DB", None),
            since=env.day("METRICS_SINCE", DEFAULT_METRICS_SINCE),
            dates_file=env.optional("METRICS_DATES", None),
            ingest_interval=env.number("INGEST_INTERVAL", 300.0),
            refresh_interval=env.number("METRICS_REFRESH", 30.0),
            line_id_pattern=env.pattern("LINE_ID_PATTERN", profile["line_id_pattern"]),
            by_stop_days=int(env.number("METRICS_BY_STOP_DAYS", 0)),
        )
        places = PlacesSettings(
            locations_dir=env.optional("LOCATIONS_DIR", DEFAULT_LOCATIONS if demo else None),
            facilities_dir=env.optional("FACILITIES_DIR", DEFAULT_FACILITIES if demo else None),
            walk_meters=env.number("WALK_METERS", 400.0),
            place_match_meters=env.number("PLACE_MATCH_METERS", 1500.0),
        )
        limits = LimitSettings(
            max_body_bytes=max(1, int(env.number("MAX_BODY_BYTES", 16384))),
            pip_max_stops=max(1, int(env.number("PIP_MAX_STOPS", 50))),
            max_radius_meters=env.number("MAX_RADIUS_METERS", 5000.0, lo=1.0),
        )
        server = ServerSettings(
            host=env.text("HOST", "127.0.0.1"),
            port=int(env.number("PORT", 8080)),
            workers=max(1, int(env.number("WORKERS", 2))),
            log_level=env.text("LOG_LEVEL", "info").lower(),
            refresh_token=env.optional("REFRESH_TOKEN", None),
            status_message=_status_message(env.optional("STATUS_MESSAGE", None)),
        )
        usage = None
        if env.flag("RATE_LIMIT", False):
            # The usage API's settings, read only when its rate limiter runs here: the
            # transit sidecar imports nothing of the usage one otherwise.
            from sidecars.usage.settings import Settings as UsageSettings

            usage = UsageSettings.from_env(env.environ)
        return cls(
            feed=feed,
            realtime=realtime,
            metrics=metrics,
            places=places,
            limits=limits,
            server=server,
            demo=demo,
            http_timeout_seconds=env.number("HTTP_TIMEOUT_SECONDS", 30.0),
            now=now,
            rate_limit=usage,
        )


def _status_message(raw: str | None) -> str | None:
    """TRANSIT_STATUS_MESSAGE: a JSON object with a `title` and a `style` of info, warning,
    error or ok (`body`, `more_info` optional)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("title"), str)
        or value.get("style") not in STATUS_STYLES
        or not all(isinstance(value.get(k, ""), str) for k in ("body", "more_info"))
    ):
        raise SettingsError(
            "TRANSIT_STATUS_MESSAGE must be a JSON object with a string `title`, a `style` of "
            f"{', '.join(STATUS_STYLES)}, and optional string `body` and `more_info`"
        )
    return raw
