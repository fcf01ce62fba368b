"""ASGI entry point: `gunicorn -k uvicorn.workers.UvicornWorker 'sidecars.transit.asgi:app()'`."""

import falcon.asgi

from .app import create_app
from .settings import Settings


def app() -> falcon.asgi.App:
    """Build the app from the `TRANSIT_*` environment (a factory, so importing reads nothing)."""
    return create_app(Settings.from_env())
