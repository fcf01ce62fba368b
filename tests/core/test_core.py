"""`build_core`: one factory for the decision core; the implementation is an argument."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import pytest
from support.core import StoreDouble

from ratelimitd import decision
from ratelimitd.backends import Backend, MemoryBackend, Op, SyncBackend
from ratelimitd.config import ConfigFile, load_ruleset
from ratelimitd.core import build_core
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor, Request
from ratelimitd.settings import CacheSettings, Settings

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


def request(value: str = "v") -> Request:
    return Request("d", [Descriptor((("k", value),))])


@pytest.mark.parametrize("impl", ["compiled", "pure"])
async def test_impl_selects_every_twin_without_patching(impl: str) -> None:
    """`impl` picks the leaves (`match`, `keys`); the decision model calling them is the one
    compiled source whatever the choice."""
    core = build_core(backend=MemoryBackend(), clock=lambda: 1_000_000.0, impl=impl)
    ruleset = core.load([ConfigFile("c.yaml", CONFIG)])
    suffix = "" if impl == "compiled" else "_py"
    match_module = importlib.import_module(f"ratelimitd.config._match{suffix}")
    keys_module = importlib.import_module(f"ratelimitd.config._keys{suffix}")
    assert ruleset.lookup is match_module.lookup
    assert core.limiter.keys is keys_module
    assert core.limiter.decision is core.service.decision is decision
    assert decision.Plan.__module__ == "ratelimitd.decision._plan"
    codes = [(await core.service.should_rate_limit(request())).overall_code for _ in range(3)]
    assert codes == [OK, OK, OVER_LIMIT]
    snapshot = core.stats.snapshot()
    assert snapshot["ratelimit.service.rate_limit.d.k.over_limit"] == 1
    assert snapshot["ratelimit.service.rate_limit.d.k.within_limit"] == 2


def test_default_settings_build_the_memory_backend() -> None:
    core = build_core()
    assert core.backend.name == "memory"
    assert core.limiter.synchronous
    assert core.local_cache is None


def test_settings_reach_the_limiter_and_the_local_cache() -> None:
    settings = Settings(
        cache=CacheSettings(
            backend="memory",
            near_limit_ratio=0.5,
            cache_key_prefix="p:",
            local_cache_size_in_bytes=1 << 16,
        )
    )
    core = build_core(settings)
    assert (core.limiter.near_limit_ratio, core.limiter.prefix) == (0.5, "p:")
    assert core.limiter.local_cache is core.local_cache is not None
    assert "ratelimit.localcache.hitCount" in core.stats.snapshot()


def test_the_synchronous_path_is_chosen_once_from_the_declared_protocol() -> None:
    memory = MemoryBackend()
    assert isinstance(memory, SyncBackend)
    assert build_core(backend=memory).limiter.synchronous
    # Checking before incrementing needs the async GET round.
    stop = Settings(
        cache=CacheSettings(backend="memory", stop_cache_key_increment_when_overlimit=True)
    )
    assert not build_core(stop, backend=memory).limiter.synchronous
    assert build_core(stop, backend=memory).limiter.stop_increment
    with pytest.raises(AttributeError):
        build_core(backend=memory).limiter.backend = MemoryBackend()  # type: ignore[misc]


class AsyncOnly(StoreDouble):
    """A Backend that is not a SyncBackend: the limiter awaits it."""

    name = "async-only"

    def __init__(self) -> None:
        super().__init__()
        self.rounds = 0

    async def increment(self, ops: Sequence[Op]) -> list[int]:
        self.rounds += 1
        return await self.backend.increment(ops)


async def test_an_async_backend_is_awaited_once_per_request() -> None:
    backend = AsyncOnly()
    assert isinstance(backend, Backend) and not isinstance(backend, SyncBackend)
    core = build_core(backend=backend, clock=lambda: 1_000_000.0)
    assert not core.limiter.synchronous
    core.load([ConfigFile("c.yaml", CONFIG)])
    response = await core.service.should_rate_limit(
        Request("d", [Descriptor((("k", "a"),)), Descriptor((("k", "b"),))])
    )
    assert response.overall_code == OK
    assert backend.rounds == 1


def test_a_ruleset_is_immutable() -> None:
    ruleset = load_ruleset([ConfigFile("c.yaml", CONFIG)])
    with pytest.raises(TypeError):
        ruleset.domains["x"] = ruleset.domains["d"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        ruleset.domains = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        ruleset.specs["x"] = []  # type: ignore[index]
    assert list(ruleset.domains) == ["d"]
