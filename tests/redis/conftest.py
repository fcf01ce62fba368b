"""redis-server processes for the backend's tests, and decision cores on the Redis backend.

The servers are support.redis_server's; `redis_server` comes from the suite's conftest. Here
every server is started on each store of `STORES` (Redis, Valkey): the backend's tests run
on both, standalone, sentinel and cluster alike.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import free_port
from support.core import Decider
from support.redis_server import STORES, RedisServer, RedisServers

from ratelimitd.backends import load_settings
from ratelimitd.core import build_core


@pytest.fixture(scope="module", params=STORES)
def store(request: pytest.FixtureRequest) -> str:
    """The store every server of a test runs (see support.redis_server.STORES)."""
    return str(request.param)


@pytest.fixture
def redis_servers(tmp_path: Path, store: str) -> Iterator[RedisServers]:
    """The suite's `redis_servers`, on `store`."""
    started = RedisServers(tmp_path / "redis", store)
    yield started
    started.stop_all()


@pytest.fixture
def servers(redis_servers: RedisServers) -> RedisServers:
    """Start redis-server processes for one test (see support.redis_server.RedisServers)."""
    return redis_servers


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory, store: str) -> Iterator[RedisServers]:
    """Start redis-server processes shared by a module's tests (a cluster, say)."""
    started = RedisServers(tmp_path_factory.mktemp("redis"), store)
    yield started
    started.stop_all()


@pytest.fixture
def unused_port() -> int:
    """A free TCP port."""
    return free_port()


@pytest.fixture
async def decider() -> AsyncIterator[Callable[..., Any]]:
    """A connected core on the Redis backend the settings name (build_core, as the daemon
    builds it): await decider(env, config_yaml, clock=...); closed at teardown."""
    built: list[Decider] = []

    async def build(
        env: dict[str, str], config: str, clock: Callable[[], float] = time.time
    ) -> Decider:
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
        d = Decider(build_core(load_settings(environ), clock=clock), clock)
        d.load(config)
        built.append(d)
        await d.backend.connect()
        return d

    yield build
    for d in built:
        await d.backend.close()


@pytest.fixture
def one_server(
    servers: RedisServers, decider: Callable[..., Any]
) -> Callable[..., Awaitable[tuple[RedisServer, Decider]]]:
    """`server, d = await one_server(config_yaml, **env)`: a new redis-server and a connected
    core on it (`decider` with REDIS_URL its address and the variables `env`)."""

    async def start(config: str, **env: str) -> tuple[RedisServer, Decider]:
        server = servers()
        return server, await decider({"REDIS_URL": server.address, **env}, config)

    return start
