"""Daily usage in SQL: one row per account and UTC day, written by the rollup, read by the
history endpoint, `usage show` and `usage export` (the same rows, so the same figures).

Rows are upserts of the value counted in Redis, never increments: writing a day twice, from
two workers at once or again after a crash, leaves the same row. The plan and quota of a day
are those seen while the day was live; a day rolled again after it ended keeps them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import date, timedelta

import msgspec

from .base import Database

_COLUMNS = "account_id, day, usage, plan, plan_limit, updated"
_INSERT = f"INSERT INTO daily_usage ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
# Today: the plan may still change, so it is written with the usage. The WHERE clauses skip
# rows that would not change (no dead row versions in PostgreSQL, no page writes in SQLite).
UPSERT_LIVE = _INSERT + (
    "ON CONFLICT (account_id, day) DO UPDATE SET usage = excluded.usage, "
    "plan = excluded.plan, plan_limit = excluded.plan_limit, updated = excluded.updated "
    "WHERE daily_usage.usage <> excluded.usage OR daily_usage.plan <> excluded.plan "
    "OR daily_usage.plan_limit <> excluded.plan_limit"
)
# A day that has ended: only late hits (refunds, buffered hits) can still change it.
UPSERT_PAST = _INSERT + (
    "ON CONFLICT (account_id, day) DO UPDATE SET usage = excluded.usage, "
    "updated = excluded.updated WHERE daily_usage.usage <> excluded.usage"
)
CLOSED_THROUGH = "closed_through"
ONE_DAY = timedelta(days=1)


class DailyUsage(msgspec.Struct, frozen=True, array_like=True):
    """One account's usage in one UTC day, with the plan and quota it had that day."""

    account: str
    day: date
    plan: str
    limit: int
    usage: int


def _row(r: Sequence[object]) -> DailyUsage:
    return DailyUsage(str(r[0]), date.fromisoformat(str(r[1])), str(r[2]), int(r[3]), int(r[4]))  # type: ignore[call-overload]


class AccountRef(msgspec.Struct, frozen=True, array_like=True):
    """What the rollup needs of an account: id, plan, creation instant."""

    id: str
    plan: str
    created: int


class DailyTable:
    """The `daily_usage` and `rollup_state` tables over one database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def accounts_after(self, after: str, limit: int) -> list[AccountRef]:
        """The next `limit` accounts by id after `after` (keyset pagination: every page is
        an index range, however many accounts there are)."""
        sql = "SELECT id, plan, created FROM accounts WHERE id > ? ORDER BY id LIMIT ?"
        return [AccountRef(r[0], r[1], int(r[2])) for r in await self.db.query(sql, (after, limit))]

    async def write(
        self, live: Sequence[Sequence[object]], past: Sequence[Sequence[object]]
    ) -> None:
        """Upsert rows (`_COLUMNS` order) of today and of ended days, in one transaction."""

        async def run() -> None:
            async with self.db.transaction() as tx:
                if live:
                    await tx.execute_many(UPSERT_LIVE, live)
                if past:
                    await tx.execute_many(UPSERT_PAST, past)

        await self.db.bounded(run)

    async def closed_through(self) -> date | None:
        """The last day rolled up after it ended (None before the first rollup)."""
        rows = await self.db.query(
            "SELECT value FROM rollup_state WHERE name = ?", (CLOSED_THROUGH,)
        )
        return date.fromisoformat(rows[0][0]) if rows else None

    async def close_through(self, day: date) -> None:
        """Advance the watermark to `day` (never back: concurrent runs may finish in any
        order; ISO dates compare as text)."""
        await self.db.execute(
            "INSERT INTO rollup_state (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE "
            "SET value = excluded.value WHERE rollup_state.value < excluded.value",
            (CLOSED_THROUGH, day.isoformat()),
        )

    async def purge(self, before: date) -> int:
        """Drop the days before `before` (retention); the rows dropped."""
        return await self.db.execute("DELETE FROM daily_usage WHERE day < ?", (before.isoformat(),))

    async def series(self, account_id: str, first: date, last: date) -> list[DailyUsage]:
        """One account's days from `first` to `last` (inclusive), oldest first."""
        sql = (
            "SELECT account_id, day, plan, plan_limit, usage FROM daily_usage "
            "WHERE account_id = ? AND day >= ? AND day <= ? ORDER BY day"
        )
        rows = await self.db.query(sql, (account_id, first.isoformat(), last.isoformat()))
        return [_row(r) for r in rows]

    async def count(self, first: date, last: date, account_id: str | None = None) -> int:
        """How many rows `scan` will yield (an index-only count, for a progress bar)."""
        sql = "SELECT COUNT(*) FROM daily_usage WHERE day >= ? AND day <= ?"
        params: tuple[str, ...] = (first.isoformat(), last.isoformat())
        if account_id is not None:
            sql += " AND account_id = ?"
            params += (account_id,)
        return int((await self.db.query(sql, params))[0][0])

    async def scan(
        self, first: date, last: date, account_id: str | None = None, page: int = 2000
    ) -> AsyncIterator[list[DailyUsage]]:
        """Every row from `first` to `last`, by day then account, in pages of `page` rows.

        Keyset pagination: each page is one short index range query starting where the last
        one stopped (a row-value comparison, which SQLite and PostgreSQL both seek to), so
        memory stays one page whatever the range, and no transaction is held open while the
        caller writes its output. One account's rows come from the primary key instead.
        """
        select = "SELECT account_id, day, plan, plan_limit, usage FROM daily_usage WHERE "
        if account_id is None:
            sql = select + "(day, account_id) > (?, ?) AND day <= ? ORDER BY day, account_id"
            cursor: list[object] = [first.isoformat(), ""]
        else:
            sql = select + "account_id = ? AND day > ? AND day <= ? ORDER BY day"
            cursor = [account_id, (first - ONE_DAY).isoformat()]
        while True:
            rows = await self.db.query(sql + " LIMIT ?", [*cursor, last.isoformat(), page])
            if not rows:
                return
            yield [_row(r) for r in rows]
            if len(rows) < page:
                return
            if account_id is None:
                cursor = [str(rows[-1][1]), str(rows[-1][0])]
            else:
                cursor = [account_id, str(rows[-1][1])]
