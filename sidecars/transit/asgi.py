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
    application = create_app(settings, store=store)
    register_routes(application, Part2Settings.from_env(), store)
    return application
