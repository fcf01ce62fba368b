"""Budget stores for the primitive tests: the memory twin and Redis (a real redis-server),
through one interface, `await store.run([call, ...])`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.budget import Scripted, redis_budgets, uncompiled_memory
from support.redis_server import RedisServers

from ratelimitd.backends.memory_budget import MemoryBudgets


@pytest.fixture(params=["memory", "memory-source", "redis", "redis-script"])
async def store(request: pytest.FixtureRequest, redis_servers: RedisServers) -> AsyncIterator[Any]:
    """Each primitive test runs on the memory twin (compiled, and its source uncompiled) and
    on a real redis-server: as the backend keeps budgets (fixed windows in plain commands,
    the others by the script), and by the script alone (as it keeps a budget with an
    outbox)."""
    if request.param == "memory":
        yield MemoryBudgets()
        return
    if request.param == "memory-source":
        yield uncompiled_memory().MemoryBudgets()
        return
    server = redis_servers()
    backend, budgets = await redis_budgets(server.address)
    if request.param == "redis-script":
        budgets = Scripted(budgets)
    budgets.server = server  # type: ignore[attr-defined] - for tests that read the keys
    yield budgets
    await backend.close()
