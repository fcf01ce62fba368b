"""ASGI entry point: `gunicorn -k uvicorn.workers.UvicornWorker 'sidecars.transit.asgi:app()'`."""

import logging

import falcon.asgi

from .app import create_app
from .settings import Settings


def app() -> falcon.asgi.App:
    """Build the app from the `TRANSIT_*` environment (a factory, so importing reads nothing)."""
    settings = Settings.from_env()
    # gunicorn configures only its own loggers; feed loads and rejections log here.
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    return create_app(settings)
