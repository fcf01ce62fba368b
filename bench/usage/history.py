"""Daily usage benchmark: the rollup, the history endpoint and the export, on SQLite and on
PostgreSQL.

    .venv/bin/python bench/usage/history.py [--accounts 10000] [--days 30] [--seconds 10]
        [--backends sqlite,postgres] [--out bench/results/usage_history.json]

Starts its own redis-server and PostgreSQL (initdb in a temporary directory), then per
database:

- rollup: `--accounts` accounts created `--days` days ago, each with a bucket in Redis for
  every one of those days (today included), as the counters leave them; one pass after the
  gap (every account-day written), then a steady pass (yesterday and today); wall time and
  the CPU of this process (the pass, and SQLite itself), of PostgreSQL and of Redis;
- history: one account with 400 stored days; the API under gunicorn (2 uvicorn workers)
  answers `GET /api/v2/user/usage/history` for the full 400 days; `wrk -t1 -c1` (one call at
  a time: latency) and `wrk -t2 -c16` (throughput), mean / p50 / p99;
- export: `python -m sidecars.usage usage export` of every row (CSV and JSON lines, to a
  file), rows per second of the whole command and of the export itself.

Quote ratios and figures from one run; the machine is shared (load average in the JSON).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from support.machine import load_average
from support.postgres_server import PostgresServer
from support.process import REPO, Proc, cpu_seconds, process_tree, scratch, start_bound
from support.redis_server import RedisServer
from support.sidecar import (
    record_database,
    usage_bench_arguments,
    usage_databases,
    usage_sidecar,
    write_usage_results,
)
from support.wrk import run_wrk

from sidecars.usage.db.daily import DailyTable
from sidecars.usage.plans import load_plans
from sidecars.usage.reports import export
from sidecars.usage.rollup import Rollup
from sidecars.usage.settings import HISTORY_PATH, Settings
from sidecars.usage.store import UsageStore
from sidecars.usage.windows import DAY, epoch, utc_date

FIGURES = ("rps", "mean_ms", "p50_ms", "p99_ms", "non2xx")


def cpu(proc: Proc | None) -> float:
    """CPU seconds of a server process tree (0 when there is none)."""
    return cpu_seconds(process_tree(proc.pid)) if proc is not None else 0.0


async def seed(settings: Settings, redis: RedisServer, accounts: int, days: int) -> UsageStore:
    """`accounts` accounts created `days - 1` days ago with a bucket for each of their days."""
    store = UsageStore(settings, load_plans())
    now = time.time()
    created = int(now - (days - 1) * DAY)
    ids = [f"bench-{i:06d}" for i in range(accounts)]
    await store.db.execute_many(
        "INSERT INTO accounts (id, plan, window_kind, start_date, end_date, created, updated) "
        "VALUES (?, ?, '', '2026-01-01', NULL, ?, ?)",
        [(a, ("free", "startup", "pro")[i % 3], created, created) for i, a in enumerate(ids)],
    )
    today = utc_date(now)
    day_starts = [epoch(today - timedelta(days=k)) for k in range(days)]
    client = redis.client()
    for start in range(0, accounts, 500):
        pipe = client.pipeline(transaction=False)
        for i, account_id in enumerate(ids[start : start + 500], start):
            keys = store.bucket_keys_for_days(account_id, day_starts)
            pipe.mset({k: (i * 7 + j) % 1000 for j, k in enumerate(keys)})
        pipe.execute()
    return store


async def rollup(
    settings: Settings, redis: RedisServer, pg: PostgresServer | None, n: int, days: int
) -> dict[str, Any]:
    """Seed, then time a pass after the gap and a steady pass."""
    store = await seed(settings, redis, n, days)
    try:
        out: dict[str, Any] = {"accounts": n, "days": days}
        for name in ("after_gap", "steady"):
            before = (time.process_time(), cpu(pg), cpu(redis))
            started = time.monotonic()
            report = await Rollup(store).run_once()
            wall = time.monotonic() - started
            after = (time.process_time(), cpu(pg), cpu(redis))
            out[name] = {
                "account_days": report.rows,
                "wall_s": round(wall, 3),
                "account_days_per_s": round(report.rows / wall),
                "cpu_s": {
                    "bench process (pass + sqlite)": round(after[0] - before[0], 3),
                    "postgres": round(after[1] - before[1], 3),
                    "redis": round(after[2] - before[2], 3),
                },
            }
        return out
    finally:
        await store.close()


async def add_history(settings: Settings) -> str:
    """An account with 400 stored days and a token; the token."""
    store = UsageStore(settings, load_plans())
    try:
        await store.create_account("history-400", "pro")
        token, _ = await store.issue_token("history-400")
        today = utc_date(time.time())
        rows = [
            ("history-400", (today - timedelta(days=k)).isoformat(), k, "pro", 1_000_000, 0)
            for k in range(400)
        ]
        await store.db.execute_many(
            "INSERT INTO daily_usage (account_id, day, usage, plan, plan_limit, updated) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (account_id, day) DO NOTHING",
            rows,
        )
        return token
    finally:
        await store.close()


def history(env: dict[str, str], token: str, tmp: Path, seconds: int) -> dict[str, Any]:
    """wrk against the 400-day history under gunicorn."""
    sidecar = usage_sidecar(
        {**env, "USAGE_RATE_LIMIT": "false", "USAGE_ROLLUP_INTERVAL_SECONDS": "0"},
        tmp / "gunicorn-history.log",
    )
    try:
        sidecar.wait_ready(60)
        sidecar.wait_steady(lambda: sidecar.get("/health").status_code == 200, "health")
        today = utc_date(time.time())
        query = f"?from={today - timedelta(days=399)}&to={today}"
        url = sidecar.base + HISTORY_PATH + query
        headers = {"Authorization": f"Bearer {token}"}
        points = len(sidecar.get(HISTORY_PATH + query, headers=headers).json()["points"])
        run_wrk(url, 2, connections=4, headers=headers)  # warm-up
        serial = run_wrk(url, seconds, connections=1, threads=1, headers=headers)
        loaded = run_wrk(url, seconds, connections=16, threads=2, headers=headers)
        return {
            "points_per_answer": points,
            "serial_t1_c1": {k: round(serial[k], 3) for k in FIGURES},
            "throughput_t2_c16": {k: round(loaded[k], 3) for k in FIGURES},
        }
    finally:
        sidecar.terminate()


async def export_in_process(settings: Settings) -> dict[str, Any]:
    """The export function alone, to /dev/null: rows per second per format."""
    store = UsageStore(settings, load_plans())
    out: dict[str, Any] = {}
    try:
        daily = DailyTable(store.db)
        today = utc_date(time.time())
        first = today - timedelta(days=399)
        for fmt in ("csv", "jsonl"):
            with open(os.devnull, "w") as sink:
                started, cpu0 = time.monotonic(), time.process_time()
                rows = await export(daily, first, today, None, fmt, sink)
                wall = time.monotonic() - started
            out[fmt] = {
                "rows": rows,
                "wall_s": round(wall, 3),
                "rows_per_s": round(rows / wall),
                "cpu_s": round(time.process_time() - cpu0, 3),
            }
    finally:
        await store.close()
    return out


def export_cli(env: dict[str, str], tmp: Path) -> dict[str, Any]:
    """`python -m sidecars.usage usage export` to a file (startup included)."""
    today = utc_date(time.time())
    argv = [sys.executable, "-m", "sidecars.usage", "usage", "export"]
    argv += ["--from", str(today - timedelta(days=399)), "--to", str(today)]
    out: dict[str, Any] = {}
    for fmt in ("csv", "jsonl"):
        target = tmp / f"export.{fmt}"
        started = time.monotonic()
        subprocess.run(
            [*argv, "--format", fmt, "--output", str(target)],
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            check=True,
            capture_output=True,
        )
        wall = time.monotonic() - started
        lines = sum(1 for _ in target.open()) - (1 if fmt == "csv" else 0)
        out[fmt] = {"rows": lines, "wall_s": round(wall, 3), "rows_per_s": round(lines / wall)}
    return out


def main() -> None:
    """Run the benchmark and print/write the JSON."""
    args = usage_bench_arguments("usage_history", accounts=10_000, days=30, seconds=10)
    results: dict[str, Any] = {"load average at start": load_average()}
    with scratch("usage-history-bench-") as (tmp, procs):
        redis = start_bound(lambda: RedisServer(tmp / "redis"))
        procs.append(redis)
        for backend, pg, database in usage_databases(args.backends, tmp, procs):
            env = {"USAGE_REDIS_URL": redis.url, **database}
            settings = Settings.from_env(env)
            redis.client().flushall()
            entry: dict[str, Any] = {}
            entry["rollup"] = asyncio.run(rollup(settings, redis, pg, args.accounts, args.days))
            token = asyncio.run(add_history(settings))
            entry["history_400_days"] = history(env, token, tmp, args.seconds)
            entry["export"] = {
                "in_process": asyncio.run(export_in_process(settings)),
                "command": export_cli(env, tmp),
            }
            record_database(results, backend, entry)
        write_usage_results(args.out, results, redis.version())


if __name__ == "__main__":
    main()
