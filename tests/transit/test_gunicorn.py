"""The README run command: the app under real gunicorn with 2 uvicorn workers, over HTTP."""

from __future__ import annotations

import gzip
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
# A new connection per probe: a kept-alive one would always reach the same worker.
FRESH = {"Connection": "close"}
LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """`python -m sidecars.transit` on port 0 (gunicorn reports the port it bound)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TRANSIT_HOST": "127.0.0.1",
        "TRANSIT_PORT": "0",
        "TRANSIT_WORKERS": "2",
        "TRANSIT_NOW": "2014-06-10T08:00:00+10:00",
        "PYTHONWARNINGS": "ignore::DeprecationWarning",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecars.transit"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    port: list[str] = []
    found = threading.Event()

    def drain() -> None:
        # Keep reading so the server never blocks on a full pipe.
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            match = LISTENING.search(line)
            if match and not port:
                port.append(match.group(1))
                found.set()
        found.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert found.wait(60) and port, "gunicorn did not start:\n" + "".join(lines)
        base = f"http://127.0.0.1:{port[0]}"
        # Each worker loads its feed in the background and answers 503 until then: wait until
        # both workers (told apart by the Transit-Worker header) have answered 200.
        deadline = time.monotonic() + 60
        ready: set[str] = set()
        with httpx.Client(base_url=base, timeout=5) as client:
            while len(ready) < 2:
                assert time.monotonic() < deadline, "not ready:\n" + "".join(lines)
                try:
                    health = client.get("/health", headers=FRESH)
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                if health.status_code == 200 and health.json()["vehicles"]["status"] == "ok":
                    ready.add(health.headers["transit-worker"])
                else:
                    time.sleep(0.01)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        reader.join(5)
        proc.stderr.close()


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
        assert len(client.get("/v2/vehicles").json()) == 10
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
