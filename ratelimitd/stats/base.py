"""What every sink shares: the Sink interface, the periodic flush, number and tag formats.

`Sink` does nothing (DISABLE_STATS); `PeriodicSink` flushes every STATS_FLUSH_INTERVAL from
the event loop, counters as deltas since its last flush (only those that changed, as gostats
does), gauges as values and the response-time timer as one line per sampled call; a
subclass only says how a line looks (`counter_line`, `gauge_line`, `timer_line`) and where
lines go (`emit`). Nothing here runs on the request path.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Iterable, Sequence

from ..runtime.aio import cancel
from .store import StatsStore, Timer

log = logging.getLogger("ratelimitd.stats")

# The reference's response-time timer; the gRPC handler (transport/rls.py) feeds it.
RESPONSE_TIME = "ratelimit_server.ShouldRateLimit.response_time"

# Registered as gauges (the pool reports them through a callable), flushed as counters: the
# reference's redis pool stats `cx_total` / `cx_local_close` are gostats counters.
CUMULATIVE_GAUGE_SUFFIXES = (".cx_total", ".cx_local_close")

# Lines formatted per event-loop slice when flushing a large store.
_LINES_PER_SLICE = 2000


class SinkError(ValueError):
    """The stats settings cannot build a sink (e.g. two sinks enabled)."""


_TAG_VALUE_RESERVED = str.maketrans({".": "_", ":": "_", "|": "_"})


def tag_pairs(extra_tags: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """EXTRA_TAGS as gostats keeps them: empty keys/values dropped, `.:|` in values -> `_`,
    sorted by key (a repeated key keeps its last value)."""
    tags: dict[str, str] = {}
    for key, value in extra_tags:
        if key and value:
            tags[key] = value.translate(_TAG_VALUE_RESERVED)
    return sorted(tags.items())


def statsd_tag_suffix(extra_tags: Iterable[tuple[str, str]]) -> str:
    """The `.__k=v.__k2=v2` suffix gostats appends to every tagged statistic's name."""
    return "".join(f".__{k}={v}" for k, v in tag_pairs(extra_tags))


def number(value: float) -> str:
    """A statsd/Prometheus number: integers without a fraction, others as Go's %g."""
    if math.isfinite(value) and value == int(value) and abs(value) < 2**63:
        return str(int(value))
    return repr(float(value))


def timer_value(ms: float) -> str:
    """A statsd timer value as gostats writes it: integers as integers, others as 'f', 6."""
    if ms >= 0 and ms == int(ms):
        return str(int(ms))
    return f"{ms:.6f}"


class Sink:
    """A sink that does nothing (DISABLE_STATS); the base of the others."""

    kind = "null"

    def __init__(self, stats: StatsStore, flush_interval: float = 10.0) -> None:
        self.stats = stats
        self.flush_interval = flush_interval
        self._task: asyncio.Task[None] | None = None

    @property
    def timer(self) -> Timer | None:
        """The response-time timer the gRPC interceptor feeds, or None when unused."""
        return None

    async def start(self) -> None:
        """Begin flushing every STATS_FLUSH_INTERVAL (and open sockets/listeners)."""

    async def stop(self) -> None:
        """Flush a last time and release sockets and listeners."""

    async def flush(self) -> None:
        """Send what changed since the last flush."""

    def _start_flushing(self) -> None:
        """Call `flush()` every flush_interval from now on (a failed flush is logged)."""
        if self._task is None:
            self._task = asyncio.create_task(
                self._flush_every_interval(), name=f"stats-{self.kind}"
            )

    async def _flush_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await self.flush()
            except Exception:
                log.exception("stats flush to the %s sink failed", self.kind)

    async def _stop_flushing(self) -> None:
        """Stop the periodic flushes (the caller flushes a last time)."""
        await cancel(self._task)
        self._task = None


NullSink = Sink


class PeriodicSink(Sink):
    """Flushes every interval from the event loop; counters as deltas, gauges as values."""

    def __init__(self, stats: StatsStore, flush_interval: float = 10.0) -> None:
        super().__init__(stats, flush_interval)
        self._last: dict[str, float] = {}
        self._timer = stats.timer(RESPONSE_TIME)

    @property
    def timer(self) -> Timer | None:
        return self._timer

    async def start(self) -> None:
        self._start_flushing()

    async def stop(self) -> None:
        await self._stop_flushing()
        await self.flush()

    async def collect(self) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """(counter deltas that are not zero, gauge values) since the last call."""
        snapshot = await self.stats.snapshot_sliced()
        gauge_names = self.stats.gauge_names()
        last = self._last
        counters: list[tuple[str, float]] = []
        gauges: list[tuple[str, float]] = []
        for name, value in snapshot.items():
            if name in gauge_names and not name.endswith(CUMULATIVE_GAUGE_SUFFIXES):
                gauges.append((name, value))
                continue
            delta = value - last.get(name, 0)
            if delta:
                last[name] = value
                if delta > 0:
                    counters.append((name, delta))
        return counters, gauges

    def timings(self) -> tuple[list[float], float]:
        """Sampled response times since the last call and the statsd sample rate."""
        sample, seen = self._timer.drain()
        rate = len(sample) / seen if seen > len(sample) else 1.0
        return sample, rate

    async def flush(self) -> None:
        counters, gauges = await self.collect()
        sample, rate = self.timings()
        lines: list[str] = []
        for i, (name, value) in enumerate(counters):
            lines.append(self.counter_line(name, value))
            if i % _LINES_PER_SLICE == _LINES_PER_SLICE - 1:
                await asyncio.sleep(0)  # a huge store must not hold the loop
        for name, value in gauges:
            lines.append(self.gauge_line(name, value))
        for ms in sample:
            lines.append(self.timer_line(RESPONSE_TIME, ms, rate))
        if lines:
            self.emit(lines)

    def counter_line(self, name: str, value: float) -> str:
        raise NotImplementedError

    def gauge_line(self, name: str, value: float) -> str:
        raise NotImplementedError

    def timer_line(self, name: str, ms: float, rate: float) -> str:
        raise NotImplementedError

    def emit(self, lines: list[str]) -> None:
        raise NotImplementedError


# `$1` and `${1}`, as Go's Regexp.Expand and statsd_exporter's templates write them.
_GROUP_REF = re.compile(r"\$\{(\d+)\}|\$(\d+)")


def expand(template: str, groups: Sequence[str | None]) -> str:
    def one(m: re.Match[str]) -> str:
        i = int(m.group(1) or m.group(2))
        return (groups[i] or "") if i < len(groups) else ""

    return _GROUP_REF.sub(one, template)
