"""The Redis backend: fixed-window counters as INCRBY + EXPIRE, auto-pipelined.

Per request (as the reference's `src/redis/fixed_cache_impl.go`) every key gets `INCRBY key
hits` then `EXPIRE key unit + rand[0, EXPIRATION_JITTER_MAX_SECONDS)`, one pipeline for the
main instance and, with REDIS_PERSECOND, one for the per-second instance (SECOND keys), awaited
main first. No MULTI and no Lua, as the reference.

Hot path. Commands are RESP-encoded by `resp` into one bytes object per request and
handed to a `_Pool`. The pool buffers the payloads of every request of one event-loop
iteration and writes them with a single `transport.write` on one connection (a flush):
`loop.call_soon` with REDIS_PIPELINE_WINDOW = 0, `loop.call_later(window)` otherwise,
and at once when REDIS_PIPELINE_LIMIT commands are buffered. Flushes, not requests, are
spread round-robin over the REDIS_POOL_SIZE connections: a request's commands stay on
one connection in order, and under load one write carries many decisions (fewer round
trips and syscalls than one connection per request would give).

Timeouts. A request never waits longer than REDIS_REQUEST_TIMEOUT (default 50 ms) for
one round of replies (a request has one round, two with STOP_CACHE_KEY_INCREMENT_WHEN_
OVERLIMIT or with keys on both instances), even when Redis hangs. Why 50 ms: Envoy's
rate-limit filter gives up after 20 ms by default (then `failure_mode_deny` decides), so
a later answer is wasted on a default Envoy; but a timeout here is not free, because
replies are positional and the connection must be closed and replaced, so it must not
fire on ordinary jitter (a GC pause, a loaded loopback, a slow fork for BGSAVE). 50 ms
is Envoy's budget plus that margin and covers fleets that raise Envoy's timeout; behind
a hung Redis it bounds the pile-up to 50 ms of traffic. Operators of default Envoys may
set 20ms. When it expires the connection is presumed hung: its pending requests fail, it
is closed and replaced in the background. Each connection also bounds its in-flight
commands (`max_in_flight`, and no flush is larger); beyond it, and while no connection
is up, requests fail at once with BackendError. Reconnection runs in a background task
with capped exponential backoff and jitter; no request ever waits on it.

Topologies: single (tcp `host:port`, unix path, `redis://`, `rediss://`, `unix://`
URLs), sentinel (`master,host:port,...`; the master is asked of the sentinels on every
(re)connect; a `+switch-master` announcement on a subscription to one of the sentinels, a
READONLY reply or a lost connection triggers the rediscovery; sentinels are dialled with
the instance's TLS settings and REDIS_SENTINEL_AUTH), and cluster (`host:port,...`; slot
map from CLUSTER SLOTS, CRC16 slots with `{hashtag}`, a request's commands grouped per node
into one pipeline each, REDIS_CLUSTER_PIPELINE_PARALLELISM of them in flight at once (1,
the default, one after another; 0 all), MOVED and ASK followed, the map refreshed in the
background on MOVED). With REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR=true a READONLY reply
(a demoted master behind a re-pointed address) drops the pool's connections, which re-dial.

Passwords never reach a log line or an error message: addresses are shown through
`RedisSettings.masked_url`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...config.budget_store import MAX_BUDGET_TXNS
from ...settings import RedisSettings
from .. import REDIS
from ..base import BackendError, Op, Waiter
from ..breaker import CLOSED, Breaker, add_breaker_stats, breaker_args
from ..memory import simulate
from . import budget
from .cluster import ClusterInstance
from .instances import RedisInstance, SingleInstance, go_duration, key_slot
from .pool import MAX_IN_FLIGHT

if TYPE_CHECKING:
    from ...health import Health
    from ...settings import Settings
    from ...stats import StatsStore

__all__ = ["RedisBackend", "create_redis_backend", "go_duration", "key_slot"]


class RedisBackend:
    """The Backend protocol over a main and an optional per-second Redis instance."""

    name = "redis"
    capabilities = REDIS

    def __init__(
        self,
        main: RedisSettings,
        per_second: RedisSettings | None = None,
        *,
        jitter_max_seconds: int = 0,
        health: Health | None = None,
        stats: StatsStore | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        breaker: tuple[int, float] | None = None,
        budget_max_transactions: int = MAX_BUDGET_TXNS,
    ) -> None:
        self.health = health
        # REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: the per-second instance shares the main one's.
        self.health_check = main.health_check_active_connection
        self.connected = False
        changed = self._connections_changed
        self.main = instance(main, jitter_max_seconds, changed, max_in_flight)
        self.per_second = (
            instance(per_second, jitter_max_seconds, changed, max_in_flight)
            if per_second is not None
            else None
        )
        for inst in (self.main, self.per_second):
            if inst is not None:
                inst.budget_max_transactions = budget_max_transactions
        # BACKEND_BREAKER_*: (failures, probe interval) gives each instance its own breaker;
        # the routing below calls the instances through `_main` / `_second`.
        self._breakers: list[Breaker] = []
        self._main: Any = self.main
        self._second: Any = self.per_second
        if breaker is not None:
            self._main = _Guarded(self.main, "redis", breaker)
            self._breakers.append(self._main.breaker)
            if self.per_second is not None:
                self._second = _Guarded(self.per_second, "redis_per_second", breaker)
                self._breakers.append(self._second.breaker)
        if self.per_second is None:
            # The hot path without a routing frame: one coroutine per request, not two;
            # and the callback path straight to the instance (or its breaker).
            self.increment = self._main.incr_expire  # type: ignore[method-assign]
            self.increment_later = self._main.increment_later  # type: ignore[method-assign]
        if health is not None and "backend" not in health.components():
            health.register("backend", False)
        if stats is not None:
            labels = ("redis_pool", "redis_per_second_pool")
            for label, inst in zip(labels, self.instances(), strict=False):
                c = inst.counters
                scope = f"ratelimit.{label}."
                stats.add_gauge(scope + "cx_active", lambda c=c: c.active)  # type: ignore[misc]
                stats.add_gauge(scope + "cx_total", lambda c=c: c.total)  # type: ignore[misc]
                stats.add_gauge(scope + "cx_local_close", lambda c=c: c.local_close)  # type: ignore[misc]
                # Extension: pipelined flushes so far, i.e. Redis round trips (writes).
                stats.add_gauge(scope + "pipeline_writes", lambda i=inst: i.writes)  # type: ignore[misc]
            for label, b in zip(labels, self._breakers, strict=False):
                add_breaker_stats(stats, f"ratelimit.{label}.", b)

    def breakers(self) -> list[Breaker]:
        """The instances' breakers (none without BACKEND_BREAKER_FAILURES)."""
        return self._breakers

    def instances(self) -> list[RedisInstance]:
        """The main instance, then the per-second one when configured."""
        return [self.main] if self.per_second is None else [self.main, self.per_second]

    @property
    def writes(self) -> int:
        """Pipelined flushes (Redis round trips) of all instances so far."""
        return sum(i.writes for i in self.instances())

    def _connections_changed(self) -> None:
        if self.health is not None and self.health_check and self.connected:
            self.health.set("backend", all(i.counters.active > 0 for i in self.instances()))

    async def connect(self) -> None:
        """Startup: connect + PING every instance with retry; then report healthy.

        Raises BackendError `timed out waiting for Redis connection to <url> after <d>:
        <err>` once REDIS_STARTUP_MAX_ELAPSED_TIME (0 = forever) has passed.
        """
        for inst in self.instances():
            await inst.start()
            await inst.warm()
        self.connected = True
        if self.health is not None:
            self.health.set("backend", True)
        self._connections_changed()

    async def increment(self, ops: Sequence[Op]) -> list[Any]:
        """INCRBY key hits + EXPIRE key unit+jitter per op (a script call for a sliding
        window or token bucket); main first, then per-second (SECOND-unit limits)."""
        if self._second is None:
            return await self._main.incr_expire(ops)
        return await self._routed(ops, "incr_expire")

    def increment_later(self, ops: Sequence[Op], waiter: Waiter) -> bool:
        """`increment` without a coroutine (`PipelinedBackend`), on a main instance alone
        (with REDIS_PERSECOND the per-second round waits for the main one's: False)."""
        return False

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """GET per key (0 when absent), routed as `increment` routes; the level of a
        sliding window or token bucket, counting nothing."""
        return await self._routed(ops, "levels")

    async def peek(self, ops: Sequence[Op]) -> list[Any]:
        """What `increment` would return: the keys' states read (one round per instance,
        routed as `increment` routes) and counted on a scratch memory store, whose maths
        are the scripts' (`keys.sliding_window`, `keys.token_bucket`); budget calls alike,
        on their budgets read in one more round (`budget.dry_run`)."""
        calls = [j for j, op in enumerate(ops) if op.budget is not None]
        if calls:
            plain = [op for op in ops if op.budget is None]
            out = await self.peek(plain) if plain else []
            results = await budget.dry_run(self.main, [ops[j].budget for j in calls])
            for j, result in zip(calls, results, strict=True):
                out.insert(j, result)
            return out
        states = await self._routed(ops, "states")
        return simulate(ops, states, int(time.time()))

    async def _routed(self, ops: Sequence[Op], call: str) -> list[Any]:
        """`call` of each instance on its ops (SECOND-unit ones on REDIS_PERSECOND's), main
        first; the results in op order."""
        second = self._second
        if second is None:
            return await getattr(self._main, call)(ops)  # type: ignore[no-any-return]
        out: list[Any] = [0] * len(ops)
        main_idx = [j for j, op in enumerate(ops) if not (op.per_second or op.seconds == 1)]
        second_idx = [j for j, op in enumerate(ops) if op.per_second or op.seconds == 1]
        for inst, idx in ((self._main, main_idx), (second, second_idx)):
            if idx:
                values = await getattr(inst, call)([ops[j] for j in idx])
                for j, value in zip(idx, values, strict=True):
                    out[j] = value
        return out

    async def delete(self, keys: Sequence[str]) -> int:
        """DEL each key on every instance (a key's instance depends on its limit's unit,
        which a key alone does not say; DEL is harmless where it is absent)."""
        found = 0
        for inst in self.instances():
            found += await inst.delete(keys)
        return found

    async def close(self) -> None:
        """Close every connection; later requests fail with BackendError."""
        for inst in self.instances():
            await inst.close()


class _Guarded:
    """An instance's entry points through its breaker (the routing's view of it)."""

    def __init__(self, inst: RedisInstance, name: str, breaker: tuple[int, float]) -> None:
        self.inst = inst
        self.breaker = inst.breaker = Breaker(name, *breaker, before_probe=inst.dial_if_down)

    def increment_later(self, ops: Sequence[Op], waiter: Waiter) -> bool:
        """The instance's callback path while the breaker is closed (the instance counts
        its calls); an open or probing breaker takes the awaited path (False)."""
        breaker = self.breaker
        if breaker.state != CLOSED:
            return False
        try:
            return self.inst.increment_later(ops, waiter)
        except BackendError:
            breaker.failed()
            raise

    async def incr_expire(self, ops: Sequence[Op]) -> list[Any]:
        return await self.breaker.call(self.inst.incr_expire, ops)  # type: ignore[no-any-return]

    async def levels(self, ops: Sequence[Op]) -> list[Any]:
        return await self.breaker.call(self.inst.levels, ops)  # type: ignore[no-any-return]

    async def states(self, ops: Sequence[Op]) -> list[Any]:
        return await self.breaker.call(self.inst.states, ops)  # type: ignore[no-any-return]


def instance(
    s: RedisSettings, jitter: int, on_change: Callable[[], None], max_in_flight: int
) -> RedisInstance:
    """The instance REDIS_TYPE names: a cluster, or a single server / sentinel master."""
    if s.type == "cluster":
        return ClusterInstance(s, jitter, on_change, max_in_flight)
    return SingleInstance(s, jitter, on_change, max_in_flight)


def create_redis_backend(
    settings: Settings, health: Health | None = None, stats: StatsStore | None = None, *_: object
) -> RedisBackend:
    """The registry factory: a RedisBackend from Settings (await `connect()` before serving).

    Must be called with a running event loop (the pools bind to it).
    """
    return RedisBackend(
        settings.redis,
        settings.redis_persecond,
        jitter_max_seconds=settings.cache.expiration_jitter_max_seconds,
        health=health,
        stats=stats,
        breaker=breaker_args(settings.cache),
        budget_max_transactions=settings.cache.budget_max_transactions,
    )
