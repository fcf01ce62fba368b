"""Token budgets: CPU per reserve and per settle against a plain decision, Redis round trips
per call, and the overshoot of the concurrency workload through the real Envoy.

    .venv/bin/python bench/budget.py [--calls 20000] [--repeat 5] [--no-envoy]

1. Store level (what exists before the budget calls are wired into the decision path):
   CPU (time.process_time) per call of the memory twin's reserve, settle and a reserve +
   settle pair, against the memory backend's fixed-window increment of one op; on Redis
   (a redis-server started on a free port) the client CPU per call, the server's
   microseconds per EVALSHA against per INCRBY (INFO commandstats), and round trips per call
   (the backend's pipelined writes / calls). Median of --repeat runs, one run for the ratios.
2. The workload (tests/support/llm_stack): N concurrent streams, each asking max_tokens and
   using less, through Envoy on the check-then-report example; the tokens charged against
   the limit, and so the overshoot. The reserve example's figure joins it once the daemon
   decides budgets (the same workload is its end-to-end test).

Writes bench/results/budget.json and budget.md. The machine may be shared: quote ratios
of one run, not absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/support

from support.budget import redis_budgets
from support.llm_stack import EXAMPLES, concurrent_streams, llm_stack
from support.machine import machine_info
from support.ready import wait_for
from support.redis_server import RedisServers

from ratelimitd.backends import MemoryBackend
from ratelimitd.backends.base import Op
from ratelimitd.budget.memory import MemoryBudgets
from ratelimitd.budget.model import RESERVE, SETTLE, Call, budget_keys, fixed

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000
WINDOWS = (fixed(3600, 2**31),)  # never over: every call takes the same path
TTL = 600_000


def calls(n: int, kind: int, tag: str) -> list[Call]:
    """`n` calls of `kind` on 64 budgets, one transaction each (what a reserve made)."""
    keys = [budget_keys("", "bench", [("user", f"u{i}")])[0] for i in range(64)]
    return [Call(kind, keys[i % 64], WINDOWS, T0, f"{tag}{i}", 700, TTL) for i in range(n)]


def cpu_per_call(run: Callable[[], None], n: int) -> float:
    start = time.process_time()
    run()
    return (time.process_time() - start) / n * 1e6


def memory_figures(n: int) -> dict[str, float]:
    """µs of CPU per call on the memory stores."""
    backend = MemoryBackend()
    ops = [Op(f"bench_user_u{i % 64}_1699999200", 1, 3600) for i in range(n)]
    now = T0 // 1000

    def plain() -> None:
        for op in ops:
            backend.increment_one(op.key, op.hits, op.seconds, now)

    budgets = MemoryBudgets()
    reserves, settles = calls(n, RESERVE, "t"), calls(n, SETTLE, "t")
    return {
        "plain": cpu_per_call(plain, n),
        "reserve": cpu_per_call(lambda: [budgets.run_now([c]) for c in reserves] and None, n),
        "settle": cpu_per_call(lambda: [budgets.run_now([c]) for c in settles] and None, n),
    }


async def redis_figures(address: str, server: Any, n: int) -> dict[str, float]:
    """Client µs of CPU per call, server µs per command, round trips per call (one caller)."""
    backend, budgets = await redis_budgets(address)
    try:
        ops = [Op(f"bench_user_u{i % 64}_1699999200", 1, 3600) for i in range(n)]
        out: dict[str, float] = {}
        for name, items in (
            ("plain", ops),
            ("reserve", calls(n, RESERVE, "r")),
            ("settle", calls(n, SETTLE, "r")),
        ):
            server.command("CONFIG", "RESETSTAT")
            writes = backend.writes
            start = time.process_time()
            for item in items:
                if name == "plain":
                    await backend.increment([item])
                else:
                    await budgets.run([item])
            out[name] = (time.process_time() - start) / n * 1e6
            out[f"{name}_round_trips"] = (backend.writes - writes) / n
            # Server CPU per call: the commands one call sends (INCRBY + EXPIRE, or EVALSHA).
            info = server.command("INFO", "commandstats").decode()
            usec = 0.0
            for line in info.splitlines():
                if line.startswith(("cmdstat_incrby:", "cmdstat_expire:", "cmdstat_evalsha:")):
                    fields = dict(f.split("=") for f in line.partition(":")[2].split(","))
                    usec += float(fields["usec"])
            out[f"{name}_server_us"] = usec / n
        return out
    finally:
        await backend.close()


def workload(streams: int, max_tokens: int, usage: int, limit: int) -> dict[str, int]:
    """The concurrency workload through Envoy on the check-then-report example."""
    config = (EXAMPLES / "check-then-report" / "config" / "llm.yaml").read_text()
    config = config.replace("requests_per_unit: 100000", f"requests_per_unit: {limit}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        llm_stack(Path(tmp), "check-then-report", config, record=False) as s,
    ):
        answers = concurrent_streams(s, streams, max_tokens=max_tokens, usage=usage)
        admitted = sum(a.status == 200 for a in answers)
        wait_for(lambda: s.counter("crowd")["value"] == admitted * usage, 60, "the reports")
        used = int(s.counter("crowd")["value"])
    return {"admitted": admitted, "charged": used, "overshoot": max(0, used - limit)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-envoy", action="store_true", help="skip the Envoy workload")
    args = parser.parse_args()
    runs = [memory_figures(args.calls) for _ in range(args.repeat)]
    memory = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    with tempfile.TemporaryDirectory() as tmp:
        servers = RedisServers(Path(tmp))
        try:
            server = servers()
            redis_runs = [
                uvloop.run(redis_figures(server.address, server, args.calls // 4))
                for _ in range(args.repeat)
            ]
        finally:
            servers.stop_all()
    redis = {k: statistics.median(r[k] for r in redis_runs) for k in redis_runs[0]}
    result: dict[str, Any] = {"machine": machine_info(), "memory": memory, "redis": redis}
    if not args.no_envoy:
        result["check_then_report"] = {
            "streams": 40,
            "max_tokens": 1000,
            "usage": 800,
            "limit": 10_000,
            **workload(40, 1000, 800, 10_000),
        }
    out = ROOT / "bench" / "results"
    (out / "budget.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Token budgets (bench/budget.py)",
        "",
        "Store level, before the budget calls are wired into the decision path. CPU µs per call",
        "(client side for Redis), ratio to a plain fixed-window increment of one counter.",
        "",
        "| call | memory µs | x plain | Redis client µs | x plain | Redis server µs | "
        "round trips |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("plain", "reserve", "settle"):
        lines.append(
            f"| {name} | {memory[name]:.2f} | {memory[name] / memory['plain']:.2f} | "
            f"{redis[name]:.1f} | {redis[name] / redis['plain']:.2f} | "
            f"{redis[name + '_server_us']:.2f} | {redis[name + '_round_trips']:.2f} |"
        )
    if "check_then_report" in result:
        w = result["check_then_report"]
        lines += [
            "",
            f"Workload: {w['streams']} concurrent streams, max_tokens {w['max_tokens']}, usage "
            f"{w['usage']}, limit {w['limit']} tokens. Check-then-report: {w['admitted']} "
            f"admitted, {w['charged']} charged, overshoot {w['overshoot']} "
            f"({100 * w['overshoot'] / w['limit']:.0f}% of the limit).",
        ]
    (out / "budget.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
