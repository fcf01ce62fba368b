"""ASGI entry point: `gunicorn -k uvicorn.workers.UvicornWorker 'sidecars.transit.asgi:app()'`."""

import logging

import falcon.asgi

from sidecars.common.server import configure_logging

from .app import create_app
from .settings import TransitSettings


def app() -> falcon.asgi.App:
    """The whole API from the `TRANSIT_*` environment (a factory, so importing reads nothing)."""
    settings = TransitSettings.from_env()
    configure_logging(settings.server.log_level)
    # httpx logs every request with its full URL, query string (an API key) included; the
    # sidecar logs its fetches itself, without credentials.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return create_app(settings)
