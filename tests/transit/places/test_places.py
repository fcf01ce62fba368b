"""Locations and facilities: the shipped CAOP lists, stops within walking distance on the real
Cairns feed, and location fields filled by id, by name and by nearest reference point."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path

import falcon.testing
import pytest

from sidecars.transit.app import Services
from sidecars.transit.geometry import haversine_m
from sidecars.transit.places.facilities import LISTED, load
from sidecars.transit.places.geo import GridIndex
from sidecars.transit.places.locations import Locations, LocationsError
from sidecars.transit.settings import DEFAULT_FACILITIES, DEFAULT_LOCATIONS, PlacesSettings
from sidecars.transit.store import TransitStore

App = Callable[..., tuple[Services, falcon.testing.TestClient]]
PlacesClient = Callable[[PlacesSettings], falcon.testing.TestClient]
HEADER = (
    "id,name,lat,lon,locality,district_id,district_name,municipality_id,municipality_name,"
    "parish_id,parish_name,region_id,region_name\n"
)


# The bundled lists and demo facilities (TRANSIT_DEMO=true); an operator's deployment has none
# unless configured.
DEMO_PLACES = PlacesSettings(locations_dir=DEFAULT_LOCATIONS, facilities_dir=DEFAULT_FACILITIES)


@pytest.fixture
def places_client(cairns_store: TransitStore, app_for: App) -> PlacesClient:
    """A TestClient over the Cairns store with the given places settings, metrics off."""

    def make(places: PlacesSettings) -> falcon.testing.TestClient:
        return app_for(cairns_store, records_dir=None, db=None, places=places)[1]

    return make


@pytest.fixture
def cairns_client(places_client: PlacesClient) -> falcon.testing.TestClient:
    return places_client(DEMO_PLACES)


def test_location_counts_shape_and_order(cairns_client: falcon.testing.TestClient) -> None:
    counts = {}
    for kind, keys in (
        ("districts", ["id", "name"]),
        ("municipalities", ["district_id", "id", "name"]),
        ("parishes", ["district_id", "id", "municipality_id", "name"]),
        ("localities", ["display", "district_id", "id", "municipality_id", "name", "parish_id"]),
    ):
        r = cairns_client.simulate_get(f"/v2/locations/{kind}")
        assert r.status_code == 200 and r.headers["cache-control"] == "public, max-age=3600"
        body = r.json
        assert list(body) == ["data", "status", "timestamp"] and body["status"] == "success"
        assert isinstance(body["timestamp"], int)
        assert all(list(item) == keys for item in body["data"])
        counts[kind] = len(body["data"])
    assert counts == {"districts": 20, "municipalities": 308, "parishes": 3092, "localities": 435}
    districts = cairns_client.simulate_get("/v2/locations/districts").json["data"]
    assert districts[0] == {"id": "01", "name": "Aveiro"}
    assert districts[-2:] == [
        {"id": "20", "name": "Região Autónoma dos Açores"},
        {"id": "30", "name": "Região Autónoma da Madeira"},
    ]
    munis = {
        m["id"]: m for m in cairns_client.simulate_get("/v2/locations/municipalities").json["data"]
    }
    assert munis["1106"] == {"district_id": "11", "id": "1106", "name": "Lisboa"}
    gz = cairns_client.simulate_get("/v2/locations/parishes", headers={"Accept-Encoding": "gzip"})
    assert gz.headers["content-encoding"] == "gzip"


def test_missing_location_files_give_empty_lists(
    tmp_path: Path, places_client: PlacesClient
) -> None:
    client = places_client(PlacesSettings(locations_dir=str(tmp_path)))
    r = client.simulate_get("/v2/locations/parishes")
    assert r.status_code == 200 and r.json["data"] == [] and r.json["status"] == "success"


def test_bad_location_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "districts.csv").write_text("id,name\n11,Lisboa\n", encoding="utf-8")
    (tmp_path / "municipalities.csv").write_text(
        "id,name,district_id\n0101,X,01\n", encoding="utf-8"
    )
    with pytest.raises(LocationsError, match="unknown district 01"):
        Locations(tmp_path)
    (tmp_path / "municipalities.csv").write_text("id,name\n0101,X\n", encoding="utf-8")
    with pytest.raises(LocationsError, match="header lacks column"):
        Locations(tmp_path)


def test_facilities_index_and_shapes(cairns_client: falcon.testing.TestClient) -> None:
    r = cairns_client.simulate_get("/v2/facilities")
    # Every kind but the PIPs, in the real service's order (the declaration in facilities.py).
    assert r.json == {"available_facilities": list(LISTED)}
    assert "cache-control" not in r.headers
    common = [
        "district_id",
        "district_name",
        "id",
        "lat",
        "locality",
        "lon",
        "municipality_id",
        "municipality_name",
        "name",
        "parish_id",
        "parish_name",
        "region_id",
        "region_name",
        "stop_ids",
    ]
    stores = cairns_client.simulate_get("/v2/facilities/stores")
    assert stores.headers["cache-control"] == "public, max-age=30"
    store = stores.json[0]
    assert sorted(store) == sorted(
        [*common, "brand_name", "contacts", "hours", "realtime", "short_name"]
    )
    assert list(store) == sorted(store)
    assert store["realtime"] is None
    assert list(store["contacts"]) == [
        "address",
        "email",
        "google_place_id",
        "phone",
        "postal_code",
        "url",
    ]
    assert store["hours"]["monday"] == ["08:00-19:00"] and store["hours"]["sunday"] == []
    second = stores.json[1]
    assert second["hours"]["monday"] == ["08:00-12:30", "13:30-18:00"]
    school = cairns_client.simulate_get("/v2/facilities/schools").json[0]
    assert sorted(school) == sorted([*common, "contacts", "grouping", "nature"])
    for kind in (
        "boat_stations",
        "train_stations",
        "light_rail_stations",
        "subway_stations",
        "helpdesks",
    ):
        r = cairns_client.simulate_get(f"/v2/facilities/{kind}")
        assert r.status_code == 200 and r.headers["cache-control"] == "public, max-age=3600"
        assert all(list(item) == common for item in r.json)
    assert cairns_client.simulate_get("/v2/facilities/helpdesks").json == []
    pip = cairns_client.simulate_get("/v2/facilities/pips").json[0]
    assert list(pip) == [c for c in common if not c.startswith("parish")]


def test_stop_ids_are_the_cairns_stops_within_walking_distance(
    cairns_store: TransitStore, cairns_client: falcon.testing.TestClient
) -> None:
    raw = cairns_store.network.raw  # type: ignore[union-attr]
    checked = 0
    for kind in ("stores", "schools", "train_stations", "boat_stations", "pips"):
        for item in cairns_client.simulate_get(f"/v2/facilities/{kind}").json:
            # Brute force over every stop of the feed, nearest first.
            dist = sorted(
                (haversine_m(item["lat"], item["lon"], s.lat, s.lon), sid)
                for sid, s in zip(raw.stop_ids, raw.stops, strict=True)
            )
            assert item["stop_ids"] == [sid for d, sid in dist if d <= 400.0], item["id"]
            checked += 1
    assert checked == 10
    by_id = {
        f["id"]: f
        for kind in ("pips", "boat_stations")
        for f in cairns_client.simulate_get(f"/v2/facilities/{kind}").json
    }
    # The panel stands at stop 750053; the ferry terminal is out at sea, far from any stop.
    assert by_id["DEMO-PIP-01"]["stop_ids"][0] == "750053"
    assert by_id["DEMO-BT-01"]["stop_ids"] == []
    # Cairns is not in Portugal: no location is guessed.
    assert by_id["DEMO-PIP-01"]["municipality_id"] == ""


def test_walking_distance_is_configurable(places_client: PlacesClient) -> None:
    near = places_client(dataclasses.replace(DEMO_PLACES, walk_meters=50.0))
    far = places_client(dataclasses.replace(DEMO_PLACES, walk_meters=1000.0))
    a = near.simulate_get("/v2/facilities/pips").json[0]["stop_ids"]
    b = far.simulate_get("/v2/facilities/pips").json[0]["stop_ids"]
    assert a == ["750053"] and len(b) > 4 and b[0] == "750053"


def test_missing_facility_file_is_404_empty_list(
    tmp_path: Path, places_client: PlacesClient
) -> None:
    client = places_client(PlacesSettings(facilities_dir=str(tmp_path)))
    r = client.simulate_get("/v2/facilities/stores")
    assert r.status_code == 404 and r.json == []
    assert client.simulate_get("/v2/facilities").status_code == 200


def test_location_fields_are_filled_by_id_name_and_position(tmp_path: Path) -> None:
    (tmp_path / "train_stations.csv").write_text(
        HEADER
        # Only a position, at CM stop 010001 in Alcochete: municipality, district, region and
        # locality from the nearest reference point; no parish (no polygons).
        + "T1,By position,38.754244,-8.959557,,,,,,,,,\n"
        # Only names: "Lagoa" exists twice (Faro, Açores); the district name decides.
        + 'T2,By name,37.1,-8.45,,,Faro,,lagoa,,"Lagoa e Carvoeiro",,\n'
        + "T3,Ambiguous name,0,0,,,,,Lagoa,,,,\n"
        # A parish id alone: municipality and district follow from it.
        + "T4,By parish id,0,0,,,,,,110601,,,\n"
        # Ids and names given: kept as given where the tables agree.
        + "T5,Far away,-16.9,145.7,Cairns,,,,,,,,\n"
        + "T6,Bad,north,-8.9,,,,,,,,,\n"
        + "T1,Duplicate,38.7,-8.9,,,,,,,,,\n",
        encoding="utf-8",
    )
    locations = Locations(Path(DEFAULT_LOCATIONS))
    got = load(tmp_path, locations, 1500.0)
    assert [str(p) for p in got.problems] == [
        f"{tmp_path / 'train_stations.csv'}:7: could not convert string to float: 'north'",
        f"{tmp_path / 'train_stations.csv'}:8: duplicate id T1",
    ]
    places = {r.values["id"]: r.place for r in got.rows["train_stations"]}
    columns = ("municipality_id", "municipality_name", "district_id", "district_name")
    assert {k: tuple(getattr(places[k], c) for c in columns) for k in ("T1", "T2", "T4")} == {
        "T1": ("1502", "Alcochete", "15", "Setúbal"),
        "T2": ("0806", "Lagoa", "08", "Faro"),
        "T4": ("1106", "Lisboa", "11", "Lisboa"),
    }
    t1 = places["T1"]
    assert (t1.region_id, t1.region_name, t1.locality, t1.parish_id) == (
        "PT170",
        "AML",
        "Alcochete",
        "",
    )
    assert places["T2"].parish_id == "080608"
    assert places["T2"].parish_name == "União das freguesias de Lagoa e Carvoeiro"
    assert places["T3"].municipality_id == "" and places["T3"].municipality_name == "Lagoa"
    assert places["T4"].parish_id == "110601"
    assert places["T5"].municipality_id == "" and places["T5"].locality == "Cairns"


def test_grid_index_matches_brute_force() -> None:
    rng = random.Random(7)
    points = [
        (38.7 + rng.uniform(-0.05, 0.05), -9.1 + rng.uniform(-0.05, 0.05)) for _ in range(2000)
    ]
    grid = GridIndex(points, cell_meters=250.0)
    for _ in range(50):
        lat, lon = 38.7 + rng.uniform(-0.06, 0.06), -9.1 + rng.uniform(-0.06, 0.06)
        radius = rng.choice([50.0, 300.0, 900.0])
        expected = sorted((haversine_m(lat, lon, a, b), i) for i, (a, b) in enumerate(points))
        assert grid.within(lat, lon, radius) == [(d, i) for d, i in expected if d <= radius]
    assert GridIndex([]).within(0, 0, 100) == []
