"""`build_core`: the decision core (stats, backend, local cache, limiter, service) from settings.

The daemon, the tests and the benchmarks build the core with this one factory; the daemon
adds the transports, the config reloader and the stats sink around it (`daemon.build`).
Which implementation of the compiled modules runs is an argument (`impl`: "compiled",
"pure", or None for the one `keys` / `match` selected at import), never a patched global:

    core = build_core(backend=MemoryBackend(), impl="pure")
    core.load([ConfigFile("c.yaml", text)])
    response = await core.service.should_rate_limit(request)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .backends import create_backend
from .backends.base import Backend, counted_by
from .backends.breaker import WithBreakers
from .backends.memory import create_memory_backend
from .backends.traced import TracedBackend
from .config import ConfigFile, RuleSet, load_ruleset, match
from .health import Health
from .limiter import Limiter
from .localcache import LocalCache, reference_capacity
from .service import RateLimitService
from .settings import CacheSettings, Settings
from .stats import StatsStore

if TYPE_CHECKING:
    from .stats.tracing import Tracing


@dataclass(frozen=True, slots=True)
class Core:
    """A decision service and what it is made of."""

    settings: Settings
    stats: StatsStore
    health: Health
    backend: Backend
    local_cache: LocalCache | None
    limiter: Limiter
    service: RateLimitService
    # "compiled" or "pure" as asked, None for the modules selected at import.
    impl: str | None = None

    def load(self, files: Iterable[ConfigFile], *, merge_domains: bool = False) -> RuleSet:
        """Validate and compile configs (this core's stats and implementation), put them
        in force, and return them. Raises ConfigError."""
        ruleset = load_ruleset(
            files,
            merge_domains=merge_domains,
            stats=self.stats,
            matcher=match.implementation(self.impl),
            backend=counted_by(self.backend),
        )
        self.limiter.check(ruleset)
        self.service.set_ruleset(ruleset)
        return ruleset


def build_core(
    settings: Settings | None = None,
    *,
    backend: Backend | None = None,
    stats: StatsStore | None = None,
    health: Health | None = None,
    clock: Callable[[], float] = time.time,
    impl: str | None = None,
    tracing: Tracing | None = None,
) -> Core:
    """Wire the decision core; no I/O (a network backend connects in `backend.connect()`).

    `backend` replaces the one the settings name (a test's own store); `settings` defaults
    to the defaults with the memory backend. With `tracing`, backend round trips are spans
    and the limiter takes the async path (one `increment` is one span).
    """
    if settings is None:
        settings = Settings(cache=CacheSettings(backend="memory"))
    stats = stats if stats is not None else StatsStore()
    health = health if health is not None else Health()
    if backend is None:
        backend = create_backend(settings, health, stats, clock=clock)
    if isinstance(backend, WithBreakers) and backend.breakers():
        breakers = backend.breakers()
        health.add_detail("breakers", lambda: {b.name: b.state_name for b in breakers})
    if tracing is not None:
        backend = TracedBackend(backend, tracing.tracer)
    cache = settings.cache
    local_cache = None
    if cache.local_cache_size_in_bytes:
        local_cache = LocalCache(reference_capacity(cache.local_cache_size_in_bytes))
        for gauge in local_cache.gauges():
            stats.add_gauge(f"ratelimit.localcache.{gauge}", _gauge_reader(local_cache, gauge))
    limiter = Limiter(
        backend,
        near_limit_ratio=cache.near_limit_ratio,
        prefix=cache.cache_key_prefix,
        local_cache=local_cache,
        # A store that reads its counters before it counts them (memcache) ignores it, as
        # the reference's memcache cache does.
        stop_increment=cache.stop_cache_key_increment_when_overlimit
        and not backend.capabilities.reads_before_counting,
        clock=clock,
        impl=impl,
    )
    fallback = None
    if cache.failure_policy == "local":
        # The same rules counted in this process while the store fails (per instance).
        fallback = Limiter(
            create_memory_backend(settings, clock=clock),
            near_limit_ratio=cache.near_limit_ratio,
            prefix=cache.cache_key_prefix,
            clock=clock,
            impl=impl,
        )
    service = RateLimitService(
        limiter,
        stats,
        settings.reload,
        clock=clock,
        impl=impl,
        failure_policy=cache.failure_policy,
        fallback=fallback,
        max_in_flight=cache.max_in_flight,
    )
    return Core(settings, stats, health, backend, local_cache, limiter, service, impl)


def _gauge_reader(cache: LocalCache, name: str) -> Callable[[], float]:
    return lambda: cache.gauges()[name]
