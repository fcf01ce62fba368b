"""No demo data in a real deployment: an operator who names their own
feed gets nothing of the bundled demo (Bull Runner vehicles, synthetic facilities, location
lists); each data family comes from its own setting or is empty, and /health says which are
configured. The bundled data is TRANSIT_DEMO=true."""

from __future__ import annotations

from pathlib import Path

import falcon.testing
from google.transit import gtfs_realtime_pb2 as rt

from sidecars.transit.app import Services, create_app
from sidecars.transit.settings import TransitSettings

from .helpers import write_feed


def serve(env: dict[str, str]) -> falcon.testing.TestClient:
    """The whole app as the entry point builds it, its data loaded."""
    settings = TransitSettings.from_env(env)
    services = Services(settings)
    assert services.store.load_static()
    services.store.poll_realtime()
    return falcon.testing.TestClient(create_app(settings, services=services))


def test_an_operator_feed_serves_nothing_of_the_demo(tmp_path: Path) -> None:
    feed = write_feed(tmp_path / "operator.zip", {})
    client = serve({"TRANSIT_GTFS_SOURCE": str(feed), "TRANSIT_NOW": "2026-03-24T09:00:00+00:00"})
    assert {s["id"] for s in client.simulate_get("/v2/stops").json} == {
        "100001", "100002", "100003", "100009"
    }  # fmt: skip
    assert client.simulate_get("/v2/vehicles").json == []
    pb = rt.FeedMessage()
    pb.ParseFromString(client.simulate_get("/v2/vehicles.pb").content)
    assert len(pb.entity) == 0
    assert client.simulate_get("/v2/alerts").json == []
    assert client.simulate_get("/v2/facilities").json == {"available_facilities": []}
    for kind in ("stores", "schools", "train_stations", "pips"):
        r = client.simulate_get(f"/v2/facilities/{kind}")
        assert (r.status_code, r.json) == (404, [])
    districts = client.simulate_get("/v2/locations/districts").json
    assert districts["data"] == [] and districts["status"] == "success"
    assert client.simulate_get("/v2/metrics/videowall/sla").status_code == 404
    # Arrivals carry no realtime: nothing was made up.
    arrivals = client.simulate_get("/v2/arrivals/by_stop/100001").json
    assert arrivals and all(a["vehicle_id"] is None for a in arrivals)
    health = client.simulate_get("/health").json
    assert health["demo"] is False
    # Every family is listed; only the feed is configured.
    assert {k: v for k, v in health["sources"].items() if v is not None} == {"gtfs": str(feed)}
    assert len(health["sources"]) == 8
    assert health["vehicles"]["status"] == "disabled"


def test_demo_mode_serves_the_bundled_data() -> None:
    client = serve({"TRANSIT_DEMO": "true", "TRANSIT_NOW": "2014-06-10T08:00:00+10:00"})
    assert len(client.simulate_get("/v2/vehicles").json) == 10
    assert client.simulate_get("/v2/facilities/stores").json
    assert len(client.simulate_get("/v2/locations/districts").json["data"]) == 20
    health = client.simulate_get("/health").json
    assert health["demo"] is True
    assert health["sources"]["vehicles"].endswith("bullrunner_vehicle_positions.pb")
    assert health["sources"]["gtfs"].endswith("cairns_gtfs.zip")
