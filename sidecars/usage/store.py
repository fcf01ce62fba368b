"""Accounts and tokens from the account database; metered usage from Redis.

The system of record (accounts, plan assignments, subscription periods, tokens) is SQL
(`sidecars.usage.db`: SQLite by default, PostgreSQL with USAGE_POSTGRES_DSN), so a Redis
restart, eviction or FLUSHALL loses no customer and no token, and writing to Redis cannot
mint a token. Redis holds only the usage counters, one per account and UTC day:

    C meter_<domain>_<key>_<id>_<day>   day buckets (ratelimitd's `meter_key`), read with MGET

Raw tokens are never stored, only their SHA-256. Every request looks the token up afresh
(no token cache), so revocation takes effect on the next request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import date
from typing import Any, Protocol, TypeVar

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from ratelimitd.keys import meter_key
from sidecars.common.outage import Outage
from sidecars.common.ratelimit import AccessDenied, IdempotencyKey

from .counters import (
    ADMIT,
    REFUND,
    REPLAYED,
    REUSED,
    TTL,
    Admission,
    UsageBuffer,
    retry_after,
)
from .db import AccountError, AccountRecord, Database, StoreUnavailable, TokenRecord, open_database
from .db.base import ACCOUNT_ID_RE
from .plans import WINDOW_KINDS, Plan, PlanError, parse_thresholds
from .settings import Settings
from .windows import Window, usage_window, utc_date

T = TypeVar("T")
log = logging.getLogger(__name__)
__all__ = ["Account", "AccountError", "StoreUnavailable", "TokenInfo", "UsageStore"]


class Keep:
    """The `end` of `update_account` when it is left as it is."""


KEEP = Keep()

TOKEN_PREFIX = "usk_"
# usk_ + 32 random bytes in unpadded base64url: anything else is rejected before any lookup.
TOKEN_RE = re.compile(r"usk_[A-Za-z0-9_-]{43}")


class Account(msgspec.Struct, frozen=True):
    """An account as stored, with its plan resolved."""

    id: str
    plan: str
    window: str  # the effective window kind (the plan's default when the record has none)
    start: date
    end: date | None
    window_override: bool = False
    created: int = 0
    updated: int = 0
    suspended: int | None = None
    thresholds: tuple[int, ...] = ()  # the effective ones (the plan's unless the record says)
    thresholds_override: bool = False


class Crossings(Protocol):
    """Who hears about counted requests (the threshold notifier), from the request path: it
    must only look and queue, never wait."""

    def observe(self, account: Account, window: Window, used: int, limit: int) -> None: ...


class TokenInfo(msgspec.Struct, omit_defaults=True):
    """What `tokens list` shows of a token (never the token)."""

    id: str
    sha256: str
    created: int
    label: str = ""
    revoked: int | None = None
    expires: int | None = None
    lastUsed: int | None = None


def _thresholds(record: AccountRecord) -> tuple[int, ...]:
    # Written by `update_account` from checked values.
    return tuple(int(v) for v in (record.thresholds or "").split(",") if v)


def _info(t: TokenRecord) -> TokenInfo:
    return TokenInfo(t.id, t.sha256, t.created, t.label, t.revoked, t.expires, t.last_used)


# How often a worker tries to write buffered hits back while Redis is unavailable.
FLUSH_INTERVAL = 0.2

# A token's `last_used` is written at most this often per worker (not once per request).
LAST_USED_PRECISION = 60

# Idempotency-Key: printable ASCII, at most this long (Stripe's bound); stored as a hash.
IDEMPOTENCY_KEY_MAX = 255
_KEY_RE = re.compile(rf"[\x20-\x7e]{{1,{IDEMPOTENCY_KEY_MAX}}}")


def _digest(text: str, size: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[: size * 2]


def token_hash(token: str) -> str:
    """The hex SHA-256 a token is stored under."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random bearer token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


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


class UsageStore:
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

    async def account(self, account_id: str) -> Account | None:
        """The account record, or None."""
        record = await self.db.account(account_id)
        return self._account(record) if record is not None else None

    def _account(self, record: AccountRecord) -> Account | None:
        plan = self.plans.get(record.plan)
        # An account whose plan was removed from the plans file is no account.
        if plan is None:
            return None
        return Account(
            id=record.id,
            plan=plan.name,
            window=record.window or plan.window,
            start=record.start,
            end=record.end,
            window_override=bool(record.window),
            created=record.created,
            updated=record.updated,
            suspended=record.suspended,
            thresholds=plan.thresholds if record.thresholds is None else _thresholds(record),
            thresholds_override=record.thresholds is not None,
        )

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

    def _idempotency(self, account_id: str, retry: IdempotencyKey) -> tuple[str, str, str]:
        """(key set, fingerprints, member) of a request's Idempotency-Key; a malformed key is
        refused (400): silently counting it would make the client's retries count twice."""
        key = retry.key.strip()
        if len(key) >= 2 and key[0] == key[-1] == '"':
            key = key[1:-1]  # the IETF draft's structured-field string form
        if _KEY_RE.fullmatch(key) is None:
            raise AccessDenied(
                "invalid_request",
                f"Idempotency-Key must be 1-{IDEMPOTENCY_KEY_MAX} printable ASCII characters.",
                400,
            )
        prefix = f"{self.settings.key_prefix}idempotency:{account_id}"
        return prefix + ":keys", prefix + ":requests", _digest(key, 16)

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
            keys = [*buckets, idempotency[0], idempotency[1]]
            args += [
                idempotency[2],
                _digest(retry.request, 8),
                int(now * 1000),
                self.settings.idempotency_window_seconds * 1000,
                self.settings.idempotency_max_keys,
            ]
        if self._admit is None or self._admit_client is not self.redis:
            self._admit_client = self.redis
            self._admit = self.redis.register_script(ADMIT)
            self._refund = self.redis.register_script(REFUND)
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
            return Admission(True, used, limit, replayed=True)
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
                keys += admission.idempotency[:2]
                args.append(admission.idempotency[2])
            await self._bounded(lambda: script(keys=keys, args=args))

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

    # ---------------------------------------------------------------- administration (CLI)

    def _check_id(self, account_id: str) -> None:
        if ACCOUNT_ID_RE.fullmatch(account_id) is None:
            raise AccountError(
                f"account id {account_id!r}: 1-64 of A-Z a-z 0-9 _ . - (starting alphanumeric)"
            )

    def _check(self, plan: str | None, window: str | None) -> None:
        """Refuse an unknown plan or window kind."""
        if plan is not None and plan not in self.plans:
            raise AccountError(f"unknown plan {plan!r} (plans: {', '.join(self.plans)})")
        if window and window not in WINDOW_KINDS:
            raise AccountError(f"window must be one of {', '.join(WINDOW_KINDS)}")

    async def create_account(
        self,
        account_id: str,
        plan: str,
        *,
        window: str = "",
        start: date | None = None,
        end: date | None = None,
    ) -> Account:
        """Create an account; AccountError if it exists."""
        self._check_id(account_id)
        self._check(plan, window)
        start = start or utc_date(self.clock())
        if end is not None and end <= start:
            raise AccountError("end must be after start")
        record = await self.db.create_account(account_id, plan, window, start, end)
        return self._required(record)

    async def update_account(
        self,
        account_id: str,
        *,
        plan: str | None = None,
        window: str | None = None,
        start: date | None = None,
        end: date | Keep | None = KEEP,
        thresholds: str | None = None,
    ) -> Account:
        """Change an account's plan, window kind ("" = plan default), period (`end=None`
        makes it open; leaving `end` out keeps it) or thresholds ("plan" = the plan's, ""
        = none, "80,100")."""
        self._check(plan, window)
        current = await self._require(account_id)
        changes: dict[str, Any] = {}
        if thresholds is not None:
            if thresholds == "plan":
                changes["thresholds"] = None
            else:
                try:
                    changes["thresholds"] = ",".join(map(str, parse_thresholds(thresholds)))
                except PlanError as exc:
                    raise AccountError(str(exc)) from None
        if plan is not None:
            changes["plan"] = plan
        if window is not None:
            changes["window_kind"] = window
        if start is not None:
            changes["start_date"] = start.isoformat()
        if not isinstance(end, Keep):
            changes["end_date"] = end.isoformat() if end is not None else None
        new_start = start or current.start
        new_end = current.end if isinstance(end, Keep) else end
        if new_end is not None and new_end <= new_start:
            raise AccountError("end must be after start")
        return self._required(await self.db.update_account(account_id, changes))

    def _required(self, record: AccountRecord) -> Account:
        account = self._account(record)
        if account is None:
            raise AccountError(f"account {record.id!r} has plan {record.plan!r}, not in the plans")
        return account

    async def _require(self, account_id: str) -> Account:
        self._check_id(account_id)
        account = await self.account(account_id)
        if account is None:
            raise AccountError(f"no account {account_id!r}")
        return account

    async def issue_token(
        self, account_id: str, label: str = "", expires: int | None = None
    ) -> tuple[str, TokenInfo]:
        """A new token for the account: (raw token, shown once; its listing entry). `expires`:
        epoch seconds from which the token is refused (401), None for never."""
        await self._require(account_id)
        now = int(self.clock())
        if expires is not None and expires <= now:
            raise AccountError("the expiry must be in the future")
        token = new_token()
        record = TokenRecord(
            "tok_" + secrets.token_hex(6),
            account_id,
            token_hash(token),
            now,
            label,
            expires=expires,
        )
        await self.db.insert_token(record)
        return token, _info(record)

    async def list_tokens(self, account_id: str) -> list[TokenInfo]:
        """The account's tokens, oldest first."""
        await self._require(account_id)
        return [_info(t) for t in await self.db.tokens(account_id)]

    async def list_accounts(self) -> list[Account]:
        """Every account (whose plan is known), by id."""
        return [a for a in map(self._account, await self.db.accounts()) if a is not None]

    async def suspend(self, account_id: str, suspended: bool) -> Account:
        """Suspend an account (its tokens are refused with 403) or resume it."""
        await self._require(account_id)
        value = int(self.clock()) if suspended else None
        return self._required(await self.db.update_account(account_id, {"suspended": value}))

    async def delete_account(self, account_id: str) -> None:
        """Delete an account and its tokens (its usage counters expire in Redis by themselves)."""
        self._check_id(account_id)
        await self.db.delete_account(account_id)

    async def revoke_token(self, account_id: str, token_id: str) -> TokenInfo:
        """Revoke one token by id: the next request with it gets 401."""
        await self._require(account_id)
        return _info(await self.db.revoke_token(account_id, token_id))
