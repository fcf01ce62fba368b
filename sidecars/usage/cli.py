"""`python -m sidecars.usage`: serve the API, administer accounts and tokens, report usage.

    [--redis-url U] [--sqlite-path P | --postgres-dsn D] [--plans-file F] COMMAND ...
    serve [gunicorn args...]                       gunicorn + uvicorn workers (USAGE_* settings)
    accounts create ID --plan P [--window W] [--start DATE] [--end DATE]
    accounts update ID [--plan P] [--window W|default] [--start DATE] [--end DATE|none]
                       [--thresholds 80,100|plan|none]
    accounts show ID                               the record, its window and current usage
    accounts list [--format json|table]
    accounts suspend ID | resume ID                refuse (403) / serve the account's tokens again
    accounts delete ID --yes                       the account and its tokens
    tokens issue ID [--label TEXT] [--expires DATE|DURATION]   prints the raw token once
    tokens list ID [--format json|table]           ids, created, last used, expiry, revoked
    tokens revoke ID TOKEN_ID
    usage rollup                                   copy the day buckets into SQL now
    usage show ID [--from DATE] [--to DATE] [--format chart|json]
    usage export --from DATE --to DATE [--account ID] [--format csv|jsonl] [--output FILE]
    webhooks list [--account ID] [--status S] [--limit N] [--format json|table]
    webhooks show EVENT_ID | webhooks resend EVENT_ID

The options before the command are the server's USAGE_* settings of the same name: they are
overrides applied by `settings` (`Settings.from_env(overrides=...)`, and for `serve` the
environment gunicorn's workers get), so the CLI always reaches the server's database and
Redis. Output is JSON on stdout (or a table, a chart, the export); errors go to stderr with
exit status 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any

import msgspec

from sidecars.common.server import exec_gunicorn, gunicorn_argv

from . import admin, reports
from .admin import Table
from .db.events import STATUSES
from .meters import MeterError, load_meters
from .plans import PLAN_NAMES, WINDOW_KINDS, PlanError, load_plans, parse_thresholds
from .settings import Settings, SettingsError, environment
from .store import KEEP, AccountError, StoreUnavailable, UsageStore

_encode = msgspec.json.encode
# Global options and the USAGE_* variable each one sets.
OPTIONS = {
    "redis_url": "USAGE_REDIS_URL",
    "sqlite_path": "USAGE_SQLITE_PATH",
    "postgres_dsn": "USAGE_POSTGRES_DSN",
    "plans_file": "USAGE_PLANS_FILE",
}
_DURATION = re.compile(r"(\d+)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a YYYY-MM-DD date") from None


def _thresholds(text: str) -> str:
    """`80,100`, `plan` (the plan's) or `none`, as `update_account` takes it."""
    if text == "plan":
        return text
    if text == "none":
        return ""
    try:
        parse_thresholds(text)
    except PlanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _end(text: str) -> date | None:
    return None if text.lower() in ("none", "") else _date(text)


class Expiry(msgspec.Struct, frozen=True):
    """`--expires`: an instant (epoch seconds) or a duration from now (seconds)."""

    at: int | None = None
    after: int | None = None

    def resolve(self, now: float) -> int:
        """The expiry instant, in epoch seconds."""
        return self.at if self.at is not None else int(now) + (self.after or 0)


def _expires(text: str) -> Expiry:
    """An ISO date (00:00Z that day), an ISO date-time (UTC unless it says), or a duration
    `<n>s|m|h|d|w` (e.g. 90d) from now."""
    text = text.strip()
    duration = _DURATION.fullmatch(text)
    if duration:
        seconds = int(duration.group(1)) * _UNIT[duration.group(2)]
        if seconds <= 0:
            raise argparse.ArgumentTypeError("the duration must be positive")
        return Expiry(after=seconds)
    try:
        if len(text) == 10:
            moment = datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC)
        else:
            moment = datetime.fromisoformat(text)
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 date / date-time nor a duration like 90d, 12h, "
            "30m, 3600s, 2w"
        ) from None
    return Expiry(at=int(moment.timestamp()))


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m sidecars.usage",
        description="Serve the account usage API; administer its accounts and tokens; report "
        "daily usage and threshold webhook events.",
        epilog="Settings not given as options come from the USAGE_* environment, as for the "
        "server (see sidecars/usage/README.md).",
    )
    for name, variable in OPTIONS.items():
        p.add_argument("--" + name.replace("_", "-"), help=f"overrides {variable}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "serve",
        help="run the API under gunicorn with uvicorn workers",
        description="Run the API under gunicorn; arguments after `serve` go to gunicorn "
        "(`python -m gunicorn --help` lists them).",
    )

    acc = _actions(sub, "accounts", "create, update, show, list, suspend, resume, delete accounts")
    create = acc.add_parser("create", help="create an account", description="Create an account.")
    create.add_argument("account", help="account id: 1-64 of A-Z a-z 0-9 _ . -")
    create.add_argument("--plan", required=True, choices=PLAN_NAMES)
    create.add_argument("--window", choices=WINDOW_KINDS, default="", help="default: the plan's")
    create.add_argument("--start", type=_date, help="subscription start (UTC); default today")
    create.add_argument("--end", type=_end, help="subscription end, exclusive; default open")
    update = acc.add_parser(
        "update",
        help="change an account's plan, window or period",
        description="Change an account; what is not given is kept. A plan change applies to "
        "the current window at once (see README, Plan changes).",
    )
    update.add_argument("account")
    update.add_argument("--plan", choices=PLAN_NAMES)
    update.add_argument("--window", choices=(*WINDOW_KINDS, "default"))
    update.add_argument("--start", type=_date, help="subscription start (YYYY-MM-DD)")
    # A non-string default: argparse would run a string default through `type`.
    update.add_argument("--end", type=_end, default=KEEP, help="YYYY-MM-DD, or none (open)")
    update.add_argument(
        "--thresholds",
        type=_thresholds,
        help="percentages of the quota notified when crossed, e.g. 80,100; `plan` for the "
        "plan's, `none` for none",
    )
    show = acc.add_parser("show", help="an account, its window and usage")
    show.add_argument("account")
    lst = acc.add_parser("list", help="every account", description="List every account.")
    lst.add_argument("--format", choices=("json", "table"), default="json")
    for name, text in (
        ("suspend", "refuse the account's requests (403 account_suspended) until resumed"),
        ("resume", "serve a suspended account again"),
    ):
        action = acc.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        action.add_argument("account")
    delete = acc.add_parser(
        "delete",
        help="delete an account and its tokens",
        description="Delete an account and its tokens (its usage counters expire in Redis).",
    )
    delete.add_argument("account")
    delete.add_argument("--yes", action="store_true", required=True, help="confirm")

    tok = _actions(sub, "tokens", "issue, list, revoke bearer tokens")
    issue = tok.add_parser(
        "issue",
        help="issue a token (printed once)",
        description="Issue a bearer token; the raw token is printed once and never stored.",
    )
    issue.add_argument("account")
    issue.add_argument("--label", default="")
    issue.add_argument(
        "--expires",
        type=_expires,
        help="refused (401) from then on: an ISO date (00:00Z), date-time, or a duration "
        "from now (90d, 12h, 30m, 3600s, 2w); default never",
    )
    tlist = tok.add_parser(
        "list",
        help="an account's tokens",
        description="An account's tokens: id, created, last used (to the minute), expiry, "
        "revocation. Never the token.",
    )
    tlist.add_argument("account")
    tlist.add_argument("--format", choices=("json", "table"), default="json")
    revoke = tok.add_parser("revoke", help="revoke a token (refused at the next request)")
    revoke.add_argument("account")
    revoke.add_argument("token_id")
    _usage_parsers(sub)
    _webhook_parsers(sub)
    return p


def _actions(sub: Any, command: str, text: str) -> Any:
    """The subparsers of a COMMAND's ACTIONs (`accounts create`, `usage export`, ...)."""
    group = sub.add_parser(command, help=text)
    return group.add_subparsers(dest="action", required=True, metavar="ACTION")


def _usage_parsers(sub: Any) -> None:
    act = _actions(sub, "usage", "daily usage: roll up, chart, export")
    act.add_parser(
        "rollup",
        help="copy the day buckets from Redis into SQL now, then apply retention",
        description="One rollup pass (the server's workers run one every "
        "USAGE_ROLLUP_INTERVAL_SECONDS); safe beside running workers and after any gap.",
    )
    show = act.add_parser(
        "show",
        help="an account's daily usage as a terminal chart",
        description="An account's daily usage from the system of record, as the history "
        "endpoint serves it, drawn as a bar chart (or JSON).",
    )
    show.add_argument("account")
    export = act.add_parser(
        "export",
        help="every account's daily usage as CSV or JSON lines",
        description="Per account and UTC day: account, date, plan, limit, usage (the figures "
        "of the history endpoint), streamed page by page; a progress bar on stderr when it "
        "is a terminal and the output is not piped.",
    )
    for action, required in ((show, False), (export, True)):
        default = "" if required else "; default: 30 days ending at --to"
        action.add_argument(
            "--from", dest="from_", type=_date, required=required, help=f"first day{default}"
        )
        action.add_argument(
            "--to",
            type=_date,
            required=required,
            help="last day" + ("" if required else "; default: today"),
        )
    show.add_argument("--format", choices=("chart", "json"), default="chart")
    show.add_argument("--width", type=int, default=80, help="chart width in columns")
    export.add_argument("--account", help="only this account")
    export.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    export.add_argument("--output", help="write to this file instead of stdout")
    export.add_argument("--no-progress", action="store_true", help="never draw the bar")


def _webhook_parsers(sub: Any) -> None:
    act = _actions(sub, "webhooks", "threshold events: list, inspect, resend")
    lst = act.add_parser(
        "list", help="events, newest first", description="Threshold events, newest first."
    )
    lst.add_argument("--account")
    lst.add_argument("--status", choices=STATUSES)
    lst.add_argument("--limit", type=int, default=100)
    lst.add_argument("--format", choices=("json", "table"), default="json")
    show = act.add_parser(
        "show", help="an event, its body and delivery attempts", description="One event."
    )
    show.add_argument("event_id")
    resend = act.add_parser(
        "resend",
        help="deliver an event again now",
        description="Deliver an event again now (delivered ones too; same id and body, a new "
        "signature). If this attempt fails the server's workers retry it for another day.",
    )
    resend.add_argument("event_id")


async def _run(args: argparse.Namespace, settings: Settings) -> Any:
    store = UsageStore(settings, load_plans(settings.plans_file))
    try:
        if args.command == "accounts":
            return await admin.accounts(args, store)
        if args.command == "tokens":
            return await admin.tokens(args, store)
        if args.command == "usage":
            return await reports.usage(args, store)
        return await reports.webhooks(args, store)
    finally:
        await store.close()


def serve(settings: Settings, overrides: dict[str, str], extra: Sequence[str]) -> None:
    """Exec gunicorn with uvicorn workers, the bind address and worker count from settings;
    the workers build the same settings from the environment `settings` hands them."""
    argv = gunicorn_argv(
        "sidecars.usage.asgi:app()",
        settings,
        extra,
        worker_class="sidecars.usage.worker.UsageWorker",
    )
    exec_gunicorn(argv, environment(overrides))


def overrides(args: argparse.Namespace) -> dict[str, str]:
    """The USAGE_* variables the global options given override."""
    given = {name: getattr(args, name, None) for name in OPTIONS}
    return {OPTIONS[name]: value for name, value in given.items() if value is not None}


def _command_index(argv: Sequence[str]) -> int:
    """Where the command is: the first word that is not a global option or its value."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("--") and word[2:].replace("-", "_") in OPTIONS:
            i += 2
        elif word.startswith("--") and word[2:].split("=")[0].replace("-", "_") in OPTIONS:
            i += 1
        else:
            return i
    return i


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    # `serve` hands everything after it to gunicorn: parse only what precedes it.
    cut = _command_index(argv)
    serving = cut < len(argv) and argv[cut] == "serve"
    if serving and {"-h", "--help"} & set(argv[cut + 1 :]):
        p.parse_args([*argv[: cut + 1], "--help"])  # exits: this help, not gunicorn's
    args = p.parse_args(argv[: cut + 1] if serving else argv)
    given = overrides(args)
    try:
        settings = Settings.from_env(overrides=given)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        try:
            # Read now, so a bad file is one line here, not a worker failing to boot.
            load_plans(settings.plans_file)
            load_meters(settings.meters_file)
        except (PlanError, MeterError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        serve(settings, given, argv[cut + 1 :])
    try:
        result = asyncio.run(_run(args, settings))
    except (AccountError, PlanError, MeterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except StoreUnavailable as exc:
        print(f"error: unavailable: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `usage export | head`: the reader has what it wanted.
        sys.stderr.close()
        return 0
    if result is None:
        return 0  # the command wrote its own output (the export)
    if isinstance(result, Table):
        sys.stdout.write(result)
    else:
        sys.stdout.write(msgspec.json.format(_encode(result)).decode() + "\n")
    return 0
