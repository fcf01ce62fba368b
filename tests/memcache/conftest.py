"""memcached processes (support.memcached) and decision services on the memcache backend."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.memcached import Memcached
from support.process import start_bound

from ratelimitd.backends.memcache import MemcacheBackend
from ratelimitd.config import ConfigFile, load_ruleset
from ratelimitd.health import Health
from ratelimitd.limiter import Limiter
from ratelimitd.messages import Descriptor, Request, Response
from ratelimitd.service import RateLimitService
from ratelimitd.stats import StatsStore


@pytest.fixture
def memcached(tmp_path: Path) -> Iterator[Callable[..., Memcached]]:
    """Start memcached processes with `memcached(*extra_args, tls=None)`; stopped at teardown."""
    started: list[Memcached] = []

    def start(*extra: str, tls: ssl.SSLContext | None = None) -> Memcached:
        def spawn() -> Memcached:
            started.append(Memcached(tmp_path, *extra, tls=tls))
            return started[-1]

        return start_bound(spawn)

    yield start
    for m in started:
        m.close()


class Decider:
    """A RateLimitService + Limiter on a MemcacheBackend, as the daemon builds them."""

    def __init__(self, backend: MemcacheBackend, config: str, clock: Callable[[], float]) -> None:
        self.backend = backend
        self.stats = StatsStore()
        self.health = backend.health
        backend.stats.register(self.stats)
        self.limiter = Limiter(backend, clock=clock)
        self.service = RateLimitService(self.limiter, self.stats, clock=clock)
        self.service.set_ruleset(
            load_ruleset([ConfigFile("config.yaml", config)], stats=self.stats)
        )

    async def decide(self, domain: str, *descriptors: list[tuple[str, str]]) -> Response:
        """One decision; each descriptor is a list of (key, value) pairs."""
        request = Request(domain, [Descriptor(tuple(d)) for d in descriptors], 0)
        return await self.service.should_rate_limit(request)

    def stat(self, name: str) -> float:
        """One statistic by full name (0 when absent)."""
        return self.stats.snapshot().get(name, 0)


@pytest.fixture
async def decider() -> AsyncIterator[Callable[..., Any]]:
    """`await decider(servers, config, now=...)`: a connected Decider; closed at teardown."""
    built: list[Decider] = []

    async def build(
        servers: list[str], config: str, now: float = 1_000_000.0, **kwargs: Any
    ) -> Decider:
        health = Health()
        health.register("backend", False)
        backend = MemcacheBackend(servers, health=health, **kwargs)
        await backend.connect()
        d = Decider(backend, config, lambda: now)
        built.append(d)
        return d

    yield build
    for d in built:
        await d.backend.close()
