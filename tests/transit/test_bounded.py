"""Bounded requests: a body limit (413), a cap on the stop ids of one PIP
request (400 naming it), and ids checked as the feed defines them, matched as whole ASCII
strings; Carris Metropolitana's 6-digit rule is its profile's, not the default."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import falcon.testing
import pytest
from support import Clock

from sidecars.transit.settings import PROFILES, FeedSettings, LimitSettings
from sidecars.transit.store import TransitStore

from .helpers import BRISBANE, CAIRNS_ZIP, local_ts

NOW = local_ts("2014-06-10T08:00", BRISBANE)
GOOGLE_SAMPLE = Path(__file__).resolve().parent / "network" / "data" / "google_sample"


def post(client: falcon.testing.TestClient, body: bytes) -> falcon.testing.Result:
    return client.simulate_post(
        "/v2/pips/estimates", body=body, headers={"Content-Type": "application/json"}
    )


def test_a_large_body_is_413(cairns: falcon.testing.TestClient) -> None:
    # The 1 MB request of 100,000 stop ids that used to stall a worker for ~25 s.
    body = json.dumps({"stops": [f"7{i:05d}" for i in range(100_000)]}).encode()
    result = post(cairns, body)
    assert result.status_code == 413
    assert result.json["status"] == "error" and "16384 bytes" in result.json["message"]
    assert "TRANSIT_MAX_BODY_BYTES" in result.json["message"]


def test_stop_ids_per_request_are_capped(
    cairns_store: TransitStore, client_for: Callable[[TransitStore], falcon.testing.TestClient]
) -> None:
    settings = dataclasses.replace(cairns_store.settings, limits=LimitSettings(pip_max_stops=3))
    store = TransitStore(settings, clock=Clock(NOW))
    store.network = cairns_store.network
    client = client_for(store)
    four = {"stops": ["750000", "750001", "750002", "750003"]}
    result = post(client, json.dumps(four).encode())
    assert result.status_code == 400
    assert (
        "4 distinct ids; at most 3 are accepted (TRANSIT_PIP_MAX_STOPS)" in result.json["message"]
    )
    # Repeats are asked once, so they do not count against the cap.
    repeated = {"stops": ["750000", "750001", "750002", "750000", "750001"]}
    assert post(client, json.dumps(repeated).encode()).status_code == 200
    assert LimitSettings().pip_max_stops == 50


def test_default_profile_accepts_the_feeds_own_ids(
    make_store: Callable[..., TransitStore],
    client_for: Callable[[TransitStore], falcon.testing.TestClient],
) -> None:
    store = make_store(GOOGLE_SAMPLE, clock=Clock(local_ts("2008-01-02T06:00", BRISBANE)))
    assert store.load_static()
    client = client_for(store)
    stops = {s["id"] for s in client.simulate_get("/v2/stops").json}
    assert "STAGECOACH" in stops
    # Listed by /v2/stops, so asked for by id: not 400 because it is not 6 digits.
    result = client.simulate_get("/v2/arrivals/by_stop/STAGECOACH")
    assert result.status_code == 200
    assert post(client, b'{"stops": ["STAGECOACH"]}').status_code == 200
    # An id the feed does not have is unknown, whatever its shape.
    for stop_id in ("NOPE", "750000%0A"):
        result = client.simulate_get(f"/v2/arrivals/by_stop/{stop_id}")
        assert (result.status_code, result.text) == (404, "[]")


FULL_WIDTH = "\uff17\uff15\uff10\uff10\uff10\uff10"  # "750000" in full-width digits


@pytest.mark.parametrize("stop_id", ["750000\n", FULL_WIDTH, "75000", "7500001"])
def test_cm_profile_holds_six_ascii_digits_whole(
    stop_id: str,
    make_store: Callable[..., TransitStore],
    client_for: Callable[[TransitStore], falcon.testing.TestClient],
) -> None:
    cm = FeedSettings(stop_id_pattern=PROFILES["cm"]["stop_id_pattern"])
    store = make_store(CAIRNS_ZIP, clock=Clock(NOW), feed=cm)
    assert store.load_static()
    client = client_for(store)
    # "750000\n" and full-width digits passed the old `re.match(r"^\d{6}$", id)`.
    result = client.simulate_get(f"/v2/arrivals/by_stop/{quote(stop_id)}")
    assert (result.status_code, result.text) == (400, "[]")
    result = post(client, json.dumps({"stops": [stop_id]}).encode())
    assert (result.status_code, result.text) == (400, "[]")
    assert client.simulate_get("/v2/arrivals/by_stop/750000").status_code == 200
