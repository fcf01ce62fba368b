"""`python -m sidecars.transit`: run the API under gunicorn with uvicorn workers."""

import os
import sys

from .settings import Settings


def main() -> None:
    """Exec gunicorn with the bind address and worker count from the settings."""
    settings = Settings.from_env()
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "--worker-class",
        "uvicorn.workers.UvicornWorker",
        "--bind",
        f"{settings.host}:{settings.port}",
        "--workers",
        str(settings.workers),
        "--log-level",
        settings.log_level,
        # A worker parses its feed in a thread; give it time on slow machines.
        "--timeout",
        "120",
        # gunicorn 27's control socket has one default path per user: two servers (tests,
        # benchmarks, the usage sidecar) would fight over it.
        "--no-control-socket",
        *sys.argv[1:],
        "sidecars.transit.asgi:app()",
    ]
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()
