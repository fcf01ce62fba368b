"""A small HTTP/1.1 server (asyncio.Protocol + httptools) for the `/json` and debug listeners
(their routes: `routes.py`, `debug.py`).

Why not a framework: `/json` must answer at least twice as many decisions per second as
gRPC from the same event loop, so the request path is one parser callback chain, one task
per request batch and one `transport.write` per response, with the status line and
headers pre-built.

Semantics: keep-alive by default on HTTP/1.1 (`Connection: close` honoured), HTTP/1.0
closes unless it asks for keep-alive; pipelined requests are answered in order and a
connection's requests are handled one after another; bodies by Content-Length or chunked,
capped (413, then the connection closes); a request head over 1 MiB gets 431; unknown
paths 404; a malformed request 400 and close; a handler that raises gives 500 (logged)
and the server carries on. Unlike the reference's `http.Server` (no timeouts, no cap):

- a request must arrive whole within `read_timeout` of its first byte or of the connection
  (a slowloris client is closed), and a keep-alive connection idle for `idle_timeout` is
  closed;
- answers that cannot be written for `write_timeout` (the client does not read them) close
  the connection, and at most MAX_PIPELINE requests, or `max_body` bytes of them, wait on a
  connection before it stops being read: a client that pipelined 1 MiB requests and never
  read once kept 64 of them;
- what a connection holds past the read that brought it (a request not read whole, the
  bodies of requests queued or being answered) is charged to the process's `ClientBuffers`
  (503 and close when it does not fit);
- past `max_connections` (or the process's ConnectionBudget), the longest-idle connection
  with no request in progress is closed to let the new one in (`limits.Eviction`), so that
  idle clients cannot keep health probes out; only when none is idle is the new one closed.

A handler is `async def handler(request: HttpRequest) -> (status, headers, body)`, where
`headers` is a tuple of `(name, value)` pairs; return a module-level constant tuple when
you can, its bytes are then formatted once. A large answer (`/stats`, `/metrics`) gives an
async iterator of byte chunks as its body: it is sent chunked (HTTP/1.0: delimited by the
close), and the next chunk is made only once the client has read the one before down to
the high-water mark, within `write_timeout` as any answer, so a client that does not read
holds at most the high-water mark and one chunk, not the whole answer (an unread 244 MB
/stats once stayed in the transport's buffer). A body that holds what it will send (a
rendered exposition) says how much in `held_bytes`: that is charged to the process's room
for such answers (`ConnectionBudget.answers`, apart from the requests' buffers) while it is
sent, and when it does not fit the answer is 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httptools

from .limits import NEVER_USED, USED, ConnectionBudget, IdleKey, Listener

__all__ = [
    "ERROR_HEADERS",
    "JSON",
    "MAX_BODY",
    "TEXT_PLAIN",
    "Handler",
    "Headers",
    "HttpRequest",
    "HttpServer",
    "Reply",
    "start_http_server",
]

logger = logging.getLogger(__name__)

Headers = tuple[tuple[str, str], ...]
# The body: bytes, or byte chunks sent as they are read (module docstring).
Body = bytes | AsyncIterator[bytes]
Reply = tuple[int, Headers, Body]


@dataclass(slots=True, eq=False)
class HttpRequest:
    """One parsed request, as a handler sees it."""

    method: bytes
    path: bytes
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    keep_alive: bool
    http11: bool
    connection: _HttpProtocol

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (`name` in lower case), or None."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def peer(self) -> str:
        """The client's address (`host:port`, a unix socket's path, or "")."""
        transport = self.connection._transport  # the protocol is this module's own
        peer = transport.get_extra_info("peername") if transport is not None else None
        if isinstance(peer, tuple):
            return f"{peer[0]}:{peer[1]}"
        return str(peer or "")

    @property
    def disconnected(self) -> asyncio.Future[None]:
        """Done once the client's connection is gone (for long handlers)."""
        return self.connection.closed


Handler = Callable[[HttpRequest], Awaitable[Reply]]

MAX_BODY = 1 << 20
# Request line + headers, as Go's http.DefaultMaxHeaderBytes.
MAX_HEAD = 1 << 20
# Pipelined requests queued on one connection before it stops reading (and their bodies:
# at most `max_body` bytes of them).
MAX_PIPELINE = 16

TEXT_PLAIN: Headers = (("Content-Type", "text/plain; charset=utf-8"),)
JSON: Headers = (("Content-Type", "application/json"),)
# What Go's http.Error sends.
ERROR_HEADERS: Headers = (*TEXT_PLAIN, ("X-Content-Type-Options", "nosniff"))

NOT_FOUND: Reply = (404, ERROR_HEADERS, b"404 page not found\n")
BAD_REQUEST: Reply = (400, ERROR_HEADERS, b"Bad Request\n")
OVERLOADED: Reply = (503, (*ERROR_HEADERS, ("Retry-After", "1")), b"Service Unavailable\n")
INTERNAL_ERROR: Reply = (500, ERROR_HEADERS, b"Internal Server Error\n")
TOO_LARGE: Reply = (413, ERROR_HEADERS, b"Request Entity Too Large\n")
HEAD_TOO_LARGE: Reply = (431, ERROR_HEADERS, b"431 Request Header Fields Too Large\n")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"Connection: close\r\n\r\n"
_KEEP_ALIVE_10 = b"Connection: keep-alive\r\n\r\n"
_CHUNKED = b"Transfer-Encoding: chunked\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_HEAD_CACHE_MAX = 256
# How long a refused client may keep sending before the connection is closed regardless.
LINGER_SECONDS = 2.0


class _TooLarge(Exception):
    """Raised from a parser callback to stop reading an oversized body."""


class _HttpProtocol(asyncio.Protocol):
    """One connection: parse, queue, handle in order, write."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._routes = server.routes
        self._fallback = server.fallback
        self._max_body = server.max_body
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._body_size = 0
        # Reading a request head, and its bytes so far (counted per chunk read).
        self._in_head = True
        self._head_size = 0
        self._queue: deque[HttpRequest | Reply] = deque()
        self._queued_bytes = 0
        self._worker: asyncio.Task[None] | None = None
        # A request is being read (its first byte seen, not yet whole); the length its
        # Content-Length announced; what it is charged in the server's ClientBuffers.
        self._in_request = False
        self._announced = 0
        self._charged = 0
        self._buffers = server.budget.buffers
        self._answers = server.budget.answers
        # Requests answered, and loop.time() since the connection has been idle.
        self._served = 0
        self._idle_since = server.loop.time()
        # No further requests are read; close once the queue is answered.
        self._closing = False
        self._read_paused = False
        self._write_waiter: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[None] = server.loop.create_future()
        # loop.time() past which the server's sweep closes this connection: a request not
        # read whole in time, or a keep-alive connection idle too long (None: a request is
        # being handled, no deadline).
        self.deadline: float | None = server.loop.time() + server.read_timeout
        self._admitted = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Both asyncio and uvloop set TCP_NODELAY on accepted sockets already.
        self._transport = transport  # type: ignore[assignment]
        server = self._server
        if not server.admit():
            self._closing = True
            transport.abort()  # type: ignore[attr-defined]
            return
        self._admitted = True
        server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()
        self._closing = True
        self._queue.clear()
        # The parser calls back into this protocol: a reference cycle that would keep the
        # connection and its last request (up to 2 MiB) until the next cyclic collection,
        # which the daemon makes rare (gc.freeze, high thresholds). No data comes now.
        self._parser = None  # type: ignore[assignment]
        self._body = []
        if self._charged:
            self._buffers.give(self._charged)
            self._charged = 0
        if not self.closed.done():
            self.closed.set_result(None)
        waiter = self._write_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._in_head:
            # httptools buffers a partial header itself, so bound the head here.
            self._head_size += len(data)
            if self._head_size > MAX_HEAD:
                self._fail(HEAD_TOO_LARGE)
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _TooLarge):
                self._fail(TOO_LARGE)
            else:  # pragma: no cover - our callbacks raise nothing else
                logger.exception("HTTP parser callback failed")
                self._fail(INTERNAL_ERROR)
        except httptools.HttpParserUpgrade:
            # We speak no other protocol: answer the request that asked, then close.
            self.shutdown()
        except httptools.HttpParserError:
            self._fail(BAD_REQUEST)
        if self._in_request or self._charged or self._queued_bytes:
            self._charge()

    def _charge(self) -> None:
        """Charge the process's buffers for what this connection holds once a read is
        processed: the request left incomplete (its head so far, its announced or read
        body) and the bodies of the requests queued or being answered. One that does not
        fit is answered 503 (after the ones before it) and the connection closed."""
        need = self._queued_bytes
        if self._in_request and not self._closing:
            need += self._head_size + max(self._announced, self._body_size)
        delta = need - self._charged
        if delta > 0 and not self._buffers.take(delta):
            self._fail(OVERLOADED)
            return
        self._charged += delta
        if delta < 0:
            self._buffers.give(-delta)

    def eof_received(self) -> bool | None:
        # A half-closed client still gets the answers to what it sent.
        self._closing = True
        if self._worker is None:
            return None
        return True

    def pause_writing(self) -> None:
        if self._write_waiter is None:
            self._write_waiter = self._server.loop.create_future()

    def resume_writing(self) -> None:
        waiter = self._write_waiter
        self._write_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.deadline is None or self._worker is None:
            self.deadline = self._server.loop.time() + self._server.read_timeout
        self._in_request = True
        self._announced = 0
        self._url = b""
        self._headers = []
        self._body = []
        self._body_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        expect = False
        for name, value in self._headers:
            lname = name.lower()
            if lname == b"content-length":
                try:
                    self._announced = int(value)
                except ValueError:
                    self._announced = 0  # the parser rejects it
                if self._announced > self._max_body:
                    raise _TooLarge
            elif lname == b"expect" and value.lower() == b"100-continue":
                expect = True
        if expect and self._worker is None and not self._queue:
            self._transport.write(_CONTINUE)  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._max_body:
            raise _TooLarge
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_head = True
        self._in_request = False
        self._head_size = 0
        self.deadline = None  # read whole: no deadline while it is handled
        if self._closing:
            return
        parser = self._parser
        url = self._url
        if url[:1] != b"/":  # absolute-form target (`GET http://host/json`)
            with contextlib.suppress(httptools.HttpParserInvalidURLError):
                url = httptools.parse_url(url).path or b"/"
        path, _, query = url.partition(b"?")
        body = self._body
        keep_alive = parser.should_keep_alive()
        request = HttpRequest(
            parser.get_method(),
            path,
            query,
            self._headers,
            body[0] if len(body) == 1 else b"".join(body),
            keep_alive,
            parser.get_http_version() == "1.1",
            self,
        )
        # The request owns them now: an idle keep-alive connection keeps no body.
        self._body = []
        self._headers = []
        if not keep_alive:
            self._closing = True
        self._enqueue(request)

    # handling

    def _enqueue(self, item: HttpRequest | Reply) -> None:
        self._queue.append(item)
        if type(item) is HttpRequest:
            self._queued_bytes += len(item.body)
        if self._worker is None:
            self._worker = self._server.loop.create_task(self._run())
        elif (
            len(self._queue) >= MAX_PIPELINE or self._queued_bytes >= self._max_body
        ) and not self._read_paused:
            self._read_paused = True
            self._transport.pause_reading()  # type: ignore[union-attr]

    def _fail(self, reply: Reply) -> None:
        """Answer a request we could not read, after the ones before it, then close."""
        self._closing = True
        self._enqueue(reply)

    async def _run(self) -> None:
        queue = self._queue
        transport = self._transport
        assert transport is not None
        server = self._server
        try:
            while queue:
                item = queue.popleft()
                if type(item) is tuple:
                    status, headers, body = item
                    tail = _CLOSE
                    head_only = False
                else:
                    request: HttpRequest = item  # type: ignore[assignment]
                    handler = self._routes.get(request.path, self._fallback)
                    if handler is None:
                        status, headers, body = NOT_FOUND
                    else:
                        try:
                            status, headers, body = await handler(request)
                            if type(body) is not bytes and not isinstance(body, AsyncIterator):
                                raise TypeError(f"reply body is {type(body).__name__}")
                        except Exception:
                            logger.exception("HTTP handler for %r failed", request.path)
                            status, headers, body = INTERNAL_ERROR
                    self._queued_bytes -= len(request.body)
                    if self._charged:
                        self._charge()
                    if not request.keep_alive or (self._closing and not queue):
                        tail = _CLOSE
                    else:
                        tail = b"\r\n" if request.http11 else _KEEP_ALIVE_10
                    head_only = request.method == b"HEAD"
                    if (
                        self._read_paused
                        and len(queue) < MAX_PIPELINE // 2
                        and self._queued_bytes < self._max_body // 2
                    ):
                        self._read_paused = False
                        transport.resume_reading()
                if transport.is_closing():
                    await _close(body)
                    return
                held = 0 if isinstance(body, bytes) else getattr(body, "held_bytes", 0)
                if held and not self._answers.take(held):
                    # What it holds until it is read does not fit in the process's room for
                    # such answers (apart from the requests' buffers: see ConnectionBudget).
                    await _close(body)
                    status, headers, body = OVERLOADED
                    tail = _CLOSE
                head = server.head(status, headers)
                if isinstance(body, bytes):
                    length = b"Content-Length: %d\r\n" % len(body)
                    transport.write(head + length + tail + (b"" if head_only else body))
                else:
                    http11 = request.http11
                    if not http11:
                        tail = _CLOSE  # no chunked coding in HTTP/1.0: the close ends it
                    try:
                        sent = await self._stream(transport, head, tail, body, head_only, http11)
                    finally:
                        if held:
                            self._answers.give(held)
                    if not sent:
                        return
                if tail is _CLOSE:
                    self._closing = True
                    queue.clear()
                    if type(item) is tuple and transport.can_write_eof():
                        self._linger(transport)
                    else:
                        transport.close()
                    return
                self._served += 1
                await self._written()
            if self._closing and not transport.is_closing():
                transport.close()
            elif self.deadline is None:  # answered everything: idle until the next request
                self.deadline = server.loop.time() + server.idle_timeout
                self._idle_since = server.loop.time()
        finally:
            self._worker = None

    async def _written(self) -> None:
        """Wait until the transport is below its high-water mark again."""
        if self._write_waiter is not None:
            # The client does not read: closed by the sweep after write_timeout.
            server = self._server
            self.deadline = server.loop.time() + server.write_timeout
            await self._write_waiter
            self.deadline = None

    async def _stream(
        self,
        transport: asyncio.Transport,
        head: bytes,
        tail: bytes,
        body: AsyncIterator[bytes],
        head_only: bool,
        chunked: bool,
    ) -> bool:
        """Send a chunked answer, a chunk once the one before is read (module docstring);
        False when the connection is gone (or aborted: the answer failed half-way)."""
        transport.write(head + (_CHUNKED if chunked else b"") + tail)
        try:
            if head_only:
                return True
            async for chunk in body:
                if not chunk:
                    continue  # an empty chunk would end the answer
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                await self._written()
                if transport.is_closing():
                    return False
            if chunked:
                transport.write(_LAST_CHUNK)
            return True
        except Exception:
            # The head is sent: the client learns of it from the missing last chunk.
            logger.exception("HTTP answer streamed for %r failed", head.split(b"\r\n", 1)[0])
            transport.abort()
            return False
        finally:
            await _close(body)

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after a refused request without losing the reply.

        The client may still be sending what we refused; closing with unread input would
        reset the connection and could discard our reply before the client reads it. So
        send FIN, discard input until the client closes too, and close anyway after a while.
        """
        transport.write_eof()
        self._server.loop.call_later(LINGER_SECONDS, transport.close)

    def _gone(self) -> None:
        """Give back the connection's slot (once)."""
        if self._admitted:
            self._admitted = False
            self._server.connections.discard(self)
            self._server.release()

    def idle_key(self) -> IdleKey | None:
        """None while a request is read, queued or handled; the connections that never sent
        a whole request come first, then the longest idle (`limits.Eviction`)."""
        if self._worker is not None or self._queue or self._in_request:
            return None
        used = USED if self._served and not self._closing else NEVER_USED
        return used, self._idle_since

    def evict(self) -> None:
        """Close now to make room for a new connection."""
        self._gone()
        self.abort()

    def shutdown(self) -> None:
        """Read no more requests; close once the queued ones are answered."""
        self._closing = True
        if self._worker is None and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Drop the connection now."""
        if self._transport is not None:
            self._transport.abort()


async def _close(body: Body) -> None:
    """Let a streamed body's generator free what it holds (a snapshot) at once."""
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()


class HttpServer(Listener["_HttpProtocol"]):
    """An HTTP/1.1 server over a route table (exact paths)."""

    def __init__(
        self,
        routes: Mapping[str, Handler],
        *,
        fallback: Handler | None = None,
        max_body: int = MAX_BODY,
        name: str = "HTTP",
        max_connections: int = 4096,
        read_timeout: float = 10.0,
        idle_timeout: float = 120.0,
        write_timeout: float = 10.0,
        budget: ConnectionBudget | None = None,
    ) -> None:
        super().__init__(
            name,
            max_connections=max_connections,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            budget=budget,
        )
        self.routes: dict[bytes, Handler] = {p.encode(): h for p, h in routes.items()}
        self.fallback = fallback
        self.max_body = max_body
        self.idle_timeout = idle_timeout
        self.port = 0
        self._heads: dict[tuple[int, Headers], bytes] = {}
        self._server: asyncio.Server | None = None

    def head(self, status: int, headers: Headers) -> bytes:
        """Status line and headers (without Content-Length), cached per constant reply."""
        key = (status, headers)
        head = self._heads.get(key)
        if head is None:
            try:
                reason = HTTPStatus(status).phrase
            except ValueError:
                reason = "Unknown"
            lines = [f"HTTP/1.1 {status} {reason}\r\n"]
            lines += [f"{name}: {value}\r\n" for name, value in headers]
            head = "".join(lines).encode("latin-1")
            if len(self._heads) < _HEAD_CACHE_MAX:
                self._heads[key] = head
        return head

    def sweep(self) -> None:
        """Close the connections past their deadline; runs every second while listening."""
        now = self.loop.time()
        for conn in [c for c in self.connections if c.deadline is not None and c.deadline < now]:
            conn.abort()

    async def start(
        self,
        host: str | None = None,
        port: int = 0,
        *,
        reuse_port: bool = False,
        sock: socket.socket | None = None,
        ssl: Any = None,
        backlog: int = 1024,
    ) -> int:
        """Listen (on host:port, or on an already bound `sock`); returns the bound port."""
        self.loop = asyncio.get_running_loop()
        factory = lambda: _HttpProtocol(self)  # noqa: E731
        if sock is not None:
            self._server = await self.loop.create_server(
                factory, sock=sock, ssl=ssl, backlog=backlog
            )
        else:
            self._server = await self.loop.create_server(
                factory, host, port, reuse_port=reuse_port or None, ssl=ssl, backlog=backlog
            )
        self.port = self._server.sockets[0].getsockname()[1]
        self.start_sweeping()
        return self.port

    async def close(self, grace: float = 10.0) -> None:
        """Stop accepting, let queued requests finish (up to `grace` s), close connections."""
        if self._server is None:
            return  # never started
        self.stop_sweeping()
        self._server.close()
        for conn in list(self.connections):
            conn.shutdown()
        await self.drain(grace)
        await self._server.wait_closed()


async def start_http_server(
    routes: Mapping[str, Handler],
    host: str | None = None,
    port: int = 0,
    *,
    fallback: Handler | None = None,
    max_body: int = MAX_BODY,
    reuse_port: bool = False,
    sock: socket.socket | None = None,
    ssl: Any = None,
) -> HttpServer:
    """Start an HttpServer on the running loop; its bound port is `.port`."""
    server = HttpServer(routes, fallback=fallback, max_body=max_body)
    await server.start(host, port, reuse_port=reuse_port, sock=sock, ssl=ssl)
    return server
