"""The system of record (accounts, plans, subscriptions, tokens) in SQL, against a real SQLite
file and a real PostgreSQL server: migrations from empty, concurrent migrators, the queries,
and accounts and tokens surviving a Redis restart and a FLUSHALL."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Iterator
from datetime import date
from pathlib import Path

import httpx
import pytest
from support import Clock, free_port
from support.process import start_bound
from support.redis_server import RedisServer
from support.sidecar import usage_database

from sidecars.usage.db import AccountError, Database, StoreUnavailable, open_database
from sidecars.usage.db.schema import LATEST
from sidecars.usage.settings import USAGE_PATH, Settings
from sidecars.usage.store import UsageStore

from .conftest import BACKENDS, postgres_for, start_sidecar
from .test_usage_gunicorn import cli
from .usage_helpers import TEST_PLANS, bearer, serving, settings_for, unique

NOW = 1_800_000_000.0


@pytest.fixture
async def database(db_settings: Settings) -> AsyncIterator[Database]:
    """The database of `db_settings`, closed after the test."""
    db = open_database(db_settings)
    yield db
    await db.close()


async def test_migrations_from_empty_and_idempotent(database: Database) -> None:
    assert await database.version() == LATEST
    # A second process opening the same database finds it current and changes nothing.
    assert await database.migrate() == LATEST
    if database.kind == "sqlite":
        assert await database.journal_mode() == "wal"  # type: ignore[attr-defined]


async def test_concurrent_migrators_serialise(db_settings: Settings) -> None:
    # Two workers starting at once on an empty database: one migrates, the other waits.
    dbs = [open_database(db_settings) for _ in range(3)]
    try:
        assert await asyncio.gather(*(db.migrate() for db in dbs)) == [LATEST] * 3
        assert await dbs[0].version() == LATEST
    finally:
        for db in dbs:
            await db.close()


async def test_accounts_and_tokens_round_trip(db_settings: Settings) -> None:
    store = UsageStore(db_settings, TEST_PLANS)
    try:
        acct = unique()
        created = await store.create_account(acct, "startup", start=date(2026, 1, 31))
        assert (created.plan, created.window, created.start, created.end) == (
            "startup",
            "billing_cycle",
            date(2026, 1, 31),
            None,
        )
        with pytest.raises(AccountError, match="exists"):
            await store.create_account(acct, "free")
        updated = await store.update_account(
            acct, plan="free", window="billing_cycle", end=date(2027, 1, 31)
        )
        assert (updated.plan, updated.window, updated.window_override) == (
            "free",
            "billing_cycle",
            True,
        )
        assert updated.end == date(2027, 1, 31)
        reopened = await store.update_account(acct, window="", end=None)
        assert reopened.window == "rolling_30_days" and reopened.end is None
        with pytest.raises(AccountError, match="no account"):
            await store.update_account(unique(), plan="pro")

        token, info = await store.issue_token(acct, "ci")
        owner = await store.authenticate(token)
        assert owner is not None and owner.id == acct and owner.plan == "free"
        assert await store.authenticate(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
        listed = await store.list_tokens(acct)
        assert [t.id for t in listed] == [info.id] and listed[0].label == "ci"
        revoked = await store.revoke_token(acct, info.id)
        assert revoked.revoked is not None
        assert await store.authenticate(token) is None
        with pytest.raises(AccountError, match="no token"):
            await store.revoke_token(acct, "tok_nope")
    finally:
        await store.close()


async def test_unreachable_database_is_store_unavailable_within_the_timeout(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    settings = dataclasses.replace(
        settings_for(redis_server.url), postgres_dsn=dsn, database_timeout_seconds=0.5
    )
    db = open_database(settings)
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(StoreUnavailable, match="postgresql"):
            await db.account("x")
        assert asyncio.get_running_loop().time() - started < 2
    finally:
        await db.close()
    # An SQLite file that cannot be created.
    (tmp_path / "file").write_text("")
    bad = dataclasses.replace(settings, postgres_dsn="", sqlite_path=str(tmp_path / "file/x.db"))
    db = open_database(bad)
    try:
        with pytest.raises((StoreUnavailable, OSError)):
            await db.account("x")
    finally:
        await db.close()


def test_sqlite_file_holds_the_schema_version_table(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    path = tmp_path / "v.sqlite3"
    settings = dataclasses.replace(settings_for(redis_server.url), sqlite_path=str(path))

    async def open_it() -> None:
        db = open_database(settings)
        await db.ping()
        await db.close()

    asyncio.run(open_it())
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(LATEST,)]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"accounts", "tokens", "schema_version"} <= tables


@pytest.fixture(params=BACKENDS)
def own_redis_env(
    request: pytest.FixtureRequest, tmp_path: Path, daemon: object
) -> Iterator[tuple[dict[str, str], RedisServer]]:
    """USAGE_* settings for a sidecar on its own Redis (so the test may flush and restart it)
    and a database of each kind."""
    redis = start_bound(lambda: RedisServer(tmp_path / "redis"))
    env = {
        "USAGE_REDIS_URL": redis.url,
        "USAGE_RATELIMIT_ADDRESS": "",
        "USAGE_REDIS_TIMEOUT_SECONDS": "2",
        **usage_database(request.param, tmp_path, postgres_for(request)),
    }
    yield env, redis
    redis.close()


def test_accounts_and_tokens_survive_redis_flushall_and_restart(
    own_redis_env: tuple[dict[str, str], RedisServer], tmp_path: Path
) -> None:
    env, redis = own_redis_env
    sidecar = start_sidecar(env, tmp_path / "gunicorn.log")
    try:
        acct = unique()
        cli(env, "accounts", "create", acct, "--plan", "pro")
        token = cli(env, "tokens", "issue", acct)["token"]
        with httpx.Client(base_url=sidecar.base, timeout=10) as client:
            assert client.get(USAGE_PATH, headers=bearer(token)).status_code == 200
            redis.client().flushall()
            after_flush = client.get(USAGE_PATH, headers=bearer(token))
            assert after_flush.status_code == 200, after_flush.text
            assert after_flush.json()["planName"] == "pro"
            redis.stop()  # no persistence: everything in it is gone
            redis.start()
            after_restart = client.get(USAGE_PATH, headers=bearer(token))
            assert after_restart.status_code == 200, after_restart.text
        assert cli(env, "accounts", "show", acct)["plan"] == "pro"
    finally:
        sidecar.terminate()


@contextlib.asynccontextmanager
async def upgraded(
    settings: Settings, version: int, *rows: tuple[str, tuple[object, ...]]
) -> AsyncIterator[Database]:
    """A database that held `rows` (statement, values) at schema `version`, then migrated to
    the latest."""
    db = open_database(settings)
    try:
        assert await db.migrate(target=version) == version
        async with db._transaction() as tx:
            for statement, values in rows:
                await tx.execute(statement, values)
        assert await db.migrate() == LATEST
        yield db
    finally:
        await db.close()


async def test_upgrade_from_version_1_keeps_rows(db_settings: Settings) -> None:
    async with upgraded(
        db_settings,
        1,
        (
            "INSERT INTO accounts (id, plan, window_kind, start_date, end_date, created, "
            "updated) VALUES (?, ?, ?, ?, ?, ?, ?)",
            ("old", "pro", "", "2026-01-01", None, 1, 1),
        ),
        (
            "INSERT INTO tokens (id, account_id, sha256, label, created, revoked) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            ("tok_old", "old", "ab" * 32, "", 1, None),
        ),
    ) as db:
        assert await db.version() == LATEST
        account = await db.account("old")
        assert account is not None and account.plan == "pro" and account.suspended is None
        owner = await db.token_owner("ab" * 32)
        assert owner is not None and owner[0].expires is None and owner[1].id == "old"


async def test_expired_tokens_401_suspended_accounts_403_last_use_recorded(
    db_settings: Settings,
) -> None:
    clock = Clock(NOW)
    async with serving(db_settings, middleware=[], clock=clock) as (client, store):
        acct = unique()
        await store.create_account(acct, "pro")
        token, _ = await store.issue_token(acct, expires=int(NOW) + 60)
        assert (await client.get(USAGE_PATH, headers=bearer(token))).status_code == 200
        listed = await store.list_tokens(acct)
        assert listed[0].last_used == int(NOW) and listed[0].expires == int(NOW) + 60
        clock.now = NOW + 60  # expired from this instant on
        expired = await client.get(USAGE_PATH, headers=bearer(token))
        assert expired.status_code == 401 and expired.json()["error"] == "invalid_token"
        token2, _ = await store.issue_token(acct)
        await store.suspend(acct, True)
        suspended = await client.get(USAGE_PATH, headers=bearer(token2))
        assert suspended.status_code == 403, suspended.text
        assert suspended.json() == {
            "status": 403,
            "error": "account_suspended",
            "message": "The account is suspended.",
        }
        await store.suspend(acct, False)
        assert (await client.get(USAGE_PATH, headers=bearer(token2))).status_code == 200
        await store.delete_account(acct)
        assert (await client.get(USAGE_PATH, headers=bearer(token2))).status_code == 401
        # The id stays the deleted account's: its counters and history are never inherited.
        with pytest.raises(AccountError, match="ids are never reused"):
            await store.create_account(acct, "free")
        assert await store.account(acct) is None


async def test_upgrade_to_version_4_keeps_deleted_ids_taken(db_settings: Settings) -> None:
    """An account deleted before version 4 left its days in the history: its id stays
    taken after the upgrade (a new owner would inherit them and its Redis counters)."""
    async with upgraded(
        db_settings,
        3,
        (
            "INSERT INTO daily_usage (account_id, day, usage, plan, plan_limit, updated) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            ("gone", "2026-01-02", 7, "free", 1000, 1),
        ),
    ) as db:
        with pytest.raises(AccountError, match="ids are never reused"):
            await db.create_account("gone", "free", "", date(2026, 1, 1), None)
        assert (await db.create_account("fresh", "free", "", date(2026, 1, 1), None)).id == "fresh"
