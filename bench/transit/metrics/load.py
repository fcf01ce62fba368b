"""Requests/s of the metrics endpoints under gunicorn (2 uvicorn workers), measured with wrk.

    python bench/transit/metrics/load.py --records /tmp/tm_bench/records \\
        --db /tmp/tm_bench/metrics.sqlite --now 2026-11-22T12:00:00+10:00

Serves the whole transit app (`asgi:app()`, as deployed), over a metrics
store that is already loaded (run ingest.py or the CLI first: the scheduled ingest then
finds nothing new). Waits until both workers answer every endpoint, then runs
`wrk -t2 -c32 -d10s --latency -H 'Accept-Encoding: gzip'` per endpoint. wrk shares the
machine's 2 cores with the server.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]
ENDPOINTS = (
    "/v2/metrics/demand/by_agency/day",
    "/v2/metrics/demand/by_agency/records",
    "/v2/metrics/demand/by_line",
    "/v2/metrics/demand/by_line/110",
    "/v2/metrics/demand/top_lines/by_agency",
    "/v2/metrics/demand/by_stop",
    "/v2/metrics/service/all",
    "/v2/metrics/complaints",
    "/v2/metrics/videowall/sla",
    "/v2/locations/parishes",
    "/v2/facilities/stores",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wrk(url: str, seconds: int, connections: int) -> dict[str, object]:
    out = subprocess.run(
        [
            "wrk",
            "-t2",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-H",
            "Accept-Encoding: gzip",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": round(rps),
        "p50": lat.get("50"),
        "p99": lat.get("99"),
        "non_2xx": int(errors.group(1)) if errors else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--now", required=True, help="TRANSIT_NOW, e.g. the last generated day")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args(argv)
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TRANSIT_RECORDS_DIR": args.records,
        "TRANSIT_METRICS_DB": args.db,
        "TRANSIT_NOW": args.now,
        "TRANSIT_LINE_ID_PATTERN": "^[0-9A-Z]{1,5}$",
        "TRANSIT_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-k",
            "uvicorn.workers.UvicornWorker",
            "-w",
            "2",
            "-b",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            "sidecars.transit.asgi:app()",
        ],
        cwd=REPO,
        env=env,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    results: dict[str, object] = {}
    try:
        deadline = time.monotonic() + 300
        ready = 0
        # Both workers must have rendered every view: 20 fresh connections in a row answer 200.
        while ready < 20:
            if time.monotonic() > deadline:
                raise SystemExit("server not ready in 300 s")
            try:
                ok = all(
                    httpx.get(base + p, headers={"Connection": "close"}, timeout=10).status_code
                    == 200
                    for p in ENDPOINTS
                )
            except httpx.HTTPError:
                ok = False
            ready = ready + 1 if ok else 0
            if not ok:
                time.sleep(0.5)
        for path in ENDPOINTS:
            plain = httpx.get(base + path, headers={"Accept-Encoding": "identity"})
            gz = httpx.get(base + path, headers={"Accept-Encoding": "gzip"})
            wrk(base + path, 2, args.connections)  # warm-up
            results[path] = {
                "bytes": len(plain.content),
                "gzip_bytes": int(gz.headers.get("content-length", 0)),
                **wrk(base + path, args.seconds, args.connections),
            }
            print(path, results[path], file=sys.stderr)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    print(json.dumps({"load_average_at_end": os.getloadavg(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
