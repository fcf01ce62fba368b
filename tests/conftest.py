"""Suite-wide fixtures: reference configs, a decision core on the memory backend, and the
real servers more than one test directory starts (helpers in tests/support)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.core import Decider, memory_decider
from support.daemon import DaemonProcess, daemon_environment, with_fresh_ports
from support.loops import pytest_asyncio_loop_factories  # noqa: F401 - the suite-wide hook
from support.pki import Pki
from support.process import start_bound
from support.redis_server import RedisServer, RedisServers


@pytest.fixture
def harness() -> Callable[..., Decider]:
    """A core on the memory backend with a settable clock, from YAML texts or paths:
    harness("domain: d\n...", now=..., options=...) (support.core.memory_decider)."""
    return memory_decider


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
        first = [True]

        def spawn() -> DaemonProcess:
            # The env's own ports first; after a lost race for one of them (another process
            # bound it between free_port() and the daemon's bind), fresh ones.
            ports = env if first[0] else with_fresh_ports(env)
            first[0] = False
            d = DaemonProcess(ports, tmp_path / f"daemon{len(started)}.log")
            started.append(d)
            return d

        if not wait:
            return spawn()
        return start_bound(spawn)

    yield start
    for d in started:
        d.close()
