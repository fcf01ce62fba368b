"""redis-server processes for the backend's tests, and decision services on the Redis backend.

The servers are support.redis_server's; `redis_server` and `redis_servers` come from the suite's
conftest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from support import free_port
from support.redis_server import RedisServers

from ratelimitd.backends.redis import RedisBackend, create_redis_backend
from ratelimitd.config import ConfigFile, load_ruleset
from ratelimitd.health import Health
from ratelimitd.limiter import Limiter
from ratelimitd.messages import Descriptor, Request, Response
from ratelimitd.service import RateLimitService
from ratelimitd.settings import Settings
from ratelimitd.stats import StatsStore


@pytest.fixture
def servers(redis_servers: RedisServers) -> RedisServers:
    """Start redis-server processes for one test (see support.redis_server.RedisServers)."""
    return redis_servers


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServers]:
    """Start redis-server processes shared by a module's tests (a cluster, say)."""
    started = RedisServers(tmp_path_factory.mktemp("redis"))
    yield started
    started.stop_all()


@pytest.fixture
def unused_port() -> int:
    """A free TCP port."""
    return free_port()


class Decider:
    """A RateLimitService + Limiter over a RedisBackend built from environment settings."""

    def __init__(
        self,
        backend: RedisBackend,
        config: str,
        stats: StatsStore,
        health: Health,
        **limiter: Any,
    ) -> None:
        self.backend = backend
        self.stats = stats
        self.health = health
        self.limiter = Limiter(backend, **limiter)
        self.service = RateLimitService(self.limiter, stats)
        self.service.set_ruleset(load_ruleset([ConfigFile("config.yaml", config)], stats=stats))

    async def decide(self, domain: str, *descriptors: Any, hits_addend: int = 0) -> Response:
        """Decide one request; each descriptor is a list of (key, value) pairs."""
        ds = [Descriptor(tuple(d)) for d in descriptors]
        return await self.service.should_rate_limit(Request(domain, ds, hits_addend))

    def stat(self, name: str) -> float:
        """One statistic by full name (0 when never created)."""
        return self.stats.snapshot().get(name, 0)


@pytest.fixture
async def decider() -> AsyncIterator[Callable[..., Any]]:
    """Build a connected Decider: await decider(env, config_yaml, **limiter_kwargs)."""
    built: list[Decider] = []

    async def build(env: dict[str, str], config: str, **limiter: Any) -> Decider:
        environ = {
            "BACKEND_TYPE": "redis",
            "REDIS_SOCKET_TYPE": "tcp",
            "EXPIRATION_JITTER_MAX_SECONDS": "0",
            "REDIS_POOL_SIZE": "2",
            "REDIS_STARTUP_MAX_ELAPSED_TIME": "5s",
            "REDIS_STARTUP_INITIAL_INTERVAL": "50ms",
            "REDIS_TIMEOUT": "2s",
            # Generous unless a test is about timeouts: the CI machine may be loaded.
            "REDIS_REQUEST_TIMEOUT": "1s",
            **env,
        }
        settings = Settings.from_env(environ)
        stats = StatsStore()
        health = Health()
        backend = create_redis_backend(settings, health, stats)
        d = Decider(
            backend,
            config,
            stats,
            health,
            cache_key_prefix=settings.cache.cache_key_prefix,
            stop_increment_when_over_limit=settings.cache.stop_cache_key_increment_when_overlimit,
            **limiter,
        )
        built.append(d)
        await backend.connect()
        return d

    yield build
    for d in built:
        await d.backend.close()
