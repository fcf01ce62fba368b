"""The Redis counter path's codec leaves, the pure-Python twins (`_resp.pyx` is the compiled
one; `resp.py` selects).

Per request, the INCRBY + EXPIRE commands of its ops in one payload (`incrby_expire_ops`),
added to its pool's next flush (`Sender`); per connection, its replies parsed (`Replies`, a
`rounds.Reader`). The connection's round that carries them (`written`, `received`, the
flushes and batches, and `resolve` handing every waiter its counters) is not twinned: it is
`rounds.py`, one source compiled in Cython's pure-Python mode. The rest of RESP (control
commands, scripts, GET) runs once per flush or rarely, and stays in `resp.py`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import hiredis

from ...config.windows import FIXED_WINDOW
from ..base import Op
from .rounds import Reader

__all__ = ["Replies", "Sender", "incrby_expire_ops"]

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


class Replies(Reader):
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
