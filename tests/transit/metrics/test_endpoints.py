"""The metrics endpoints over a small hand-made record set with independently worked-out
figures. The clock is Friday 2026-11-20 10:00 Lisbon (operational day 2026-11-20)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import falcon.testing
import pytest
from support import Clock

from sidecars.transit.app import Services
from sidecars.transit.store import TransitStore

from ..helpers import local_ts
from .records import ride, validation, write_csv

# The app's services and a test client of it, as `app_for` makes them.
Loaded = tuple[Services, falcon.testing.TestClient]
App = Callable[..., Loaded]

VALIDATIONS = (
    [validation("2026-11-20T08:00", "41", "1001", "010001")] * 3
    + [validation("2026-11-19T09:00", "41", "1001", "010002")] * 2
    + [validation("2026-10-31T12:00", "41", "1001", "010001")] * 4
    # Before TRANSIT_METRICS_SINCE (2024-01-01): never shown.
    + [validation("2023-12-31T12:00", "41", "1001", "010001")] * 5
    + [validation("2026-11-20T09:00", "41", "1002", "010003")] * 3
    + [validation("2026-11-13T09:00", "41", "1002", "010003")] * 6
    # After "now" (10:00) on today's operational day: demand, but not "today so far".
    + [validation("2026-11-20T11:00", "41", "1003", "010004")] * 5
    + [validation("2026-11-18T10:00", "41", "1004", "010004")] * 5
    + [validation("2026-11-20T08:30", "41", "1001", "010001", valid=0)]
    + [validation("2026-11-20T07:00", "42", "2001", "020001")] * 2
    + [validation("2026-11-13T09:00", "42", "2001", "020001")]
    + [validation("2026-11-13T11:00", "42", "2001", "020001")]
)
RIDES = [
    ride("20261120", "41", "1001", "T1", "08:00:00", one=1, three=1, svkm=10, delay=60),
    ride("20261120", "41", "1001", "T2", "09:30:00", one=0, three=1, svkm=12, delay=400),
    ride("20261120", "41", "1001", "T3", "11:00:00", one=1, three=1, svkm=8, delay=""),
    ride("20261120", "42", "2001", "T4", "07:00:00", one=0, three=0, svkm=20, delay=600),
    ride("20261120", "42", "2001", "T5", "09:59:00", one=1, three=0, svkm=5, delay=""),
    ride("20261119", "41", "1001", "T6", "08:00:00", one=1, three=0, dvkm=7.5, empty=1),
    ride("20261119", "41", "1001", "T7", "09:00:00", one=0, three=0, empty=0),
    ride("20261119", "42", "2001", "T8", "08:00:00", one=0, three=1, dvkm=3.25, empty=1),
    ride("20261106", "41", "1001", "T9", "08:00:00", one=1, three=1),
    ride("20261106", "41", "1001", "T10", "09:00:00", one=0, three=0),
    # 15 days ago: outside the 14-day window.
    ride("20261105", "41", "1001", "T11", "09:00:00"),
]
COMPLAINTS = [
    ("C1", "20261110", "complaint", "email", "1001", ""),
    ("C2", "20261112", "info_request", "phone", "1001", ""),
    ("C3", "20261101", "other", "web", "", "1106"),
    ("C4", "20231201", "complaint", "email", "1001", ""),
    ("C5", "20261115", "complaint", "phone", "", ""),
]


@pytest.fixture
def loaded(tmp_path: Path, lisbon_store: TransitStore, app_for: App) -> Loaded:
    records = tmp_path / "records"
    write_csv(records / "validations.csv", VALIDATIONS)
    write_csv(records / "rides.csv", RIDES)
    write_csv(records / "complaints.csv", COMPLAINTS)
    services, client = app_for(lisbon_store)
    services.metrics.refresh(ingest=True)
    report = services.metrics.last_report
    assert report is not None and report.rejected == 0
    return services, client


def refresh_at(services: Services, clock: Clock, when: str) -> None:
    """Set the clock to Lisbon time `when` and refresh the views (no new records read)."""
    clock.now = local_ts(when)
    services.metrics.refresh()


def get(client: falcon.testing.TestClient, path: str) -> object:
    r = client.simulate_get(path)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json


def test_demand_by_agency_day_and_month(loaded: Loaded) -> None:
    _, client = loaded
    day = get(client, "/v2/metrics/demand/by_agency/day")
    assert [r["properties"] for r in day] == [{"agency_id": "41"}, {"agency_id": "42"}]
    a41 = {d: e["qty"] for d, e in day[0]["data"].items()}
    assert a41 == {
        "2026-10-31": 4,
        "2026-11-13": 6,
        "2026-11-18": 5,
        "2026-11-19": 2,
        "2026-11-20": 11,
    }
    assert day[0]["data"]["2026-11-20"] == {
        "day_type": "1",
        "holiday": "0",
        "notes": "",
        "period": "",
        "qty": 11,
    }
    assert day[0]["data"]["2026-10-31"]["day_type"] == "2"
    assert list(day[0]) == ["_id", "data", "description", "generated_at", "metric", "properties"]
    assert day[0]["metric"] == "demand_by_agency_day" and day[0]["generated_at"].endswith("Z")
    month = get(client, "/v2/metrics/demand/by_agency/month")
    assert [(r["properties"]["agency_id"], r["data"]) for r in month] == [
        ("41", {"2026-10": {"qty": 4}, "2026-11": {"qty": 24}}),
        ("42", {"2026-11": {"qty": 4}}),
    ]
    assert get(client, "/v2/metrics/demand/by_agency/year") == []


def test_demand_records_highest_day_and_month(loaded: Loaded) -> None:
    _, client = loaded
    (record,) = get(client, "/v2/metrics/demand/by_agency/records")
    assert record["_id"] == "demand_by_agency_records"
    assert record["data"] == {
        "agencies": {
            "41": {
                "day": {"date": "2026-11-20", "qty": 11},
                "month": {"date": "2026-11", "qty": 24},
            },
            # Two days with 2: the earlier one is the record.
            "42": {"day": {"date": "2026-11-13", "qty": 2}, "month": {"date": "2026-11", "qty": 4}},
        },
        "total": {
            "day": {"date": "2026-11-20", "qty": 13},
            "month": {"date": "2026-11", "qty": 28},
        },
    }


def test_demand_by_line_and_one_line(loaded: Loaded) -> None:
    _, client = loaded
    lines = get(client, "/v2/metrics/demand/by_line")
    totals = {r["properties"]["line_id"]: sum(e["qty"] for e in r["data"].values()) for r in lines}
    assert totals == {"1001": 9, "1002": 9, "1003": 5, "1004": 5, "2001": 4}
    one = client.simulate_get("/v2/metrics/demand/by_line/1002")
    assert one.status_code == 200 and one.headers["cache-control"] == "public, max-age=300"
    assert one.json == [lines[1]]
    assert get(client, "/v2/metrics/demand/by_line/9999") == []
    # The default profile takes any line id (110N is a line somewhere): unknown is [].
    assert get(client, "/v2/metrics/demand/by_line/10a") == []


def test_cm_profile_line_ids_are_four_digits(lisbon_store: TransitStore, app_for: App) -> None:
    _, client = app_for(lisbon_store, line_id_pattern=r"\d{4}")
    for line_id in ("10a", "1001%0A", "１００１"):
        bad = client.simulate_get(f"/v2/metrics/demand/by_line/{line_id}")
        assert bad.status_code == 400 and bad.json == []


def test_top_lines_ties(loaded: Loaded) -> None:
    _, client = loaded
    top = get(client, "/v2/metrics/demand/top_lines/by_agency")
    assert list(top) == ["lastUpdated", "topLinesByAgency"]
    ranked = {
        agency: [r["properties"]["line_id"] for r in v["lines"]]
        for agency, v in top["topLinesByAgency"].items()
    }
    # 1001 and 1002 tie at 9, 1003 and 1004 at 5: the lower line id goes first.
    assert ranked == {"41": ["1001", "1002", "1003"], "42": ["2001"]}
    assert top["lastUpdated"] == top["topLinesByAgency"]["41"]["lines"][0]["generated_at"]


def test_demand_by_stop(
    tmp_path: Path,
    loaded: Loaded,
    lisbon_store: TransitStore,
    app_for: App,
) -> None:
    _, client = loaded
    # The spec's answer ("in preparation") unless TRANSIT_METRICS_BY_STOP_DAYS opts in.
    assert get(client, "/v2/metrics/demand/by_stop") == []
    services, client = app_for(lisbon_store, by_stop_days=31)
    services.metrics.refresh(ingest=True)
    stops = get(client, "/v2/metrics/demand/by_stop")
    totals = {r["properties"]["stop_id"]: sum(e["qty"] for e in r["data"].values()) for r in stops}
    assert totals == {"010001": 7, "010002": 2, "010003": 9, "010004": 10, "020001": 4}


def test_service_last_14_days(loaded: Loaded) -> None:
    _, client = loaded
    body = get(client, "/v2/metrics/service/all")
    assert body == {
        "data": [
            {
                "agency_id": "41",
                "line_id": "1001",
                "operational_date": "20261119",
                "pass_trip_count": 1,
                "pass_trip_percentage": 50.0,
                "total_trip_count": 2,
            },
            {
                "agency_id": "42",
                "line_id": "2001",
                "operational_date": "20261119",
                "pass_trip_count": 1,
                "pass_trip_percentage": 100.0,
                "total_trip_count": 1,
            },
            {
                "agency_id": "41",
                "line_id": "1001",
                "operational_date": "20261106",
                "pass_trip_count": 1,
                "pass_trip_percentage": 50.0,
                "total_trip_count": 2,
            },
        ]
    }


def test_service_window_moves_with_the_operational_day(loaded: Loaded, clock: Clock) -> None:
    services, client = loaded
    # 03:59 on the 21st is still the 20th: nothing moves.
    refresh_at(services, clock, "2026-11-21T03:59")
    assert len(get(client, "/v2/metrics/service/all")["data"]) == 3
    # 04:00 on the 21st: the 20th joins the window, the 6th leaves it.
    refresh_at(services, clock, "2026-11-21T04:00")
    dates = [r["operational_date"] for r in get(client, "/v2/metrics/service/all")["data"]]
    assert dates == ["20261120", "20261120", "20261119", "20261119"]


def test_complaints(loaded: Loaded) -> None:
    _, client = loaded
    body = get(client, "/v2/metrics/complaints")
    assert body == [
        {
            "_id": "line-1001",
            "complaints": 1,
            "email": 1,
            "filter_value": "1001",
            "info_requests": 1,
            "last_update": "20261112",
            "other": 0,
            "phone": 1,
            "total": 2,
            "type": "line",
        },
        {
            "_id": "municipality-1106",
            "complaints": 0,
            "email": 0,
            "filter_value": "1106",
            "info_requests": 0,
            "last_update": "20261101",
            "other": 1,
            "phone": 0,
            "total": 1,
            "type": "municipality",
        },
        {
            "_id": "global-all",
            "complaints": 2,
            "email": 1,
            "filter_value": "all",
            "info_requests": 1,
            "last_update": "20261115",
            "other": 1,
            "phone": 2,
            "total": 4,
            "type": "global",
        },
    ]


def test_videowall_views(loaded: Loaded, clock: Clock) -> None:
    _, client = loaded
    views = {
        name: get(client, f"/v2/metrics/videowall/{name}")
        for name in ("delays", "empty-rides", "sla", "validations", "vkm")
    }
    for body in views.values():
        assert list(body) == ["data", "timestamp_resource"]
        assert body["timestamp_resource"] == int(clock.now * 1000)
    assert views["delays"]["data"] == {
        "_41_average_delay_minutes": 3.83,
        "_41_delayed_for_more_than_five_minutes_count": 1,
        "_41_total_until_now_count": 2,
        "_42_average_delay_minutes": 10.0,
        "_42_delayed_for_more_than_five_minutes_count": 1,
        "_42_total_until_now_count": 1,
        "_cm_average_delay_minutes": 5.89,
        "_cm_delayed_for_more_than_five_minutes_count": 2,
        "_cm_total_until_now_count": 3,
    }
    assert views["empty-rides"]["data"] == {
        "_41_empty_rides_count": 1,
        "_41_empty_rides_vkm": 7.5,
        "_42_empty_rides_count": 1,
        "_42_empty_rides_vkm": 3.25,
        "_cm_empty_rides_count": 2,
        "_cm_empty_rides_vkm": 10.75,
    }
    assert views["sla"]["data"] == {
        "_41_scheduled_rides_total": 3,
        "_41_scheduled_rides_until_now": 2,
        "_41_simple_one_validation_transaction_fail_until_now": 1,
        "_41_simple_three_events_fail_until_now": 0,
        "_41_simple_three_events_or_simple_one_validation_transaction_fail_until_now": 0,
        "_42_scheduled_rides_total": 2,
        "_42_scheduled_rides_until_now": 2,
        "_42_simple_one_validation_transaction_fail_until_now": 1,
        "_42_simple_three_events_fail_until_now": 2,
        "_42_simple_three_events_or_simple_one_validation_transaction_fail_until_now": 1,
        "_cm_scheduled_rides_total": 5,
        "_cm_scheduled_rides_until_now": 4,
        "_cm_simple_one_validation_transaction_fail_until_now": 2,
        "_cm_simple_three_events_fail_until_now": 2,
        "_cm_simple_three_events_or_simple_one_validation_transaction_fail_until_now": 1,
    }
    assert views["validations"]["data"] == {
        "_41_last_week_valid_count": 6,
        "_41_today_valid_count": 6,
        "_42_last_week_valid_count": 1,
        "_42_today_valid_count": 2,
        "_cm_last_week_valid_count": 7,
        "_cm_today_valid_count": 8,
    }
    assert views["vkm"]["data"] == {
        "_41_scheduled_vkm_until_now": 22.0,
        "_41_simple_one_validation_transaction_vkm_until_now": 10.0,
        "_41_simple_three_events_or_simple_one_validation_transaction_vkm_until_now": 22.0,
        "_41_simple_three_events_vkm_until_now": 22.0,
        "_42_scheduled_vkm_until_now": 25.0,
        "_42_simple_one_validation_transaction_vkm_until_now": 5.0,
        "_42_simple_three_events_or_simple_one_validation_transaction_vkm_until_now": 5.0,
        "_42_simple_three_events_vkm_until_now": 0.0,
        "_cm_scheduled_vkm_until_now": 47.0,
        "_cm_simple_one_validation_transaction_vkm_until_now": 15.0,
        "_cm_simple_three_events_or_simple_one_validation_transaction_vkm_until_now": 27.0,
        "_cm_simple_three_events_vkm_until_now": 22.0,
    }


def test_until_now_follows_the_clock(loaded: Loaded, clock: Clock) -> None:
    services, client = loaded
    refresh_at(services, clock, "2026-11-20T11:30")
    sla = get(client, "/v2/metrics/videowall/sla")["data"]
    assert sla["_41_scheduled_rides_until_now"] == 3
    assert get(client, "/v2/metrics/videowall/validations")["data"]["_41_today_valid_count"] == 11


def test_new_records_are_picked_up(tmp_path: Path, loaded: Loaded) -> None:
    services, client = loaded
    with open(tmp_path / "records" / "validations.csv", "a", encoding="utf-8") as f:
        f.write(",".join(map(str, validation("2026-11-20T09:45", "43", "3001", "030001"))) + "\n")
    services.metrics.refresh(ingest=True)
    day = get(client, "/v2/metrics/demand/by_agency/day")
    assert [r["properties"]["agency_id"] for r in day] == ["41", "42", "43"]
    # Ingesting the same directory again changes nothing.
    before = client.simulate_get("/v2/metrics/demand/by_line").headers["etag"]
    services.metrics.refresh(ingest=True)
    assert client.simulate_get("/v2/metrics/demand/by_line").headers["etag"] == before


def test_headers_gzip_and_etag(loaded: Loaded) -> None:
    _, client = loaded
    expected = {
        "/v2/metrics/demand/by_agency/day": "public, max-age=1800",
        "/v2/metrics/demand/by_agency/records": "public, max-age=1800",
        "/v2/metrics/demand/by_line": "public, max-age=300",
        "/v2/metrics/demand/top_lines/by_agency": "public, max-age=300",
        "/v2/metrics/demand/by_stop": "public, max-age=300",
        "/v2/metrics/complaints": "public, max-age=300",
        "/v2/metrics/service/all": "public, max-age=3600",
        "/v2/metrics/videowall/sla": "public, max-age=60",
    }
    for path, cache in expected.items():
        r = client.simulate_get(path + "/")  # trailing slash ignored
        assert r.status_code == 200
        assert r.headers["cache-control"] == cache
        assert r.headers["content-type"] == "application/json; charset=utf-8"
        assert r.headers["access-control-allow-origin"] == "*"
        again = client.simulate_get(path, headers={"If-None-Match": r.headers["etag"]})
        assert again.status_code == 304
    gz = client.simulate_get("/v2/metrics/demand/by_line", headers={"Accept-Encoding": "gzip"})
    assert gz.headers["content-encoding"] == "gzip"


def test_calendar_from_a_dates_file(
    tmp_path: Path, lisbon_store: TransitStore, app_for: App
) -> None:
    dates = tmp_path / "dates.txt"
    dates.write_text(
        "date,period,day_type,holiday,description\n20261120,1,3,1,Feriado de teste\n",
        encoding="utf-8",
    )
    write_csv(tmp_path / "records" / "validations.csv", VALIDATIONS[:3])
    services, client = app_for(lisbon_store, dates_file=str(dates))
    services.metrics.refresh(ingest=True)
    (record,) = get(client, "/v2/metrics/demand/by_agency/day")
    assert record["data"]["2026-11-20"] == {
        "day_type": "3",
        "holiday": "1",
        "notes": "Feriado de teste",
        "period": "1",
        "qty": 3,
    }


def test_no_store_or_not_ready_is_404_empty_list(lisbon_store: TransitStore, app_for: App) -> None:
    _, client = app_for(lisbon_store, records_dir=None, db=None)
    for path in (
        "/v2/metrics/demand/by_agency/day",
        "/v2/metrics/videowall/vkm",
        "/v2/metrics/demand/by_line/1001",
    ):
        r = client.simulate_get(path)
        assert r.status_code == 404 and r.json == []
    # Configured but not refreshed yet (the worker just started): also 404 `[]`.
    _, client = app_for(lisbon_store)
    assert client.simulate_get("/v2/metrics/complaints").status_code == 404


def test_empty_store_serves_empty_views(lisbon_store: TransitStore, app_for: App) -> None:
    services, client = app_for(lisbon_store)
    services.metrics.refresh(ingest=True)
    assert get(client, "/v2/metrics/demand/by_agency/records") == []
    assert get(client, "/v2/metrics/service/all") == {"data": []}
    assert get(client, "/v2/metrics/demand/top_lines/by_agency") == {
        "lastUpdated": None,
        "topLinesByAgency": {},
    }
    # Every agency of the feed has its keys, zero before any data.
    assert get(client, "/v2/metrics/videowall/delays")["data"] == {
        "_41_average_delay_minutes": 0,
        "_41_delayed_for_more_than_five_minutes_count": 0,
        "_41_total_until_now_count": 0,
        "_42_average_delay_minutes": 0,
        "_42_delayed_for_more_than_five_minutes_count": 0,
        "_42_total_until_now_count": 0,
        "_cm_average_delay_minutes": 0,
        "_cm_delayed_for_more_than_five_minutes_count": 0,
        "_cm_total_until_now_count": 0,
    }


def test_by_stop_window(tmp_path: Path, lisbon_store: TransitStore, app_for: App) -> None:
    write_csv(tmp_path / "records" / "validations.csv", VALIDATIONS)
    services, client = app_for(lisbon_store, by_stop_days=2)
    services.metrics.refresh(ingest=True)
    stops = get(client, "/v2/metrics/demand/by_stop")
    # Only the 19th and 20th (today): the 18th's stop 010004 counts only today's 5.
    assert {r["properties"]["stop_id"]: sorted(r["data"]) for r in stops} == {
        "010001": ["2026-11-20"],
        "010002": ["2026-11-19"],
        "010003": ["2026-11-20"],
        "010004": ["2026-11-20"],
        "020001": ["2026-11-20"],
    }
    services, client = app_for(lisbon_store, by_stop_days=0)
    services.metrics.refresh(ingest=True)
    assert get(client, "/v2/metrics/demand/by_stop") == []
