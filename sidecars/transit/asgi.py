"""ASGI entry point: `gunicorn -k uvicorn.workers.UvicornWorker 'sidecars.transit.asgi:app()'`."""

import falcon.asgi

from sidecars.common.server import configure_logging

from .app import create_app
from .part2 import Part2Settings, register_routes
from .settings import Settings
from .store import TransitStore


def app() -> falcon.asgi.App:
    """Both parts of the API (network and realtime; metrics, locations and facilities) from
    the `TRANSIT_*` environment (a factory, so importing reads nothing)."""
    settings = Settings.from_env()
    configure_logging(settings.log_level)
    store = TransitStore(settings)
    middleware: list[object] = []
    if settings.rate_limit:
        # The usage API's rate limiter (USAGE_* settings): anonymous callers by address,
        # accounts by token, metered and held to their plan.
        from sidecars.usage.app import rate_limiter
        from sidecars.usage.settings import Settings as UsageSettings

        middleware = rate_limiter(UsageSettings.from_env())
    application = create_app(settings, store=store, middleware=middleware)
    register_routes(application, Part2Settings.from_env(), store)
    return application
