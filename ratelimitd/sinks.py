"""Stats sinks: where `StatsStore` numbers go, chosen as the reference chooses them.

`create_sink(settings, stats)` returns one of (reference section 2, "sink choice"):

* `NullSink` when DISABLE_STATS (counting goes on in memory for `/stats`);
* `DogStatsdSink` (USE_DOG_STATSD): DogStatsD lines over UDP, EXTRA_TAGS and the
  DOG_STATSD_MOGRIFIER_* rules turned into real `|#k:v` tags;
* `StatsdSink` (USE_STATSD, the default): plain statsd lines over TCP as lyft/gostats sends
  them, EXTRA_TAGS serialized into the name as `<name>.__k=v.__k2=v2`;
* `PrometheusSink` (USE_PROMETHEUS): an HTTP endpoint on PROMETHEUS_ADDR + PROMETHEUS_PATH
  serving the text exposition through a statsd_exporter-style mapper (the reference's
  default mapping unless PROMETHEUS_MAPPER_YAML);
* `LoggingSink` otherwise: gostats' JSON log lines on stderr.

A second enabled sink is an error (`SinkError`), as it is fatal in the reference.

Nothing here runs on the request path. The hot path keeps incrementing attributes; every
STATS_FLUSH_INTERVAL a sink reads `StatsStore.snapshot()` from the event loop and sends
counters as deltas since its last flush (only those that changed, as gostats does), gauges
as values and the `ratelimit_server.ShouldRateLimit.response_time` timer (ms) as one line
per sampled call. Network writes never block the loop: statsd lines go into a bounded
buffer drained by a background task that reconnects with backoff, and what does not fit is
dropped and counted. The response-time timer is fed by the gRPC interceptor of
`ratelimitd.tracing.server_interceptor`.

Workers (RATELIMITD_WORKERS > 1): each process flushes its own counters to statsd. For
Prometheus, each worker is given a shared directory and its index; it writes its totals to
`<dir>/worker-<index>.json` (atomically, on every flush and before answering a scrape) and
every worker's endpoint (the port is bound with SO_REUSEPORT) serves the sum of all the
files, so whichever worker answers, the scrape shows the whole daemon and counters never go
backwards. A restarted worker starts from its predecessor's file, so its counters continue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import socket
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

from .settings import DogStatsdMogrifier, Settings, StatsSettings
from .stats import StatsStore, Timer

log = logging.getLogger(__name__)

RESPONSE_TIME = "ratelimit_server.ShouldRateLimit.response_time"

# Registered as gauges (the pool reports them through a callable), flushed as counters: the
# reference's redis pool stats `cx_total` / `cx_local_close` are gostats counters.
_CUMULATIVE_GAUGE_SUFFIXES = (".cx_total", ".cx_local_close")

# gostats' net sink: 3 s between reconnects, 1.5 s dial timeout, 1 s write timeout, about
# 4 MiB of stats buffered before dropping.
RECONNECT_MIN_SECONDS = 0.1
RECONNECT_MAX_SECONDS = 3.0
DIAL_TIMEOUT_SECONDS = 1.5
WRITE_TIMEOUT_SECONDS = 1.0
MAX_BUFFERED_BYTES = 1 << 22
# datadog-go's default UDP payload (no IP fragmentation on a 1500-byte MTU).
UDP_PAYLOAD_BYTES = 1432
# Lines formatted per event-loop slice when flushing a large store.
_LINES_PER_SLICE = 2000


class SinkError(ValueError):
    """The stats settings cannot build a sink (e.g. two sinks enabled)."""


# -- names and tags ------------------------------------------------------------------------

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


def _number(value: float) -> str:
    """A statsd/Prometheus number: integers without a fraction, others as Go's %g."""
    if math.isfinite(value) and value == int(value) and abs(value) < 2**63:
        return str(int(value))
    return repr(float(value))


def _timer_value(ms: float) -> str:
    # gostats: integers as integers, other values with 6 decimals ('f', 6).
    if ms >= 0 and ms == int(ms):
        return str(int(ms))
    return f"{ms:.6f}"


# -- base ----------------------------------------------------------------------------------


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


NullSink = Sink


class _PeriodicSink(Sink):
    """Flushes every interval from the event loop; counters as deltas, gauges as values."""

    def __init__(self, stats: StatsStore, flush_interval: float = 10.0) -> None:
        super().__init__(stats, flush_interval)
        self._last: dict[str, float] = {}
        self._timer = stats.timer(RESPONSE_TIME)

    @property
    def timer(self) -> Timer | None:
        return self._timer

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"stats-{self.kind}")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await self.flush()
            except Exception:
                log.exception("stats flush to the %s sink failed", self.kind)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    def collect(self) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """(counter deltas that are not zero, gauge values) since the last call."""
        snapshot = self.stats.snapshot()
        gauge_names = self.stats.gauge_names()
        last = self._last
        counters: list[tuple[str, float]] = []
        gauges: list[tuple[str, float]] = []
        for name, value in snapshot.items():
            if name in gauge_names and not name.endswith(_CUMULATIVE_GAUGE_SUFFIXES):
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
        counters, gauges = self.collect()
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


# -- statsd over TCP -----------------------------------------------------------------------


class TcpWriter:
    """Bytes to host:port over TCP without ever blocking the caller.

    `send()` appends to a bounded queue (dropping, and counting, what does not fit); a
    background task connects (with backoff between failed attempts), writes the queue and
    reconnects when the peer goes away or stops reading for WRITE_TIMEOUT_SECONDS.
    """

    def __init__(self, host: str, port: int, max_buffered: int = MAX_BUFFERED_BYTES) -> None:
        self.host = host
        self.port = port
        self.max_buffered = max_buffered
        self.queued = 0
        self.dropped_bytes = 0
        self.sent_bytes = 0
        self.connects = 0
        self.connect_failures = 0
        self._queue: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the background connect/write task."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="statsd-tcp")

    def send(self, data: bytes) -> bool:
        """Queue data; False (and counted as dropped) when the buffer is full."""
        if self.queued + len(data) > self.max_buffered:
            self._drop(len(data), "statsd buffer full")
            return False
        self._queue.append(data)
        self.queued += len(data)
        self._wake.set()
        return True

    def _drop(self, n: int, why: str) -> None:
        before = self.dropped_bytes
        self.dropped_bytes += n
        # Log once per 32 KiB dropped, as gostats does.
        if before // 32768 != self.dropped_bytes // 32768 or before == 0:
            log.warning("%s: dropped %d bytes of stats (%d in total)", why, n, self.dropped_bytes)

    async def _run(self) -> None:
        delay = RECONNECT_MIN_SECONDS
        while True:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), DIAL_TIMEOUT_SECONDS
                )
            except (OSError, TimeoutError) as err:
                self.connect_failures += 1
                if self.connect_failures == 1 or delay >= RECONNECT_MAX_SECONDS:
                    log.warning(
                        "statsd connection error (%s:%s): %s",
                        self.host,
                        self.port,
                        str(err) or type(err).__name__,
                    )
                await asyncio.sleep(delay)
                delay = min(RECONNECT_MAX_SECONDS, delay * 2)
                continue
            self.connects += 1
            delay = RECONNECT_MIN_SECONDS
            try:
                await self._pump(reader, writer)
            except (OSError, TimeoutError) as err:
                log.warning(
                    "statsd connection lost (%s:%s): %s",
                    self.host,
                    self.port,
                    str(err) or type(err).__name__,
                )
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_SECONDS)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # statsd never answers: a finished read means the server closed the connection.
        closed: asyncio.Future[Any] = asyncio.ensure_future(reader.read(1))
        wake: asyncio.Future[Any] | None = None
        try:
            while True:
                while self._queue:
                    chunk = self._queue.popleft()
                    self.queued -= len(chunk)
                    writer.write(chunk)
                    try:
                        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_SECONDS)
                    except TimeoutError:
                        self._drop(len(chunk), "statsd write timed out")
                        raise
                    self.sent_bytes += len(chunk)
                if closed.done():
                    raise ConnectionResetError("closed by the statsd server")
                self._wake.clear()
                wake = waiting = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({waiting, closed}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
        finally:
            closed.cancel()
            if wake is not None:
                wake.cancel()

    async def flush(self, timeout: float = WRITE_TIMEOUT_SECONDS) -> None:
        """Wait (at most `timeout`) until the queue is written."""
        deadline = time.monotonic() + timeout
        while self._queue and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Stop the background task; what is still queued is dropped."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class StatsdSink(_PeriodicSink):
    """gostats' TCP statsd sink: `name:delta|c`, `name:value|g`, `name:ms|ms` lines."""

    kind = "statsd"

    def __init__(
        self,
        stats: StatsStore,
        host: str,
        port: int,
        *,
        extra_tags: Iterable[tuple[str, str]] = (),
        flush_interval: float = 10.0,
        max_buffered: int = MAX_BUFFERED_BYTES,
    ) -> None:
        super().__init__(stats, flush_interval)
        self.suffix = statsd_tag_suffix(extra_tags)
        self.writer = TcpWriter(host, port, max_buffered)

    async def start(self) -> None:
        self.writer.start()
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        await self.writer.flush()
        await self.writer.close()

    def counter_line(self, name: str, value: float) -> str:
        return f"{name}{self.suffix}:{_number(value)}|c\n"

    def gauge_line(self, name: str, value: float) -> str:
        return f"{name}{self.suffix}:{_number(value)}|g\n"

    def timer_line(self, name: str, ms: float, rate: float) -> str:
        if rate < 1.0:
            return f"{name}{self.suffix}:{_timer_value(ms)}|ms|@{rate:.6g}\n"
        return f"{name}{self.suffix}:{_timer_value(ms)}|ms\n"

    def emit(self, lines: list[str]) -> None:
        # One chunk per 64 KiB (gostats' TCP buffer size) keeps drops coarse but bounded.
        chunk: list[str] = []
        size = 0
        for line in lines:
            chunk.append(line)
            size += len(line)
            if size >= 1 << 16:
                self.writer.send("".join(chunk).encode())
                chunk, size = [], 0
        if chunk:
            self.writer.send("".join(chunk).encode())


# -- DogStatsD over UDP --------------------------------------------------------------------


class UdpWriter:
    """Datagrams of at most UDP_PAYLOAD_BYTES, newline-separated lines, never blocking."""

    def __init__(self, host: str, port: int, payload: int = UDP_PAYLOAD_BYTES) -> None:
        self.host = host
        self.port = port
        self.payload = payload
        self.sent_packets = 0
        self.dropped_bytes = 0
        self._sock: socket.socket | None = None

    async def open(self) -> bool:
        """Resolve and connect the socket (retried on the next send when it fails)."""
        if self._sock is not None:
            return True
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_DGRAM)
            family, kind, proto, _, addr = infos[0]
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            sock.connect(addr)
        except OSError as err:
            log.warning("dogstatsd address %s:%s: %s", self.host, self.port, err)
            return False
        self._sock = sock
        return True

    def send_lines(self, lines: Sequence[str]) -> None:
        """Pack lines into datagrams and send them; a failed send drops that datagram."""
        packet: list[bytes] = []
        size = 0
        for line in lines:
            data = line.encode()
            if packet and size + len(data) > self.payload:
                self._send(b"".join(packet))
                packet, size = [], 0
            packet.append(data)
            size += len(data)
        if packet:
            self._send(b"".join(packet))

    def _send(self, data: bytes) -> None:
        sock = self._sock
        if sock is None:
            self.dropped_bytes += len(data)
            return
        try:
            sock.send(data)
            self.sent_packets += 1
        except OSError:
            # No agent (ECONNREFUSED) or a full socket buffer: statsd over UDP is lossy.
            self.dropped_bytes += len(data)

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


@dataclass(frozen=True)
class _Mogrifier:
    regex: re.Pattern[str]
    name: str
    tags: tuple[tuple[str, str], ...]


_GROUP_REF = re.compile(r"\$(\d+)")


def _expand(template: str, groups: Sequence[str | None]) -> str:
    def one(m: re.Match[str]) -> str:
        i = int(m.group(1))
        return (groups[i] or "") if i < len(groups) else ""

    return _GROUP_REF.sub(one, template)


class DogStatsdSink(_PeriodicSink):
    """The reference's DogStatsD sink: `name:value|c|#k:v,...` over UDP.

    EXTRA_TAGS become tags (`k:v`, values cleaned as gostats cleans them), then the first
    mogrifier whose PATTERN matches the name rewrites it to NAME and adds TAGS (`$N` is the
    N-th group). Timers are sent in milliseconds.
    """

    kind = "dogstatsd"

    def __init__(
        self,
        stats: StatsStore,
        host: str,
        port: int,
        *,
        extra_tags: Iterable[tuple[str, str]] = (),
        mogrifiers: Iterable[DogStatsdMogrifier] = (),
        flush_interval: float = 10.0,
    ) -> None:
        super().__init__(stats, flush_interval)
        self.tags = [f"{k}:{v}" for k, v in tag_pairs(extra_tags)]
        self.mogrifiers = [_Mogrifier(m.regex, m.metric_name, m.tags) for m in mogrifiers]
        self.writer = UdpWriter(host, port)
        self._names: dict[str, str] = {}

    def mogrify(self, name: str) -> tuple[str, list[str]]:
        """The DogStatsD name and tags of a statistic."""
        for m in self.mogrifiers:
            match = m.regex.search(name)
            if match is None:
                continue
            groups = (match.group(0), *match.groups())
            tags = [f"{k}:{_expand(v, groups)}" for k, v in m.tags]
            return _expand(m.name, groups), self.tags + tags
        return name, self.tags

    def _head(self, name: str) -> tuple[str, str]:
        # (name, "|#tags" or "") memoised per statistic: names repeat every flush.
        cached = self._names.get(name)
        if cached is None:
            new_name, tags = self.mogrify(name)
            cached = self._names[name] = new_name + "\0" + ("|#" + ",".join(tags) if tags else "")
        head, _, tail = cached.partition("\0")
        return head, tail

    async def start(self) -> None:
        await self.writer.open()
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        self.writer.close()

    async def flush(self) -> None:
        await self.writer.open()
        await super().flush()

    def counter_line(self, name: str, value: float) -> str:
        head, tags = self._head(name)
        return f"{head}:{_number(value)}|c{tags}\n"

    def gauge_line(self, name: str, value: float) -> str:
        head, tags = self._head(name)
        return f"{head}:{_number(value)}|g{tags}\n"

    def timer_line(self, name: str, ms: float, rate: float) -> str:
        head, tags = self._head(name)
        sampled = f"|@{rate:.6g}" if rate < 1.0 else ""
        return f"{head}:{_number(round(ms, 6))}|ms{sampled}{tags}\n"

    def emit(self, lines: list[str]) -> None:
        self.writer.send_lines(lines)


# -- stdout (gostats' logging sink) --------------------------------------------------------


class LoggingSink(_PeriodicSink):
    """gostats' logging sink: one JSON line per flushed statistic on stderr."""

    kind = "stdout"

    def __init__(
        self,
        stats: StatsStore,
        *,
        extra_tags: Iterable[tuple[str, str]] = (),
        flush_interval: float = 10.0,
        stream: TextIO | None = None,
    ) -> None:
        super().__init__(stats, flush_interval)
        self.suffix = statsd_tag_suffix(extra_tags)
        self.stream = stream

    def _line(self, name: str, kind: str, value: float) -> str:
        return json.dumps(
            {
                "level": "debug",
                "ts": round(time.time(), 6),
                "logger": "gostats.loggingsink",
                "msg": f"flushing {kind}",
                "json": {"name": name + self.suffix, "type": kind, "value": f"{value:f}"},
            },
            separators=(",", ":"),
        )

    def counter_line(self, name: str, value: float) -> str:
        return self._line(name, "counter", value)

    def gauge_line(self, name: str, value: float) -> str:
        return self._line(name, "gauge", value)

    def timer_line(self, name: str, ms: float, rate: float) -> str:
        return self._line(name, "timer", ms)

    def emit(self, lines: list[str]) -> None:
        stream = self.stream or sys.stderr
        stream.write("\n".join(lines) + "\n")
        stream.flush()


# -- Prometheus ----------------------------------------------------------------------------

# prometheus client_golang's DefBuckets (seconds), statsd_exporter's default histogram.
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# The reference's src/stats/prom/default_mapper.yaml, with the response time scaled from
# milliseconds to seconds unless PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS.
_RULE_STATS = ("near_limit", "over_limit", "total_hits", "within_limit", "shadow_mode")


def default_mapping_config(response_time_as_milliseconds: bool = False) -> dict[str, Any]:
    """The default mapper as a statsd_exporter mapping config (a YAML-shaped dict)."""
    mappings: list[dict[str, Any]] = []
    for stat in _RULE_STATS:
        mappings.append(
            {
                "match": f"ratelimit.service.rate_limit.*.*.{stat}",
                "name": f"ratelimit_service_rate_limit_{stat}",
                "timer_type": "histogram",
                "labels": {"domain": "$1", "key1": "$2"},
            }
        )
    for stat in _RULE_STATS:
        mappings.append(
            {
                "match": (
                    r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\." + stat
                ),
                "match_type": "regex",
                "name": f"ratelimit_service_rate_limit_{stat}",
                "timer_type": "histogram",
                "labels": {"domain": "$1", "key1": "$2", "key2": "$3"},
            }
        )
    mappings += [
        {
            "match": "ratelimit.service.call.should_rate_limit.*",
            "name": "ratelimit_service_should_rate_limit_error",
            "match_metric_type": "counter",
            "labels": {"err_type": "$1"},
        },
        {
            "match": "ratelimit_server.*.total_requests",
            "name": "ratelimit_service_total_requests",
            "match_metric_type": "counter",
            "labels": {"grpc_method": "$1"},
        },
        {
            "match": "ratelimit_server.*.response_time",
            "name": "ratelimit_service_response_time_seconds",
            "timer_type": "histogram",
            "scale": 1.0 if response_time_as_milliseconds else 0.001,
            "labels": {"grpc_method": "$1"},
        },
        {
            "match": "ratelimit.service.config_load_success",
            "name": "ratelimit_service_config_load_success",
            "match_metric_type": "counter",
        },
        {
            "match": "ratelimit.service.config_load_error",
            "name": "ratelimit_service_config_load_error",
            "match_metric_type": "counter",
        },
    ]
    return {"mappings": mappings}


_NOT_NAME_CHAR = re.compile(r"[^a-zA-Z0-9_]")


def escape_metric_name(name: str) -> str:
    """statsd_exporter's name for an unmapped statistic: non-[a-zA-Z0-9_] -> `_`."""
    name = _NOT_NAME_CHAR.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


@dataclass(frozen=True)
class Mapping:
    """One statsd_exporter mapping rule (the subset the reference's mapper uses)."""

    regex: re.Pattern[str]
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    metric_type: str = ""  # "", counter, gauge, observer
    drop: bool = False
    observer: str = "histogram"  # histogram | summary
    buckets: tuple[float, ...] = DEFAULT_BUCKETS
    scale: float = 1.0


@dataclass(frozen=True)
class Mapped:
    """Where one statistic goes in the exposition."""

    name: str
    labels: tuple[tuple[str, str], ...]
    mapping: Mapping | None


class MetricMapper:
    """statsd names -> Prometheus names and labels, statsd_exporter's mapping semantics.

    Supported: `mappings` with `match` (glob, `*` = one dot-free component, or
    `match_type: regex`, searched unanchored as Go does), `name`, `labels` with `$N`
    references, `match_metric_type` (counter | gauge | observer/timer), `action: drop`,
    `timer_type`/`observer_type` (histogram | summary), `buckets` or
    `histogram_options.buckets`, `scale`, and `defaults` for the last four. The first
    matching rule wins; an unmatched statistic is exported under its escaped name.
    """

    def __init__(self, mappings: Sequence[Mapping]) -> None:
        self.mappings = tuple(mappings)
        self._cache: dict[tuple[str, str], Mapped | None] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MetricMapper:
        """Build from a parsed mapping YAML."""
        if not isinstance(config, dict):
            raise SinkError("prometheus mapper: expected a mapping with a 'mappings' list")
        defaults = config.get("defaults") or {}
        mappings = []
        for raw in config.get("mappings") or []:
            if not isinstance(raw, dict) or "match" not in raw:
                raise SinkError(f"prometheus mapper: a mapping needs 'match': {raw!r}")
            match = str(raw["match"])
            match_type = raw.get("match_type", defaults.get("match_type", "glob"))
            try:
                if match_type == "regex":
                    regex = re.compile(match)
                else:
                    regex = re.compile("^" + re.escape(match).replace(r"\*", "([^.]*)") + "$")
            except re.error as err:
                raise SinkError(f"prometheus mapper: bad match {match!r}: {err}") from None
            action = raw.get("action", "map")
            name = str(raw.get("name", ""))
            if action != "drop" and not name:
                raise SinkError(f"prometheus mapper: mapping {match!r} has no name")
            options = raw.get("histogram_options") or {}
            buckets = (
                raw.get("buckets")
                or options.get("buckets")
                or defaults.get("buckets")
                or (defaults.get("histogram_options") or {}).get("buckets")
                or DEFAULT_BUCKETS
            )
            kind = str(raw.get("match_metric_type", "")).replace("timer", "observer")
            observer = raw.get("observer_type") or raw.get("timer_type")
            observer = observer or defaults.get("observer_type") or defaults.get("timer_type")
            mappings.append(
                Mapping(
                    regex=regex,
                    name=name,
                    labels=tuple((str(k), str(v)) for k, v in (raw.get("labels") or {}).items()),
                    metric_type=kind,
                    drop=action == "drop",
                    observer="summary" if observer == "summary" else "histogram",
                    buckets=tuple(sorted(float(b) for b in buckets)),
                    scale=float(raw.get("scale", defaults.get("scale", 1.0))),
                )
            )
        return cls(mappings)

    @classmethod
    def from_settings(cls, settings: StatsSettings) -> MetricMapper:
        """PROMETHEUS_MAPPER_YAML when set, else the reference's default mapping."""
        if settings.prometheus_mapper_yaml:
            try:
                with open(settings.prometheus_mapper_yaml, encoding="utf-8") as f:
                    config = yaml.safe_load(f)
            except (OSError, yaml.YAMLError) as err:
                raise SinkError(f"PROMETHEUS_MAPPER_YAML: {err}") from None
            return cls.from_config(config)
        return cls.from_config(
            default_mapping_config(settings.prometheus_response_time_as_milliseconds)
        )

    def map(self, name: str, kind: str) -> Mapped | None:
        """The exposition name and labels of a statistic (kind: counter | gauge |
        observer), or None when a rule drops it."""
        key = (name, kind)
        if key in self._cache:
            return self._cache[key]
        result: Mapped | None = Mapped(escape_metric_name(name), (), None)
        for m in self.mappings:
            if m.metric_type and m.metric_type != kind:
                continue
            match = m.regex.search(name)
            if match is None:
                continue
            if m.drop:
                result = None
                break
            groups = (match.group(0), *match.groups())
            labels = tuple((k, _expand(v, groups)) for k, v in m.labels)
            result = Mapped(escape_metric_name(_expand(m.name, groups)), labels, m)
            break
        self._cache[key] = result
        return result


@dataclass
class Totals:
    """One process's statistics in the shape the Prometheus sink sums over workers."""

    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    # name -> (bounds ms, bucket counts, count, sum ms)
    timers: dict[str, tuple[list[float], list[int], int, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, stats: StatsStore) -> Totals:
        """The current totals of a store."""
        gauge_names = stats.gauge_names()
        totals = cls()
        for name, value in stats.snapshot().items():
            if name in gauge_names and not name.endswith(_CUMULATIVE_GAUGE_SUFFIXES):
                totals.gauges[name] = value
            else:
                totals.counters[name] = value
        for t in stats.timers():
            totals.timers[t.name] = (list(t.bounds), list(t.buckets), t.count, t.sum)
        return totals

    def add(self, other: Totals, gauges: bool = True) -> None:
        """Add another process's totals (gauges too unless told otherwise)."""
        for name, value in other.counters.items():
            self.counters[name] = self.counters.get(name, 0) + value
        if gauges:
            for name, value in other.gauges.items():
                self.gauges[name] = self.gauges.get(name, 0) + value
        for name, (bounds, buckets, count, total) in other.timers.items():
            mine = self.timers.get(name)
            if mine is None or mine[0] != bounds:
                if mine is not None:
                    continue  # bounds differ (a worker with another mapper): keep ours
                self.timers[name] = (list(bounds), list(buckets), count, total)
                continue
            merged = [a + b for a, b in zip(mine[1], buckets, strict=True)]
            self.timers[name] = (mine[0], merged, mine[2] + count, mine[3] + total)

    def to_json(self) -> bytes:
        """The file format of the worker share."""
        return json.dumps(
            {"counters": self.counters, "gauges": self.gauges, "timers": self.timers}
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Totals:
        """Parse `to_json` output."""
        raw = json.loads(data)
        timers = {
            k: (list(v[0]), list(v[1]), int(v[2]), float(v[3])) for k, v in raw["timers"].items()
        }
        return cls(dict(raw["counters"]), dict(raw["gauges"]), timers)


class WorkerShare:
    """A directory where each worker process keeps its totals for the Prometheus scrape."""

    def __init__(self, directory: str, index: int) -> None:
        self.directory = directory
        self.index = index
        self.path = os.path.join(directory, f"worker-{index}.json")
        # A restarted worker continues from its predecessor's counters.
        self.base = Totals()
        try:
            with open(self.path, "rb") as f:
                self.base.add(Totals.from_json(f.read()), gauges=False)
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def write(self, totals: Totals) -> None:
        """Replace this worker's file atomically with base + totals."""
        merged = Totals()
        merged.add(self.base, gauges=False)
        merged.add(totals)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(merged.to_json())
        os.replace(tmp, self.path)

    def read_all(self) -> Totals:
        """The sum over every worker's file."""
        total = Totals()
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return total
        for name in names:
            if not (name.startswith("worker-") and name.endswith(".json")):
                continue
            try:
                with open(os.path.join(self.directory, name), "rb") as f:
                    total.add(Totals.from_json(f.read()))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being replaced, or not ours
        return total


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels_text(labels: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels))
    return "{" + inner + "}" if inner else ""


def parse_listen_address(addr: str) -> tuple[str | None, int]:
    """Go's `host:port` listen address (`:9090` = every interface, `[::1]:9090`)."""
    host, sep, port = addr.rpartition(":")
    if not sep:
        raise SinkError(f"PROMETHEUS_ADDR: expected host:port, got {addr!r}")
    try:
        number = int(port)
    except ValueError:
        raise SinkError(f"PROMETHEUS_ADDR: bad port in {addr!r}") from None
    host = host.strip("[]")
    return (host or None), number


HELP_TEXT = "Metric autogenerated by statsd_exporter."
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PrometheusSink(Sink):
    """The Prometheus text exposition on PROMETHEUS_ADDR + PROMETHEUS_PATH.

    A scrape renders the current totals (the live store, or the sum over the workers'
    files when a `WorkerShare` is given) through the mapper, so the values are those of
    `snapshot()` at that moment. EXTRA_TAGS become labels of every series (the mapping's
    own labels win a clash); the reference would serialize them into the statsd name, which
    no default mapping then matches.
    """

    kind = "prometheus"

    def __init__(
        self,
        stats: StatsStore,
        mapper: MetricMapper,
        *,
        addr: str = ":9090",
        path: str = "/metrics",
        extra_tags: Iterable[tuple[str, str]] = (),
        flush_interval: float = 10.0,
        share: WorkerShare | None = None,
    ) -> None:
        super().__init__(stats, flush_interval)
        self.mapper = mapper
        self.host, self.port = parse_listen_address(addr)
        self.path = path
        self.tags = tuple((escape_metric_name(k), v) for k, v in tag_pairs(extra_tags))
        self.share = share
        self._timer = stats.timer(RESPONSE_TIME)
        self._timer.capacity = 0  # buckets only: a scrape needs no per-call values
        mapped = mapper.map(RESPONSE_TIME, "observer")
        if mapped is not None and mapped.mapping is not None:
            scale = mapped.mapping.scale or 1.0
            self._timer.set_bounds(tuple(b / scale for b in mapped.mapping.buckets))
        else:
            self._timer.set_bounds(DEFAULT_BUCKETS)
        self._server: asyncio.Server | None = None

    @property
    def timer(self) -> Timer | None:
        return self._timer

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, reuse_port=True, reuse_address=True
            )
            self.port = self._server.sockets[0].getsockname()[1]
            log.info("prometheus metrics on %s:%d%s", self.host or "*", self.port, self.path)
        if self.share is not None and self._task is None:
            self._task = asyncio.create_task(self._publish(), name="stats-prometheus")

    async def _publish(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            await self.flush()

    async def flush(self) -> None:
        if self.share is not None:
            try:
                self.share.write(Totals.of(self.stats))
            except OSError as err:
                log.warning("cannot write the worker's stats file: %s", err)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def totals(self) -> Totals:
        """What a scrape shows: this process, or every worker."""
        if self.share is None:
            return Totals.of(self.stats)
        with contextlib.suppress(OSError):
            self.share.write(Totals.of(self.stats))
        return self.share.read_all()

    def render(self) -> bytes:
        """The text exposition (format 0.0.4) of the current totals."""
        totals = self.totals()
        # family name -> (type, {labels: value or histogram})
        families: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], Any]]] = {}

        def series(mapped: Mapped, kind: str) -> dict[tuple[tuple[str, str], ...], Any] | None:
            family = families.get(mapped.name)
            if family is None:
                family = families[mapped.name] = (kind, {})
            elif family[0] != kind:
                return None  # statsd_exporter drops a name that changes type
            return family[1]

        def labels_of(mapped: Mapped) -> tuple[tuple[str, str], ...]:
            own = dict(mapped.labels)
            merged = {k: v for k, v in self.tags if k not in own}
            merged.update(own)
            return tuple(sorted(merged.items()))

        for name, value in totals.counters.items():
            mapped = self.mapper.map(name, "counter")
            if mapped is None:
                continue
            values = series(mapped, "counter")
            if values is not None:
                key = labels_of(mapped)
                values[key] = values.get(key, 0) + value
        for name, value in totals.gauges.items():
            mapped = self.mapper.map(name, "gauge")
            if mapped is None:
                continue
            values = series(mapped, "gauge")
            if values is not None:
                values[labels_of(mapped)] = value
        for name, (bounds, buckets, count, total) in totals.timers.items():
            if count == 0:
                continue
            mapped = self.mapper.map(name, "observer")
            if mapped is None:
                continue
            scale = mapped.mapping.scale if mapped.mapping is not None else 1.0
            kind = "summary"
            if mapped.mapping is not None and mapped.mapping.observer == "histogram":
                kind = "histogram"
            values = series(mapped, kind)
            if values is None:
                continue
            key = labels_of(mapped)
            les = [b * scale for b in bounds]
            previous = values.get(key)
            if previous is not None and previous[0] == les:
                buckets = [a + b for a, b in zip(previous[1], buckets, strict=True)]
                count += previous[2]
                total = previous[3] / scale + total
            values[key] = (les, buckets, count, total * scale)

        out: list[str] = []
        for fname in sorted(families):
            kind, values = families[fname]
            out.append(f"# HELP {fname} {HELP_TEXT}\n# TYPE {fname} {kind}\n")
            for key in sorted(values):
                value = values[key]
                if kind in ("counter", "gauge"):
                    out.append(f"{fname}{_labels_text(key)} {_number(value)}\n")
                    continue
                les, buckets, count, total = value
                if kind == "histogram":
                    running = 0
                    for le, n in zip([*les, math.inf], buckets, strict=True):
                        running += n
                        le_text = "+Inf" if le == math.inf else _number(le)
                        labels = _labels_text((*key, ("le", le_text)))
                        out.append(f"{fname}_bucket{labels} {running}\n")
                out.append(f"{fname}_sum{_labels_text(key)} {_number(total)}\n")
                out.append(f"{fname}_count{_labels_text(key)} {count}\n")
        return "".join(out).encode()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            path = target.split("?", 1)[0]
            if path != self.path:
                status, body, ctype = "404 Not Found", b"404 page not found\n", "text/plain"
            elif method not in ("GET", "HEAD"):
                status, body, ctype = "405 Method Not Allowed", b"", "text/plain"
            else:
                status, body, ctype = "200 OK", self.render(), CONTENT_TYPE
            writer.write(
                (
                    f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode()
                + (body if method != "HEAD" else b"")
            )
            await asyncio.wait_for(writer.drain(), 10.0)
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


# -- factory -------------------------------------------------------------------------------


def create_sink(
    settings: Settings,
    stats: StatsStore,
    *,
    worker_index: int | None = None,
    share_dir: str | None = None,
    stream: TextIO | None = None,
) -> Sink:
    """The sink the reference's runner would build from these settings (not started).

    `worker_index` and `share_dir` are given to every worker process when the daemon runs
    RATELIMITD_WORKERS > 1: the Prometheus sink then serves the sum over the workers.
    """
    cfg = settings.stats
    if not cfg.disable:
        enabled = [
            name
            for name, on in (
                ("USE_DOG_STATSD", cfg.use_dog_statsd),
                ("USE_STATSD", cfg.use_statsd),
                ("USE_PROMETHEUS", cfg.use_prometheus),
            )
            if on
        ]
        if len(enabled) > 1:
            raise SinkError(
                f"{', '.join(enabled)}: only one stats sink may be enabled (USE_STATSD "
                "defaults to true, so set USE_STATSD=false to use another sink)"
            )
    kind = cfg.sink
    interval = cfg.flush_interval
    if kind == "dogstatsd":
        return DogStatsdSink(
            stats,
            cfg.statsd_host,
            cfg.statsd_port,
            extra_tags=cfg.extra_tags,
            mogrifiers=cfg.dog_statsd_mogrifiers,
            flush_interval=interval,
        )
    if kind == "statsd":
        return StatsdSink(
            stats,
            cfg.statsd_host,
            cfg.statsd_port,
            extra_tags=cfg.extra_tags,
            flush_interval=interval,
        )
    if kind == "prometheus":
        share = None
        if share_dir is not None and worker_index is not None:
            share = WorkerShare(share_dir, worker_index)
        return PrometheusSink(
            stats,
            MetricMapper.from_settings(cfg),
            addr=cfg.prometheus_addr,
            path=cfg.prometheus_path,
            extra_tags=cfg.extra_tags,
            flush_interval=interval,
            share=share,
        )
    if kind == "stdout":
        return LoggingSink(stats, extra_tags=cfg.extra_tags, flush_interval=interval, stream=stream)
    return NullSink(stats, interval)
