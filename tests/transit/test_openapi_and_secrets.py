"""The API under real gunicorn (2 workers) with an operator's sources fetched over HTTP with
credentials in the URLs (query parameters, userinfo) and in headers:

- schemathesis against `/v2/openapi.json`: every documented operation, valid and invalid
  inputs, no server error and no status, content-type or schema violation;
- no credential anywhere: every public body (each documented GET, `/health`, `/status/feed`,
  error answers) and the server log (at debug level) are grepped for each secret.
"""

from __future__ import annotations

import base64
import contextlib
from collections import Counter
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import httpx
import hypothesis
import pytest
import schemathesis
from schemathesis.specs.openapi.checks import (
    positive_data_acceptance,
    response_schema_conformance,
)
from support import free_port
from support.fuzz import fuzz
from support.sidecar import Gunicorn

from sidecars.transit.settings import DEFAULT_FACILITIES, DEFAULT_LOCATIONS

from .helpers import BRISBANE, CAIRNS_ZIP, http_files, local_ts, serving
from .realtime.test_realtime import feed

NOW = local_ts("2014-06-10T08:00", BRISBANE)
SECRETS = {
    "query": "qSECRETgtfs4711",
    "header": "hSECRETvehicles0815",
    "user": "uSECRETalice",
    "password": "pSECRETwonderland",
    "dead": "dSECRETnowhere2323",
}


def _trip_updates() -> bytes:
    """A cancelled trip, a skipped stop and an added trip on the Cairns feed at NOW."""
    at = int(local_ts("2014-06-10T08:30", BRISBANE))
    return feed(
        [
            {"id": "c", "trip_update": {"trip": {"trip_id": "CNS2014-CNS_MUL-Weekday-00-4165883",
                                                 "schedule_relationship": "CANCELED"}}},
            {"id": "n", "trip_update": {
                "trip": {"trip_id": "EXTRA-1", "route_id": "110-423",
                         "schedule_relationship": "NEW"},
                "stop_time_update": [
                    {"stop_id": "750000", "arrival": {"time": at}},
                    {"stop_id": "750001", "arrival": {"time": at + 300}},
                ]}},
        ],
        NOW,
    )  # fmt: skip


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    """The operator's server: the feed needs the query key, the vehicles the header, the
    trip updates HTTP basic credentials; anything else is 401."""
    basic = base64.b64encode(f"{SECRETS['user']}:{SECRETS['password']}".encode()).decode()

    def authorize(path: str, headers: Message) -> bool:
        return {
            "/gtfs.zip": path.endswith(f"?api_key={SECRETS['query']}"),
            "/vp.pb": headers.get("x-api-key") == SECRETS["header"],
            "/tu.pb": headers.get("Authorization") == f"Basic {basic}",
        }[path.partition("?")[0]]

    files = {
        "/gtfs.zip": CAIRNS_ZIP.read_bytes(),
        "/vp.pb": feed([], NOW),
        "/tu.pb": _trip_updates(),
    }
    with http_files(files, authorize) as base:
        yield base.removeprefix("http://")


@pytest.fixture(scope="module")
def sidecar(origin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gunicorn]:
    env = {
        "TRANSIT_NOW": "2014-06-10T08:00:00+10:00",
        "TRANSIT_GTFS_SOURCE": f"http://{origin}/gtfs.zip?api_key={SECRETS['query']}",
        "TRANSIT_VEHICLES_SOURCE": f"http://{origin}/vp.pb",
        "TRANSIT_VEHICLES_SOURCE_HEADERS": f'{{"x-api-key": "{SECRETS["header"]}"}}',
        "TRANSIT_TRIP_UPDATES_SOURCE": f"http://{SECRETS['user']}:{SECRETS['password']}"
        f"@{origin}/tu.pb",
        # Nothing listens there: its error must not repeat the key either.
        "TRANSIT_ALERTS_SOURCE": f"http://127.0.0.1:{free_port()}/alerts.pb?token="
        f"{SECRETS['dead']}",
        "TRANSIT_LOCATIONS_DIR": DEFAULT_LOCATIONS,
        "TRANSIT_FACILITIES_DIR": DEFAULT_FACILITIES,
        "TRANSIT_LOG_LEVEL": "debug",
        "TRANSIT_REALTIME_REFRESH_SECONDS": "1",
    }
    log = tmp_path_factory.mktemp("transit-openapi") / "gunicorn.log"
    with serving(
        env, log, lambda r: r.status_code == 200 and r.json()["trip_updates"]["status"] == "ok"
    ) as gunicorn:
        yield gunicorn


# OpenAPI cannot say that `lat`, `lon` and `radius` of /v2/stops go together: schema-valid
# requests with only some of them are refused (400, tested in test_queries), so that one check
# is left out there.
# The root answers the real service's greeting, a plain text in its JSON content type (as
# documented): it cannot be read as JSON, so its body is not checked against a schema.
PARTIAL_PARAMS_REFUSED = {
    "GET /v2/stops": [positive_data_acceptance],
    "GET /v2/": [response_schema_conformance],
}


def test_schemathesis_finds_no_violations(sidecar: Gunicorn) -> None:
    schema = schemathesis.openapi.from_url(sidecar.base + "/v2/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 50
    seen: Counter[tuple[str, int]] = Counter()
    for operation in operations:
        excluded = PARTIAL_PARAMS_REFUSED.get(operation.label, [])
        fuzz(
            operation,
            schemathesis.GenerationMode.POSITIVE,
            seen,
            excluded=excluded,
            max_examples=10,
        )
        # Unsatisfiable: nothing to make invalid (no parameters, or only free strings).
        with contextlib.suppress(hypothesis.errors.Unsatisfiable):
            fuzz(
                operation,
                schemathesis.GenerationMode.NEGATIVE,
                seen,
                excluded=excluded,
                max_examples=10,
            )
    # Accepted and refused inputs were both exercised where the API takes any.
    assert seen[("GET /v2/stops", 200)] and seen[("GET /v2/stops", 400)], seen
    assert seen[("POST /v2/pips/estimates", 400)], seen


def _public_bodies(base: str) -> dict[str, bytes]:
    """Every documented GET with a plausible id, and a few error answers."""
    doc = httpx.get(base + "/v2/openapi.json").json()
    ids = {"item_id": "750000", "line_id": "110"}
    out: dict[str, bytes] = {}
    with httpx.Client(base_url=base, timeout=30) as client:
        for path, methods in doc["paths"].items():
            if "get" in methods:
                url = path.format(**ids)
                out[url] = client.get(url).content
        for url in ("/health", "/status/feed", "/v2/nowhere", "/v2/stops?x=1",
                    "/v2/vehicles?line_id=110", "/v2/status/message"):  # fmt: skip
            out[url] = client.get(url).content
        out["POST refresh"] = client.post("/status/feed/refresh").content
    return out


def test_no_credential_is_served_or_logged(sidecar: Gunicorn) -> None:
    bodies = _public_bodies(sidecar.base)
    health = httpx.get(sidecar.base + "/health").json()
    # The sources are named, without their credentials.
    assert health["sources"]["gtfs"].endswith("/gtfs.zip?api_key=***")
    assert health["sources"]["trip_updates"].startswith("http://***@127.0.0.1:")
    assert health["alerts"]["status"] == "error" and "token=***" in health["alerts"]["last_error"]
    assert health["vehicles"]["status"] == "ok"  # the header was sent
    feed_status = httpx.get(sidecar.base + "/status/feed").json()
    assert feed_status["serving"]["source"].endswith("api_key=***")
    log = Path(sidecar.log_path).read_bytes()
    assert b"static feed http://127.0.0.1:" in log  # the log does name the source
    for name, secret in SECRETS.items():
        for url, body in bodies.items():
            assert secret.encode() not in body, (name, url)
        assert secret.encode() not in log, name
