"""Exact quotas: the atomic check-and-count in Redis, refunds of error answers, the rolling
window's Retry-After, subscriptions not started, plan changes mid-window; and admitted ==
planLimit at concurrency 300 over 2 gunicorn workers."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path

import httpx
import pytest
import yaml
from support import Clock
from support.daemon import DaemonProcess
from support.redis_server import RedisServer

from ratelimitd.config.keys import meter_key
from sidecars.usage.counters import retry_after
from sidecars.usage.settings import USAGE_PATH
from sidecars.usage.windows import DAY, day_start, usage_window

from .conftest import RATELIMIT_CONFIG, start_sidecar
from .test_usage_gunicorn import account
from .usage_helpers import account_with_token, bearer, serving, session_sqlite_path, settings_for

NOW = datetime(2026, 3, 10, 15, 30, tzinfo=UTC).timestamp()


def bucket(redis_server: RedisServer, acct: str, day: float) -> int:
    """One day's usage as stored."""
    value = redis_server.client().get(meter_key("", "api", [("account", acct)], int(day)))
    return int(value or 0)


async def test_usage_written_elsewhere_counts_at_once(redis_server: RedisServer) -> None:
    settings = settings_for(redis_server.url, quota_exempt_paths=())
    async with serving(settings) as (client, store):
        acct, token = await account_with_token(store, "free")  # limit 5
        assert (await client.get(USAGE_PATH, headers=bearer(token))).status_code == 200
        key = meter_key("", "api", [("account", acct)], int(time.time()))
        assert redis_server.client().ttl(key) > 31 * DAY  # kept longer than any window
        # Another worker's hits (3) are seen by the next check: no cached sum to go stale.
        redis_server.client().incrby(meter_key("", "api", [("account", acct)], int(time.time())), 3)
        assert (await client.get(USAGE_PATH, headers=bearer(token))).status_code == 200
        refused = await client.get(USAGE_PATH, headers=bearer(token))
        assert refused.status_code == 429 and refused.json()["error"] == "quota_exceeded"
        assert bucket(redis_server, acct, time.time()) == 5


@pytest.mark.parametrize("count_errors", [False, True])
async def test_error_answers_are_refunded_unless_configured(
    redis_server: RedisServer, count_errors: bool
) -> None:
    settings = settings_for(
        redis_server.url, quota_exempt_paths=(), count_error_responses=count_errors
    )
    async with serving(settings) as (client, store):
        acct, token = await account_with_token(store, "startup")
        auth = bearer(token)
        assert (await client.get(USAGE_PATH, headers=auth)).status_code == 200
        assert (await client.get("/nowhere", headers=auth)).status_code == 404
        assert (await client.post(USAGE_PATH, headers=auth)).status_code == 405
        assert (
            await client.get(USAGE_PATH, params={"format": "x"}, headers=auth)
        ).status_code == 400
        assert (await client.head(USAGE_PATH, headers=auth)).status_code == 200
        # Refused by the middleware: never counted.
        assert (await client.get(USAGE_PATH, headers=bearer("usk_" + "Z" * 43))).status_code == 401
        expected = 5 if count_errors else 2
        assert bucket(redis_server, acct, time.time()) == expected


def test_retry_after_on_a_rolling_window_is_when_enough_usage_ages_out() -> None:
    now = NOW
    window = usage_window("rolling_30_days", date(2020, 1, 1), now)
    counts = [0] * 31
    counts[0], counts[1], counts[5], counts[30] = 3, 4, 2, 1  # 10 used, limit 10
    to_midnight = window.end - now
    # At the next 00:00Z the oldest day (3) leaves: 7 < 10, room again.
    assert retry_after(window, counts, 10, now) == int(to_midnight)
    # Limit 6: days 0 and 1 must leave (after the second midnight): 3 < 6.
    assert retry_after(window, counts, 6, now) == int(to_midnight + DAY)
    # Limit 2: days 0..5 must leave: the sixth midnight.
    assert retry_after(window, counts, 2, now) == int(to_midnight + 5 * DAY)
    # A billing cycle: when the next one starts.
    cycle = usage_window("billing_cycle", date(2026, 1, 15), now)
    assert retry_after(cycle, [10], 10, now) == int(cycle.end - now)


async def test_quota_exceeded_retry_after_on_the_rolling_window(redis_server: RedisServer) -> None:
    clock = Clock(NOW)
    settings = settings_for(redis_server.url, quota_exempt_paths=())
    async with serving(settings, clock=clock) as (client, store):
        acct, token = await account_with_token(store, "free", start=date(2025, 1, 1))  # 5
        today = day_start(NOW)
        for day, hits in ((today - 30 * DAY, 2), (today - 3 * DAY, 2), (today, 1)):
            redis_server.client().incrby(meter_key("", "api", [("account", acct)], day), hits)
        refused = await client.get(USAGE_PATH, headers=bearer(token))
        assert refused.status_code == 429
        # The oldest day (2 hits) ages out at the next 00:00Z: 3 < 5.
        assert int(refused.headers["retry-after"]) == int(today + DAY - NOW)
        clock.now = today + DAY
        assert (await client.get(USAGE_PATH, headers=bearer(token))).status_code == 200


async def test_subscription_not_started_is_403_but_can_read_its_usage(
    redis_server: RedisServer,
) -> None:
    clock = Clock(NOW)
    async with serving(settings_for(redis_server.url), clock=clock) as (client, store):
        acct, token = await account_with_token(store, "pro", start=date(2026, 4, 1))
        early = await client.get("/anything", headers=bearer(token))
        assert early.status_code == 403 and early.json()["error"] == "subscription_not_started"
        assert "2026-04-01" in early.json()["message"]
        # The usage endpoint (quota-exempt) answers: the first cycle, nothing counted.
        usage = await client.get(USAGE_PATH, headers=bearer(token))
        assert usage.status_code == 200 and usage.json()["currentUsage"] == 0
        assert bucket(redis_server, acct, NOW) == 0
        clock.now = datetime(2026, 4, 1, tzinfo=UTC).timestamp()
        assert (await client.get(USAGE_PATH, headers=bearer(token))).json()["currentUsage"] == 1


async def test_plan_change_mid_window_applies_to_the_whole_window_at_once(
    redis_server: RedisServer,
) -> None:
    async with serving(settings_for(redis_server.url, quota_exempt_paths=())) as (client, store):
        acct, token = await account_with_token(store, "startup", window="rolling_30_days")
        statuses = [(await client.get(USAGE_PATH, headers=bearer(token))).status_code]
        redis_server.client().incrby(meter_key("", "api", [("account", acct)], int(time.time())), 6)
        # Downgrade to free (5): the 7 already used count against the new limit at once.
        await store.update_account(acct, plan="free")
        statuses.append((await client.get(USAGE_PATH, headers=bearer(token))).status_code)
        # Upgrade again: the headroom of the new limit (20 - 7) is there at once.
        await store.update_account(acct, plan="startup")
        statuses.append((await client.get(USAGE_PATH, headers=bearer(token))).status_code)
        assert statuses == [200, 429, 200]
        assert bucket(redis_server, acct, time.time()) == 8


def test_shipped_ratelimit_config_does_not_meter() -> None:
    # The sidecar counts usage; a `meter: true` rule would count every request twice.
    text = RATELIMIT_CONFIG.read_text()
    assert "meter: true" not in yaml.safe_dump(yaml.safe_load(text))


def test_admitted_equals_plan_limit_at_concurrency_300_with_2_workers(
    redis_server: RedisServer, daemon: DaemonProcess, tmp_path: Path
) -> None:
    limit, concurrency, requests = 100, 300, 600
    plans = tmp_path / "plans.yaml"
    plans.write_text(f"plans:\n  free: {{limit: {limit}}}\n")
    env = {
        "USAGE_REDIS_URL": redis_server.url,
        "USAGE_SQLITE_PATH": session_sqlite_path(),
        "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
        "USAGE_RATELIMIT_TIMEOUT_SECONDS": "5",
        "USAGE_REDIS_TIMEOUT_SECONDS": "5",
        "USAGE_DATABASE_TIMEOUT_SECONDS": "10",
        "USAGE_PLANS_FILE": str(plans),
        "USAGE_QUOTA_EXEMPT_PATHS": "",
        "USAGE_REDIS_POOL_SIZE": "64",
    }
    sidecar = start_sidecar(env, tmp_path / "gunicorn.log", workers=2)
    acct, token, _ = account(env, "free")

    async def burst() -> tuple[Counter[int], set[str]]:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
        gate = asyncio.Semaphore(concurrency)
        pids: set[str] = set()
        async with httpx.AsyncClient(base_url=sidecar.base, timeout=60, limits=limits) as client:

            async def one() -> int:
                async with gate:
                    resp = await client.get(USAGE_PATH, headers=bearer(token))
                    return resp.status_code

            statuses = await asyncio.gather(*(one() for _ in range(requests)))
        return Counter(statuses), pids

    try:
        started = time.monotonic()
        statuses, _ = asyncio.run(burst())
        elapsed = time.monotonic() - started
        stored = bucket(redis_server, acct, time.time())
        print(
            f"\nexact quota: planLimit={limit} concurrency={concurrency} workers=2 "
            f"requests={requests}: admitted (200)={statuses[200]} refused (429)={statuses[429]} "
            f"other={sum(v for k, v in statuses.items() if k not in (200, 429))} "
            f"stored usage={stored} in {elapsed:.1f} s"
        )
        assert statuses[200] == limit, statuses
        assert statuses[429] == requests - limit, statuses
        assert stored == limit
    finally:
        sidecar.terminate()
