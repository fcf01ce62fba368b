"""The queries apps need, on the real feeds: stops near a point, vehicles and alerts of a line,
a route or a stop, one vehicle by id; and any query parameter an endpoint does not read is a
400 naming the ones it does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import falcon.testing
import pytest
from support import Clock

from sidecars.transit.geometry import haversine_m
from sidecars.transit.store import TransitStore

from .helpers import BULLRUNNER_VP, BULLRUNNER_ZIP, SMALL_FEED, write_feed
from .realtime.test_realtime import NOW, feed

PALM_COVE = (-16.74359, 145.668217)  # stop 750000 of the Cairns feed


def test_stops_near_a_point(cairns: falcon.testing.TestClient) -> None:
    lat, lon = PALM_COVE
    result = cairns.simulate_get(f"/v2/stops?lat={lat}&lon={lon}&radius=400")
    assert result.status_code == 200
    assert result.headers["cache-control"] == "public, max-age=3600"
    near = [s["id"] for s in result.json]
    # Nearest first; each item is the stop of /v2/stops.
    assert near == ["750000", "750040", "750001", "750039"]
    everything = {s["id"]: s for s in cairns.simulate_get("/v2/stops").json}
    assert result.json[1] == everything["750040"]
    assert cairns.simulate_get(f"/v2/stops?lat={lat}&lon={lon}&radius=0").json == [
        everything["750000"]
    ]
    assert cairns.simulate_get("/v2/stops?lat=0&lon=0&radius=5000").json == []


@pytest.mark.parametrize(
    "query, message",
    [
        ("lat=-16.7", "lat, lon and radius go together"),
        ("lat=-16.7&lon=145.6", "lat, lon and radius go together"),
        ("lat=-16.7&lon=145.6&radius=5001", "radius='5001': a decimal number from 0 to 5000"),
        ("lat=91&lon=145.6&radius=10", "lat='91'"),
        ("lat=x&lon=145.6&radius=10", "lat='x'"),
        ("lat=nan&lon=145.6&radius=10", "lat='nan'"),
        ("lat=1&lat=2&lon=145.6&radius=10", "lat is given 2 times"),
    ],
)
def test_stops_near_bad_queries(
    cairns: falcon.testing.TestClient, query: str, message: str
) -> None:
    result = cairns.simulate_get(f"/v2/stops?{query}")
    assert result.status_code == 400 and message in result.json["message"], result.json


@pytest.mark.parametrize(
    "path, known",
    [
        ("/v2/vehicles?line=110", "line_id, route_id"),
        ("/v2/stops?latitude=1", "lat, lon, radius"),
        ("/v2/arrivals/by_stop/750000?day=20140610", "date, limit"),
        ("/v2/lines?_=1", "none"),
        ("/v2/alerts?route=110-423", "line_id, route_id, stop_id"),
        ("/v2/locations/districts?x=1", "none"),
        ("/v2/metrics/videowall/sla?x=1", "none"),
        ("/health?verbose=1", "none"),
    ],
)
def test_unknown_query_parameters_are_refused(
    cairns: falcon.testing.TestClient, path: str, known: str
) -> None:
    result = cairns.simulate_get(path)
    assert result.status_code == 400
    assert result.headers["content-type"] == "application/json; charset=utf-8"
    assert result.json["message"].endswith(f"(accepted here: {known})"), result.json
    assert "unknown query parameter(s): " in result.json["message"]


@pytest.fixture
def bull_runner(
    tmp_path: Path, make_store: Callable[..., TransitStore], client_for
) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    """The real Bull Runner feed and vehicles, a minute after they were sent."""
    store = make_store(
        BULLRUNNER_ZIP, clock=Clock(1505314375 + 60), vehicles_source=str(BULLRUNNER_VP)
    )
    assert store.load_static()
    store.poll_realtime()
    return client_for(store)  # type: ignore[no-any-return]


def test_vehicles_of_a_line_or_route_and_one_vehicle(
    bull_runner: falcon.testing.TestClient,
) -> None:
    every = bull_runner.simulate_get("/v2/vehicles").json
    on_c = bull_runner.simulate_get("/v2/vehicles?route_id=C").json
    assert [v["id"] for v in on_c] == ["1|1538", "1|2252", "1|3004"]
    assert on_c == [v for v in every if v["route_id"] == "C"]
    assert bull_runner.simulate_get("/v2/vehicles?line_id=C").json == on_c
    assert bull_runner.simulate_get("/v2/vehicles?line_id=C&route_id=F").json == []
    assert bull_runner.simulate_get("/v2/vehicles?route_id=nope").json == []
    one = bull_runner.simulate_get("/v2/vehicles/1|1536")
    assert one.status_code == 200 and one.json == next(v for v in every if v["id"] == "1|1536")
    assert one.headers["cache-control"] == "public, max-age=5"
    assert bull_runner.simulate_get("/v2/vehicles/1%7C1536").json == one.json
    missing = bull_runner.simulate_get("/v2/vehicles/1|9999")
    assert (missing.status_code, missing.json) == (404, {})


def test_alerts_of_a_route_a_line_or_a_stop(
    tmp_path: Path, small_feed: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    alerts = tmp_path / "alerts.pb"
    alerts.write_bytes(
        feed(
            [
                {"id": "route", "alert": {"informed_entity": [{"route_id": "R1"}]}},
                {"id": "stop", "alert": {"informed_entity": [{"stop_id": "100009"}]}},
                {"id": "trip", "alert": {"informed_entity": [{"trip": {"trip_id": "T2"}}]}},
                {"id": "at", "alert": {"informed_entity": [{"route_id": "R1",
                                                            "stop_id": "100002"}]}},
            ]
        )
    )  # fmt: skip
    store = make_store(small_feed, clock=Clock(NOW), alerts_source=str(alerts))
    assert store.load_static()
    store.poll_realtime()
    client = client_for(store)

    def ids(query: str) -> list[str]:
        return [a["alert_id"] for a in client.simulate_get(f"/v2/alerts?{query}").json]

    # The operator's route id, its line, a trip of it: all match.
    assert ids("route_id=R1") == ["route", "trip", "at"]
    assert ids("line_id=1") == ["route", "trip", "at"]
    # A stop: alerts naming it, and alerts about a whole route (or a trip of it) serving it.
    assert ids("stop_id=100001") == ["route", "trip"]
    assert ids("stop_id=100002") == ["route", "trip", "at"]
    assert ids("stop_id=100009") == ["stop"]
    assert ids("route_id=R1&stop_id=100002") == ["route", "trip", "at"]
    assert ids("route_id=R9") == []


# Stops on both sides of the antimeridian (Fiji's latitude) and around the south pole.
FAR_STOPS = {
    "900001": (-17.0, 179.9996),
    "900002": (-17.0, -179.9997),  # 75 m east of 900001, across 180 degrees
    "900003": (-17.0, -179.995),  # 554 m
    "900004": (-17.0, 179.99),  # 1 km west: outside 1000 m
    "900005": (-89.995, 0.0),
    "900006": (-89.995, 180.0),  # 1.1 km from 900005 over the pole
    "900007": (-89.995, 90.0),
}


@pytest.fixture
def far_away(
    tmp_path: Path, make_store: Callable[..., TransitStore], client_for
) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    stops = SMALL_FEED["stops.txt"] + "".join(
        f"{sid},Far {sid},{lat},{lon},\n" for sid, (lat, lon) in FAR_STOPS.items()
    )
    path = write_feed(tmp_path / "far.zip", {"stops.txt": stops})
    store = make_store(path, clock=Clock(NOW))
    assert store.load_static()
    return client_for(store)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "lat, lon, radius",
    [
        (-17.0, 179.9996, 1000),
        (-17.0, -179.9999, 1000),
        (-17.0, 180, 600),
        (-17.0, -180, 5000),
        (-90, 0, 1000),
        (-90, 123.4, 600),
        (-89.999, -170, 1000),
        (-89.995, 90, 800),
    ],
)
def test_stops_near_agree_with_every_haversine(
    far_away: falcon.testing.TestClient, lat: float, lon: float, radius: float
) -> None:
    result = far_away.simulate_get(f"/v2/stops?lat={lat}&lon={lon}&radius={radius}")
    assert result.status_code == 200
    every = far_away.simulate_get("/v2/stops").json
    expected = sorted(
        (haversine_m(lat, lon, s["lat"], s["lon"]), s["id"])
        for s in every
        if haversine_m(lat, lon, s["lat"], s["lon"]) <= radius
    )
    assert [s["id"] for s in result.json] == [sid for _, sid in expected]
    assert expected, "each case has a stop in reach"


def test_the_antimeridian_and_the_pole_are_crossed(far_away: falcon.testing.TestClient) -> None:
    fiji = far_away.simulate_get("/v2/stops?lat=-17&lon=179.9996&radius=1000").json
    assert [s["id"] for s in fiji] == ["900001", "900002", "900003"]
    pole = far_away.simulate_get("/v2/stops?lat=-90&lon=0&radius=1000").json
    assert {s["id"] for s in pole} == {"900005", "900006", "900007"}


@pytest.mark.parametrize(
    "text", ["1_000", "\uff11\uff10\uff10", "1e3", "inf", "0x10", " 100", "100 ", "+-1", "."]
)
def test_only_plain_decimal_numbers(far_away: falcon.testing.TestClient, text: str) -> None:
    result = far_away.simulate_get("/v2/stops", params={"lat": "-17", "lon": "179", "radius": text})
    assert result.status_code == 400
    assert "a decimal number" in result.json["message"]
    limit = far_away.simulate_get("/v2/arrivals/by_stop/100001", params={"limit": text})
    assert limit.status_code == 400


@pytest.mark.parametrize("text", ["1000", "1000.", "999.50", "+10", ".5", "0"])
def test_plain_decimals_are_accepted(far_away: falcon.testing.TestClient, text: str) -> None:
    result = far_away.simulate_get("/v2/stops", params={"lat": "-17", "lon": "179", "radius": text})
    assert result.status_code == 200
