"""memcached processes (support.memcached) and decision cores on the memcache backend."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.clock import Clock
from support.core import Decider
from support.memcached import Memcached
from support.process import start_bound

from ratelimitd.backends.memcache import MemcacheBackend
from ratelimitd.core import build_core
from ratelimitd.health import Health


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


@pytest.fixture
async def decider() -> AsyncIterator[Callable[..., Any]]:
    """`await decider(servers, config, now=..., **backend_options)`: a core (build_core) on a
    connected MemcacheBackend; closed at teardown."""
    built: list[Decider] = []

    async def build(
        servers: list[str], config: str, now: float = 1_000_000.0, **kwargs: Any
    ) -> Decider:
        health = Health()
        health.register("backend", False)
        backend = MemcacheBackend(servers, health=health, **kwargs)
        await backend.connect()
        clock = Clock(now)
        d = Decider(build_core(backend=backend, health=health, clock=clock), clock)
        backend.stats.register(d.stats)
        d.load(config)
        built.append(d)
        return d

    yield build
    for d in built:
        await d.backend.close()
