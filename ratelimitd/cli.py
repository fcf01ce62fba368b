"""Command-line entry points: `serve` (default), `check-config`, `client`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def check_config(argv: Sequence[str]) -> int:
    """`ratelimitd check-config [--merge-domain-config] PATH...`: validate config files."""
    from .config import ConfigError, load_files, load_ruleset

    parser = argparse.ArgumentParser(
        prog="ratelimitd check-config",
        description="Validate rate limit config files (files or directories) as the server would.",
    )
    parser.add_argument(
        "--merge-domain-config",
        "-merge_domain_configs",
        "--merge_domain_configs",
        dest="merge",
        action="store_true",
        help="allow several files to declare the same domain (MERGE_DOMAIN_CONFIG)",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH")
    args = parser.parse_args(list(argv))
    print("checking rate limit configs...")
    try:
        files = load_files(args.paths)
        for f in files:
            print(f"opening config file: {f.name}")
        ruleset = load_ruleset(files, merge_domains=args.merge)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    rules = sum(1 for _ in ruleset.rules())
    print(f"all rate limit configs ok: {len(files)} files, {len(ruleset)} domains, {rules} rules")
    return 0


def serve(argv: Sequence[str]) -> int:
    """`ratelimitd [serve]`: run the daemon configured by the environment."""
    from .logs import configure_logging
    from .settings import Settings, SettingsError

    if argv and argv[0] in ("-h", "--help"):
        print("usage: ratelimitd [serve]\n\nConfigured by environment variables (see README).")
        return 0
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"ratelimitd: {exc}", file=sys.stderr)
        return 1
    configure_logging(settings)
    if settings.workers.count > 1:
        from .workers import supervise

        prometheus = settings.stats.sink == "prometheus"
        return supervise(settings.workers.count, share_stats=prometheus)
    from .daemon import serve as run_daemon

    return run_daemon(settings)


def client(argv: Sequence[str]) -> int:
    """`ratelimitd client -dial_string HOST:PORT -domain D -descriptors k=v,...`."""
    from .transport.client import client_main

    return client_main(argv)


COMMANDS = {
    "serve": serve,
    "check-config": check_config,
    "client": client,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch `ratelimitd <command> ...`; no command means `serve`."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args and not args[0].startswith("-") else "serve"
    if args and command == args[0]:
        args = args[1:]
    handler = COMMANDS.get(command)
    if handler is None:
        known = ", ".join(COMMANDS)
        print(f"ratelimitd: unknown command '{command}' (known: {known})", file=sys.stderr)
        return 2
    return handler(args)
