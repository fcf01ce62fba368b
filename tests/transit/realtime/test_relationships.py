"""The trip relationships beyond SCHEDULED, CANCELED and ADDED, after the GTFS-RT reference, on
the small Lisbon feed: a DUPLICATED trip is a copy of a static one at another time (the static
one still runs), an UNSCHEDULED trip runs at the times its updates give on the static trip's
route, a REPLACEMENT (deprecated) update applies to the static trip it names."""

from __future__ import annotations

from pathlib import Path

import falcon.testing
import pytest

from ..helpers import local_ts
from .test_realtime import NOW


def at(clock: str) -> int:
    return int(local_ts(f"2026-03-24T{clock}"))


UPDATES = [
    # T2 (09:00, 09:10, 09:20) copied to start at 11:00, a minute late at its second stop.
    {"id": "dup", "trip_update": {
        "trip": {"trip_id": "T2", "schedule_relationship": "DUPLICATED"},
        "trip_properties": {"trip_id": "T2-11", "start_date": "20260324",
                            "start_time": "11:00:00"},
        "vehicle": {"id": "V7"},
        "stop_time_update": [{"stop_sequence": 2, "arrival": {"delay": 60}}]}},
    # T1's vehicle running without a timetable, at the times it gives.
    {"id": "free", "trip_update": {
        "trip": {"trip_id": "T1", "schedule_relationship": "UNSCHEDULED"},
        "stop_time_update": [
            {"stop_id": "100002", "schedule_relationship": "UNSCHEDULED",
             "arrival": {"time": at("09:40")}},
            {"stop_id": "100003", "schedule_relationship": "UNSCHEDULED",
             "arrival": {"time": at("09:52")}}]}},
    {"id": "rep", "trip_update": {
        "trip": {"trip_id": "TBACK", "schedule_relationship": "REPLACEMENT"}, "delay": 300}},
]  # fmt: skip


@pytest.fixture
def client(small_feed: Path, trip_updates_client) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    return trip_updates_client(small_feed, UPDATES, NOW)  # type: ignore[no-any-return]


def rows(client: falcon.testing.TestClient, stop: str) -> list[dict]:
    result = client.simulate_get(f"/v2/arrivals/by_stop/{stop}")
    assert result.status_code == 200, result.text
    return result.json  # type: ignore[no-any-return]


def test_a_duplicated_trip_is_a_shifted_copy(client: falcon.testing.TestClient) -> None:
    second = {a["trip_id"]: a for a in rows(client, "100002")}
    copy = second["T2-11"]
    assert copy["schedule_relationship"] == "DUPLICATED"
    assert copy["scheduled_arrival"] == "11:10:00" and copy["scheduled_arrival_unix"] == at("11:10")
    assert copy["estimated_arrival"] == "11:11:00" and copy["vehicle_id"] == "A|V7"
    assert copy["pattern_id"] == second["T2"]["pattern_id"] and copy["headsign"] == "Third"
    # The copy's delay carries on; the static T2 runs as scheduled.
    third = {a["trip_id"]: a for a in rows(client, "100003")}
    assert third["T2-11"]["estimated_arrival"] == "11:21:00"
    assert second["T2"]["schedule_relationship"] == "SCHEDULED"
    assert second["T2"]["estimated_arrival"] is None
    panel = client.simulate_post("/v2/pips/estimates", json={"stops": ["100002"]}).json
    assert "T2-11" in [r["journeyId"] for r in panel]


def test_an_unscheduled_trip_runs_at_the_times_given(client: falcon.testing.TestClient) -> None:
    second = [a for a in rows(client, "100002") if a["schedule_relationship"] == "UNSCHEDULED"]
    assert [
        (a["trip_id"], a["estimated_arrival"], a["route_id"], a["headsign"]) for a in second
    ] == [("T1", "09:40:00", "R1", "Third")]
    assert second[0]["pattern_id"] == "R1_0"


def test_a_replacement_update_applies_to_its_static_trip(
    client: falcon.testing.TestClient,
) -> None:
    back = {a["trip_id"]: a for a in rows(client, "100003")}["TBACK"]
    assert back["schedule_relationship"] == "SCHEDULED"
    assert (back["scheduled_arrival"], back["estimated_arrival"]) == ("10:00:00", "10:05:00")
