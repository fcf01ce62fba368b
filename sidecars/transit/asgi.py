"""ASGI entry point: `gunicorn -k uvicorn.workers.UvicornWorker 'sidecars.transit.asgi:app()'`."""

import falcon.asgi

from sidecars.common.server import configure_logging

from .app import create_app
from .settings import TransitSettings


def app() -> falcon.asgi.App:
    """The whole API from the `TRANSIT_*` environment (a factory, so importing reads nothing)."""
    settings = TransitSettings.from_env()
    configure_logging(settings.server.log_level)
    return create_app(settings)
