"""Real memcached processes on free ports, decision services on the memcache backend, and
the daemon as a subprocess with BACKEND_TYPE=memcache.

Every memcached is started as `memcached -u root -l 127.0.0.1 -p P -U 0 -t 1` and polled
with `version` until it answers; a missing binary fails the test (never a skip).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop
from support import DaemonProcess, daemon_environment, free_port

from ratelimitd.backends.memcache import MemcacheBackend
from ratelimitd.config import ConfigFile, load_ruleset
from ratelimitd.health import Health
from ratelimitd.limiter import Limiter
from ratelimitd.messages import Descriptor, Request, Response
from ratelimitd.service import RateLimitService
from ratelimitd.stats import StatsStore

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 10.0


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Callable[[], Any]]:
    """The backend's tests run on uvloop, the daemon's loop."""
    return {"uvloop": uvloop.new_event_loop}


def poll(check: Callable[[], bool], timeout: float = READY_TIMEOUT, what: str = "") -> None:
    """Call `check` until it returns true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (OSError, ssl.SSLError):
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


class Memcached:
    """One memcached process and a tiny blocking text-protocol client for assertions."""

    def __init__(self, *extra: str, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls  # the helper client's TLS context, for a server started with -Z
        self.binary = shutil.which("memcached") or "/usr/bin/memcached"
        if not os.path.exists(self.binary):
            pytest.fail("memcached is not installed (apt-get install memcached)")
        self.port = free_port()
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """host:port."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> Memcached:
        """Start the process and wait until it answers `version`."""
        args = [self.binary, "-u", "root", "-l", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            [*args, "-U", "0", "-t", "1", *self.extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        poll(lambda: self.command(b"version").startswith(b"VERSION"), what="memcached")
        return self

    def stop(self) -> None:
        """Kill the process (and wait for it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def command(self, line: bytes, data: bytes | None = None) -> bytes:
        """One command; its reply up to the terminating line (END, or a single line)."""
        with contextlib.ExitStack() as stack:
            s = stack.enter_context(socket.create_connection(("127.0.0.1", self.port), timeout=2))
            if self.tls is not None:
                s = stack.enter_context(self.tls.wrap_socket(s))
            s.sendall(line + b"\r\n" + (data + b"\r\n" if data is not None else b""))
            out = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return out
                out += chunk
                if out.endswith(b"END\r\n") or (
                    out.endswith(b"\r\n") and not out.startswith((b"VALUE", b"STAT"))
                ):
                    return out

    def value(self, key: str) -> int | None:
        """The integer stored at `key`, None when absent."""
        reply = self.command(b"get " + key.encode())
        if reply == b"END\r\n":
            return None
        return int(reply.split(b"\r\n")[1])

    def ttl(self, key: str) -> int:
        """Seconds left on `key` (meta `mg <key> t`; -1 = never expires, -2 = absent)."""
        reply = self.command(b"mg " + key.encode() + b" t")
        if reply.startswith(b"EN"):
            return -2
        return int(reply.split()[1][1:])


@pytest.fixture
def memcached() -> Iterator[Callable[..., Memcached]]:
    """Start memcached processes with `memcached(*extra_args)`; all stopped at teardown."""
    started: list[Memcached] = []

    def start(*extra: str, tls: ssl.SSLContext | None = None) -> Memcached:
        m = Memcached(*extra, tls=tls)
        started.append(m)
        return m.start()

    yield start
    for m in started:
        m.stop()


class Decider:
    """A RateLimitService + Limiter on a MemcacheBackend, as the daemon builds them."""

    def __init__(self, backend: MemcacheBackend, config: str, clock: Callable[[], float]) -> None:
        self.backend = backend
        self.stats = StatsStore()
        self.health = backend.health
        backend.stats.register(self.stats)
        self.limiter = Limiter(backend, clock=clock)
        self.service = RateLimitService(self.limiter, self.stats, clock=clock)
        self.service.set_ruleset(
            load_ruleset([ConfigFile("config.yaml", config)], stats=self.stats)
        )

    async def decide(self, domain: str, *descriptors: list[tuple[str, str]]) -> Response:
        """One decision; each descriptor is a list of (key, value) pairs."""
        request = Request(domain, [Descriptor(tuple(d)) for d in descriptors], 0)
        return await self.service.should_rate_limit(request)

    def stat(self, name: str) -> float:
        """One statistic by full name (0 when absent)."""
        return self.stats.snapshot().get(name, 0)


@pytest.fixture
async def decider() -> AsyncIterator[Callable[..., Any]]:
    """`await decider(servers, config, now=...)`: a connected Decider; closed at teardown."""
    built: list[Decider] = []

    async def build(
        servers: list[str], config: str, now: float = 1_000_000.0, **kwargs: Any
    ) -> Decider:
        health = Health()
        health.register("backend", False)
        backend = MemcacheBackend(servers, health=health, **kwargs)
        await backend.connect()
        d = Decider(backend, config, lambda: now)
        built.append(d)
        return d

    yield build
    for d in built:
        await d.backend.close()


# -- the daemon as a subprocess --------------------------------------------------------------


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """`start_daemon(config_yaml, **env)`: a ready daemon on free ports; stopped at teardown."""
    started: list[DaemonProcess] = []

    def start(config: str, **extra: str) -> DaemonProcess:
        env = daemon_environment(tmp_path / "runtime")
        (tmp_path / "runtime" / "config" / "config.yaml").write_text(config)
        env.update(extra)
        d = DaemonProcess(env, tmp_path / f"daemon{len(started)}.log")
        started.append(d)
        poll(d.ready, timeout=20, what="daemon readiness")
        return d

    yield start
    for d in started:
        d.close()
