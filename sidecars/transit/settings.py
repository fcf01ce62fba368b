"""Settings of the transit sidecar: one frozen `TransitSettings` in sections, built from the
`TRANSIT_*` variables (and the usage API's `USAGE_*` ones when TRANSIT_RATE_LIMIT is on).

This is the only module of the sidecar that reads `os.environ`; see the settings tables in
sidecars/transit/README.md, metrics/README.md and places/README.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path

from sidecars.usage.settings import Settings as UsageSettings

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_GTFS = str(DATA_DIR / "cairns_gtfs.zip")
DEFAULT_VEHICLES = str(DATA_DIR / "bullrunner_vehicle_positions.pb")
# The shipped CAOP lists and the facility files (sidecars/transit/places/data/SOURCE.md).
DEFAULT_LOCATIONS = str(Path(__file__).resolve().parent / "places" / "data")
DEFAULT_FACILITIES = str(Path(DEFAULT_LOCATIONS) / "facilities")
DEFAULT_METRICS_SINCE = date(2024, 1, 1)


class SettingsError(ValueError):
    """A `TRANSIT_*` variable has a value that cannot be used."""


@dataclass(frozen=True, slots=True)
class FeedSettings:
    """The static GTFS feed, and the service day its arrivals and metrics are counted in."""

    source: str = DEFAULT_GTFS
    refresh_seconds: float = 3600.0
    filename: str = "CMET.zip"
    # None: the first agency's agency_timezone.
    timezone: str | None = None
    operational_day_start_hour: int = 4
    stop_id_pattern: str = r"^\d{6}$"


@dataclass(frozen=True, slots=True)
class RealtimeSettings:
    """The GTFS-Realtime sources (None: off), polled together."""

    vehicles_source: str | None = DEFAULT_VEHICLES
    trip_updates_source: str | None = None
    alerts_source: str | None = None
    vehicle_metadata_source: str | None = None
    refresh_seconds: float = 10.0
    vehicles_pb_max_age_seconds: float = 90.0


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
    line_id_pattern: str = r"^\d{4}$"
    by_stop_days: int = 31

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
    """The location lists and the facility files (None: no facilities, every kind 404 `[]`)."""

    locations_dir: str = DEFAULT_LOCATIONS
    facilities_dir: str | None = DEFAULT_FACILITIES
    walk_meters: float = 400.0
    place_match_meters: float = 1500.0


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """How `python -m sidecars.transit` runs gunicorn."""

    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 2
    log_level: str = "info"


@dataclass(frozen=True, slots=True)
class TransitSettings:
    """How the transit sidecar runs: one section per part of the API, plus what they share."""

    feed: FeedSettings = field(default_factory=FeedSettings)
    realtime: RealtimeSettings = field(default_factory=RealtimeSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    places: PlacesSettings = field(default_factory=PlacesSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    # Timeout of every URL fetch (static feed and realtime sources).
    http_timeout_seconds: float = 30.0
    # A pinned clock (demos and benchmarks on old feeds).
    now: datetime | None = None
    # TRANSIT_RATE_LIMIT=true: public requests go through the usage API's rate limiter,
    # configured by its USAGE_* settings (ratelimitd address, Redis, failure policy).
    rate_limit: UsageSettings | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TransitSettings:
        """Build the settings from `TRANSIT_*` variables (defaults serve the embedded data)."""
        env = _Env(os.environ if environ is None else environ)
        now = env.instant("NOW")
        start_hour = int(env.number("OPERATIONAL_DAY_START_HOUR", 4))
        if start_hour > 23:
            raise SettingsError("TRANSIT_OPERATIONAL_DAY_START_HOUR must be 0..23")
        feed = FeedSettings(
            source=env.text("GTFS_SOURCE", DEFAULT_GTFS),
            refresh_seconds=env.number("GTFS_REFRESH_SECONDS", 3600.0),
            filename=env.text("GTFS_FILENAME", "CMET.zip"),
            timezone=env.optional("TIMEZONE", None),
            operational_day_start_hour=start_hour,
            stop_id_pattern=env.text("STOP_ID_PATTERN", r"^\d{6}$"),
        )
        realtime = RealtimeSettings(
            vehicles_source=env.optional("VEHICLES_SOURCE", DEFAULT_VEHICLES),
            trip_updates_source=env.optional("TRIP_UPDATES_SOURCE", None),
            alerts_source=env.optional("ALERTS_SOURCE", None),
            vehicle_metadata_source=env.optional("VEHICLE_METADATA_SOURCE", None),
            refresh_seconds=env.number("REALTIME_REFRESH_SECONDS", 10.0),
            vehicles_pb_max_age_seconds=env.number("VEHICLES_PB_MAX_AGE_SECONDS", 90.0),
        )
        metrics = MetricsSettings(
            records_dir=env.optional("RECORDS_DIR", None),
            db=env.optional("METRICS_DB", None),
            since=env.day("METRICS_SINCE", DEFAULT_METRICS_SINCE),
            dates_file=env.optional("METRICS_DATES", None),
            ingest_interval=env.number("INGEST_INTERVAL", 300.0),
            refresh_interval=env.number("METRICS_REFRESH", 30.0),
            line_id_pattern=env.text("LINE_ID_PATTERN", r"^\d{4}$"),
            by_stop_days=int(env.number("METRICS_BY_STOP_DAYS", 31)),
        )
        places = PlacesSettings(
            locations_dir=env.text("LOCATIONS_DIR", DEFAULT_LOCATIONS),
            facilities_dir=env.optional("FACILITIES_DIR", DEFAULT_FACILITIES),
            walk_meters=env.number("WALK_METERS", 400.0),
            place_match_meters=env.number("PLACE_MATCH_METERS", 1500.0),
        )
        server = ServerSettings(
            host=env.text("HOST", "127.0.0.1"),
            port=int(env.number("PORT", 8080)),
            workers=max(1, int(env.number("WORKERS", 2))),
            log_level=env.text("LOG_LEVEL", "info").lower(),
        )
        rate_limit = env.flag("RATE_LIMIT", False)
        return cls(
            feed=feed,
            realtime=realtime,
            metrics=metrics,
            places=places,
            server=server,
            http_timeout_seconds=env.number("HTTP_TIMEOUT_SECONDS", 30.0),
            now=now,
            rate_limit=UsageSettings.from_env(env.environ) if rate_limit else None,
        )


class _Env:
    """`TRANSIT_<name>` lookups with the sidecar's rules and error messages."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def text(self, name: str, default: str) -> str:
        """A value; unset or empty: the default."""
        value = self.environ.get("TRANSIT_" + name, "").strip()
        return value or default

    def optional(self, name: str, default: str | None) -> str | None:
        """A value that can be switched off: unset is the default, set but empty is None."""
        value = self.environ.get("TRANSIT_" + name)
        if value is None:
            return default
        return value.strip() or None

    def number(self, name: str, default: float) -> float:
        """A non-negative number; unset or empty: the default."""
        raw = self.environ.get("TRANSIT_" + name, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"TRANSIT_{name}={raw!r} is not a number") from None
        if value < 0:
            raise SettingsError(f"TRANSIT_{name}={raw!r} must not be negative")
        return value

    def flag(self, name: str, default: bool) -> bool:
        """true/false (also 1/0, yes/no); unset or empty: the default."""
        raw = self.environ.get("TRANSIT_" + name, "").strip().lower()
        if not raw:
            return default
        if raw in ("1", "true", "yes"):
            return True
        if raw in ("0", "false", "no"):
            return False
        raise SettingsError(f"TRANSIT_{name}={raw!r} (accepted: true, false)")

    def day(self, name: str, default: date) -> date:
        """An ISO 8601 date; unset or empty: the default."""
        raw = self.environ.get("TRANSIT_" + name, "").strip()
        if not raw:
            return default
        try:
            return date.fromisoformat(raw)
        except ValueError:
            raise SettingsError(f"TRANSIT_{name}={raw!r} is not a date") from None

    def instant(self, name: str) -> datetime | None:
        """An ISO 8601 instant with a UTC offset; unset or empty: None."""
        raw = self.environ.get("TRANSIT_" + name, "").strip()
        if not raw:
            return None
        try:
            value = datetime.fromisoformat(raw)
        except ValueError:
            raise SettingsError(f"TRANSIT_{name}={raw!r} is not an ISO 8601 time") from None
        if value.tzinfo is None:
            raise SettingsError(f"TRANSIT_{name} needs a UTC offset, e.g. 2014-06-10T08:00+10:00")
        return value
