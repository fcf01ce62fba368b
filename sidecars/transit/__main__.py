"""`python -m sidecars.transit`: run the API under gunicorn with uvicorn workers;
`python -m sidecars.transit validate [FEED]`: the validation report of a feed (cli.py)."""

import sys

from sidecars.common.server import exec_gunicorn, gunicorn_argv

from .settings import SettingsError, TransitSettings


def main() -> None:
    """Exec gunicorn with the bind address and worker count from the settings."""
    if sys.argv[1:2] == ["validate"]:
        from .cli import main as validate

        sys.exit(validate(sys.argv[2:]))
    try:
        server = TransitSettings.from_env().server
    except SettingsError as exc:
        sys.exit(f"error: {exc}")
    # A worker parses its feed in a thread; give it time on slow machines.
    argv = gunicorn_argv("sidecars.transit.asgi:app()", server, sys.argv[1:], timeout=120)
    exec_gunicorn(argv)


if __name__ == "__main__":
    main()
