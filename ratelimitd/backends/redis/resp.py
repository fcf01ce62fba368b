"""RESP2 on asyncio: pre-encoded counter commands and a pipelined connection protocol.

The counter hot path does not go through a general Redis client: a request's commands
are encoded straight into one bytes object (INCRBY + EXPIRE per key: `incrby_expire_ops`,
or, compiled, from the decision's fixed windows handed over in C: `Sender` is a
`backends._rounds.Rounds`),
written by the pool together with the other requests of the same event-loop iteration (a
request joins the flush being built through `Sender`), and the replies are parsed
(`Replies`: integers in C, any other reply by `hiredis.Reader`) and handed back to each
request in order. Those leaves of the codec are compiled (`_resp.pyx`; their pure twin
`_resp_py.py`, selected here as the other compiled modules are, RATELIMITD_NO_EXTENSIONS=1
forcing the twin). The round that carries them, `RespConnection.write` and
`data_received` and the flushes they write and answer, is written once in `rounds.py`
(Cython's pure-Python mode: compiled where built, else run as it is).

A connection keeps a FIFO of pending batches (one per request and round). Each batch
carries a deadline; one timer per connection watches them. A batch past its deadline
fails its request at once, but stays in the FIFO: its replies are still due, in order,
and are read and dropped when they come. Only when the oldest batch is still unanswered
`STALL_FACTOR` timeouts after its deadline is the server presumed hung (paused or
partitioned): everything pending fails, the transport is closed and the owner replaces
the connection. So a momentary stall (a busy event loop, a slow fork on the server)
costs the requests caught in it, not the connections and the requests after them.
"""

from __future__ import annotations

import asyncio
import binascii
import ssl
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import hiredis

from ..._twins import chooser, install
from ..base import BackendError
from . import _resp_py
from ._resp_py import bulk_int
from .rounds import Batch, received, written

IMPLEMENTATION = install(globals(), "ratelimitd.backends.redis._resp", _resp_py)
if TYPE_CHECKING:
    # The twins' names, typed as the pure one's (the module's own `__all__`).
    from ._resp_py import Replies, Sender, incrby_expire_ops  # noqa: F401

# implementation(name): the module behind the twin names ("compiled", "pure"; None: selected).
implementation = chooser(
    "ratelimitd.backends.redis._resp", "ratelimitd.backends.redis._resp_py", IMPLEMENTATION
)

_SLOTS = 16384  # Redis Cluster hash slots


def key_slot(key: bytes) -> int:
    """The Redis Cluster hash slot of a key: CRC16/XMODEM of the key or its {hashtag} (here,
    below the instances, so that the scripts' modules route without importing them)."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) & (_SLOTS - 1)


_INCRBY = b"*3\r\n$6\r\nINCRBY\r\n$%d\r\n%b\r\n%b"
_EXPIRE = b"*3\r\n$6\r\nEXPIRE\r\n$%d\r\n%b\r\n%b"
_GET = b"*2\r\n$3\r\nGET\r\n$%d\r\n%b\r\n"

# A connection whose oldest reply is this many request timeouts late is given up.
STALL_FACTOR = 20
ASKING = b"*1\r\n$6\r\nASKING\r\n"
PING = b"*1\r\n$4\r\nPING\r\n"

ReplyError = hiredis.ReplyError


def incrby(key: bytes, hits: int) -> bytes:
    """`INCRBY key hits`, RESP-encoded."""
    return _INCRBY % (len(key), key, bulk_int(hits))


def expire(key: bytes, seconds: int) -> bytes:
    """`EXPIRE key seconds`, RESP-encoded."""
    return _EXPIRE % (len(key), key, bulk_int(seconds))


def get(key: bytes) -> bytes:
    """`GET key`, RESP-encoded."""
    return _GET % (len(key), key)


def command(*args: str | bytes | int) -> bytes:
    """Any command, RESP-encoded (control plane: AUTH, SENTINEL, CLUSTER SLOTS, ...)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, int):
            arg = b"%d" % arg
        elif isinstance(arg, str):
            arg = arg.encode()
        out.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(out)


class SharedFuture(asyncio.Future):  # type: ignore[type-arg]
    """The replies of one flush, awaited by every request in it that awaits (`Flush.future`).

    A request that is cancelled while waiting must not cancel the flush for the
    others: `cancel` refuses, so the waiting task is cancelled as soon as the flush
    completes (within the request timeout) instead of at once.
    """

    def cancel(self, msg: Any = None) -> bool:
        """Refuse (see the class docstring)."""
        return False


class RespConnection(asyncio.Protocol):
    """One Redis connection: writes flushed payloads, dispatches replies to batches.

    A batch's future gets the list of its replies (error replies as `ReplyError`
    instances inside it), or a `BackendError` instance when the connection failed or
    timed out; callers check the type instead of catching (no unretrieved exceptions).
    """

    # Slots: the round's methods (`rounds.received`, `written`) read and write these once a
    # round.
    __slots__ = (
        "_lost",
        "_reader",
        "_timer",
        "_timer_at",
        "closed",
        "in_flight",
        "local_close",
        "loop",
        "on_lost",
        "on_timeout",
        "pending",
        "timeout",
        "transport",
        "writes",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        on_lost: Callable[[RespConnection], None] | None = None,
    ) -> None:
        self.loop = loop
        self.timeout = timeout
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.pending: deque[Batch] = deque()
        self.in_flight = 0  # commands written whose replies are still due
        self.writes = 0
        self.closed = False
        self.local_close = False
        self._reader = Replies()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when `_timer` fires (loop time)
        self._lost: asyncio.Future[None] = loop.create_future()
        # Told how many commands a deadline check failed (the pool logs them).
        self.on_timeout: Callable[[int], None] | None = None

    # asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = transport  # type: ignore[assignment]

    # The two methods run once a round, in `rounds` (compiled: no Python frame each).
    data_received = received  # parse replies, complete the batches they finish, in order
    write = written  # write one flush: its batches due, the deadline timer armed

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail what is pending and tell the owner."""
        reason = f"redis connection lost: {exc}" if exc else "redis connection closed"
        self._fail_all(reason)
        if not self._lost.done():
            self._lost.set_result(None)
        if self.on_lost is not None:
            on_lost, self.on_lost = self.on_lost, None
            on_lost(self)

    # writing ----------------------------------------------------------------------

    async def call(self, payload: bytes, n: int, timeout: float) -> list[Any]:
        """Send commands outside the pipeline (handshake, control plane); their replies."""
        batch = Batch(self.loop.create_future(), n)
        self.write(payload, [batch], n, timeout)
        result = await batch.future
        if isinstance(result, BackendError):
            raise result
        return result

    # failure ----------------------------------------------------------------------

    def _check_deadline(self) -> None:
        self._timer = None
        pending = self.pending
        if not pending:
            return
        now = self.loop.time()
        stall = pending[0].deadline + self.timeout * STALL_FACTOR
        if stall <= now:
            self.abort("redis request timed out (connection stalled)")
            return
        next_check = stall
        timed_out: BackendError | None = None
        failed = 0
        for batch in pending:
            if batch.future.done():
                continue
            if batch.deadline > now:
                next_check = min(next_check, batch.deadline)
                break
            if timed_out is None:
                timed_out = BackendError("redis request timed out")
            batch.future.set_result(timed_out)
            failed += batch.n
        if failed and self.on_timeout is not None:
            self.on_timeout(failed)
        self._timer = self.loop.call_at(next_check, self._check_deadline)
        self._timer_at = next_check

    def abort(self, reason: str) -> None:
        """Give up on this connection: fail what is pending, close the transport."""
        self._fail_all(reason)
        transport = self.transport
        if transport is not None and not transport.is_closing():
            self.local_close = True
            transport.abort()

    def close(self) -> None:
        """Close gracefully (pending batches fail when the transport is gone)."""
        self.closed = True
        transport = self.transport
        if transport is not None and not transport.is_closing():
            self.local_close = True
            transport.close()

    async def wait_closed(self) -> None:
        """Wait until the transport is gone (after `close` or `abort`)."""
        if self.transport is not None:
            await self._lost

    def _fail_all(self, reason: str) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending = self.pending
        self.pending = deque()
        self.in_flight = 0
        for batch in pending:
            if not batch.future.done():
                batch.future.set_result(BackendError(reason))


async def open_connection(
    address: tuple[str, int] | str,
    *,
    timeout: float,
    dial_timeout: float,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    username: str | None = None,
    password: str | None = None,
    on_lost: Callable[[RespConnection], None] | None = None,
) -> RespConnection:
    """Dial, AUTH when configured, PING; a ready connection or BackendError."""
    loop = asyncio.get_running_loop()
    conn = RespConnection(loop, timeout)
    try:
        if isinstance(address, str):
            coro = loop.create_unix_connection(lambda: conn, address, ssl=ssl_context)
        else:
            host, port = address
            coro = loop.create_connection(
                lambda: conn,
                host,
                port,
                ssl=ssl_context,
                server_hostname=(server_hostname or host) if ssl_context else None,
            )
        await asyncio.wait_for(coro, dial_timeout)
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        conn.abort("dial failed")
        raise BackendError(f"{type(exc).__name__}: {exc}") from exc
    try:
        payload = PING
        n = 1
        if password is not None:
            auth = command("AUTH", username, password) if username else command("AUTH", password)
            payload = auth + PING
            n = 2
        replies = await conn.call(payload, n, dial_timeout)
        for reply in replies:
            if isinstance(reply, ReplyError):
                raise BackendError(str(reply))
    except BaseException:
        conn.abort("handshake failed")
        raise
    conn.on_lost = on_lost
    return conn
