"""The CLI's usage and webhook commands: `usage rollup|show|export`, `webhooks
list|show|resend`.

`usage show` and `usage export` read the same `daily_usage` rows as the history endpoint,
so the three give the same figures.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import IO, Any

import msgspec

from .admin import Table, table
from .db.daily import DailyTable, DailyUsage
from .db.events import AttemptRecord, EventRecord, EventTable
from .rollup import Rollup
from .schemas import DailyPoint, UsageHistory
from .store import AccountError, UsageStore
from .terminal import Progress, chart, piped
from .webhooks import Notifier
from .windows import day_range, utc_date

EXPORT_COLUMNS = ("account", "date", "plan", "limit", "usage")


class ExportRow(msgspec.Struct):
    """One line of `usage export --format jsonl`."""

    account: str
    date: date
    plan: str
    limit: int
    usage: int


_export_encoder = msgspec.json.Encoder()


def _range(args: argparse.Namespace, today: date) -> tuple[date, date]:
    try:
        return day_range(args.from_, args.to or today)
    except ValueError as exc:
        raise AccountError(f"--from/--to: {exc}") from None


async def usage(args: argparse.Namespace, store: UsageStore) -> Any:
    """`usage rollup|show|export`."""
    daily = DailyTable(store.db)
    if args.action == "rollup":
        report = await Rollup(store).run_once()
        return {
            "from": report.first,
            "to": report.last,
            "accounts": report.accounts,
            "accountDays": report.rows,
            "closedThrough": report.closed_through,
            "purgedDays": report.purged,
            "seconds": round(report.seconds, 3),
        }
    first, last = _range(args, utc_date(store.clock()))
    if args.action == "show":
        rows = await daily.series(args.account, first, last)
        if not rows and await store.account(args.account) is None:
            raise AccountError(f"no account {args.account!r} and no usage recorded for it")
        if args.format == "json":
            points = [DailyPoint(r.day, r.usage, r.plan, r.limit) for r in rows]  # type: ignore[arg-type]
            return UsageHistory(first, last, points)
        return Table(chart(args.account, rows, args.width))
    try:
        out: IO[str] = open(args.output, "w", newline="") if args.output else sys.stdout  # noqa: SIM115
    except OSError as exc:
        raise AccountError(f"cannot write {args.output}: {exc.strerror}") from None
    try:
        show = not args.no_progress and sys.stderr.isatty() and (args.output or not piped(out))
        await export(
            daily, first, last, args.account, args.format, out, sys.stderr if show else None
        )
    finally:
        if args.output:
            out.close()
    return None


async def export(
    daily: DailyTable,
    first: date,
    last: date,
    account: str | None,
    fmt: str,
    out: IO[str],
    progress_to: IO[str] | None = None,
) -> int:
    """Write the rows of [first, last] (one account's or all) to `out` as CSV or JSON lines,
    page by page; a progress bar on `progress_to` when given. The rows written."""
    progress = None
    if progress_to is not None:
        progress = Progress(progress_to, await daily.count(first, last, account))
    write: Callable[[list[DailyUsage]], None]
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(EXPORT_COLUMNS)

        def write(page: list[DailyUsage]) -> None:
            writer.writerows((r.account, r.day.isoformat(), r.plan, r.limit, r.usage) for r in page)

    else:

        def write(page: list[DailyUsage]) -> None:
            rows = (ExportRow(r.account, r.day, r.plan, r.limit, r.usage) for r in page)
            out.write("".join(_export_encoder.encode(row).decode() + "\n" for row in rows))

    written = 0
    async for page in daily.scan(first, last, account):
        if progress is not None:
            progress.clear()  # the rows may go to the same terminal
        write(page)
        out.flush()
        written += len(page)
        if progress is not None:
            progress.advance(len(page))
    if progress is not None:
        progress.done()
    return written


# ------------------------------------------------------------------ webhooks


def _ms(value: int | None) -> str | None:
    if value is None or value <= 0:
        return None
    moment = datetime.fromtimestamp(value / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_view(event: EventRecord) -> dict[str, Any]:
    """What `webhooks list` shows of an event."""
    return {
        "id": event.id,
        "account": event.account,
        "threshold": event.threshold,
        "windowStart": _ms(event.window_start * 1000),
        "status": event.status,
        "attempts": event.attempts,
        "created": _ms(event.created_ms),
        "nextAttempt": _ms(event.next_attempt_ms) if event.status == "pending" else None,
        "delivered": _ms(event.delivered_ms),
        "giveUp": _ms(event.give_up_ms),
    }


def attempt_view(attempt: AttemptRecord) -> dict[str, Any]:
    """One delivery attempt."""
    return {
        "attempt": attempt.attempt,
        "at": _ms(attempt.at_ms),
        "durationMs": attempt.duration_ms,
        "statusCode": attempt.status_code,
        "error": attempt.error or None,
    }


async def webhooks(args: argparse.Namespace, store: UsageStore) -> Any:
    """`webhooks list|show|resend`."""
    events = EventTable(store.db)
    if args.action == "list":
        views = [event_view(e) for e in await events.recent(args.account, args.status, args.limit)]
        if args.format == "table":
            columns = ("id", "account", "threshold", "status", "attempts", "created", "delivered")
            return Table(table(views, columns))
        return views
    event = await events.get(args.event_id)
    if event is None:
        raise AccountError(f"no webhook event {args.event_id!r}")
    if args.action == "resend":
        settings = store.settings
        if not settings.webhook_url:
            raise AccountError("USAGE_WEBHOOK_URL is not set: there is no receiver to send to")
        notifier = Notifier(settings, store.db, store.clock)
        try:
            now_ms = int(store.clock() * 1000)
            held = await events.claim(event.id, now_ms, notifier.lease_ms, again=True)
            if held is None:
                raise AccountError(f"{event.id} is being delivered by a worker now; retry shortly")
            await notifier.attempt(held, again=True)
        finally:
            await notifier.close()
        event = await events.get(args.event_id) or event
    return {
        **event_view(event),
        "payload": msgspec.json.decode(event.payload),
        "deliveryAttempts": [attempt_view(a) for a in await events.attempts(event.id)],
    }
