"""TripUpdate semantics on the real Cairns feed with generated GTFS-RT, through the app:
cancelled, deleted and added trips, skipped and NO_DATA stops, delays carried to later stops
(the departure's when given), updates about another day; in arrivals by stop and by pattern,
the next-N arrivals and the passenger information panels."""

from __future__ import annotations

import falcon.testing
import pytest

from ..helpers import BRISBANE, CAIRNS_ZIP, local_ts

NOW = local_ts("2014-06-10T08:00", BRISBANE)  # a Tuesday of the feed
PREFIX = "CNS2014-CNS_MUL-Weekday-00-"
A, B, C, D, E = (f"{PREFIX}{n}" for n in (4165883, 4165884, 4165885, 4165886, 4165887))


def at(clock: str) -> int:
    return int(local_ts(f"2014-06-10T{clock}", BRISBANE))


TRIP_UPDATES = [
    # A (08:15 at 750337, 08:16 at 750000, 08:17 at 750001, 08:19 at 750002): two minutes
    # late in, four out of its first stop; its third stop is skipped.
    {"id": "a", "trip_update": {"trip": {"trip_id": A}, "stop_time_update": [
        {"stop_sequence": 1, "arrival": {"delay": 120}, "departure": {"delay": 240}},
        {"stop_sequence": 3, "schedule_relationship": "SKIPPED"}]}},
    {"id": "b", "trip_update": {"trip": {"trip_id": B, "schedule_relationship": "CANCELED"}}},
    # C: five minutes late as a whole; no data from its third stop on.
    {"id": "c", "trip_update": {"trip": {"trip_id": C}, "delay": 300, "stop_time_update": [
        {"stop_sequence": 3, "schedule_relationship": "NO_DATA"}]}},
    # D: ten minutes late, but tomorrow.
    {"id": "d", "trip_update": {"trip": {"trip_id": D, "start_date": "20140611"},
                                "delay": 600}},
    {"id": "e", "trip_update": {"trip": {"trip_id": E, "start_date": "20140610",
                                         "schedule_relationship": "DELETED"}}},
    # A trip the timetable does not have, at two stops.
    {"id": "n", "trip_update": {
        "trip": {"trip_id": "EXTRA-1", "route_id": "110-423", "schedule_relationship": "NEW"},
        "vehicle": {"id": "77"},
        "stop_time_update": [{"stop_id": "750000", "arrival": {"time": at("08:30")}},
                             {"stop_id": "750001", "arrival": {"time": at("08:31")}}]}},
]  # fmt: skip


@pytest.fixture
def client(trip_updates_client) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    return trip_updates_client(CAIRNS_ZIP, TRIP_UPDATES, NOW)  # type: ignore[no-any-return]


def rows(client: falcon.testing.TestClient, path: str) -> dict[str, dict]:
    result = client.simulate_get(path)
    assert result.status_code == 200, result.text
    return {a["trip_id"]: a for a in result.json}


def test_delay_carried_on_by_departure_and_past_a_skipped_stop(
    client: falcon.testing.TestClient,
) -> None:
    a = rows(client, "/v2/arrivals/by_stop/750000")[A]
    assert a["schedule_relationship"] == "SCHEDULED"
    assert a["scheduled_arrival"] == "08:16:00" and a["estimated_arrival"] == "08:20:00"
    skipped = rows(client, "/v2/arrivals/by_stop/750001")[A]
    assert skipped["schedule_relationship"] == "SKIPPED" and skipped["estimated_arrival"] is None
    # SKIPPED is not propagated: the stop after it keeps the 240 s.
    after = rows(client, "/v2/arrivals/by_stop/750002")[A]
    assert after["schedule_relationship"] == "SCHEDULED"
    assert after["estimated_arrival"] == "08:23:00"


def test_cancelled_trip_is_marked_and_not_on_the_panel(client: falcon.testing.TestClient) -> None:
    b = rows(client, "/v2/arrivals/by_stop/750000")[B]
    assert b["schedule_relationship"] == "CANCELED"
    assert b["estimated_arrival"] is None and b["observed_arrival"] is None
    pattern = rows(client, f"/v2/arrivals/by_pattern/{b['pattern_id']}")
    assert pattern[B]["schedule_relationship"] == "CANCELED"
    panel = client.simulate_post("/v2/pips/estimates", json={"stops": ["750000"]}).json
    assert B not in {p["journeyId"] for p in panel}
    assert [p["timetabledArrivalTime"] for p in panel if p["journeyId"] == A] == ["08:16:00"]


def test_trip_delay_and_no_data(client: falcon.testing.TestClient) -> None:
    assert rows(client, "/v2/arrivals/by_stop/750000")[C]["estimated_arrival"] == "09:25:00"
    # NO_DATA at the third stop: none there nor after it.
    assert rows(client, "/v2/arrivals/by_stop/750001")[C]["estimated_arrival"] is None
    assert rows(client, "/v2/arrivals/by_stop/750002")[C]["estimated_arrival"] is None


def test_update_about_another_day_and_deleted_trip(client: falcon.testing.TestClient) -> None:
    today = rows(client, "/v2/arrivals/by_stop/750000")
    assert today[D]["estimated_arrival"] is None
    tomorrow = rows(client, "/v2/arrivals/by_stop/750000?date=20140611")
    assert tomorrow[D]["estimated_arrival"] == "10:00:00"  # 09:50 + 10 min
    assert E not in today and E in tomorrow  # deleted today only


def test_added_trip_in_arrivals_and_panels(client: falcon.testing.TestClient) -> None:
    added = rows(client, "/v2/arrivals/by_stop/750000")["EXTRA-1"]
    assert added["schedule_relationship"] == "ADDED"
    assert added["scheduled_arrival"] == added["estimated_arrival"] == "08:30:00"
    assert added["route_id"] == "110-423" and added["line_id"] == "110"
    assert added["vehicle_id"] == "1|77" and added["pattern_id"] is None
    assert added["headsign"]  # the name of its last stop
    panel = client.simulate_post("/v2/pips/estimates", json={"stops": ["750000"]}).json
    extra = [p for p in panel if p["journeyId"] == "EXTRA-1"]
    assert [p["estimatedTimeString"] for p in extra] == ["\u2022 30 min"]
    # Its last stop is where it ends: not on that stop's panel.
    last = client.simulate_post("/v2/pips/estimates", json={"stops": ["750001"]}).json
    assert "EXTRA-1" not in {p["journeyId"] for p in last}


def test_next_arrivals(client: falcon.testing.TestClient) -> None:
    result = client.simulate_get("/v2/arrivals/by_stop/750000?limit=3")
    assert result.status_code == 200
    # From now: A (estimated 08:20), the added trip (08:30), then cancelled B (08:50, shown
    # so a rider knows); in time order.
    assert [(a["trip_id"], a["schedule_relationship"]) for a in result.json] == [
        (A, "SCHEDULED"),
        ("EXTRA-1", "ADDED"),
        (B, "CANCELED"),
    ]
    for bad in ("0", "1001", "2.5", "x"):
        assert client.simulate_get(f"/v2/arrivals/by_stop/750000?limit={bad}").status_code == 400
