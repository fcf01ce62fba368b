"""Redis backend load benchmark: client CPU per INCRBY+EXPIRE pair, round trips per decision.

Starts its own redis-server on a free port, runs on uvloop, and prints a Markdown table
plus a JSON line describing the run (machine, Python, Redis version, extension mode).

    .venv/bin/python bench/redis/pairs.py [--seconds 3] [--pool-size 10] [--repeat 3]

1. Pairs: C tasks (C = 1, 16, 256) each awaiting `RedisBackend.increment([Op(key, 1, 60)])`
   in a loop: one INCRBY + EXPIRE pair per request, the worst case for per-request
   overhead (own key per task, 60 s unit, up to 300 s of jitter). Client CPU =
   `time.process_time()` of this process / pairs; server CPU = utime + stime of
   redis-server from /proc / pairs.
2. Decisions: 64 tasks each deciding through `RateLimitService` (Limiter + RedisBackend)
   in a loop, one descriptor per request; round trips per decision = the backend's
   flushes (one `transport.write` each, one reply read) / decisions.

Each figure is run --repeat times and the run with the median client CPU is shown; every
run's figure is in the JSON. The machine may be shared: compare figures of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop
from support.machine import machine_info
from support.process import cpu_seconds, start_bound
from support.redis_server import RedisServer

from ratelimitd.backends.base import Op
from ratelimitd.backends.redis import RedisBackend
from ratelimitd.config import ConfigFile
from ratelimitd.core import build_core
from ratelimitd.messages import Descriptor, Request
from ratelimitd.settings import RedisSettings

CONFIG = """
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
"""


def server_cpu(pid: int) -> float:
    """utime + stime of a process, seconds."""
    return cpu_seconds([pid])


async def run_workers(
    call: Callable[[int], tuple[Callable[[Any], Awaitable[object]], Any]],
    concurrency: int,
    seconds: float,
    batch: int,
    pid: int,
) -> tuple[int, float, float, float]:
    """Workers 0..concurrency-1 at once, each awaiting `fn(arg)` (`fn, arg = call(i)`) in
    batches of `batch` for `seconds`: (calls, client CPU, server CPU, wall seconds)."""
    stop = time.monotonic() + seconds
    done = 0

    async def worker(i: int) -> None:
        nonlocal done
        fn, arg = call(i)
        n = 0
        while time.monotonic() < stop:
            for _ in range(batch):
                await fn(arg)
            n += batch
        done += n

    cpu, srv, wall = time.process_time(), server_cpu(pid), time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done, time.process_time() - cpu, server_cpu(pid) - srv, time.monotonic() - wall


async def pairs(backend: RedisBackend, concurrency: int, seconds: float, pid: int) -> dict:
    def call(i: int) -> tuple[Callable[[Any], Awaitable[object]], Any]:
        return backend.increment, [Op(f"bench_pair_{i}", 1, 60)]

    await run_workers(call, min(concurrency, 8), seconds, 50, pid)  # warm-up
    writes = backend.writes
    done, cpu, srv, wall = await run_workers(call, concurrency, seconds, 50, pid)
    return {
        "concurrency": concurrency,
        "pairs": done,
        "pairs_per_s": round(done / wall),
        "client_us_per_pair": round(cpu / done * 1e6, 2),
        "server_us_per_pair": round(srv / done * 1e6, 2),
        "pairs_per_write": round(done / (backend.writes - writes), 1),
    }


async def decisions(
    backend: RedisBackend, concurrency: int, seconds: float, pid: int, impl: str | None
) -> dict:
    core = build_core(backend=backend, impl=impl)
    core.load([ConfigFile("bench.yaml", CONFIG)])
    service = core.service

    def call(i: int) -> tuple[Callable[[Any], Awaitable[object]], Any]:
        return service.should_rate_limit, Request("bench", [Descriptor((("user", f"u{i}"),))])

    writes = backend.writes
    done, cpu, srv, wall = await run_workers(call, concurrency, seconds, 20, pid)
    flushes = backend.writes - writes
    return {
        "concurrency": concurrency,
        "decisions": done,
        "decisions_per_s": round(done / wall),
        "round_trips_per_decision": round(flushes / done, 4),
        "decisions_per_write": round(done / flushes, 1),
        "client_us_per_decision": round(cpu / done * 1e6, 2),
        "server_us_per_decision": round(srv / done * 1e6, 2),
    }


def median(runs: list[dict], key: str) -> dict:
    """The run with the median `key`, with every run's `key` alongside."""
    ordered = sorted(runs, key=lambda r: r[key])
    chosen = dict(ordered[len(ordered) // 2])
    chosen[key + "_runs"] = [r[key] for r in runs]
    return chosen


async def run(args: argparse.Namespace, port: int, pid: int) -> dict:
    backend = RedisBackend(
        RedisSettings(
            type="single",
            socket_type="tcp",
            url=f"127.0.0.1:{port}",
            pool_size=args.pool_size,
            request_timeout=1.0,
        ),
        jitter_max_seconds=300,
    )
    await backend.connect()
    try:
        out: dict = {"pairs": [], "decisions": []}
        for c in (1, 16, 256):
            runs = [await pairs(backend, c, args.seconds, pid) for _ in range(args.repeat)]
            out["pairs"].append(median(runs, "client_us_per_pair"))
        runs = [
            await decisions(backend, 64, args.seconds, pid, args.impl) for _ in range(args.repeat)
        ]
        out["decisions"].append(median(runs, "client_us_per_decision"))
        return out
    finally:
        await backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median shown)")
    parser.add_argument(
        "--impl",
        choices=("compiled", "pure"),
        help="the decision core's keys/match implementation (default: the one selected)",
    )
    args = parser.parse_args()
    machine = machine_info()  # before the run: the load average at start
    with tempfile.TemporaryDirectory() as tmp:
        redis = start_bound(lambda: RedisServer(Path(tmp)))
        try:
            result = uvloop.run(run(args, redis.port, redis.pid))
        finally:
            redis.close()
    result["machine"] = {
        **machine,
        "pool_size": args.pool_size,
        "seconds": args.seconds,
        "repeat": args.repeat,
        "decision core impl": args.impl or "as selected (see implementations)",
    }
    print("| concurrency | pairs/s | client µs/pair | server µs/pair | pairs/write |")
    print("|---|---|---|---|---|")
    for r in result["pairs"]:
        print(
            f"| {r['concurrency']} | {r['pairs_per_s']:,} | {r['client_us_per_pair']} | "
            f"{r['server_us_per_pair']} | {r['pairs_per_write']} |"
        )
    print()
    print(
        "| concurrent decisions | decisions/s | round trips/decision | decisions/write "
        "| client µs/decision | server µs/decision |"
    )
    print("|---|---|---|---|---|---|")
    for r in result["decisions"]:
        print(
            f"| {r['concurrency']} | {r['decisions_per_s']:,} | {r['round_trips_per_decision']} "
            f"| {r['decisions_per_write']} | {r['client_us_per_decision']} "
            f"| {r['server_us_per_decision']} |"
        )
    print()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
