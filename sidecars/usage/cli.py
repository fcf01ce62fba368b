"""`python -m sidecars.usage`: serve the API, administer accounts and tokens.

    serve [gunicorn args...]                       gunicorn + uvicorn workers (USAGE_* settings)
    accounts create ID --plan P [--window W] [--start DATE] [--end DATE]
    accounts update ID [--plan P] [--window W|default] [--start DATE] [--end DATE|none]
    accounts show ID                               the record, its window and current usage
    tokens issue ID [--label TEXT]                 prints the raw token once
    tokens list ID
    tokens revoke ID TOKEN_ID

Output is JSON on stdout; errors go to stderr with exit status 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from datetime import date
from typing import Any

import msgspec

from sidecars.common.server import exec_gunicorn, gunicorn_argv

from .plans import PLAN_NAMES, WINDOW_KINDS, PlanError, load_plans
from .settings import Settings, SettingsError
from .store import KEEP, AccountError, StoreUnavailable, UsageStore
from .windows import utc_datetime

_encode = msgspec.json.encode


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a YYYY-MM-DD date") from None


def _end(text: str) -> date | None:
    return None if text.lower() in ("none", "") else _date(text)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m sidecars.usage", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the API under gunicorn with uvicorn workers")

    accounts = sub.add_parser("accounts", help="create, update, show accounts")
    acc = accounts.add_subparsers(dest="action", required=True)
    create = acc.add_parser("create")
    create.add_argument("account")
    create.add_argument("--plan", required=True, choices=PLAN_NAMES)
    create.add_argument("--window", choices=WINDOW_KINDS, default="", help="default: the plan's")
    create.add_argument("--start", type=_date, help="subscription start (UTC); default today")
    create.add_argument("--end", type=_end, help="subscription end, exclusive; default open")
    update = acc.add_parser("update")
    update.add_argument("account")
    update.add_argument("--plan", choices=PLAN_NAMES)
    update.add_argument("--window", choices=(*WINDOW_KINDS, "default"))
    update.add_argument("--start", type=_date)
    update.add_argument("--end", type=_end, default=KEEP, help="a date, or none")
    show = acc.add_parser("show")
    show.add_argument("account")

    tokens = sub.add_parser("tokens", help="issue, list, revoke bearer tokens")
    tok = tokens.add_subparsers(dest="action", required=True)
    issue = tok.add_parser("issue")
    issue.add_argument("account")
    issue.add_argument("--label", default="")
    lst = tok.add_parser("list")
    lst.add_argument("account")
    revoke = tok.add_parser("revoke")
    revoke.add_argument("account")
    revoke.add_argument("token_id")
    return p


def _account_view(store: UsageStore, account: Any, used: int) -> dict[str, Any]:
    window = store.window(account)
    return {
        "id": account.id,
        "plan": account.plan,
        "planLimit": store.plans[account.plan].limit,
        "window": account.window,
        "windowIsPlanDefault": not account.window_override,
        "subscriptionPeriod": {"start": account.start, "end": account.end},
        "usagePeriod": {"start": utc_datetime(window.start), "end": utc_datetime(window.end)},
        "currentUsage": used,
    }


async def _run(args: argparse.Namespace, settings: Settings) -> Any:
    store = UsageStore(settings, load_plans(settings.plans_file))
    try:
        if args.command == "accounts":
            if args.action == "create":
                account = await store.create_account(
                    args.account, args.plan, window=args.window, start=args.start, end=args.end
                )
            elif args.action == "update":
                window = "" if args.window == "default" else args.window
                account = await store.update_account(
                    args.account, plan=args.plan, window=window, start=args.start, end=args.end
                )
            else:
                found = await store.account(args.account)
                if found is None:
                    raise AccountError(f"no account {args.account!r}")
                account = found
            _, used = await store.usage(account)
            return _account_view(store, account, used)
        if args.action == "issue":
            token, info = await store.issue_token(args.account, args.label)
            return {"token": token, "id": info.id, "account": args.account, "label": info.label}
        if args.action == "list":
            return await store.list_tokens(args.account)
        return await store.revoke_token(args.account, args.token_id)
    finally:
        await store.close()


def serve(settings: Settings, extra: Sequence[str]) -> None:
    """Exec gunicorn with uvicorn workers, the bind address and worker count from settings."""
    exec_gunicorn(gunicorn_argv("sidecars.usage.asgi:app()", settings, extra))


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        try:
            settings = Settings.from_env()
        except SettingsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        serve(settings, argv[1:])
    args = parser().parse_args(argv)
    try:
        result = asyncio.run(_run(args, Settings.from_env()))
    except (AccountError, PlanError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except StoreUnavailable as exc:
        print(f"error: unavailable: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(msgspec.json.format(_encode(result)).decode() + "\n")
    return 0
