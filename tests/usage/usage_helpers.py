"""Helpers shared by the usage tests: settings, accounts with tokens, in-process clients."""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date
from functools import cache
from typing import Any

import httpx
from support.daemon import DaemonProcess
from support.redis_server import RedisServer
from support.sidecar import Gunicorn

from sidecars.usage.app import create_app
from sidecars.usage.db import open_database
from sidecars.usage.db.events import EventRecord, EventTable
from sidecars.usage.plans import DEFAULTS, Plan, load_plans
from sidecars.usage.settings import USAGE_PATH, Settings
from sidecars.usage.store import UsageStore

# Small quotas so tests can reach them; windows as the shipped defaults.
TEST_PLANS = {
    "free": Plan("free", 5, "rolling_30_days"),
    "startup": Plan("startup", 20, "billing_cycle"),
    "pro": DEFAULTS["pro"],
}


@cache
def session_sqlite_path() -> str:
    """The SQLite file of the in-process apps of this test run (removed at exit)."""
    directory = tempfile.mkdtemp(prefix="usage-tests-")
    atexit.register(shutil.rmtree, directory, True)
    return directory + "/usage.sqlite3"


def settings_for(redis_url: str, **overrides: Any) -> Settings:
    """Settings for an in-process app on a test Redis and SQLite file (no ratelimitd unless
    given).

    Generous timeouts, so a loaded CI machine cannot turn a slow answer into a 503 or a
    fail-open decision (which would not be metered); the tests about timeouts set their own.
    """
    base = Settings(
        redis_url=redis_url,
        sqlite_path=session_sqlite_path(),
        ratelimit_address="",
        redis_timeout_seconds=2.0,
        ratelimit_timeout_seconds=2.0,
        # In-process clients all come from 127.0.0.1: the abuse tests set their own limit.
        invalid_token_limit=1_000_000,
    )
    return dataclasses.replace(base, **overrides)


def daemon_settings(redis_server: RedisServer, daemon: DaemonProcess, **overrides: Any) -> Settings:
    """`settings_for` the test Redis with decisions from the test ratelimitd."""
    return settings_for(redis_server.url, ratelimit_address=daemon.grpc_target, **overrides)


def unique(prefix: str = "acct") -> str:
    """An account id no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def account_with_token(
    store: UsageStore,
    plan: str = "free",
    *,
    account_id: str | None = None,
    window: str = "",
    start: date | None = None,
    end: date | None = None,
) -> tuple[str, str]:
    """Create an account and issue it a token; (account id, raw token)."""
    account_id = account_id or unique()
    await store.create_account(account_id, plan, window=window, start=start, end=end)
    token, _ = await store.issue_token(account_id)
    return account_id, token


def bearer(token: str) -> dict[str, str]:
    """The Authorization header for a token."""
    return {"Authorization": f"Bearer {token}"}


# Stores made by `client_for`, closed after each test by conftest's `close_stores` even when
# the test failed before its own `store.close()` (an open store keeps the loop from closing).
OPEN_STORES: list[UsageStore] = []


def client_for(settings: Settings, **kwargs: Any) -> tuple[httpx.AsyncClient, UsageStore]:
    """An in-process client of `create_app(settings)` and the store the app uses."""
    plans = kwargs.pop("plans", TEST_PLANS)
    store = UsageStore(settings, plans, clock=kwargs.pop("clock", time.time))
    OPEN_STORES.append(store)
    app = create_app(settings, store=store, **kwargs)
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://usage.test"), store


@asynccontextmanager
async def serving(
    settings: Settings, **kwargs: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, UsageStore]]:
    """`client_for(settings, **kwargs)` with the client open for the block and the store closed
    after it."""
    client, store = client_for(settings, **kwargs)
    async with client:
        yield client, store
    await store.close()


def hammer(
    sidecar: Gunicorn,
    requests: list[tuple[str, dict[str, str]]],
    path: str = USAGE_PATH,
    concurrency: int = 16,
) -> list[httpx.Response]:
    """Send `(token, extra headers)` requests to `path` with `concurrency` in flight, each on
    a fresh connection (so both workers answer); the responses, in order."""

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=sidecar.base, timeout=60, limits=limits) as client:

            async def one(token: str, extra: dict[str, str]) -> httpx.Response:
                async with gate:
                    return await client.get(path, headers={**bearer(token), **extra})

            return list(await asyncio.gather(*(one(t, h) for t, h in requests)))

    return asyncio.run(run())


def provision(env: dict[str, str], *plans: str) -> list[tuple[str, str]]:
    """One new account per plan, each with a token, in the database of the USAGE_* settings
    `env` (in process: quicker than the CLI); [(account id, token)]."""

    async def run() -> list[tuple[str, str]]:
        store = UsageStore(Settings.from_env(env), load_plans(env.get("USAGE_PLANS_FILE")))
        try:
            return [await account_with_token(store, plan) for plan in plans]
        finally:
            await store.close()

    return asyncio.run(run())


def current_usage(env: dict[str, str], account_id: str) -> int:
    """The account's usage in its current window, as the usage endpoint sums it."""

    async def run() -> int:
        store = UsageStore(Settings.from_env(env), load_plans(env.get("USAGE_PLANS_FILE")))
        try:
            account = await store.account(account_id)
            assert account is not None
            return (await store.usage(account))[1]
        finally:
            await store.close()

    return asyncio.run(run())


def events_of(env: dict[str, str], account_id: str) -> list[EventRecord]:
    """The account's webhook events in the database of the USAGE_* settings `env`."""

    async def run() -> list[EventRecord]:
        db = open_database(Settings.from_env(env))
        try:
            return await EventTable(db).recent(account_id)
        finally:
            await db.close()

    return asyncio.run(run())
