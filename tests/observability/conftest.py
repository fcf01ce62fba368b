"""Fixtures for the sinks and tracing: real statsd (TCP/UDP) and OTLP/HTTP receivers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

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


class OtlpReceiver:
    """Spans posted to an OTLP/HTTP endpoint, decoded from ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self.url = ""

    def spans(self) -> list[tuple[Any, Any]]:
        """(resource, span) for every span received so far."""
        out: list[tuple[Any, Any]] = []
        with self.lock:
            for req in self.requests:
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        out.extend((rs.resource, span) for span in ss.spans)
        return out


@pytest.fixture
def otlp_http() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP trace receiver (protobuf payloads) on a free port."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            with receiver.lock:
                receiver.requests.append(request)
                receiver.paths.append(self.path)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    yield receiver
    server.shutdown()
    server.server_close()
    thread.join()
