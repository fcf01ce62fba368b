"""Fixtures of the daemon tests (the suite-wide ones are in tests/conftest.py): a daemon run
until it exits; the gRPC transports started in the test's event loop (test_grpc*.py, client
side in support.grpc_rls)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.grpc_rls import CONFIG, Served, plain_settings, tls_settings
from support.pki import Pki

from ratelimitd.health import Health
from ratelimitd.service import RateLimitService
from ratelimitd.settings import Settings
from ratelimitd.transport.grpc import GrpcTransport
from ratelimitd.transport.native import NativeGrpcTransport

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
