"""The rollup: each account's day buckets copied from Redis into SQL, then retention.

Redis keeps a day bucket for 35 days (`counters.TTL`); the system of record keeps the days
for USAGE_RETENTION_DAYS (400 by default). A pass writes, for every account, each day from
the first one not yet closed (or the oldest Redis may still hold, after a long gap) through
today, as upserts of the bucket's value (`db.daily`). Yesterday is always written again:
refunds and hits buffered during a Redis outage can still land in it after midnight.

Safe from every worker at once and after any gap, because nothing a pass writes depends on
what an earlier pass did: a row is the bucket's value, and the watermark (`closed_through`,
the last day rolled after it ended plus CLOSE_GRACE) only advances, after a whole pass. A
pass killed half-way leaves rows that the next pass writes again with the same values.

In the server each worker runs a pass every USAGE_ROLLUP_INTERVAL_SECONDS; a Redis lease
lets one worker of the fleet do a given interval's pass (an optimisation only: two passes
at once are correct, just wasted work). `python -m sidecars.usage usage rollup` runs a pass
from the command line (cron, or catching up by hand), regardless of the lease.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta

from redis.exceptions import RedisError

from sidecars.common.lifecycle import stop_tasks
from sidecars.common.outage import Outage

from .counters import TTL
from .db import StoreUnavailable
from .db.daily import AccountRef, DailyTable
from .db.events import EventTable
from .db.metered import MeteredTable
from .store import UsageStore
from .windows import DAY, epoch, utc_date

log = logging.getLogger(__name__)

# Accounts per page: one MGET of up to PAGE x 35 keys, one SQL transaction of their rows.
PAGE = 500
# A day is closed this long after it ended: late refunds and short outages' buffered hits.
CLOSE_GRACE = 600
# The oldest day Redis may still hold, counting today as day 0.
REDIS_DAYS = TTL // DAY - 1


@dataclass(frozen=True, slots=True)
class RollupReport:
    """What one pass did."""

    first: date  # the oldest day written
    last: date  # today
    accounts: int
    rows: int  # account-days written (unchanged ones included)
    closed_through: date | None
    purged: int
    seconds: float


class Rollup:
    """Copies day buckets of every account from Redis into `daily_usage`; drops old days."""

    def __init__(self, store: UsageStore, clock: Callable[[], float] | None = None) -> None:
        self.store = store
        self.clock = clock or store.clock
        self.daily = DailyTable(store.db)
        self.events = EventTable(store.db)
        self.metered = MeteredTable(store.db)
        self.outage = Outage("rollup", "daily usage is not written to SQL meanwhile")
        self._task: asyncio.Task[None] | None = None
        # One lease per database: fleets sharing a Redis but not a database (staging beside
        # production, tests) must not wait for each other's passes.
        self.lease_name = "rollup:" + hashlib.sha256(store.db.identity.encode()).hexdigest()[:16]

    async def run_once(self, now: float | None = None) -> RollupReport:
        """One pass (see the module docstring)."""
        started = time.monotonic()
        now = self.clock() if now is None else now
        today = utc_date(now)
        closed = await self.daily.closed_through()
        oldest = today - timedelta(days=REDIS_DAYS)
        first = oldest if closed is None else max(oldest, closed + timedelta(days=1))
        first = min(first, today - timedelta(days=1))
        accounts = rows = 0
        after = ""
        while True:
            page = await self.daily.accounts_after(after, PAGE)
            if not page:
                break
            after = page[-1].id
            accounts += len(page)
            rows += await self._page(page, first, today, int(now))
        # Closed: every day that ended CLOSE_GRACE ago has been written after it ended.
        closing = utc_date(now - CLOSE_GRACE) - timedelta(days=1)
        if closed is None or closing > closed:
            await self.daily.close_through(closing)
            closed = closing
        retention = self.store.settings.retention_days
        purged = await self.daily.purge(today - timedelta(days=retention - 1))
        await self.events.purge(int((now - retention * DAY) * 1000))
        # Metered events go with their days (ingestion refuses any older than the
        # retention, so a purged event cannot come back as new).
        await self.metered.purge(epoch(today - timedelta(days=retention - 1)) * 1000)
        return RollupReport(
            first, today, accounts, rows, closed, purged, time.monotonic() - started
        )

    async def _page(self, page: list[AccountRef], first: date, today: date, now: int) -> int:
        """Read one page of accounts' buckets (one MGET) and upsert their days."""
        plans = self.store.plans
        spans: list[tuple[str, str, int, list[date]]] = []
        keys: list[str] = []
        for account in page:
            plan = plans.get(account.plan)
            if plan is None:
                continue  # a plan removed from the plans file: no account (as for requests)
            # No bucket can predate the account.
            start = max(first, utc_date(account.created))
            days = [start + timedelta(days=i) for i in range((today - start).days + 1)]
            spans.append((account.id, plan.name, plan.limit, days))
            keys += self.store.bucket_keys_for_days(account.id, map(epoch, days))
        if not keys:
            return 0
        values = await self.store.read_buckets(keys)
        live: list[tuple[object, ...]] = []
        past: list[tuple[object, ...]] = []
        i = 0
        for account_id, plan_name, limit, days in spans:
            for d in days:
                value = values[i]
                i += 1
                row = (account_id, d.isoformat(), int(value or 0), plan_name, limit, now)
                (live if d == today else past).append(row)
        await self.daily.write(live, past)
        return len(live) + len(past)

    # ------------------------------------------------------------ in the server

    def start(self) -> None:
        """Run passes in the background every USAGE_ROLLUP_INTERVAL_SECONDS (0: never)."""
        if self.store.settings.rollup_interval_seconds > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._forever())

    async def stop(self) -> None:
        """Stop the background passes (a pass cut short is redone by the next)."""
        task, self._task = self._task, None
        await stop_tasks(task)

    async def _forever(self) -> None:
        interval = self.store.settings.rollup_interval_seconds
        # Workers start together: spread their first pass (a restart catches up at once).
        await asyncio.sleep(random.uniform(0, min(interval, 2.0)))
        holder = secrets.token_hex(8)
        while True:
            try:
                if await self.store.lease(self.lease_name, holder, interval * 0.9):
                    report = await self.run_once()
                    log.debug("rollup: %s", report)
                self.outage.answered()
            except (StoreUnavailable, RedisError, OSError) as exc:
                self.outage.failed(str(exc))
            await asyncio.sleep(interval)
