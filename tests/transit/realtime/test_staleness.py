"""What is not current is not served as current: the real Bull Runner positions (2017)
against a later clock, messages past the age limit, alerts outside their active periods; and
/health says degraded with the reason. The snapshot is rebuilt when something in it expires,
without waiting for a new message."""

from __future__ import annotations

from collections.abc import Callable
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path

import pytest
from google.transit import gtfs_realtime_pb2 as rt
from support import Clock

from sidecars.common.environment import SettingsError
from sidecars.transit.settings import TransitSettings
from sidecars.transit.store import TransitStore

from ..helpers import BULLRUNNER_VP, BULLRUNNER_ZIP, SMALL_FEED, write_feed
from .test_realtime import NOW, TRIP_UPDATES, VEHICLES, feed

HEARD = 1505314375  # the Bull Runner message's header time, 2017-09-13


def test_positions_from_2017_are_not_current(
    make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    clock = Clock(HEARD + 60)
    store = make_store(BULLRUNNER_ZIP, clock=clock, vehicles_source=str(BULLRUNNER_VP))
    assert store.load_static()
    store.poll_realtime()
    client = client_for(store)
    assert len(client.simulate_get("/v2/vehicles").json) == 10
    assert client.simulate_get("/health").json["vehicles"]["status"] == "ok"
    # A minute and a half later nothing new came: the same snapshot is no longer current.
    clock.now = HEARD + 91
    assert client.simulate_get("/v2/vehicles").json == []
    message = rt.FeedMessage()
    message.ParseFromString(client.simulate_get("/v2/vehicles.pb").content)
    assert len(message.entity) == 0
    assert client.simulate_get("/v2/vehicles/1|1536").status_code == 404
    health = client.simulate_get("/health").json
    assert health["status"] == "degraded"
    assert health["vehicles"]["status"] == "stale"
    assert "older than 90 s (TRANSIT_VEHICLES_MAX_AGE_SECONDS)" in health["vehicles"]["reason"]
    # Years later (the real clock against the demo data): the same, with the time named.
    clock.now = 1795838555
    health = client.simulate_get("/health").json
    assert "2017-09-13T14:52:55Z" in health["vehicles"]["reason"]
    assert any(r.startswith("vehicles: ") for r in health["reasons"])
    # and the feed itself has no service on that day
    assert health["feed"]["service_today"] is False
    assert any("no service on 2026" in r for r in health["reasons"])


def test_alerts_outside_their_active_period(
    tmp_path: Path, small_feed: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    now = int(NOW)
    alerts = tmp_path / "alerts.pb"
    alerts.write_bytes(
        feed(
            [
                {"id": "past", "alert": {
                    "active_period": [{"start": now - 7200, "end": now - 3600}],
                    "informed_entity": [{"route_id": "R1"}]}},
                {"id": "now", "alert": {"active_period": [{"start": now - 60, "end": now + 60}],
                                        "informed_entity": [{"stop_id": "100002"}]}},
                {"id": "later", "alert": {"active_period": [{"start": now + 600}],
                                          "informed_entity": [{"route_id": "R1"}]}},
                {"id": "always", "alert": {"informed_entity": [{"agency_id": "A"}]}},
            ]
        )
    )  # fmt: skip
    clock = Clock(now)
    # The message itself stays current for the hour this test moves through.
    store = make_store(
        small_feed, clock=clock, alerts_source=str(alerts), alerts_max_age_seconds=3600
    )
    assert store.load_static()
    store.poll_realtime()
    client = client_for(store)

    def served() -> list[str]:
        return [a["alert_id"] for a in client.simulate_get("/v2/alerts").json]

    assert served() == ["now", "always"]
    pb = rt.FeedMessage()
    pb.ParseFromString(client.simulate_get("/v2/alerts.pb").content)
    assert [e.id for e in pb.entity] == ["now", "always"]
    # Not the source's fault: health stays ok.
    assert client.simulate_get("/health").json["status"] == "ok"
    clock.now = now + 601
    assert served() == ["later", "always"]


def test_a_message_past_the_age_limit_is_not_used(
    tmp_path: Path, small_feed: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    tu = tmp_path / "tu.pb"
    tu.write_bytes(feed(TRIP_UPDATES, NOW - 3600))  # an hour old
    store = make_store(small_feed, clock=Clock(NOW), trip_updates_source=str(tu))
    assert store.load_static()
    store.poll_realtime()
    client = client_for(store)
    arrivals = client.simulate_get("/v2/arrivals/by_stop/100001").json
    assert all(a["estimated_arrival"] is None for a in arrivals)
    health = client.simulate_get("/health").json
    assert health["trip_updates"]["status"] == "stale"
    assert "older than 90 s" in health["trip_updates"]["reason"]


def test_no_service_today_is_degraded(
    tmp_path: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    # The small feed runs March and April 2026; in May nothing runs.
    path = write_feed(tmp_path / "f.zip", {})
    store = make_store(path, clock=Clock(NOW + 60 * 86400))
    assert store.load_static()
    health = client_for(store).simulate_get("/health").json
    assert health["status"] == "degraded" and health["feed"]["service_today"] is False
    assert health["reasons"] == [
        "feed: the served feed has no service on 20260523; its calendars cover 20260302..20260430"
    ]
    notices = {
        n["code"] for n in client_for(store).simulate_get("/status/feed").json["serving"]["notices"]
    }
    assert {"expired_calendar", "no_service_today"} <= notices


def test_one_staleness_policy_per_kind_for_json_and_protobuf(
    tmp_path: Path, small_feed: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    now = int(NOW)
    positions = [
        {"id": f"e{age}", "vehicle": {
            "trip": {"trip_id": trip}, "vehicle": {"id": f"V{age}"},
            "position": {"latitude": 38.71, "longitude": -9.11}, "timestamp": now - age}}
        for age, trip in ((30, "T2"), (120, "T1"), (250, "TLATE"))
    ]  # fmt: skip
    updates = [
        {"id": "fresh", "trip_update": {"trip": {"trip_id": "T2"}, "delay": 60,
                                        "timestamp": now - 30}},
        {"id": "stale", "trip_update": {"trip": {"trip_id": "T1"}, "delay": 60,
                                        "timestamp": now - 100}},
    ]  # fmt: skip
    closure = [{"id": "closed", "alert": {"informed_entity": [{"stop_id": "100002"}],
                                          "effect": "NO_SERVICE"}}]  # fmt: skip
    files = {
        "vehicles_source": feed(positions, now),
        "trip_updates_source": feed(updates, now),
        # A stop-closure alert published ten minutes ago and not repeated since.
        "alerts_source": feed(closure, now - 600),
    }
    sources = {}
    for kind, data in files.items():
        (tmp_path / kind).write_bytes(data)
        sources[kind] = str(tmp_path / kind)
    store = make_store(small_feed, clock=Clock(now), **sources)
    assert store.load_static()
    store.poll_realtime()
    client = client_for(store)
    # Positions: 90 s, in the list, the item, the protobuf and the arrivals alike.
    assert [v["id"] for v in client.simulate_get("/v2/vehicles").json] == ["A|V30"]
    pb = rt.FeedMessage()
    pb.ParseFromString(client.simulate_get("/v2/vehicles.pb").content)
    assert [e.vehicle.vehicle.id for e in pb.entity] == ["A|V30"]
    assert client.simulate_get("/v2/vehicles/A|V120").status_code == 404
    arrivals = {a["trip_id"]: a for a in client.simulate_get("/v2/arrivals/by_stop/100001").json}
    assert arrivals["T2"]["vehicle_id"] == "A|V30"
    assert arrivals["T1"]["vehicle_id"] is None and arrivals["TLATE"]["vehicle_id"] is None
    # Trip updates: 90 s.
    assert arrivals["T2"]["estimated_arrival"] == "09:01:00"
    assert arrivals["T1"]["estimated_arrival"] is None
    # Alerts: a message ten minutes old is still current.
    assert [a["alert_id"] for a in client.simulate_get("/v2/alerts").json] == ["closed"]
    health = client.simulate_get("/health").json
    assert health["alerts"]["status"] == "ok"
    assert "2 of 3 vehicle positions older than 90 s" in health["vehicles"]["reason"]
    assert "1 trip update(s) older than 90 s" in health["trip_updates"]["reason"]


@pytest.mark.parametrize(
    "name, replacement",
    [
        ("TRANSIT_REALTIME_MAX_AGE_SECONDS", "TRANSIT_TRIP_UPDATES_MAX_AGE_SECONDS"),
        ("TRANSIT_VEHICLES_PB_MAX_AGE_SECONDS", "TRANSIT_VEHICLES_MAX_AGE_SECONDS"),
    ],
)
def test_the_retired_age_settings_stop_the_start(name: str, replacement: str) -> None:
    with pytest.raises(SettingsError, match=replacement) as caught:
        TransitSettings.from_env({"TRANSIT_DEMO": "true", name: "300"})
    assert str(caught.value).startswith(f"{name} is no longer read")


def test_conditional_requests_on_the_lists_and_the_protobuf(
    tmp_path: Path, small_feed: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    sent = int(NOW) - 20
    (tmp_path / "vp.pb").write_bytes(feed(VEHICLES, sent))
    (tmp_path / "alerts.pb").write_bytes(feed([{"id": "a", "alert": {}}], sent))
    store = make_store(
        small_feed,
        clock=Clock(NOW),
        vehicles_source=str(tmp_path / "vp.pb"),
        alerts_source=str(tmp_path / "alerts.pb"),
    )
    assert store.load_static()
    store.poll_realtime()
    client = client_for(store)
    loaded = formatdate(store.network.loaded_at // 1, usegmt=True)  # type: ignore[union-attr]
    heard = formatdate(sent, usegmt=True)
    for path, modified in (
        ("/v2/vehicles", heard),
        ("/v2/vehicles.pb", heard),
        ("/v2/alerts", heard),
        ("/v2/alerts.pb", heard),
        ("/v2/vehicles?line_id=1", heard),
        ("/v2/stops", loaded),
        ("/v2/lines", loaded),
        ("/v2/routes", loaded),
        ("/v2/gtfs", loaded),
        ("/v2/dates", loaded),
    ):
        first = client.simulate_get(path)
        assert first.status_code == 200 and first.headers["last-modified"] == modified, path
        etag = first.headers["etag"]
        assert client.simulate_get(path, headers={"If-None-Match": etag}).status_code == 304
        same = client.simulate_get(path, headers={"If-Modified-Since": modified})
        assert same.status_code == 304 and same.content == b"", path
        earlier = formatdate(parsedate_to_datetime(modified).timestamp() - 1, usegmt=True)
        assert client.simulate_get(path, headers={"If-Modified-Since": earlier}).status_code == 200
        # If-None-Match wins over If-Modified-Since (RFC 9110).
        both = {"If-None-Match": '"other"', "If-Modified-Since": modified}
        assert client.simulate_get(path, headers=both).status_code == 200, path
        bad = client.simulate_get(path, headers={"If-Modified-Since": "yesterday"})
        assert bad.status_code == 200


def two_agencies(tmp_path: Path) -> Path:
    """The small feed with a second agency, B, whose trip TB runs 09:00-09:20."""
    files = {
        "agency.txt": SMALL_FEED["agency.txt"] + "B,Other Buses,http://example.org,Europe/Lisbon\n",
        "routes.txt": SMALL_FEED["routes.txt"] + "R2,B,2,Two,3,,\n",
        "trips.txt": SMALL_FEED["trips.txt"] + "R2,WK,TB,Third,0,S1,B9\n",
        "stop_times.txt": SMALL_FEED["stop_times.txt"]
        + "TB,09:00:00,09:00:00,100001,1,0,0,0\n"
        + "TB,09:10:00,09:10:00,100002,2,0,0,1.5\n"
        + "TB,09:20:00,09:20:00,100003,3,0,0,3.0\n",
    }
    return write_feed(tmp_path / "two.zip", files)


def test_an_agency_whose_realtime_is_silent_degrades_health(
    tmp_path: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    vp = tmp_path / "vp.pb"
    current = [VEHICLES[0], VEHICLES[2]]
    vp.write_bytes(feed(current, NOW))  # A's V1 on T2 and a parked bus; nothing of B
    clock = Clock(NOW)
    store = make_store(two_agencies(tmp_path), clock=clock, vehicles_source=str(vp))
    assert store.load_static()
    store.poll_realtime()
    client = client_for(store)
    health = client.simulate_get("/health").json
    assert health["vehicles"]["status"] == "ok"  # the source itself is fine...
    agencies = health["agencies"]
    assert agencies["A"]["status"] == "ok" and agencies["A"]["vehicles"] == 2
    # ... but B's trip TB runs now and none of its buses is heard: the status says so.
    assert agencies["B"] == {
        "status": "silent", "trips_running": 1, "vehicles": 0, "trip_updates": 0,
        "last_heard": None,
    }  # fmt: skip
    assert health["status"] == "degraded"
    assert (
        "agency B: 1 trip(s) running and no current position or trip update (last heard never)"
        in health["reasons"]
    )
    message = client.simulate_get("/v2/status/message").json
    assert message["style"] != "ok"
    # B's bus reports in: every agency is ok.
    b_bus = {"id": "b1", "vehicle": {"trip": {"trip_id": "TB"}, "vehicle": {"id": "B1"},
                                     "position": {"latitude": 38.7, "longitude": -9.1},
                                     "timestamp": int(NOW) - 5}}  # fmt: skip
    vp.write_bytes(feed([*current, b_bus], NOW))
    store.poll_realtime()
    health = client.simulate_get("/health").json
    assert health["agencies"]["B"]["status"] == "ok" and health["status"] == "ok"
    assert health["agencies"]["B"]["last_heard"] == int(NOW) - 5
    # At 10:00 B runs nothing: idle, and its last sign of life is kept.
    clock.now = NOW + 3300
    vp.write_bytes(feed(VEHICLES[:1], NOW + 3300))
    store.poll_realtime()
    b = client.simulate_get("/health").json["agencies"]["B"]
    assert b["status"] == "idle" and b["last_heard"] == int(NOW) - 5


def test_a_realtime_feed_of_another_schedule_version_is_flagged(
    tmp_path: Path, small_feed: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    other = [
        {"id": f"e{n}", "vehicle": {"trip": {"trip_id": f"[PLAN2]T{n}"}, "vehicle": {"id": f"V{n}"},
                                    "position": {"latitude": 38.7, "longitude": -9.1},
                                    "timestamp": int(NOW)}}
        for n in range(1, 4)
    ]  # fmt: skip
    vp = tmp_path / "vp.pb"
    vp.write_bytes(feed(other, NOW))
    store = make_store(small_feed, clock=Clock(NOW), vehicles_source=str(vp))
    assert store.load_static()
    store.poll_realtime()
    health = client_for(store).simulate_get("/health").json
    vehicles = health["vehicles"]
    assert vehicles["status"] == "mismatch" and vehicles["unknown_trips"] == 3
    assert "3 of the 3 trips it names are not in the served feed" in vehicles["reason"]
    assert "'[PLAN2]T1'" in vehicles["reason"] and health["status"] == "degraded"
    # One unknown trip in ten named is not a mismatch (an extra the timetable lacks).
    known = [dict(e, vehicle=dict(e["vehicle"], trip={"trip_id": "T2"})) for e in other * 3]
    vp.write_bytes(feed([*known, other[0]], NOW))
    store.poll_realtime()
    vehicles = client_for(store).simulate_get("/health").json["vehicles"]
    assert vehicles["status"] == "ok" and vehicles["unknown_trips"] == 1
