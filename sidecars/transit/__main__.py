"""`python -m sidecars.transit`: run the API under gunicorn with uvicorn workers."""

import sys

from sidecars.common.server import exec_gunicorn, gunicorn_argv

from .settings import TransitSettings


def main() -> None:
    """Exec gunicorn with the bind address and worker count from the settings."""
    server = TransitSettings.from_env().server
    exec_gunicorn(
        gunicorn_argv(
            "sidecars.transit.asgi:app()",
            host=server.host,
            port=server.port,
            workers=server.workers,
            log_level=server.log_level,
            extra=sys.argv[1:],
            # A worker parses its feed in a thread; give it time on slow machines.
            timeout=120,
        )
    )


if __name__ == "__main__":
    main()
