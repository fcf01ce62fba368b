"""Metered events in, meter values out: CloudEvents ingestion with de-duplication by `source`
+ `id`, cancellation within 24 hours, meter queries, and the thresholds of meters with limits.

Ingestion (`ingest`): one event or a batch, all or nothing. Each event needs `specversion`
1.0, `id`, `source`, `type`, `subject` (an existing account's id); `time` (RFC 3339 with an
offset) defaults to receipt and may be up to USAGE_EVENT_MAX_AGE_DAYS back (it lands in its
own hour and day) and FUTURE_SECONDS ahead; `data` is a JSON object that every meter of the
type can aggregate. An event already stored (same source and id) is a duplicate: counted
once, whatever the replay carries.

Cancellation (`cancel`, Stripe's rule): within CANCEL_SECONDS of receipt an event can be
cancelled; it then leaves every meter, and the thresholds of its meters are recomputed.

Thresholds of an event meter with a limit for the account's plan: after events of the
account are stored or cancelled, the meter's value in the account's usage window is
compared with each mark. `meter_thresholds` holds which marks are reached now; the first
worker to flip a mark from unreached to reached (a conditional upsert, atomic in both
databases) queues the one webhook of that crossing. A mark still reached after a
cancellation stays reached: no second webhook. One that is no longer reached is cleared, and
reaching it again later is a new crossing, notified again. In a rolling window the marks
are one state across its days (a value can also drop as old days leave it).
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from .db.base import ACCOUNT_ID_RE
from .db.daily import DailyTable
from .db.metered import MeteredEvent, MeteredTable
from .meters import WINDOW_SIZES, Meter, aggregate, by_event_type, check_event, plain
from .schemas import Cancelled, Ingested, MeterRow
from .store import Account, UsageStore
from .webhooks import Crossing, Notifier, marks
from .windows import DAY, Window, epoch, utc_date

MAX_BATCH = 1000  # events per request
MAX_BODY = 4 * 1024 * 1024  # bytes per request
MAX_TEXT = 256  # characters of an id, source, type
FUTURE_SECONDS = 300  # as Stripe: a clock a few minutes ahead is not refused
CANCEL_SECONDS = 24 * 3600  # Stripe's cancellation window
# Per query: hour windows over a month, day windows over the history's 400 days.
MAX_WINDOWS = {"hour": 31 * 24, "day": 400, None: 400}

_decode_any = msgspec.json.Decoder()
_encode = msgspec.json.encode


class MeteringError(Exception):
    """A request the metering refuses: HTTP `status`, ApiError `error`, a message."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


class CloudEvent(msgspec.Struct):
    """The CloudEvents 1.0 attributes the metering reads (extensions are allowed, unread)."""

    specversion: str
    id: str
    source: str
    type: str
    subject: str | None = None
    time: datetime | None = None
    data: Any = None


class CancelRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of `POST .../events/cancel`."""

    source: str
    id: str


def _bad(index: int | None, message: str, error: str = "invalid_event") -> MeteringError:
    where = f"event {index}: " if index is not None else ""
    return MeteringError(400, error, where + message)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


class Metering:
    """Ingestion, cancellation, queries and meter thresholds over one usage store."""

    def __init__(
        self,
        store: UsageStore,
        meters: Mapping[str, Meter],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.store = store
        self.meters = meters
        self.table = MeteredTable(store.db)
        self.daily = DailyTable(store.db)
        self.clock = clock or store.clock
        self.by_type = by_event_type(meters)
        self.notifier: Notifier | None = None
        self.max_age_days = store.settings.event_max_age_days

    # ------------------------------------------------------------ authentication

    def operator(self, authorization: str | None) -> None:
        """Refuse (401) a request without USAGE_INGEST_TOKEN as its Bearer token."""
        expected = self.store.settings.ingest_token
        scheme, _, token = (authorization or "").partition(" ")
        if (
            not expected
            or scheme.lower() != "bearer"
            or not hmac.compare_digest(token.strip().encode(), expected.encode())
        ):
            raise MeteringError(401, "unauthorized", "The ingestion token is required.")

    # ------------------------------------------------------------ ingestion

    def parse(self, body: bytes, now: float) -> list[MeteredEvent]:
        """The events of a request body (one CloudEvent or a JSON array of them), checked."""
        if len(body) > MAX_BODY:
            raise MeteringError(413, "payload_too_large", f"At most {MAX_BODY} bytes.")
        try:
            raw = _decode_any.decode(body)
        except msgspec.DecodeError as exc:
            raise _bad(None, f"the body is not JSON: {exc}") from None
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise _bad(None, "the batch is empty")
        if len(items) > MAX_BATCH:
            raise _bad(None, f"{len(items)} events; at most {MAX_BATCH} per request")
        now_ms = int(now * 1000)
        oldest = utc_date(now) - timedelta(days=self.max_age_days)
        return [self._event(i, item, now_ms, oldest) for i, item in enumerate(items)]

    def _event(self, i: int, item: Any, now_ms: int, oldest: Any) -> MeteredEvent:
        try:
            ce = msgspec.convert(item, CloudEvent)
        except msgspec.ValidationError as exc:
            raise _bad(i, str(exc)) from None
        if ce.specversion != "1.0":
            raise _bad(i, f"specversion {ce.specversion!r} is not 1.0")
        for name in ("id", "source", "type"):
            value = getattr(ce, name)
            if not value or len(value) > MAX_TEXT:
                raise _bad(i, f"{name} must be 1-{MAX_TEXT} characters")
        if ce.subject is None or ACCOUNT_ID_RE.fullmatch(ce.subject) is None:
            raise _bad(i, "subject must be the account's id")
        if ce.time is None:
            time_ms = now_ms
        elif ce.time.tzinfo is None:
            raise _bad(i, "time must carry an offset (RFC 3339, e.g. 2026-02-01T10:00:00Z)")
        else:
            time_ms = _ms(ce.time)
            if time_ms > now_ms + FUTURE_SECONDS * 1000:
                raise _bad(i, f"time {ce.time.isoformat()} is in the future", "event_in_future")
            if time_ms < epoch(oldest) * 1000:
                raise _bad(
                    i,
                    f"time {ce.time.isoformat()} is too old: events may be at most "
                    f"{self.max_age_days} days back (from {oldest.isoformat()} on)",
                    "event_too_old",
                )
        data = {} if ce.data is None else ce.data
        if not isinstance(data, dict):
            raise _bad(i, "data must be a JSON object")
        for meter in self.by_type.get(ce.type, ()):
            reason = check_event(meter, data)
            if reason is not None:
                raise _bad(i, reason)
        return MeteredEvent(
            ce.source, ce.id, ce.subject, ce.type, time_ms, _encode(data).decode(), now_ms
        )

    async def ingest(self, body: bytes) -> Ingested:
        """Store the events of a body (all or none); the new ones and the duplicates."""
        now = self.clock()
        events = self.parse(body, now)
        return await self.store_events(events, now)

    async def store_events(self, events: Sequence[MeteredEvent], now: float) -> Ingested:
        """Store checked events whose subjects exist (all or none), then recompute the
        thresholds of the accounts and meters they touch."""
        subjects = {e.account for e in events}
        known = await self.table.existing_accounts(sorted(subjects))
        for index, e in enumerate(events):
            if e.account not in known:
                raise _bad(index, f"subject {e.account!r} is not an account", "unknown_subject")
        new = await self.table.insert(events)
        if new:
            # Only meters with a limit have thresholds to recompute.
            touched = sorted({(e.account, e.type) for e in events})
            limited = [(a, m) for a, t in touched for m in self.by_type.get(t, ()) if m.limits]
            accounts: dict[str, Account | None] = {}
            for account_id, _ in limited:
                if account_id not in accounts:
                    accounts[account_id] = await self.store.account(account_id)
            await self.recompute(
                (account, m) for a, m in limited if (account := accounts[a]) is not None
            )
        return Ingested(new, len(events) - new)

    # ------------------------------------------------------------ corrections

    async def cancel(self, body: bytes) -> Cancelled:
        """Cancel one stored event received less than CANCEL_SECONDS ago (again: the same
        answer); its meters' thresholds are recomputed."""
        try:
            request = msgspec.json.decode(body, type=CancelRequest)
        except msgspec.DecodeError as exc:
            raise _bad(None, f'expected {{"source": ..., "id": ...}}: {exc}') from None
        now = self.clock()
        now_ms = int(now * 1000)
        event = await self.table.get(request.source, request.id)
        if event is None:
            raise MeteringError(404, "event_not_found", "No event with this source and id.")
        if event.cancelled_ms is None:
            since = now_ms - CANCEL_SECONDS * 1000
            if not await self.table.cancel(request.source, request.id, now_ms, since):
                again = await self.table.get(request.source, request.id)
                if again is None or again.cancelled_ms is None:
                    raise MeteringError(
                        409,
                        "cancel_window_passed",
                        f"The event was received on {_utc(event.received_ms).isoformat()}; "
                        "events can be cancelled within 24 hours of receipt.",
                    )
                event = again
            else:
                event = msgspec.structs.replace(event, cancelled_ms=now_ms)
                account = await self.store.account(event.account)
                if account is not None:
                    pairs = [(account, m) for m in self.by_type.get(event.type, ())]
                    await self.recompute(pairs, lowered=True)
        assert event.cancelled_ms is not None
        return Cancelled(event.source, event.id, event.account, _utc(event.cancelled_ms))

    # ------------------------------------------------------------ queries

    async def total(self, account: Account, meter: Meter, start_ms: int, end_ms: int) -> float:
        """The meter's value over [start_ms, end_ms) for the account."""
        rows = await self.query(account, meter, start_ms, end_ms, None, ())
        return sum(r.value for r in rows)

    async def query(
        self,
        account: Account,
        meter: Meter,
        start_ms: int,
        end_ms: int,
        window_size: str | None,
        group_by: tuple[str, ...],
    ) -> list[MeterRow]:
        """The meter over [start_ms, end_ms) in windows of `window_size` (aligned to UTC
        hours or days; None: one window, the range), one row per window and group with
        events, oldest first."""
        if meter.builtin:
            return await self._requests(account, start_ms, end_ms, window_size)
        if window_size is None:
            base, size = start_ms, max(end_ms - start_ms, 1)
        else:
            size = WINDOW_SIZES[window_size] * 1000
            base = start_ms // size * size
        events = [
            (t, _decode_any.decode(data))
            for t, data in await self.table.series(account.id, meter.event_type, start_ms, end_ms)
        ]
        rows = []
        for index, group, value in aggregate(meter, events, base, size, group_by):
            first = base + index * size
            last = end_ms if window_size is None else first + size
            rows.append(
                MeterRow(
                    _utc(first), _utc(last), plain(value), dict(zip(group_by, group, strict=True))
                )
            )
        return rows

    async def _requests(
        self, account: Account, start_ms: int, end_ms: int, window_size: str | None
    ) -> list[MeterRow]:
        """The built-in meter: the rolled-up days whose start is in [start_ms, end_ms)."""
        first = utc_date(math.ceil(start_ms / 1000 / DAY) * DAY)
        last = utc_date((end_ms - 1) / 1000)
        if first > last:
            return []
        days = await self.daily.series(account.id, first, last)
        if window_size == "day":
            return [
                MeterRow(_utc(epoch(d.day) * 1000), _utc((epoch(d.day) + DAY) * 1000), d.usage)
                for d in days
                if d.usage
            ]
        total = sum(d.usage for d in days)
        return [MeterRow(_utc(start_ms), _utc(end_ms), total)] if total else []

    # ------------------------------------------------------------ thresholds

    def window(self, account: Account, now: float) -> Window:
        """The account's usage window now (the request quota's)."""
        return self.store.window(account, now)

    async def recompute(
        self, pairs: Iterable[tuple[Account, Meter]], *, lowered: bool = False
    ) -> None:
        """Compare each meter's value in the account's window with its marks (see the module
        docstring); queue the webhook of each mark reached for the first time (or again).
        `lowered` (after a cancellation): also clear the marks no longer reached."""
        now = self.clock()
        for account, meter in pairs:
            limit = meter.limit(account.plan)
            if limit is None:
                continue
            window = self.window(account, now)
            value = await self.total(account, meter, window.start * 1000, window.end * 1000)
            # A rolling window slides every day: its marks are one state (as the request
            # quota's: an account that stays above a mark is not notified again each day,
            # one that dropped below, as old days left, and climbs back is).
            rolling = window.kind == "rolling_30_days"
            state = 0 if rolling else window.start
            for pct, mark in marks(account.thresholds, limit):
                if value >= mark:
                    n = await self.table.cross(account.id, meter.slug, state, pct)
                    if n is not None and self.notifier is not None:
                        self.notifier.notify(
                            Crossing(
                                account.id,
                                account.plan,
                                pct,
                                int(value),
                                limit,
                                window,
                                now,
                                meter=meter.slug,
                                crossing=n,
                            )
                        )
                elif lowered or rolling:
                    await self.table.uncross(account.id, meter.slug, state, pct)
