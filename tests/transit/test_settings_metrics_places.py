"""`Part2Settings.from_env` and `register_routes` on part 1's app."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import falcon.testing
import pytest

from sidecars.transit.app import create_app
from sidecars.transit.part2 import Part2Settings, feed_timezone, register_routes
from sidecars.transit.places.facilities import DEFAULT_DIR
from sidecars.transit.settings import SettingsError
from sidecars.transit.store import TransitStore

from .helpers import CAIRNS_ZIP


def test_defaults() -> None:
    s = Part2Settings.from_env({})
    assert s == Part2Settings()
    assert s.records_dir is None and s.metrics_db_path is None
    assert s.facilities_dir == str(DEFAULT_DIR)
    assert (s.walk_meters, s.ingest_interval, s.metrics_since) == (400.0, 300.0, date(2024, 1, 1))


def test_from_env() -> None:
    s = Part2Settings.from_env(
        {
            "TRANSIT_RECORDS_DIR": "/data/records",
            "TRANSIT_METRICS_SINCE": "2025-06-01",
            "TRANSIT_INGEST_INTERVAL": "60",
            "TRANSIT_METRICS_REFRESH": "10",
            "TRANSIT_WALK_METERS": "250",
            "TRANSIT_LINE_ID_PATTERN": r"^\w+$",
            "TRANSIT_FACILITIES_DIR": "",
            "TRANSIT_LOCATIONS_DIR": "/data/locations",
        }
    )
    assert s.metrics_db_path == Path("/data/records/metrics.sqlite")
    assert s.metrics_since == date(2025, 6, 1)
    assert (s.ingest_interval, s.metrics_refresh, s.walk_meters) == (60.0, 10.0, 250.0)
    assert s.line_id_pattern == r"^\w+$" and s.facilities_dir is None
    assert s.locations_dir == "/data/locations"
    assert Part2Settings.from_env({"TRANSIT_METRICS_DB": "/x.sqlite"}).metrics_db_path == Path(
        "/x.sqlite"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("WALK_METERS", "far"), ("INGEST_INTERVAL", "-1"), ("METRICS_SINCE", "2024-13-01")],
)
def test_invalid_values(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=f"TRANSIT_{name}"):
        Part2Settings.from_env({f"TRANSIT_{name}": value})


def test_register_routes_on_part1_app(cairns_store: TransitStore) -> None:
    app = create_app(cairns_store.settings, store=cairns_store)
    register_routes(app, Part2Settings(), cairns_store)
    client = falcon.testing.TestClient(app)
    assert client.simulate_get("/v2/locations/districts").status_code == 200
    assert client.simulate_get("/v2/facilities/pips").status_code == 200
    # Metrics are off without a records dir or store: the real service's missing-key answer.
    r = client.simulate_get("/v2/metrics/demand/by_line")
    assert r.status_code == 404 and r.json == []
    # Part 1's routes and error bodies are untouched.
    assert client.simulate_get("/v2/stops").status_code == 200
    assert client.simulate_get("/v2/nothing").json["statusCode"] == 404


def test_feed_timezone() -> None:
    assert str(feed_timezone(str(CAIRNS_ZIP))) == "Australia/Brisbane"
