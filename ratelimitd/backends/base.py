"""The backend contract: what the daemon and the limiter call on a counter store.

`Backend` is what every store implements (memory, redis, memcache, and wrappers such as
tracing's): `connect` before serving, `increment` and `get` per request, `close` at
shutdown. `SyncBackend` adds the synchronous fast path of a store that needs no I/O (the
memory backend); the limiter is given one or the other when it is built and never looks for
methods at request time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import msgspec


class BackendError(Exception):
    """Any failure of the counter store; the service fails the request with it."""


class Op(msgspec.Struct, gc=False):
    """One counter operation: INCRBY `key` `hits`, expiring after `seconds` (the unit).

    `get` reads the same ops without adding their hits, so a caller that checks before it
    increments (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) hands the same list to both.
    """

    key: str
    hits: int
    seconds: int


@runtime_checkable
class Backend(Protocol):
    """Fixed-window counters with the semantics of Redis INCRBY + EXPIRE.

    The backend adds its own expiry jitter (EXPIRATION_JITTER_MAX_SECONDS) and routes
    SECOND-unit keys where it must.
    """

    name: str

    async def connect(self) -> None:
        """Start-up: reach the store (with the backend's own retries) before any port opens."""
        ...

    async def increment(self, ops: Sequence[Op]) -> list[int]:
        """INCRBY key hits + EXPIRE key unit+jitter for each op; the counters after."""
        ...

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """Current counter values (0 when absent) of the ops' keys; their hits are ignored."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


@runtime_checkable
class SyncBackend(Backend, Protocol):
    """A backend that can count without awaiting (no I/O): the limiter's fast path.

    `now` is the limiter's clock (Unix seconds), so a whole request sees one instant.
    """

    def increment_now(self, ops: Sequence[Op], now: int) -> list[int]:
        """`increment` at `now`, synchronously."""
        ...

    def increment_one(self, key: str, hits: int, seconds: int, now: int) -> int:
        """`increment_now` of one op given as its fields (no Op built): the counter after."""
        ...
