"""Derivations for plain and Carris-Metropolitana-extended GTFS: lines, routes, patterns,
trip groups, valid_on, stop aggregates."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from sidecars.transit.gtfs import read_feed
from sidecars.transit.network import Network, natural_key
from sidecars.transit.places.locations import Locations
from sidecars.transit.source import FeedFiles

from ..helpers import CAIRNS_ZIP, SMALL_FEED, write_feed

DATA = Path(__file__).resolve().parent / "data"


def network(path: Path | str, locations: Locations | None = None, unit: str = "auto") -> Network:
    files = FeedFiles.load(str(path), 5)
    return Network(read_feed(files, dist_unit=unit), files.digest, 0.0, None, locations)


@pytest.fixture(scope="module")
def cairns_net() -> Network:
    return network(CAIRNS_ZIP)


def body(b) -> object:  # type: ignore[no-untyped-def]
    assert b is not None
    return json.loads(b.data)


def test_natural_key_orders_numbers_by_value() -> None:
    assert sorted(["10", "9", "1001_0_2", "1001_0_10", "A"], key=natural_key) == [
        "9",
        "10",
        "1001_0_2",
        "1001_0_10",
        "A",
    ]


def test_cairns_lines_are_route_short_names(cairns_net: Network) -> None:
    lines = body(cairns_net.lines_body)
    ids = [line["id"] for line in lines]
    assert ids == sorted(ids, key=natural_key)
    line = next(x for x in lines if x["id"] == "110")
    # Route 110-423 runs two shapes each way: one pattern per direction (CM's API gives a
    # route at most two), each with a version per shape.
    assert line["route_ids"] == ["110-423"]
    assert line["color"] == "#7BC142" and line["text_color"] == "#000000"
    assert line["short_name"] == "110" and line["long_name"] == "City - Palm Cove"
    assert line["stop_ids"] == []
    assert sorted(line["pattern_ids"]) == ["110-423_0", "110-423_1"]
    for pattern_id in line["pattern_ids"]:
        versions = body(cairns_net.pattern_body(pattern_id))
        assert len({v["shape_id"] for v in versions}) == len(versions) == 2


def test_cairns_patterns_one_per_route_and_direction(cairns_net: Network) -> None:
    # 54 distinct (route, direction, shape, stop sequence) variants in the feed, on
    # 22 routes: at most two patterns each, every variant a version of its direction's.
    variants = {
        (v.pattern_id, v.variant, v.shape_id) for vs in cairns_net.patterns.values() for v in vs
    }
    assert len(variants) == 54
    routes = body(cairns_net.routes_body)
    assert len(routes) == 22 and all(1 <= len(r["pattern_ids"]) <= 2 for r in routes)
    assert max(len(cairns_net.patterns[p]) for r in routes for p in r["pattern_ids"]) >= 4
    for pattern_id, versions in cairns_net.patterns.items():
        route_id, direction = pattern_id.rsplit("_", 1)
        assert direction in ("0", "1") and route_id in {r["id"] for r in routes}
        assert all(v.pattern_id == pattern_id and str(v.direction) == direction for v in versions)
        # Each version's path is its own trips' stops; version ids are distinct.
        ids = [v.version_id for v in versions]
        assert len(set(ids)) == len(ids)


def test_pattern_ids_are_stable_across_loads() -> None:
    assert sorted(network(CAIRNS_ZIP).patterns) == sorted(network(CAIRNS_ZIP).patterns)


def test_cairns_valid_on_applies_calendar_dates_removals_and_additions(cairns_net: Network) -> None:
    raw = cairns_net.raw
    weekday = raw.service_dates[raw.service_ids.index("CNS2014-CNS_MUL-Weekday-00")]
    sunday = raw.service_dates[raw.service_ids.index("CNS2014-CNS_MUL-Sunday-00")]
    assert "20140609" not in weekday  # Monday holiday removed
    assert "20140610" in weekday
    assert "20140609" in sunday and "20140608" in sunday  # added Monday, regular Sunday
    assert "20141225" in sunday and "20141225" not in weekday
    assert min(weekday) == "20140526" and max(weekday) == "20141224"


def test_cairns_pattern_body_shape_and_past_midnight_times(cairns_net: Network) -> None:
    late = None
    for pattern_id in cairns_net.patterns:
        versions = body(cairns_net.pattern_body(pattern_id))
        assert isinstance(versions, list) and versions
        for v in versions:
            assert list(v) == sorted(v)  # keys in the real service's (alphabetical) order
            assert v["valid_on"] == sorted(v["valid_on"])
            assert len(v["version_id"]) == 64
            for group in v["trips"]:
                for item in group["schedule"]:
                    if item["arrival_time"] >= "24":
                        late = item
    assert late is not None
    hour = int(late["arrival_time"][:2])
    assert late["arrival_time_24h"] == f"{hour - 24:02d}" + late["arrival_time"][2:]


def test_cairns_pickup_drop_off_flags(cairns_net: Network) -> None:
    flags = set()
    for pattern_id in cairns_net.patterns:
        for v in body(cairns_net.pattern_body(pattern_id)):
            flags.update((p["allow_pickup"], p["allow_drop_off"]) for p in v["path"])
    assert {(True, True), (False, True), (False, False)} <= flags


def test_small_feed_trip_groups_merge_identical_schedules(small_feed: Path) -> None:
    net = network(small_feed)
    pattern_id = net.trip_pattern[net.trip_index["T1"]]
    assert net.trip_pattern[net.trip_index["TLATE"]] == pattern_id
    [version] = body(net.pattern_body(pattern_id))
    groups = version["trips"]
    assert len(groups) == 3  # T1+T1X share times, T2, TLATE
    merged = groups[0]
    # Newest first, as the real service builds them.
    assert merged["trip_ids"] == ["T1X", "T1"]
    assert merged["service_ids"] == ["EXTRA", "WK"]
    assert "20260326" in merged["valid_on"]
    assert [s["arrival_time"] for s in groups[1]["schedule"]] == [
        "09:00:00",
        "09:10:00",
        "09:20:00",
    ]
    assert groups[1]["schedule"][0]["arrival_time_24h"] == "09:00:00"
    assert [s["arrival_time"] for s in groups[2]["schedule"]] == [
        "23:50:00",
        "24:05:00",
        "26:30:00",
    ]
    assert [s["arrival_time_24h"] for s in groups[2]["schedule"]] == [
        "23:50:00",
        "00:05:00",
        "02:30:00",
    ]
    # calendar 2026-03-01..04-30 weekdays, minus 03-25, plus 03-28 and 03-29
    valid = version["valid_on"]
    assert "20260325" not in valid and "20260328" in valid and "20260329" in valid
    assert "20260321" not in valid and "20260302" in valid
    assert version["path"] == [
        {"allow_drop_off": False, "allow_pickup": True, "distance": 0.0, "distance_delta": 0.0,
         "stop_id": "100001", "stop_sequence": 1},
        {"allow_drop_off": True, "allow_pickup": True, "distance": 1500.0,
         "distance_delta": 1500.0, "stop_id": "100002", "stop_sequence": 2},
        {"allow_drop_off": True, "allow_pickup": False, "distance": 3000.0,
         "distance_delta": 1500.0, "stop_id": "100003", "stop_sequence": 3},
    ]  # fmt: skip
    # shape_dist_traveled 1.5 per 1.4 km step: told to be kilometres, served in metres.
    assert net.raw.dist_factor == 1000.0
    assert version["color"] == "#FF0000"
    assert version["text_color"] == "#000000"  # patterns default to black text
    assert version["direction_id"] == 0 and version["shape_id"] == "S1"


def test_small_feed_routes_lines_and_colour_defaults(small_feed: Path) -> None:
    net = network(small_feed)
    [route] = body(net.routes_body)
    [line] = body(net.lines_body)
    assert route["text_color"] == "#FFFFFF" and line["text_color"] == "#FFFFFF"
    assert route["line_id"] == "1" and line["id"] == "1"
    assert route["route_ids"] == ["R1"]
    assert len(route["pattern_ids"]) == 2 and route["pattern_ids"] == line["pattern_ids"]
    back = net.trip_pattern[net.trip_index["TBACK"]]
    assert route["pattern_ids"][0] == back  # discovered last, listed first


def test_stop_served_by_no_trip_has_empty_lists(small_feed: Path) -> None:
    stops = {s["id"]: s for s in body(network(small_feed).stops_body)}
    assert stops["100009"]["line_ids"] == []
    assert stops["100009"]["pattern_ids"] == [] and stops["100009"]["route_ids"] == []
    assert stops["100001"]["line_ids"] == ["1"] and len(stops["100001"]["pattern_ids"]) == 2
    assert stops["100001"]["wheelchair_boarding"] is True
    assert stops["100002"]["wheelchair_boarding"] is False
    assert stops["100001"]["operational_status"] == "active"


def test_operational_status_column_is_lower_cased_or_omitted(tmp_path: Path) -> None:
    stops = (
        "stop_id,stop_name,stop_lat,stop_lon,operational_status\n"
        "100001,First,38.7,-9.1,ACTIVE\n100002,Second,38.7,-9.1,VOIDED\n"
        "100003,Third,38.7,-9.1,SEASONAL\n100009,Lonely,38.7,-9.1,\n"
    )
    net = network(write_feed(tmp_path / "f.zip", {"stops.txt": stops}))
    statuses = {s["id"]: s.get("operational_status") for s in body(net.stops_body)}
    assert statuses == {"100001": "active", "100002": "voided", "100003": "seasonal",
                        "100009": "active"}  # fmt: skip


CM_ROUTES = (
    "route_id,agency_id,route_short_name,route_long_name,route_type,route_color,route_text_color,"
    "line_id,line_short_name,line_long_name\n"
    "1001_0,CM,1001,Alcochete (Freeport) - Almada,3,C61D23,FFFFFF,1001,1001,Alcochete - Almada\n"
    "1001_1,CM,1001,Alcochete - Almada (via Pragal),3,C61D23,FFFFFF,1001,1001,Alcochete - Almada\n"
)
CM_TRIPS = (
    "route_id,service_id,trip_id,trip_headsign,direction_id,shape_id,pattern_id,calendar_desc\n"
    "1001_0,7_21NBI,1001_0_1_0600_0629_0_7,Almada,0,,1001_0_1,Dias úteis\n"
    "1001_0,4_21NBI,1001_0_1_0600_0629_0_4,Almada,0,,1001_0_1,Sábados\n"
    "1001_0,7_21NBI,1001_0_2_0700_0729_0_7,Alcochete,1,,1001_0_2,Dias úteis\n"
    "1001_1,7_21NBI,1001_1_1_0800_0829_0_7,Almada (Pragal),0,,1001_1_1,Dias úteis\n"
)
CM_STOP_TIMES = (
    "trip_id,arrival_time,departure_time,stop_id,stop_sequence,shape_dist_traveled\n"
    "1001_0_1_0600_0629_0_7,06:00:00,06:00:00,010001,1,0\n"
    "1001_0_1_0600_0629_0_7,06:20:00,06:20:00,020001,2,12.5\n"
    "1001_0_1_0600_0629_0_4,06:00:00,06:00:00,010001,1,0\n"
    "1001_0_1_0600_0629_0_4,06:20:00,06:20:00,020001,2,12.5\n"
    "1001_0_2_0700_0729_0_7,07:00:00,07:00:00,020001,1,0\n"
    "1001_0_2_0700_0729_0_7,07:20:00,07:20:00,010002,2,12.4\n"
    "1001_1_1_0800_0829_0_7,08:00:00,08:00:00,010001,1,0\n"
    "1001_1_1_0800_0829_0_7,08:30:00,08:30:00,060001,2,20\n"
)
CM_CALENDAR_DATES = (
    "service_id,date,exception_type,period,day_type,holiday\n"
    "7_21NBI,20260323,1,1,1,0\n7_21NBI,20260324,1,1,1,0\n4_21NBI,20260328,1,1,2,0\n"
)


@pytest.fixture
def cm_net(tmp_path: Path) -> Network:
    files = {
        "agency.txt": "agency_id,agency_name,agency_url,agency_timezone,agency_lang\n"
        "CM,Carris Metropolitana,https://www.carrismetropolitana.pt,Europe/Lisbon,pt\n",
        "stops.txt": (DATA / "cm_stops_sample.txt").read_text(encoding="utf-8"),
        "routes.txt": CM_ROUTES,
        "trips.txt": CM_TRIPS,
        "stop_times.txt": CM_STOP_TIMES,
        "calendar_dates.txt": CM_CALENDAR_DATES,
    }
    # Carris Metropolitana's shape_dist_traveled is in kilometres (this sample's stop
    # positions do not tell it).
    return network(write_feed(tmp_path / "cm.zip", files, base={}), unit="km")


def test_cm_extended_columns_drive_lines_and_patterns(cm_net: Network) -> None:
    [line] = body(cm_net.lines_body)
    assert line["id"] == "1001" and line["long_name"] == "Alcochete - Almada"
    assert line["route_ids"] == ["1001_1", "1001_0"]
    assert line["pattern_ids"] == ["1001_1_1", "1001_0_2", "1001_0_1"]
    assert line["municipality_ids"] == ["1106", "1502", "1503"]
    assert line["district_ids"] == ["11", "15"] and line["region_ids"] == ["PT170"]
    routes = {r["id"]: r for r in body(cm_net.routes_body)}
    assert routes["1001_0"]["pattern_ids"] == ["1001_0_2", "1001_0_1"]
    assert routes["1001_0"]["long_name"] == "Alcochete (Freeport) - Almada"
    assert sorted(cm_net.patterns) == ["1001_0_1", "1001_0_2", "1001_1_1"]
    [version] = body(cm_net.pattern_body("1001_0_1"))
    assert version["short_name"] == "1001" and version["long_name"] == "Alcochete - Almada"
    [group] = version["trips"]  # weekday and saturday trips share their times
    assert group["service_ids"] == ["4_21NBI", "7_21NBI"]
    assert group["valid_on"] == ["20260323", "20260324", "20260328"]
    # Metres.
    assert version["path"][1]["distance"] == 12500.0
    assert version["path"][1]["distance_delta"] == 12500.0


def test_cm_stop_columns(cm_net: Network) -> None:
    stops = {s["id"]: s for s in body(cm_net.stops_body)}
    oriente = stops["060001"]
    assert oriente["facilities"] == ["school", "subway", "train"]
    assert oriente["municipality_id"] == "1106" and oriente["district_id"] == "11"
    # Without location lists the locality named by the stop gets the id of the lists derived
    # from the stops (`/v2/locations/localities`), as the shipped lists name it.
    assert oriente["region_id"] == "PT170"
    assert oriente["locality_id"] == "1106-parque-das-nacoes"
    assert oriente["tts_name"].startswith("Gare Do Oriente")
    assert oriente["line_ids"] == ["1001"] and oriente["pattern_ids"] == ["1001_1_1"]
    assert stops["010001"]["route_ids"] == ["1001_0", "1001_1"]
    assert list(stops) == sorted(stops, key=natural_key)


def test_active_services_by_day(small_feed: Path) -> None:
    net = network(small_feed)
    wk = net.raw.service_ids.index("WK")
    assert net.active_services(date(2026, 3, 24))[wk] == 1
    assert net.active_services(date(2026, 3, 25))[wk] == 0
    assert net.active_services(date(2026, 3, 28))[wk] == 1
    assert net.active_services(date(2026, 3, 21))[wk] == 0


def test_shape_body(small_feed: Path) -> None:
    shape = body(network(small_feed).shape_body("S1"))
    assert shape["shape_id"] == "S1"
    assert shape["geojson"] == {
        "geometry": {"coordinates": [[-9.1, 38.7], [-9.11, 38.71], [-9.12, 38.72]],
                     "type": "LineString"},
        "properties": {},
        "type": "Feature",
    }  # fmt: skip
    # about 1.41 km per 0.01 degree step at this latitude
    assert 2800 < shape["extension"] < 2850 and isinstance(shape["extension"], int)
    points = shape["points"]
    assert [p["shape_pt_sequence"] for p in points] == [1, 2, 3]
    assert points[0]["shape_dist_traveled"] == 0.0
    assert int(points[-1]["shape_dist_traveled"]) == shape["extension"]


def test_cm_pattern_with_two_headsigns_has_two_versions(tmp_path: Path) -> None:
    trips = CM_TRIPS + "1001_0,7_21NBI,1001_0_1_0900_0929_0_7,Almada (Centro),0,,1001_0_1,Dias\n"
    stop_times = CM_STOP_TIMES + (
        "1001_0_1_0900_0929_0_7,09:00:00,09:00:00,010001,1,0\n"
        "1001_0_1_0900_0929_0_7,09:20:00,09:20:00,020001,2,12.5\n"
    )
    files = {
        "agency.txt": "agency_id,agency_name,agency_url,agency_timezone\nCM,CM,http://x,Europe/Lisbon\n",
        "stops.txt": (DATA / "cm_stops_sample.txt").read_text(encoding="utf-8"),
        "routes.txt": CM_ROUTES,
        "trips.txt": trips,
        "stop_times.txt": stop_times,
        "calendar_dates.txt": CM_CALENDAR_DATES,
    }
    net = network(write_feed(tmp_path / "cm.zip", files, base={}))
    versions = body(net.pattern_body("1001_0_1"))
    assert [v["headsign"] for v in versions] == ["Almada", "Almada (Centro)"]
    assert versions[0]["version_id"] != versions[1]["version_id"]
    assert all(v["id"] == "1001_0_1" for v in versions)
    assert versions[1]["trips"][0]["trip_ids"] == ["1001_0_1_0900_0929_0_7"]
    assert versions[1]["valid_on"] == ["20260323", "20260324"]


def test_a_variant_with_other_stops_is_a_version_of_its_directions_pattern(
    tmp_path: Path,
) -> None:
    # T3 runs direction 0 without stop 100002: still R1's one direction-0 pattern, as its
    # own version with its own path.
    files = {
        "trips.txt": SMALL_FEED["trips.txt"] + "R1,WK,T3,Third,0,S1,B4\n",
        "stop_times.txt": SMALL_FEED["stop_times.txt"]
        + "T3,11:00:00,11:00:00,100001,1,0,0,0\n"
        + "T3,11:20:00,11:20:00,100003,2,0,0,3.0\n",
    }
    net = network(write_feed(tmp_path / "f.zip", files))
    [route] = body(net.routes_body)
    assert sorted(route["pattern_ids"]) == ["R1_0", "R1_1"]
    versions = body(net.pattern_body("R1_0"))
    paths = [[p["stop_id"] for p in v["path"]] for v in versions]
    assert paths == [["100001", "100002", "100003"], ["100001", "100003"]]
    assert versions[0]["version_id"] != versions[1]["version_id"]
    assert versions[1]["trips"][0]["trip_ids"] == ["T3"]
