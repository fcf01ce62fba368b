"""Redis Cluster: round trips per decision with REDIS_CLUSTER_PIPELINE_PARALLELISM 1 and N.

Starts three cluster masters (real redis-server, `redis-cli --cluster create`) on free ports,
runs on uvloop, and decides requests of three descriptors whose keys live on the three masters,
one caller at a time (so a decision's latency is its own round trips), for parallelism 1 (the
reference's default: a request's node pipelines one after another), 3 and 0 (all at once).
A one-descriptor request (one node) measured in the same run is the unit: round trips on the
critical path = latency of the 3-descriptor decision / latency of the 1-descriptor one.
Writes per decision are the backend's flushes (one `transport.write` each) / decisions.

    .venv/bin/python bench/redis/cluster.py [--decisions 5000] [--repeat 3]

Prints a Markdown table and one JSON line; bench/results/redis_cluster.md keeps a run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import uvloop
from support.core import Decider, suite_config
from support.machine import machine_info
from support.redis_server import RedisServer, RedisServers

from ratelimitd.backends import load_settings
from ratelimitd.backends.redis import key_slot
from ratelimitd.core import build_core

NOW = 1_000_000.0  # a fixed clock: the keys (and so their slots) stay put
WINDOW = 997200  # NOW's hour


def clock() -> float:
    return NOW


# d: k 10^9 per hour, a limit the load never reaches.
CONFIG = suite_config("bench_far_limit")


def values_per_node(nodes: list[RedisServer]) -> list[str]:
    """Three values whose keys live on three different masters."""
    owners = {}
    for n in nodes:
        for start, end, master, *_ in n.client().execute_command("CLUSTER", "SLOTS"):
            owners[(start, end)] = int(master[1])
    found: dict[int, str] = {}
    for i in range(10_000):
        value = f"v{i}"
        slot = key_slot(f"d_k_{value}_{WINDOW}".encode())
        port = next(p for (s, e), p in owners.items() if s <= slot <= e)
        found.setdefault(port, value)
        if len(found) == 3:
            return list(found.values())
    raise SystemExit("no three values on three nodes")


async def measure(nodes: list[RedisServer], parallelism: str, descriptors: list, n: int) -> dict:
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_TYPE": "cluster",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": nodes[0].address,
        "REDIS_POOL_SIZE": "4",
        "REDIS_CLUSTER_PIPELINE_PARALLELISM": parallelism,
    }
    d = Decider(build_core(load_settings(env), clock=clock), clock)
    d.load(CONFIG)
    await d.backend.connect()
    try:
        for _ in range(200):  # warm up: connections, slot map
            await d.decide("d", *descriptors)
        writes = d.backend.writes
        started = time.perf_counter()
        for _ in range(n):
            await d.decide("d", *descriptors)
        elapsed = time.perf_counter() - started
        return {"us": elapsed / n * 1e6, "writes": (d.backend.writes - writes) / n}
    finally:
        await d.backend.close()


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        servers = RedisServers(Path(tmp))
        try:
            nodes = servers.cluster(3)
            values = values_per_node(nodes)
            one = [[("k", values[0])]]
            three = [[("k", v)] for v in values]
            rows: dict[str, list[dict]] = {}
            for _ in range(args.repeat):  # interleaved, so a noisy moment hits every variant
                for name, parallelism, descriptors in (
                    ("1 descriptor (unit)", "1", one),
                    ("3 descriptors, parallelism 1", "1", three),
                    ("3 descriptors, parallelism 3", "3", three),
                    ("3 descriptors, parallelism 0", "0", three),
                ):
                    got = await measure(nodes, parallelism, descriptors, args.decisions)
                    rows.setdefault(name, []).append(got)
        finally:
            servers.stop_all()
    unit = statistics.median(r["us"] for r in rows["1 descriptor (unit)"])
    print(
        "| request | µs per decision (median of runs) | round trips on the critical path "
        "| writes per decision |"
    )
    print("|---|---:|---:|---:|")
    table = {}
    for name, runs in rows.items():
        us = statistics.median(r["us"] for r in runs)
        writes = statistics.median(r["writes"] for r in runs)
        table[name] = {"us": us, "round_trips": us / unit, "writes": writes, "runs": runs}
        print(f"| {name} | {us:.1f} | {us / unit:.2f} | {writes:.2f} |")
    print(json.dumps({"machine": machine_info(), "decisions": args.decisions, "table": table}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    uvloop.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
