"""Measure static feed ingest (fetch + parse + validate + index + encode lists) and peak RSS.

Each feed is loaded in a fresh child process so its peak RSS is its own.

    .venv/bin/python bench/transit/network/ingest.py \
        sidecars/transit/data/cairns_gtfs.zip /tmp/cm_synth.zip
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from sidecars.transit.settings import FeedSettings, RealtimeSettings, TransitSettings
from sidecars.transit.store import TransitStore
t0 = time.perf_counter()
settings = TransitSettings(
    feed=FeedSettings(source=sys.argv[1]), realtime=RealtimeSettings(vehicles_source=None)
)
store = TransitStore(settings)
ok = store.load_static()
elapsed = time.perf_counter() - t0
net = store.network
t1 = time.perf_counter()
if net is not None:
    first = next(iter(net.patterns))
    net.pattern_body(first)
pattern_ms = (time.perf_counter() - t1) * 1000
print(json.dumps({
    "ok": ok,
    "seconds": round(elapsed, 2),
    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "stops": len(net.raw.stop_ids) if net else 0,
    "trips": len(net.raw.trip_ids) if net else 0,
    "stop_times": len(net.raw.st_trip) if net else 0,
    "patterns": len(net.patterns) if net else 0,
    "first_pattern_encode_ms": round(pattern_ms, 1),
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("feeds", nargs="+")
    args = parser.parse_args()
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": root}
    machine = f"{platform.node()} {platform.machine()} cpus={os.cpu_count()}"
    print(f"# {machine} python {platform.python_version()}")
    for feed in args.feeds:
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", CHILD, feed], env=env, capture_output=True, text=True, check=True
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["feed"] = feed
        result["wall_with_interpreter_s"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
