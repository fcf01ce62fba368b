"""Measure static feed ingest (fetch + parse + validate + index + encode lists) and peak RSS.

Each feed is loaded in a fresh child process so its peak RSS is its own (the same measure as
bench/transit/scale.py's ingest step, which also compares with an earlier revision).

    .venv/bin/python bench/transit/network/ingest.py \
        sidecars/transit/data/cairns_gtfs.zip /tmp/cm_synth.zip
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench" / "transit"))

from scale import ingest  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("feeds", nargs="+")
    args = parser.parse_args()
    machine = f"{platform.node()} {platform.machine()} cpus={os.cpu_count()}"
    print(f"# {machine} python {platform.python_version()}")
    for feed in args.feeds:
        t0 = time.perf_counter()
        result = ingest(REPO, Path(feed).resolve())
        result["feed"] = feed
        result["wall_with_interpreter_s"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
