"""The reference's DogStatsD sink (USE_DOG_STATSD): `name:value|c|#k:v,...` over UDP.

EXTRA_TAGS become real tags, and the DOG_STATSD_MOGRIFIER_* rules rewrite names into tags.
Datagrams are never waited for: a send that fails is dropped (statsd over UDP is lossy).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..settings import DogStatsdMogrifier
from .base import PeriodicSink, expand, number, tag_pairs
from .store import StatsStore

log = logging.getLogger("ratelimitd.stats")

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


class DogStatsdSink(PeriodicSink):
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
            tags = [f"{k}:{expand(v, groups)}" for k, v in m.tags]
            return expand(m.name, groups), self.tags + tags
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
        return f"{head}:{number(value)}|c{tags}\n"

    def gauge_line(self, name: str, value: float) -> str:
        head, tags = self._head(name)
        return f"{head}:{number(value)}|g{tags}\n"

    def timer_line(self, name: str, ms: float, rate: float) -> str:
        head, tags = self._head(name)
        sampled = f"|@{rate:.6g}" if rate < 1.0 else ""
        return f"{head}:{number(round(ms, 6))}|ms{sampled}{tags}\n"

    def emit(self, lines: list[str]) -> None:
        self.writer.send_lines(lines)
