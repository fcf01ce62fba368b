"""ASGI entry point: `gunicorn -k uvicorn.workers.UvicornWorker 'sidecars.transit.asgi:app()'`."""

import logging

import falcon.asgi

from .app import create_app
from .part2 import Part2Settings, register_routes
from .settings import Settings
from .store import TransitStore


def app() -> falcon.asgi.App:
    """Both parts of the API (network and realtime; metrics, locations and facilities) from
    the `TRANSIT_*` environment (a factory, so importing reads nothing)."""
    settings = Settings.from_env()
    # gunicorn configures only its own loggers; feed loads and rejections log here.
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    store = TransitStore(settings)
    middleware: list[object] = []
    if settings.rate_limit:
        # The same middleware as the usage API: anonymous callers by address, accounts by
        # token, metered and held to their plan (USAGE_* settings).
        from sidecars.usage.app import StoreLifecycle, rate_limit_middleware
        from sidecars.usage.plans import load_plans
        from sidecars.usage.settings import Settings as UsageSettings
        from sidecars.usage.store import UsageStore

        usage = UsageSettings.from_env()
        usage_store = UsageStore(usage, load_plans(usage.plans_file))
        middleware = [rate_limit_middleware(usage, usage_store), StoreLifecycle(usage_store)]
    application = create_app(settings, store=store, middleware=middleware)
    register_routes(application, Part2Settings.from_env(), store)
    return application
