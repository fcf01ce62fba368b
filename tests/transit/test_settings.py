"""TransitSettings from TRANSIT_* variables: the feed, realtime and server sections, the clock,
the rate limiter."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from sidecars.transit.settings import (
    DEFAULT_GTFS,
    DEFAULT_VEHICLES,
    SettingsError,
    TransitSettings,
)
from sidecars.usage.settings import Settings as UsageSettings


def test_defaults_serve_the_embedded_data() -> None:
    s = TransitSettings.from_env({})
    assert s == TransitSettings()
    assert s.feed.source == DEFAULT_GTFS and s.realtime.vehicles_source == DEFAULT_VEHICLES
    assert s.realtime.trip_updates_source is None and s.realtime.alerts_source is None
    assert s.feed.operational_day_start_hour == 4 and s.feed.stop_id_pattern == r"^\d{6}$"
    assert s.feed.refresh_seconds == 3600 and s.realtime.refresh_seconds == 10
    assert s.server.workers == 2 and s.server.port == 8080
    assert s.rate_limit is None


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


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TRANSIT_GTFS_REFRESH_SECONDS", "soon", "not a number"),
        ("TRANSIT_REALTIME_REFRESH_SECONDS", "-1", "must not be negative"),
        ("TRANSIT_NOW", "yesterday", "ISO 8601"),
        ("TRANSIT_NOW", "2014-06-10T08:00:00", "UTC offset"),
        ("TRANSIT_OPERATIONAL_DAY_START_HOUR", "24", "0..23"),
        ("TRANSIT_RATE_LIMIT", "maybe", "accepted: true, false"),
    ],
)
def test_bad_values(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        TransitSettings.from_env({name: value})


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        TransitSettings().now = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        TransitSettings().feed.source = ""  # type: ignore[misc]


def test_rate_limit_reads_the_usage_settings() -> None:
    env = {"TRANSIT_RATE_LIMIT": "true", "USAGE_RATELIMIT_FAILURE_MODE": "deny"}
    s = TransitSettings.from_env(env)
    assert s.rate_limit == UsageSettings.from_env(env)
    assert s.rate_limit.ratelimit_failure_mode == "deny"
    assert TransitSettings.from_env({"TRANSIT_RATE_LIMIT": "false"}).rate_limit is None
