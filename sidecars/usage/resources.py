"""Falcon resources of the usage API and its error handlers (every error body is ApiError)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import falcon
import falcon.asgi
import msgspec

from sidecars.common.errors import ApiError, answer
from sidecars.common.ratelimit import (
    AccessDenied,
    AuthFailure,
    authenticate_request,
    forbidden,
    unauthorized,
)

from .schemas import SubscriptionPeriod, UsageHealth, UsagePeriod, UsageResponse
from .store import Account, StoreUnavailable, UsageStore
from .windows import utc_datetime

log = logging.getLogger(__name__)

JSON = "application/json"
FORMATS = ["json"]
PARAMETERS = frozenset({"format"})
ALLOW = "GET, HEAD, OPTIONS"
_encode = msgspec.json.encode


class Usage:
    """`GET|HEAD|OPTIONS {base}/api/v2/user/usage`."""

    def __init__(self, store: UsageStore, realm: str, retry_after: int) -> None:
        self.store = store
        self.realm = realm
        self.retry_after = retry_after

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """The token's account: plan, limit, usage in the current window, periods."""
        unknown = sorted(set(req.params) - PARAMETERS)
        if unknown:
            # Strict, like `format`: a typo (`fromat=json`) is reported, not silently ignored.
            message = f"Unknown query parameter {unknown[0]!r}; supported: format."
            answer(resp, ApiError(400, "invalid_request", message))
            return
        # Every value but exactly `json` is refused, including an empty or repeated one.
        formats = req.get_param_as_list("format")
        if formats is not None and formats != FORMATS:
            message = f"Unsupported format {','.join(formats)!r}; supported values: json."
            answer(resp, ApiError(400, "invalid_format", message, FORMATS))
            return
        try:
            account: Account = await authenticate_request(req, self.store.authenticate)
            window, used = await self.store.usage(account)
        except AuthFailure as failure:
            unauthorized(resp, failure, self.realm)
            return
        except AccessDenied as denied:
            forbidden(resp, denied)
            return
        except StoreUnavailable as exc:
            log.warning("account store unavailable: %s", exc)
            message = "The account store is unavailable; retry shortly."
            answer(resp, ApiError(503, "store_unavailable", message), self.retry_after)
            return
        limit = self.store.plans[account.plan].limit
        body = UsageResponse(
            planName=account.plan,  # type: ignore[arg-type]  # checked against the plans
            planLimit=limit,
            currentUsage=used,
            remainingUsage=max(limit - used, 0),
            usageWindow=account.window,  # type: ignore[arg-type]
            subscriptionPeriod=SubscriptionPeriod(account.start, account.end),
            usagePeriod=UsagePeriod(utc_datetime(window.start), utc_datetime(window.end)),
        )
        resp.content_type = JSON
        resp.data = _encode(body)
        # Per-account figures behind a bearer token: no shared cache may keep them.
        resp.cache_control = ["no-store"]

    async def on_head(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """GET's status and headers; Falcon sends no body for HEAD."""
        await self.on_get(req, resp)

    async def on_options(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """No content; the allowed methods."""
        resp.status = falcon.HTTP_204
        resp.set_header("Allow", ALLOW)


class Health:
    """`GET /health`: each dependency and the overall status (see UsageHealth)."""

    def __init__(
        self,
        store: UsageStore,
        retry_after: int,
        probe_ratelimiter: Callable[[], Awaitable[bool | None]] | None = None,
        ratelimiter_deny: bool = False,
    ) -> None:
        self.store = store
        self.retry_after = retry_after
        self.probe_ratelimiter = probe_ratelimiter
        self.ratelimiter_deny = ratelimiter_deny

    async def _up(self, ping: Callable[[], Awaitable[None]]) -> bool:
        try:
            await ping()
            return True
        except StoreUnavailable:
            return False

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """Ping the database and Redis, probe ratelimitd."""
        database = await self._up(self.store.db.ping)
        counters = await self._up(self.store.ping)
        if counters and self.store.buffer.total:
            await self.store.flush()  # Redis is back: do not wait for the next flush round
        limiter = await self.probe_ratelimiter() if self.probe_ratelimiter else None
        counters_deny = self.store.settings.counter_failure_mode == "deny"
        if (
            not database
            or (not counters and counters_deny)
            or (limiter is False and self.ratelimiter_deny)
        ):
            status = "unavailable"
        elif not counters or limiter is False or self.store.buffer.total:
            status = "degraded"
        else:
            status = "ok"
        body = UsageHealth(
            status,  # type: ignore[arg-type]
            "ok" if database else "unavailable",
            "ok" if counters else "unavailable",
            "disabled" if limiter is None else "ok" if limiter else "unavailable",
            self.store.buffer.total,
        )
        if status == "unavailable":
            resp.status = falcon.HTTP_503
            resp.set_header("Retry-After", str(self.retry_after))
        resp.content_type = JSON
        resp.data = _encode(body)
        resp.cache_control = ["no-store"]


class OpenApi:
    """`GET /openapi.json`: the document, encoded once."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.body = _encode(document)

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """The OpenAPI document."""
        resp.content_type = JSON
        resp.data = self.body


async def http_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: falcon.HTTPError, params: Any
) -> None:
    """Falcon's errors (404, 405, bad requests) as ApiError bodies, keeping their headers."""
    status = ex.status_code
    if status == 404:
        body = ApiError(404, "not_found", f"No resource at {req.path}.")
    elif status == 405:
        body = ApiError(405, "method_not_allowed", f"{req.method} is not allowed here.")
    else:
        body = ApiError(status, "invalid_request", ex.title or "Bad request.")
    if ex.headers:
        resp.set_headers(ex.headers)
    answer(resp, body)


async def unexpected_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: Exception, params: Any
) -> None:
    """A bug: log it, answer 500 with a JSON body."""
    log.exception("unhandled error on %s %s", req.method, req.path, exc_info=ex)
    answer(resp, ApiError(500, "internal_error", "Internal server error."))
