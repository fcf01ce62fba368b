"""No demo data in a real deployment: an operator who names their own
feed gets nothing of the bundled demo (vehicles, synthetic facilities, location lists); each
data family comes from its own setting or is empty, and /health says which are configured (by
name, not the server's paths). The bundled data is TRANSIT_DEMO=true: its vehicles run on its
own feed's trips."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import falcon.testing
from google.transit import gtfs_realtime_pb2 as rt

from sidecars.transit.app import Services, create_app
from sidecars.transit.demo import DEMO_NOW, demo_vehicles
from sidecars.transit.settings import DEFAULT_GTFS, DEFAULT_VEHICLES, FeedSettings, TransitSettings
from sidecars.transit.source import FeedFiles
from sidecars.transit.store import build_network

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
    # Named, without the server's paths.
    assert {k: v for k, v in health["sources"].items() if v is not None} == {"gtfs": "operator.zip"}
    assert health["feed"]["source"] == "operator.zip"
    assert str(tmp_path) not in client.simulate_get("/health").text
    assert str(tmp_path) not in client.simulate_get("/status/feed").text
    assert len(health["sources"]) == 8
    assert health["vehicles"]["status"] == "disabled"


def test_demo_mode_serves_the_bundled_data() -> None:
    client = serve({"TRANSIT_DEMO": "true", "TRANSIT_NOW": DEMO_NOW})
    vehicles = client.simulate_get("/v2/vehicles").json
    assert len(vehicles) == 37
    # The demo's vehicles run on the demo's routes, joined to its lines and patterns...
    routes = {r["id"]: r for r in client.simulate_get("/v2/routes").json}
    for v in vehicles:
        assert v["pattern_id"] in routes[v["route_id"]]["pattern_ids"], v
        assert v["line_id"] == routes[v["route_id"]]["line_id"]
    # ... and are in vehicles.pb (all of them are on a trip and current).
    pb = rt.FeedMessage()
    pb.ParseFromString(client.simulate_get("/v2/vehicles.pb").content)
    assert sorted(e.vehicle.vehicle.id for e in pb.entity) == sorted(v["id"] for v in vehicles)
    first = client.simulate_get(f"/v2/arrivals/by_stop/{vehicles[0]['stop_id']}").json
    assert any(a["vehicle_id"] == vehicles[0]["id"] for a in first)
    assert client.simulate_get("/v2/facilities/stores").json
    assert len(client.simulate_get("/v2/locations/districts").json["data"]) == 20
    health = client.simulate_get("/health").json
    assert health["demo"] is True and health["status"] == "ok", health["reasons"]
    assert health["sources"]["vehicles"] == "cairns_vehicle_positions.pb"
    assert health["sources"]["gtfs"] == "cairns_gtfs.zip"


def test_the_shipped_demo_positions_are_the_generators() -> None:
    net = build_network(FeedFiles.load(DEFAULT_GTFS, 30.0), FeedSettings(source=DEFAULT_GTFS))
    now = datetime.fromisoformat(DEMO_NOW).timestamp()
    assert demo_vehicles(net, now) == Path(DEFAULT_VEHICLES).read_bytes()
