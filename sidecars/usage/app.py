"""`create_app(settings)`: the usage API as a Falcon ASGI application."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import falcon
import falcon.asgi

from sidecars.ratelimit_middleware import RateLimitConfig, RateLimitMiddleware

from . import resources as r
from .openapi import openapi_document
from .plans import Plan, load_plans
from .settings import Settings
from .store import Account, UsageStore

REALM = "api"


class StoreLifecycle:
    """Closes the store's connection pool when the ASGI app shuts down."""

    def __init__(self, store: UsageStore) -> None:
        self.store = store

    async def process_shutdown(self, scope: dict, event: dict) -> None:
        """Close Redis connections before the worker's loop goes."""
        await self.store.close()


def rate_limit_middleware(settings: Settings, store: UsageStore) -> RateLimitMiddleware:
    """The rate-limit middleware wired to the usage store (also for the transit API)."""
    config = RateLimitConfig(
        address=settings.ratelimit_address,
        domain=settings.ratelimit_domain,
        timeout_seconds=settings.ratelimit_timeout_seconds,
        failure_mode=settings.ratelimit_failure_mode,
        quota_refresh_seconds=settings.quota_refresh_seconds,
        quota_exempt_paths=frozenset(settings.quota_exempt_paths),
        exempt_paths=frozenset(settings.exempt_paths),
        retry_after_seconds=settings.retry_after_seconds,
    )

    async def quota(account: Account) -> tuple[int, int, float]:
        window, used = await store.usage(account)
        return used, store.plans[account.plan].limit, float(window.end)

    return RateLimitMiddleware(
        config, authenticate=store.authenticate, quota=quota, realm=REALM, wall_clock=store.clock
    )


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
    if middleware is None:
        middleware = [rate_limit_middleware(settings, store)] if settings.rate_limit else []
    stack: list[Any] = [*middleware, StoreLifecycle(store)]
    app = falcon.asgi.App(middleware=stack)
    # `format=` must reach the resource (and be refused), not vanish as a blank value.
    app.req_options.keep_blank_qs_values = True
    app.req_options.strip_url_path_trailing_slash = True

    app.add_route(settings.usage_path, r.Usage(store, REALM, settings.retry_after_seconds))
    app.add_route("/health", r.Health(store, settings.retry_after_seconds))
    app.add_route("/openapi.json", r.OpenApi(openapi_document(settings)))

    app.add_error_handler(Exception, r.unexpected_error)
    app.add_error_handler(falcon.HTTPError, r.http_error)
    return app
