"""The Redis counter path's hot codec, the pure-Python twin (`_resp.pyx` is the compiled one;
`resp.py` selects).

Per request, the INCRBY + EXPIRE commands of its ops in one payload
(`incrby_expire_ops`), added to its pool's next flush (`Sender`); per pipelined flush, its
replies parsed (`Replies`) and taken from the parser (`read_replies`: two a request, so the
loop is per request too) and every waiter of the flush given its counters where they are read
(`Flush.deliver`, `Resolver`, `resolve`). A connection's two methods that run once a round,
`RespConnection.data_received` and `write`, are `received` and `written` here: bound to the
class, compiled, they run no Python frame. The
rest of RESP (control commands, scripts, GET, the connection's batches) runs once per flush
or rarely, and stays in `resp.py`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import hiredis

from ...config.windows import FIXED_WINDOW
from ..base import BackendError, Op

__all__ = [
    "Batch",
    "Flush",
    "Replies",
    "Resolver",
    "Sender",
    "incrby_expire_ops",
    "read_replies",
    "received",
    "resolve",
    "written",
]

_INCRBY_EXPIRE = b"*3\r\n$6\r\nINCRBY\r\n$%d\r\n%b\r\n%b*3\r\n$6\r\nEXPIRE\r\n$%d\r\n%b\r\n%b"

# Bulk-string encodings of the small integers (hits, and unit + jitter up to an hour +
# jitter), so the hot path formats only the key.
_SMALL_INTS = tuple(b"$%d\r\n%d\r\n" % (len(str(i)), i) for i in range(4096))


def bulk_int(n: int) -> bytes:
    """An integer as a RESP bulk string."""
    if 0 <= n < 4096:
        return _SMALL_INTS[n]
    s = b"%d" % n
    return b"$%d\r\n%b\r\n" % (len(s), s)


def incrby_expire_ops(ops: Sequence[Op], jitter: int) -> bytes | None:
    """`INCRBY key hits` + `EXPIRE key seconds` for every op, RESP-encoded in one payload,
    each op expiring after its seconds plus a random jitter below `jitter`
    (EXPIRATION_JITTER_MAX_SECONDS); None when an op is a script's (an algorithm's, a
    refund or a budget call)."""
    parts = []
    for op in ops:
        if op.algorithm != FIXED_WINDOW or op.refund or op.budget is not None:
            return None
        seconds = op.seconds
        if jitter > 0:
            seconds += int(random.random() * jitter)
        key = op.key.encode()
        n = len(key)
        parts.append(_INCRBY_EXPIRE % (n, key, bulk_int(op.hits), n, key, bulk_int(seconds)))
    return b"".join(parts)


class Sender:
    """`SingleInstance.increment_later`: a request's fixed-window ops as one payload, handed
    to its pool's next flush with `waiter` (`Pool.submit`); False, nothing sent, when an op
    is a script's (`incr_expire` awaits those: their scripts may need a second round).
    Raises BackendError when the pool has no connection.

    The compiled twin opens or joins the flush being built without calling `Pool.send`: per
    request no Python frame, where this one runs four. It is also a `backends._rounds.Rounds`: the
    compiled decision hands it a plan's fixed windows as C values (key, hits, seconds), so
    such a plan makes no `Op`; this twin takes `Op`s only.
    """

    def __init__(self, pool: Any, jitter: int) -> None:
        self.pool = pool
        self.jitter = jitter

    def __call__(self, ops: Sequence[Op], waiter: Any) -> bool:
        """Start the round of `ops` (see the class docstring)."""
        payload = incrby_expire_ops(ops, self.jitter)
        if payload is None:
            return False
        self.pool.send(payload, 2 * len(ops), waiter)
        return True


class Flush:
    """One pipelined flush: the waiters `Pool.send` queued on it (`entries`, three items a
    waiter: the waiter, the offset of its first reply, its number of replies) and the future
    of the callers that await it (`future`, made for the first of them by `Pool.submit`).

    Its connection completes it as it completes a future (`done`, `set_result`), but the
    replies read for it reach its waiters at once (`deliver`): no future, done callback and
    loop pass per flush, which a call alone in the loop (a trickle) paid for by itself.
    """

    __slots__ = ("_done", "entries", "future", "loop", "receiver")

    def __init__(self, loop: Any, receiver: Any) -> None:
        self.loop = loop
        self.receiver = receiver  # (replies, entries) -> None: the instance's `Resolver`
        self.entries: list[Any] | None = None
        self.future: Any = None
        self._done = False

    def done(self) -> bool:
        """Whether it has its replies or its failure."""
        return self._done

    def set_result(self, result: Any) -> None:
        """Its failure (a BackendError instance; or replies): the waiters get it from the
        loop, as from a done callback, never inside the call that failed it (a flush
        refused as it is submitted must not answer the decision submitting it)."""
        self._done = True
        if self.future is not None:
            self.future.set_result(result)
        if self.entries is not None:
            self.loop.call_soon(self.receiver, result, self.entries)

    def deliver(self, replies: list[Any]) -> None:
        """Its replies, read: every waiter gets its own now."""
        self._done = True
        if self.future is not None:
            self.future.set_result(replies)
        if self.entries is not None:
            self.receiver(replies, self.entries)


class Resolver:
    """An instance's `Pool.receiver`: `resolve` with its breaker (looked up per flush: a
    breaker is given to the instance after its pool) and its `_counts`."""

    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self.counts = instance._counts

    def __call__(self, replies: Any, entries: list[Any]) -> None:
        """Give the waiters of one flush their counters (`resolve`)."""
        resolve(replies, entries, self.instance.breaker, self.counts)


class Replies:
    """A connection's reply parser: `hiredis.Reader`'s `feed` and `gets`.

    The compiled twin reads integer replies itself (INCRBY's and EXPIRE's, all the counter
    path gets: two a request), without a call into hiredis each, and hands hiredis any
    other kind and what follows it until hiredis is idle again (no reply begun, no byte
    held); the replies, and the errors for a malformed stream, are hiredis's.
    """

    def __init__(self) -> None:
        self.reader = hiredis.Reader()

    def feed(self, data: bytes) -> None:
        """Bytes read from the connection."""
        self.reader.feed(data)

    def gets(self) -> Any:
        """The next reply, or False when none is whole yet."""
        return self.reader.gets()


def read_replies(reader: Replies, replies: list[Any], n: int) -> bool:
    """Append up to `n` replies from `reader` (its `gets`: False when no whole reply is
    buffered) to `replies`; True when all `n` came."""
    gets = reader.gets
    for _ in range(n):
        reply = gets()
        if reply is False:
            return False
        replies.append(reply)
    return True


def resolve(
    replies: Any,
    entries: list[Any],
    breaker: Any,
    counts: Callable[[list[Any], int, int], list[Any]],
) -> None:
    """Give each waiter of one flush (`entries`, three items a waiter: the waiter, the
    offset of its first reply, its number of replies) its counters: every other reply
    (INCRBY's; the EXPIRE after each must be a number too), or what `counts` makes of
    replies that are not all numbers (a saturated counter, or the BackendError it raises);
    every waiter gets a fresh copy of the flush's BackendError (`replies` is not a list).
    The `breaker` (or None) counts each waiter that is still wanted: a success resets its
    failures, a failure is one more."""
    failed = replies.__class__ is not list
    for i in range(0, len(entries), 3):
        waiter, offset, n = entries[i : i + 3]
        result: Any
        if failed:
            result = BackendError(*replies.args)
        else:
            mine = replies[offset : offset + n]
            if all(reply.__class__ is int for reply in mine):
                result = mine[::2]
            else:
                try:
                    result = counts(replies, offset, n)
                except BackendError as exc:
                    result = exc
        if breaker is not None and not waiter.cancelled:
            if failed or result.__class__ is not list:
                breaker.failed()
            else:
                breaker.failures = 0
        waiter(result)


class Batch:
    """Commands written together on one connection: a future (or a `Flush`) for their `n`
    replies."""

    __slots__ = ("deadline", "future", "n", "replies")

    def __init__(self, future: Any, n: int) -> None:
        self.future = future
        self.n = n
        self.replies: list[Any] = []
        self.deadline = 0.0


def received(conn: Any, data: bytes) -> None:
    """`RespConnection.data_received`: parse replies and complete the batches they finish,
    in order; a flush's waiters get theirs at once (`Flush.deliver`)."""
    reader = conn._reader
    reader.feed(data)
    pending = conn.pending
    try:
        while pending:
            batch = pending[0]
            replies = batch.replies
            if not read_replies(reader, replies, batch.n - len(replies)):
                return  # the rest of this batch has not arrived yet
            pending.popleft()
            conn.in_flight -= batch.n
            fut = batch.future
            if fut.done():
                continue
            if fut.__class__ is not Flush:
                fut.set_result(replies)
                continue
            try:
                fut.deliver(replies)
            except Exception as exc:  # as the loop reports a failed callback
                conn.loop.call_exception_handler(
                    {"message": "resolving a redis flush failed", "exception": exc}
                )
            if conn.pending is not pending:
                return  # failed while resolving (`_fail_all`): nothing left to read
        if reader.gets() is not False:
            conn.abort("redis sent a reply nobody asked for")
    except hiredis.ProtocolError as exc:
        conn.abort(f"redis protocol error: {exc}")


def written(
    conn: Any, payload: bytes, batches: list[Batch], commands: int, timeout: float = 0.0
) -> None:
    """`RespConnection.write`: write one flush (the payloads of `batches`, `commands`
    commands in all), its batches now due, the connection's deadline timer armed."""
    if conn.closed or conn.transport is None:
        err = BackendError("redis connection closed")
        for b in batches:
            if not b.future.done():
                b.future.set_result(err)
        return
    loop = conn.loop
    deadline = loop.time() + (timeout or conn.timeout)
    pending = conn.pending
    for b in batches:
        b.deadline = deadline
        pending.append(b)
    conn.in_flight += commands
    conn.writes += 1
    conn.transport.write(payload)
    timer = conn._timer
    if timer is None or deadline < conn._timer_at:  # or armed for a longer handshake's
        if timer is not None:
            timer.cancel()
        conn._timer = loop.call_at(deadline, conn._check_deadline)
        conn._timer_at = deadline
