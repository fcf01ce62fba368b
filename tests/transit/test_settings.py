"""TransitSettings from TRANSIT_* variables: the feed, realtime, metrics, places and server
sections, the clock, the rate limiter."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest

from sidecars.transit.settings import (
    DEFAULT_FACILITIES,
    DEFAULT_GTFS,
    DEFAULT_LOCATIONS,
    DEFAULT_VEHICLES,
    FeedSettings,
    MetricsSettings,
    PlacesSettings,
    SettingsError,
    TransitSettings,
    id_matcher,
)
from sidecars.usage.settings import Settings as UsageSettings

OPERATOR = {"TRANSIT_GTFS_SOURCE": "/srv/gtfs.zip"}


def test_nothing_configured_refuses_to_start() -> None:
    with pytest.raises(SettingsError, match=r"TRANSIT_GTFS_SOURCE is not set.*TRANSIT_DEMO=true"):
        TransitSettings.from_env({})


def test_demo_mode_serves_the_bundled_data() -> None:
    s = TransitSettings.from_env({"TRANSIT_DEMO": "true"})
    assert s.demo
    assert s.feed.source == DEFAULT_GTFS and s.realtime.vehicles_source == DEFAULT_VEHICLES
    assert s.places.facilities_dir == DEFAULT_FACILITIES
    assert s.places.locations_dir == DEFAULT_LOCATIONS
    assert s.realtime.trip_updates_source is None and s.realtime.alerts_source is None
    with pytest.raises(SettingsError, match="unset TRANSIT_GTFS_SOURCE or TRANSIT_DEMO"):
        TransitSettings.from_env({"TRANSIT_DEMO": "true", "TRANSIT_GTFS_SOURCE": "/x.zip"})


def test_an_operator_feed_brings_nothing_of_the_demo() -> None:
    s = TransitSettings.from_env(OPERATOR)
    assert not s.demo
    assert s == TransitSettings(feed=FeedSettings(source="/srv/gtfs.zip"))
    assert s.feed.source == "/srv/gtfs.zip"
    assert s.sources() == {
        "gtfs": "gtfs.zip",  # by name: the server's paths are not shown
        "vehicles": None,
        "trip_updates": None,
        "alerts": None,
        "vehicle_metadata": None,
        "facilities": None,
        "locations": None,
        "metrics": None,
    }
    assert s.feed.operational_day_start_hour == 4 and s.feed.stop_id_pattern is None
    assert s.metrics.line_id_pattern is None and s.metrics.by_stop_days == 0
    assert s.feed.refresh_seconds == 3600 and s.realtime.refresh_seconds == 10
    assert (s.feed.max_skipped_share, s.feed.max_drop_share) == (0.1, 0.25)
    assert (s.limits.max_body_bytes, s.limits.pip_max_stops) == (16384, 50)
    assert s.server.workers == 2 and s.server.port == 8080
    assert s.rate_limit is None


def test_cm_profile_holds_carris_metropolitana_id_rules() -> None:
    s = TransitSettings.from_env({**OPERATOR, "TRANSIT_PROFILE": "cm"})
    assert s.feed.stop_id_pattern == r"\d{6}" and s.metrics.line_id_pattern == r"\d{4}"
    valid = id_matcher(s.feed.stop_id_pattern)
    assert valid("750000")
    # Whole-string ASCII matching: a trailing newline or full-width digits are not 6 digits.
    assert not valid("750000\n") and not valid("７５００００") and not valid("7500001")
    # An explicit pattern wins over the profile; empty: no rule.
    s = TransitSettings.from_env(
        {**OPERATOR, "TRANSIT_PROFILE": "cm", "TRANSIT_STOP_ID_PATTERN": ""}
    )
    assert s.feed.stop_id_pattern is None


def test_values_are_parsed() -> None:
    s = TransitSettings.from_env(
        {
            "TRANSIT_GTFS_SOURCE": "https://example.org/gtfs.zip",
            "TRANSIT_VEHICLES_SOURCE": "",
            "TRANSIT_ALERTS_SOURCE": "/tmp/alerts.pb",
            "TRANSIT_GTFS_REFRESH_SECONDS": "60",
            "TRANSIT_NOW": "2014-06-10T08:00:00+10:00",
            "TRANSIT_TIMEZONE": "Europe/Lisbon",
            "TRANSIT_OPERATIONAL_DAY_START_HOUR": "3",
            "TRANSIT_PORT": "0",
            "TRANSIT_WORKERS": "4",
            "TRANSIT_RECORDS_DIR": "/data/records",
            "TRANSIT_METRICS_SINCE": "2025-06-01",
            "TRANSIT_INGEST_INTERVAL": "60",
            "TRANSIT_METRICS_REFRESH": "10",
            "TRANSIT_WALK_METERS": "250",
            "TRANSIT_LINE_ID_PATTERN": r"^\w+$",
            "TRANSIT_FACILITIES_DIR": "",
            "TRANSIT_LOCATIONS_DIR": "/data/locations",
            "OTHER": "ignored",
        }
    )
    assert s.feed.source == "https://example.org/gtfs.zip"
    assert s.realtime.vehicles_source is None  # empty switches a source off
    assert s.realtime.alerts_source == "/tmp/alerts.pb"
    assert s.feed.refresh_seconds == 60.0
    assert s.now == datetime(2014, 6, 10, 8, tzinfo=timezone(timedelta(hours=10)))
    assert s.feed.timezone == "Europe/Lisbon" and s.feed.operational_day_start_hour == 3
    assert s.server.port == 0 and s.server.workers == 4
    m, p = s.metrics, s.places
    assert m.db_path == Path("/data/records/metrics.sqlite")
    assert m.since == date(2025, 6, 1)
    assert (m.ingest_interval, m.refresh_interval, p.walk_meters) == (60.0, 10.0, 250.0)
    assert m.line_id_pattern == r"^\w+$" and p.facilities_dir is None
    assert p.locations_dir == "/data/locations"
    db = TransitSettings.from_env({**OPERATOR, "TRANSIT_METRICS_DB": "/x.sqlite"}).metrics.db_path
    assert db == Path("/x.sqlite")


def test_metrics_and_places_defaults() -> None:
    s = TransitSettings.from_env(OPERATOR)
    m, p = s.metrics, s.places
    assert m == MetricsSettings() and p == PlacesSettings()
    assert m.records_dir is None and m.db_path is None
    # An operator's deployment serves no facilities or locations it was not given.
    assert p.facilities_dir is None and p.locations_dir is None
    assert (
        TransitSettings.from_env({"TRANSIT_DEMO": "1"}).places.facilities_dir == DEFAULT_FACILITIES
    )
    assert (p.walk_meters, m.ingest_interval, m.since) == (400.0, 300.0, date(2024, 1, 1))


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TRANSIT_GTFS_REFRESH_SECONDS", "soon", "not a number"),
        ("TRANSIT_REALTIME_REFRESH_SECONDS", "-1", "must not be negative"),
        ("TRANSIT_NOW", "yesterday", "ISO 8601"),
        ("TRANSIT_NOW", "2014-06-10T08:00:00", "UTC offset"),
        ("TRANSIT_OPERATIONAL_DAY_START_HOUR", "24", "0..23"),
        ("TRANSIT_RATE_LIMIT", "maybe", "accepted: true, false"),
        ("TRANSIT_PROFILE", "tfl", "accepted: gtfs, cm"),
        ("TRANSIT_SHAPE_DIST_UNIT", "yards", "accepted: auto, m, km, mi, ft"),
        ("TRANSIT_FEED_MAX_DROP_SHARE", "1.5", "between 0 and 1"),
        ("TRANSIT_STOP_ID_PATTERN", "[0-9", "not a regex"),
        ("TRANSIT_WALK_METERS", "far", "TRANSIT_WALK_METERS"),
        ("TRANSIT_INGEST_INTERVAL", "-1", "TRANSIT_INGEST_INTERVAL"),
        ("TRANSIT_METRICS_SINCE", "2024-13-01", "TRANSIT_METRICS_SINCE"),
    ],
)
def test_bad_values(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        TransitSettings.from_env({**OPERATOR, name: value})


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        TransitSettings().now = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        TransitSettings().feed.source = ""  # type: ignore[misc]


def test_rate_limit_reads_the_usage_settings() -> None:
    env = {**OPERATOR, "TRANSIT_RATE_LIMIT": "true", "USAGE_RATELIMIT_FAILURE_MODE": "deny"}
    s = TransitSettings.from_env(env)
    assert s.rate_limit == UsageSettings.from_env(env)
    assert s.rate_limit.ratelimit_failure_mode == "deny"
    assert TransitSettings.from_env({**OPERATOR, "TRANSIT_RATE_LIMIT": "false"}).rate_limit is None
