"""Consistent, joinable fields, on the bundled real feeds: zero-padded
times, distances in metres, stop location ids that join /v2/locations/*, vehicle ids and
values, at most two patterns per route, gzip on every JSON body, the real API's root and an
explicit arrivals day."""

from __future__ import annotations

import gzip
import itertools
import json
import re
import struct
from collections.abc import Callable
from pathlib import Path

import falcon.testing
import pytest
from google.protobuf import json_format
from google.transit import gtfs_realtime_pb2 as rt
from support import Clock

from sidecars.transit.app import Services, create_app
from sidecars.transit.gtfs import read_feed
from sidecars.transit.network import Network
from sidecars.transit.places.locations import Locations
from sidecars.transit.settings import (
    DEFAULT_LOCATIONS,
    FeedSettings,
    PlacesSettings,
    RealtimeSettings,
    TransitSettings,
)
from sidecars.transit.source import FeedFiles
from sidecars.transit.store import TransitStore

from .helpers import BRISBANE, BULLRUNNER_ZIP, CAIRNS_ZIP, local_ts, write_feed

DATA = Path(__file__).resolve().parent / "network" / "data"
GOOGLE_SAMPLE = DATA / "google_sample"
HHMMSS = re.compile(r"\d{2}:\d{2}:\d{2}")
Client = Callable[[TransitStore], falcon.testing.TestClient]


def network(path: Path, locations: Locations | None = None, unit: str = "auto") -> Network:
    files = FeedFiles.load(str(path), 5)
    return Network(read_feed(files, dist_unit=unit), files.digest, 0.0, None, locations)


def patterns(net: Network) -> list[dict]:  # type: ignore[type-arg]
    """Every version of every pattern, as served."""
    out = []
    for pattern_id in net.patterns:
        body = net.pattern_body(pattern_id)
        assert body is not None
        out += json.loads(body.data)
    return out


def test_times_are_zero_padded_everywhere(make_store, client_for: Client) -> None:  # type: ignore[no-untyped-def]
    # The Google sample writes 6:00:00 and expands frequencies into trips.
    store = make_store(GOOGLE_SAMPLE, clock=Clock(local_ts("2008-01-02T05:00", BRISBANE)))
    assert store.load_static()
    client = client_for(store)
    times = [
        s[key]
        for v in patterns(store.network)
        for g in v["trips"]
        for s in g["schedule"]
        for key in ("arrival_time", "arrival_time_24h")
    ]
    assert times and all(HHMMSS.fullmatch(t) for t in times)
    arrivals = client.simulate_get("/v2/arrivals/by_stop/STAGECOACH").json
    assert any(a["trip_id"].startswith("STBA@") for a in arrivals)
    assert all(HHMMSS.fullmatch(a["scheduled_arrival"]) for a in arrivals)
    assert arrivals[0]["scheduled_arrival"] == "06:00:00"


def test_distances_are_metres_on_every_bundled_feed() -> None:
    # Cairns: shapes without shape_dist_traveled: the stops placed on the shape.
    cairns = network(CAIRNS_ZIP)
    assert cairns.raw.dist_factor is None
    for v in patterns(cairns):
        path = [p["distance"] for p in v["path"]]
        assert path == sorted(path) and path[-1] > 1000
        extension = json.loads(cairns.shape_body(v["shape_id"]).data)["extension"]  # type: ignore[union-attr]
        assert path[-1] <= extension + 1
        deltas = [p["distance_delta"] for p in v["path"]]
        assert abs(sum(deltas) - (path[-1] - path[0])) < 1
    # Bull Runner: shape_dist_traveled in metres, told from the geometry.
    bull = network(BULLRUNNER_ZIP)
    assert bull.raw.dist_factor == 1.0
    [shape] = [json.loads(bull.shape_body("0").data)]  # type: ignore[union-attr]
    assert shape["points"][1]["shape_dist_traveled"] == 69.3  # 69.2541192753 in the feed
    # The Google sample: no shapes, no distances: the straight lines between the stops.
    sample = network(GOOGLE_SAMPLE)
    for v in patterns(sample):
        path = [p["distance"] for p in v["path"]]
        assert path[0] == 0.0 and all(b > a for a, b in itertools.pairwise(path))


def test_a_configured_unit_wins(small_feed: Path) -> None:
    # The small feed's 1.5 per 1.4 km is told to be kilometres; an operator may say metres.
    [v] = json.loads(network(small_feed, unit="m").pattern_body("R1_0").data)  # type: ignore[union-attr]
    assert [p["distance"] for p in v["path"]] == [0.0, 1.5, 3.0]


def test_stop_location_ids_join_the_location_lists(tmp_path: Path) -> None:
    # 504 real Carris Metropolitana stops (every 25th), which name their locality.
    stops = (DATA / "cm_stops_every_25th.txt").read_text(encoding="utf-8")
    first, second = (line.split(",")[0] for line in stops.splitlines()[1:3])
    files = {
        "agency.txt": "agency_id,agency_name,agency_url,agency_timezone\n"
        "CM,Carris Metropolitana,https://www.carrismetropolitana.pt,Europe/Lisbon\n",
        "stops.txt": stops,
        "routes.txt": "route_id,agency_id,route_short_name,route_long_name,route_type\n"
        "1001_0,CM,1001,Alcochete - Almada,3\n",
        "calendar_dates.txt": "service_id,date,exception_type\nS,20260324,1\n",
        "trips.txt": "route_id,service_id,trip_id\n1001_0,S,T1\n",
        "stop_times.txt": "trip_id,arrival_time,departure_time,stop_id,stop_sequence\n"
        f"T1,08:00:00,08:00:00,{first},1\nT1,08:10:00,08:10:00,{second},2\n",
    }
    feed = write_feed(tmp_path / "cm.zip", files, base={})
    locations = Locations(Path(DEFAULT_LOCATIONS))
    net = network(feed, locations)
    served = json.loads(net.stops_body.data)
    assert len(served) == 504 and set(net.raw.report.counts) == {
        ("missing_recommended_file", "warning")
    }
    ids = {
        kind: {x.id for x in getattr(locations, kind)}
        for kind in ("districts", "municipalities", "localities")
    }
    for stop in served:
        assert stop["district_id"] in ids["districts"]
        assert stop["municipality_id"] in ids["municipalities"]
        assert stop["locality_id"] in ids["localities"]
    alcochete = next(s for s in served if s["id"] == "010001")
    assert (alcochete["district_id"], alcochete["municipality_id"]) == ("15", "1502")
    assert alcochete["locality_id"] == "1502-alcochete"
    # Served by the app, they join /v2/locations/localities.
    store = TransitStore(
        _settings(feed, PlacesSettings(locations_dir=DEFAULT_LOCATIONS)),
        clock=Clock(0),
        locations=locations,
    )
    assert store.load_static()
    services = Services(store.settings, store=store)
    client = falcon.testing.TestClient(create_app(store.settings, services=services))
    listed = {x["id"] for x in client.simulate_get("/v2/locations/localities").json["data"]}
    assert {s["locality_id"] for s in client.simulate_get("/v2/stops").json} <= listed


def _settings(feed: Path, places: PlacesSettings) -> TransitSettings:
    return TransitSettings(
        feed=FeedSettings(source=str(feed)),
        realtime=RealtimeSettings(vehicles_source=None),
        places=places,
    )


def test_every_route_id_is_the_operators_on_every_bundled_feed(small_feed: Path) -> None:
    for feed in (CAIRNS_ZIP, BULLRUNNER_ZIP, GOOGLE_SAMPLE, small_feed):
        net = network(feed)
        routes = json.loads(net.routes_body.data)
        pattern_ids = [p for r in routes for p in r["pattern_ids"]]
        assert sorted(pattern_ids) == sorted(net.patterns), feed  # each pattern in one route
        # Each API route is a GTFS route, under the id the feed (and its GTFS-RT) uses.
        assert sorted(r["id"] for r in routes) == sorted(
            {row.route_id for row in net.raw.routes}
            & {net.raw.routes[r].route_id for r in net.raw.trip_route}
        )
        # A pattern names the route that lists it.
        by_id = {r["id"]: r for r in routes}
        assert all(v["id"] in by_id[v["route_id"]]["pattern_ids"] for v in patterns(net))


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def test_vehicles_ids_units_precision_and_pb(
    small_feed: Path, tmp_path: Path, make_store, client_for: Client
) -> None:  # type: ignore[no-untyped-def]
    now = local_ts("2026-03-24T09:05")
    message = json_format.ParseDict(
        {
            "header": {"gtfs_realtime_version": "2.0", "timestamp": int(now)},
            "entity": [
                {"id": "e1", "vehicle": {
                    "trip": {"trip_id": "T2"}, "vehicle": {"id": "1160"},
                    "position": {"latitude": 38.7101234, "longitude": -9.1109876, "speed": 8.3},
                    "occupancy_status": "FEW_SEATS_AVAILABLE", "timestamp": int(now) - 5}},
            ],
        },
        rt.FeedMessage(),
    )  # fmt: skip
    vp = tmp_path / "vp.pb"
    vp.write_bytes(message.SerializeToString())
    store = make_store(small_feed, clock=Clock(now), vehicles_source=str(vp))
    assert store.load_static()
    store.poll_realtime()
    client = client_for(store)
    [v] = client.simulate_get("/v2/vehicles").json
    assert v["id"] == "A|1160" and v["agency_id"] == "A"
    assert v["timestamp"] == int(now) - 5  # Unix seconds, as the real API's v2
    # The float32 values of GTFS-RT at their precision, not widened (38.71012496948242).
    assert v["lat"] == 38.710125 and v["lon"] == -9.110988 and v["speed"] == 8.3
    assert f32(v["lat"]) == f32(38.7101234)
    pb = rt.FeedMessage()
    pb.ParseFromString(client.simulate_get("/v2/vehicles.pb").content)
    [entity] = pb.entity
    assert entity.vehicle.occupancy_status == rt.VehiclePosition.FEW_SEATS_AVAILABLE
    assert entity.vehicle.trip.HasField("direction_id") and entity.vehicle.trip.direction_id == 0
    assert entity.vehicle.vehicle.label == "1160"


def test_gzip_on_every_json_body_above_the_threshold(cairns: falcon.testing.TestClient) -> None:
    gz = {"Accept-Encoding": "gzip"}
    for method, path, body in (
        ("GET", "/v2/arrivals/by_stop/750000", None),
        ("GET", "/health", None),
        ("GET", "/status/feed", None),
        ("POST", "/v2/pips/estimates", b'{"stops": ["750000", "750001"]}'),
    ):
        result = cairns.simulate_request(method, path, headers=gz, body=body)
        assert result.status_code == 200, path
        assert result.headers.get("content-encoding") == "gzip", path
        assert "Accept-Encoding" in result.headers["vary"]
        plain = cairns.simulate_request(method, path, body=body)
        assert "content-encoding" not in plain.headers
        assert json.loads(gzip.decompress(result.content)) == plain.json or path == "/health"
    # Small bodies stay as they are.
    small = cairns.simulate_get("/v2/pips/X/message", headers=gz)
    assert "content-encoding" not in small.headers


def test_root_and_an_explicit_arrivals_day(cairns: falcon.testing.TestClient) -> None:
    for path in ("/v2", "/v2/"):
        root = cairns.simulate_get(path)
        assert (root.status_code, root.text) == (200, "Jusi was here!")
        assert root.headers["content-type"] == "application/json; charset=utf-8"
    # Monday 2014-06-09 was a public holiday (Sunday service); the default is today (Tuesday).
    monday = cairns.simulate_get("/v2/arrivals/by_stop/750000", params={"date": "20140609"}).json
    assert monday and all("Sunday" in a["trip_id"] for a in monday)
    assert monday[0]["scheduled_arrival_unix"] < local_ts("2014-06-10T04:00", BRISBANE)
    today = cairns.simulate_get("/v2/arrivals/by_stop/750000").json
    assert all("Weekday" in a["trip_id"] for a in today)
    pattern_id = today[0]["pattern_id"]
    by_pattern = cairns.simulate_get(f"/v2/arrivals/by_pattern/{pattern_id}?date=20140609")
    assert by_pattern.status_code == 200
    for bad in ("2014-06-09", "20141340", "yesterday"):
        r = cairns.simulate_get("/v2/arrivals/by_stop/750000", params={"date": bad})
        assert (r.status_code, r.text) == (400, "[]")


@pytest.mark.parametrize("path", ["/v2/nothing", "/v2/stops/750000"])
def test_not_found_message_has_no_v2_prefix(cairns: falcon.testing.TestClient, path: str) -> None:
    body = cairns.simulate_get(path).json
    assert body["message"] == f"Route GET:{path[3:]} not found"
