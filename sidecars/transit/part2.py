"""Part 2 of the transit API: metrics, locations and facilities, added to part 1's app.

    app = create_app(settings)
    register_routes(app, Part2Settings.from_env(), store)

`Part2Settings` is the only reader of the part-2 `TRANSIT_*` variables. The timezone and the
operational day start hour are part 1's (`TRANSIT_TIMEZONE`, `TRANSIT_OPERATIONAL_DAY_START_HOUR`,
read from `store.settings`), so arrivals and metrics always agree on what "today" is.
"""

from __future__ import annotations

import csv
import io
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import falcon.asgi

from sidecars.common.lifecycle import Lifecycle

from .metrics import resources as metrics_resources
from .metrics.service import MetricsService
from .places import resources as places_resources
from .places.facilities import DEFAULT_DIR as DEFAULT_FACILITIES
from .places.locations import DEFAULT_DIR as DEFAULT_LOCATIONS
from .places.service import Places
from .settings import SettingsError
from .store import TransitStore

DEFAULT_SINCE = date(2024, 1, 1)
DEFAULT_LINE_ID_PATTERN = r"^\d{4}$"


@dataclass(frozen=True, slots=True)
class Part2Settings:
    """How metrics, locations and facilities are served; see sidecars/transit/metrics/README.md
    and sidecars/transit/places/README.md."""

    # Metrics: where records arrive and where the SQLite store lives (default
    # `<records_dir>/metrics.sqlite`). Neither set: the metrics endpoints answer 404 `[]`.
    records_dir: str | None = None
    metrics_db: str | None = None
    metrics_since: date = DEFAULT_SINCE
    metrics_dates: str | None = None
    ingest_interval: float = 300.0
    metrics_refresh: float = 30.0
    line_id_pattern: str = DEFAULT_LINE_ID_PATTERN
    by_stop_days: int = 31
    # Locations and facilities.
    locations_dir: str = str(DEFAULT_LOCATIONS)
    facilities_dir: str | None = str(DEFAULT_FACILITIES)
    walk_meters: float = 400.0
    place_match_meters: float = 1500.0

    @property
    def metrics_db_path(self) -> Path | None:
        """The store file, or None when metrics are off."""
        if self.metrics_db:
            return Path(self.metrics_db)
        if self.records_dir:
            return Path(self.records_dir) / "metrics.sqlite"
        return None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Part2Settings:
        """Build from `TRANSIT_*` variables; an empty value means the default."""
        env = os.environ if environ is None else environ

        def text(name: str) -> str | None:
            value = env.get("TRANSIT_" + name, "").strip()
            return value or None

        def number(name: str, default: float) -> float:
            raw = text(name)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise SettingsError(f"TRANSIT_{name}={raw!r} is not a number") from None
            if value < 0:
                raise SettingsError(f"TRANSIT_{name}={raw!r} must not be negative")
            return value

        since_raw = text("METRICS_SINCE")
        since = DEFAULT_SINCE
        if since_raw is not None:
            try:
                since = date.fromisoformat(since_raw)
            except ValueError:
                raise SettingsError(f"TRANSIT_METRICS_SINCE={since_raw!r} is not a date") from None
        facilities = env.get("TRANSIT_FACILITIES_DIR")
        return cls(
            records_dir=text("RECORDS_DIR"),
            metrics_db=text("METRICS_DB"),
            metrics_since=since,
            metrics_dates=text("METRICS_DATES"),
            ingest_interval=number("INGEST_INTERVAL", 300.0),
            metrics_refresh=number("METRICS_REFRESH", 30.0),
            line_id_pattern=text("LINE_ID_PATTERN") or DEFAULT_LINE_ID_PATTERN,
            by_stop_days=int(number("METRICS_BY_STOP_DAYS", 31)),
            locations_dir=text("LOCATIONS_DIR") or str(DEFAULT_LOCATIONS),
            # Set but empty: no facilities at all (every kind 404 `[]`).
            facilities_dir=(
                str(DEFAULT_FACILITIES) if facilities is None else (facilities.strip() or None)
            ),
            walk_meters=number("WALK_METERS", 400.0),
            place_match_meters=number("PLACE_MATCH_METERS", 1500.0),
        )


class Part2:
    """The part-2 services of one worker, and their lifecycle."""

    def __init__(self, settings: Part2Settings, store: TransitStore) -> None:
        self.settings = settings
        self.store = store
        part1 = store.settings
        fixed_tz = ZoneInfo(part1.timezone) if part1.timezone else None

        def timezone() -> ZoneInfo | None:
            if fixed_tz is not None:
                return fixed_tz
            net = store.network
            return net.tz if net is not None else None

        self.metrics = MetricsService(
            db_path=settings.metrics_db_path,
            records_dir=Path(settings.records_dir) if settings.records_dir else None,
            since=settings.metrics_since,
            ingest_interval=settings.ingest_interval,
            refresh_interval=settings.metrics_refresh,
            start_hour=part1.operational_day_start_hour,
            timezone=timezone,
            clock=store.now,
            dates_file=Path(settings.metrics_dates) if settings.metrics_dates else None,
            by_stop_days=settings.by_stop_days,
        )
        self.places = Places(
            Path(settings.locations_dir),
            Path(settings.facilities_dir) if settings.facilities_dir else None,
            settings.walk_meters,
            settings.place_match_meters,
            network=lambda: store.network,
        )

    def register(self, app: falcon.asgi.App) -> None:
        """Add the routes and the refresh thread's lifecycle to the app."""
        for path, resource in metrics_resources.routes(self.metrics, self.settings.line_id_pattern):
            app.add_route(path, resource)
        for path, resource in places_resources.routes(self.places):
            app.add_route(path, resource)
        app.add_middleware(Lifecycle(startup=self.metrics.start, shutdown=self.metrics.stop))


def register_routes(app: falcon.asgi.App, settings: Part2Settings, store: TransitStore) -> None:
    """Add every metrics, locations and facilities route to part 1's app."""
    Part2(settings, store).register(app)


def feed_timezone(source: str) -> ZoneInfo:
    """The agency timezone of a local GTFS zip or directory (the CLI has no loaded feed)."""
    path = Path(source)
    if path.is_dir():
        data = (path / "agency.txt").read_bytes()
    else:
        with zipfile.ZipFile(path) as z:
            name = next(n for n in z.namelist() if n.rsplit("/", 1)[-1] == "agency.txt")
            data = z.read(name)
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"))))
    tz = next((r.get("agency_timezone", "").strip() for r in rows if r.get("agency_timezone")), "")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(f"{source}: no usable agency_timezone ({tz!r})") from None
