"""Accounts, bearer tokens and metered usage in Redis (the Redis ratelimitd meters into).

Key layout (`P` = USAGE_KEY_PREFIX, default `usage:`; `C` = ratelimitd's CACHE_KEY_PREFIX):

    P account:<id>          hash  plan, window ("" = the plan's default), start, end ("" = open),
                                  created, updated (epoch seconds)
    P token:<sha256 hex>    hash  account, id, created, label. Exists only while the token is
                                  valid: revoking deletes it, so the next request fails.
    P tokens:<id>           hash  token id -> JSON {id, sha256, created, label, revoked}: the
                                  account's tokens for `tokens list` / `tokens revoke`.
    C meter_<domain>_<key>_<id>_<day>   ratelimitd's day buckets (`meter: true`), read with MGET.

Raw tokens are never stored, only their SHA-256. Every request reads the token hash afresh
(no token cache), so revocation takes effect on the next request.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import date
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ratelimitd.keys import meter_key

from .plans import WINDOW_KINDS, Plan
from .settings import Settings
from .windows import Window, usage_window, utc_date

T = TypeVar("T")
__all__ = ["Account", "AccountError", "StoreUnavailable", "TokenInfo", "UsageStore"]

TOKEN_PREFIX = "usk_"
# usk_ + 32 random bytes in unpadded base64url: anything else is rejected before any lookup.
TOKEN_RE = re.compile(r"usk_[A-Za-z0-9_-]{43}")
ACCOUNT_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class StoreUnavailable(Exception):
    """Redis cannot answer now: unreachable, failing, or slower than USAGE_REDIS_TIMEOUT_SECONDS
    (connect, read or pool wait)."""


class AccountError(ValueError):
    """A CLI request the store refuses (unknown account, duplicate, bad value)."""


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


class TokenInfo(msgspec.Struct, omit_defaults=True):
    """What `tokens list` shows of a token (never the token)."""

    id: str
    sha256: str
    created: int
    label: str = ""
    revoked: int | None = None


_token_info = msgspec.json.Decoder(TokenInfo)
_encode = msgspec.json.encode


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
        # A retry would multiply the bound; the caller answers 503 and the client retries.
        retry=Retry(NoBackoff(), 0),
    )
    # from_pool hands the pool over: aclose() closes its connections too.
    return aioredis.Redis.from_pool(pool)


class UsageStore:
    """Reads and writes accounts, tokens and usage sums; every call bounded in time."""

    def __init__(
        self,
        settings: Settings,
        plans: Mapping[str, Plan],
        *,
        redis: aioredis.Redis | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.plans = plans
        self.clock = clock
        self._redis = redis
        self._prefix = settings.key_prefix
        # Connect plus one read, with slack: the outer bound if a socket option is not honoured.
        self._deadline = settings.redis_timeout_seconds * 2 + 0.05

    @property
    def redis(self) -> aioredis.Redis:
        """The client, made on first use (inside the worker's event loop)."""
        if self._redis is None:
            self._redis = connect(self.settings)
        return self._redis

    async def close(self) -> None:
        """Close the connection pool."""
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def _bounded(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self._deadline):
                return await make()
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(str(exc) or type(exc).__name__) from exc

    # ---------------------------------------------------------------- request path

    async def ping(self) -> None:
        """Raise StoreUnavailable unless Redis answers."""
        await self._bounded(self.redis.ping)

    async def authenticate(self, token: str) -> Account | None:
        """The account owning a valid token; None for a malformed, unknown or revoked one."""
        if TOKEN_RE.fullmatch(token) is None:
            return None
        key = self._prefix + "token:" + token_hash(token)
        account_id = await self._bounded(lambda: self.redis.hget(key, "account"))
        if account_id is None:
            return None
        return await self.account(
            account_id.decode() if isinstance(account_id, bytes) else account_id
        )

    async def account(self, account_id: str) -> Account | None:
        """The account record, or None."""
        raw = await self._bounded(
            lambda: self.redis.hgetall(self._prefix + "account:" + account_id)
        )
        return self._account(account_id, raw)

    def _account(self, account_id: str, raw: Mapping[Any, Any]) -> Account | None:
        # The client returns bytes (no decode_responses): the hot path skips decoding.
        fields = {bytes(k).decode(): bytes(v).decode() for k, v in raw.items()}
        plan = self.plans.get(fields.get("plan", ""))
        # A record without a known plan (half-written, or its plan removed) is no account.
        if plan is None or not fields.get("start"):
            return None
        window = fields.get("window") or plan.window
        end = fields.get("end")
        return Account(
            id=account_id,
            plan=plan.name,
            window=window,
            start=date.fromisoformat(fields["start"]),
            end=date.fromisoformat(end) if end else None,
            window_override=bool(fields.get("window")),
            created=int(fields.get("created", 0)),
            updated=int(fields.get("updated", 0)),
        )

    def window(self, account: Account, now: float | None = None) -> Window:
        """The account's current counting window."""
        return usage_window(account.window, account.start, self.clock() if now is None else now)

    def bucket_keys(self, account_id: str, window: Window) -> list[str]:
        """ratelimitd's meter keys of the window's days (the same function writes them)."""
        prefix, domain = self.settings.cache_key_prefix, self.settings.meter_domain
        entries = ((self.settings.meter_key, account_id),)
        return [meter_key(prefix, domain, entries, day) for day in window.days]

    async def usage(self, account: Account, now: float | None = None) -> tuple[Window, int]:
        """The current window and the hits metered in it (one MGET)."""
        window = self.window(account, now)
        keys = self.bucket_keys(account.id, window)
        if not keys:
            return window, 0
        values = await self._bounded(lambda: self.redis.mget(keys))
        return window, sum(int(v) for v in values if v is not None)

    # ---------------------------------------------------------------- administration (CLI)

    def _check_id(self, account_id: str) -> None:
        if ACCOUNT_ID_RE.fullmatch(account_id) is None:
            raise AccountError(
                f"account id {account_id!r}: 1-64 of A-Z a-z 0-9 _ . - (starting alphanumeric)"
            )

    def _check(self, plan: str | None, window: str | None) -> None:
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
        key = self._prefix + "account:" + account_id
        now = str(int(self.clock()))
        # HSETNX claims the id atomically; a reader seeing only `created` finds no plan yet.
        if not await self._bounded(lambda: self.redis.hsetnx(key, "created", now)):
            raise AccountError(f"account {account_id!r} exists")
        mapping: dict[Any, Any] = {
            "plan": plan,
            "window": window,
            "start": start.isoformat(),
            "end": end.isoformat() if end else "",
            "updated": now,
        }
        await self._bounded(lambda: self.redis.hset(key, mapping=mapping))
        return await self._require(account_id)

    async def update_account(
        self,
        account_id: str,
        *,
        plan: str | None = None,
        window: str | None = None,
        start: date | None = None,
        end: date | str | None = "keep",
    ) -> Account:
        """Change an account's plan, window kind ("" = plan default) or period."""
        self._check(plan, window)
        current = await self._require(account_id)
        mapping: dict[Any, Any] = {"updated": str(int(self.clock()))}
        if plan is not None:
            mapping["plan"] = plan
        if window is not None:
            mapping["window"] = window
        if start is not None:
            mapping["start"] = start.isoformat()
        if end != "keep":
            mapping["end"] = end.isoformat() if isinstance(end, date) else ""
        new_start = start or current.start
        new_end = current.end if end == "keep" else end
        if isinstance(new_end, date) and new_end <= new_start:
            raise AccountError("end must be after start")
        key = self._prefix + "account:" + account_id
        await self._bounded(lambda: self.redis.hset(key, mapping=mapping))
        return await self._require(account_id)

    async def _require(self, account_id: str) -> Account:
        self._check_id(account_id)
        account = await self.account(account_id)
        if account is None:
            raise AccountError(f"no account {account_id!r}")
        return account

    async def issue_token(self, account_id: str, label: str = "") -> tuple[str, TokenInfo]:
        """A new token for the account: (raw token, shown once; its listing entry)."""
        await self._require(account_id)
        token = new_token()
        digest = token_hash(token)
        info = TokenInfo("tok_" + secrets.token_hex(6), digest, int(self.clock()), label)
        record: dict[Any, Any] = {
            "account": account_id,
            "id": info.id,
            "created": str(info.created),
        }
        if label:
            record["label"] = label
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self._prefix + "token:" + digest, mapping=record)
        pipe.hset(self._prefix + "tokens:" + account_id, info.id, _encode(info))
        await self._bounded(pipe.execute)
        return token, info

    async def list_tokens(self, account_id: str) -> list[TokenInfo]:
        """The account's tokens, oldest first."""
        await self._require(account_id)
        raw = await self._bounded(lambda: self.redis.hvals(self._prefix + "tokens:" + account_id))
        return sorted((_token_info.decode(v) for v in raw), key=lambda t: (t.created, t.id))

    async def revoke_token(self, account_id: str, token_id: str) -> TokenInfo:
        """Revoke one token by id: its hash key goes, so the next request with it gets 401."""
        await self._require(account_id)
        listing = self._prefix + "tokens:" + account_id
        raw = await self._bounded(lambda: self.redis.hget(listing, token_id))
        if raw is None:
            raise AccountError(f"account {account_id!r} has no token {token_id!r}")
        info = _token_info.decode(raw)
        if info.revoked is None:
            info.revoked = int(self.clock())
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self._prefix + "token:" + info.sha256)
        pipe.hset(listing, token_id, _encode(info))
        await self._bounded(pipe.execute)
        return info
