"""The memcached text protocol: pipelined connections and the nodes that hold them.

A `Connection` writes the operations of one event-loop iteration in one write and resolves
replies in command order; one watchdog per connection enforces the operation timeout. A
`Node` is one server with a few such connections, dialled lazily with backoff.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
import time

from ..base import BackendError

_REDIAL_MIN = 0.05
_REDIAL_MAX = 1.0


def host_port(item: str) -> tuple[str, int]:
    host, sep, port = item.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise BackendError(f"invalid memcache address {item!r} (expected host:port)")
    return host.strip("[]"), int(port)


GET, LINES = 0, 1


class _Pending:
    """One pipelined operation: a multi-get or `count` single-line replies."""

    __slots__ = ("count", "deadline", "future", "kind", "lines", "values")

    def __init__(
        self, kind: int, count: int, future: asyncio.Future[object], deadline: float
    ) -> None:
        self.kind = kind
        self.count = count
        self.future = future
        self.deadline = deadline
        self.lines: list[bytes] = []
        self.values: dict[bytes, bytes] = {}


class MemcacheProtocolError(BackendError):
    """A reply the text protocol does not allow here; the connection is dropped."""


class Connection(asyncio.Protocol):
    """A pipelined memcached text-protocol connection: replies resolve in command order.

    The operations of one event-loop iteration go out in one write (`call_soon` flush),
    so concurrent requests share syscalls. One watchdog timer per connection, not one per
    operation, checks the oldest operation's deadline every timeout/4: a hung connection
    is detected between 1 and 1.25 timeouts after the operation was sent.
    """

    def __init__(self, label: str, timeout: float) -> None:
        self.label = label
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        self._pending: collections.deque[_Pending] = collections.deque()
        self._out: list[bytes] = []
        self._loop = asyncio.get_running_loop()
        self._watchdog: asyncio.TimerHandle | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(BackendError(f"memcache {self.label}: connection lost ({exc or 'closed'})"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        try:
            self._parse()
        except MemcacheProtocolError as exc:
            self._fail(exc)

    # Requests
    def request(self, payload: bytes, kind: int, count: int) -> asyncio.Future[object]:
        """Queue `payload` for this iteration's write; the future of its replies."""
        loop = self._loop
        fut: asyncio.Future[object] = loop.create_future()
        if self.closed or self.transport is None:
            fut.set_exception(BackendError(f"memcache {self.label}: connection closed"))
            return fut
        self._pending.append(_Pending(kind, count, fut, loop.time() + self.timeout))
        if not self._out:
            loop.call_soon(self._flush)
        self._out.append(payload)
        if self._watchdog is None:
            self._watchdog = loop.call_later(self.timeout / 4, self._watch)
        return fut

    def _flush(self) -> None:
        out = self._out
        self._out = []
        if out and not self.closed and self.transport is not None:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _watch(self) -> None:
        self._watchdog = None
        if not self._pending:
            return
        if self._pending[0].deadline <= self._loop.time():
            self._fail(BackendError(f"memcache {self.label}: timeout after {self.timeout}s"))
            return
        self._watchdog = self._loop.call_later(self.timeout / 4, self._watch)

    def close(self) -> None:
        """Close the connection; pending operations fail."""
        self._fail(BackendError(f"memcache {self.label}: connection closed"))

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        self._out = []
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self.transport is not None:
            self.transport.abort()
        while self._pending:
            p = self._pending.popleft()
            if not p.future.done():
                p.future.set_exception(exc)
                # Nobody may await it any more (an abandoned background op).
                p.future.exception()

    def _done(self, p: _Pending, result: object) -> None:
        self._pending.popleft()
        if not p.future.done():
            p.future.set_result(result)

    def _parse(self) -> None:
        buf = self._buf
        pos = 0
        try:
            while self._pending:
                p = self._pending[0]
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    return
                line = bytes(buf[pos:end])
                if p.kind == LINES:
                    pos = end + 2
                    p.lines.append(line)
                    if len(p.lines) == p.count:
                        self._done(p, p.lines)
                    continue
                if line == b"END":
                    pos = end + 2
                    self._done(p, p.values)
                    continue
                if not line.startswith(b"VALUE "):
                    # ERROR / CLIENT_ERROR / SERVER_ERROR: the stream may be out of step.
                    raise MemcacheProtocolError(
                        f"memcache {self.label}: get failed: {line.decode(errors='replace')}"
                    )
                parts = line.split()
                if len(parts) < 4 or not parts[3].isdigit():
                    raise MemcacheProtocolError(f"memcache {self.label}: bad VALUE line {line!r}")
                size = int(parts[3])
                if len(buf) < end + 2 + size + 2:
                    return  # the data block is not complete yet
                start = end + 2
                p.values[parts[1]] = bytes(buf[start : start + size])
                pos = start + size + 2
        finally:
            if pos:
                del buf[:pos]
        if buf and not self._pending:
            raise MemcacheProtocolError(
                f"memcache {self.label}: unexpected data {bytes(buf[:80])!r}"
            )


async def open_connection(
    host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float
) -> Connection:
    loop = asyncio.get_running_loop()
    label = f"{host}:{port}"
    async with asyncio.timeout(timeout):
        _, conn = await loop.create_connection(
            lambda: Connection(label, timeout),
            host,
            port,
            ssl=ssl_context,
            server_hostname=host if ssl_context is not None else None,
        )
    sock = conn.transport.get_extra_info("socket") if conn.transport else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


class Node:
    """One memcached server: a few pipelined connections, dialled lazily, with backoff."""

    def __init__(
        self,
        address: str,
        size: int,
        ssl_context: ssl.SSLContext | None,
        timeout: float,
    ) -> None:
        self.address = address
        self.host, self.port = host_port(address)
        # SRV targets end in a dot (as Go prints them, and they sort with it); /etc/hosts
        # and certificate names are matched without it.
        self.host = self.host.removesuffix(".")
        self.ssl_context = ssl_context
        self.timeout = timeout
        self._conns: list[Connection | None] = [None] * max(1, size)
        self._dialing: list[asyncio.Future[Connection] | None] = [None] * len(self._conns)
        self._next = 0
        self._down_until = 0.0
        self._backoff = _REDIAL_MIN
        self._closed = False

    def _slot(self) -> int:
        i = self._next
        self._next = (i + 1) % len(self._conns)
        return i

    async def connection(self) -> Connection:
        """A live connection (round-robin over the slots); BackendError when unreachable."""
        i = self._slot()
        conn = self._conns[i]
        if conn is not None and not conn.closed:
            return conn
        dialing = self._dialing[i]
        if dialing is None:
            if time.monotonic() < self._down_until:
                raise BackendError(f"memcache {self.address}: unreachable (backing off)")
            dialing = self._dialing[i] = asyncio.ensure_future(self._dial(i))
        return await asyncio.shield(dialing)

    async def _dial(self, i: int) -> Connection:
        try:
            conn = await open_connection(self.host, self.port, self.ssl_context, self.timeout)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            self._down_until = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, _REDIAL_MAX)
            raise BackendError(f"memcache {self.address}: {exc or type(exc).__name__}") from exc
        finally:
            self._dialing[i] = None
        if self._closed:
            # Dropped while dialling (SRV refresh, backend close): an unowned connection would
            # stay open, and uvloop's loop.close() waits for every open handle.
            conn.close()
            raise BackendError(f"memcache {self.address}: node closed")
        self._backoff = _REDIAL_MIN
        self._conns[i] = conn
        return conn

    async def warm(self) -> None:
        """Dial every connection slot now (startup), not on first use."""
        await asyncio.gather(*(self.connection() for _ in self._conns))

    async def request(self, payload: bytes, kind: int, count: int) -> object:
        """Send one pipelined operation and await its replies."""
        conn = await self.connection()
        return await conn.request(payload, kind, count)

    def close(self) -> None:
        """Close every connection (one still being dialled closes when it arrives)."""
        self._closed = True
        for i, conn in enumerate(self._conns):
            if conn is not None:
                conn.close()
                self._conns[i] = None
