"""Connections to one Redis address set: dialling (TLS, AUTH), and the auto-pipelining pool.

A `Pool` buffers the RESP payloads of every request of one event-loop iteration and writes
them with one `transport.write` on one of its connections (a flush); see the package
docstring for the why. `Dialer` opens one connection; `Counters` are an instance's
connection statistics (`ratelimit.<pool label>.cx_*`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ...runtime.aio import cancel
from ...settings import RedisSettings, redis_auth
from ..base import BackendError
from . import resp
from .resp import ReplyError, RespConnection, SharedFuture
from .rounds import Batch, Flush

log = logging.getLogger("ratelimitd.backends.redis")

Address = tuple[str, int] | str  # (host, port) or a unix socket path

_RECONNECT_INITIAL = 0.05
_RECONNECT_MAX = 1.0
# Commands one connection may have in flight; a flush is never larger.
MAX_IN_FLIGHT = 8192
# Commands past REDIS_REQUEST_TIMEOUT are logged once per burst: when the first times out
# after this many quiet seconds, then at most this often while they go on.
TIMEOUT_LOG_SECONDS = 10.0


def host_port(item: str) -> tuple[str, int]:
    host, sep, port = item.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise BackendError(f"invalid redis address {item!r} (expected host:port)")
    return host.strip("[]"), int(port)


class Counters:
    """Connection statistics of one instance (ratelimit.<label>.*)."""

    __slots__ = ("active", "local_close", "on_change", "total")

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.active = 0
        self.total = 0
        self.local_close = 0
        self.on_change = on_change


class Dialer:
    """How to open a connection of one instance to one address."""

    def __init__(self, s: RedisSettings, ssl_context: ssl.SSLContext | None) -> None:
        self.s = s
        self.ssl_context = ssl_context
        self.username, self.password = redis_auth(s.auth)

    def with_url_credentials(self, username: str | None, password: str | None) -> None:
        """Credentials from a redis:// URL, unless REDIS_AUTH set them."""
        if self.password is None and password:
            self.username, self.password = username or None, password

    async def open(
        self,
        address: Address,
        on_lost: Callable[[RespConnection], None] | None = None,
        *,
        auth: tuple[str | None, str | None] | None = None,
    ) -> RespConnection:
        """A ready connection (AUTH + PING done); `auth` overrides the instance's."""
        username, password = auth if auth is not None else (self.username, self.password)
        return await resp.open_connection(
            address,
            timeout=self.s.request_timeout,
            dial_timeout=self.s.dial_timeout,
            ssl_context=self.ssl_context,
            username=username,
            password=password,
            on_lost=on_lost,
        )

    async def query(self, address: Address, *args: str | int, **kw: Any) -> Any:
        """One control-plane command on a short-lived connection; its reply."""
        conn = await self.open(address, **kw)
        try:
            (reply,) = await conn.call(resp.command(*args), 1, self.s.dial_timeout)
        finally:
            conn.close()
            await conn.wait_closed()
        if isinstance(reply, ReplyError):
            raise BackendError(str(reply))
        return reply


@dataclass(slots=True, eq=False)
class Pool:
    """REDIS_POOL_SIZE connections to one server, fed by per-iteration flushes."""

    s: RedisSettings
    dialer: Dialer
    resolve: Callable[[], Awaitable[Address]]
    counters: Counters
    describe: str
    max_in_flight: int
    loop: asyncio.AbstractEventLoop | None = field(init=False, default=None)  # set when opened
    conns: list[RespConnection] = field(init=False, default_factory=list)
    writes: int = field(init=False, default=0)  # flushes: one transport.write each
    closed: bool = field(init=False, default=False)
    _buf: list[bytes] = field(init=False, default_factory=list)
    _fut: Flush | None = field(init=False, default=None)  # the flush being built
    _cmds: int = field(init=False, default=0)
    _scheduled: bool = field(init=False, default=False)
    _rr: int = field(init=False, default=0)
    _maintainer: asyncio.Task[None] | None = field(init=False, default=None)
    _probe_dial: asyncio.Task[None] | None = field(init=False, default=None)
    _window: float = field(init=False)
    _timed_out: int = field(init=False, default=0)  # commands timed out, not logged yet
    _timeout_logged: float = field(init=False, default=-TIMEOUT_LOG_SECONDS)  # monotonic
    _limit: int = field(init=False)
    # receiver(replies, entries): resolves the waiters `send` queued on one flush, with its
    # replies (or its BackendError) and their waiter, offset, commands (`Flush.entries`);
    # set by the owner.
    receiver: Callable[[Any, list[Any]], None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._window = self.s.pipeline_window
        # Commands per flush: REDIS_PIPELINE_LIMIT, and never more than one connection
        # may have in flight, so a burst is split over connections instead of refused.
        most = self.max_in_flight
        self._limit = min(self.s.pipeline_limit or most, most)

    # hot path ---------------------------------------------------------------------

    def submit(self, payload: bytes, n: int) -> tuple[SharedFuture, int]:
        """Queue one request's commands for the next flush.

        Returns the future of the flush's replies (its result: every reply of the flush,
        or a BackendError) and the offset of this request's first reply in it. One future
        per flush rather than per request keeps dispatch off the per-request path.
        """
        flush, offset = self._queue(payload, n)
        fut = flush.future
        if fut is None:
            fut = flush.future = SharedFuture(loop=self.loop)
        self._queued()
        return fut, offset

    def send(self, payload: bytes, n: int, waiter: Any) -> None:
        """`submit` for a caller that does not await: the `receiver` gets `waiter` with the
        flush's replies, together with every other waiter of that flush, where the
        connection reads them (one call per flush, none per request)."""
        flush, offset = self._queue(payload, n)
        entries = flush.entries
        if entries is None:
            entries = flush.entries = []
        entries += (waiter, offset, n)
        self._queued()

    def _queue(self, payload: bytes, n: int) -> tuple[Flush, int]:
        """The flush that takes a request's `n` commands (the open one, unless they would
        overfill it), and their offset in it; the payload added to it."""
        if not self.conns:
            raise BackendError(f"no connection to redis at {self.describe}")
        offset = self._cmds
        if offset and offset + n > self._limit:
            self._flush()
            offset = 0
        flush = self._fut
        if flush is None:
            flush = self._fut = Flush(self.loop, self.receiver)
        self._buf.append(payload)
        self._cmds = offset + n
        return flush, offset

    def _queued(self) -> None:
        """Written at once when full, else scheduled (once per flush)."""
        if self._cmds >= self._limit:
            self._flush()
        elif not self._scheduled:
            self._scheduled = True
            loop = self.loop
            assert loop is not None  # a connection exists, so the pool was opened
            if self._window:
                loop.call_later(self._window, self._flush, True)
            else:
                loop.call_soon(self._flush, True)

    def _flush(self, scheduled: bool = False) -> None:
        """Write the flush being built (`scheduled`: the loop's callback, which finds none
        when the flush filled up and was written at once)."""
        if scheduled:
            self._scheduled = False
        fut = self._fut
        if fut is None:
            assert scheduled
            return
        cmds = self._cmds
        payload = b"".join(self._buf)
        self._buf = []
        self._fut = None
        self._cmds = 0
        conns = self.conns
        limit = self.max_in_flight
        if conns and cmds <= limit:
            # The last flush's connection again while it has nothing in flight (a trickle
            # of calls): its deadline timer is still armed, where the next one's has lapsed
            # and would be armed, and fire, once per call. Busy ones pass it round-robin.
            conn = conns[self._rr % len(conns)]
            if not conn.in_flight:
                self.writes += 1
                conn.write(payload, [Batch(fut, cmds)], cmds)
                return
        idlest = None
        for _ in range(len(conns)):
            self._rr += 1
            conn = conns[self._rr % len(conns)]
            if conn.in_flight + cmds <= limit:
                self.writes += 1
                conn.write(payload, [Batch(fut, cmds)], cmds)
                return
            if idlest is None or conn.in_flight < idlest.in_flight:
                idlest = conn
        if idlest is not None and cmds > limit and idlest.in_flight < limit:
            # One request larger than the limit itself (MAX_DESCRIPTORS_PER_REQUEST bounds it)
            # could never fit: it goes to the idlest connection rather than failing. A flush
            # that would fit later still fails fast: Redis is too far behind to take more.
            self.writes += 1
            idlest.write(payload, [Batch(fut, cmds)], cmds)
            return
        reason = "redis pipeline full" if conns else "no connection to redis"
        fut.set_result(BackendError(f"{reason} at {self.describe}"))

    # connections ------------------------------------------------------------------

    async def open_all(self) -> None:
        """Open the missing connections concurrently; raise if none is up afterwards."""
        address = await self.resolve()
        missing = self.s.pool_size - len(self.conns)
        results = await asyncio.gather(
            *(self._open(address) for _ in range(missing)), return_exceptions=True
        )
        if not self.conns:
            errors = [r for r in results if isinstance(r, BaseException)]
            raise errors[0] if errors else BackendError("no connection")
        if len(self.conns) < self.s.pool_size:
            self.maintain()

    async def dial_if_down(self) -> None:
        """With no connection up, dial one now instead of waiting for the maintainer's
        backoff (a breaker's probe: the store may be back although the pool has not
        re-dialled yet). Waits at most REDIS_REQUEST_TIMEOUT, as a request would; the dial
        goes on in the background past it. Raises BackendError when it fails or is late."""
        if self.conns or self.closed:
            return
        dial = self._probe_dial
        if dial is None or dial.done():
            dial = self._probe_dial = asyncio.get_running_loop().create_task(self._dial())
            dial.add_done_callback(_retrieve)
        try:
            await asyncio.wait_for(asyncio.shield(dial), self.s.request_timeout)
        except TimeoutError:
            raise BackendError(f"no connection to redis at {self.describe} yet") from None

    async def _dial(self) -> None:
        await self._open(await self.resolve())

    async def _open(self, address: Address) -> None:
        self.loop = asyncio.get_running_loop()
        conn = await self.dialer.open(address, self._lost)
        conn.on_timeout = self._timed_out_commands
        if self.closed:
            conn.close()
            return
        if conn.closed:  # lost before we could adopt it
            return
        self.conns.append(conn)
        counters = self.counters
        counters.total += 1
        counters.active += 1
        counters.on_change()

    def _timed_out_commands(self, n: int) -> None:
        """`n` commands of a connection passed REDIS_REQUEST_TIMEOUT: a stall fails every
        pipelined command past its deadline at once (each answered as
        BACKEND_FAILURE_POLICY says), and once did so without a word in the log."""
        self._timed_out += n
        now = time.monotonic()
        if now - self._timeout_logged >= TIMEOUT_LOG_SECONDS:
            log.warning(
                "redis request timed out after REDIS_REQUEST_TIMEOUT (%gs) on %s: %d "
                "commands failed since the last such line",
                self.s.request_timeout,
                self.describe,
                self._timed_out,
            )
            self._timed_out = 0
            self._timeout_logged = now

    def _lost(self, conn: RespConnection) -> None:
        if conn in self.conns:
            self.conns.remove(conn)
            counters = self.counters
            counters.active -= 1
            if conn.local_close:
                counters.local_close += 1
            counters.on_change()
            if not self.conns and not self.closed:
                log.warning("no connection left to redis at %s; reconnecting", self.describe)
        if not self.closed:
            self.maintain()

    def maintain(self) -> None:
        """Refill the pool in the background (no request ever waits for it)."""
        if self._maintainer is None and not self.closed:
            self._maintainer = asyncio.get_running_loop().create_task(self._maintain())

    async def _maintain(self) -> None:
        delay = _RECONNECT_INITIAL
        try:
            while not self.closed and len(self.conns) < self.s.pool_size:
                try:
                    address = await self.resolve()
                    while not self.closed and len(self.conns) < self.s.pool_size:
                        await self._open(address)
                    delay = _RECONNECT_INITIAL
                except BackendError as exc:
                    log.debug("reconnecting to redis at %s: %s", self.describe, exc)
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, _RECONNECT_MAX)
        finally:
            self._maintainer = None

    def reset(self) -> None:
        """Drop every connection (the master moved); the maintainer reconnects."""
        for conn in list(self.conns):
            conn.abort("redis master changed")

    async def close(self) -> None:
        """Close every connection and stop reconnecting."""
        self.closed = True
        if self._probe_dial is not None:
            self._probe_dial.cancel()
        await cancel(self._maintainer)
        conns = list(self.conns)
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()


def _retrieve(task: asyncio.Task[None]) -> None:
    # A probe's dial that failed after the probe stopped waiting: its error was logged by
    # nobody and matters to nobody (the maintainer keeps dialling).
    if not task.cancelled():
        task.exception()


async def await_replies(submitted: tuple[SharedFuture, int], n: int) -> list[Any]:
    """Await a submitted request: its `n` replies, or raise the BackendError of its flush."""
    fut, offset = submitted
    replies = await fut
    if replies.__class__ is not list:
        raise BackendError(*replies.args)  # a fresh instance per request
    return replies[offset : offset + n]  # type: ignore[no-any-return]
