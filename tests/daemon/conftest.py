"""Fixtures of the daemon tests (the suite-wide ones are in tests/conftest.py): a daemon run
until it exits; the gRPC transports (test_grpc*.py, client side in support.grpc_rls) and the
HTTP main and debug servers (test_http*.py, client side in support.http_transport) started
in the test's event loop."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.grpc_rls import CONFIG, Served, plain_settings, tls_settings
from support.h2raw import CONFIG as H2_CONFIG
from support.h2raw import Raw
from support.http_transport import CONFIG as HTTP_CONFIG
from support.http_transport import Servers
from support.pki import Pki

from ratelimitd.health import Health
from ratelimitd.service import RateLimitService
from ratelimitd.settings import DebugSettings, GrpcSettings, ListenerSettings, Settings
from ratelimitd.transport.debug import debug_routes
from ratelimitd.transport.grpc import GrpcTransport
from ratelimitd.transport.http import start_http_server
from ratelimitd.transport.native import NativeGrpcTransport
from ratelimitd.transport.routes import main_routes

Exited = subprocess.CompletedProcess[str]


@pytest.fixture
def serve_until_exit() -> Callable[[dict[str, str], float], Exited]:
    """serve_until_exit(env, timeout): `python -m ratelimitd serve` with `env`, for a daemon
    that must exit on its own within `timeout` seconds; its return code and output (text)."""

    def run(env: dict[str, str], timeout: float) -> Exited:
        argv = [sys.executable, "-m", "ratelimitd", "serve"]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)

    return run


# -- gRPC transports (test_grpc*.py) -----------------------------------------------------


# Both gRPC transports pass every test that takes `transport_cls` or `serve`
# (GRPC_TRANSPORT=native|grpcio).
TRANSPORTS = {"native": NativeGrpcTransport, "grpcio": GrpcTransport}


@pytest.fixture(params=list(TRANSPORTS))
def transport_cls(request: pytest.FixtureRequest) -> type[Any]:
    """The gRPC transport class under test."""
    return TRANSPORTS[request.param]


@pytest.fixture
async def serve(transport_cls: type[Any]) -> AsyncIterator[Callable[..., Any]]:
    """Start a transport: `await serve(service, stats, settings=..., health=...)`."""
    started: list[Any] = []

    async def start(
        service: RateLimitService,
        stats: Any,
        settings: Settings | None = None,
        health: Health | None = None,
    ) -> Served:
        if health is None:
            health = Health()
            health.register("backend", True)
        settings = settings or plain_settings()
        transport = transport_cls(settings, service, health, stats)
        await transport.start()
        started.append(transport)
        target = transport.address if settings.listeners.grpc_uds else f"127.0.0.1:{transport.port}"
        return Served(transport, target)

    yield start
    for transport in started:
        await transport.stop(0)


@pytest.fixture
def serve_tls(
    harness: Callable[..., Any], serve: Any, certs: Pki, tmp_path: Path
) -> Callable[..., Awaitable[Served]]:
    """Start a transport deciding on CONFIG over TLS: `await serve_tls(**overrides)`, the
    overrides GrpcSettings fields over `tls_settings` (its files in tmp_path)."""

    async def start(**overrides: Any) -> Served:
        h = harness(CONFIG)
        return await serve(h.service, h.stats, settings=tls_settings(certs, tmp_path, **overrides))

    return start


# -- the native transport under raw HTTP/2 frames (test_h2_*.py) --------------------------


@pytest.fixture
async def native_server(harness: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """Start the native transport deciding on support.h2raw.CONFIG, in the test's loop:
    `t = await native_server(**grpc_settings)`, or with `settings=` a whole Settings."""
    started: list[NativeGrpcTransport] = []

    async def start(settings: Settings | None = None, **grpc_settings: Any) -> NativeGrpcTransport:
        h = harness(H2_CONFIG)
        settings = settings or Settings(
            listeners=ListenerSettings(grpc_host="127.0.0.1", grpc_port=0),
            grpc=GrpcSettings(**grpc_settings),
        )
        health = Health()
        health.register("backend", True)
        transport = NativeGrpcTransport(settings, h.service, health, h.stats)
        await transport.start()
        started.append(transport)
        return transport

    yield start
    for transport in started:
        await transport.stop(0)


@pytest.fixture
async def raw_client() -> AsyncIterator[Callable[..., Any]]:
    """`c = await raw_client(port, preface=True, settings=None)`: a support.h2raw.Raw client,
    closed at teardown."""
    clients: list[Raw] = []

    async def open_raw(port: int, preface: bool = True, **kw: Any) -> Raw:
        raw = await Raw.open(port, preface, **kw)
        clients.append(raw)
        return raw

    yield open_raw
    for raw in clients:
        raw.writer.close()
        with contextlib.suppress(ConnectionError):
            await raw.writer.wait_closed()


# -- HTTP servers (test_http*.py) --------------------------------------------------------


# The debug server's profile endpoint on (it is off by default).
PROFILING = DebugSettings(profile_enabled=True)


@pytest.fixture
async def make_servers(harness: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """make_servers(yaml, **harness_kwargs) -> Servers (closed at teardown)."""
    started: list[Servers] = []

    async def make(
        config: str = HTTP_CONFIG, debug_settings: DebugSettings = PROFILING, **kwargs: Any
    ) -> Servers:
        h = harness(config, **kwargs)
        health = Health()
        health.register("backend", True)
        main = await start_http_server(main_routes(h.service, health), "127.0.0.1", 0)
        debug = await start_http_server(
            debug_routes(h.service, h.stats, settings=debug_settings), "127.0.0.1", 0
        )
        servers = Servers(h, health, main, debug)
        started.append(servers)
        return servers

    yield make
    for servers in started:
        await servers.close()


@pytest.fixture
async def srv(make_servers: Callable[..., Any]) -> Servers:
    return await make_servers()
