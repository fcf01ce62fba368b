"""Metering benchmark: event ingestion, the meter query and the account page, on SQLite and
on PostgreSQL, in process (the Falcon app through an ASGI transport: JSON parsing,
validation, SQL; no sockets, so the figures are the app's own cost).

    .venv/bin/python bench/usage/metering.py [--batches 200] [--accounts 10000] [--days 30]
        [--queries 300] [--backends sqlite,postgres] [--out bench/results/usage_metering.json]

Starts its own redis-server and PostgreSQL (initdb in a temporary directory), then per
database:

- ingestion: `--batches` POSTs of 100 CloudEvents (a batch; 100 accounts, two models), one
  at a time; events per second of the whole run, and the same batches again (every event a
  duplicate);
- meter query: `--accounts` accounts with one `llm.tokens` event per day for `--days` days
  (stored directly), then `--queries` calls of `GET .../meters/tokens?windowSize=day&
  groupBy=model` over the 30 days for random accounts, one at a time: p50 / p99 / max;
- page: one account with 400 rolled-up days; `GET /account/usage` over the 400 days, 50
  times: p50 / p99 / max.

Quote figures from one run; the machine is shared (load average in the JSON).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from support.machine import load_average
from support.process import scratch, start_bound
from support.redis_server import RedisServer
from support.sidecar import (
    record_database,
    usage_bench_arguments,
    usage_databases,
    write_usage_results,
)

from sidecars.usage.app import create_app
from sidecars.usage.db.metered import MeteredEvent, MeteredTable
from sidecars.usage.plans import load_plans
from sidecars.usage.settings import EVENTS_PATH, METERS_PATH, PAGE_PATH, Settings
from sidecars.usage.store import UsageStore
from sidecars.usage.windows import DAY, epoch, utc_date

INGEST = "bench-ingest-token-0123456789"
MODELS = ("gpt-4o", "gpt-4o-mini")
HEADERS = {
    "Authorization": f"Bearer {INGEST}",
    "Content-Type": "application/cloudevents-batch+json",
}


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / max in ms."""
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


async def add_accounts(store: UsageStore, ids: list[str], created: int) -> None:
    """Account rows, in one statement."""
    await store.db.execute_many(
        "INSERT INTO accounts (id, plan, window_kind, start_date, end_date, created, updated) "
        "VALUES (?, 'pro', '', '2026-01-01', NULL, ?, ?)",
        [(a, created, created) for a in ids],
    )


async def ingestion(settings: Settings, batches: int) -> dict[str, Any]:
    """Events per second of `batches` POSTs of 100 events, then of their replay."""
    store = UsageStore(settings, load_plans())
    ids = [f"ingest-{i:03d}" for i in range(100)]
    await add_accounts(store, ids, int(time.time()))
    app = create_app(settings, middleware=[], store=store)
    now = datetime.now(UTC).isoformat()
    bodies = [
        json.dumps(
            [
                {"specversion": "1.0", "id": f"{b}-{i}", "source": "bench", "type": "llm.tokens",
                 "subject": ids[i], "time": now,
                 "data": {"model": MODELS[i % 2], "tokens": 100 + i}}
                for i in range(100)
            ]
        ).encode()
        for b in range(batches)
    ]  # fmt: skip
    out: dict[str, Any] = {"batch": 100, "batches": batches}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for label in ("new", "replayed"):
            started = time.perf_counter()
            for body in bodies:
                resp = await client.post(EVENTS_PATH, content=body, headers=HEADERS)
                assert resp.status_code == 200, resp.text
            wall = time.perf_counter() - started
            out[label] = {
                "seconds": round(wall, 3),
                "events_per_s": round(batches * 100 / wall),
                "last": resp.json(),
            }
    await store.close()
    return out


async def meter_query(settings: Settings, accounts: int, days: int, queries: int) -> dict[str, Any]:
    """p50/p99 of the tokens meter over `days` days for random accounts of `accounts`."""
    store = UsageStore(settings, load_plans())
    now = time.time()
    ids = [f"meter-{i:06d}" for i in range(accounts)]
    await add_accounts(store, ids, int(now - days * DAY))
    table = MeteredTable(store.db)
    today = epoch(utc_date(now))
    seeded = time.perf_counter()
    chunk: list[MeteredEvent] = []
    for n, account in enumerate(ids):
        for d in range(days):
            at = (today - d * DAY + 3600 + n % 3600) * 1000
            data = json.dumps({"model": MODELS[(n + d) % 2], "tokens": 50 + (n + d) % 500})
            chunk.append(
                MeteredEvent("seed", f"{account}-{d}", account, "llm.tokens", at, data, at)
            )
        if len(chunk) >= 6000:
            await table.insert(chunk)
            chunk = []
    if chunk:
        await table.insert(chunk)
    seed_seconds = time.perf_counter() - seeded
    rng = random.Random(7)
    sample = rng.sample(ids, queries)
    tokens = {a: (await store.issue_token(a))[0] for a in sample}
    app = create_app(settings, middleware=[], store=store)
    first = datetime.fromtimestamp(today - (days - 1) * DAY, UTC).date().isoformat()
    params = {"from": first, "windowSize": "day", "groupBy": "model"}
    samples = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for account in sample:
            headers = {"Authorization": f"Bearer {tokens[account]}"}
            started = time.perf_counter()
            resp = await client.get(f"{METERS_PATH}/tokens", params=params, headers=headers)
            samples.append(time.perf_counter() - started)
            assert resp.status_code == 200 and len(resp.json()["data"]) >= days - 1, resp.text
    await store.close()
    return {
        "events": accounts * days,
        "seed_seconds": round(seed_seconds, 2),
        "rows_per_answer": days,
        **percentiles(samples),
    }


async def page(settings: Settings, loads: int = 50) -> dict[str, Any]:
    """p50/p99 of the account page over 400 rolled-up days."""
    store = UsageStore(settings, load_plans())
    now = time.time()
    await add_accounts(store, ["page-account"], int(now - 400 * DAY))
    today = utc_date(now)
    await store.db.execute_many(
        "INSERT INTO daily_usage (account_id, day, usage, plan, plan_limit, updated) "
        "VALUES (?, ?, ?, 'pro', 1000000, ?)",
        [("page-account", (today - timedelta(days=k)).isoformat(), 100 + k, int(now))
         for k in range(400)],
    )  # fmt: skip
    token, _ = await store.issue_token("page-account")
    app = create_app(settings, middleware=[], store=store)
    params = {"from": (today - timedelta(days=399)).isoformat(), "to": today.isoformat()}
    samples = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for _ in range(loads):
            started = time.perf_counter()
            resp = await client.get(
                PAGE_PATH, params=params, headers={"Authorization": f"Bearer {token}"}
            )
            samples.append(time.perf_counter() - started)
            assert resp.status_code == 200 and resp.text.count("<rect") == 400, resp.text[:300]
    await store.close()
    return {"days": 400, "bytes": len(resp.content), **percentiles(samples)}


def main() -> None:
    """Run the benchmark and print/write the JSON."""
    args = usage_bench_arguments(
        "usage_metering", batches=200, accounts=10_000, days=30, queries=300
    )
    results: dict[str, Any] = {"load average at start": load_average()}
    with scratch("usage-metering-bench-") as (tmp, procs):
        redis = start_bound(lambda: RedisServer(tmp / "redis"))
        procs.append(redis)
        for backend, _pg, database in usage_databases(args.backends, tmp, procs):
            env = {
                "USAGE_REDIS_URL": redis.url,
                "USAGE_INGEST_TOKEN": INGEST,
                "USAGE_ROLLUP_INTERVAL_SECONDS": "0",
                "USAGE_DATABASE_TIMEOUT_SECONDS": "60",
                **database,
            }
            settings = Settings.from_env(env)
            entry: dict[str, Any] = {
                "ingestion": asyncio.run(ingestion(settings, args.batches)),
                "meter_query": asyncio.run(
                    meter_query(settings, args.accounts, args.days, args.queries)
                ),
                "page_400_days": asyncio.run(page(settings)),
            }
            record_database(results, backend, entry)
        write_usage_results(args.out, results, redis.version())


if __name__ == "__main__":
    main()
