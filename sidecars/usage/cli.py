"""`python -m sidecars.usage`: serve the API, administer accounts and tokens.

    [--redis-url U] [--sqlite-path P | --postgres-dsn D] [--plans-file F] COMMAND ...
    serve [gunicorn args...]                       gunicorn + uvicorn workers (USAGE_* settings)
    accounts create ID --plan P [--window W] [--start DATE] [--end DATE]
    accounts update ID [--plan P] [--window W|default] [--start DATE] [--end DATE|none]
    accounts show ID                               the record, its window and current usage
    accounts list [--format json|table]
    accounts suspend ID | resume ID                refuse (403) / serve the account's tokens again
    accounts delete ID --yes                       the account and its tokens
    tokens issue ID [--label TEXT] [--expires DATE|DURATION]   prints the raw token once
    tokens list ID [--format json|table]           ids, created, last used, expiry, revoked
    tokens revoke ID TOKEN_ID

The options before the command are the server's USAGE_* settings of the same name (they
override the environment), so the CLI always reaches the server's database and Redis. Output
is JSON on stdout (or a table); errors go to stderr with exit status 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any

import msgspec

from sidecars.common.server import exec_gunicorn, gunicorn_argv

from .plans import PLAN_NAMES, WINDOW_KINDS, PlanError, load_plans
from .settings import Settings, SettingsError
from .store import KEEP, AccountError, StoreUnavailable, UsageStore
from .windows import utc_datetime

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
        description="Serve the account usage API; administer its accounts and tokens.",
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

    accounts = sub.add_parser(
        "accounts", help="create, update, show, list, suspend, resume, delete accounts"
    )
    acc = accounts.add_subparsers(dest="action", required=True, metavar="ACTION")
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

    tokens = sub.add_parser("tokens", help="issue, list, revoke bearer tokens")
    tok = tokens.add_subparsers(dest="action", required=True, metavar="ACTION")
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
    return p


def _account_view(store: UsageStore, account: Any, used: int | None) -> dict[str, Any]:
    window = store.window(account)
    view = {
        "id": account.id,
        "plan": account.plan,
        "planLimit": store.plans[account.plan].limit,
        "window": account.window,
        "windowIsPlanDefault": not account.window_override,
        "subscriptionPeriod": {"start": account.start, "end": account.end},
        "usagePeriod": {"start": utc_datetime(window.start), "end": utc_datetime(window.end)},
        "suspended": _instant(account.suspended),
    }
    if used is not None:
        view["currentUsage"] = used
    return view


def _instant(ts: int | None) -> str | None:
    return utc_datetime(ts).isoformat().replace("+00:00", "Z") if ts is not None else None


def _token_view(info: Any) -> dict[str, Any]:
    return {
        "id": info.id,
        "label": info.label,
        "sha256": info.sha256,
        "created": _instant(info.created),
        "lastUsed": _instant(info.lastUsed),
        "expires": _instant(info.expires),
        "revoked": _instant(info.revoked),
    }


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned text table (`-` for null)."""

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, dict):
            return "..".join(cell(v) for v in value.values())
        return str(value)

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines) + "\n"


class Table(str):
    """Output already formatted as a table."""


async def _run(args: argparse.Namespace, settings: Settings) -> Any:
    store = UsageStore(settings, load_plans(settings.plans_file))
    try:
        if args.command == "accounts":
            return await _accounts(args, store)
        if args.action == "issue":
            expires = args.expires.resolve(store.clock()) if args.expires else None
            token, info = await store.issue_token(args.account, args.label, expires)
            return {"token": token, **_token_view(info), "account": args.account}
        if args.action == "list":
            views = [_token_view(t) for t in await store.list_tokens(args.account)]
            if args.format == "table":
                columns = ("id", "label", "created", "lastUsed", "expires", "revoked")
                return Table(table(views, columns))
            return views
        return _token_view(await store.revoke_token(args.account, args.token_id))
    finally:
        await store.close()


async def _accounts(args: argparse.Namespace, store: UsageStore) -> Any:
    action = args.action
    if action == "list":
        views = [_account_view(store, a, None) for a in await store.list_accounts()]
        if args.format == "table":
            columns = ("id", "plan", "planLimit", "window", "subscriptionPeriod", "suspended")
            return Table(table(views, columns))
        return views
    if action == "delete":
        await store.delete_account(args.account)
        return {"id": args.account, "deleted": True}
    if action == "create":
        account = await store.create_account(
            args.account, args.plan, window=args.window, start=args.start, end=args.end
        )
    elif action == "update":
        window = "" if args.window == "default" else args.window
        account = await store.update_account(
            args.account, plan=args.plan, window=window, start=args.start, end=args.end
        )
    elif action in ("suspend", "resume"):
        account = await store.suspend(args.account, action == "suspend")
    else:
        found = await store.account(args.account)
        if found is None:
            raise AccountError(f"no account {args.account!r}")
        account = found
    _, used = await store.usage(account)
    return _account_view(store, account, used)


def serve(settings: Settings, extra: Sequence[str]) -> None:
    """Exec gunicorn with uvicorn workers, the bind address and worker count from settings."""
    argv = gunicorn_argv(
        "sidecars.usage.asgi:app()",
        settings,
        extra,
        worker_class="sidecars.usage.worker.UsageWorker",
    )
    exec_gunicorn(argv)


def environment(args: argparse.Namespace, base: Mapping[str, str]) -> dict[str, str]:
    """The USAGE_* settings: the environment, overridden by the global options given."""
    env = dict(base)
    for name, variable in OPTIONS.items():
        value = getattr(args, name, None)
        if value is not None:
            env[variable] = value
    # An option naming one database replaces the environment's other one (both options given
    # stay both, and are refused as the server refuses them).
    if (
        getattr(args, "postgres_dsn", None) is not None
        and getattr(args, "sqlite_path", None) is None
    ):
        env.pop("USAGE_SQLITE_PATH", None)
    if (
        getattr(args, "sqlite_path", None) is not None
        and getattr(args, "postgres_dsn", None) is None
    ):
        env.pop("USAGE_POSTGRES_DSN", None)
    return env


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
    try:
        settings = Settings.from_env(environment(args, os.environ))
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        if any(getattr(args, name) is not None for name in OPTIONS):
            # The workers read the environment: pass the options on through it.
            os.environ.update(environment(args, {}))
        serve(settings, argv[cut + 1 :])
    try:
        result = asyncio.run(_run(args, settings))
    except (AccountError, PlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except StoreUnavailable as exc:
        print(f"error: unavailable: {exc}", file=sys.stderr)
        return 1
    if isinstance(result, Table):
        sys.stdout.write(result)
    else:
        sys.stdout.write(msgspec.json.format(_encode(result)).decode() + "\n")
    return 0
