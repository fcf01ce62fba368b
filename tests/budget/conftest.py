"""Budget stores for the primitive tests: the memory twin and Redis (a real redis-server),
through one interface, `await store.run([call, ...])`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.budget import redis_budgets
from support.redis_server import RedisServers

from ratelimitd.backends.memory_budget import MemoryBudgets


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_servers: RedisServers) -> AsyncIterator[Any]:
    """Each primitive test runs on the memory twin and on a real redis-server."""
    if request.param == "memory":
        yield MemoryBudgets()
        return
    server = redis_servers()
    backend, budgets = await redis_budgets(server.address)
    budgets.server = server  # type: ignore[attr-defined] - for tests that read the keys
    yield budgets
    await backend.close()
