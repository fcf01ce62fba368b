"""ASGI entry point: `gunicorn -k uvicorn.workers.UvicornWorker 'sidecars.usage.asgi:app()'`."""

import falcon.asgi

from sidecars.common.server import configure_logging

from .app import create_app
from .settings import Settings


def app() -> falcon.asgi.App:
    """Build the app from the `USAGE_*` environment (a factory, so importing reads nothing)."""
    settings = Settings.from_env()
    configure_logging(settings.log_level)
    return create_app(settings)
