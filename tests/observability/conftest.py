"""Fixtures for the sinks and tracing: real statsd (TCP/UDP) and OTLP/HTTP receivers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from support.otlp import OtlpReceiver, otlp_http_receiver

# The config the statsd/Prometheus tests decide against: a key-only rule (2/minute) and an
# exact-value rule (100/second) whose stats keys are `obs.user` and `obs.path_/a`.
CONFIG = """\
domain: obs
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: path
    value: /a
    rate_limit:
      unit: second
      requests_per_unit: 100
    descriptors:
      - key: method
        value: GET
        rate_limit:
          unit: second
          requests_per_unit: 100
"""


@contextlib.asynccontextmanager
async def running(sink: Any) -> AsyncIterator[Any]:
    """A stats sink started for the block and stopped after it (its final flush)."""
    await sink.start()
    try:
        yield sink
    finally:
        await sink.stop()


class LineReceiver:
    """statsd lines received by a listener, in arrival order."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.port = 0
        self.connections = 0

    def feed(self, data: bytes) -> None:
        self.lines.extend(line for line in data.decode().split("\n") if line)

    def named(self, prefix: str) -> list[str]:
        """Lines whose name starts with `prefix`."""
        return [line for line in self.lines if line.startswith(prefix)]


class TcpListener:
    """A statsd TCP server feeding a LineReceiver; `close()` also closes its connections."""

    def __init__(self, received: LineReceiver) -> None:
        self.received = received
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self, port: int = 0) -> int:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", port)
        self.received.port = self.server.sockets[0].getsockname()[1]
        return self.received.port

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.received.connections += 1
        self.writers.append(writer)
        pending = bytearray()
        while data := await reader.read(65536):
            pending.extend(data)
            cut = pending.rfind(b"\n") + 1
            if cut:
                self.received.feed(bytes(pending[:cut]))
                del pending[:cut]
        writer.close()

    def drop_connections(self) -> None:
        """Close every accepted connection (the server goes away for its clients)."""
        for writer in self.writers:
            writer.close()

    async def close(self) -> None:
        self.drop_connections()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for writer in self.writers:
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@pytest.fixture
async def tcp_statsd() -> AsyncIterator[LineReceiver]:
    """A statsd TCP listener on a free port."""
    received = LineReceiver()
    listener = TcpListener(received)
    await listener.start()
    received.listener = listener  # type: ignore[attr-defined]
    yield received
    await listener.close()


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, received: LineReceiver) -> None:
        self.received = received
        self.packets: list[bytes] = []

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.packets.append(data)
        self.received.feed(data)


@pytest.fixture
async def udp_statsd() -> AsyncIterator[LineReceiver]:
    """A DogStatsD UDP listener on a free port."""
    received = LineReceiver()
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(
        lambda: _Datagrams(received), local_addr=("127.0.0.1", 0)
    )
    received.port = transport.get_extra_info("sockname")[1]
    received.packets = protocol.packets  # type: ignore[attr-defined]
    yield received
    transport.close()


@pytest.fixture
def otlp_http() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP trace receiver (protobuf payloads) on a free port."""
    with otlp_http_receiver() as receiver:
        yield receiver
