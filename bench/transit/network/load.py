"""Requests/s and p99 of /v2/stops, /v2/arrivals/by_stop/:id and /v2/vehicles under gunicorn
(2 uvicorn workers), measured with wrk (which shares the machine's cores with the server).

    .venv/bin/python bench/transit/network/load.py                      # embedded Cairns feed
    .venv/bin/python bench/transit/network/load.py --feed /tmp/cm_synth.zip --stop 100000 \\
        --now 2026-03-24T08:00:00+00:00
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench" / "transit"))

from scale import serve  # noqa: E402
from support.machine import SIDECAR_PACKAGES, describe, machine_info  # noqa: E402
from support.sidecar import Gunicorn  # noqa: E402
from support.wrk import run_wrk  # noqa: E402


def start_server(args: argparse.Namespace, workdir: Path) -> Gunicorn:
    """The transit API under gunicorn on port 0, once every worker has loaded the feed."""
    env = {"TRANSIT_NOW": args.now}
    if args.feed:
        env["TRANSIT_GTFS_SOURCE"] = args.feed
    else:
        env["TRANSIT_DEMO"] = "true"
    return serve(REPO, env, workdir / "gunicorn.log", args.workers)


def wrk(url: str, seconds: int, connections: int, gzip: bool) -> dict[str, float]:
    """wrk -t2 against `url` (asking for gzip or not)."""
    headers = {"Accept-Encoding": "gzip"} if gzip else None
    return run_wrk(url, seconds, connections=connections, threads=2, headers=headers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--feed", help="TRANSIT_GTFS_SOURCE (default: the embedded Cairns zip)")
    parser.add_argument("--stop", default="750000", help="stop id for the arrivals endpoint")
    parser.add_argument("--now", default="2014-06-10T08:00:00+10:00", help="TRANSIT_NOW")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    machine = machine_info(SIDECAR_PACKAGES)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(args, Path(tmp))
        try:
            measure(args, server, machine)
        finally:
            server.terminate(60)


def measure(args: argparse.Namespace, server: Gunicorn, machine: dict[str, object]) -> None:
    """Print the Markdown table: body sizes, then wrk per endpoint."""
    base = server.base
    sizes = {
        p: len(server.get(p).content)
        for p in ("/v2/stops", f"/v2/arrivals/by_stop/{args.stop}", "/v2/vehicles")
    }
    print(
        f"# feed={args.feed or 'embedded cairns'} workers={args.workers} "
        f"wrk -t2 -c{args.connections} -d{args.seconds}s, cpus={os.cpu_count()}"
    )
    print()
    print("\n".join(describe(machine)))
    print()
    print("| endpoint | Accept-Encoding | body bytes | requests/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for path, gzip in (
        ("/v2/stops", True),
        ("/v2/stops", False),
        (f"/v2/arrivals/by_stop/{args.stop}", False),
        ("/v2/vehicles", False),
    ):
        wrk(base + path, 2, args.connections, gzip)  # warm-up
        r = wrk(base + path, args.seconds, args.connections, gzip)
        enc = "gzip" if gzip else "identity"
        print(
            f"| `{path}` | {enc} | {sizes[path]} | {r['rps']:,.0f} | {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
