"""GTFS-RT merge: vehicles joined to trips, TripUpdate estimates, observed times, alerts,
vehicle metadata, and a broken realtime fetch keeping the last good one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import falcon.testing
import pytest
from google.protobuf import json_format
from google.transit import gtfs_realtime_pb2 as rt
from support import Clock

from sidecars.transit.store import TransitStore

from ..helpers import BULLRUNNER_VP, BULLRUNNER_ZIP, http_files, local_ts

NOW = local_ts("2026-03-24T09:05")  # a Tuesday in Lisbon (WET, UTC+0)


def feed(entities: list[dict], timestamp: float = NOW) -> bytes:
    message = json_format.ParseDict(
        {
            "header": {
                "gtfs_realtime_version": "2.0",
                "incrementality": "FULL_DATASET",
                "timestamp": int(timestamp),
            },
            "entity": entities,
        },
        rt.FeedMessage(),
    )
    return message.SerializeToString()


VEHICLES = [
    {"id": "e1", "vehicle": {
        "trip": {"trip_id": "T2", "route_id": "R1"}, "vehicle": {"id": "V1"},
        "position": {"latitude": 38.71, "longitude": -9.11, "bearing": 90, "speed": 8.5},
        "current_stop_sequence": 2, "stop_id": "100002", "current_status": "INCOMING_AT",
        "timestamp": int(NOW) - 10}},
    {"id": "e2", "vehicle": {
        "trip": {"trip_id": "TLATE"}, "vehicle": {"id": "OLD"},
        "position": {"latitude": 38.7, "longitude": -9.1}, "timestamp": int(NOW) - 1000}},
    {"id": "e3", "vehicle": {"vehicle": {"id": "PARKED"},
                             "position": {"latitude": 38.7, "longitude": -9.1}}},
]  # fmt: skip
TRIP_UPDATES = [
    {"id": "u1", "trip_update": {
        "trip": {"trip_id": "T2"}, "vehicle": {"id": "V1"},
        "stop_time_update": [
            {"stop_sequence": 1, "arrival": {"time": int(local_ts("2026-03-24T09:01"))}},
            {"stop_sequence": 3, "arrival": {"delay": 300}},
        ]}},
    {"id": "u2", "trip_update": {
        "trip": {"trip_id": "T1"}, "vehicle": {"id": "V9"},
        "stop_time_update": [{"stop_id": "100002", "arrival": {"delay": 120}}]}},
    {"id": "u3", "trip_update": {
        "trip": {"trip_id": "TBACK"},
        "stop_time_update": [{"stop_sequence": 1, "schedule_relationship": "SKIPPED"}]}},
]  # fmt: skip
ALERTS = [
    {"id": "a1", "alert": {
        "active_period": [{"start": 1774000000, "end": 1775000000}],
        "informed_entity": [{"route_id": "R1"}, {"stop_id": "100002"}],
        "cause": "CONSTRUCTION", "effect": "DETOUR",
        "header_text": {"translation": [{"text": "Obras", "language": "pt"}]},
        "description_text": {"translation": [{"text": "Desvio na paragem Second"}]}}},
]  # fmt: skip
METADATA = (
    "id,make,model,owner,propulsion,license_plate,registration_date,capacity_seated,"
    "capacity_standing,capacity_total,bikes_allowed,wheelchair_accessible,door_status\n"
    "A|V1,Mercedes,Citaro,Test Agency,diesel,AA-00-00,2023-01-01,30,50,80,0,1,CLOSED\n"
)


@pytest.fixture
def rt_files(tmp_path: Path) -> dict[str, Path]:
    files = {
        "vehicles_source": tmp_path / "vp.pb",
        "trip_updates_source": tmp_path / "tu.pb",
        "alerts_source": tmp_path / "alerts.pb",
        "vehicle_metadata_source": tmp_path / "vehicles.csv",
    }
    files["vehicles_source"].write_bytes(feed(VEHICLES))
    files["trip_updates_source"].write_bytes(feed(TRIP_UPDATES))
    files["alerts_source"].write_bytes(feed(ALERTS))
    files["vehicle_metadata_source"].write_text(METADATA)
    return files


@pytest.fixture
def rt_store(small_feed: Path, rt_files: dict[str, Path], make_store: Callable) -> TransitStore:  # type: ignore[type-arg]
    # Positions and messages up to ten minutes old are current (OLD, 1000 s old, is not).
    store = make_store(
        small_feed,
        clock=Clock(NOW),
        vehicles_max_age_seconds=600,
        trip_updates_max_age_seconds=600,
        **{k: str(v) for k, v in rt_files.items()},
    )
    assert store.load_static()
    store.poll_realtime()
    return store


@pytest.fixture
def client(rt_store: TransitStore, client_for) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    return client_for(rt_store)


def test_vehicle_joined_to_its_trip_and_metadata(client: falcon.testing.TestClient) -> None:
    vehicles = {v["id"]: v for v in client.simulate_get("/v2/vehicles").json}
    # OLD was last heard from 1000 s ago: not a current position, so not listed.
    assert set(vehicles) == {"A|V1", "A|PARKED"}
    v1 = vehicles["A|V1"]
    assert v1["agency_id"] == "A" and v1["trip_id"] == "T2" and v1["route_id"] == "R1"
    assert v1["line_id"] == "1" and v1["pattern_id"] == "R1_0"
    assert v1["block_id"] == "B1" and v1["stop_id"] == "100002"
    assert v1["current_status"] == "INCOMING_AT" and v1["schedule_relationship"] == "SCHEDULED"
    assert v1["speed"] == 8.5 and v1["bearing"] == 90.0 and v1["timestamp"] == int(NOW) - 10
    assert v1["make"] == "Mercedes" and v1["model"] == "Citaro" and v1["owner"] == "Test Agency"
    assert v1["capacity_total"] == 80 and v1["capacity_seated"] == 30
    assert v1["license_plate"] == "AA-00-00" and v1["registration_date"] == "20230101"
    assert v1["wheelchair_accessible"] is True and v1["bikes_allowed"] is False
    assert v1["door_status"] == "CLOSED" and v1["propulsion"] == "diesel"
    assert vehicles["A|PARKED"]["trip_id"] is None and vehicles["A|PARKED"]["make"] is None


def test_vehicles_pb_keeps_recent_vehicles_on_a_trip(client: falcon.testing.TestClient) -> None:
    message = rt.FeedMessage()
    message.ParseFromString(client.simulate_get("/v2/vehicles.pb").content)
    assert message.header.incrementality == rt.FeedHeader.FULL_DATASET
    [entity] = message.entity  # PARKED has no trip
    assert entity.vehicle.vehicle.id == "A|V1" and entity.vehicle.vehicle.label == "V1"
    assert entity.vehicle.trip.trip_id == "T2"
    assert entity.vehicle.vehicle.license_plate == "AA-00-00"
    assert entity.vehicle.current_status == rt.VehiclePosition.INCOMING_AT


def by_trip(arrivals: list[dict]) -> dict[str, dict]:
    return {a["trip_id"]: a for a in arrivals}


def test_arrival_estimates_observed_and_delay_propagation(
    client: falcon.testing.TestClient,
) -> None:
    first = by_trip(client.simulate_get("/v2/arrivals/by_stop/100001").json)
    assert set(first) == {"T1", "T2", "TLATE", "TBACK"}  # T1X runs on another day
    t2 = first["T2"]
    # The feed writes 9:00:00; the API always pads.
    assert t2["scheduled_arrival"] == "09:00:00"
    assert t2["scheduled_arrival_unix"] == int(local_ts("2026-03-24T09:00"))
    assert t2["estimated_arrival"] == "09:01:00"
    assert t2["estimated_arrival_unix"] == int(local_ts("2026-03-24T09:01"))
    # 09:01 is in the past and the bus is heading to stop 2: it has passed stop 1.
    assert t2["observed_arrival"] == "09:01:00"
    assert t2["observed_arrival_unix"] == t2["estimated_arrival_unix"]
    assert t2["vehicle_id"] == "A|V1"
    # T1's update starts at stop 2: nothing known for stop 1.
    assert first["T1"]["estimated_arrival"] is None and first["T1"]["vehicle_id"] == "A|V9"
    assert first["TLATE"]["vehicle_id"] is None  # its only position is too old
    assert first["TBACK"]["estimated_arrival"] is None
    second = by_trip(client.simulate_get("/v2/arrivals/by_stop/100002").json)
    # The +60 s of stop 1 carries on to stop 2, which has no update of its own.
    assert second["T2"]["estimated_arrival"] == "09:11:00"
    assert second["T2"]["observed_arrival"] is None
    assert second["T1"]["estimated_arrival"] == "08:12:00"
    assert second["T1"]["observed_arrival"] == "08:12:00"
    third = by_trip(client.simulate_get("/v2/arrivals/by_stop/100003").json)
    assert third["T2"]["estimated_arrival"] == "09:25:00"
    assert third["T1"]["estimated_arrival"] == "08:22:00"  # delay 120 carried on
    assert third["TLATE"]["scheduled_arrival"] == "26:30:00"
    assert third["TLATE"]["scheduled_arrival_unix"] == int(local_ts("2026-03-25T02:30"))
    assert third["TBACK"]["estimated_arrival"] is None  # skipped stop


def test_arrivals_without_realtime_are_null(small_feed: Path, make_store, client_for) -> None:  # type: ignore[no-untyped-def]
    store = make_store(small_feed, clock=Clock(NOW))
    store.load_static()
    arrivals = client_for(store).simulate_get("/v2/arrivals/by_stop/100001").json
    assert arrivals
    for a in arrivals:
        assert a["estimated_arrival"] is None and a["estimated_arrival_unix"] is None
        assert a["observed_arrival"] is None and a["observed_arrival_unix"] is None
        assert a["vehicle_id"] is None


def test_arrivals_by_pattern_with_realtime(client: falcon.testing.TestClient, rt_store) -> None:  # type: ignore[no-untyped-def]
    net = rt_store.network
    pattern_id = net.trip_pattern[net.trip_index["T2"]]
    arrivals = client.simulate_get(f"/v2/arrivals/by_pattern/{pattern_id}").json
    t2 = [a for a in arrivals if a["trip_id"] == "T2"]
    assert [a["stop_id"] for a in t2] == ["100001", "100002", "100003"]
    assert [a["estimated_arrival"] for a in t2] == ["09:01:00", "09:11:00", "09:25:00"]
    assert {a["trip_id"] for a in arrivals} == {"T1", "T2", "TLATE"}


def test_pip_estimates_use_realtime_then_schedule(client: falcon.testing.TestClient) -> None:
    rows = client.simulate_post("/v2/pips/estimates", json={"stops": ["100002"]}).json
    # T1 (08:12) has passed; T2 in 6 minutes; TLATE scheduled 24:05.
    assert [r["journeyId"] for r in rows] == ["T2", None]
    t2, late = rows
    assert t2["estimatedTimeString"] == "\u2022 6 min"
    assert t2["estimatedArrivalTime"] == "09:11:00" and t2["timetabledArrivalTime"] == "09:10:00"
    assert t2["observedVehicleId"] == "A|V1" and t2["lineId"] == "1"
    assert t2["stopHeadsign"] == "Third"
    assert late["estimatedTimeString"] == "00:05" and late["estimatedArrivalTime"] == "24:05:00"
    assert late["estimatedTimeUnixSeconds"] == int(local_ts("2026-03-25T00:05"))


def test_pip_skips_trips_ending_at_the_stop_and_skipped_stops(
    client: falcon.testing.TestClient, rt_store: TransitStore, rt_files: dict[str, Path]
) -> None:
    # T1, T2 and TLATE end at 100003; TBACK starts there, but its update SKIPS that stop.
    rows = client.simulate_post("/v2/pips/estimates", json={"stops": ["100003"]}).json
    assert [r["lineId"] for r in rows] == ["INFO", "INFO"]
    rt_files["trip_updates_source"].write_bytes(feed(TRIP_UPDATES[:2]))
    rt_store.poll_realtime()
    rows = client.simulate_post("/v2/pips/estimates", json={"stops": ["100003"]}).json
    assert [r["stopHeadsign"] for r in rows] == ["First"]


def test_pip_a_chegar_under_one_minute(client: falcon.testing.TestClient, rt_store) -> None:  # type: ignore[no-untyped-def]
    rt_store.now.now = local_ts("2026-03-24T09:10:30")
    rows = client.simulate_post("/v2/pips/estimates", json={"stops": ["100002"]}).json
    assert rows[0]["journeyId"] == "T2" and rows[0]["estimatedTimeString"] == "A chegar"


def test_alerts_json_and_pb(client: falcon.testing.TestClient) -> None:
    [alert] = client.simulate_get("/v2/alerts").json
    assert alert == {
        "active_period": [{"end": 1775000000, "start": 1774000000}],
        "alert_id": "a1",
        "cause": "CONSTRUCTION",
        "description_text": {"translation": [{"text": "Desvio na paragem Second"}]},
        "effect": "DETOUR",
        "header_text": {"translation": [{"text": "Obras", "language": "pt"}]},
        # The route's line, as the real service means to add it.
        "informed_entity": [{"line_id": "1", "route_id": "R1"}, {"stop_id": "100002"}],
    }
    message = rt.FeedMessage()
    message.ParseFromString(client.simulate_get("/v2/alerts.pb").content)
    [entity] = message.entity
    assert entity.id == "a1" and entity.alert.effect == rt.Alert.DETOUR


def test_broken_realtime_keeps_the_last_good_snapshot(
    rt_store: TransitStore, rt_files: dict[str, Path], client: falcon.testing.TestClient
) -> None:
    rt_files["vehicles_source"].write_bytes(b"\x00garbage, not protobuf")
    rt_files["alerts_source"].unlink()
    rt_store.poll_realtime()
    assert len(client.simulate_get("/v2/vehicles").json) == 2
    assert len(client.simulate_get("/v2/alerts").json) == 1
    health = client.simulate_get("/health").json
    assert health["status"] == "degraded"
    assert health["vehicles"]["status"] == "stale" and health["vehicles"]["last_error"]
    assert health["alerts"]["status"] == "stale" and "alerts.pb" in health["alerts"]["last_error"]
    assert health["trip_updates"]["status"] == "ok"
    # and a good fetch clears it
    rt_files["vehicles_source"].write_bytes(feed(VEHICLES[:1]))
    rt_store.poll_realtime()
    assert len(client.simulate_get("/v2/vehicles").json) == 1
    assert client.simulate_get("/health").json["vehicles"]["status"] == "ok"


def test_realtime_from_http_urls(small_feed: Path, make_store, client_for) -> None:  # type: ignore[no-untyped-def]
    with http_files({"/vp.pb": feed(VEHICLES)}) as base:
        store = make_store(small_feed, clock=Clock(NOW), vehicles_source=base + "/vp.pb")
        store.load_static()
        store.poll_realtime()
        assert len(client_for(store).simulate_get("/v2/vehicles").json) == 2  # OLD is too old


def test_bull_runner_vehicles_and_a_frequency_trip_update(
    tmp_path: Path,
    make_store,
    client_for,  # type: ignore[no-untyped-def]
) -> None:
    tu = tmp_path / "tu.pb"
    tu.write_bytes(
        feed(
            [{"id": "u", "trip_update": {
                "trip": {"trip_id": "1", "start_time": "10:50:00"}, "vehicle": {"id": "1536"},
                "stop_time_update": [{"stop_sequence": 2, "arrival": {"delay": 120}}]}}],
            1505314375,
        )
    )  # fmt: skip
    store = make_store(
        BULLRUNNER_ZIP,
        clock=Clock(1505314375),  # 2017-09-13 10:52:55 in New York, a Wednesday
        vehicles_source=str(BULLRUNNER_VP),
        trip_updates_source=str(tu),
    )
    assert store.load_static()
    store.poll_realtime()
    client = client_for(store)
    vehicles = {v["id"]: v for v in client.simulate_get("/v2/vehicles").json}
    # The feed has no agency_id: its single agency is "1".
    assert len(vehicles) == 10 and all(v["agency_id"] == "1" for v in vehicles.values())
    assert vehicles["1|1536"]["route_id"] == "F" and vehicles["1|1536"]["line_id"] == "F"
    arrivals = {a["trip_id"]: a for a in client.simulate_get("/v2/arrivals/by_stop/230").json}
    expanded = arrivals["1@10:50:00"]
    assert expanded["scheduled_arrival"] == "10:51:04"
    assert expanded["estimated_arrival"] == "10:53:04"
    assert expanded["vehicle_id"] == "1|1536"
    assert arrivals["1@11:00:00"]["estimated_arrival"] is None
