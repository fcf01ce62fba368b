"""Account page load in a real browser: `GET /account/usage` over 400 rolled-up days, loaded
by headless Chromium over the DevTools protocol, on SQLite and on PostgreSQL.

    .venv/bin/python bench/usage/page_load.py [--loads 20] [--backends sqlite,postgres]
        [--out bench/results/usage_page_load.json]

Starts its own redis-server, ratelimitd on it (the usage suite's rules: the page is counted
as in a deployment) and PostgreSQL (initdb in a temporary directory), then per database:
one account created 400 days ago with 400 rolled-up days (as bench/usage/metering.py seeds
it), the usage API under gunicorn (2 uvicorn workers), and one Chromium that sends the
account's token as `Authorization: Bearer` (Network.setExtraHTTPHeaders) and loads
`/account/usage?from=<399 days ago>&to=<today>` once to warm up, then `--loads` times. Each
load's figures are the browser's own navigation timing (`performance.getEntriesByType(
'navigation')[0]`, read through Runtime.evaluate), relative to its startTime:
responseStart (first byte), responseEnd (last byte) and loadEventEnd (parsed, styled, the
SVG laid out, load event done): p50 / p99 / max (below 100 loads p99 is the slowest). Every
load is checked: status 200 and 400 bars in the chart. The end of a load is found by polling
the page (Runtime.evaluate every 5 ms), which the figures include.

Writes the JSON and a Markdown summary beside it. The machine is shared (load average in
both): quote figures from one run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from support.browser import BINARY, DevTools
from support.core import suite_config
from support.daemon import redis_and_daemon
from support.machine import describe, load_average, version
from support.postgres_server import pg_binary
from support.process import scratch
from support.sidecar import (
    record_database,
    usage_bench_arguments,
    usage_databases,
    usage_sidecar,
    write_usage_results,
)

from sidecars.usage.plans import load_plans
from sidecars.usage.settings import PAGE_PATH, Settings
from sidecars.usage.store import UsageStore
from sidecars.usage.windows import DAY, utc_date

DAYS = 400
ACCOUNT = "page-account"
# The navigation timing figures kept, each relative to the entry's startTime.
MARKS = ("responseStart", "responseEnd", "loadEventEnd")
BARS = "document.querySelectorAll('svg rect[data-date]').length"


async def seed(settings: Settings) -> str:
    """One account with DAYS rolled-up days; a token for it."""
    store = UsageStore(settings, load_plans())
    try:
        now = time.time()
        await store.db.execute_many(
            "INSERT INTO accounts (id, plan, window_kind, start_date, end_date, created, updated) "
            "VALUES (?, 'pro', '', '2026-01-01', NULL, ?, ?)",
            [(ACCOUNT, int(now - DAYS * DAY), int(now))],
        )
        today = utc_date(now)
        await store.db.execute_many(
            "INSERT INTO daily_usage (account_id, day, usage, plan, plan_limit, updated) "
            "VALUES (?, ?, ?, 'pro', 1000000, ?)",
            [(ACCOUNT, (today - timedelta(days=k)).isoformat(), 100 + k, int(now))
             for k in range(DAYS)],
        )  # fmt: skip
        token, _ = await store.issue_token(ACCOUNT)
        return token
    finally:
        await store.close()


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / max of `samples` (ms)."""
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 1),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        "max_ms": round(ordered[-1], 1),
    }


def page_loads(url: str, token: str, loads: int) -> dict[str, Any]:
    """One warm-up load of `url`, then `loads` loads: percentiles of each mark."""
    samples: dict[str, list[float]] = {mark: [] for mark in MARKS}
    with DevTools() as browser:
        browser.call("Network.enable")
        browser.call("Network.setExtraHTTPHeaders", headers={"Authorization": f"Bearer {token}"})
        for n in range(loads + 1):
            entry = browser.load(url)
            bars = browser.evaluate(BARS)
            if entry.get("responseStatus", 200) != 200 or bars != DAYS:
                raise AssertionError(f"load {n}: status {entry.get('responseStatus')}, {bars} bars")
            if n:  # the first is the warm-up
                for mark in MARKS:
                    samples[mark].append(entry[mark] - entry["startTime"])
    return {
        "loads": loads,
        "bytes": entry.get("transferSize"),
        **{mark: percentiles(values) for mark, values in samples.items()},
    }


def served(env: dict[str, str], log: Path, token: str, loads: int) -> dict[str, Any]:
    """The page's loads from the usage API under gunicorn (started, then stopped)."""
    sidecar = usage_sidecar(env, log)
    try:
        sidecar.wait_ready(60)
        sidecar.wait_steady(lambda: sidecar.get("/health").status_code == 200, "health")
        today = utc_date(time.time())
        query = f"?from={today - timedelta(days=DAYS - 1)}&to={today}"
        return page_loads(sidecar.base + PAGE_PATH + query, token, loads)
    finally:
        sidecar.terminate()


def markdown(results: dict[str, Any], loads: int) -> str:
    """The summary written beside the JSON."""
    rows = [
        f"| {db} | {r['responseEnd']['p50_ms']} | {r['responseEnd']['p99_ms']} "
        f"| **{r['loadEventEnd']['p50_ms']}** | **{r['loadEventEnd']['p99_ms']}** "
        f"| {r['loadEventEnd']['max_ms']} | {r['load average after']} |"
        for db, r in results["databases"].items()
    ]
    return "\n".join(
        [
            "# Usage API: the account page in a real browser (400 days)",
            "",
            "```sh",
            f".venv/bin/python bench/usage/page_load.py --loads {loads}",
            "```",
            "",
            f"Headless Chromium over the DevTools protocol, {loads} loads after one warm-up of",
            f"`{PAGE_PATH}?from=<399 days ago>&to=<today>` (400 bars, checked on every load),",
            "the usage API under gunicorn (2 uvicorn workers) with ratelimitd and Redis; the",
            "browser's own navigation timing, ms from the navigation's start (responseEnd: last",
            "byte received; loadEventEnd: the page parsed, laid out and its load event done).",
            "p99 is the 99th percentile's sample (below 100 loads: the slowest load). The",
            "figures include the benchmark's own polling of the page (Runtime.evaluate every",
            "5 ms until loadEventEnd is set), on a machine shared with other work.",
            "",
            "| database | responseEnd p50 | responseEnd p99 | load p50 | load p99 | load max "
            "| load average after |",
            "|---|---:|---:|---:|---:|---:|---|",
            *rows,
            "",
            f"Load average (1, 5, 15 min) at the start: {results['load average at start']}.",
            "",
            "## Machine",
            "",
            *describe(results["machine"]),
            "",
        ]
    )


def main() -> None:
    """Run the benchmark, print the JSON, write it and its Markdown summary."""
    args = usage_bench_arguments("usage_page_load", loads=20)
    results: dict[str, Any] = {"load average at start": load_average(), "databases": {}}
    with scratch("usage-page-load-bench-") as (tmp, procs):
        redis, daemon = redis_and_daemon(tmp, procs, suite_config("usage_daemon"))
        for backend, _pg, database in usage_databases(args.backends, tmp, procs):
            env = {
                "USAGE_REDIS_URL": redis.url,
                "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
                "USAGE_ROLLUP_INTERVAL_SECONDS": "0",
                **database,
            }
            token = asyncio.run(seed(Settings.from_env(env)))
            entry = served(env, tmp / f"gunicorn-{backend}.log", token, args.loads)
            record_database(results["databases"], backend, entry)
        out = write_usage_results(
            args.out,
            results,
            redis.version(),
            chromium=version([BINARY, "--version"]),
            postgres=version([pg_binary("postgres"), "--version"]),
        )
    out.with_suffix(".md").write_text(markdown(results, args.loads))


if __name__ == "__main__":
    main()
