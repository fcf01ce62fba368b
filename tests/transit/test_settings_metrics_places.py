"""The metrics and places sections of TransitSettings, and the one app serving every part."""

from __future__ import annotations

import dataclasses
from datetime import date
from pathlib import Path

import falcon.testing
import pytest

from sidecars.transit.app import Services, create_app
from sidecars.transit.settings import (
    DEFAULT_FACILITIES,
    DEFAULT_LOCATIONS,
    MetricsSettings,
    PlacesSettings,
    SettingsError,
    TransitSettings,
)
from sidecars.transit.store import TransitStore

OPERATOR = {"TRANSIT_GTFS_SOURCE": "/srv/gtfs.zip"}


def test_defaults() -> None:
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


def test_from_env() -> None:
    s = TransitSettings.from_env(
        {
            **OPERATOR,
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
    m, p = s.metrics, s.places
    assert m.db_path == Path("/data/records/metrics.sqlite")
    assert m.since == date(2025, 6, 1)
    assert (m.ingest_interval, m.refresh_interval, p.walk_meters) == (60.0, 10.0, 250.0)
    assert m.line_id_pattern == r"^\w+$" and p.facilities_dir is None
    assert p.locations_dir == "/data/locations"
    db = TransitSettings.from_env({**OPERATOR, "TRANSIT_METRICS_DB": "/x.sqlite"}).metrics.db_path
    assert db == Path("/x.sqlite")


@pytest.mark.parametrize(
    ("name", "value"),
    [("WALK_METERS", "far"), ("INGEST_INTERVAL", "-1"), ("METRICS_SINCE", "2024-13-01")],
)
def test_invalid_values(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=f"TRANSIT_{name}"):
        TransitSettings.from_env({**OPERATOR, f"TRANSIT_{name}": value})


def test_one_app_serves_every_part(cairns_store: TransitStore) -> None:
    places = PlacesSettings(locations_dir=DEFAULT_LOCATIONS, facilities_dir=DEFAULT_FACILITIES)
    settings = dataclasses.replace(cairns_store.settings, places=places)
    app = create_app(settings, services=Services(settings, store=cairns_store))
    client = falcon.testing.TestClient(app)
    assert client.simulate_get("/v2/locations/districts").status_code == 200
    assert client.simulate_get("/v2/facilities/pips").status_code == 200
    # Metrics are off without a records dir or store: the real service's missing-key answer.
    r = client.simulate_get("/v2/metrics/demand/by_line")
    assert r.status_code == 404 and r.json == []
    # The network routes and the error bodies are the same app's.
    assert client.simulate_get("/v2/stops").status_code == 200
    assert client.simulate_get("/v2/nothing").json["statusCode"] == 404
