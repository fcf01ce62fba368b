"""A Falcon ASGI middleware that asks ratelimitd for a decision on every request.

The usage API installs it with its Redis-backed accounts (`sidecars.usage.app`), and the
transit API installs the same when TRANSIT_RATE_LIMIT=true. Per request, in
`process_request`, before routing:

1. A bearer token, when the request carries one, is authenticated by the `authenticate`
   callable given (the usage sidecar's accounts). A Bearer header whose token is
   malformed, unknown or revoked is answered 401 right here, so a client with a bad token
   learns it instead of being served as anonymous. Other schemes and no header: anonymous.
2. Quota: for an account, the hits in its current window (the sum of ratelimitd's metered day
   buckets) are compared with its plan's limit. The sum is cached per process and re-read at
   most every `quota_refresh_seconds`; between reads the hits this process let through are
   added, so an account overshoots its quota by at most what other processes let through in
   one refresh interval. At the limit: 429 `quota_exceeded` (paths in `quota_exempt_paths`,
   e.g. the usage endpoint itself, stay reachable).
3. ShouldRateLimit with ratelimitd's public client (`ratelimitd.client.RateLimitClient`: one
   gRPC channel per process, a short deadline, reconnecting by itself) with descriptors
   (domain `domain`, one hit each):
       anonymous:  [("remote_address", <client address>)]
       account:    [("account", <id>)]  and  [("plan", <plan>), ("account", <id>)]
   The `account` rule of the ratelimitd config carries `meter: true`: that is what counts the
   request into the account's day bucket (sidecars/usage/ratelimit-config.yaml).
   OVER_LIMIT: 429 `rate_limited` with Retry-After and RateLimit-Limit/-Remaining/-Reset;
   allowed requests carry the RateLimit-* headers of their tightest limit.
   ratelimitd unreachable, too slow or answering UNKNOWN: `failure_mode` "allow" lets the
   request through, "deny" answers 503 `rate_limiter_unavailable` with Retry-After.

The account store's own errors stay its own: the exception types it raises when it cannot
answer are handed in (`unavailable=`) and answered 503 `store_unavailable` with Retry-After.
The authenticated principal is left in `req.context.principal` for the resources.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import falcon
import falcon.asgi

from ratelimitd.client import RateLimitClient, RateLimitError
from ratelimitd.messages import OK, OVER_LIMIT, Response

from .errors import ApiError, answer

log = logging.getLogger(__name__)


class Principal(Protocol):
    """Who a token belongs to: what the descriptors are made of."""

    @property
    def id(self) -> str: ...

    @property
    def plan(self) -> str: ...


# Token -> principal, or None for an unknown/revoked token; raises on an unavailable store.
Authenticate = Callable[[str], Awaitable[Principal | None]]
# Principal -> (hits in the current window, plan limit, epoch seconds when the window moves).
QuotaProbe = Callable[[Any], Awaitable[tuple[int, int, float]]]


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    """How the middleware asks ratelimitd and enforces quotas."""

    address: str  # host:port of ratelimitd's gRPC listener; "" asks no one (auth and quota only)
    domain: str = "api"
    timeout_seconds: float = 0.25
    failure_mode: str = "allow"  # or "deny"
    quota_refresh_seconds: float = 2.0
    quota_exempt_paths: frozenset[str] = frozenset()
    exempt_paths: frozenset[str] = frozenset()
    retry_after_seconds: int = 5  # when the account store is unavailable
    quota_cache_entries: int = 100_000


class AccessDenied(Exception):
    """Raised by `authenticate` for a valid token whose holder may not be served now (e.g. a
    suspended account): answered 403 with `error`."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def forbidden(resp: falcon.asgi.Response, denied: AccessDenied) -> None:
    """Answer 403 with the refusal's code."""
    answer(resp, ApiError(403, denied.error, denied.message))


class AuthFailure(Exception):
    """A request that must be answered 401; `token_given` decides the challenge."""

    def __init__(self, token_given: bool) -> None:
        super().__init__("invalid_token" if token_given else "unauthorized")
        self.token_given = token_given


def bearer_token(header: str | None) -> str | None:
    """The token of a `Bearer` Authorization header; "" for a Bearer header with no token.

    None when there is no header or it uses another scheme (the caller is anonymous).
    """
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = rest.strip()
    # More than one credential after the scheme is malformed; "" signals it to the caller.
    return "" if " " in token else token


async def authenticate_request(req: falcon.asgi.Request, authenticate: Authenticate) -> Any:
    """The principal of a request; raises AuthFailure (401), or what `authenticate` raises."""
    principal = getattr(req.context, "principal", None)
    if principal is not None:
        return principal
    token = bearer_token(req.get_header("Authorization"))
    if token is None:
        raise AuthFailure(token_given=False)
    principal = await authenticate(token) if token else None
    if principal is None:
        raise AuthFailure(token_given=True)
    req.context.principal = principal
    return principal


def unauthorized(resp: falcon.asgi.Response, failure: AuthFailure, realm: str = "api") -> None:
    """Answer 401 with the RFC 6750 challenge. Unknown and revoked tokens look the same."""
    challenge = f'Bearer realm="{realm}"'
    if failure.token_given:
        challenge += ', error="invalid_token", error_description="The access token is invalid"'
        body = ApiError(401, "invalid_token", "The access token is invalid.")
    else:
        body = ApiError(401, "unauthorized", "A bearer token is required.")
    resp.set_header("WWW-Authenticate", challenge)
    answer(resp, body)


class QuotaCache:
    """Per-process window sums, re-read at most every `refresh` seconds, plus local hits."""

    def __init__(
        self,
        probe: QuotaProbe,
        refresh: float,
        max_entries: int,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.probe = probe
        self.wall_clock = wall_clock
        self.refresh = refresh
        self.max_entries = max_entries
        self.clock = clock
        # account id -> [hits at read, local hits since, limit, window moves at, read at]
        self._entries: collections.OrderedDict[str, list[Any]] = collections.OrderedDict()
        self._reading: dict[str, asyncio.Future[list[Any]]] = {}

    async def state(self, principal: Any) -> tuple[int, int, float]:
        """(hits in the window as far as this process knows, limit, epoch when it moves)."""
        entry = self._entries.get(principal.id)
        now = self.clock()
        # Re-read when stale, and at once when the window has moved (a new cycle or day).
        if entry is None or now - entry[4] >= self.refresh or self.wall_clock() >= entry[3]:
            entry = await self._read(principal)
        else:
            self._entries.move_to_end(principal.id)
        return entry[0] + entry[1], entry[2], entry[3]

    async def _read(self, principal: Any) -> list[Any]:
        # Concurrent requests of one account share one read instead of stampeding Redis.
        pending = self._reading.get(principal.id)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this request was cancelled
                # The request doing the read was cancelled (its client went away): read anew.
                return await self._read(principal)
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._reading[principal.id] = future
        try:
            started = self.clock()
            used, limit, moves_at = await self.probe(principal)
            entry = [used, 0, limit, moves_at, started]
            self._entries[principal.id] = entry
            self._entries.move_to_end(principal.id)
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            future.set_result(entry)
            return entry
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            # Retrieved here so a read nobody else awaited does not log "never retrieved".
            future.exception()
            raise
        finally:
            del self._reading[principal.id]

    def count(self, principal: Any) -> None:
        """Record a hit this process let through since the last read."""
        entry = self._entries.get(principal.id)
        if entry is not None:
            entry[1] += 1


class RateLimitMiddleware:
    """Authenticate, enforce the quota, ask ratelimitd; see the module docstring."""

    def __init__(
        self,
        config: RateLimitConfig,
        *,
        authenticate: Authenticate,
        quota: QuotaProbe | None = None,
        unavailable: tuple[type[Exception], ...] = (),
        realm: str = "api",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.wall_clock = wall_clock
        self.authenticate = authenticate
        # What `authenticate` / `quota` raise when their store cannot answer: 503, not 500.
        self.unavailable = unavailable
        self.realm = realm
        self.client = (
            RateLimitClient(config.address, timeout=config.timeout_seconds)
            if config.address
            else None
        )
        self.quota = (
            QuotaCache(
                quota, config.quota_refresh_seconds, config.quota_cache_entries, clock, wall_clock
            )
            if quota is not None
            else None
        )
        self._deny = config.failure_mode == "deny"

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """Decide the request; complete `resp` when it is refused."""
        # Preflights carry no credentials and health probes must not be limited.
        if req.method == "OPTIONS" or req.path in self.config.exempt_paths:
            return
        principal = None
        if bearer_token(req.get_header("Authorization")) is not None:
            try:
                principal = await authenticate_request(req, self.authenticate)
            except AuthFailure as failure:
                unauthorized(resp, failure, self.realm)
                return
            except AccessDenied as denied:
                forbidden(resp, denied)
                return
            except self.unavailable:
                self._store_unavailable(resp)
                return
        if principal is not None:
            if self.quota is not None and req.path not in self.config.quota_exempt_paths:
                try:
                    used, limit, moves_at = await self.quota.state(principal)
                except self.unavailable:
                    self._store_unavailable(resp)
                    return
                if used >= limit:
                    wait = int(moves_at - self.wall_clock()) + 1
                    message = f"The plan's quota of {limit} requests in this window is used up."
                    answer(resp, ApiError(429, "quota_exceeded", message), retry_after=wait)
                    return
            descriptors: tuple[tuple[tuple[str, str], ...], ...] = (
                (("account", principal.id),),
                (("plan", principal.plan), ("account", principal.id)),
            )
        else:
            descriptors = ((("remote_address", req.remote_addr or "unknown"),),)
        if self.client is not None:
            decision = await self._decide(self.client, descriptors)
            if decision is None or decision.overall_code not in (OK, OVER_LIMIT):
                if self._deny:
                    message = "The rate limiter is unavailable; retry shortly."
                    answer(resp, ApiError(503, "rate_limiter_unavailable", message), 1)
                    return
            else:
                over = self._headers(resp, decision)
                if over is not None:
                    message = f"Too many requests; retry in {over} s."
                    answer(resp, ApiError(429, "rate_limited", message), retry_after=over)
                    return
        if principal is not None and self.quota is not None:
            self.quota.count(principal)

    async def _decide(
        self, client: RateLimitClient, descriptors: Iterable[Sequence[tuple[str, str]]]
    ) -> Response | None:
        """The decision for one hit, or None when ratelimitd cannot give one in time."""
        try:
            return await client.should_rate_limit(self.config.domain, descriptors, 1)
        except RateLimitError as exc:
            log.warning("ratelimitd %s: %s", client.target, exc.code.name)
            return None

    def _headers(self, resp: falcon.asgi.Response, decision: Response) -> int | None:
        """Set RateLimit-* of the tightest limit; the seconds to wait when over a limit."""
        tightest = None
        wait = None
        for status in decision.statuses:
            if status.rule is None:
                continue
            if status.code == OVER_LIMIT:
                reset = max(1, status.duration_until_reset)
                wait = reset if wait is None else max(wait, reset)
                if tightest is None or tightest.code != OVER_LIMIT:
                    tightest = status
            elif tightest is None or (
                tightest.code != OVER_LIMIT and status.limit_remaining < tightest.limit_remaining
            ):
                tightest = status
        if tightest is not None:
            resp.set_header("RateLimit-Limit", str(tightest.rule.requests_per_unit))
            resp.set_header("RateLimit-Remaining", str(tightest.limit_remaining))
            resp.set_header("RateLimit-Reset", str(tightest.duration_until_reset))
        return wait

    def _store_unavailable(self, resp: falcon.asgi.Response) -> None:
        message = "The account store is unavailable; retry shortly."
        answer(resp, ApiError(503, "store_unavailable", message), self.config.retry_after_seconds)

    async def process_shutdown(self, scope: dict, event: dict) -> None:
        """Close the client's gRPC channel."""
        if self.client is not None:
            await self.client.close()
