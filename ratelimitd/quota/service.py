"""The Rate Limit Quota Service: one global limit divided among the Envoys that report.

Each Envoy holds one stream; each report of a bucket is answered with an assignment, a
token bucket the Envoy enforces locally. Tokens are taken from the rule's counter in the
existing store (memory for one replica, Redis for several) when they are granted, as the
hits of an RLS request would be, so the tokens outstanding in every Envoy never exceed
what is left of the limit in the window:

- a stream's Envoy holds `left` tokens, the last assignment less what it reported allowed
  since; requests it reports allowed beyond them (admitted by the filter's fallback before
  the first assignment, or after one expired) are charged to the counter too;
- when `left` falls short of what the stream's demand uses in two report periods, the
  missing tokens are its share (`share.shares`, by demand among this replica's streams of
  the bucket) of what the counter has left; the grant is taken from the counter, and the
  Envoy gets a new token bucket of `left + grant` tokens that replaces its own (so its old
  tokens are not added twice); otherwise the same strategy is sent again, which only
  extends it;
- when the counter's window ends, every stream of the bucket gets a new assignment from the
  new window at once (tokens of the old window would otherwise be spent in the new one);
- with no rule for a bucket (unknown domain, no match, `unlimited`) the assignment is
  ALLOW_ALL.

Assignments live RLQS_ASSIGNMENT_TTL, a little over the report period; on shutdown every
assignment is sent again with TTL 0, so Envoys fall back to their configured behaviour at
once. A bucket reported idle for RLQS_IDLE_TIMEOUT is abandoned; a stream's buckets are
forgotten when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..backends.base import BackendError
from ..grpcstatus import INVALID_ARGUMENT, OK, RESOURCE_EXHAUSTED, UNAVAILABLE
from ..messages import OVER_LIMIT, Descriptor, Request, ServiceError
from ..service import RateLimitService
from ..settings import QuotaSettings
from ..stats import StatsStore, sanitize_stat_name
from ..stats.store import OVERFLOW_KEY as OVERFLOW
from .buckets import Bucket, BucketError, BucketKeys, Entries
from .codec import ALLOW, DENY, TOKENS, Action, ReportError, decode_reports, encode_actions
from .share import demand, shares, smoothed, wanted

log = logging.getLogger("ratelimitd.quota")

# A token bucket that never refills within a window: one token per day.
FILL_SECONDS = 86_400
# Messages a stream may have waiting while one is processed (Envoy sends one per bucket
# subscription and one per report period), and their bytes for the whole process: past
# either the stream is ended RESOURCE_EXHAUSTED (a message's bytes go back to the client's
# connection window as soon as it is read, so they are bounded here).
MAX_QUEUED = 256
MAX_QUEUED_BYTES = 16 * 1024 * 1024
# How often window ends are looked for.
TICK_SECONDS = 0.5

Send = Callable[[bytes], None]
Finish = Callable[[int, str], None]


class QuotaStream:
    """One StreamRateLimitQuotas call: its domain, its buckets, its queue of messages."""

    def __init__(self, quota: QuotaService, ident: int, peer: str, send: Send, end: Finish):
        self.quota = quota
        self.ident = ident
        self.peer = peer
        self._send = send
        self._end = end
        self.domain = ""
        # Bucket key -> Bucket; None for a bucket refused (counted against the bound).
        self.buckets: dict[frozenset[tuple[str, str]], Bucket | None] = {}
        self.queue: deque[Any] = deque()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.reports = self.allowed = self.denied = self.assignments = 0

    # -- from the transport ---------------------------------------------------------------

    def receive(self, message: bytes | None) -> None:
        """A message from the client; None once it has sent its last."""
        if self.closed:
            return
        if len(self.queue) >= MAX_QUEUED:
            self.quota.ended += 1
            self.finish(RESOURCE_EXHAUSTED, f"more than {MAX_QUEUED} messages waiting")
            return
        if message is not None:
            if self.quota.queued + len(message) > MAX_QUEUED_BYTES:
                self.quota.ended += 1
                self.finish(RESOURCE_EXHAUSTED, "too many report bytes waiting in this process")
                return
            self.quota.queued += len(message)
        self.queue.append(message)
        self._wake()

    def cancel(self) -> None:
        """The client is gone (reset, connection lost): forget the stream."""
        self._close()
        if self.task is not None:
            self.task.cancel()

    # -- ours -----------------------------------------------------------------------------

    def refresh(self, key: frozenset[tuple[str, str]]) -> None:
        """Assign the bucket again (its window ended)."""
        self.queue.append(key)
        self._wake()

    def _wake(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self.queue and not self.closed:
            item = self.queue.popleft()
            if item is None:
                self.finish(OK, "")
                return
            if isinstance(item, bytes):
                try:
                    await self.quota.report(self, item)
                finally:
                    self.quota.queued -= len(item)
            else:
                await self.quota.refresh(self, item)

    def send(self, actions: list[Action]) -> None:
        """Send a response carrying `actions` (none: nothing is sent)."""
        if actions and not self.closed:
            self._send(encode_actions(actions))

    def finish(self, code: int, message: str) -> None:
        """End the call with a status."""
        if not self.closed:
            self._close()
            self._end(code, message)

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self.quota.queued -= sum(len(m) for m in self.queue if isinstance(m, bytes))
            self.queue.clear()
            self.quota.forget(self)


class QuotaService:
    """Every stream of this process, their buckets, their assignments and statistics."""

    def __init__(
        self,
        service: RateLimitService,
        settings: QuotaSettings,
        stats: StatsStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.service = service
        self.settings = settings
        self.keys = BucketKeys(settings.bucket_keys)
        self.clock = clock
        self.horizon = 2 * settings.report_interval
        self.streams: dict[int, QuotaStream] = {}
        # (domain, bucket key) -> {stream ident: Bucket}: the streams sharing a bucket here.
        self.index: dict[tuple[str, frozenset[tuple[str, str]]], dict[int, Bucket]] = {}
        self._next = 0
        self._ticker: asyncio.TimerHandle | None = None
        self.held = 0  # buckets all streams hold
        self.queued = 0  # bytes of messages waiting to be processed
        # STATS_MAX_REQUEST_SERIES: buckets and streams named in the statistics.
        self.max_series = stats.max_request_series if stats is not None else 10_000
        self.refused = 0  # buckets refused: malformed or past the per-stream bound
        self.errors = 0  # reports not answered: the store failed
        self.ended = 0  # streams ended by the server (protocol errors, overload)
        if stats is not None:
            stats.add_source(self.series)

    # -- streams --------------------------------------------------------------------------

    def open(self, send: Send, end: Finish, peer: str = "") -> QuotaStream:
        """A new stream: `send(response bytes)`, `end(grpc status, message)` (at once when
        RLQS_MAX_STREAMS are open)."""
        self._next += 1
        stream = QuotaStream(self, self._next, peer, send, end)
        if len(self.streams) >= self.settings.max_streams:
            self.ended += 1
            stream.closed = True
            end(RESOURCE_EXHAUSTED, f"RLQS_MAX_STREAMS={self.settings.max_streams} streams open")
            return stream
        self.streams[stream.ident] = stream
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(TICK_SECONDS, self._tick)
        return stream

    def forget(self, stream: QuotaStream) -> None:
        """A stream ended: its buckets go with it."""
        self.streams.pop(stream.ident, None)
        for key, b in stream.buckets.items():
            if b is not None:
                self.held -= _weight(key)
            index_key = (stream.domain, key)
            sharing = self.index.get(index_key)
            if sharing is not None:
                sharing.pop(stream.ident, None)
                if not sharing:
                    del self.index[index_key]
        stream.buckets.clear()

    async def shutdown(self) -> None:
        """Every assignment again with TTL 0 (the Envoys fall back at once), then every
        stream ended UNAVAILABLE."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        for stream in list(self.streams.values()):
            actions = [
                Action(dict(key), b.sent, 0.0)
                for key, b in stream.buckets.items()
                if b is not None and b.sent is not None
            ]
            stream.send(actions)
            stream.finish(UNAVAILABLE, "the rate limit quota service is shutting down")

    # -- reports --------------------------------------------------------------------------

    async def report(self, stream: QuotaStream, data: bytes) -> None:
        """One RateLimitQuotaUsageReports: each bucket answered, in order, in one response."""
        try:
            domain, usages = decode_reports(data)
        except ReportError as exc:
            self._end(stream, INVALID_ARGUMENT, str(exc))
            return
        if not stream.domain:
            if not domain:
                self._end(stream, INVALID_ARGUMENT, "the first report has no domain")
                return
            stream.domain = domain
        elif domain and domain != stream.domain:
            self._end(
                stream,
                INVALID_ARGUMENT,
                f"domain {domain!r} on a stream of domain {stream.domain!r} "
                "(a new domain needs a new stream)",
            )
            return
        actions = []
        for usage in usages:
            try:
                action = await self._usage(stream, usage.bucket, usage)
            except (BackendError, ServiceError) as exc:
                # The Envoy keeps its assignment until its TTL; the next report tries again.
                self.errors += 1
                log.warning("RLQS: bucket %s not assigned: %s", usage.bucket, exc)
                continue
            if stream.closed:
                return
            if action is not None:
                actions.append(action)
        stream.send(actions)

    async def _usage(
        self, stream: QuotaStream, bucket: dict[str, str], usage: Any
    ) -> Action | None:
        key = frozenset(bucket.items())
        b = stream.buckets.get(key, False)
        now = self.clock()
        if b is False:
            if (
                len(stream.buckets) >= self.settings.max_buckets_per_stream
                or self.held + _weight(bucket) > self.settings.max_buckets
            ):
                self.refused += 1
                return None
            try:
                entries = self.keys.entries(bucket, self.service.snapshot.options)
            except BucketError as exc:
                self.refused += 1
                stream.buckets[key] = None
                log.warning("RLQS: stream %s: bucket refused: %s", stream.peer, exc)
                return None
            b = stream.buckets[key] = Bucket(entries, last_busy=now)
            self.held += _weight(bucket)
            self.index.setdefault((stream.domain, key), {})[stream.ident] = b
        elif b is None:
            return None  # refused before (and logged then)
        assert isinstance(b, Bucket)
        n = usage.allowed + usage.denied
        b.reports += 1
        b.allowed += usage.allowed
        b.denied += usage.denied
        stream.reports += 1
        stream.allowed += usage.allowed
        stream.denied += usage.denied
        if n:
            b.last_busy = now
        elif b.sent is not None and now - b.last_busy >= self.settings.idle_timeout:
            self._drop(stream, key)
            return Action(bucket, abandon=True)
        b.rate = smoothed(b.rate, demand(usage.allowed, usage.denied, usage.elapsed))
        return await self._assign(stream, key, b, usage.allowed)

    async def refresh(self, stream: QuotaStream, key: frozenset[tuple[str, str]]) -> None:
        """A bucket's window ended: its new assignment, from the new window."""
        b = stream.buckets.get(key)
        if b is None:
            return
        try:
            action = await self._assign(stream, key, b, 0)
        except (BackendError, ServiceError) as exc:
            self.errors += 1
            log.warning("RLQS: bucket %s not assigned: %s", dict(key), exc)
            return
        stream.send([action])

    async def _assign(
        self, stream: QuotaStream, key: frozenset[tuple[str, str]], b: Bucket, consumed: int
    ) -> Action:
        """The bucket's assignment after `consumed` more allowed requests (see the module
        docstring); tokens taken from the counter as needed."""
        service = self.service
        domain = stream.domain
        status = (
            await service.dry_run(Request(domain, [Descriptor(b.entries, hits_addend=0)]))
        ).response.statuses[0]
        rule = status.rule
        ttl = self.settings.assignment_ttl
        if rule is None or rule.unlimited:
            b.limit = 0
            b.left = 0
            return self._sent(stream, key, b, ALLOW, ttl)
        b.limit = rule.requests_per_unit
        now = self.clock()
        period = rule.unit_seconds
        window_end = (now // period + 1) * period
        rollover = b.window_end != window_end
        b.window_end = window_end
        excess = max(0, consumed - b.left)
        b.left = max(0, b.left - consumed)
        if rollover:
            b.left = 0  # the new strategy replaces the Envoy's bucket and its old tokens
        # Tokens for the demand until the next report but one, or the window's end if that
        # comes first (what is left then is replaced at the end, not carried over).
        horizon = min(self.horizon, max(1.0, window_end - now))
        want = wanted(b.rate or 0.0, horizon)
        if b.reports <= 1:
            # A subscription shows one request: until a report shows the real demand, the
            # stream may also spend at the pace that uses the rest of the window evenly.
            left_time = max(1.0, window_end - now)
            want = max(want, math.ceil(status.limit_remaining * horizon / left_time))
        need = want - b.left
        grant = 0
        if need > 0:
            available = max(0, status.limit_remaining - excess)
            grant = self._share(stream, key, available, horizon)
        if grant + excess:
            request = Request(domain, [Descriptor(b.entries)], hits_addend=grant + excess)
            response = await service.should_rate_limit(request)
            if response.overall_code == OVER_LIMIT:
                grant = 0  # another replica took it first: nothing granted, nothing lost
        if grant or rollover or b.sent is None:
            # A new bucket of `left + grant` tokens replaces the Envoy's (reset: it starts
            # full, and the tokens it held are not added twice).
            b.left += grant
            strategy = (TOKENS, b.left, FILL_SECONDS) if b.left else DENY
            reset = b.sent is not None and b.sent[0] == TOKENS
            return self._sent(stream, key, b, strategy, ttl, reset)
        return self._sent(stream, key, b, b.sent, ttl)  # the same again: extended

    def _share(
        self, stream: QuotaStream, key: frozenset[tuple[str, str]], available: int, horizon: float
    ) -> int:
        """This stream's part of `available` among this replica's streams of the bucket."""
        sharing = self.index.get((stream.domain, key), {})
        wants = {}
        weights = {}
        for ident, other in sharing.items():
            wants[ident] = max(0, wanted(other.rate or 0.0, horizon) - other.left)
            weights[ident] = other.rate or 0.0
        return shares(available, wants, weights).get(stream.ident, 0)

    def _sent(
        self,
        stream: QuotaStream,
        key: frozenset[tuple[str, str]],
        b: Bucket,
        strategy: tuple[object, ...],
        ttl: float,
        reset: bool = False,
    ) -> Action:
        b.sent = strategy
        b.assignments += 1
        stream.assignments += 1
        return Action(dict(key), strategy, ttl, reset=reset)

    def _drop(self, stream: QuotaStream, key: frozenset[tuple[str, str]]) -> None:
        if stream.buckets.pop(key, None) is not None:
            self.held -= _weight(key)
        sharing = self.index.get((stream.domain, key))
        if sharing is not None:
            sharing.pop(stream.ident, None)
            if not sharing:
                del self.index[(stream.domain, key)]

    def _end(self, stream: QuotaStream, code: int, message: str) -> None:
        self.ended += 1
        log.warning("RLQS: stream from %s ended: %s", stream.peer or "?", message)
        stream.finish(code, message)

    def _tick(self) -> None:
        """Assign again every bucket whose window has ended; wake again at the next end
        (at the latest TICK_SECONDS later), so tokens of a window are replaced within
        milliseconds of its end."""
        now = self.clock()
        wake = now + TICK_SECONDS
        for stream in list(self.streams.values()):
            for key, b in list(stream.buckets.items()):
                if b is None or b.window_end <= 0 or b.sent is None:
                    continue
                if now >= b.window_end:
                    b.window_end = -1.0  # refreshed once (the refresh sets the new end)
                    stream.refresh(key)
                else:
                    wake = min(wake, b.window_end)
        if self.streams:
            loop = asyncio.get_running_loop()
            self._ticker = loop.call_later(max(0.0, wake - now), self._tick)
        else:
            self._ticker = None

    # -- what is seen -------------------------------------------------------------------

    def buckets(self, domain: str | None = None) -> list[dict[str, Any]]:
        """Every bucket held by a stream now (optionally of one domain), for `/counters`."""
        out = []
        for (d, key), sharing in sorted(
            self.index.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1]))
        ):
            if domain is not None and d != domain:
                continue
            first = next(iter(sharing.values()))
            out.append(
                {
                    "domain": d,
                    "bucket": dict(sorted(key)),
                    "entries": [list(e) for e in first.entries],
                    "limit": first.limit,
                    "streams": [
                        {
                            "stream": ident,
                            "peer": self.streams[ident].peer if ident in self.streams else "",
                            "demand": round(b.rate or 0.0, 3),
                            "tokens": b.left,
                            "strategy": list(b.sent) if b.sent is not None else None,
                            "reports": b.reports,
                            "allowed": b.allowed,
                            "denied": b.denied,
                            "assignments": b.assignments,
                        }
                        for ident, b in sorted(sharing.items())
                    ],
                }
            )
        return out

    def series(self) -> tuple[dict[str, float], dict[str, float]]:
        """Counters and gauges per bucket and per stream (a StatsStore source). Past
        STATS_MAX_REQUEST_SERIES buckets (streams), the rest are summed in one `_overflow`
        bucket (stream), as request-made rule series are folded."""
        counters: dict[str, float] = {
            "ratelimit.rlqs.refused_buckets": self.refused,
            "ratelimit.rlqs.store_errors": self.errors,
            "ratelimit.rlqs.streams_ended": self.ended,
        }
        gauges: dict[str, float] = {
            "ratelimit.rlqs.streams": len(self.streams),
            "ratelimit.rlqs.buckets": len(self.index),
            "ratelimit.rlqs.stream_buckets": self.held,
        }
        most = self.max_series
        for i, ((domain, _), sharing) in enumerate(self.index.items()):
            first = next(iter(sharing.values()))
            key = _stat_key(domain, first.entries) if i < most else OVERFLOW
            name = f"ratelimit.rlqs.bucket.{key}."
            held = list(sharing.values())
            _add(counters, name, held, ("reports", "allowed", "denied", "assignments"))
            gauges[name + "streams"] = gauges.get(name + "streams", 0) + len(held)
            gauges[name + "tokens"] = gauges.get(name + "tokens", 0) + sum(b.left for b in held)
        for i, stream in enumerate(self.streams.values()):
            name = f"ratelimit.rlqs.stream.{stream.ident if i < most else OVERFLOW}."
            _add(counters, name, [stream], ("reports", "allowed", "denied", "assignments"))
            held = [b for b in stream.buckets.values() if b is not None]
            gauges[name + "buckets"] = gauges.get(name + "buckets", 0) + len(held)
            gauges[name + "tokens"] = gauges.get(name + "tokens", 0) + sum(b.left for b in held)
        return counters, gauges


def _add(out: dict[str, float], prefix: str, items: list[Any], fields: tuple[str, ...]) -> None:
    for field in fields:
        out[prefix + field] = out.get(prefix + field, 0) + sum(getattr(x, field) for x in items)


def _weight(bucket: Any) -> int:
    """What a bucket counts against RLQS_MAX_BUCKETS: once, and once more per 256 bytes of
    its keys and values (as MEMORY_MAX_KEYS counts the memory store's keys)."""
    items = bucket.items() if isinstance(bucket, dict) else bucket
    return 1 + sum(len(k) + len(v) for k, v in items) // 256


def _stat_key(domain: str, entries: Entries) -> str:
    return sanitize_stat_name(".".join([domain, *(f"{k}_{v}" for k, v in entries)]))
