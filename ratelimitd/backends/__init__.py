"""Counter backends behind one declared contract (`base.Backend`, `base.SyncBackend`,
`base.Capabilities`), and their registry.

A backend is one module (memory) or package (redis, memcache) and one line of `BACKENDS`:
its BACKEND_TYPE name, its declared capabilities, and its factory, imported only when that
backend is built. The config load (which algorithms), the core and the CLI read the
registry, never a backend's name. The settings import no backend: `load_settings` composes
them with the registry (which BACKEND_TYPE names exist, which settings apply), as the
reference's runner picks the cache for the settings it read. Importing this package imports
no store.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config.windows import ALL_ALGORITHMS, FIXED_WINDOW, SLIDING_WINDOW
from ..settings import Settings, backend_type_from_env, settings_from_env
from .base import Backend, BackendError, Capabilities, Op, SyncBackend

if TYPE_CHECKING:
    from ..health import Health
    from ..stats import StatsStore

    # `factory(settings, health, stats, clock)`: the clock is the memory store's.
    Factory = Callable[[Settings, Health, StatsStore, Callable[[], float]], Backend]

_ALL = ALL_ALGORITHMS
_WINDOWS = frozenset({FIXED_WINDOW, SLIDING_WINDOW})  # the windows a budget holds reservations in


@dataclass(frozen=True, slots=True)
class Registered:
    """One backend: its declaration, and its factory as `module:function` (imported when
    it is built) or as the function itself."""

    capabilities: Capabilities
    factory: str | Callable[..., Backend]

    def create(self) -> Callable[..., Backend]:
        """The factory function."""
        if callable(self.factory):
            return self.factory
        module, _, name = self.factory.partition(":")
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


MEMORY = Capabilities(
    algorithms=_ALL,
    budgets=_WINDOWS,
    no_failures="the in-process store never fails or waits",
    waits=False,
    shared=False,
    sections=("memory",),
    span="Memory Pipeline Execution",
)
REDIS = Capabilities(
    algorithms=_ALL,
    budgets=_WINDOWS,
    breakers=True,
    sections=("redis",),
    span="Redis Pipeline Execution",
)
MEMCACHE = Capabilities(
    no_failures="it fails open as the reference's: a memcached failure answers OK, never an error",
    reads_before_counting=True,
    sections=("memcache",),
    span="Memcache Pipeline Execution",
)

# BACKEND_TYPE -> the backend. Adding one is a module and a line here.
BACKENDS: dict[str, Registered] = {
    "redis": Registered(REDIS, "ratelimitd.backends.redis:create_redis_backend"),
    "memcache": Registered(MEMCACHE, "ratelimitd.backends.memcache:create_memcache_backend"),
    "memory": Registered(MEMORY, "ratelimitd.backends.memory:create_memory_backend"),
}


def capabilities(name: str) -> Capabilities:
    """What the backend BACKEND_TYPE names can do (KeyError for an unknown name)."""
    return BACKENDS[name].capabilities


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The process's Settings from `environ` (None: the process environment), its BACKEND_TYPE
    one of the registry's and checked as that backend declares; raise SettingsError."""
    return settings_from_env(environ, {name: r.capabilities for name, r in BACKENDS.items()})


def backend_type() -> str | None:
    """BACKEND_TYPE when set explicitly (one of the registry's names), else None."""
    return backend_type_from_env(BACKENDS)


def create_backend(
    settings: Settings,
    health: Health,
    stats: StatsStore,
    *,
    clock: Callable[[], float] = time.time,
) -> Backend:
    """The backend BACKEND_TYPE names, from its registry line; `clock` is the memory one's."""
    kind = settings.cache.backend
    registered = BACKENDS.get(kind)
    if registered is None:
        raise ValueError(f"BACKEND_TYPE: unknown backend {kind!r}")
    return registered.create()(settings, health, stats, clock)


def __getattr__(name: str) -> Any:
    # The memory store on demand: `from ratelimitd.backends import MemoryBackend` works
    # without this package importing a store when the settings import it.
    if name == "MemoryBackend":
        from .memory import MemoryBackend

        return MemoryBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "MEMCACHE",
    "MEMORY",
    "REDIS",
    "Backend",
    "BackendError",
    "Capabilities",
    "MemoryBackend",
    "Op",
    "Registered",
    "SyncBackend",
    "backend_type",
    "capabilities",
    "create_backend",
    "load_settings",
]
