# cython: annotation_typing=False
"""A Redis connection's round, written once: a flush written with its batches due
(`written`), its replies read back and handed to the batches they finish, in order
(`received`), and every waiter of a pipelined flush given its counters where they are read
(`Flush.deliver`, `Resolver`, `resolve`).

`RespConnection.write` and `data_received` are `written` and `received`, bound to the class;
`Pool` builds its flushes as `Flush`es and writes them as `Batch`es; the compiled
`_resp.Sender` opens and writes a trickle's flush here in C. The codec's leaves (the payload
of a request's ops, the reply parser) stay in `_resp` and its pure twin `_resp_py`; a parser
is a `Reader`, so that compiled, the round reads the compiled one's replies in C.

Compiled in Cython's pure-Python mode (types in `rounds.pxd`, which `_resp.pyx` cimports):
per round, no Python frame. The same source runs uncompiled where the extension is not built.
"""

from __future__ import annotations

from typing import Any

import hiredis

from ..base import BackendError

__all__ = [
    "Batch",
    "Flush",
    "Reader",
    "Resolver",
    "read_replies",
    "received",
    "resolve",
    "written",
]


class Reader:
    """What a connection reads its replies with (`_resp.Replies`, or its pure twin):
    `hiredis.Reader`'s `feed` and `gets`. A base class, so that the compiled round calls the
    compiled parser's methods in C."""

    def feed(self, data: bytes) -> None:
        """Bytes read from the connection."""
        raise NotImplementedError

    def gets(self) -> Any:
        """The next reply, or False when none is whole yet."""
        raise NotImplementedError


def read_replies(reader: Reader, replies: list[Any], n: int) -> bool:
    """Append up to `n` replies from `reader` (its `gets`: False when no whole reply is
    buffered) to `replies`; True when all `n` came."""
    for _k in range(n):
        reply = reader.gets()
        if reply is False:
            return False
        replies.append(reply)
    return True


def resolve(
    replies: Any,
    entries: list[Any],
    breaker: Any,
    counts: Any,
) -> None:
    """Give each waiter of one flush (`entries`, three items a waiter: the waiter, the
    offset of its first reply, its number of replies) its counters: every other reply
    (INCRBY's; the EXPIRE after each must be a number too), or what `counts(replies, offset,
    n)` makes of replies that are not all numbers (a saturated counter, or the BackendError
    it raises); every waiter gets a fresh copy of the flush's BackendError (`replies` is not
    a list). The `breaker` (or None) counts each waiter that is still wanted: a success
    resets its failures, a failure is one more."""
    failed = type(replies) is not list
    for i in range(0, len(entries) - 2, 3):
        waiter = entries[i]
        first = offset = entries[i + 1]
        n = entries[i + 2]
        result: Any
        if failed:
            result = BackendError(*replies.args)
        else:
            mine = replies
            if offset < 0 or offset + n > len(mine):  # never (a flush has every reply), but
                mine = mine[offset : offset + n]  # compiled, an index is not checked
                offset = 0
            for k in range(offset, offset + n):
                if type(mine[k]) is not int:
                    try:
                        result = counts(replies, first, n)
                    except BackendError as exc:
                        result = exc
                    break
            else:  # the INCRBYs'
                result = [mine[k] for k in range(offset, offset + n, 2)]
        if breaker is not None and not waiter.cancelled:
            if failed or type(result) is not list:
                breaker.failed()
            else:
                breaker.failures = 0
        waiter(result)


class Resolver:
    """An instance's `Pool.receiver`: `resolve` with its breaker (looked up per flush: a
    breaker is given to the instance after its pool) and its `_counts`."""

    __slots__ = ("counts", "instance")

    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self.counts = instance._counts

    def __call__(self, replies: Any, entries: list[Any]) -> None:
        """Give the waiters of one flush their counters (`resolve`)."""
        self.resolve(replies, entries)

    def resolve(self, replies: Any, entries: list[Any]) -> None:
        """`__call__`, which `Flush.deliver` calls in C when compiled."""
        resolve(replies, entries, self.instance.breaker, self.counts)


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
            if type(self.receiver) is Resolver:
                resolver = self.receiver
                resolver.resolve(replies, self.entries)
            else:
                self.receiver(replies, self.entries)


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
            if not read_replies(reader, batch.replies, batch.n - len(batch.replies)):
                return  # the rest of this batch has not arrived yet
            pending.popleft()
            conn.in_flight -= batch.n
            fut = batch.future
            if type(fut) is not Flush:
                if not fut.done():
                    fut.set_result(batch.replies)
                continue
            flush = fut
            if flush._done:
                continue
            try:
                flush.deliver(batch.replies)
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
