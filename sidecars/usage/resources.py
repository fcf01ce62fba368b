"""Falcon resources of the usage API and its error handlers (every error body is ApiError)."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from datetime import date
from typing import Any

import falcon
import falcon.asgi
import msgspec

from sidecars.common.errors import ApiError, answer
from sidecars.common.ratelimit import (
    AccessDenied,
    AuthFailure,
    authenticate_request,
    refused,
    unauthorized,
)

from .db.daily import DailyTable
from .schemas import (
    DailyPoint,
    SubscriptionPeriod,
    UsageHealth,
    UsageHistory,
    UsagePeriod,
    UsageResponse,
)
from .store import Account, StoreUnavailable, UsageStore
from .windows import day_range, utc_date, utc_datetime

log = logging.getLogger(__name__)

JSON = "application/json"
FORMATS = ["json"]
ALLOW = "GET, HEAD, OPTIONS"
# Per call: a year and a month of daily points, the retention's default.
MAX_HISTORY_DAYS = 400
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_encode = msgspec.json.encode


class BadRequest(Exception):
    """A query the resource refuses (400) with `error`."""

    def __init__(self, message: str, error: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.error = error


def respond(resp: falcon.asgi.Response, body: msgspec.Struct) -> None:
    """Answer 200 with a JSON body no shared cache may keep (per-account figures behind a
    bearer token, or the operator's)."""
    resp.content_type = JSON
    resp.data = _encode(body)
    resp.cache_control = ["no-store"]


def store_unavailable(resp: falcon.asgi.Response, exc: Exception, retry_after: int) -> None:
    """Answer 503 `store_unavailable` with Retry-After (the database or Redis is down)."""
    log.warning("account store unavailable: %s", exc)
    message = "The account store is unavailable; retry shortly."
    answer(resp, ApiError(503, "store_unavailable", message), retry_after)


class AccountResource:
    """A resource answering for the token's account: strict query parameters (a typo such as
    `fromat=json` is reported, not ignored), authentication, and the shared error answers."""

    parameters: frozenset[str] = frozenset({"format"})

    def __init__(self, store: UsageStore, realm: str, retry_after: int) -> None:
        self.store = store
        self.realm = realm
        self.retry_after = retry_after

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """Check the query, authenticate, answer (`answer`) or the error."""
        try:
            self.check_query(req)
            account: Account = await authenticate_request(req, self.store.authenticate)
            body = await self.answer(req, account)
        except BadRequest as bad:
            supported = FORMATS if bad.error == "invalid_format" else None
            answer(resp, ApiError(400, bad.error, bad.message, supported))
            return
        except AuthFailure as failure:
            unauthorized(resp, failure, self.realm)
            return
        except AccessDenied as denied:
            refused(resp, denied)
            return
        except StoreUnavailable as exc:
            store_unavailable(resp, exc, self.retry_after)
            return
        respond(resp, body)

    def check_query(self, req: falcon.asgi.Request) -> None:
        """Refuse unknown parameters and any `format` but exactly `json`."""
        unknown = sorted(set(req.params) - self.parameters)
        if unknown:
            supported = ", ".join(sorted(self.parameters))
            raise BadRequest(f"Unknown query parameter {unknown[0]!r}; supported: {supported}.")
        # Every value but exactly `json` is refused, including an empty or repeated one.
        formats = req.get_param_as_list("format")
        if formats is not None and formats != FORMATS:
            raise BadRequest(
                f"Unsupported format {','.join(formats)!r}; supported values: json.",
                "invalid_format",
            )

    async def answer(self, req: falcon.asgi.Request, account: Account) -> msgspec.Struct:
        """The body for an authenticated request."""
        raise NotImplementedError

    async def on_head(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """GET's status and headers; Falcon sends no body for HEAD."""
        await self.on_get(req, resp)

    async def on_options(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """No content; the allowed methods."""
        resp.status = falcon.HTTP_204
        resp.set_header("Allow", ALLOW)


class Usage(AccountResource):
    """`GET|HEAD|OPTIONS {base}/api/v2/user/usage`: the token's account's plan, limit, usage
    in the current window (from Redis) and periods."""

    async def answer(self, req: falcon.asgi.Request, account: Account) -> msgspec.Struct:
        """The current window's figures."""
        window, used = await self.store.usage(account)
        limit = self.store.plans[account.plan].limit
        return UsageResponse(
            planName=account.plan,  # type: ignore[arg-type]  # checked against the plans
            planLimit=limit,
            currentUsage=used,
            remainingUsage=max(limit - used, 0),
            usageWindow=account.window,  # type: ignore[arg-type]
            subscriptionPeriod=SubscriptionPeriod(account.start, account.end),
            usagePeriod=UsagePeriod(utc_datetime(window.start), utc_datetime(window.end)),
        )


def day_param(req: falcon.asgi.Request, name: str) -> date | None:
    """Query parameter `name` as one YYYY-MM-DD calendar date, or None when absent."""
    values = req.get_param_as_list(name)
    if values is None:
        return None
    if len(values) != 1 or _DATE.fullmatch(values[0]) is None:
        raise BadRequest(f"{name!r} must be one date, YYYY-MM-DD.")
    try:
        return date.fromisoformat(values[0])
    except ValueError:
        raise BadRequest(f"{name}={values[0]!r} is not a calendar date.") from None


class History(AccountResource):
    """`GET|HEAD|OPTIONS {base}/api/v2/user/usage/history?from=&to=`: the token's account's
    daily usage from the system of record (rolled up from the counters)."""

    parameters = frozenset({"format", "from", "to"})

    def __init__(self, store: UsageStore, daily: DailyTable, realm: str, retry_after: int) -> None:
        super().__init__(store, realm, retry_after)
        self.daily = daily

    def check_query(self, req: falcon.asgi.Request) -> None:
        """Also the range: valid dates, `from` <= `to`, at most MAX_HISTORY_DAYS days."""
        super().check_query(req)
        first, last = self.range(req)
        days = (last - first).days + 1
        if days > MAX_HISTORY_DAYS:
            raise BadRequest(f"The range has {days} days; at most {MAX_HISTORY_DAYS} per call.")

    def range(self, req: falcon.asgi.Request) -> tuple[date, date]:
        """[from, to]: `to` defaults to today (UTC), `from` to the 30 days ending at `to`."""
        last = day_param(req, "to") or utc_date(self.store.clock())
        try:
            return day_range(day_param(req, "from"), last)
        except ValueError as exc:
            raise BadRequest(f"{str(exc)[0].upper()}{str(exc)[1:]}.") from None

    async def answer(self, req: falcon.asgi.Request, account: Account) -> msgspec.Struct:
        """The account's days in the range."""
        first, last = self.range(req)
        rows = await self.daily.series(account.id, first, last)
        points = [
            DailyPoint(r.day, r.usage, r.plan, r.limit)  # type: ignore[arg-type]
            for r in rows
        ]
        return UsageHistory(first, last, points)


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
