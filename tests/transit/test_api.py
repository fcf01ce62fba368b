"""Every endpoint against the real Cairns feed and Bull Runner vehicles: shapes, values,
status codes and bodies, headers, caching."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import zipfile

import falcon.testing
import pytest
from google.transit import gtfs_realtime_pb2 as rt

from sidecars.transit.app import Services, create_app
from sidecars.transit.network import natural_key
from sidecars.transit.settings import DEFAULT_FACILITIES, DEFAULT_LOCATIONS, PlacesSettings
from sidecars.transit.store import TransitStore

from .helpers import BRISBANE, CAIRNS_ZIP, local_ts

STOP_FIELDS = {
    "district_id", "facilities", "id", "lat", "line_ids", "locality_id", "lon", "long_name",
    "municipality_id", "operational_status", "pattern_ids", "region_id", "route_ids",
    "short_name", "tts_name", "wheelchair_boarding",
}  # fmt: skip
LINE_FIELDS = {
    "id", "short_name", "long_name", "tts_name", "color", "text_color", "district_ids",
    "locality_ids", "municipality_ids", "region_ids", "facilities", "pattern_ids", "route_ids",
    "stop_ids",
}  # fmt: skip
PATTERN_FIELDS = {
    "id", "line_id", "route_id", "shape_id", "short_name", "long_name", "headsign",
    "tts_headsign", "color", "text_color", "version_id", "direction_id", "district_ids",
    "locality_ids", "municipality_ids", "region_ids", "facilities", "valid_on", "path", "trips",
}  # fmt: skip
ARRIVAL_FIELDS = {
    "scheduled_arrival", "estimated_arrival", "observed_arrival", "scheduled_arrival_unix",
    "estimated_arrival_unix", "observed_arrival_unix", "headsign", "line_id", "route_id",
    "pattern_id", "trip_id", "vehicle_id", "stop_sequence", "schedule_relationship",
}  # fmt: skip
VEHICLE_FIELDS = {
    "id", "agency_id", "bearing", "speed", "lat", "lon", "timestamp", "current_status",
    "schedule_relationship", "block_id", "event_id", "line_id", "pattern_id", "route_id",
    "shift_id", "stop_id", "trip_id", "door_status", "bikes_allowed", "wheelchair_accessible",
    "capacity_seated", "capacity_standing", "capacity_total", "license_plate", "make", "model",
    "owner", "propulsion", "registration_date",
}  # fmt: skip
PIP_FIELDS = {
    "estimatedArrivalTime", "estimatedDepartureTime", "timetabledArrivalTime",
    "timetabledDepartureTime", "observedArrivalTime", "observedDepartureTime",
    "estimatedTimeString", "estimatedTimeUnixSeconds", "journeyId", "lineId", "patternId",
    "stopHeadsign", "observedVehicleId", "observedDriverId", "operatorId", "stopId",
}  # fmt: skip
JSON = "application/json; charset=utf-8"


def get_json(client: falcon.testing.TestClient, path: str, status: int = 200) -> object:
    result = client.simulate_get(path)
    assert result.status_code == status, result.text
    assert result.headers["content-type"] == JSON
    return result.json


def test_stops(cairns: falcon.testing.TestClient) -> None:
    result = cairns.simulate_get("/v2/stops")
    assert result.status_code == 200
    assert result.headers["cache-control"] == "public, max-age=3600"
    assert result.headers["access-control-allow-origin"] == "*"
    stops = result.json
    assert len(stops) == 416
    assert all(set(s) == STOP_FIELDS for s in stops)
    assert [s["id"] for s in stops] == sorted((s["id"] for s in stops), key=natural_key)
    first = stops[0]
    assert first["id"] == "750000"
    assert first["long_name"] == "Cedar Rd (Palm Cove) - Hail and Ride Location"
    assert first["lat"] == -16.74359 and first["lon"] == 145.668217
    assert first["line_ids"] == ["110", "110N"]
    # The operator's route ids, as in the feed and in GTFS-RT (patterns.py).
    assert first["route_ids"] == ["110-423", "110N-423"]
    assert isinstance(first["wheelchair_boarding"], bool)


def test_lines_and_routes(cairns: falcon.testing.TestClient) -> None:
    lines = get_json(cairns, "/v2/lines")
    routes = get_json(cairns, "/v2/routes")
    assert isinstance(lines, list) and isinstance(routes, list)
    assert all(set(x) == LINE_FIELDS for x in lines)
    assert all(set(x) == LINE_FIELDS | {"line_id"} for x in routes)
    assert len(lines) == 22 and len(routes) == 22  # one per GTFS route, under its own id
    assert all(r["pattern_ids"] for r in routes)
    route = next(r for r in routes if r["id"] == "110-423")
    assert route["line_id"] == "110" and route["color"] == "#7BC142"
    line = next(x for x in lines if x["id"] == "110")
    assert line["route_ids"] == ["110-423"]
    assert cairns.simulate_get("/v2/routes").headers["cache-control"] == "public, max-age=3600"


def test_patterns_and_unknown_pattern(cairns: falcon.testing.TestClient) -> None:
    route = next(r for r in get_json(cairns, "/v2/routes") if r["id"] == "110-423")
    for pattern_id in route["pattern_ids"]:
        versions = get_json(cairns, f"/v2/patterns/{pattern_id}")
        assert isinstance(versions, list) and len(versions) >= 1
        for v in versions:
            assert set(v) == PATTERN_FIELDS
            assert v["id"] == pattern_id and v["route_id"] == "110-423" and v["line_id"] == "110"
            assert set(v["path"][0]) == {
                "allow_drop_off", "allow_pickup", "distance", "distance_delta", "stop_id",
                "stop_sequence",
            }  # fmt: skip
            assert set(v["trips"][0]) == {"schedule", "service_ids", "trip_ids", "valid_on",
                                          "version_id"}  # fmt: skip
            assert set(v["trips"][0]["schedule"][0]) == {
                "arrival_time", "arrival_time_24h", "stop_id", "stop_sequence",
            }  # fmt: skip
    result = cairns.simulate_get("/v2/patterns/nope")
    assert result.status_code == 404 and result.text == "{}"
    assert result.headers["content-type"] == JSON


def test_shapes_and_unknown_shape(cairns: falcon.testing.TestClient) -> None:
    shape = get_json(cairns, "/v2/shapes/1100015")
    assert set(shape) == {"extension", "geojson", "points", "shape_id"}
    assert shape["shape_id"] == "1100015"
    assert shape["geojson"]["type"] == "Feature"
    assert shape["geojson"]["geometry"]["type"] == "LineString"
    # GeoJSON is [lon, lat]
    assert shape["geojson"]["geometry"]["coordinates"][0] == [145.668255, -16.743632]
    assert shape["points"][0] == {
        "shape_dist_traveled": 0.0,
        "shape_pt_lat": -16.743632,
        "shape_pt_lon": 145.668255,
        "shape_pt_sequence": 10001,
    }
    assert isinstance(shape["extension"], int) and 30_000 < shape["extension"] < 35_000
    result = cairns.simulate_get("/v2/shapes/nope")
    assert result.status_code == 404 and result.text == "{}"


def test_gtfs_zip_is_the_served_feed(cairns: falcon.testing.TestClient) -> None:
    result = cairns.simulate_get("/v2/gtfs")
    assert result.status_code == 200
    assert result.headers["content-type"] == "application/zip"
    assert result.headers["content-disposition"] == 'attachment; filename="CMET.zip"'
    assert result.content == CAIRNS_ZIP.read_bytes()
    assert "stop_times.txt" in zipfile.ZipFile(io.BytesIO(result.content)).namelist()


def test_arrivals_by_stop_on_a_weekday(cairns: falcon.testing.TestClient) -> None:
    arrivals = get_json(cairns, "/v2/arrivals/by_stop/750000")
    assert isinstance(arrivals, list) and arrivals
    assert all(set(a) == ARRIVAL_FIELDS for a in arrivals)
    unix = [a["scheduled_arrival_unix"] for a in arrivals]
    assert unix == sorted(unix)
    for a in arrivals:
        # 2014-06-10 is a Tuesday: only the weekday services run.
        assert "Weekday" in a["trip_id"]
        h, m, s = (int(x) for x in a["scheduled_arrival"].split(":"))
        assert (
            a["scheduled_arrival_unix"]
            == local_ts("2014-06-10T00:00", BRISBANE) + h * 3600 + m * 60 + s
        )
        assert a["estimated_arrival"] is None and a["observed_arrival_unix"] is None
        assert a["vehicle_id"] is None
    assert arrivals[0]["line_id"] in ("110", "110N")
    result = cairns.simulate_get("/v2/arrivals/by_stop/750000")
    assert result.headers["cache-control"] == "public, max-age=20"


def test_arrivals_operational_day_boundary(cairns_store, cairns: falcon.testing.TestClient) -> None:  # type: ignore[no-untyped-def]
    # 03:59 on Tuesday 2014-06-10 still belongs to Monday 06-09, a public holiday on which the
    # Sunday service runs instead of the weekday one.
    cairns_store.now.now = local_ts("2014-06-10T03:59:59", BRISBANE)
    monday = get_json(cairns, "/v2/arrivals/by_stop/750000")
    assert monday and all("Sunday" in a["trip_id"] for a in monday)
    assert monday[0]["scheduled_arrival_unix"] >= local_ts("2014-06-09T00:00", BRISBANE)
    cairns_store.now.now = local_ts("2014-06-10T04:00:00", BRISBANE)
    tuesday = get_json(cairns, "/v2/arrivals/by_stop/750000")
    assert tuesday and all("Weekday" in a["trip_id"] for a in tuesday)


def test_arrivals_by_stop_errors(cairns: falcon.testing.TestClient) -> None:
    # The default ("gtfs") profile takes any id the feed has: others are unknown (404); the
    # "cm" profile's 6-digit rule is tested with the bounded requests.
    for path, status in [("/v2/arrivals/by_stop/abc", 404), ("/v2/arrivals/by_stop/75000", 404),
                         ("/v2/arrivals/by_stop/999999", 404),
                         ("/v2/arrivals/by_stop/750000?date=2014-06-10", 400)]:  # fmt: skip
        result = cairns.simulate_get(path)
        assert (result.status_code, result.text) == (status, "[]")
        assert result.headers["content-type"] == JSON


def test_arrivals_by_pattern(cairns: falcon.testing.TestClient) -> None:
    route = next(r for r in get_json(cairns, "/v2/routes") if r["id"] == "110-423")
    pattern_id = route["pattern_ids"][-1]
    arrivals = get_json(cairns, f"/v2/arrivals/by_pattern/{pattern_id}")
    assert arrivals and all(set(a) == ARRIVAL_FIELDS | {"stop_id"} for a in arrivals)
    assert {a["pattern_id"] for a in arrivals} == {pattern_id}
    versions = get_json(cairns, f"/v2/patterns/{pattern_id}")
    assert {a["stop_id"] for a in arrivals} <= {p["stop_id"] for v in versions for p in v["path"]}
    result = cairns.simulate_get("/v2/arrivals/by_pattern/nope")
    assert (result.status_code, result.text) == (404, "[]")


def test_vehicles_from_the_real_bull_runner_feed(cairns: falcon.testing.TestClient) -> None:
    result = cairns.simulate_get("/v2/vehicles")
    assert result.headers["cache-control"] == "public, max-age=5"
    assert result.headers["access-control-allow-origin"] == "*"
    vehicles = result.json
    assert len(vehicles) == 10
    assert all(set(v) == VEHICLE_FIELDS for v in vehicles)
    # Cairns has no agency_id: its single agency is "1" in the API.
    v = next(v for v in vehicles if v["id"] == "1|1536")
    assert v["agency_id"] == "1"
    assert v["route_id"] == "F" and v["bearing"] == 180.0
    assert v["lat"] == pytest.approx(28.0662212) and v["lon"] == pytest.approx(-82.4176941)
    assert v["timestamp"] == 1505314375  # the feed header's
    assert v["trip_id"] is None and v["line_id"] is None  # route F is not a Cairns route
    assert v["event_id"] == "1"


def test_vehicles_pb_is_gtfs_rt(cairns: falcon.testing.TestClient) -> None:
    result = cairns.simulate_get("/v2/vehicles.pb")
    assert result.status_code == 200
    assert result.headers["content-type"] == "application/octet-stream"
    assert result.headers["cache-control"] == "public, max-age=5"
    feed = rt.FeedMessage()
    feed.ParseFromString(result.content)
    assert feed.header.gtfs_realtime_version == "2.0"
    # The real service only publishes vehicles that are on a trip; Bull Runner's are not.
    assert len(feed.entity) == 0


def test_alerts_without_a_source_are_empty(cairns: falcon.testing.TestClient) -> None:
    result = cairns.simulate_get("/v2/alerts")
    assert (result.status_code, result.text) == (200, "[]")
    assert result.headers["cache-control"] == "public, max-age=20"
    pb = cairns.simulate_get("/v2/alerts.pb")
    assert pb.headers["content-type"] == "application/octet-stream"
    feed = rt.FeedMessage()
    feed.ParseFromString(pb.content)
    assert len(feed.entity) == 0


def test_pip_message(cairns: falcon.testing.TestClient) -> None:
    result = cairns.simulate_get("/v2/pips/ABC123/message")
    assert result.json == {"message": "#ABC123"}
    assert result.headers["cache-control"] == "public, max-age=20"


def post_pip(client: falcon.testing.TestClient, body: object) -> falcon.testing.Result:
    result = client.simulate_post("/v2/pips/estimates", body=json.dumps(body))
    assert result.headers["content-type"] == JSON
    return result


def test_pip_estimates_scheduled(cairns: falcon.testing.TestClient) -> None:
    result = post_pip(cairns, {"stops": ["750000", "750001"]})
    assert result.status_code == 200
    assert result.headers["cache-control"] == "public, no-cache"
    rows = result.json
    assert 0 < len(rows) <= 8
    assert all(set(r) == PIP_FIELDS for r in rows)
    now = local_ts("2014-06-10T08:00", BRISBANE)
    seconds = [r["estimatedTimeUnixSeconds"] for r in rows]
    assert seconds == sorted(seconds) and seconds[0] > now
    first = rows[0]
    assert first["journeyId"] is None and first["observedVehicleId"] is None
    assert first["estimatedArrivalTime"] == first["timetabledArrivalTime"]
    assert first["estimatedTimeString"] == first["timetabledArrivalTime"][:5]
    assert first["stopId"] == "" and first["operatorId"] == "" and first["observedDriverId"] == ""


def test_pip_estimates_after_service_gives_placeholders(cairns_store, cairns) -> None:  # type: ignore[no-untyped-def]
    cairns_store.now.now = local_ts("2015-06-10T08:00", BRISBANE)  # after the feed's end
    rows = post_pip(cairns, {"stops": ["750000"]}).json
    assert [r["stopHeadsign"] for r in rows] == ["Sem estimativas em tempo real.",
                                                 "Consulte o site para +info."]  # fmt: skip
    assert [r["lineId"] for r in rows] == ["INFO", "INFO"]


@pytest.mark.parametrize(
    ("stops", "headsigns", "strings"),
    [
        (["000000"], ["Olá :)", "Olá :)"], ["TEST", "›››"]),
        (["000001"], ["Sem estimativas. Consulte site para +info."], ["1 min"]),
        (["no-service"], ["Paragem desativada.", "Painel inativo."], ["", ""]),
        # special ids win before validation, the first one in the list
        (["bad", "no-service", "000000"], ["Paragem desativada.", "Painel inativo."], ["", ""]),
    ],
)
def test_pip_special_ids(
    cairns: falcon.testing.TestClient, stops: list[str], headsigns: list[str], strings: list[str]
) -> None:
    result = post_pip(cairns, {"stops": stops})
    assert result.status_code == 200
    assert [r["stopHeadsign"] for r in result.json] == headsigns
    assert [r["estimatedTimeString"] for r in result.json] == strings
    assert all(set(r) == PIP_FIELDS for r in result.json)
    assert result.json[0]["estimatedArrivalTime"] == "23:59:59"


@pytest.mark.parametrize("body", [{}, {"stops": []}, {"stops": "750000"},
                                  {"stops": [750000]}, [], {"other": 1}])  # fmt: skip
def test_pip_invalid_input_is_400_empty_list(
    cairns: falcon.testing.TestClient, body: object
) -> None:
    result = post_pip(cairns, body)
    assert (result.status_code, result.text) == (400, "[]")


def test_pip_unparsable_body_is_a_400_envelope(cairns: falcon.testing.TestClient) -> None:
    # The real service answers 500 (its error handler); a bad body is the client's: 400.
    result = cairns.simulate_post("/v2/pips/estimates", body="{not json")
    assert result.status_code == 400
    assert result.headers["cache-control"] == "public, max-age=5"
    body = result.json
    assert set(body) == {"message", "status", "timestamp"}
    assert body["status"] == "error" and "the body is not JSON" in body["message"]


def test_unknown_route_and_method_get_the_fastify_404(cairns: falcon.testing.TestClient) -> None:
    result = cairns.simulate_get("/v2/nothing")
    assert result.status_code == 404
    # The real proxy strips /v2 before the app sees the path.
    assert result.json == {"message": "Route GET:/nothing not found", "error": "Not Found",
                           "statusCode": 404}  # fmt: skip
    # There are no per-item stop endpoints in v2.
    assert cairns.simulate_get("/v2/stops/750000").status_code == 404
    result = cairns.simulate_delete("/v2/stops")
    assert result.status_code == 404
    assert result.json["message"] == "Route DELETE:/stops not found"


def test_trailing_slash_is_ignored(cairns: falcon.testing.TestClient) -> None:
    assert cairns.simulate_get("/v2/lines/").content == cairns.simulate_get("/v2/lines").content
    assert cairns.simulate_get("/v2/patterns/nope/").status_code == 404


def test_gzip_etag_and_304(cairns: falcon.testing.TestClient) -> None:
    plain = cairns.simulate_get("/v2/stops")
    zipped = cairns.simulate_get("/v2/stops", headers={"Accept-Encoding": "gzip, deflate"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert "Accept-Encoding" in zipped.headers["vary"]
    assert gzip.decompress(zipped.content) == plain.content
    assert len(zipped.content) < len(plain.content) / 5
    assert plain.headers["etag"] != zipped.headers["etag"]
    for response in (plain, zipped):
        again = cairns.simulate_get(
            "/v2/stops", headers={"If-None-Match": response.headers["etag"]}
        )
        assert again.status_code == 304 and again.content == b""
        assert again.headers["etag"] and again.headers["cache-control"] == "public, max-age=3600"
    stale = cairns.simulate_get("/v2/stops", headers={"If-None-Match": '"other"'})
    assert stale.status_code == 200
    no_gzip = cairns.simulate_get("/v2/stops", headers={"Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in no_gzip.headers


def test_static_bodies_are_encoded_once_per_feed_version(cairns_store) -> None:  # type: ignore[no-untyped-def]
    net = cairns_store.network
    assert net.pattern_body("110-423_0") is net.pattern_body("110-423_0")
    assert net.stops_body.gzipped() is net.stops_body.gzipped()


def test_head_and_preflight(cairns: falcon.testing.TestClient) -> None:
    head = cairns.simulate_head("/v2/lines")
    assert head.status_code == 200 and head.content == b""
    options = cairns.simulate_options("/v2/arrivals/by_stop/750000")
    assert options.status_code == 204
    assert options.headers["access-control-allow-origin"] == "*"
    assert options.headers["access-control-allow-methods"] == "GET, POST, OPTIONS"
    assert options.headers["access-control-max-age"] == "1728000"


def test_timing_headers(cairns: falcon.testing.TestClient) -> None:
    result = cairns.simulate_get("/v2/lines")
    assert int(result.headers["cmet-send-timestamp"]) >= int(
        result.headers["cmet-receive-timestamp"]
    )


def test_health(cairns: falcon.testing.TestClient) -> None:
    health = get_json(cairns, "/health")
    assert health["status"] == "ok"
    assert health["feed"]["status"] == "ok" and health["feed"]["problems"] == []
    assert health["feed"]["version"] == "ff39d3763a105ae9"
    assert health["vehicles"]["status"] == "ok" and health["vehicles"]["entities"] == 10
    assert health["alerts"]["status"] == "disabled"
    assert cairns.simulate_get("/health").headers["transit-worker"].isdigit()


def test_every_error_status_has_a_json_body(cairns: falcon.testing.TestClient) -> None:
    for method, path in [("GET", "/v2/x"), ("GET", "/v2/patterns/x"), ("GET", "/v2/shapes/x"),
                         ("GET", "/v2/arrivals/by_stop/x"), ("GET", "/v2/arrivals/by_pattern/x"),
                         ("POST", "/v2/pips/estimates"), ("PUT", "/v2/lines")]:  # fmt: skip
        result = cairns.simulate_request(method, path)
        assert result.status_code >= 400
        assert result.headers["content-type"] == JSON
        json.loads(result.content)


@pytest.mark.parametrize("header", ["gzip;q=abc", "br", "identity", "gzip; q=0.0"])
def test_odd_accept_encoding_falls_back_to_identity(
    cairns: falcon.testing.TestClient, header: str
) -> None:
    result = cairns.simulate_get("/v2/stops", headers={"Accept-Encoding": header})
    assert result.status_code == 200 and "content-encoding" not in result.headers


def test_body_cache_evicts_least_recently_used() -> None:
    from sidecars.transit.bodies import Body, BodyCache

    cache = BodyCache(max_bytes=3000)
    a, b, c = Body(b"a" * 1000), Body(b"b" * 1000), Body(b"c" * 1000)
    cache.put("a", a)
    cache.put("b", b)
    assert cache.get("a") == (True, a)  # a is now the most recent
    cache.put("c", c)  # over budget: b goes
    assert cache.get("b") == (False, None)
    assert cache.get("a") == (True, a) and cache.get("c") == (True, c)
    cache.put("unknown", None)
    assert cache.get("unknown") == (True, None)


def test_one_app_serves_every_part(cairns_store: TransitStore) -> None:
    places = PlacesSettings(locations_dir=DEFAULT_LOCATIONS, facilities_dir=DEFAULT_FACILITIES)
    settings = dataclasses.replace(cairns_store.settings, places=places)
    app = create_app(settings, services=Services(settings, store=cairns_store))
    client = falcon.testing.TestClient(app)
    assert client.simulate_get("/v2/locations/districts").status_code == 200
    assert client.simulate_get("/v2/facilities/pips").status_code == 200
    # Metrics are off without a records dir or store: the real service's missing-key answer.
    r = client.simulate_get("/v2/metrics/demand/by_line")
    assert r.status_code == 404 and r.json == []
    # The network routes and the error bodies are the same app's.
    assert client.simulate_get("/v2/stops").status_code == 200
    assert client.simulate_get("/v2/nothing").json["statusCode"] == 404
