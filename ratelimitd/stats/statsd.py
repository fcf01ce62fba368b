"""gostats' statsd sink (USE_STATSD): `name:delta|c`, `name:value|g`, `name:ms|ms` lines.

EXTRA_TAGS are serialized into the name as `<name>.__k=v.__k2=v2`. Network writes never
block the loop: lines go into a bounded buffer drained by a background task that
reconnects with backoff, and what does not fit is dropped and counted. With
STATSD_PROTOCOL=udp (gostats' own variable) the lines go out as datagrams of at most 1,432
bytes, gostats' UDP buffer size (no IP fragmentation on a 1500-byte MTU).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from ..runtime.aio import cancel
from .base import PeriodicSink, number, statsd_tag_suffix, tag_pairs, timer_value
from .store import StatsStore

log = logging.getLogger("ratelimitd.stats")

# gostats' net sink: 3 s between reconnects, 1.5 s dial timeout, 1 s write timeout, about
# 4 MiB of stats buffered before dropping.
RECONNECT_MIN_SECONDS = 0.1
RECONNECT_MAX_SECONDS = 3.0
DIAL_TIMEOUT_SECONDS = 1.5
WRITE_TIMEOUT_SECONDS = 1.0
MAX_BUFFERED_BYTES = 1 << 22


# datadog-go's default UDP payload (no IP fragmentation on a 1500-byte MTU).
UDP_PAYLOAD_BYTES = 1432


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
            log.warning("statsd address %s:%s: %s", self.host, self.port, err)
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
        await cancel(self._task)
        self._task = None


class StatsdSink(PeriodicSink):
    """gostats' statsd sink: `name:delta|c`, `name:value|g`, `name:ms|ms` lines, TCP or UDP."""

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
        protocol: str = "tcp",
    ) -> None:
        super().__init__(stats, flush_interval)
        self.extra_tags = tag_pairs(extra_tags)  # EXTRA_TAGS, cleaned as gostats cleans them
        self.suffix = statsd_tag_suffix(self.extra_tags)
        self.writer = TcpWriter(host, port, max_buffered)
        self.udp = UdpWriter(host, port) if protocol == "udp" else None

    async def start(self) -> None:
        if self.udp is not None:
            await self.udp.open()
        else:
            self.writer.start()
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self.udp is not None:
            self.udp.close()
            return
        await self.writer.flush()
        await self.writer.close()

    async def flush(self) -> None:
        if self.udp is not None:
            await self.udp.open()  # an address that did not resolve at start is retried
        await super().flush()

    def counter_line(self, name: str, value: float) -> str:
        return f"{name}{self.suffix}:{number(value)}|c\n"

    def gauge_line(self, name: str, value: float) -> str:
        return f"{name}{self.suffix}:{number(value)}|g\n"

    def timer_line(self, name: str, ms: float, rate: float) -> str:
        if rate < 1.0:
            return f"{name}{self.suffix}:{timer_value(ms)}|ms|@{rate:.6g}\n"
        return f"{name}{self.suffix}:{timer_value(ms)}|ms\n"

    def emit(self, lines: list[str]) -> None:
        if self.udp is not None:
            self.udp.send_lines(lines)  # a datagram per 1,432 bytes of whole lines
            return
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
