"""Requests/s of the metrics endpoints under gunicorn (2 uvicorn workers), measured with wrk.

    python bench/transit/metrics/load.py --records /tmp/tm_bench/records \\
        --db /tmp/tm_bench/metrics.sqlite --now 2026-11-22T12:00:00+10:00

Serves the whole transit app (`python -m sidecars.transit`, as deployed), over a metrics
store that is already loaded (run ingest.py or the CLI first: the scheduled ingest then
finds nothing new). Waits until both workers answer every endpoint, then runs
`wrk -t2 -c32 -d10s -H 'Accept-Encoding: gzip'` per endpoint. wrk shares the
machine's 2 cores with the server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from support.machine import SIDECAR_PACKAGES, machine_info
from support.sidecar import transit_sidecar
from support.wrk import run_wrk

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


def wrk(url: str, seconds: int, connections: int) -> dict[str, object]:
    """wrk -t2 asking for gzip: requests/s, p50/p99 in ms, non-2xx answers."""
    out = run_wrk(url, seconds, connections, threads=2, headers={"Accept-Encoding": "gzip"})
    return {
        "rps": round(out["rps"]),
        "p50_ms": round(out["p50_ms"], 2),
        "p99_ms": round(out["p99_ms"], 2),
        "non2xx": out["non2xx"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--now", required=True, help="TRANSIT_NOW, e.g. the last generated day")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args(argv)
    machine = machine_info(SIDECAR_PACKAGES)
    env = {
        "TRANSIT_RECORDS_DIR": args.records,
        "TRANSIT_METRICS_DB": args.db,
        "TRANSIT_NOW": args.now,
        "TRANSIT_DEMO": "true",  # the records are generated from the bundled Cairns feed
        "TRANSIT_LOG_LEVEL": "warning",
    }
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # gunicorn's own "Listening at" line is at info level; the app logs at warning.
        server = transit_sidecar(env, Path(tmp) / "gunicorn.log", 2, "--log-level", "info")
        try:
            server.wait_ready(60)
            # Both workers must have rendered every view: 20 fresh connections in a row
            # answer 200 on every endpoint.
            server.wait_steady(
                lambda: all(server.get(p).status_code == 200 for p in ENDPOINTS),
                "every worker to serve every endpoint",
                times=20,
                timeout=300,
            )
            for path in ENDPOINTS:
                plain = server.get(path, headers={"Accept-Encoding": "identity"})
                gz = server.get(path, headers={"Accept-Encoding": "gzip"})
                wrk(server.base + path, 2, args.connections)  # warm-up
                results[path] = {
                    "bytes": len(plain.content),
                    "gzip_bytes": int(gz.headers.get("content-length", 0)),
                    **wrk(server.base + path, args.seconds, args.connections),
                }
                print(path, results[path], file=sys.stderr)
        finally:
            server.terminate(30)
    machine["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(json.dumps({"machine": machine, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
