"""The backend contract: what the daemon and the limiter call on a counter store, and what
a store declares it can do.

`Backend` is what every store implements (memory, redis, memcache, and wrappers such as
tracing's): `connect` before serving, `increment` and `get` per request, `peek` for a dry
run, `delete` for an admin's reset, `close` at shutdown; and `capabilities`, its
declaration (`Capabilities`), which the config load, the settings checks and the core read
instead of the store's name. `SyncBackend` adds the synchronous fast path of a store that
needs no I/O (the memory backend); `PipelinedBackend` the callback path of one that does
(Redis: a request's round started without a coroutine, its results handed to a `Waiter`).
The limiter and the service are given one or the other when they are built and never look
for methods at request time.

This module imports nothing of ratelimitd at run time: the settings read the declarations
(through the registry, `backends/__init__.py`) without importing any store.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from ..config.windows import FIXED_WINDOW, ONLY_FIXED_WINDOW
from ..runtime.tlsfiles import unreadable

if TYPE_CHECKING:
    from ..settings import MemcacheSettings, RedisSettings


class BackendError(Exception):
    """Any failure of the counter store; the service fails the request with it."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a counter store can do, declared once by each backend (its registry entry).

    The config refuses a limit whose `algorithm` is not in `algorithms` (at load, never at
    request time); the settings refuse what would be accepted and do nothing with it
    (BACKEND_FAILURE_POLICY and BACKEND_BREAKER_* need a store that `raises`, breakers one
    with `breakers`, MAX_INFLIGHT_DECISIONS one that `waits`), and check the sections of
    settings it reads (`sections`); the core and the CLI read the rest.
    """

    # The config's algorithm ids it counts exactly (config/windows.py).
    algorithms: frozenset[int] = ONLY_FIXED_WINDOW
    # The algorithm ids whose limits it keeps token budgets for (`budget:`, its Op.budget
    # calls): reserve, settle, release, each one atomic call on the budget's keys.
    budgets: frozenset[int] = frozenset()
    # Why the failure settings do not apply to it, when it never fails or fails open (their
    # message); empty when a failure reaches the service as BackendError.
    no_failures: str = ""
    breakers: bool = False  # a circuit breaker per instance (BACKEND_BREAKER_*)
    waits: bool = True  # a decision waits for I/O (MAX_INFLIGHT_DECISIONS bounds them)
    shared: bool = True  # processes share its counters (RATELIMITD_WORKERS)
    refunds: bool = True  # takes hits back (is_negative_hits)
    delete: bool = True  # deletes counters (the admin's reset)
    # Reads the counters before it counts (so STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, as
    # the reference's memcache, changes nothing).
    reads_before_counting: bool = False
    # The sections of Settings it reads: their cross-checks run when it is selected.
    sections: tuple[str, ...] = ()
    # The name of a traced round trip's span (TRACING_ENABLED).
    span: str = "Pipeline Execution"

    @property
    def raises(self) -> bool:
        """A failure reaches the service as BackendError (the failure settings apply)."""
        return not self.no_failures


def client_ssl_context(s: RedisSettings | MemcacheSettings, prefix: str) -> ssl.SSLContext:
    """A store's client TLS from its `<prefix>TLS_*` files: its CA (else the system's),
    client certificate, name check.

    A file that cannot be used stops start-up with one line naming the variable and the
    file, as in the reference (its TlsConfigFromFiles panics). A certificate without its
    key (or the reverse) is refused too, where the reference silently connects without a
    client certificate.
    """
    cert, key, ca = s.tls_client_cert, s.tls_client_key, s.tls_cacert
    if bool(cert) != bool(key):
        raise BackendError(
            f"{prefix}TLS_CLIENT_CERT and {prefix}TLS_CLIENT_KEY must be set together"
        )
    files = (("TLS_CACERT", ca), ("TLS_CLIENT_CERT", cert), ("TLS_CLIENT_KEY", key))
    problem = unreadable((prefix + name, path) for name, path in files)
    if problem:
        raise BackendError(problem)
    try:
        ctx = ssl.create_default_context(cafile=ca or None)
    except ssl.SSLError as err:
        raise BackendError(
            f"{prefix}TLS_CACERT: no CA certificate in {ca}: {err.reason or err}"
        ) from None
    try:
        if cert:
            ctx.load_cert_chain(cert, key)
    except ssl.SSLError as err:
        raise BackendError(
            f"{prefix}TLS_CLIENT_CERT, {prefix}TLS_CLIENT_KEY: cannot load the key pair "
            f"({cert}, {key}): {err.reason or err}"
        ) from None
    if s.tls_skip_hostname_verification:
        # As the reference: the chain is still verified, only the name is not.
        ctx.check_hostname = False
    return ctx


class Op(msgspec.Struct, gc=False):
    """One counter operation: INCRBY `key` `hits`, expiring after `seconds` (the window).

    `get` reads the same ops without adding their hits, so a caller that checks before it
    increments (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) hands the same list to both.

    The fields after `seconds` are the extension's (docs/algorithms.md). `limit` is the
    window's requests_per_unit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT's check reads it);
    `algorithm` the config's id (config/windows.py). `per_second`
    routes the op to REDIS_PERSECOND's instance (a SECOND-unit limit, of any multiplier;
    a bare `Op(key, hits, 1)` is routed there too). With `algorithm` SLIDING_WINDOW or
    TOKEN_BUCKET the store decides atomically, with the maths of `keys.sliding_window` /
    `keys.token_bucket` at `now` (ticks of `tick` ms; windows of `seconds`), and counts the
    hits only if they are admitted; its result is `(level after, ticks until reset)`
    instead of a counter, and `get` gives the level without counting.

    `refund` (a descriptor's is_negative_hits; fixed windows only) takes `hits` back: the
    counter is decremented, floored at 0, atomically, and its TTL set again to `seconds`
    (+ jitter) as an increment sets it; an absent counter is not created (the result is 0).
    The result is the counter after. A refund op is never handed to `get`.

    `budget` (a `config.budget_store.Call`; a store whose capabilities name `budgets`) makes the op
    one token-budget call on the budget's keys (`key` is its state key), applied atomically;
    its result is the call's `config.budget_store.Result`. It is never handed to `get`; `peek`
    runs it on a copy of the budget (`MemoryBudgets.dry_run`), its Result with `held`.
    """

    key: str
    hits: int
    seconds: int
    per_second: bool = False
    algorithm: int = FIXED_WINDOW
    limit: int = 0
    tick: int = 1
    now: int = 0
    refund: bool = False
    budget: Any = None


@runtime_checkable
class Backend(Protocol):
    """Fixed-window counters with the semantics of Redis INCRBY + EXPIRE.

    The backend adds its own expiry jitter (EXPIRATION_JITTER_MAX_SECONDS) and routes
    SECOND-unit keys where it must.
    """

    name: str  # BACKEND_TYPE's name for it (logs)
    capabilities: Capabilities

    async def connect(self) -> None:
        """Start-up: reach the store (with the backend's own retries) before any port opens."""
        ...

    async def increment(self, ops: Sequence[Op]) -> list[Any]:
        """INCRBY key hits + EXPIRE key unit+jitter for each op; the counters after (a
        `(level, ticks until reset)` pair for a sliding-window or token-bucket op)."""
        ...

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """Current counter values (0 when absent) of the ops' keys; their hits are ignored."""
        ...

    async def peek(self, ops: Sequence[Op]) -> list[Any]:
        """What `increment(ops)` would return now, writing nothing (a dry run: `/explain`)."""
        ...

    async def delete(self, keys: Sequence[str]) -> int:
        """Remove counters (an admin's reset, never a decision); how many existed."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class PassThrough:
    """A Backend that hands every call to the store it wraps (`.backend`).

    The base of wrappers that change one or two calls and keep the rest of the contract
    as the store has it: tracing's spans around `increment` and `get`, the tests' doubles
    of a failing or stuck store. A subclass sets `name` and `capabilities` (its own, or the
    wrapped store's).
    """

    name: str
    capabilities: Capabilities

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def connect(self) -> None:
        """Connect the wrapped store."""
        await self.backend.connect()

    async def increment(self, ops: Sequence[Op]) -> list[Any]:
        """The wrapped store's increment."""
        return await self.backend.increment(ops)

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """The wrapped store's get."""
        return await self.backend.get(ops)

    async def peek(self, ops: Sequence[Op]) -> list[Any]:
        """The wrapped store's dry run."""
        return await self.backend.peek(ops)

    async def delete(self, keys: Sequence[str]) -> int:
        """The wrapped store's delete."""
        return await self.backend.delete(keys)

    async def close(self) -> None:
        """Close the wrapped store."""
        await self.backend.close()


def counted_by(backend: Backend) -> tuple[str, frozenset[int], frozenset[int]]:
    """What the config load checks limits against: the store's name (for the message), the
    algorithms it declares it counts exactly and those it keeps budgets for."""
    caps = backend.capabilities
    return backend.name, caps.algorithms, caps.budgets


@runtime_checkable
class SyncBackend(Backend, Protocol):
    """A backend that can count without awaiting (no I/O): the limiter's fast path.

    `now` is the limiter's clock (Unix seconds), so a whole request sees one instant.
    """

    def increment_now(self, ops: Sequence[Op], now: int) -> list[Any]:
        """`increment` at `now`, synchronously."""
        ...

    def increment_one(self, key: str, hits: int, seconds: int, now: int) -> int:
        """`increment_now` of one op given as its fields (no Op built): the counter after."""
        ...

    def decide_now(
        self,
        key: str,
        algorithm: int,
        hits: int,
        window: int,
        limit: int,
        tick: int,
        now_ticks: int,
        now: int,
    ) -> tuple[int, int]:
        """`increment_now` of one sliding-window or token-bucket op given as its fields
        (window and time in ticks): (level after, ticks until reset)."""
        ...

    def budget_now(self, call: Any) -> Any:
        """`increment_now` of one budget call (`budget_store.Call`, no Op built): its
        `budget_store.Result`."""
        ...


@runtime_checkable
class Waiter(Protocol):
    """Who waits for the results of `PipelinedBackend.increment_later`."""

    # The result is no longer wanted (its client left or its deadline passed): it is still
    # delivered, but the store does not count it for or against its health (a circuit
    # breaker's verdict), as a cancelled `increment` is counted neither way.
    cancelled: bool

    def __call__(self, results: Any) -> None:
        """The list `increment` returns, or the exception it raises."""
        ...


@runtime_checkable
class PipelinedBackend(Backend, Protocol):
    """A backend that can start a round without a coroutine: the service's callback path
    for stores that wait for I/O (no task and no coroutine chain per request; the waiters
    of one pipelined round are resolved together when its replies arrive)."""

    def increment_later(self, ops: Sequence[Op], waiter: Waiter) -> bool:
        """Start `increment(ops)`: True, and `waiter(results)` is called once, from the
        event loop and never from within this call, with what `increment` would return
        (or the BackendError it would raise). False when the store cannot for these ops
        now (nothing was started: await `increment` instead). Raises BackendError when the
        round cannot start (nothing was sent), as `increment` would."""
        ...
