"""Usage API load benchmark: wrk against the app under gunicorn (2 uvicorn workers) on Redis.

    .venv/bin/python bench/usage/run.py [--duration 10] [--repeats 3] [--out ...results.json]

Starts its own redis-server, ratelimitd (BACKEND_TYPE=redis, limits far above the load), an
SQLite account database and the sidecar on free ports, issues a token with the CLI, then runs wrk:

- throughput: `wrk -t2 -c64` for requests/s and p99, middleware off and on;
- added latency: `wrk -t1 -c1` (one request at a time), middleware off and on; the
  difference of the mean latencies is what the middleware adds per request (token lookup
  moves from the resource into it, so it adds the gRPC decision and the atomic quota
  check-and-count in Redis).

"off" is USAGE_RATE_LIMIT=false (no middleware: the resource authenticates); "on" is the
default middleware with USAGE_QUOTA_EXEMPT_PATHS="" so the quota check runs on every request.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.core import suite_config
from support.daemon import redis_and_daemon
from support.machine import SIDECAR_PACKAGES, load_average, machine_info
from support.process import REPO, scratch
from support.sidecar import usage_sidecar
from support.wrk import run_wrk

# The usage API's rules (api: remote_address, account, plan pro + account) at 10^9 per second.
CONFIG = suite_config("bench_usage")
FIGURES = ("rps", "mean_ms", "p50_ms", "p99_ms", "non2xx")


def wrk(url: str, token: str, threads: int, conns: int, duration: int) -> dict[str, float]:
    """One wrk run with the bearer token: requests/s, mean/p50/p99 latency in ms, non-2xx."""
    headers = {"Authorization": f"Bearer {token}"}
    out = run_wrk(url, duration, connections=conns, threads=threads, headers=headers)
    return {k: out[k] for k in FIGURES}


def main() -> None:
    """Run the benchmark and print/write the JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "usage.json"))
    args = ap.parse_args()
    machine = machine_info(SIDECAR_PACKAGES)
    with scratch("usage-bench-") as (tmp, procs):
        redis, daemon = redis_and_daemon(tmp, procs, CONFIG)

        database = {"USAGE_SQLITE_PATH": str(tmp / "usage.sqlite3")}
        cenv = {**os.environ, "PYTHONPATH": str(REPO), "USAGE_REDIS_URL": redis.url, **database}
        cli = [sys.executable, "-m", "sidecars.usage"]
        subprocess.run(
            [*cli, "accounts", "create", "bench", "--plan", "pro"],
            env=cenv,
            check=True,
            capture_output=True,
        )
        issued = subprocess.run(
            [*cli, "tokens", "issue", "bench"], env=cenv, check=True, capture_output=True, text=True
        )
        token = json.loads(issued.stdout)["token"]

        modes = {
            "off": {"USAGE_REDIS_URL": redis.url, "USAGE_RATE_LIMIT": "false", **database},
            "on": {
                "USAGE_REDIS_URL": redis.url,
                **database,
                "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
                "USAGE_QUOTA_EXEMPT_PATHS": "",
            },
        }
        # Both servers run side by side and the rounds alternate between them, so a change in
        # the shared machine's load hits both modes alike; medians over the rounds are quoted.
        bases: dict[str, str] = {}
        for name, mode_env in modes.items():
            sidecar = usage_sidecar(mode_env, tmp / f"usage-{name}.log")
            procs.append(sidecar)
            sidecar.wait_ready(60)
            sidecar.wait_steady(
                lambda s=sidecar: s.get("/health").status_code == 200, "usage API health"
            )
            bases[name] = sidecar.base
        rounds: dict[str, dict[str, list[dict[str, float]]]] = {
            name: {"throughput_t2_c64": [], "serial_t1_c1": []} for name in modes
        }
        for base in bases.values():
            wrk(base + "/api/v2/user/usage", token, 2, 64, 2)  # warm-up: pools, caches
        for _ in range(args.repeats):
            for name, base in bases.items():
                url = base + "/api/v2/user/usage"
                rounds[name]["throughput_t2_c64"].append(wrk(url, token, 2, 64, args.duration))
                rounds[name]["serial_t1_c1"].append(wrk(url, token, 1, 1, args.duration))
        results: dict[str, Any] = {}
        for name, tests in rounds.items():
            results[name] = {
                test: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                for test, runs in tests.items()
            }
        results["rounds"] = rounds
        off, on = results["off"]["serial_t1_c1"], results["on"]["serial_t1_c1"]
        results["middleware_added_ms"] = {
            "mean": round(on["mean_ms"] - off["mean_ms"], 3),
            "p50": round(on["p50_ms"] - off["p50_ms"], 3),
            "p99": round(on["p99_ms"] - off["p99_ms"], 3),
        }
        results["machine"] = {
            **machine,
            "redis-server": redis.version(),
            "gunicorn_workers": 2,
            "duration_s": args.duration,
            "repeats": args.repeats,
            "load average at end": load_average(),
        }
    text = json.dumps(results, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
