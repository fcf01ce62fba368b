"""Suite-wide fixtures: reference configs and a decision service on the memory backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop

from ratelimitd.backends import MemoryBackend
from ratelimitd.config import ConfigFile, load_ruleset
from ratelimitd.limiter import Limiter
from ratelimitd.localcache import LocalCache
from ratelimitd.messages import Descriptor, Request
from ratelimitd.service import RateLimitService
from ratelimitd.settings import ReloadOptions
from ratelimitd.stats import StatsStore

REPO = Path(__file__).resolve().parent.parent
# Copies of the reference service's own test configs (see tests/configs/README.md).
TEST_CONFIGS = REPO / "tests" / "configs"


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], object]]:
    """Async tests run on uvloop, the loop the daemon runs on."""
    return {"uvloop": uvloop.new_event_loop}


def config_path(name: str) -> Path:
    """A config from tests/configs (our copies of the reference's test configs)."""
    return TEST_CONFIGS / name


class Clock:
    """A controllable Unix clock."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Harness:
    """A RateLimitService on the memory backend with a fake clock, as tests build it."""

    def __init__(
        self,
        files: list[ConfigFile],
        *,
        options: ReloadOptions | None = None,
        near_limit_ratio: float = 0.8,
        cache_key_prefix: str = "",
        local_cache_bytes: int = 0,
        stop_increment: bool = False,
        merge_domains: bool = False,
        now: float = 1_000_000.0,
    ) -> None:
        self.clock = Clock(now)
        self.stats = StatsStore()
        self.backend = MemoryBackend(0, clock=self.clock)
        self.local_cache = LocalCache(local_cache_bytes) if local_cache_bytes else None
        self.limiter = Limiter(
            self.backend,
            near_limit_ratio=near_limit_ratio,
            cache_key_prefix=cache_key_prefix,
            local_cache=self.local_cache,
            stop_increment_when_over_limit=stop_increment,
            clock=self.clock,
        )
        self.service = RateLimitService(self.limiter, self.stats, options, clock=self.clock)
        self.ruleset = load_ruleset(files, merge_domains=merge_domains, stats=self.stats)
        self.service.set_ruleset(self.ruleset)

    async def decide(self, domain: str, *descriptors: object, hits_addend: int = 0):
        """Decide a request; each descriptor is a list of (k, v) pairs or a Descriptor."""
        ds = [d if isinstance(d, Descriptor) else Descriptor(tuple(d)) for d in descriptors]  # type: ignore[arg-type]
        return await self.service.should_rate_limit(Request(domain, ds, hits_addend))

    def stat(self, name: str) -> float:
        """One statistic by full name (0 when never created)."""
        return self.stats.snapshot().get(name, 0)


@pytest.fixture
def harness() -> Callable[..., Harness]:
    """Build a Harness from YAML texts or paths: harness("domain: d\\n...", ...)."""

    def build(*configs: str | Path, **kwargs: object) -> Harness:
        files = []
        for i, c in enumerate(configs):
            if isinstance(c, Path):
                files.append(ConfigFile(str(c), c.read_text()))
            else:
                files.append(ConfigFile(f"config.{i}.yaml", c))
        return Harness(files, **kwargs)  # type: ignore[arg-type]

    return build
