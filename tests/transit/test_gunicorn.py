"""The README run command: the app under real gunicorn with 2 uvicorn workers, over HTTP."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import httpx
import pytest

from .helpers import serving


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m sidecars.transit` on port 0, 2 workers (gunicorn reports the port it bound)."""
    env = {"TRANSIT_NOW": "2014-06-10T08:00:00+10:00", "TRANSIT_DEMO": "true"}
    log = tmp_path_factory.mktemp("transit") / "gunicorn.log"
    with serving(
        env, log, lambda r: r.status_code == 200 and r.json()["vehicles"]["status"] == "ok"
    ) as gunicorn:
        yield gunicorn.base


def test_serves_real_data_over_http(server: str) -> None:
    with httpx.Client(base_url=server, timeout=10) as client:
        stops = client.get("/v2/stops")
        assert stops.status_code == 200
        assert stops.headers["content-type"] == "application/json; charset=utf-8"
        assert stops.headers["content-encoding"] == "gzip"  # httpx asks for it
        assert len(stops.json()) == 416
        assert len(client.get("/v2/lines").json()) == 22
        arrivals = client.get("/v2/arrivals/by_stop/750000/")
        assert arrivals.status_code == 200 and arrivals.json()
        assert (
            len(client.get("/v2/vehicles").json()) == 37
        )  # the demo's trips under way at its clock
        assert client.get("/v2/gtfs").content[:2] == b"PK"
        pip = client.post("/v2/pips/estimates", json={"stops": ["000001"]})
        assert pip.json()[0]["lineId"] == "INFO"
        assert client.get("/v2/nowhere").status_code == 404


def test_etag_and_raw_gzip_over_http(server: str) -> None:
    with httpx.Client(base_url=server, timeout=10) as client:
        first = client.get("/v2/routes", headers={"Accept-Encoding": "gzip"})
        again = client.get("/v2/routes", headers={"If-None-Match": first.headers["etag"]})
        assert again.status_code == 304
        raw = client.build_request("GET", "/v2/routes", headers={"Accept-Encoding": "gzip"})
        response = client.send(raw, stream=True)
        body = b"".join(response.iter_raw())
        response.close()
        assert gzip.decompress(body) == first.content
