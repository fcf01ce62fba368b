"""gRPC over HTTP/2 on uvloop: the asyncio Protocol and server around the `_h2` core.

The core (`ratelimitd.transport._h2`, libnghttp2) parses and frames; this module owns the sockets:
one `H2Protocol` per connection feeds it what was read and writes what it returns, once per
`data_received` and, for replies finished later (a Redis round trip), once per event-loop
iteration per connection. It also owns what needs a clock or a socket option: deadlines
(grpc-timeout), max connection age with its grace, graceful GOAWAY on shutdown, TLS with
ALPN `h2` and the client SAN check at the handshake, unix sockets and SO_REUSEPORT (for
workers sharing a port).

What a client may hold, and for how long:

- a connection is counted from the moment it is accepted, its TLS handshake included, and
  must finish the handshake and send the HTTP/2 preface within `connection_timeout`, as
  grpc-go's ConnectionTimeout; a full listener closes its idlest connection to let a new one
  in (`limits.Eviction`);
- a request whose body is not complete `read_timeout` after its HEADERS is answered
  DEADLINE_EXCEEDED; incomplete requests, requests waiting for an asynchronous decision
  and replies held back by the peer are charged to the process's `ClientBuffers`;
- an answered call drops its request and its deadline at once (calls answered with a
  grpc-timeout of 99999999H once stayed in memory for their whole timeout);
- a reply the peer does not let out (a flow-control window left at zero, a socket not read)
  is reset after `write_timeout`, and a connection whose socket stays unwritable that long
  is closed; nghttp2 closes a connection that queues more than 1000 PING/SETTINGS
  acknowledgements, so neither replies nor acks pile up;
- a connection streaming frames that do no work, or more header blocks than can be decoded
  in time, gets GOAWAY ENHANCE_YOUR_CALM from the core and is closed (docs/flood-protection.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import random
import ssl
import stat
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..grpcstatus import DEADLINE_EXCEEDED, INTERNAL
from ._h2 import Connection, Stream  # type: ignore[import-not-found]
from .limits import NEVER_USED, USED, ConnectionBudget, IdleKey, Listener

log = logging.getLogger("ratelimitd.transport.h2")

# How long the graceful GOAWAY waits for the peer's PING acknowledgement before the final one.
GOAWAY_PING_TIMEOUT = 1.0
# How long a connection that got its final GOAWAY may keep sending before it is closed anyway.
LINGER_SECONDS = 2.0
# What a closed connection is taken to free (nghttp2's session, the protocol, the transport's
# buffers), for the allocator's trimmer.
CONNECTION_BYTES = 64 * 1024
# The deadline heap is compacted when more than this many of its entries (and more than
# half) belong to calls already answered.
_DEAD_DEADLINES = 64

Dispatch = Callable[[Stream, "H2Protocol"], None]


class H2Protocol(asyncio.Protocol):
    """One HTTP/2 connection."""

    # Slots: the compiled routes read `conn` at its offset per call (`_rls`).
    __slots__ = (
        "_admitted",
        "_dispatch",
        "_early",
        "_flush_handle",
        "_handshake",
        "_lingering",
        "_receiving",
        "_timers",
        "accepted",
        "conn",
        "paused_since",
        "server",
        "transport",
    )

    def __init__(self, server: H2Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.conn: Any = None
        self._dispatch = server.dispatch
        self._receiving = False
        self._flush_handle: asyncio.Handle | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._lingering = False
        self._admitted = False
        # time.monotonic() when accepted, and since when the socket is unwritable (0: it is).
        self.accepted = 0.0
        self.paused_since = 0.0
        self._handshake: asyncio.Task[None] | None = None
        self._early: list[bytes] = []

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.accepted = time.monotonic()
        server = self.server
        # Counted from the accept, TLS handshake included: 24,000 handshakes never finished
        # once used every descriptor while the gRPC cap saw none of them.
        if not server.admit():
            transport.abort()  # type: ignore[attr-defined]
            return
        self._admitted = True
        server.connections.add(self)
        if server.ssl_context is not None:
            self._handshake = server.loop.create_task(self._start_tls(transport))
        else:
            self._start()

    async def _start_tls(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        # The loop starts reading right after connection_made, so the ClientHello may reach
        # this protocol before start_tls hands the socket to its TLS protocol: give it what
        # came early, through the BufferedProtocol interface, once it is in place.
        server.loop.call_soon(self._replay_early, transport)
        try:
            tls = await server.loop.start_tls(
                transport,  # type: ignore[arg-type]
                self,
                server.ssl_context,  # type: ignore[arg-type]
                server_side=True,
                ssl_handshake_timeout=server.connection_timeout,
            )
        except (Exception, asyncio.CancelledError):
            # Failed, timed out or evicted: the slot goes back here, whether or not the
            # loop also calls connection_lost (it does only for some failures).
            transport.abort()  # type: ignore[attr-defined]
            self._gone()
            return
        finally:
            self._handshake = None
        if tls is None or not self._admitted:  # evicted as the handshake completed
            if tls is not None:
                tls.abort()
            return
        self.transport = tls  # type: ignore[assignment]
        self._start()

    def _replay_early(self, transport: asyncio.BaseTransport) -> None:
        early, self._early = self._early, []
        tls: Any = transport.get_protocol()
        for data in early:
            view = memoryview(data)
            while view:
                buffer = tls.get_buffer(len(view))
                n = min(len(buffer), len(view))
                buffer[:n] = view[:n]
                tls.buffer_updated(n)
                view = view[n:]

    def _start(self) -> None:
        """The connection is ours (its TLS handshake done): HTTP/2 begins."""
        server = self.server
        transport = self.transport
        assert transport is not None
        if server.require_san and not server.san_allowed(transport):
            # GRPC_CLIENT_TLS_SAN: refused right after the handshake, before any HTTP/2.
            transport.abort()
            return
        options = server.core_options
        # A compiled dispatch (`rls.router`) binds itself to the connection: the core then
        # calls the route in C, without `_on_request`'s Python frame per call.
        bind = getattr(self._dispatch, "bind", None)
        on_request = self._on_request if bind is None else bind(self, self._call_failed)
        self.conn = Connection(on_request, self._on_close, **options)
        age = server.max_connection_age
        if age > 0:
            # +/-10% jitter, as grpc-go: connections opened together do not all leave together.
            self._later(age * random.uniform(0.9, 1.1), self._age_out)
        self._write(self.conn.flush())  # our SETTINGS

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None or self._lingering:
            # Read before TLS took the socket over: a ClientHello, a few reads at most
            # (the client waits for our answer); past that it is not TLS anyway.
            if self._handshake is not None and len(self._early) < 16:
                self._early.append(data)
            return
        self._receiving = True
        try:
            out = conn.receive(data)
        except Exception:
            log.exception("HTTP/2 connection failed")
            self.transport.abort()  # type: ignore[union-attr]
            return
        finally:
            self._receiving = False
        if out:
            self.transport.write(out)  # type: ignore[union-attr]
        if conn.wants_close:
            self._close()

    def eof_received(self) -> bool:
        return False  # the peer is gone: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        conn, self.conn = self.conn, None
        if conn is not None:
            server = self.server
            for stream in list(conn.streams.values()):
                server.forget_deadline(stream)
                if stream.work is not None:
                    stream.work.cancel()
                    stream.work = None

    def _gone(self) -> None:
        """Give back the connection's slot (once)."""
        if self._admitted:
            self._admitted = False
            server = self.server
            server.release()
            server.connections.discard(self)
            trimmer = server.budget.trimmer
            if trimmer is not None:
                trimmer.freed(CONNECTION_BYTES)

    def pause_writing(self) -> None:
        # The peer is not reading what we send: stop reading what it sends, and close the
        # connection if that lasts `write_timeout` (the server's sweep).
        self.paused_since = time.monotonic()
        self.transport.pause_reading()  # type: ignore[union-attr]

    def resume_writing(self) -> None:
        self.paused_since = 0.0
        self.transport.resume_reading()  # type: ignore[union-attr]

    # -- limits.Evictable ------------------------------------------------------------------

    def idle_key(self) -> IdleKey | None:
        """None while a call is open; the connections that never finished their TLS
        handshake or preface come first, then the longest without a call."""
        conn = self.conn
        if conn is None or self._lingering or not conn.established:
            return NEVER_USED, self.accepted
        if conn.streams:
            return None
        return USED, conn.idle_since

    def evict(self) -> None:
        """Close now to make room for a new connection."""
        self._gone()
        if self._handshake is not None:
            self._handshake.cancel()
        if self.transport is not None:
            self.transport.abort()

    # -- the core's callbacks --------------------------------------------------------------

    def _on_request(self, stream: Stream) -> None:
        try:
            self._dispatch(stream, self)
        except Exception:
            self._call_failed(stream)

    def _call_failed(self, stream: Stream) -> None:
        # A bug in one call's handling answers that call, not every call on the
        # connection (raising here would tear the whole connection down).
        log.exception("gRPC call failed")
        self._on_close(stream)
        if not stream.answered:
            self.finish(stream, INTERNAL, "internal error")

    def _on_close(self, stream: Stream) -> None:
        # Reset by the client (or its deadline passed) before we answered: stop the work.
        self.server.forget_deadline(stream)
        work = stream.work
        if work is not None:
            stream.work = None
            work.cancel()

    # -- replies ---------------------------------------------------------------------------

    def answer(self, stream: Stream, code: int, reply: bytes | str) -> None:
        """Finish a unary call: the reply bytes when `code` is 0, else that status.

        (The compiled routes answer a call decided within the read that completed it on
        the connection itself: there is nothing else to do for it then.)"""
        conn = self.conn
        if conn is None:
            return
        if code:
            conn.finish(stream, code, reply)
        else:
            conn.respond(stream, reply)
        stream.work = None
        # Every call is answered here: the checks inline, not a call each (`schedule_flush`'s
        # frame, too: a call answered alone, in a trickle, pays for each by itself).
        if stream.deadline is not None:
            self.server.forget_deadline(stream)
        if not self._receiving and self._flush_handle is None:
            self._flush_handle = self.server.loop.call_soon(self._flush)

    def send_message(self, stream: Stream, message: bytes) -> None:
        """One message of a server-streaming reply."""
        if self.conn is not None:
            self.conn.send_message(stream, message)
            self.schedule_flush()

    def finish(self, stream: Stream, code: int, message: str = "") -> None:
        """End a call with a status."""
        if self.conn is not None:
            self.conn.finish(stream, code, message)
            stream.work = None
            self.server.forget_deadline(stream)
            self.schedule_flush()

    def reset(self, stream: Stream) -> None:
        """RST_STREAM CANCEL: a reply the peer did not let out within `write_timeout`."""
        if self.conn is not None:
            self.conn.reset(stream)
            self.server.forget_deadline(stream)
            self.schedule_flush()

    def schedule_flush(self) -> None:
        """Write what the core has queued at the end of this loop iteration (once)."""
        if not self._receiving and self._flush_handle is None and self.conn is not None:
            self._flush_handle = self.server.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        conn = self.conn
        if conn is None:
            return
        data = conn.flush()  # as `_write`, inline: once per answered call in a trickle
        if data and not self.transport.is_closing():  # type: ignore[union-attr]
            self.transport.write(data)  # type: ignore[union-attr]
        if conn.wants_close:
            self._close()

    def _close(self) -> None:
        """Close after the final GOAWAY without losing it.

        Closing a socket with unread input resets the connection, and the peer may then
        discard our GOAWAY unread (a flooding peer always has input in flight). So half-close
        (FIN after what is queued), discard what still arrives, and close when the peer does,
        or after LINGER_SECONDS.
        """
        transport = self.transport
        if transport is None or transport.is_closing() or self._lingering:
            return
        self._lingering = True
        if transport.can_write_eof():
            transport.write_eof()
            self._later(LINGER_SECONDS, transport.close)
        else:  # TLS: no half-close
            transport.close()

    def _write(self, data: bytes) -> None:
        if data and not self.transport.is_closing():  # type: ignore[union-attr]
            self.transport.write(data)  # type: ignore[union-attr]

    # -- GOAWAY ----------------------------------------------------------------------------

    def shutdown(self, grace: float | None) -> None:
        """Graceful GOAWAY; in-flight calls finish; closed at the latest after `grace` s."""
        conn = self.conn
        if conn is None or conn.draining:
            return
        conn.shutdown()
        self._flush()
        self._later(GOAWAY_PING_TIMEOUT, self._final_goaway)
        if grace is not None:
            self._later(grace, self.abort)

    def _age_out(self) -> None:
        grace = self.server.max_connection_age_grace
        self.shutdown(grace if grace > 0 else None)

    def _final_goaway(self) -> None:
        if self.conn is not None:
            self.conn.goaway()
            self._flush()

    def abort(self) -> None:
        """Close now."""
        if self.transport is not None:
            self.transport.abort()

    def _later(self, delay: float, callback: Callable[[], None]) -> None:
        self._timers.append(self.server.loop.call_later(delay, callback))


class H2Server(Listener[H2Protocol]):
    """A gRPC server over `H2Protocol`: listeners, deadlines, connections, drain."""

    def __init__(
        self,
        dispatch: Dispatch,
        *,
        max_concurrent_streams: int = 100,
        max_message: int = 4 * 1024 * 1024,
        max_connection_age: float = 0.0,
        max_connection_age_grace: float = 0.0,
        metadata: Iterable[str] = (),
        client_san: str = "",
        san_matches: Callable[[str, str], bool] | None = None,
        max_connections: int = 4096,
        read_timeout: float = 10.0,
        write_timeout: float = 10.0,
        connection_timeout: float = 20.0,
        budget: ConnectionBudget | None = None,
        streaming: Iterable[bytes] = (),
    ) -> None:
        # read_timeout: a request whose body has not arrived whole this long after its
        # HEADERS is answered DEADLINE_EXCEEDED (its buffered bytes freed): 20,000 such
        # streams once held 75 MB. write_timeout: a reply not sent whole this long after it
        # was ready is reset (one connection whose peer announced a zero window once held
        # 1 GB of answered calls).
        super().__init__(
            "gRPC",
            max_connections=max_connections,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            budget=budget,
        )
        self.dispatch = dispatch
        # From accept to the client's HTTP/2 preface and SETTINGS, TLS handshake included.
        self.connection_timeout = connection_timeout
        self.ssl_context: ssl.SSLContext | None = None
        self.core_options = {
            "max_concurrent_streams": max_concurrent_streams,
            "max_message": max_message,
            "metadata": tuple(metadata),
            "buffers": self.budget.buffers,
            # Paths served as bidirectional streams (the core's `_h2_streaming.pxi`).
            "streaming": tuple(streaming),
        }
        self.max_connection_age = max_connection_age
        self.max_connection_age_grace = max_connection_age_grace
        self.require_san = bool(client_san)
        self._san = client_san
        self._san_matches = san_matches
        self._servers: list[asyncio.Server] = []
        # Deadlines of calls still waiting: [when, sequence, stream, protocol] in a heap,
        # with one timer for the earliest, so a call costs a heappush, not a TimerHandle.
        # An answered call's entry is emptied at once (its stream and connection freed) and
        # the heap compacted once most of it is such entries.
        self._deadlines: list[list[Any]] = []
        self._dead = 0
        self._deadline_timer: asyncio.Handle | None = None
        self._deadline_at = 0.0
        self._seq = 0

    async def start(
        self,
        host: str,
        port: int,
        *,
        uds: str = "",
        ssl_context: ssl.SSLContext | None = None,
        reuse_port: bool = False,
        backlog: int = 1024,
    ) -> int:
        """Listen on host:port (or the unix socket `uds`); the bound TCP port (0 for a socket)."""
        self.loop = asyncio.get_running_loop()
        self.start_sweeping()
        # TLS is started per connection once it is counted (`H2Protocol._start_tls`).
        self.ssl_context = ssl_context
        factory = lambda: H2Protocol(self)  # noqa: E731
        if uds:
            if not uds.startswith("\0"):
                _remove_stale_socket(uds)
            server = await self.loop.create_unix_server(factory, uds, backlog=backlog)
            self._servers.append(server)
            return 0
        server = await self.loop.create_server(
            factory, host, port, reuse_port=reuse_port, backlog=backlog
        )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    def watch_deadline(self, stream: Stream, proto: H2Protocol) -> None:
        """Answer `stream` DEADLINE_EXCEEDED (and cancel its work) once its timeout passes."""
        when = self.loop.time() + stream.timeout
        self._seq += 1
        entry = [when, self._seq, stream, proto]
        stream.deadline = entry
        heapq.heappush(self._deadlines, entry)
        timer = self._deadline_timer
        if timer is None or when < self._deadline_at:
            if timer is not None:
                timer.cancel()
            self._arm_deadline(when)

    def forget_deadline(self, stream: Stream) -> None:
        """The call is answered (or gone): drop what its deadline entry holds."""
        entry = stream.deadline
        if entry is None:
            return
        stream.deadline = None
        entry[2] = entry[3] = None
        self._dead += 1
        heap = self._deadlines
        if self._dead > _DEAD_DEADLINES and 2 * self._dead > len(heap):
            heap[:] = [e for e in heap if e[2] is not None]
            heapq.heapify(heap)
            self._dead = 0

    def _arm_deadline(self, when: float) -> None:
        # Remember `when` here: for a time under a millisecond away uvloop's call_at returns
        # a plain Handle (it runs it as call_soon), which has no when().
        self._deadline_at = when
        self._deadline_timer = self.loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self._deadline_timer = None
        heap = self._deadlines
        now = self.loop.time()
        while heap and heap[0][0] <= now:
            _, _, stream, proto = heapq.heappop(heap)
            if stream is None:  # answered already
                self._dead -= 1
                continue
            stream.deadline = None
            if stream.answered or stream.closed:
                continue
            work = stream.work
            if work is not None:
                stream.work = None
                work.cancel()
            proto.finish(stream, DEADLINE_EXCEEDED, "context deadline exceeded")
        if heap:
            self._arm_deadline(heap[0][0])

    def san_allowed(self, transport: asyncio.BaseTransport) -> bool:
        """Whether the client certificate of a TLS connection carries the required SAN."""
        cert = transport.get_extra_info("peercert") or {}
        names = [value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"]
        matches = self._san_matches or (lambda pattern, name: pattern == name)
        if any(matches(name, self._san) for name in names):
            return True
        peer = transport.get_extra_info("peername")
        log.warning(
            "refused a gRPC connection from %s: client certificate does not match the "
            "required SAN %r",
            peer,
            self._san,
        )
        return False

    def sweep(self) -> None:
        """Enforce the timeouts (see the module docstring); runs every second."""
        now = time.monotonic()
        unread = now - self.read_timeout
        unsent = now - self.write_timeout
        unestablished = now - self.connection_timeout
        for proto in list(self.connections):
            conn = proto.conn
            if conn is None or not conn.established:
                if proto.accepted < unestablished:
                    proto.evict()  # no preface (or TLS handshake) in time
                continue
            if 0.0 < proto.paused_since < unsent:
                proto.evict()  # its socket has not been writable for write_timeout
                continue
            for stream in list(conn.streams.values()):
                if stream.closed:
                    continue
                if not stream.dispatched and stream.started < unread:
                    proto.finish(stream, DEADLINE_EXCEEDED, "request not received in time")
                elif 0.0 < stream.sending_since < unsent:
                    proto.reset(stream)

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting; GOAWAY every connection; close them once drained (or after grace)."""
        self.stop_sweeping()
        for server in self._servers:
            server.close()
        for proto in list(self.connections):
            proto.shutdown(grace)
        await self.drain(grace)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None


def _remove_stale_socket(path: str) -> None:
    """A unix socket left by a previous run would make bind fail: remove it (only a socket)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)
