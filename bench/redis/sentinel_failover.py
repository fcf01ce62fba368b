"""Sentinel: failed decisions, recovery time and lost counts in a `SENTINEL FAILOVER` under load.

Starts a master, its replica and three sentinels (real redis-server processes on free ports),
and 16 callers deciding in a loop through the Redis backend (REDIS_TYPE=sentinel), each on
its own key. After 2 s a `SENTINEL FAILOVER` promotes the replica; the callers go on for 14 s
more. Reported per variant:

- failed decisions (BackendError) and the window they fell in;
- time from the FAILOVER command until the backend's pool points at the new master, and
  until the first decision after it is served;
- lost counts: decisions answered OK whose count is not on the new master at the end (the
  demoted master takes writes until the sentinels reconfigure it, up to 10 s later).

Variants: `+switch-master` (the default: a subscription to a sentinel moves the pool when
the failover is announced) and `READONLY only` (the subscription disabled: the pool moves when
the demoted master first answers READONLY, as before this feature).

    .venv/bin/python bench/redis/sentinel_failover.py

Prints a Markdown table and one JSON line; bench/results/redis_sentinel.md keeps a run.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import uvloop
from support.core import Decider, suite_config
from support.machine import machine_info
from support.redis_server import RedisServers

from ratelimitd.backends import load_settings
from ratelimitd.backends.base import BackendError
from ratelimitd.backends.redis.instances import SingleInstance
from ratelimitd.core import build_core

CALLERS = 16
BEFORE = 2.0
AFTER = 14.0
# d: k 10^9 per hour, a limit the load never reaches.
CONFIG = suite_config("bench_far_limit")


async def variant(workdir: Path, follow_switch: bool) -> dict:
    servers = RedisServers(workdir)
    try:
        _master, replica, sentinels = servers.sentinels()
        urls = ",".join(s.address for s in sentinels)
        env = {
            "BACKEND_TYPE": "redis",
            "REDIS_TYPE": "sentinel",
            "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": f"mymaster,{urls}",
            "REDIS_POOL_SIZE": "2",
            "EXPIRATION_JITTER_MAX_SECONDS": "0",
        }
        d = Decider(build_core(load_settings(env)), time.time)
        d.load(CONFIG)
        if not follow_switch:
            SingleInstance._watch_sentinels = _no_watch  # type: ignore[method-assign]
        await d.backend.connect()
        instance = d.backend.main
        ok = [0] * CALLERS
        failures: list[float] = []
        stop = asyncio.Event()

        async def caller(i: int) -> None:
            while not stop.is_set():
                try:
                    await d.decide("d", [("k", f"c{i}")])
                    ok[i] += 1
                except BackendError:
                    failures.append(time.monotonic())
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(caller(i)) for i in range(CALLERS)]
        await asyncio.sleep(BEFORE)
        new = ("127.0.0.1", replica.port)
        ordered = time.monotonic()
        await asyncio.to_thread(
            sentinels[0].client().execute_command, "SENTINEL", "FAILOVER", "mymaster"
        )
        moved = None
        served = None
        end = ordered + AFTER
        while time.monotonic() < end:
            if moved is None and instance.address == new and instance.pool.conns:
                moved = time.monotonic()
                before = sum(ok)
            if moved is not None and served is None and sum(ok) > before:
                served = time.monotonic()
            await asyncio.sleep(0.005)
        stop.set()
        await asyncio.gather(*tasks)
        await d.backend.close()
        counted = 0
        client = replica.client()
        for i in range(CALLERS):
            keys = client.keys(f"d_k_c{i}_*")
            counted += sum(int(client.get(k) or 0) for k in keys)
        return {
            "variant": "+switch-master" if follow_switch else "READONLY only",
            "decisions_ok": sum(ok),
            "failed": len(failures),
            "failures_window_ms": (
                round((max(failures) - min(failures)) * 1000, 1) if failures else 0.0
            ),
            "pool_moved_ms": round((moved - ordered) * 1000, 1) if moved else None,
            "first_served_ms": round((served - ordered) * 1000, 1) if served else None,
            "lost_counts": sum(ok) - counted,
        }
    finally:
        servers.stop_all()


async def _no_watch(self: SingleInstance) -> None:
    return None


async def run() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(await variant(Path(tmp) / "switch", True))
        rows.append(await variant(Path(tmp) / "readonly", False))
    print(
        "| variant | decisions OK | failed | failures within (ms) | pool on new master after "
        "(ms) | first decision served after (ms) | counts lost |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['decisions_ok']:,} | {r['failed']} | "
            f"{r['failures_window_ms']} | {r['pool_moved_ms']} | {r['first_served_ms']} | "
            f"{r['lost_counts']:,} |"
        )
    print(json.dumps({"machine": machine_info(), "callers": CALLERS, "rows": rows}))


if __name__ == "__main__":
    uvloop.run(run())
