"""Settings from TRANSIT_* variables."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from sidecars.transit.settings import DEFAULT_GTFS, DEFAULT_VEHICLES, Settings, SettingsError


def test_defaults_serve_the_embedded_data() -> None:
    s = Settings.from_env({})
    assert s.gtfs_source == DEFAULT_GTFS and s.vehicles_source == DEFAULT_VEHICLES
    assert s.trip_updates_source is None and s.alerts_source is None
    assert s.operational_day_start_hour == 4 and s.stop_id_pattern == r"^\d{6}$"
    assert s.gtfs_refresh_seconds == 3600 and s.realtime_refresh_seconds == 10
    assert s.workers == 2 and s.port == 8080


def test_values_are_parsed() -> None:
    s = Settings.from_env(
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
    assert s.gtfs_source == "https://example.org/gtfs.zip"
    assert s.vehicles_source is None  # empty switches a source off
    assert s.alerts_source == "/tmp/alerts.pb"
    assert s.gtfs_refresh_seconds == 60.0
    assert s.now == datetime(2014, 6, 10, 8, tzinfo=timezone(timedelta(hours=10)))
    assert s.timezone == "Europe/Lisbon" and s.operational_day_start_hour == 3
    assert s.port == 0 and s.workers == 4


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TRANSIT_GTFS_REFRESH_SECONDS", "soon", "not a number"),
        ("TRANSIT_REALTIME_REFRESH_SECONDS", "-1", "must not be negative"),
        ("TRANSIT_NOW", "yesterday", "ISO 8601"),
        ("TRANSIT_NOW", "2014-06-10T08:00:00", "UTC offset"),
        ("TRANSIT_OPERATIONAL_DAY_START_HOUR", "24", "0..23"),
    ],
)
def test_bad_values(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({name: value})


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Settings().port = 1  # type: ignore[misc]
