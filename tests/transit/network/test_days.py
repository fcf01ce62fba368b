"""Which trips an arrivals request shows: the operational day in the agency's zone, across
midnight, calendar_dates removals and a DST change day (small built feed, Europe/Lisbon)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import falcon.testing
import pytest
from support import Clock

from sidecars.transit.store import TransitStore

from ..helpers import local_ts


@pytest.fixture
def store(small_feed: Path, make_store: Callable[..., TransitStore]) -> TransitStore:
    store = make_store(small_feed, clock=Clock(local_ts("2026-03-24T12:00")))
    store.load_static()
    return store


@pytest.fixture
def client(store: TransitStore, client_for) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    return client_for(store)


def arrivals(client: falcon.testing.TestClient, stop: str) -> list[dict]:
    result = client.simulate_get(f"/v2/arrivals/by_stop/{stop}")
    assert result.status_code == 200
    return result.json


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


def test_removed_date_has_no_arrivals(store: TransitStore, client) -> None:  # type: ignore[no-untyped-def]
    store.now.now = local_ts("2026-03-25T12:00")  # WK removed by calendar_dates
    assert arrivals(client, "100001") == []
    store.now.now = local_ts("2026-03-26T12:00")  # WK runs, and EXTRA adds T1X
    assert {a["trip_id"] for a in arrivals(client, "100001")} == {"T1", "T1X", "T2", "TLATE",
                                                                   "TBACK"}  # fmt: skip


def test_after_midnight_still_shows_yesterdays_late_trip(store: TransitStore, client) -> None:  # type: ignore[no-untyped-def]
    store.now.now = local_ts("2026-03-25T01:00")  # operational day 2026-03-24
    late = next(a for a in arrivals(client, "100002") if a["trip_id"] == "TLATE")
    assert late["scheduled_arrival"] == "24:05:00"
    assert late["scheduled_arrival_unix"] == int(local_ts("2026-03-25T00:05"))
    store.now.now = local_ts("2026-03-25T04:00")  # operational day 2026-03-25: removed date
    assert arrivals(client, "100002") == []


def test_dst_change_day(store: TransitStore, client) -> None:  # type: ignore[no-untyped-def]
    # Saturday 2026-03-28 is added; at 02:00 on Sunday the 29th Lisbon moves to WEST (UTC+1).
    store.now.now = local_ts("2026-03-28T20:00")
    third = {a["trip_id"]: a for a in arrivals(client, "100003")}
    assert third["T1"]["scheduled_arrival_unix"] == utc("2026-03-28T08:20:00")  # WET
    assert third["TLATE"]["scheduled_arrival"] == "26:30:00"
    # Service times count from noon minus 12 h (00:00 WET on the 28th): 26:30 is 02:30 UTC,
    # 03:30 WEST by the clock, since an hour of the night was skipped.
    assert third["TLATE"]["scheduled_arrival_unix"] == utc("2026-03-29T02:30:00")
    store.now.now = utc("2026-03-29T02:30:00")  # 03:30 WEST: still Saturday's operational day
    assert {a["trip_id"] for a in arrivals(client, "100003")} == set(third)
    store.now.now = local_ts("2026-03-29T12:00")
    sunday = {a["trip_id"]: a for a in arrivals(client, "100003")}
    assert sunday["T1"]["scheduled_arrival_unix"] == utc("2026-03-29T07:20:00")  # WEST
    assert sunday["TBACK"]["scheduled_arrival"] == "10:00:00"
    assert sunday["TBACK"]["scheduled_arrival_unix"] == utc("2026-03-29T09:00:00")


def test_stop_served_by_no_trip_answers_an_empty_day(client) -> None:  # type: ignore[no-untyped-def]
    assert arrivals(client, "100009") == []
    rows = client.simulate_post("/v2/pips/estimates", json={"stops": ["100009"]}).json
    assert [r["lineId"] for r in rows] == ["INFO", "INFO"]


def test_arrivals_are_sorted_across_midnight(client) -> None:  # type: ignore[no-untyped-def]
    times = [a["scheduled_arrival"] for a in arrivals(client, "100002")]
    assert times == ["08:10:00", "09:10:00", "24:05:00"]
