"""How a sidecar runs: gunicorn with uvicorn workers, and one log format for its workers."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LOG_FORMAT = "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"


@dataclass(frozen=True, slots=True)
class Server:
    """Where and how a sidecar serves: what its settings say about gunicorn (each sidecar's
    settings extend it; the usage sidecar's with its own default port)."""

    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 2
    log_level: str = "info"


def gunicorn_argv(
    app: str,
    server: Server,
    extra: Sequence[str] = (),
    timeout: int | None = None,
    worker_class: str = "uvicorn.workers.UvicornWorker",
) -> list[str]:
    """The gunicorn command line serving the ASGI factory `app` (`module:factory()`)."""
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "--worker-class",
        worker_class,
        "--bind",
        f"{server.host}:{server.port}",
        "--workers",
        str(server.workers),
        "--log-level",
        server.log_level,
    ]
    if timeout is not None:
        argv += ["--timeout", str(timeout)]
    # gunicorn 27's control socket has one default path per user: two servers (the other
    # sidecar, tests, benchmarks) would fight over it.
    argv.append("--no-control-socket")
    return [*argv, *extra, app]


def exec_gunicorn(argv: list[str], env: Mapping[str, str] | None = None) -> None:
    """Replace this process with gunicorn (so signals reach the arbiter directly), with the
    environment `env` when given (the one its workers build their settings from)."""
    if env is None:
        os.execv(argv[0], argv)
    else:
        os.execve(argv[0], argv, env)


def configure_logging(level: str) -> None:
    """Log the app's own records (feed loads, store errors) like gunicorn's: it configures
    only its own loggers."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
