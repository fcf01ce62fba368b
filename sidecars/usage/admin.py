"""The CLI's account and token commands (`accounts ...`, `tokens ...`): JSON views of the
store's records, or aligned tables."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .store import AccountError, UsageStore
from .windows import utc_datetime


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
        "suspended": instant(account.suspended),
        "thresholds": list(account.thresholds),
        "thresholdsArePlanDefault": not account.thresholds_override,
    }
    if used is not None:
        view["currentUsage"] = used
    return view


def instant(ts: int | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (`...Z`); None stays None."""
    return utc_datetime(ts).isoformat().replace("+00:00", "Z") if ts is not None else None


def _token_view(info: Any) -> dict[str, Any]:
    return {
        "id": info.id,
        "label": info.label,
        "sha256": info.sha256,
        "created": instant(info.created),
        "lastUsed": instant(info.last_used),
        "expires": instant(info.expires),
        "revoked": instant(info.revoked),
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


async def tokens(args: argparse.Namespace, store: UsageStore) -> Any:
    """`tokens issue|list|revoke`."""
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


async def accounts(args: argparse.Namespace, store: UsageStore) -> Any:
    """`accounts create|update|show|list|suspend|resume|delete`."""
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
            args.account,
            plan=args.plan,
            window=window,
            start=args.start,
            end=args.end,
            thresholds=args.thresholds,
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
