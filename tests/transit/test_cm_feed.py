"""A Carris-Metropolitana-shaped deployment: the real CM stops (every 25th), agency, dates,
periods and feed_info with CM-style lines, trips and GTFS-RT vehicles (`41|1160`), and no
location lists configured. Ids join: the operator's route ids, CM's vehicle ids as CM sends
them, location ids of the stops in `/v2/locations/*`, one spelling per videowall key; and the
endpoints of the real API that come from CM's own files: dates, periods, plans, status."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import falcon.testing
import pytest
from support import Clock

from sidecars.transit.app import Services
from sidecars.transit.places.names import locality_id
from sidecars.transit.store import TransitStore

from .helpers import local_ts, write_feed
from .metrics.records import validation, write_csv
from .realtime.test_realtime import feed

DATA = Path(__file__).resolve().parent / "network" / "data"
NOW = local_ts("2026-03-24T08:05")  # a Tuesday, in Lisbon
STOPS = (DATA / "cm_stops_every_25th.txt").read_text(encoding="utf-8")
FIRST, SECOND, THIRD = (r["stop_id"] for r in list(csv.DictReader(io.StringIO(STOPS)))[:3])


def cm_files() -> dict[str, str | None]:
    cm = {name: (DATA / "cm" / name).read_text(encoding="utf-8") for name in (
        "agency.txt", "dates.txt", "periods.txt", "feed_info.txt")}  # fmt: skip
    return {
        **cm,
        "stops.txt": STOPS,
        "routes.txt": "route_id,agency_id,route_short_name,route_long_name,route_type,"
        "route_color,route_text_color,line_id,line_short_name,line_long_name\n"
        "1001_0,CM,1001,Alcochete - Almada,3,ED1C24,FFFFFF,1001,1001,Alcochete - Almada\n",
        "trips.txt": "route_id,service_id,trip_id,trip_headsign,direction_id,pattern_id\n"
        "1001_0,DU_26,1001_0_1_0800_0829_0_7,Almada,0,1001_0_1\n",
        "stop_times.txt": "trip_id,arrival_time,departure_time,stop_id,stop_sequence\n"
        f"1001_0_1_0800_0829_0_7,08:00:00,08:00:00,{FIRST},1\n"
        f"1001_0_1_0800_0829_0_7,08:10:00,08:10:00,{SECOND},2\n"
        f"1001_0_1_0800_0829_0_7,08:20:00,08:20:00,{THIRD},3\n",
        "calendar_dates.txt": "service_id,date,exception_type\nDU_26,20260324,1\n",
    }


@pytest.fixture
def cm_store(tmp_path: Path, make_store: Callable[..., TransitStore]) -> TransitStore:
    vehicles = tmp_path / "vp.pb"
    vehicles.write_bytes(
        feed(
            [{"id": "21NBI-41|1160-1001_0_1_0800_0829_0_7", "vehicle": {
                "trip": {"trip_id": "1001_0_1_0800_0829_0_7", "route_id": "1001_0"},
                "vehicle": {"id": "41|1160"}, "timestamp": int(NOW) - 20,
                "position": {"latitude": 38.75, "longitude": -8.96}}}],
            NOW,
        )
    )  # fmt: skip
    path = write_feed(tmp_path / "cm.zip", cm_files(), base={})
    store = make_store(path, clock=Clock(NOW), vehicles_source=str(vehicles))
    assert store.load_static()
    store.poll_realtime()
    return store


@pytest.fixture
def client(cm_store: TransitStore, app_for) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    # Metrics on, no location lists configured (an operator's deployment).
    return app_for(cm_store)[1]  # type: ignore[no-any-return]


def test_vehicle_ids_as_cm_sends_them_and_routes_as_the_feed_names_them(
    client: falcon.testing.TestClient,
) -> None:
    [vehicle] = client.simulate_get("/v2/vehicles").json
    assert vehicle["id"] == "41|1160" and vehicle["agency_id"] == "41"
    assert vehicle["route_id"] == "1001_0" and vehicle["line_id"] == "1001"
    assert vehicle["pattern_id"] == "1001_0_1"
    assert client.simulate_get("/v2/vehicles/41|1160").json == vehicle
    routes = {r["id"] for r in client.simulate_get("/v2/routes").json}
    assert routes == {"1001_0"}
    arrivals = client.simulate_get(f"/v2/arrivals/by_stop/{FIRST}").json
    assert [(a["route_id"], a["vehicle_id"]) for a in arrivals] == [("1001_0", "41|1160")]


def test_locations_are_derived_from_the_stops_and_join(client: falcon.testing.TestClient) -> None:
    stops = client.simulate_get("/v2/stops").json
    assert len(stops) == 504

    def listed(kind: str) -> dict[str, dict]:
        body = client.simulate_get(f"/v2/locations/{kind}").json
        assert body["status"] == "success"
        return {x["id"]: x for x in body["data"]}

    districts, municipalities = listed("districts"), listed("municipalities")
    localities, regions = listed("localities"), listed("regions")
    for stop in stops:
        assert stop["district_id"] in districts
        assert stop["municipality_id"] in municipalities
        assert stop["locality_id"] in localities
        assert stop["region_id"] in regions
    assert districts["15"] == {"id": "15", "name": "Setúbal"}
    assert municipalities["1502"] == {"district_id": "15", "id": "1502", "name": "Alcochete"}
    alcochete = localities[locality_id("1502", "Alcochete")]
    assert alcochete["id"] == "1502-alcochete" and alcochete["municipality_id"] == "1502"
    assert regions["PT170"] == {"id": "PT170", "name": "AML"}


def test_dates_periods_plans_from_cms_files(client: falcon.testing.TestClient) -> None:
    dates = client.simulate_get("/v2/dates")
    assert dates.headers["cache-control"] == "public, max-age=3600"
    days = dates.json
    assert len(days) == 2557  # 2023-01-01 to 2029-12-31
    assert days[0] == {
        "date": "20230101", "day_type": "3", "description": "", "holiday": "1", "period": "2"
    }  # fmt: skip
    periods = {p["id"]: p for p in client.simulate_get("/v2/periods").json}
    assert [periods[i]["name"] for i in ("1", "2", "3")] == [
        "Período Escolar", "Período de Férias Escolares", "Período de Verão"
    ]  # fmt: skip
    school = periods["1"]
    assert len(school["valid_on"]) == sum(d["period"] == "1" for d in days)
    first = school["valid_ranges"][0]
    assert first["start"] == school["valid_on"][0] <= first["end"]
    [plan] = client.simulate_get("/v2/plans").json
    # CM's feed_info has feed_start_date "0" (not a date): the row is reported and the plan
    # spans the service days.
    assert plan["agency_id"] == "CM" and plan["valid_range"] == {
        "start": "20260324",
        "end": "20260324",
    }
    report = client.simulate_get("/status/feed").json["serving"]
    codes = {(n["code"], n["severity"]) for n in report["notices"]}
    assert ("invalid_date", "error") in codes
    assert ("unknown_file", "info") in codes  # dates.txt, periods.txt


def test_status_time_and_message(client: falcon.testing.TestClient) -> None:
    result = client.simulate_get("/v2/status/time")
    assert result.headers["cache-control"] == "public, max-age=5"
    assert result.json == {
        "now_minus_20_seconds": int(NOW) - 20,
        "now_minus_5_minutes": "202603240800",
        "now_minus_90_seconds": int(NOW) - 90,
        "now_unix_int": int(NOW),
    }
    message = client.simulate_get("/v2/status/message").json
    assert message == {"body": "", "more_info": "", "style": "ok", "title": "All data is current."}


def test_videowall_keys_have_one_spelling(tmp_path: Path, cm_store: TransitStore, app_for) -> None:  # type: ignore[no-untyped-def]
    # The feed's agency is `CM`; the records are the operator areas'.
    write_csv(tmp_path / "records" / "validations.csv",
              [validation("2026-03-24T07:30", "41", "1001", FIRST)] * 3)  # fmt: skip
    services: Services
    services, client = app_for(cm_store)
    services.metrics.refresh(ingest=True)
    data = client.simulate_get("/v2/metrics/videowall/validations").json["data"]
    assert data["_41_today_valid_count"] == 3 and data["_cm_today_valid_count"] == 3
    assert not any(k.startswith("_CM_") for k in data), data
