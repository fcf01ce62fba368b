"""The client side of the HTTP transport tests (tests/daemon/test_http*.py): the rules they
decide on, a minimal HTTP/1.1 client over raw asyncio streams (so keep-alive, pipelining and
chunked bodies are under the test's control), the main and debug servers over one harness,
and a stand-in service. The fixtures that start servers (`make_servers`, `srv`) are in
tests/daemon/conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from ratelimitd.health import Health
from ratelimitd.messages import Refusal, Response
from ratelimitd.service import RateLimitService, Snapshot
from ratelimitd.settings import ReloadOptions
from ratelimitd.stats import StatsStore
from ratelimitd.transport.http import HttpServer

from .attacks import unread_pages
from .core import suite_config
from .ready import wait_until

# Harness clock: 1_000_000 s, so a MINUTE window resets in 20 s and a SECOND one in 1 s.
CONFIG = suite_config("http_transport")

ONE_K = b'{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}'


class Reply:
    """A parsed HTTP response."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


async def read_reply(reader: asyncio.StreamReader, *, head: bool = False) -> Reply:
    """One response from the stream: a Content-Length body, or a chunked one (a large
    answer: /stats, /metrics)."""
    status_line = await reader.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked" and not head:
        return Reply(status, headers, await read_chunks(reader))
    length = 0 if head else int(headers["content-length"])
    body = await reader.readexactly(length)
    return Reply(status, headers, body)


async def read_chunks(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, up to its last chunk."""
    parts = []
    while size := int((await reader.readline()).split(b";")[0], 16):
        parts.append(await reader.readexactly(size))
        assert await reader.readexactly(2) == b"\r\n"
    assert await reader.readline() == b"\r\n"  # no trailers
    return b"".join(parts)


def request_bytes(
    path: str,
    body: bytes | None = None,
    *,
    method: str = "POST",
    version: str = "1.1",
    headers: tuple[str, ...] = (),
) -> bytes:
    """A request with a Content-Length body (or none)."""
    lines = [f"{method} {path} HTTP/{version}", "Host: test", *headers]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


class Conn:
    """One client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def call(self, path: str, body: bytes | None = None, **kwargs: Any) -> Reply:
        await self.send(request_bytes(path, body, **kwargs))
        return await read_reply(self.reader, head=kwargs.get("method") == "HEAD")

    async def at_eof(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 5) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):  # the server may have closed first
            await self.writer.wait_closed()


class Servers:
    """The main and debug servers over one harness."""

    def __init__(self, h: Any, health: Health, main: HttpServer, debug: HttpServer) -> None:
        self.h = h
        self.health = health
        self.main = main
        self.debug = debug
        self._conns: list[Conn] = []

    async def conn(self, debug: bool = False) -> Conn:
        c = await Conn.open(self.debug.port if debug else self.main.port)
        self._conns.append(c)
        return c

    async def call(self, path: str, body: bytes | None = None, **kwargs: Any) -> Reply:
        c = await self.conn()
        return await c.call(path, body, **kwargs)

    async def debug_call(self, path: str) -> Reply:
        c = await self.conn(debug=True)
        return await c.call(path, method="GET")

    async def close(self) -> None:
        for c in self._conns:
            await c.close()
        await self.main.close(grace=1)
        await self.debug.close(grace=1)


class StubService:
    """A stand-in service whose decision the test chooses: `outcome`, or the answer the
    service's own `answer` gives to it when it is an error."""

    def __init__(self, outcome: Response | Exception) -> None:
        self.outcome = outcome
        self.ruleset = None
        self.snapshot = Snapshot(None, ReloadOptions())  # the request bounds /json applies
        self.stats = StatsStore()

    async def _decided(self) -> Response | Refusal:
        if isinstance(self.outcome, Exception):
            return self.answer(self.outcome)
        return self.outcome

    def decide(self, request: Any, waiter: Any = None) -> Any:
        return self._decided()

    def answer(self, error: Exception, *args: Any, **kwargs: Any) -> Response | Refusal:
        # The service's one place where failures become answers, as it answers a failure
        # out of no plan (the stand-in has none).
        return RateLimitService.answer(self, error)  # type: ignore[arg-type]


def paused(server: HttpServer) -> Any:
    """A connection of `server` whose writing is paused (its client does not read), or None."""
    return next((c for c in server.connections if c._write_waiter is not None), None)


async def unread_answer(server: HttpServer, path: str) -> int:
    """Ask `server` for `path` on a connection that never reads (attacks.unread_pages): the
    bytes the server holds for it once its writing is paused. Returns once the server has
    closed it (its write timeout)."""
    client = await asyncio.to_thread(unread_pages, server.port, path, 1)
    try:
        await wait_until(lambda: paused(server), what="writing paused")
        conn = paused(server)
        held: int = conn._transport.get_write_buffer_size()
        await wait_until(lambda: conn not in server.connections, what="closed after write_timeout")
        return held
    finally:
        client.close()
