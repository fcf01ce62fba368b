"""`create_app(settings)`: the usage API as a Falcon ASGI application.

`rate_limiter(settings)` is this package's other public entry: the account-aware rate limiter
as middleware for another app (the transit API installs it when TRANSIT_RATE_LIMIT=true).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import falcon
import falcon.asgi

from sidecars.common.clients import RequestLimits, parse_networks
from sidecars.common.lifecycle import Lifecycle
from sidecars.common.ratelimit import RateLimitConfig, RateLimitMiddleware

from . import resources as r
from .db.daily import DailyTable
from .openapi import openapi_document
from .plans import Plan, load_plans
from .rollup import Rollup
from .settings import Settings
from .store import StoreUnavailable, UsageStore
from .webhooks import Notifier

REALM = "api"


def rate_limit_middleware(settings: Settings, store: UsageStore) -> RateLimitMiddleware:
    """The rate-limit middleware wired to a usage store."""
    config = RateLimitConfig(
        address=settings.ratelimit_address,
        domain=settings.ratelimit_domain,
        timeout_seconds=settings.ratelimit_timeout_seconds,
        failure_mode=settings.ratelimit_failure_mode,
        quota_exempt_paths=frozenset(settings.quota_exempt_paths),
        exempt_paths=frozenset(settings.exempt_paths),
        retry_after_seconds=settings.retry_after_seconds,
        count_error_responses=settings.count_error_responses,
        invalid_token_limit=settings.invalid_token_limit,
        idempotent_answer_bytes=settings.idempotency_max_answer_bytes,
    )
    return RateLimitMiddleware(
        config,
        authenticate=store.authenticate,
        admit=store.admit,
        refund=store.refund,
        remember=store.remember,
        count_invalid_token=store.count_invalid_token,
        unavailable=(StoreUnavailable,),
        realm=REALM,
    )


def rate_limiter(settings: Settings) -> list[object]:
    """The usage API's rate limiter for another Falcon app: the middleware over its own
    account store, and the lifecycle of the store's background work (rollup passes, and the
    threshold notifier when USAGE_WEBHOOK_URL is set: requests counted there cross
    thresholds too), which closes the store on shutdown."""
    store = UsageStore(settings, load_plans(settings.plans_file))
    background = Background(store)
    lifecycle = Lifecycle(startup=background.start, shutdown=background.stop)
    return [rate_limit_middleware(settings, store), lifecycle]


class Background:
    """A worker's background work, started and stopped with the ASGI lifespan: the rollup
    passes and, when USAGE_WEBHOOK_URL is set, the threshold notifier (which the store tells
    about counted requests). Stopped before the store closes, so the Redis connections and
    the database go last, before the worker's loop."""

    def __init__(self, store: UsageStore) -> None:
        self.store = store
        self.rollup = Rollup(store)
        self.notifier = None
        if store.settings.webhook_url:
            self.notifier = Notifier(store.settings, store.db, store.clock)
            store.crossings = self.notifier

    def start(self) -> None:
        """Start the rollup passes and the notifier in the worker's loop."""
        self.rollup.start()
        if self.notifier is not None:
            self.notifier.start()

    async def stop(self) -> None:
        """Stop them, then close the store."""
        await self.rollup.stop()
        if self.notifier is not None:
            await self.notifier.close()
        await self.store.close()


def create_app(
    settings: Settings,
    *,
    middleware: Iterable[object] | None = None,
    store: UsageStore | None = None,
    plans: Mapping[str, Plan] | None = None,
    clock: Callable[[], float] = time.time,
) -> falcon.asgi.App:
    """Build the app.

    `middleware=None` installs the rate-limit middleware built from the settings (none when
    `USAGE_RATE_LIMIT=false`, e.g. behind an Envoy that already asks ratelimitd); pass a list
    (e.g. `[]`) to replace it. The usage resource authenticates by itself when no middleware
    did.
    """
    if store is None:
        store = UsageStore(settings, plans or load_plans(settings.plans_file), clock=clock)
    background = Background(store)
    limiter: RateLimitMiddleware | None = None
    if middleware is None:
        limiter = rate_limit_middleware(settings, store) if settings.rate_limit else None
        middleware = [limiter] if limiter is not None else []
    else:
        limiter = next((m for m in middleware if isinstance(m, RateLimitMiddleware)), None)
    limits = RequestLimits(
        parse_networks(settings.trusted_proxies),
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
    )
    lifecycle = Lifecycle(startup=background.start, shutdown=background.stop)
    stack: list[Any] = [limits, *middleware, lifecycle]
    app = falcon.asgi.App(middleware=stack)
    # `format=` must reach the resource (and be refused), not vanish as a blank value.
    app.req_options.keep_blank_qs_values = True
    app.req_options.strip_url_path_trailing_slash = True

    retry_after = settings.retry_after_seconds
    app.add_route(settings.usage_path, r.Usage(store, REALM, retry_after))
    history = r.History(store, DailyTable(store.db), REALM, retry_after)
    app.add_route(settings.history_path, history)
    app.add_route(
        "/health",
        r.Health(
            store,
            settings.retry_after_seconds,
            probe_ratelimiter=limiter.probe if limiter is not None else None,
            ratelimiter_deny=settings.ratelimit_failure_mode == "deny",
        ),
    )
    app.add_route("/openapi.json", r.OpenApi(openapi_document(settings)))

    app.add_error_handler(Exception, r.unexpected_error)
    app.add_error_handler(falcon.HTTPError, r.http_error)
    return app
