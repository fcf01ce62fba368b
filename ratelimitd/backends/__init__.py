"""Counter backends behind one declared contract (base.Backend, base.SyncBackend), and their
registry: one module (memory) or package (redis, memcache) per backend, one entry in
`create_backend`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import Backend, BackendError, Op, SyncBackend
from .memory import MemoryBackend

if TYPE_CHECKING:
    from ..health import Health
    from ..settings import Settings
    from ..stats import StatsStore


def create_backend(
    settings: Settings,
    health: Health,
    stats: StatsStore,
    *,
    clock: Callable[[], float] = time.time,
) -> Backend:
    """The backend BACKEND_TYPE names (memory, redis, memcache); `clock` is the memory one's."""
    kind = settings.cache.backend
    if kind == "memory":
        cache = settings.cache
        return MemoryBackend(
            cache.expiration_jitter_max_seconds, clock=clock, max_keys=cache.memory_max_keys
        )
    if kind == "redis":
        from .redis import create_redis_backend

        return create_redis_backend(settings, health, stats)
    if kind == "memcache":
        from .memcache import create_memcache_backend

        return create_memcache_backend(settings, health, stats)
    raise ValueError(f"BACKEND_TYPE: unknown backend {kind!r}")


__all__ = ["Backend", "BackendError", "MemoryBackend", "Op", "SyncBackend", "create_backend"]
