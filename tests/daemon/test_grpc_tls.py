"""The gRPC transport over TLS / mTLS, with certificates the test makes (openssl CLI,
support.pki) and replaces on disk, and client SAN enforcement; both transports.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.grpc_rls import (
    CONFIG,
    KV,
    TIMEOUT,
    Served,
    call,
    plain_settings,
    request,
    rpc_error,
    tls_settings,
)
from support.pki import Pki

from ratelimitd.health import Health
from ratelimitd.messages import OK, OVER_LIMIT
from ratelimitd.transport.grpc import (
    GrpcConfigError,
)
from ratelimitd.transport.native import NativeGrpcTransport

# -- TLS (the test PKI `certs` fixture lives in tests/conftest.py; `serve_tls` and
# support.grpc_rls.tls_settings are shared with test_grpc_client.py) ----------------------


async def test_tls(serve_tls: Callable[..., Awaitable[Served]], certs: Pki) -> None:
    served = await serve_tls()
    async with served.channel(certs.creds(certs.ca)) as channel:
        assert (await call(channel, request("test", KV))).overall_code == OK
    async with served.channel() as plaintext:
        err = await rpc_error(call(plaintext, request("test", KV)))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
    async with served.channel(certs.creds(certs.ca2)) as untrusted:
        err = await rpc_error(call(untrusted, request("test", KV)))
        assert err.code() == grpc.StatusCode.UNAVAILABLE


async def test_tls_settings_need_cert_and_key(
    harness: Callable[..., Any], transport_cls: type[Any]
) -> None:
    h = harness(CONFIG)
    transport = transport_cls(plain_settings(server_use_tls=True), h.service, Health(), h.stats)
    with pytest.raises(GrpcConfigError, match="GRPC_SERVER_TLS_CERT"):
        await transport.start()
    missing = plain_settings(
        server_use_tls=True,
        server_tls_cert="/nonexistent/tls.pem",
        server_tls_key="/nonexistent/tls.key",
    )
    transport = transport_cls(missing, h.service, Health(), h.stats)
    with pytest.raises(GrpcConfigError, match=r"/nonexistent/tls\.pem"):
        await transport.start()


async def test_mtls_requires_a_client_certificate(
    serve_tls: Callable[..., Awaitable[Served]], certs: Pki
) -> None:
    served = await serve_tls(client_tls_cacert=str(certs.ca))
    async with served.channel(certs.creds(certs.ca)) as anonymous:
        err = await rpc_error(call(anonymous, request("test", KV)))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
    async with served.channel(certs.creds(certs.ca, certs.client)) as channel:
        assert (await call(channel, request("test", KV))).overall_code == OK


async def test_certificate_replaced_on_disk_is_used_by_new_connections(
    harness: Callable[..., Any], serve: Any, certs: Pki, tmp_path: Path
) -> None:
    h = harness(CONFIG)
    settings = tls_settings(certs, tmp_path)
    served = await serve(h.service, h.stats, settings=settings)
    async with served.channel(certs.creds(certs.ca)) as before:
        assert (await call(before, request("test", KV))).overall_code == OK
        # Swap in a certificate from the second CA the way deployments do: write, rename.
        for source, target in (
            (certs.server2[0], settings.grpc.server_tls_cert),
            (certs.server2[1], settings.grpc.server_tls_key),
        ):
            shutil.copy(source, target + ".new")
            os.replace(target + ".new", target)
        async with served.channel(certs.creds(certs.ca2)) as after:
            assert (await call(after, request("test", KV))).overall_code == OK
        async with served.channel(certs.creds(certs.ca)) as stale:
            err = await rpc_error(call(stale, request("test", KV)))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
        # A broken replacement keeps the certificates in force.
        Path(settings.grpc.server_tls_cert).write_text("not a certificate")
        async with served.channel(certs.creds(certs.ca2)) as kept:
            assert (await call(kept, request("test", KV))).overall_code == OVER_LIMIT


async def test_client_san_enforced(
    harness: Callable[..., Any], serve: Any, certs: Pki, tmp_path: Path
) -> None:
    h = harness(CONFIG)
    settings = tls_settings(
        certs,
        tmp_path,
        client_tls_cacert=str(certs.ca),
        client_tls_san="client.example.com",
    )
    served = await serve(h.service, h.stats, settings=settings)
    native = isinstance(served.transport, NativeGrpcTransport)
    async with served.channel(certs.creds(certs.ca, certs.other)) as wrong:
        err = await rpc_error(call(wrong, request("test", KV)))
        if native:
            # Refused when the handshake completes, as the reference refuses it.
            assert err.code() == grpc.StatusCode.UNAVAILABLE
        else:
            # grpc Python has no hook into certificate verification: refused per call.
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "client.example.com" in err.details()
        health = health_pb2_grpc.HealthStub(wrong)
        err = await rpc_error(health.Check(health_pb2.HealthCheckRequest(service="ratelimit")))
        expected = grpc.StatusCode.UNAVAILABLE if native else grpc.StatusCode.UNAUTHENTICATED
        assert err.code() == expected
    async with served.channel(certs.creds(certs.ca, certs.client)) as right:
        assert (await call(right, request("test", KV))).overall_code == OK
        watch = health_pb2_grpc.HealthStub(right).Watch(
            health_pb2.HealthCheckRequest(service="ratelimit"), timeout=TIMEOUT
        )
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
    assert h.stats.service.total_requests == 1
