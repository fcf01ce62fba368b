"""Threshold notifications: one signed webhook event per account, threshold and window.

The request path only looks: `observe` (called by the store after a counted request, with
the usage after it) compares the usage with the account's thresholds and queues a crossing;
it never waits on SQL or on the receiver. A background task per worker turns crossings into
event rows (`db.events`: the unique key makes the event one across all workers and
processes, even when two workers see the crossing at once) and delivers the events it
created at once; a poller delivers retries that are due, claimed with a lease so one worker
sends each.

When is a threshold crossed? In a billing cycle usage only grows (refunds aside), so any
counted request at or above the mark notifies, once per cycle: a jump over the mark (hits
flushed after a Redis outage, a plan change) is still notified. A rolling window also
shrinks at 00:00Z; there only the request that takes usage from below the mark to it
notifies, so an account that stays above a threshold is not notified again every day, and
one that dropped below and climbs back is (its window starts on another day).

Delivery: POST USAGE_WEBHOOK_URL with the JSON event, `Usage-Signature: t=<unix time>,
v1=<hex HMAC-SHA256 of "<t>.<body>" with USAGE_WEBHOOK_SECRET>` (Stripe's scheme, so their
receivers' verification code fits; one v1 per secret while two are set for a rotation),
`Usage-Event-Id`. A 2xx answer delivers it; anything
else (other status, timeout, refused connection) is retried with exponential backoff and
equal jitter (USAGE_WEBHOOK_RETRY_SECONDS doubling, at most an hour apart) until
USAGE_WEBHOOK_RETRY_FOR_SECONDS after the crossing (a day), then the event is `failed`.
Every attempt is a row in `webhook_attempts`. Delivery is at least once: a worker stopped
between the receiver's answer and its record sends the event again; receivers dedupe by id.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import httpx
import msgspec

from sidecars.common.lifecycle import stop_tasks
from sidecars.common.outage import Outage

from .db import Database, StoreUnavailable
from .db.events import DELIVERED, FAILED, PENDING, AttemptRecord, EventRecord, EventTable
from .meters import REQUESTS
from .schemas import EventWindow, ThresholdEvent
from .windows import Window, utc_datetime

if TYPE_CHECKING:
    from .settings import Settings
    from .store import Account

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Usage-Signature"
EVENT_TYPE: Final = "usage.threshold.crossed"
MAX_DELAY = 3600.0  # the longest wait between two attempts, seconds
QUEUE = 10_000  # crossings waiting for their row, per worker
CONCURRENCY = 16  # deliveries in flight, per worker
_encode = msgspec.json.encode


def signature(secrets_: str, timestamp: int, body: bytes) -> str:
    """The `Usage-Signature` header value for a body sent at `timestamp`: one `v1` per
    secret of `secrets_` (separated by spaces: during a rotation the new and the old one,
    so receivers that know either accept the event, as with Stripe's rolled secrets)."""
    signed = f"{timestamp}.".encode() + body
    macs = [hmac.new(s.encode(), signed, hashlib.sha256).hexdigest() for s in secrets_.split()]
    return f"t={timestamp}," + ",".join(f"v1={mac}" for mac in macs)


def verify(secret: str, header: str, body: bytes, now: float, tolerance: float = 300) -> bool:
    """Whether `header` signs `body` with `secret`, at most `tolerance` seconds ago (what a
    receiver does; the README has the same as a standalone snippet)."""
    pairs = [part.strip().split("=", 1) for part in header.split(",") if "=" in part]
    try:
        timestamp = int(next(v for k, v in pairs if k == "t"))
    except (StopIteration, ValueError):
        return False
    if abs(now - timestamp) > tolerance:
        return False  # a replayed old request
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return any(hmac.compare_digest(expected.hexdigest(), v) for k, v in pairs if k == "v1")


def backoff(failures: int, base: float) -> float:
    """Seconds before the next attempt after `failures` failed ones: doubling from `base`,
    at most MAX_DELAY, with equal jitter (half fixed, half random) so the retries of events
    that failed together spread out without collapsing to zero."""
    delay = min(MAX_DELAY, base * 2 ** (failures - 1))
    return delay / 2 + random.uniform(0, delay / 2)


def marks(thresholds: tuple[int, ...], limit: int) -> list[tuple[int, int]]:
    """(percent, usage that reaches it) per threshold: the usage is rounded up, so 80 % of
    5 is reached at 4, and 100 % exactly at the limit."""
    return [(pct, -(-limit * pct // 100)) for pct in thresholds]


@dataclass(frozen=True, slots=True)
class Crossing:
    """A counted request took an account to a threshold."""

    account: str
    plan: str
    threshold: int
    usage: int
    limit: int
    window: Window
    seen: float
    meter: str = ""  # '' = the counted requests; else an event meter's slug
    crossing: int = 1  # the how-many-th time the meter reached the mark in the window


class Notifier:
    """Turns crossings into events and delivers them (see the module docstring)."""

    def __init__(
        self, settings: Settings, db: Database, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.events = EventTable(db)
        self.clock = clock
        self._seen: set[tuple[str, int, int]] = set()  # (account, threshold, window start)
        self._queue: asyncio.Queue[Crossing] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._deliveries: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._slots = asyncio.Semaphore(CONCURRENCY)
        self.outage = Outage("threshold events", "crossings wait in this worker's queue")
        # Longer than one attempt can take: a held event is never sent twice at once.
        self.lease_ms = int((settings.webhook_timeout_seconds + 5) * 1000)

    # ------------------------------------------------------------ request path

    def observe(self, account: Account, window: Window, used: int, limit: int) -> None:
        """A request of `account` was counted and usage is now `used`: queue the thresholds
        it crossed (see the module docstring). Never waits."""
        if limit <= 0 or self._queue is None:
            return
        for pct, mark in marks(account.thresholds, limit):
            if used < mark:
                break
            if window.kind == "rolling_30_days" and used - 1 >= mark:
                continue
            key = (account.id, pct, window.start)
            if key in self._seen:
                continue
            if len(self._seen) > 100_000:
                self._seen.clear()  # a bound, not a correctness matter: SQL dedupes
            self._seen.add(key)
            crossing = Crossing(account.id, account.plan, pct, used, limit, window, self.clock())
            try:
                self._queue.put_nowait(crossing)
            except asyncio.QueueFull:
                self._seen.discard(key)
                log.error("threshold event of %s at %d%% dropped: queue full", account.id, pct)

    def notify(self, crossing: Crossing) -> None:
        """Queue a crossing already decided once for all workers (an event meter's, see
        `metering.Metering.recompute`). Never waits."""
        if self._queue is None:
            return
        try:
            self._queue.put_nowait(crossing)
        except asyncio.QueueFull:
            log.error("threshold event of %s (%s) dropped: queue full", crossing.account,
                      crossing.meter)  # fmt: skip

    # ------------------------------------------------------------ background

    def start(self) -> None:
        """Start the event writer and the retry poller in the running loop."""
        if self._tasks:
            return
        self._queue = asyncio.Queue(QUEUE)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._write_events()), loop.create_task(self._poll())]

    async def close(self) -> None:
        """Stop the tasks (an attempt cut short is retried once its lease ends)."""
        tasks = [*self._tasks, *self._deliveries]
        self._tasks = []
        self._queue = None
        await stop_tasks(*tasks)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _write_events(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            crossing = await queue.get()
            while True:
                # Made afresh on each try: its lease must run from the insert, or a retry
                # poller could claim the event while this worker sends it.
                event = self.event(crossing)
                try:
                    created = await self.events.create(event)
                    self.outage.answered()
                    break
                except StoreUnavailable as exc:
                    # The crossing is kept: the database comes back, the event is written.
                    self.outage.failed(str(exc))
                    await asyncio.sleep(1.0)
                except Exception:
                    # A bug must not stop the writer: this crossing is lost, the next kept.
                    log.exception("threshold event %s not written", event.id)
                    created = False
                    break
            if created:
                self._spawn(event)

    def event(self, crossing: Crossing) -> EventRecord:
        """The event row of a crossing, held (leased) by this worker for its first attempt."""
        now_ms = int(self.clock() * 1000)
        body = ThresholdEvent(
            id="evt_" + secrets.token_hex(12),
            type=EVENT_TYPE,
            created=utc_datetime(int(crossing.seen)),
            account=crossing.account,
            plan=crossing.plan,  # type: ignore[arg-type]  # a plan of the plans file
            threshold=crossing.threshold,
            usage=crossing.usage,
            limit=crossing.limit,
            window=EventWindow(
                crossing.window.kind,  # type: ignore[arg-type]
                utc_datetime(crossing.window.start),
                utc_datetime(crossing.window.end),
            ),
            meter=crossing.meter or REQUESTS,
        )
        return EventRecord(
            id=body.id,
            account=crossing.account,
            threshold=crossing.threshold,
            window_start=crossing.window.start,
            created_ms=now_ms,
            payload=_encode(body).decode(),
            status=PENDING,
            attempts=0,
            next_attempt_ms=now_ms,
            lease_until_ms=now_ms + self.lease_ms,
            give_up_ms=now_ms + int(self.settings.webhook_retry_for_seconds * 1000),
            meter=crossing.meter,
            crossing=crossing.crossing,
        )

    def _spawn(self, event: EventRecord) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver_held(event))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _deliver_held(self, event: EventRecord) -> None:
        async with self._slots:
            try:
                await self.attempt(event)
            except StoreUnavailable as exc:
                # Not recorded: the lease ends and the poller tries again.
                self.outage.failed(str(exc))
            except Exception:
                log.exception("webhook %s: attempt not recorded", event.id)

    async def _poll(self) -> None:
        """Claim and send the retries that are due, every second (or more often when the
        first retry comes sooner)."""
        interval = min(1.0, self.settings.webhook_retry_seconds)
        while True:
            await asyncio.sleep(interval)
            try:
                now_ms = int(self.clock() * 1000)
                for event_id in await self.events.due(now_ms, CONCURRENCY):
                    event = await self.events.claim(event_id, now_ms, self.lease_ms)
                    if event is not None:
                        self._spawn(event)
                self.outage.answered()
            except StoreUnavailable as exc:
                self.outage.failed(str(exc))
            except Exception:
                log.exception("webhook retry poll failed")

    # ------------------------------------------------------------ one attempt

    def client(self) -> httpx.AsyncClient:
        """The HTTP client of the deliveries (made in the running loop, on first use)."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.settings.webhook_timeout_seconds,
                follow_redirects=False,  # a redirect is not an answer from the receiver
                headers={"User-Agent": "ratelimitd-usage-webhooks/1"},
            )
        return self._client

    async def attempt(self, event: EventRecord, *, again: bool = False) -> AttemptRecord:
        """POST a held event once, record the attempt and what comes next; the attempt.

        `again` (an operator's resend): a new retry period starts from now.
        """
        body = event.payload.encode()
        started = self.clock()
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: signature(self.settings.webhook_secret, int(started), body),
            "Usage-Event-Id": event.id,
        }
        code: int | None = None
        error = ""
        try:
            response = await self.client().post(
                self.settings.webhook_url, content=body, headers=headers
            )
            code = response.status_code
            if not 200 <= code < 300:
                error = f"HTTP {code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        now = self.clock()
        number = event.attempts + 1
        attempt = AttemptRecord(
            event.id, number, int(started * 1000), int((now - started) * 1000), code, error[:500]
        )
        give_up_ms = event.give_up_ms
        if again:
            give_up_ms = int((started + self.settings.webhook_retry_for_seconds) * 1000)
        if not error:
            status, next_ms = DELIVERED, 0
        else:
            next_ms = int((now + backoff(number, self.settings.webhook_retry_seconds)) * 1000)
            status = FAILED if next_ms > give_up_ms else PENDING
            log.info("webhook %s attempt %d failed: %s", event.id, number, error)
        await self.events.record(attempt, status, next_ms, give_up_ms)
        return attempt
