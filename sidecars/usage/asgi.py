"""ASGI entry point: `gunicorn -k uvicorn.workers.UvicornWorker 'sidecars.usage.asgi:app()'`."""

import logging

import falcon.asgi

from .app import create_app
from .settings import Settings


def app() -> falcon.asgi.App:
    """Build the app from the `USAGE_*` environment (a factory, so importing reads nothing)."""
    settings = Settings.from_env()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    return create_app(settings)
