"""Requests/s and p99 of /v2/stops, /v2/arrivals/by_stop/:id and /v2/vehicles under gunicorn
(2 uvicorn workers), measured with wrk (which shares the machine's cores with the server).

    .venv/bin/python bench/transit/network/load.py                      # embedded Cairns feed
    .venv/bin/python bench/transit/network/load.py --feed /tmp/cm_synth.zip --stop 100000 \\
        --now 2026-03-24T08:00:00+00:00
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]
# A new connection per probe: a kept-alive one would always reach the same worker.
FRESH = {"Connection": "close"}
LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore::DeprecationWarning",
        "TRANSIT_PORT": "0",
        "TRANSIT_WORKERS": str(args.workers),
        "TRANSIT_NOW": args.now,
        "TRANSIT_LOG_LEVEL": "warning",
    }
    if args.feed:
        env["TRANSIT_GTFS_SOURCE"] = args.feed
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecars.transit", "--log-level", "info"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    port: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            match = LISTENING.search(line)
            if match and not port:
                port.append(match.group(1))
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(60):
        raise SystemExit("server did not start")
    base = f"http://127.0.0.1:{port[0]}"
    deadline = time.monotonic() + 300
    ready: set[str] = set()
    with httpx.Client(base_url=base, timeout=5) as client:
        while len(ready) < args.workers:  # every worker must have loaded the feed
            if time.monotonic() > deadline:
                raise SystemExit("server not ready")
            try:
                health = client.get("/health", headers=FRESH)
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            if health.status_code == 200:
                ready.add(health.headers["transit-worker"])
            else:
                time.sleep(0.2)
    return proc, base


def wrk(url: str, seconds: int, connections: int, gzip: bool) -> tuple[float, str, str]:
    cmd = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency"]
    if gzip:
        cmd += ["-H", "Accept-Encoding: gzip"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)  # type: ignore[union-attr]
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)  # type: ignore[union-attr]
    return rps, p50, p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--feed", help="TRANSIT_GTFS_SOURCE (default: the embedded Cairns zip)")
    parser.add_argument("--stop", default="750000", help="stop id for the arrivals endpoint")
    parser.add_argument("--now", default="2014-06-10T08:00:00+10:00", help="TRANSIT_NOW")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    proc, base = start_server(args)
    try:
        with httpx.Client(base_url=base, timeout=10) as client:
            sizes = {
                p: len(client.get(p).content)
                for p in ("/v2/stops", f"/v2/arrivals/by_stop/{args.stop}", "/v2/vehicles")
            }
        print(
            f"# feed={args.feed or 'embedded cairns'} workers={args.workers} "
            f"wrk -t2 -c{args.connections} -d{args.seconds}s, cpus={os.cpu_count()}"
        )
        print("| endpoint | Accept-Encoding | body bytes | requests/s | p50 | p99 |")
        print("|---|---|---|---|---|---|")
        for path, gzip in (
            ("/v2/stops", True),
            ("/v2/stops", False),
            (f"/v2/arrivals/by_stop/{args.stop}", False),
            ("/v2/vehicles", False),
        ):
            wrk(base + path, 2, args.connections, gzip)  # warm-up
            rps, p50, p99 = wrk(base + path, args.seconds, args.connections, gzip)
            enc = "gzip" if gzip else "identity"
            print(f"| `{path}` | {enc} | {sizes[path]} | {rps:,.0f} | {p50} | {p99} |", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


if __name__ == "__main__":
    main()
