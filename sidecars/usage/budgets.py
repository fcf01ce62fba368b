"""ratelimitd's token budgets feed the metering: each settle the daemon appended to its
outbox stream (`ratelimitd.budget.outbox`, a budget rule's `outbox:`) becomes one metered
event, exactly once.

Every worker reads the stream USAGE_BUDGET_STREAM (on USAGE_BUDGET_REDIS_URL, the daemon's
Redis; default USAGE_REDIS_URL) in one consumer group, `usage`, so each entry goes to one
worker of the fleet; it stores the entries' events, then acknowledges them (XACK). An entry
is an event `{source: "ratelimitd:<stream>", id: <transaction id>, subject: <the entry
USAGE_BUDGET_ACCOUNT_KEY>, type: llm.tokens, time: <the settle's instant>, data: {model:
<the entry USAGE_BUDGET_MODEL_KEY>, tokens: <charged>}}`, stored by the ingestion's own
de-duplication (source + id), so an entry delivered twice (a worker that stored it and died
before its XACK; its pending entries are claimed by another worker after CLAIM_IDLE_MS)
counts once. A Redis or database outage leaves entries in the stream (or pending) until
it ends. Acknowledged entries are trimmed (XTRIM MINID) once none is pending. An entry
whose subject is not an account is logged and acknowledged (it can never be stored); so is
a malformed one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from ratelimitd.budget.outbox import Settled, parse
from sidecars.common.lifecycle import stop_tasks
from sidecars.common.outage import Outage

from .db.metered import MeteredEvent
from .metering import Metering
from .store import StoreUnavailable

log = logging.getLogger(__name__)

GROUP = "usage"
EVENT_TYPE = "llm.tokens"  # the shipped `tokens` meter's
BATCH = 500  # entries per read
BLOCK_MS = 1000  # how long a read waits for new entries
CLAIM_IDLE_MS = 30_000  # a pending entry this old belongs to a worker that died


def _text(value: str | bytes) -> str:
    """A field of a redis-py reply, which may come as bytes (no decode_responses)."""
    return value.decode() if isinstance(value, bytes) else value


class BudgetFeed:
    """One worker's consumer of the outbox stream (module docstring)."""

    def __init__(self, metering: Metering) -> None:
        settings = metering.store.settings
        self.metering = metering
        self.stream = settings.budget_stream
        self.source = f"ratelimitd:{self.stream}"
        self.account_key = settings.budget_account_key
        self.model_key = settings.budget_model_key
        self.url = settings.budget_redis_url or settings.redis_url
        self.timeout = settings.redis_timeout_seconds
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self.outage = Outage("the token budget feed", "settles wait in the stream")
        self._task: asyncio.Task[None] | None = None
        self._redis: aioredis.Redis | None = None

    def start(self) -> None:
        """Start consuming in the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop (entries read and not acknowledged are read again, here or elsewhere)."""
        task, self._task = self._task, None
        await stop_tasks(task)
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    def redis(self) -> aioredis.Redis:
        """The client of the daemon's Redis (a read blocks BLOCK_MS: its timeout is longer)."""
        if self._redis is None:
            self._redis = aioredis.Redis.from_url(
                self.url,
                socket_timeout=self.timeout + BLOCK_MS / 1000,
                socket_connect_timeout=self.timeout,
            )
        return self._redis

    async def _run(self) -> None:
        delay = 0.1
        grouped = False
        while True:
            try:
                if not grouped:
                    await self._group()
                    grouped = True
                await self.step()
                self.outage.answered()
                delay = 0.1
            except (RedisError, OSError, StoreUnavailable) as exc:
                self.outage.failed(str(exc) or type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("token budget feed: a step failed")
                await asyncio.sleep(1.0)

    async def _group(self) -> None:
        try:
            await self.redis().xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def step(self) -> int:
        """Store and acknowledge one batch: this worker's own pending entries first (after a
        failure), then those a dead worker left, then new ones; how many."""
        r = self.redis()
        # RESP2 replies: [[stream, [(id, fields), ...]]] (redis-py types them loosely).
        got: Any = await r.xreadgroup(GROUP, self.consumer, {self.stream: "0"}, count=BATCH)
        batch: list[Any] = got[0][1] if got else []
        if not batch:
            claimed: Any = await r.xautoclaim(
                self.stream, GROUP, self.consumer, CLAIM_IDLE_MS, "0-0", count=BATCH
            )
            batch = claimed[1]
        if not batch:
            got = await r.xreadgroup(
                GROUP, self.consumer, {self.stream: ">"}, count=BATCH, block=BLOCK_MS
            )
            batch = got[0][1] if got else []
        if not batch:
            return 0
        await self.store(batch)
        await r.xack(self.stream, GROUP, *[entry_id for entry_id, _ in batch])
        # Trim what every worker has acknowledged. XINFO GROUPS gives the group's pending count
        # and the last entry delivered to it in one reply: with none pending, every entry up to
        # that one is stored, whichever worker read it (entries delivered later are newer and
        # stay). Trimming to this batch's own last entry instead would leave a slower worker's
        # newer entries behind whenever that worker acknowledged while this one was pending.
        for group in await r.xinfo_groups(self.stream):
            if _text(group["name"]) == GROUP and group["pending"] == 0:
                last = group["last-delivered-id"]
                await r.xtrim(self.stream, minid=last, approximate=False)
        return len(batch)

    async def store(self, batch: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        """Store the events of a batch of entries (those that can be stored)."""
        now = self.metering.clock()
        settled: list[Settled] = []
        for entry_id, fields in batch:
            try:
                settled.append(parse(fields))
            except ValueError as exc:
                log.error("token budget feed: entry %s dropped: %s", entry_id, exc)
        events = [self.event(s, now) for s in settled if s.value(self.account_key)]
        known = await self.metering.table.existing_accounts(sorted({e.account for e in events}))
        for e in events:
            if e.account not in known:
                log.warning("token budget feed: %s is not an account; %s dropped",
                            e.account, e.id)  # fmt: skip
        events = [e for e in events if e.account in known]
        if events:
            await self.metering.store_events(events, now)

    def event(self, settled: Settled, now: float) -> MeteredEvent:
        """The metered event of one settle."""
        data = {"model": settled.value(self.model_key), "tokens": settled.tokens}
        return MeteredEvent(
            self.source,
            settled.txn,
            settled.value(self.account_key) or "",
            EVENT_TYPE,
            settled.at_ms,
            json.dumps(data, separators=(",", ":")),
            int(now * 1000),
        )
