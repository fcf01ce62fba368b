"""The rollup of day buckets from Redis into SQL, on SQLite and PostgreSQL: idempotent
upserts, the plan of each day, catching up after a gap, retention, passes running at once,
and a pass killed half-way then run again (from every worker's command line at once)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import date, timedelta

import psycopg
import pytest
from support import REPO, Clock
from support.ready import wait_for
from support.redis_server import RedisServer

from sidecars.usage.db import open_database
from sidecars.usage.db.daily import DailyTable, DailyUsage
from sidecars.usage.db.events import EventRecord, EventTable
from sidecars.usage.rollup import REDIS_DAYS, Rollup
from sidecars.usage.settings import Settings
from sidecars.usage.store import UsageStore
from sidecars.usage.windows import DAY, epoch, utc_date

from .usage_helpers import TEST_PLANS, unique

NOW = 1_800_000_000.0  # 2027-01-15 08:00Z
TODAY = utc_date(NOW)


def day(n: int) -> date:
    """`n` days after today (negative: before)."""
    return TODAY + timedelta(days=n)


def seed(redis: RedisServer, store: UsageStore, account_id: str, days: dict[int, int]) -> None:
    """Write day buckets as the counters would have: {days from today: usage}."""
    keys = store.bucket_keys_for_days(account_id, [epoch(day(n)) for n in days])
    redis.client().mset(dict(zip(keys, days.values(), strict=True)))


async def rows(store: UsageStore, account_id: str) -> dict[date, DailyUsage]:
    """Every stored day of an account."""
    series = await DailyTable(store.db).series(account_id, day(-500), day(500))
    return {r.day: r for r in series}


@pytest.fixture
async def clocked(db_settings: Settings) -> AsyncIterator[tuple[UsageStore, Clock]]:
    """A store on a fresh database of each kind, its clock 40 days before NOW."""
    clock = Clock(NOW - 40 * DAY)
    store = UsageStore(db_settings, TEST_PLANS, clock=clock)
    yield store, clock
    await store.close()


async def test_a_pass_copies_each_day_and_running_it_again_changes_nothing(
    clocked: tuple[UsageStore, Clock], redis_server: RedisServer
) -> None:
    store, clock = clocked
    old = (await store.create_account(unique(), "startup")).id  # created 40 days ago
    clock.now = NOW - 2 * DAY
    new = (await store.create_account(unique(), "free")).id  # 2 days ago
    clock.now = NOW
    # Older than Redis keeps, inside, yesterday, today; before `new` existed.
    seed(redis_server, store, old, {-40: 9, -REDIS_DAYS: 1, -10: 2, -1: 3, 0: 4})
    seed(redis_server, store, new, {-3: 7, -2: 5, 0: 6})
    rollup = Rollup(store)
    report = await rollup.run_once()
    assert (report.first, report.last, report.accounts) == (day(-REDIS_DAYS), TODAY, 2)
    assert report.rows == (REDIS_DAYS + 1) + 3
    assert report.closed_through == day(-1)
    stored = await rows(store, old)
    assert sorted(stored) == [day(n) for n in range(-REDIS_DAYS, 1)]
    assert {d: r.usage for d, r in stored.items() if r.usage} == {
        day(-REDIS_DAYS): 1,
        day(-10): 2,
        day(-1): 3,
        day(0): 4,
    }
    assert {(r.plan, r.limit) for r in stored.values()} == {("startup", 20)}
    assert {d: r.usage for d, r in (await rows(store, new)).items()} == {
        day(-2): 5,
        day(-1): 0,
        day(0): 6,
    }
    before = {**(await rows(store, old)), **(await rows(store, new))}
    # Again, and twice at once (two workers): the same rows.
    await rollup.run_once()
    await asyncio.gather(Rollup(store).run_once(), Rollup(store).run_once())
    assert {**(await rows(store, old)), **(await rows(store, new))} == before


async def test_the_plan_of_each_day_and_what_a_later_pass_rereads(
    clocked: tuple[UsageStore, Clock], redis_server: RedisServer
) -> None:
    store, clock = clocked
    acct = (await store.create_account(unique(), "startup")).id
    clock.now = NOW
    seed(redis_server, store, acct, {-3: 1, -1: 2, 0: 3})
    await Rollup(store).run_once()
    # Late hits: yesterday and today are read again; a closed day is not.
    seed(redis_server, store, acct, {-3: 100, -1: 20, 0: 30})
    await store.update_account(acct, plan="pro")  # changed today
    await Rollup(store).run_once()
    stored = await rows(store, acct)
    assert [stored[day(n)].usage for n in (-3, -1, 0)] == [1, 20, 30]
    # Today has the plan it has now; the days before keep the plan they had.
    assert (stored[day(0)].plan, stored[day(0)].limit) == ("pro", 1_000_000)
    assert (stored[day(-1)].plan, stored[day(-1)].limit) == ("startup", 20)


async def test_a_gap_is_caught_up_and_retention_drops_old_days(
    clocked: tuple[UsageStore, Clock], redis_server: RedisServer
) -> None:
    store, clock = clocked
    store.settings = dataclasses.replace(store.settings, retention_days=10)
    acct = (await store.create_account(unique(), "free")).id  # 40 days ago
    clock.now = NOW
    seed(redis_server, store, acct, {-1: 1})
    await Rollup(store).run_once()  # rolls 34 days back, then keeps 10
    stored = await rows(store, acct)
    assert min(stored) == day(-9) and max(stored) == day(0)
    events = EventTable(store.db)
    old_event = _event(acct, NOW - 11 * DAY)
    assert await events.create(old_event)
    # No pass for six days: the next one writes every day since the last closed one.
    clock.now = NOW + 6 * DAY
    seed(redis_server, store, acct, {n: n for n in range(1, 7)})
    report = await Rollup(store).run_once()
    assert report.first == day(0) and report.closed_through == day(5)
    stored = await rows(store, acct)
    assert [stored[day(n)].usage for n in range(1, 7)] == [1, 2, 3, 4, 5, 6]
    assert min(stored) == day(-3)  # 10 days ending today
    assert await events.get(old_event.id) is None  # events follow the same retention


def _event(account_id: str, at: float) -> EventRecord:
    ms = int(at * 1000)
    return EventRecord(
        "evt_old_" + account_id, account_id, 100, int(at), ms, "{}", "delivered", 1, 0, 0, ms
    )


def test_a_pass_killed_half_way_is_completed_by_the_next(
    db_settings: Settings, redis_server: RedisServer
) -> None:
    # Pages of 500 accounts: a kill after the first lands half-way (PostgreSQL's pages are
    # slower, so fewer suffice there).
    n_accounts = 1000 if db_settings.postgres_dsn else 2000
    total = n_accounts * (REDIS_DAYS + 1)
    ids = [f"kill-{unique()}-{i:05d}" for i in range(n_accounts)]
    now = time.time()
    today = utc_date(now)
    days = [today - timedelta(days=k) for k in range(REDIS_DAYS, -1, -1)]

    async def setup() -> None:
        store = UsageStore(db_settings, TEST_PLANS)
        created = int(now - 40 * DAY)
        try:
            await store.db.execute_many(
                "INSERT INTO accounts (id, plan, window_kind, start_date, end_date, created, "
                "updated) VALUES (?, 'pro', '', ?, NULL, ?, ?)",
                [(a, "2026-01-01", created, created) for a in ids],
            )
        finally:
            await store.close()

    asyncio.run(setup())
    keys_of = UsageStore(db_settings, TEST_PLANS).bucket_keys_for_days  # no connection made
    pipe = redis_server.client().pipeline(transaction=False)
    for i, account_id in enumerate(ids):
        keys = keys_of(account_id, [epoch(d) for d in days])
        pipe.mset({k: i + j for j, k in enumerate(keys)})
    pipe.execute()
    env = {**os.environ, "PYTHONPATH": str(REPO), "USAGE_REDIS_URL": redis_server.url}
    if db_settings.postgres_dsn:
        env["USAGE_POSTGRES_DSN"] = db_settings.postgres_dsn
    else:
        env["USAGE_SQLITE_PATH"] = db_settings.sqlite_path
    argv = [sys.executable, "-m", "sidecars.usage", "usage", "rollup"]
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # Killed as soon as its first page of rows is committed.
        wait_for(lambda: count(db_settings) > 0 or first.poll() is not None, 60, "first rows")
        first.send_signal(signal.SIGKILL)
    finally:
        _, err = first.communicate()
    at_kill = count(db_settings)
    assert 0 < at_kill < total, (at_kill, total, err.decode())
    assert watermark(db_settings) is None  # the pass never finished
    # Run again from two command lines at the same moment: all rows, the right values.
    runs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)]
    runs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err.decode()
    assert count(db_settings) == total
    expected = sum(i + j for i in range(n_accounts) for j in range(len(days)))
    assert total_usage(db_settings) == expected
    assert watermark(db_settings) is not None


def _sql(settings: Settings, sql: str) -> object:
    if settings.postgres_dsn:
        with psycopg.connect(settings.postgres_dsn) as conn:
            row = conn.execute(sql).fetchone()
    else:
        with sqlite3.connect(settings.sqlite_path, timeout=30) as conn:
            row = conn.execute(sql).fetchone()
    return row[0] if row else None


def count(settings: Settings) -> int:
    """Rows in daily_usage (0 before the table exists)."""
    try:
        return int(_sql(settings, "SELECT COUNT(*) FROM daily_usage"))  # type: ignore[call-overload]
    except (sqlite3.OperationalError, psycopg.errors.UndefinedTable):
        return 0


def total_usage(settings: Settings) -> int:
    """The sum of every stored day."""
    return int(_sql(settings, "SELECT SUM(usage) FROM daily_usage"))  # type: ignore[call-overload]


def watermark(settings: Settings) -> object:
    """The closed-through day, or None."""
    return _sql(settings, "SELECT value FROM rollup_state WHERE name = 'closed_through'")


async def test_open_database_migrates_the_new_tables(db_settings: Settings) -> None:
    db = open_database(db_settings)
    try:
        assert await DailyTable(db).closed_through() is None
        assert await EventTable(db).recent() == []
    finally:
        await db.close()
