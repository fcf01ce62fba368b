"""Accounts and tokens from the account database; metered usage from Redis.

The system of record (accounts, plan assignments, subscription periods, tokens) is SQL
(`sidecars.usage.db`: SQLite by default, PostgreSQL with USAGE_POSTGRES_DSN), so a Redis
restart, eviction or FLUSHALL loses no customer and no token, and writing to Redis cannot
mint a token. Redis holds only the usage counters, one per account and UTC day:

    C meter_<domain>_<key>_<id>_<day>   day buckets (ratelimitd's `meter_key`), read with MGET

Raw tokens are never stored, only their SHA-256. Every request looks the token up afresh
(no token cache), so revocation takes effect on the next request.

This module is the request path (authenticate, check-and-count with idempotency keys,
refunds, the outage buffer); resolving and administering accounts and tokens is
`accounts.AccountAdmin`, which `UsageStore` extends.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from ratelimitd.config.keys import meter_key
from sidecars.common.outage import Outage
from sidecars.common.ratelimit import AccessDenied, IdempotencyKey

from .accounts import KEEP, TOKEN_RE, Account, AccountAdmin, token_hash
from .counters import (
    ADMIT,
    REFUND,
    REMEMBER,
    REPLAYED,
    REUSED,
    TTL,
    Admission,
    UsageBuffer,
    retry_after,
)
from .db import AccountError, Database, StoreUnavailable, TokenRecord, open_database
from .plans import Plan
from .settings import Settings
from .windows import Window, usage_window, utc_date

T = TypeVar("T")
log = logging.getLogger(__name__)
__all__ = [
    "KEEP",
    "Account",
    "AccountError",
    "StoreUnavailable",
    "TokenRecord",
    "UsageStore",
    "token_hash",
]


class Crossings(Protocol):
    """Who hears about counted requests (the threshold notifier), from the request path: it
    must only look and queue, never wait."""

    def observe(self, account: Account, window: Window, used: int, limit: int) -> None: ...


# How often a worker tries to write buffered hits back while Redis is unavailable.
FLUSH_INTERVAL = 0.2

# A token's `last_used` is written at most this often per worker (not once per request).
LAST_USED_PRECISION = 60

# Idempotency-Key: printable ASCII, at most this long (Stripe's bound); stored as a hash. A
# key is compared as sent: `"abc"` (the IETF draft's quoted form) and `abc` are two keys, as
# a client retrying sends the same bytes again.
IDEMPOTENCY_KEY_MAX = 255
_KEY_RE = re.compile(rf"[\x20-\x7e]{{1,{IDEMPOTENCY_KEY_MAX}}}")


def _digest(text: str, size: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[: size * 2]


def connect(settings: Settings) -> aioredis.Redis:
    """A Redis client whose every wait is bounded (connect, read, pool checkout; no retries)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_pool_size,
        timeout=settings.redis_timeout_seconds,
        socket_timeout=settings.redis_timeout_seconds,
        socket_connect_timeout=settings.redis_timeout_seconds,
        # One immediate retry: a pooled connection to a Redis that restarted fails once, the
        # retry reconnects. The caller's deadline (`_bounded`) still bounds the whole call.
        retry=Retry(NoBackoff(), 1),
    )
    # from_pool hands the pool over: aclose() closes its connections too.
    return aioredis.Redis.from_pool(pool)


class UsageStore(AccountAdmin):
    """Accounts and tokens (the database) and usage sums (Redis); every call bounded in time."""

    def __init__(
        self,
        settings: Settings,
        plans: Mapping[str, Plan],
        *,
        redis: aioredis.Redis | None = None,
        database: Database | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.plans = plans
        self.clock = clock
        self._redis = redis
        self.db = database if database is not None else open_database(settings, clock)
        self._touched: dict[str, int] = {}  # token id -> last_used written by this worker
        self._admit: AsyncScript | None = None
        self._refund: AsyncScript | None = None
        self._remember: AsyncScript | None = None
        self._admit_client: aioredis.Redis | None = None
        self.buffer = UsageBuffer(settings.counter_buffer_hits)
        self._flusher: asyncio.Task[None] | None = None
        consequence = (
            "serving and buffering usage in this worker (USAGE_COUNTER_FAILURE_MODE=allow)"
            if settings.counter_failure_mode == "allow"
            else "answering 503 (USAGE_COUNTER_FAILURE_MODE=deny)"
        )
        self.counters_outage = Outage("Redis (usage counters)", consequence)
        self.crossings: Crossings | None = None  # set by the app when webhooks are on
        # Connect plus one read, with slack: the outer bound if a socket option is not honoured.
        self._deadline = settings.redis_timeout_seconds * 2 + 0.05

    @property
    def redis(self) -> aioredis.Redis:
        """The client, made on first use (inside the worker's event loop)."""
        if self._redis is None:
            self._redis = connect(self.settings)
        return self._redis

    async def close(self) -> None:
        """Flush what is buffered (once, bounded), close the Redis pool and the database."""
        if self._flusher is not None:
            self._flusher.cancel()
        if self.buffer.total and self._redis is not None:
            await self.flush()
            if self.buffer.total:
                log.error(
                    "%d buffered usage hits lost: Redis unavailable at shutdown", self.buffer.total
                )
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
        await self.db.close()

    async def _bounded(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self._deadline):
                return await make()
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis: {exc or type(exc).__name__}") from exc

    # ---------------------------------------------------------------- request path

    async def ping(self) -> None:
        """Raise StoreUnavailable unless Redis answers."""
        await self._bounded(self.redis.ping)

    async def authenticate(self, token: str) -> Account | None:
        """The account owning a valid token; None for a malformed, unknown, revoked or expired
        one. A suspended account raises AccessDenied (403)."""
        if TOKEN_RE.fullmatch(token) is None:
            return None
        found = await self.db.token_owner(token_hash(token))
        if found is None:
            return None
        record, owner = found
        now = int(self.clock())
        if record.expires is not None and now >= record.expires:
            return None
        account = self._account(owner)
        if account is not None and account.suspended is not None:
            raise AccessDenied("account_suspended", "The account is suspended.")
        last = self._touched.get(record.id, record.last_used or 0)
        if now - last >= LAST_USED_PRECISION:
            self._touched[record.id] = now
            if len(self._touched) > 100_000:
                self._touched.clear()
            try:
                await self.db.touch_token(record.id, now)
            except StoreUnavailable as exc:
                # Bookkeeping only: the request is served; the next minute tries again.
                log.info("token last-use not recorded: %s", exc)
        return account

    def window(self, account: Account, now: float | None = None) -> Window:
        """The account's current counting window."""
        return usage_window(account.window, account.start, self.clock() if now is None else now)

    def bucket_keys(self, account_id: str, window: Window) -> list[str]:
        """The meter keys of the window's days (ratelimitd's `meter_key` layout)."""
        return self.bucket_keys_for_days(account_id, window.days)

    def bucket_keys_for_days(self, account_id: str, days: Iterable[int]) -> list[str]:
        """The meter keys of an account's days (day starts, epoch seconds)."""
        prefix, domain = self.settings.cache_key_prefix, self.settings.meter_domain
        entries = ((self.settings.meter_key, account_id),)
        return [meter_key(prefix, domain, entries, day) for day in days]

    async def read_buckets(self, keys: list[str]) -> list[bytes | None]:
        """The values of many buckets: MGETs of at most 5,000 keys, in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for i in range(0, len(keys), 5000):
            pipe.mget(keys[i : i + 5000])
        chunks = await self._bounded(pipe.execute)
        return [v for chunk in chunks for v in chunk]

    async def lease(self, name: str, holder: str, seconds: float) -> bool:
        """Take the fleet-wide lease `name` for `seconds` unless another holder has it."""
        key = f"{self.settings.key_prefix}lease:{name}"
        ms = max(1, int(seconds * 1000))
        return bool(await self._bounded(lambda: self.redis.set(key, holder, nx=True, px=ms)))

    async def usage(self, account: Account, now: float | None = None) -> tuple[Window, int]:
        """The current window and the hits metered in it (one MGET)."""
        window = self.window(account, now)
        keys = self.bucket_keys(account.id, window)
        if not keys:
            return window, 0
        values = await self._bounded(lambda: self.redis.mget(keys))
        return window, sum(int(v) for v in values if v is not None)

    def _idempotency(self, account_id: str, retry: IdempotencyKey) -> tuple[str, str, str, str]:
        """(key set, fingerprints, answers, member) of a request's Idempotency-Key; a
        malformed key is refused (400): silently counting it would make the client's retries
        count twice."""
        key = retry.key
        if _KEY_RE.fullmatch(key) is None:
            raise AccessDenied(
                "invalid_request",
                f"Idempotency-Key must be 1-{IDEMPOTENCY_KEY_MAX} printable ASCII characters.",
                400,
            )
        prefix = f"{self.settings.key_prefix}idempotency:{account_id}"
        return prefix + ":keys", prefix + ":requests", prefix + ":answers", _digest(key, 16)

    async def admit(
        self, account: Account, exempt: bool = False, retry: IdempotencyKey | None = None
    ) -> Admission:
        """Check-and-count one request of the account against its plan, atomically (one
        round trip). `exempt` (a quota-exempt path): served even at the limit, and then not
        counted. A subscription that has not started yet raises AccessDenied (403), except
        on exempt paths, where the request is served and not counted. `retry`: the request's
        Idempotency-Key; a key seen within the key window is served, not counted."""
        now = self.clock()
        limit = self.plans[account.plan].limit
        window = self.window(account, now)
        if account.start > utc_date(now):
            if exempt:
                return Admission(True, 0, limit)
            raise AccessDenied(
                "subscription_not_started",
                f"The subscription starts on {account.start.isoformat()}.",
            )
        buckets = self.bucket_keys(account.id, window)
        keys: list[str] = buckets
        args: list[int | str] = [limit, TTL]
        idempotency = None
        if retry is not None and self.settings.idempotency_window_seconds > 0:
            idempotency = self._idempotency(account.id, retry)
            keys = [*buckets, *idempotency[:3]]
            args += [
                idempotency[3],
                _digest(retry.request, 8),
                int(now * 1000),
                self.settings.idempotency_window_seconds * 1000,
                self.settings.idempotency_max_keys,
            ]
        if self._admit is None or self._admit_client is not self.redis:
            self._admit_client = self.redis
            self._admit = self.redis.register_script(ADMIT)
            self._refund = self.redis.register_script(REFUND)
            self._remember = self.redis.register_script(REMEMBER)
        script = self._admit
        try:
            reply = await self._bounded(lambda: script(keys=keys, args=args))
        except StoreUnavailable as exc:
            self.counters_outage.failed(str(exc))
            if self.settings.counter_failure_mode == "deny" or not self.buffer.add(buckets[-1]):
                raise
            self._start_flush()
            # Served unchecked and counted here: billing gets the hit when Redis is back.
            return Admission(True, -1, limit, counted_key=buckets[-1], buffered=True)
        if self.buffer.total == 0:
            self.counters_outage.answered()
        outcome, used = int(reply[0]), int(reply[1])
        if outcome == REUSED:
            raise AccessDenied(
                "idempotency_key_reused",
                "This Idempotency-Key was used with a different request.",
                422,
            )
        if outcome == REPLAYED:
            answer = reply[2] if len(reply) > 2 else None
            return Admission(True, used, limit, replayed=True, answer=answer)
        if outcome:
            if self.crossings is not None:
                self.crossings.observe(account, window, used, limit)
            return Admission(True, used, limit, counted_key=buckets[-1], idempotency=idempotency)
        if exempt:
            return Admission(True, used, limit)
        wait = retry_after(window, [int(v) for v in reply[2:]], limit, now)
        return Admission(False, used, limit, retry_after=wait)

    async def refund(self, admission: Admission) -> None:
        """Take back the hit an admission counted (never below zero)."""
        if admission.buffered and self.buffer.take_back(admission.counted_key):
            return
        if admission.counted_key and self._refund is not None:
            script = self._refund
            keys, args = [admission.counted_key], []
            if admission.idempotency is not None:
                keys += admission.idempotency[:3]
                args.append(admission.idempotency[3])
            await self._bounded(lambda: script(keys=keys, args=args))

    async def remember(self, admission: Admission, answer: bytes) -> None:
        """Keep the answer of a request counted under an Idempotency-Key, for its replays
        (while the key is the account's: not after a refund, within the key window)."""
        if admission.idempotency is None or self._remember is None:
            return
        _, prints, answers, member = admission.idempotency
        window = self.settings.idempotency_window_seconds * 1000
        script = self._remember
        await self._bounded(lambda: script(keys=[prints, answers], args=[member, answer, window]))

    def _start_flush(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        """Write the buffered hits back every FLUSH_INTERVAL until the buffer is empty."""
        while self.buffer.total:
            await asyncio.sleep(FLUSH_INTERVAL)
            await self.flush()

    async def flush(self) -> int:
        """Write the buffered hits to Redis (one pipeline); the hits written (0 on failure)."""
        pending = dict(self.buffer.hits)
        if not pending:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for key, n in pending.items():
            pipe.incrby(key, n)
            pipe.expire(key, TTL, nx=True)
        try:
            await self._bounded(pipe.execute)
        except StoreUnavailable:
            return 0
        written = 0
        for key, n in pending.items():
            # Hits buffered or refunded while the pipeline ran stay for the next round.
            left = self.buffer.hits.get(key, 0) - n
            if left > 0:
                self.buffer.hits[key] = left
            else:
                self.buffer.hits.pop(key, None)
            written += n
        self.buffer.total -= written
        self.buffer.flushed += written
        if self.buffer.total == 0:
            self.counters_outage.answered(f"flushed {self.buffer.flushed} buffered hits")
        return written

    async def count_invalid_token(self, address: str) -> tuple[int, int]:
        """Count one invalid-token attempt from `address` in its fixed window: (attempts in
        the window, seconds until it ends)."""
        window = self.settings.invalid_token_window_seconds
        key = f"{self.settings.key_prefix}invalid_token:{address}"
        pipe = self.redis.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, window, nx=True)
        pipe.ttl(key)
        count, _, ttl = await self._bounded(pipe.execute)
        return int(count), max(1, int(ttl))
