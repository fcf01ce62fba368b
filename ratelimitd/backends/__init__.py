"""Counter backends behind one small async protocol (see base.Backend), and their registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Backend, BackendError
from .memory import MemoryBackend

if TYPE_CHECKING:
    from ..health import Health
    from ..settings import Settings
    from ..stats import StatsStore


def create_backend(settings: Settings, health: Health, stats: StatsStore) -> Backend:
    """The backend BACKEND_TYPE names (memory, redis, memcache)."""
    kind = settings.cache.backend
    if kind == "memory":
        return MemoryBackend(settings.cache.expiration_jitter_max_seconds)
    if kind == "redis":
        from .redis import create_redis_backend

        return create_redis_backend(settings, health, stats)
    if kind == "memcache":
        from .memcache import create_memcache_backend

        return create_memcache_backend(settings, health, stats)
    raise ValueError(f"BACKEND_TYPE: unknown backend {kind!r}")


__all__ = ["Backend", "BackendError", "MemoryBackend", "create_backend"]
