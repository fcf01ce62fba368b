"""The client side of the gRPC transport tests (tests/daemon/test_grpc*.py): the rules they
decide on, settings for a loopback listener (plain or TLS), RateLimitRequest building, a
started transport with channel factories, and the calls. The fixtures that start transports
(`transport_cls`, `serve`, `serve_tls`) are in tests/daemon/conftest.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from ratelimitd._proto import rls_pb2, rls_pb2_grpc
from ratelimitd.settings import GrpcSettings, ListenerSettings, Settings
from ratelimitd.transport.grpc import GrpcTransport
from support.pki import Pki

CONFIG = """\
domain: test
descriptors:
  - key: k
    value: v
    rate_limit:
      unit: minute
      requests_per_unit: 2
      name: kv_limit
  - key: unlimited
    rate_limit:
      unlimited: true
"""
# The harness clock stands at 1_000_000 s: 1_000_000 % 60 == 40, so 20 s are left.
RESET = 20
TIMEOUT = 5.0
# Each test channel opens its own connections: grpc otherwise shares subchannels between
# channels to one target, and a TLS test must see a fresh handshake.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


def plain_settings(grpc_uds: str = "", **grpc: Any) -> Settings:
    """Settings for a loopback listener on a free port; `grpc` sets GrpcSettings fields."""
    listeners = ListenerSettings(grpc_host="127.0.0.1", grpc_port=0, grpc_uds=grpc_uds)
    return Settings(listeners=listeners, grpc=GrpcSettings(**grpc))


def request(domain: str = "test", *descriptors: list[tuple[str, str]], hits: int = 0) -> Any:
    """A RateLimitRequest built with the generated classes."""
    msg = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits)
    for entries in descriptors:
        d = msg.descriptors.add()
        for key, value in entries:
            d.entries.add(key=key, value=value)
    return msg


KV = [("k", "v")]


class Served:
    """A started GrpcTransport plus channel factories for it."""

    def __init__(self, transport: GrpcTransport, target: str) -> None:
        self.transport = transport
        self.target = target

    def channel(self, credentials: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
        if credentials is None:
            return grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(self.target, credentials, options=CHANNEL_OPTIONS)


async def call(channel: grpc.aio.Channel, msg: Any) -> Any:
    """ShouldRateLimit through the generated stub."""
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    return await stub.ShouldRateLimit(msg, timeout=TIMEOUT)


async def rpc_error(awaitable: Any) -> grpc.aio.AioRpcError:
    """The AioRpcError an RPC fails with."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return info.value


def tls_settings(certs: Pki, root: Path, **overrides: Any) -> Settings:
    """TLS settings whose cert/key are copies in `root` (so a test may replace them)."""
    cert, key = root / "tls.pem", root / "tls.key"
    shutil.copy(certs.server[0], cert)
    shutil.copy(certs.server[1], key)
    return plain_settings(
        server_use_tls=True,
        server_tls_cert=str(cert),
        server_tls_key=str(key),
        **overrides,
    )
