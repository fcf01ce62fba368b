"""Settings of the transit sidecar: one frozen value built from `TRANSIT_*` variables.

This is the only module of the sidecar that reads `os.environ`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_GTFS = str(DATA_DIR / "cairns_gtfs.zip")
DEFAULT_VEHICLES = str(DATA_DIR / "bullrunner_vehicle_positions.pb")


class SettingsError(ValueError):
    """A `TRANSIT_*` variable has a value that cannot be used."""


@dataclass(frozen=True, slots=True)
class Settings:
    """How the transit sidecar runs; see the settings table in sidecars/transit/README.md."""

    gtfs_source: str = DEFAULT_GTFS
    gtfs_refresh_seconds: float = 3600.0
    gtfs_filename: str = "CMET.zip"
    vehicles_source: str | None = DEFAULT_VEHICLES
    trip_updates_source: str | None = None
    alerts_source: str | None = None
    vehicle_metadata_source: str | None = None
    realtime_refresh_seconds: float = 10.0
    vehicles_pb_max_age_seconds: float = 90.0
    http_timeout_seconds: float = 30.0
    timezone: str | None = None
    operational_day_start_hour: int = 4
    stop_id_pattern: str = r"^\d{6}$"
    now: datetime | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 2
    log_level: str = "info"
    # TRANSIT_RATE_LIMIT=true: public requests go through the usage API's rate-limit
    # middleware (configured by its USAGE_* settings: ratelimitd address, Redis, policy).
    rate_limit: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build the settings from `TRANSIT_*` variables (defaults serve the embedded data)."""
        env = os.environ if environ is None else environ

        def text(name: str, default: str | None) -> str | None:
            value = env.get("TRANSIT_" + name)
            if value is None:
                return default
            # An empty value switches an optional source off.
            return value.strip() or None

        def number(name: str, default: float) -> float:
            raw = env.get("TRANSIT_" + name)
            if raw is None or not raw.strip():
                return default
            try:
                value = float(raw)
            except ValueError:
                raise SettingsError(f"TRANSIT_{name}={raw!r} is not a number") from None
            if value < 0:
                raise SettingsError(f"TRANSIT_{name}={raw!r} must not be negative")
            return value

        now_raw = text("NOW", None)
        now = None
        if now_raw is not None:
            try:
                now = datetime.fromisoformat(now_raw)
            except ValueError:
                raise SettingsError(f"TRANSIT_NOW={now_raw!r} is not an ISO 8601 time") from None
            if now.tzinfo is None:
                raise SettingsError("TRANSIT_NOW needs a UTC offset, e.g. 2014-06-10T08:00+10:00")
        start_hour = int(number("OPERATIONAL_DAY_START_HOUR", 4))
        if start_hour > 23:
            raise SettingsError("TRANSIT_OPERATIONAL_DAY_START_HOUR must be 0..23")
        return cls(
            gtfs_source=text("GTFS_SOURCE", DEFAULT_GTFS) or DEFAULT_GTFS,
            gtfs_refresh_seconds=number("GTFS_REFRESH_SECONDS", 3600.0),
            gtfs_filename=text("GTFS_FILENAME", "CMET.zip") or "CMET.zip",
            vehicles_source=text("VEHICLES_SOURCE", DEFAULT_VEHICLES),
            trip_updates_source=text("TRIP_UPDATES_SOURCE", None),
            alerts_source=text("ALERTS_SOURCE", None),
            vehicle_metadata_source=text("VEHICLE_METADATA_SOURCE", None),
            realtime_refresh_seconds=number("REALTIME_REFRESH_SECONDS", 10.0),
            rate_limit=(text("RATE_LIMIT", "false") or "false").lower() in ("1", "true", "yes"),
            vehicles_pb_max_age_seconds=number("VEHICLES_PB_MAX_AGE_SECONDS", 90.0),
            http_timeout_seconds=number("HTTP_TIMEOUT_SECONDS", 30.0),
            timezone=text("TIMEZONE", None),
            operational_day_start_hour=start_hour,
            stop_id_pattern=text("STOP_ID_PATTERN", r"^\d{6}$") or r"^\d{6}$",
            now=now,
            host=text("HOST", "127.0.0.1") or "127.0.0.1",
            port=int(number("PORT", 8080)),
            workers=max(1, int(number("WORKERS", 2))),
            log_level=(text("LOG_LEVEL", "info") or "info").lower(),
        )
