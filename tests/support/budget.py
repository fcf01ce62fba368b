"""Budget stores for tests and benchmarks: the memory twin, and the Redis one on a real
redis-server (single or cluster) through the backend's own instance and pipeline."""

from __future__ import annotations

from ratelimitd.backends.redis import RedisBackend
from ratelimitd.backends.redis.budget import RedisBudgets
from ratelimitd.settings import RedisSettings


async def redis_budgets(
    address: str, *, cluster: bool = False, pool_size: int = 2
) -> tuple[RedisBackend, RedisBudgets]:
    """A connected Redis backend on `address` (host:port, or the nodes of a cluster,
    comma-separated) and budgets on its main instance; close the backend when done."""
    backend = RedisBackend(
        RedisSettings(
            type="cluster" if cluster else "single",
            socket_type="tcp",
            url=address,
            pool_size=pool_size,
            startup_max_elapsed_time=5.0,
            startup_initial_interval=0.05,
            request_timeout=2.0,
        )
    )
    await backend.connect()
    return backend, RedisBudgets(backend.main)
