"""`python -m sidecars.transit`: run the API under gunicorn with uvicorn workers."""

import sys

from sidecars.common.server import exec_gunicorn, gunicorn_argv

from .settings import TransitSettings


def main() -> None:
    """Exec gunicorn with the bind address and worker count from the settings."""
    server = TransitSettings.from_env().server
    # A worker parses its feed in a thread; give it time on slow machines.
    argv = gunicorn_argv("sidecars.transit.asgi:app()", server, sys.argv[1:], timeout=120)
    exec_gunicorn(argv)


if __name__ == "__main__":
    main()
