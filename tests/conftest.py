"""Suite-wide fixtures: reference configs, a decision service on the memory backend, and the
real servers more than one test directory starts (helpers in tests/support)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.clock import Clock
from support.daemon import DaemonProcess, daemon_environment
from support.loops import pytest_asyncio_loop_factories  # noqa: F401 - the suite-wide hook
from support.pki import Pki
from support.redis_server import RedisServer, RedisServers

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


def config_path(name: str) -> Path:
    """A config from tests/configs (our copies of the reference's test configs)."""
    return TEST_CONFIGS / name


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


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The test PKI (support.pki), made once per session."""
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def redis_servers(tmp_path: Path) -> Iterator[RedisServers]:
    """Start redis-server processes for one test: redis_servers(*args, **options)."""
    started = RedisServers(tmp_path / "redis")
    yield started
    started.stop_all()


@pytest.fixture
def redis_server(redis_servers: RedisServers) -> RedisServer:
    """One plain redis-server over TCP on a free port."""
    return redis_servers()


@pytest.fixture
def daemon_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a daemon on free ports serving tmp_path/runtime/config/*.yaml."""
    return daemon_environment(tmp_path / "runtime")


@pytest.fixture(params=["native", "grpcio"])
def grpc_env(daemon_env: dict[str, str], request: pytest.FixtureRequest) -> dict[str, str]:
    """`daemon_env` with GRPC_TRANSPORT set: gRPC tests run on both transports."""
    return dict(daemon_env, GRPC_TRANSPORT=request.param)


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Start daemons with `start_daemon(env, wait=True)`; all are killed at teardown."""
    started: list[DaemonProcess] = []

    def start(env: dict[str, str], wait: bool = True) -> DaemonProcess:
        d = DaemonProcess(env, tmp_path / f"daemon{len(started)}.log")
        started.append(d)
        return d.wait_ready() if wait else d

    yield start
    for d in started:
        d.close()
