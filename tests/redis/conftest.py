"""Real redis-server processes on free ports, and decision services on the Redis backend.

Every server is started with `--save "" --appendonly no --dir <tmp>` and polled with PING
until it answers; a missing `redis-server` binary fails the test (never a skip).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import uvloop

from ratelimitd.backends.redis import RedisBackend, create_redis_backend
from ratelimitd.config import ConfigFile, load_ruleset
from ratelimitd.health import Health
from ratelimitd.limiter import Limiter
from ratelimitd.messages import Descriptor, Request, Response
from ratelimitd.service import RateLimitService
from ratelimitd.settings import Settings
from ratelimitd.stats import StatsStore

READY_TIMEOUT = 10.0


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Callable[[], Any]]:
    """The backend's tests run on uvloop, the daemon's loop."""
    return {"uvloop": uvloop.new_event_loop}


def free_port(cluster_bus: bool = False) -> int:
    """A TCP port nobody listens on right now (and port + 10000 too, for a cluster bus)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not cluster_bus:
            return port
        if port + 10000 < 65536:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


def binary(name: str) -> str:
    """The path of a server binary; fails the test when it is not installed."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (apt-get install redis-server redis-tools)")
    return path


def poll(check: Callable[[], bool], timeout: float = READY_TIMEOUT, what: str = "") -> None:
    """Call `check` until it returns true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.01)


async def apoll(check: Callable[[], Any], timeout: float = READY_TIMEOUT, what: str = "") -> None:
    """Async `poll`: await/call `check` until true, yielding to the loop in between."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.01)


class RedisServer:
    """One redis-server (or sentinel) process."""

    def __init__(self, tmp: Path, *args: str, port: int | None = None, tls: bool = False):
        self.port = port if port is not None else free_port()
        self.tmp = tmp
        self.args = list(args)
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        self.unixsocket = ""
        self.password: str | None = None
        self.tls_kwargs: dict[str, Any] = {}
        self._clients: list[redis.Redis] = []
        self.conf = ""  # written to <tmp>/redis.conf, the first argument
        self.sentinel = False

    @property
    def address(self) -> str:
        """host:port."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        """Start the process and wait until it answers PING."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        if self.tls:
            port_args = ["--port", "0", "--tls-port", str(self.port)]
        else:
            port_args = ["--port", str(self.port)]
        conf = self.tmp / "redis.conf"
        conf.write_text(self.conf)
        cmd = [
            binary("redis-server"),
            str(conf),
            *(["--sentinel"] if self.sentinel else []),
            *port_args,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.tmp),
            *self.args,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        poll(self._ping, what=f"redis-server on {self.port}")
        return self

    def _ping(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited with {self.proc.returncode}: {self.args}")
        client = redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=0.5,
            **self.tls_kwargs,
        )
        try:
            return bool(client.ping())
        finally:
            client.close()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client to this server (for reading what the backend wrote)."""
        if not kwargs and self._clients:
            return self._clients[0]
        kw: dict[str, Any] = {"password": self.password, **self.tls_kwargs, **kwargs}
        if self.unixsocket and not self.tls:
            client = redis.Redis(unix_socket_path=self.unixsocket, **kw)
        else:
            client = redis.Redis(host="127.0.0.1", port=self.port, **kw)
        if kwargs:
            self._clients.append(client)
        else:
            self._clients.insert(0, client)
        return client

    def close_clients(self) -> None:
        """Close the redis-py clients handed out."""
        for client in self._clients:
            client.close()
        self._clients.clear()

    def stop(self) -> None:
        """Terminate the process and wait for it."""
        self.close_clients()
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server hangs with its sockets open."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


class Servers:
    """Starts redis-server processes under one directory and stops them all at the end.

    servers("--maxmemory", "1mb", password="x"), a sentinel with
    servers(conf="sentinel monitor ...", sentinel=True), a cluster node with cluster=True
    (its port + 10000, the cluster bus, is free too).
    """

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[RedisServer] = []

    def __call__(
        self,
        *args: str,
        tls: bool = False,
        tls_kwargs: dict[str, Any] | None = None,
        port: int | None = None,
        password: str | None = None,
        conf: str | None = None,
        sentinel: bool = False,
        cluster: bool = False,
    ) -> RedisServer:
        if cluster:
            port = free_port(cluster_bus=True)
            args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", *args)
        server = RedisServer(self.tmp / f"redis{len(self.started)}", *args, port=port, tls=tls)
        server.tls_kwargs = tls_kwargs or {}
        if conf is not None:
            server.conf = conf
            server.sentinel = sentinel
        server.password = password
        if password is not None:
            server.args += ["--requirepass", password]
        self.started.append(server)
        return server.start()

    def stop_all(self) -> None:
        """Stop every server started."""
        for server in self.started:
            server.stop()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    """Start redis-server processes for one test (see Servers)."""
    started = Servers(tmp_path)
    yield started
    started.stop_all()


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Start redis-server processes shared by a module's tests (a cluster, say)."""
    started = Servers(tmp_path_factory.mktemp("redis"))
    yield started
    started.stop_all()


@pytest.fixture
def unused_port() -> int:
    """A free TCP port."""
    return free_port()


@pytest.fixture
def redis_server(servers: Servers) -> RedisServer:
    """One plain redis-server over TCP."""
    return servers()


class Decider:
    """A RateLimitService + Limiter over a RedisBackend built from environment settings."""

    def __init__(
        self,
        backend: RedisBackend,
        config: str,
        stats: StatsStore,
        health: Health,
        **limiter: Any,
    ) -> None:
        self.backend = backend
        self.stats = stats
        self.health = health
        self.limiter = Limiter(backend, **limiter)
        self.service = RateLimitService(self.limiter, stats)
        self.service.set_ruleset(load_ruleset([ConfigFile("config.yaml", config)], stats=stats))

    async def decide(self, domain: str, *descriptors: Any, hits_addend: int = 0) -> Response:
        """Decide one request; each descriptor is a list of (key, value) pairs."""
        ds = [Descriptor(tuple(d)) for d in descriptors]
        return await self.service.should_rate_limit(Request(domain, ds, hits_addend))

    def stat(self, name: str) -> float:
        """One statistic by full name (0 when never created)."""
        return self.stats.snapshot().get(name, 0)


@pytest.fixture
async def decider() -> AsyncIterator[Callable[..., Any]]:
    """Build a connected Decider: await decider(env, config_yaml, **limiter_kwargs)."""
    built: list[Decider] = []

    async def build(env: dict[str, str], config: str, **limiter: Any) -> Decider:
        environ = {
            "BACKEND_TYPE": "redis",
            "REDIS_SOCKET_TYPE": "tcp",
            "EXPIRATION_JITTER_MAX_SECONDS": "0",
            "REDIS_POOL_SIZE": "2",
            "REDIS_STARTUP_MAX_ELAPSED_TIME": "5s",
            "REDIS_STARTUP_INITIAL_INTERVAL": "50ms",
            "REDIS_TIMEOUT": "2s",
            # Generous unless a test is about timeouts: the CI machine may be loaded.
            "REDIS_REQUEST_TIMEOUT": "1s",
            **env,
        }
        settings = Settings.from_env(environ)
        stats = StatsStore()
        health = Health()
        backend = create_redis_backend(settings, health, stats)
        d = Decider(
            backend,
            config,
            stats,
            health,
            cache_key_prefix=settings.cache.cache_key_prefix,
            stop_increment_when_over_limit=settings.cache.stop_cache_key_increment_when_overlimit,
            **limiter,
        )
        built.append(d)
        await backend.connect()
        return d

    yield build
    for d in built:
        await d.backend.close()
