"""The right bus around midnight and on the nights the clocks change, on a feed built here
(Europe/Lisbon: 2025-03-30 springs forward at 01:00 UTC, 2025-10-26 falls back at 01:00 UTC):
arrivals and panels look at every service day that can still have a departure, service times
count from noon minus 12 h, and a TripUpdate without start_date is about one day."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import falcon.testing
import pytest
from support import Clock

from sidecars.transit.store import TransitStore

from ..helpers import local_ts, write_feed

# One route, two stops, a service running every day. EARLY runs at 00:30 of its own service
# day, NIGHT at 25:30 / 26:30 (after midnight, on the previous day's timetable), ONE45 at
# 01:45 and MORNING at 05:00.
MIDNIGHT_FEED: dict[str, str] = {
    "agency.txt": "agency_id,agency_name,agency_url,agency_timezone\n"
    "A,Night Buses,http://example.org,Europe/Lisbon\n",
    "stops.txt": "stop_id,stop_name,stop_lat,stop_lon\n"
    "200001,Cais,38.700000,-9.100000\n"
    "200002,Alto,38.710000,-9.110000\n",
    "routes.txt": "route_id,agency_id,route_short_name,route_long_name,route_type\n"
    "N1,A,201,Night,3\n",
    "calendar.txt": "service_id,monday,tuesday,wednesday,thursday,friday,saturday,sunday,"
    "start_date,end_date\n"
    "ALL,1,1,1,1,1,1,1,20250301,20251130\n",
    "trips.txt": "route_id,service_id,trip_id,trip_headsign,direction_id\n"
    "N1,ALL,EARLY,Alto,0\n"
    "N1,ALL,NIGHT,Alto,0\n"
    "N1,ALL,ONE45,Alto,0\n"
    "N1,ALL,MORNING,Alto,0\n",
    "stop_times.txt": "trip_id,arrival_time,departure_time,stop_id,stop_sequence\n"
    "EARLY,00:30:00,00:30:00,200001,1\n"
    "EARLY,00:40:00,00:40:00,200002,2\n"
    "NIGHT,25:30:00,25:30:00,200001,1\n"
    "NIGHT,26:30:00,26:30:00,200002,2\n"
    "ONE45,01:45:00,01:45:00,200001,1\n"
    "ONE45,01:55:00,01:55:00,200002,2\n"
    "MORNING,05:00:00,05:00:00,200001,1\n"
    "MORNING,05:10:00,05:10:00,200002,2\n",
}


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


@pytest.fixture
def store(tmp_path: Path, make_store: Callable[..., TransitStore]) -> TransitStore:
    path = write_feed(tmp_path / "night.zip", {}, base=MIDNIGHT_FEED)
    store = make_store(path, clock=Clock(local_ts("2025-06-12T00:20")))
    assert store.load_static()
    return store


@pytest.fixture
def client(store: TransitStore, client_for) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    return client_for(store)  # type: ignore[no-any-return]


def get(client: falcon.testing.TestClient, path: str) -> list[dict]:
    result = client.simulate_get(path)
    assert result.status_code == 200, result.text
    return result.json  # type: ignore[no-any-return]


def runs(rows: list[dict]) -> list[tuple[str, str, int]]:
    return [(a["trip_id"], a["scheduled_arrival"], a["scheduled_arrival_unix"]) for a in rows]


def test_the_bus_at_0030_of_the_new_day_is_next_at_0020(store: TransitStore, client) -> None:  # type: ignore[no-untyped-def]
    # 00:20 on Thursday 2025-06-12 (WEST, UTC+1): operational day Wednesday, but Thursday's
    # 00:30 trip comes first, then Wednesday's 25:30.
    assert runs(get(client, "/v2/arrivals/by_stop/200001?limit=2")) == [
        ("EARLY", "00:30:00", int(local_ts("2025-06-12T00:30"))),
        ("NIGHT", "25:30:00", int(local_ts("2025-06-12T01:30"))),
    ]
    panel = client.simulate_post("/v2/pips/estimates", json={"stops": ["200001"]}).json
    assert [(r["journeyId"], r["estimatedTimeString"]) for r in panel][:3] == [
        (None, "00:30"),
        (None, "01:30"),
        (None, "01:45"),
    ]
    # The default list is what Wednesday's operational day shows: its own trips and
    # Thursday's before 04:00 (EARLY, ONE45), not Thursday's 05:00.
    day = runs(get(client, "/v2/arrivals/by_stop/200001"))
    assert [(t, u) for t, _, u in day] == [
        ("EARLY", int(local_ts("2025-06-11T00:30"))),  # Wednesday's own, early
        ("ONE45", int(local_ts("2025-06-11T01:45"))),
        ("MORNING", int(local_ts("2025-06-11T05:00"))),
        ("EARLY", int(local_ts("2025-06-12T00:30"))),  # Thursday's, inside Wednesday's day
        ("NIGHT", int(local_ts("2025-06-12T01:30"))),  # Wednesday's 25:30
        ("ONE45", int(local_ts("2025-06-12T01:45"))),  # Thursday's
    ]
    # ?date= is one service day's timetable, as before.
    wednesday = runs(get(client, "/v2/arrivals/by_stop/200001?date=20250611"))
    assert [t for t, _, _ in wednesday] == ["EARLY", "ONE45", "MORNING", "NIGHT"]


def test_at_0350_the_next_three_come_from_the_new_day(store: TransitStore, client) -> None:  # type: ignore[no-untyped-def]
    store.now.now = local_ts("2025-06-12T03:50")  # type: ignore[attr-defined]
    assert runs(get(client, "/v2/arrivals/by_stop/200001?limit=3")) == [
        ("MORNING", "05:00:00", int(local_ts("2025-06-12T05:00"))),
        ("EARLY", "00:30:00", int(local_ts("2025-06-13T00:30"))),  # Friday's
        ("NIGHT", "25:30:00", int(local_ts("2025-06-13T01:30"))),  # Thursday's
    ]
    panel = client.simulate_post("/v2/pips/estimates", json={"stops": ["200001"]}).json
    assert [r["estimatedTimeString"] for r in panel][:3] == ["05:00", "00:30", "01:30"]


@pytest.mark.parametrize(
    "day, first, second",
    [
        # Spring forward: 01:00 UTC on the 30th. The 29th starts at 00:00 UTC (noon minus
        # 12 h): 25:30 is 01:30 UTC (02:30 WEST), 26:30 an hour later (03:30 WEST).
        ("20250329", "2025-03-30T01:30:00", "2025-03-30T02:30:00"),
        # Fall back: 01:00 UTC on the 26th. The 25th starts at 23:00 UTC on the 24th:
        # 25:30 is 00:30 UTC (01:30 WEST), 26:30 an hour later (01:30 WET).
        ("20251025", "2025-10-26T00:30:00", "2025-10-26T01:30:00"),
        # An ordinary night: the same hour apart.
        ("20250611", "2025-06-12T00:30:00", "2025-06-12T01:30:00"),
    ],
)
def test_times_past_midnight_on_the_nights_the_clocks_change(
    client: falcon.testing.TestClient, day: str, first: str, second: str
) -> None:
    rows = get(client, f"/v2/arrivals/by_pattern/{pattern_of(client)}?date={day}")
    night = {a["stop_id"]: a for a in rows if a["trip_id"] == "NIGHT"}
    assert night["200001"]["scheduled_arrival_unix"] == utc(first)
    assert night["200002"]["scheduled_arrival_unix"] == utc(second)
    assert (
        night["200002"]["scheduled_arrival_unix"] - night["200001"]["scheduled_arrival_unix"]
        == 3600
    )


def pattern_of(client: falcon.testing.TestClient) -> str:
    (route,) = get(client, "/v2/routes")
    (pattern,) = route["pattern_ids"]
    return pattern  # type: ignore[no-any-return]


def test_estimates_read_like_the_timetable_on_a_dst_night(
    tmp_path: Path, trip_updates_client
) -> None:  # type: ignore[no-untyped-def]
    # 02:10 WEST on 2025-03-30, NIGHT of the 29th on time: its estimates are its timetable's
    # times (26:30 is not shown as 27:30 nor 25:30).
    now = utc("2025-03-30T01:10:00")
    update = {"trip": {"trip_id": "NIGHT", "start_date": "20250329"}, "delay": 0}
    path = write_feed(tmp_path / "night.zip", {}, base=MIDNIGHT_FEED)
    client = trip_updates_client(path, [{"id": "n", "trip_update": update}], now)
    rows = get(client, "/v2/arrivals/by_stop/200002?limit=1")
    assert [(a["trip_id"], a["scheduled_arrival"], a["estimated_arrival"]) for a in rows] == [
        ("NIGHT", "26:30:00", "26:30:00")
    ]
    assert rows[0]["estimated_arrival_unix"] == utc("2025-03-30T02:30:00")


def test_an_update_without_start_date_is_about_todays_run(
    tmp_path: Path, trip_updates_client
) -> None:  # type: ignore[no-untyped-def]
    now = local_ts("2025-06-12T04:30")  # Thursday's operational day
    entities = [
        {"id": "c", "trip_update": {"trip": {"trip_id": "MORNING",
                                             "schedule_relationship": "CANCELED"}}},
        {"id": "d", "trip_update": {"trip": {"trip_id": "NIGHT"}, "delay": 120}},
    ]  # fmt: skip
    path = write_feed(tmp_path / "night.zip", {}, base=MIDNIGHT_FEED)
    client = trip_updates_client(path, entities, now)
    today = {a["trip_id"]: a for a in get(client, "/v2/arrivals/by_stop/200001?date=20250612")}
    assert today["MORNING"]["schedule_relationship"] == "CANCELED"
    assert today["NIGHT"]["estimated_arrival"] == "25:32:00"
    tomorrow = {a["trip_id"]: a for a in get(client, "/v2/arrivals/by_stop/200001?date=20250613")}
    assert tomorrow["MORNING"]["schedule_relationship"] == "SCHEDULED"
    assert tomorrow["NIGHT"]["estimated_arrival"] is None
    # Yesterday's NIGHT ran hours ago (01:30 today): the update is not about it either.
    yesterday = {a["trip_id"]: a for a in get(client, "/v2/arrivals/by_stop/200001?date=20250611")}
    assert yesterday["NIGHT"]["estimated_arrival"] is None


def test_an_added_trip_of_tomorrow_is_not_in_todays_list(
    tmp_path: Path, trip_updates_client
) -> None:  # type: ignore[no-untyped-def]
    now = local_ts("2025-06-12T12:00")
    at = [int(local_ts(f"2025-06-13T{clock}")) for clock in ("10:00", "10:10")]
    added = {"id": "x", "trip_update": {
        "trip": {"trip_id": "EXTRA", "route_id": "N1", "start_date": "20250613",
                 "schedule_relationship": "ADDED"},
        "stop_time_update": [{"stop_id": "200001", "arrival": {"time": at[0]}},
                             {"stop_id": "200002", "arrival": {"time": at[1]}}]}}  # fmt: skip
    path = write_feed(tmp_path / "night.zip", {}, base=MIDNIGHT_FEED)
    client = trip_updates_client(path, [added], now)

    def trips(query: str) -> list[str]:
        return [a["trip_id"] for a in get(client, f"/v2/arrivals/by_stop/200001{query}")]

    assert "EXTRA" not in trips("")
    assert "EXTRA" in trips("?date=20250613") and "EXTRA" not in trips("?date=20250612")
    # Friday's 00:30, Thursday's 25:30, Friday's 01:45 and 05:00, then the added 10:00.
    assert trips("?limit=4") == ["EARLY", "NIGHT", "ONE45", "MORNING"]
    assert "EXTRA" in trips("?limit=5")
