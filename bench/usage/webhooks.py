"""Threshold webhook benchmark: how long after a crossing request the receiver has the event.

    .venv/bin/python bench/usage/webhooks.py [--crossings 300] [--concurrency 1,8]
        [--backends sqlite,postgres] [--out bench/results/usage_webhooks.json]

Starts its own redis-server, PostgreSQL, ratelimitd (limits far above the load) and the API
under gunicorn (2 uvicorn workers, webhooks on), and a receiver in this process (a threaded
HTTP server answering 204 at once; it checks every signature). Each account's usage is set
one below its quota of 10 (the 100 % threshold) in Redis, then one request per account
crosses it, `--concurrency` crossing requests in flight at a time. Per event:

- after the answer: receipt at the receiver minus the moment the crossing request's answer
  arrived at the client (the crossing is done; what remains is the event's row, the POST);
- after the request: receipt minus the moment the crossing request was sent.

p50 / p99 / max of each, in milliseconds, per database and concurrency; every event must
arrive exactly once with a valid signature. The machine is shared: load average in the JSON.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import httpx
from support.core import suite_config
from support.daemon import redis_and_daemon
from support.machine import load_average
from support.process import scratch
from support.ready import wait_for
from support.sidecar import (
    usage_bench_arguments,
    usage_databases,
    usage_sidecar,
    write_usage_results,
)
from support.webhook_receiver import WebhookReceiver

from sidecars.usage.plans import load_plans
from sidecars.usage.settings import USAGE_PATH, Settings
from sidecars.usage.store import UsageStore

CONFIG = suite_config("bench_usage")
SECRET = "whsec_bench_0123456789abcdef"
LIMIT = 10


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max, in ms."""
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(ordered[-1], 2),
    }


async def provision(settings: Settings, plans_file: str, n: int, tag: str) -> list[str]:
    """`n` accounts with a token each, usage one below the quota; their tokens."""
    store = UsageStore(settings, load_plans(plans_file))
    tokens = []
    try:
        for i in range(n):
            account = await store.create_account(f"hook-{tag}-{i:05d}", "free")
            token, _ = await store.issue_token(account.id)
            key = store.bucket_keys(account.id, store.window(account))[-1]
            await store.redis.set(key, LIMIT - 1)
            tokens.append(token)
    finally:
        await store.close()
    return tokens


async def cross(base: str, tokens: list[str], concurrency: int) -> dict[str, tuple[float, float]]:
    """One crossing request per token: {token: (sent, answered)} in time.time()."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    times: dict[str, tuple[float, float]] = {}
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def one(token: str) -> None:
            async with gate:
                sent = time.time()
                resp = await client.get(USAGE_PATH, headers={"Authorization": f"Bearer {token}"})
                times[token] = (sent, time.time())
                assert resp.status_code == 200, resp.text

        await asyncio.gather(*(one(t) for t in tokens))
    return times


def main() -> None:
    """Run the benchmark and print/write the JSON."""
    args = usage_bench_arguments("usage_webhooks", crossings=300, concurrency="1,8")
    results: dict[str, Any] = {"load average at start": load_average()}
    receiver = WebhookReceiver(SECRET)
    with scratch("usage-webhook-bench-") as (tmp, procs):
        redis, daemon = redis_and_daemon(tmp, procs, CONFIG)
        plans = tmp / "plans.yaml"
        plans.write_text(
            f"plans:\n  free: {{limit: {LIMIT}, window: billing_cycle, thresholds: [100]}}\n"
        )
        for backend, _pg, database in usage_databases(args.backends, tmp, procs):
            env = {
                "USAGE_REDIS_URL": redis.url,
                "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
                "USAGE_PLANS_FILE": str(plans),
                "USAGE_WEBHOOK_URL": receiver.url,
                "USAGE_WEBHOOK_SECRET": SECRET,
                **database,
            }
            sidecar = usage_sidecar(env, tmp / f"gunicorn-{backend}.log")
            procs.append(sidecar)
            sidecar.wait_ready(60)
            sidecar.wait_steady(lambda s=sidecar: s.get("/health").status_code == 200, "health")
            settings = Settings.from_env(env)
            results[backend] = {}
            # Warm-up: each worker's first event makes its HTTP client and SQL connections.
            warm = asyncio.run(provision(settings, str(plans), 20, f"{backend}-warm"))
            asyncio.run(cross(sidecar.base, warm, 4))
            wait_for(
                lambda b=backend: (
                    sum(
                        d.event["account"].startswith(f"hook-{b}-warm-")
                        for d in receiver.deliveries
                    )
                    >= 20
                ),
                120,
                "the warm-up events",
            )
            for concurrency in map(int, args.concurrency.split(",")):
                tag = f"{backend}-c{concurrency}"
                tokens = asyncio.run(provision(settings, str(plans), args.crossings, tag))
                times = asyncio.run(cross(sidecar.base, tokens, concurrency))
                prefix = f"hook-{tag}-"
                wait_for(
                    lambda p=prefix: (
                        sum(d.event["account"].startswith(p) for d in receiver.deliveries)
                        >= args.crossings
                    ),
                    120,
                    "every event",
                )
                got = [d for d in receiver.deliveries if d.event["account"].startswith(prefix)]
                assert len(got) == args.crossings and all(d.signed for d in got)
                by_account = {d.event["account"]: d.at for d in got}
                accounts = [f"{prefix}{i:05d}" for i in range(args.crossings)]
                after_answer, after_request = [], []
                for account, token in zip(accounts, tokens, strict=True):
                    sent, answered = times[token]
                    after_answer.append((by_account[account] - answered) * 1000)
                    after_request.append((by_account[account] - sent) * 1000)
                results[backend][f"concurrency_{concurrency}"] = {
                    "crossings": args.crossings,
                    "slowest_ms": sorted(round(x) for x in after_request)[-5:],
                    "after_answer": percentiles(after_answer),
                    "after_request": percentiles(after_request),
                }
                print(json.dumps({tag: results[backend][f"concurrency_{concurrency}"]}))
            sidecar.terminate()
        write_usage_results(args.out, results, redis.version(), gunicorn_workers=2)
    receiver.close()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
