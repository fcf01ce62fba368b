"""The public async client (`ratelimitd.transport.client`) against both gRPC transports and the
daemon: decisions, the raw-bytes call, errors, deadlines, TLS / mTLS and reconnecting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.core import StoreDouble
from support.daemon import DaemonProcess, write_config
from support.pki import Pki
from support.ready import free_port

from ratelimitd.backends import MemoryBackend, Op
from ratelimitd.config import ConfigFile
from ratelimitd.core import Core, build_core
from ratelimitd.health import Health
from ratelimitd.messages import OK, OVER_LIMIT
from ratelimitd.settings import GrpcSettings, ListenerSettings, Settings
from ratelimitd.transport.client import ClientTLS, RateLimitClient, RateLimitError
from ratelimitd.transport.grpc import GrpcTransport
from ratelimitd.transport.native import NativeGrpcTransport
from ratelimitd.transport.protocodec import Limit, decode_response, encode_request

CONFIG = """\
domain: test
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2, name: kv_limit}
"""
MINUTE = 2
NOW = 1_000_000.0  # 1_000_000 % 60 == 40: 20 s until the window ends

TRANSPORTS = {"native": NativeGrpcTransport, "grpcio": GrpcTransport}


def settings(port: int = 0, **grpc_settings: Any) -> Settings:
    listeners = ListenerSettings(grpc_host="127.0.0.1", grpc_port=port)
    return Settings(listeners=listeners, grpc=GrpcSettings(**grpc_settings))


def memory_core() -> Core:
    core = build_core(backend=MemoryBackend(clock=lambda: NOW), clock=lambda: NOW)
    core.load([ConfigFile("config.yaml", CONFIG)])
    return core


@pytest.fixture(params=list(TRANSPORTS))
async def serve(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., Any]]:
    """`await serve(core, settings)` starts a transport; the target to dial is `.target`."""
    started: list[Any] = []

    async def start(core: Core, config: Settings | None = None) -> Any:
        health = Health()
        health.register("backend", True)
        transport = TRANSPORTS[request.param](
            config or settings(), core.service, health, core.stats
        )
        await transport.start()
        transport.target = f"127.0.0.1:{transport.port}"
        started.append(transport)
        return transport

    yield start
    for transport in started:
        await transport.stop(0)


async def test_decisions_and_the_raw_bytes_call(serve: Any) -> None:
    served = await serve(memory_core())
    async with RateLimitClient(served.target, timeout=5.0) as client:
        first = await client.should_rate_limit("test", [[("k", "v")]])
        assert first.overall_code == OK
        status = first.statuses[0]
        assert status.rule == Limit(2, MINUTE, "kv_limit")
        assert (status.limit_remaining, status.duration_until_reset) == (1, 20)
        raw = await client.should_rate_limit_bytes(encode_request("test", [[("k", "v")]], 1))
        assert decode_response(raw).statuses[0].limit_remaining == 0
        over = await client.should_rate_limit("test", [[("k", "v")]], hits_addend=1)
        assert over.overall_code == OVER_LIMIT


async def test_errors_carry_the_status_code_and_the_servers_text(serve: Any) -> None:
    served = await serve(memory_core())
    async with RateLimitClient(served.target) as client:
        with pytest.raises(RateLimitError) as exc:
            await client.should_rate_limit("test", [])
    assert exc.value.code == grpc.StatusCode.UNKNOWN
    assert exc.value.details == "rate limit descriptor list must not be empty"
    async with RateLimitClient(f"127.0.0.1:{free_port()}") as nobody:
        with pytest.raises(RateLimitError) as exc:
            await nobody.should_rate_limit("test", [[("k", "v")]])
    assert exc.value.code == grpc.StatusCode.UNAVAILABLE


class Stuck(StoreDouble):
    """An async backend whose store never answers."""

    name = "stuck"

    async def increment(self, ops: Sequence[Op]) -> list[int]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    get = increment


async def test_every_call_has_a_deadline(serve: Any) -> None:
    core = build_core(backend=Stuck())
    core.load([ConfigFile("config.yaml", CONFIG)])
    served = await serve(core)
    async with RateLimitClient(served.target, timeout=0.2) as client:
        with pytest.raises(RateLimitError) as exc:
            await client.should_rate_limit("test", [[("k", "v")]])
        assert exc.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(RateLimitError) as exc:
            await client.should_rate_limit("test", [[("k", "v")]], timeout=0.05)
        assert exc.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_tls_and_mtls(serve: Any, certs: Pki) -> None:
    tls = settings(
        server_use_tls=True,
        server_tls_cert=str(certs.server[0]),
        server_tls_key=str(certs.server[1]),
        client_tls_cacert=str(certs.ca),
    )
    served = await serve(memory_core(), tls)
    with_cert = ClientTLS(str(certs.ca), str(certs.client[0]), str(certs.client[1]))
    async with RateLimitClient(served.target, tls=with_cert) as client:
        assert (await client.should_rate_limit("test", [[("k", "v")]])).overall_code == OK
    # The server requires a client certificate (mTLS): without one the handshake fails.
    async with RateLimitClient(served.target, tls=ClientTLS(str(certs.ca))) as anonymous:
        with pytest.raises(RateLimitError) as exc:
            await anonymous.should_rate_limit("test", [[("k", "v")]])
        assert exc.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(OSError):
        await RateLimitClient(served.target, tls=ClientTLS("/nonexistent/ca.pem")).open()
    with pytest.raises(ValueError, match="cert_file and key_file"):
        await RateLimitClient(served.target, tls=ClientTLS(cert_file="c.pem")).open()


async def test_tls_server_name_override(serve: Any, certs: Pki) -> None:
    tls = settings(
        server_use_tls=True,
        server_tls_cert=str(certs.elsewhere[0]),
        server_tls_key=str(certs.elsewhere[1]),
    )
    served = await serve(memory_core(), tls)
    async with RateLimitClient(served.target, tls=ClientTLS(str(certs.ca))) as wrong_name:
        with pytest.raises(RateLimitError):
            await wrong_name.should_rate_limit("test", [[("k", "v")]])
    named = ClientTLS(str(certs.ca), server_name="elsewhere.test")
    async with RateLimitClient(served.target, tls=named) as client:
        assert (await client.should_rate_limit("test", [[("k", "v")]])).overall_code == OK


async def test_the_client_reconnects_to_a_restarted_server(serve: Any) -> None:
    port = free_port()
    core = memory_core()
    served = await serve(core, settings(port))
    client = RateLimitClient(f"127.0.0.1:{port}", max_reconnect_backoff=0.2)
    try:
        assert (await client.should_rate_limit("test", [[("a", "1")]])).overall_code == OK
        await served.stop(0)
        with pytest.raises(RateLimitError) as exc:  # fails fast while the server is gone
            await client.should_rate_limit("test", [[("a", "1")]])
        assert exc.value.code == grpc.StatusCode.UNAVAILABLE
        await serve(core, settings(port))
        client.wait_for_ready = True  # now wait (within the deadline) for the reconnect
        assert (await client.should_rate_limit("test", [[("a", "1")]])).overall_code == OK
    finally:
        await client.close()


def test_a_client_follows_the_running_event_loop(
    daemon_env: dict[str, str], start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """One client used from two `asyncio.run` calls (as a CLI or a forked worker would)."""
    write_config(daemon_env, "config.yaml", CONFIG)
    daemon = start_daemon(daemon_env)
    client = RateLimitClient(daemon.grpc_target)

    async def remaining() -> int:
        return (
            (await client.should_rate_limit("test", [[("k", "loops")]])).statuses[0].limit_remaining
        )

    assert asyncio.run(remaining()) == 1
    assert asyncio.run(remaining()) == 0

    async def close() -> None:
        await client.close()

    asyncio.run(close())
