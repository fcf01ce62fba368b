"""The gRPC transport against a real grpc.aio server on a free port, called over real channels.

Covers the RLS v3 wire format (our own protos against hand-encoded bytes), decisions and
statuses, the reference's error statuses and texts, health, TLS / mTLS with certificates the
test makes (openssl CLI) and replaces on disk, client SAN enforcement, unix sockets, connection
options, and `ratelimitd client` run as a subprocess.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import uvloop
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.pki import Pki

from ratelimitd._proto import base_pb2, ratelimit_pb2, ratelimit_unit_pb2, rls_pb2, rls_pb2_grpc
from ratelimitd.backends.base import BackendError
from ratelimitd.cli import _go_float, go_quote, parse_flags, proto_text
from ratelimitd.config import ConfigFile, Rule
from ratelimitd.core import build_core
from ratelimitd.health import Health
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor, Request, Response, Status
from ratelimitd.service import RateLimitService
from ratelimitd.settings import GrpcSettings, ListenerSettings, Settings
from ratelimitd.transport import protocodec
from ratelimitd.transport.grpc import (
    METHOD_PATH,
    GrpcConfigError,
    GrpcTransport,
    dns_name_matches,
    listen_address,
    server_options,
)
from ratelimitd.transport.native import NativeGrpcTransport

REPO = Path(__file__).resolve().parents[2]

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


# -- helpers -----------------------------------------------------------------------------


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


# Both gRPC transports pass every test below (GRPC_TRANSPORT=native|grpcio).
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


async def call(channel: grpc.aio.Channel, msg: Any) -> Any:
    """ShouldRateLimit through the generated stub."""
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    return await stub.ShouldRateLimit(msg, timeout=TIMEOUT)


async def rpc_error(awaitable: Any) -> grpc.aio.AioRpcError:
    """The AioRpcError an RPC fails with."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return info.value


# -- wire format -------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, value: int | bytes | str) -> bytes:
    """One protobuf field: varint (wire type 0) for ints, length-delimited (2) otherwise."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def test_request_bytes_match_envoy_field_numbers() -> None:
    entry = _field(1, "k") + _field(2, "v")
    override = _field(1, 5) + _field(2, 2)  # requests_per_unit, unit MINUTE
    hits = b""  # a present UInt64Value holding 0 is an empty submessage
    descriptor = _field(1, entry) + _field(2, override) + _field(3, hits)
    wire = _field(1, "dom") + _field(2, descriptor) + _field(3, 7)

    msg = rls_pb2.RateLimitRequest(domain="dom", hits_addend=7)
    d = msg.descriptors.add()
    d.entries.add(key="k", value="v")
    d.limit.requests_per_unit = 5
    d.limit.unit = ratelimit_unit_pb2.MINUTE
    d.hits_addend.SetInParent()
    assert msg.SerializeToString() == wire
    assert rls_pb2.RateLimitRequest.FromString(wire) == msg
    assert protocodec.decode_request(wire) == Request(
        "dom", [Descriptor((("k", "v"),), (5, 2), 0)], 7
    )


def test_response_bytes_match_envoy_field_numbers() -> None:
    limit = _field(3, "n") + _field(1, 10) + _field(2, 7)  # name, requests_per_unit, WEEK
    status = _field(1, 2) + _field(2, limit) + _field(3, 4) + _field(4, _field(1, 58))
    header = _field(1, "RateLimit-Limit") + _field(2, "10")
    wire = _field(1, 2) + _field(2, status) + _field(3, header)
    msg = rls_pb2.RateLimitResponse.FromString(wire)
    assert msg.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    st = msg.statuses[0]
    assert (st.code, st.limit_remaining, st.duration_until_reset.seconds) == (2, 4, 58)
    assert st.current_limit.name == "n"
    assert st.current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.WEEK
    assert msg.response_headers_to_add[0] == base_pb2.HeaderValue(key="RateLimit-Limit", value="10")
    rule = Rule("test.k", 10, 7, name="n")
    ours = protocodec.encode_response(
        Response(OVER_LIMIT, [Status(OVER_LIMIT, rule, 4, 58)], [("RateLimit-Limit", "10")])
    )
    # Field order on the wire differs (we emit by field number); the messages are equal.
    assert rls_pb2.RateLimitResponse.FromString(ours) == msg


def test_proto_names_and_enums_are_envoys() -> None:
    assert rls_pb2.DESCRIPTOR.package == "envoy.service.ratelimit.v3"
    assert ratelimit_pb2.DESCRIPTOR.package == "envoy.extensions.common.ratelimit.v3"
    assert ratelimit_unit_pb2.DESCRIPTOR.package == "envoy.type.v3"
    assert base_pb2.DESCRIPTOR.package == "envoy.config.core.v3"
    service = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"]
    method = service.methods_by_name["ShouldRateLimit"]
    assert f"/{service.full_name}/{method.name}" == METHOD_PATH
    unit = rls_pb2.RateLimitResponse.RateLimit.Unit
    assert [
        unit.Value(n) for n in ("SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "YEAR")
    ] == [
        1,
        2,
        3,
        4,
        7,
        5,
        6,
    ]
    assert rls_pb2.RateLimitResponse.Code.Value("OVER_LIMIT") == 2
    hits = ratelimit_pb2.RateLimitDescriptor.DESCRIPTOR.fields_by_name["hits_addend"]
    assert (hits.number, hits.message_type.full_name) == (3, "google.protobuf.UInt64Value")
    # Generated modules live in our package, never in the top-level `envoy` package.
    assert rls_pb2.__name__ == "ratelimitd._proto.rls_pb2"


# -- codec -------------------------------------------------------------------------------


def test_decode_request_mapping() -> None:
    data = protocodec.encode_request(
        "d",
        [[("a", "1"), ("b", "")], Descriptor((("c", "2"),), (3, 7), 5), Descriptor((("e", "f"),))],
        hits_addend=2,
    )
    assert protocodec.decode_request(data) == Request(
        "d",
        [
            Descriptor((("a", "1"), ("b", ""))),
            Descriptor((("c", "2"),), (3, 7), 5),
            Descriptor((("e", "f"),), None, None),
        ],
        2,
    )
    with pytest.raises(protocodec.DecodeError):
        protocodec.decode_request(b"\xff\xff\xff")


def test_encode_response_fields_only_when_a_limit_applied() -> None:
    rule = Rule("d.k", 3, 2)
    resp = Response(
        OK,
        [Status(OK, rule, 2, 0), Status(OK, None, 0xFFFFFFFF, 0), Status(OK)],
        [("H", "1")],
        {"domain": "d", "n": {"x": [1, True, None]}},
    )
    msg = rls_pb2.RateLimitResponse.FromString(protocodec.encode_response(resp))
    limited, unlimited, unknown = msg.statuses
    assert limited.HasField("current_limit") and limited.HasField("duration_until_reset")
    assert limited.duration_until_reset.seconds == 0  # present although zero
    assert limited.current_limit.name == ""
    assert not unlimited.HasField("current_limit") and unlimited.limit_remaining == 0xFFFFFFFF
    assert not unknown.HasField("duration_until_reset")
    assert msg.dynamic_metadata["domain"] == "d"
    assert list(msg.dynamic_metadata["n"]["x"]) == [1.0, True, None]
    back = protocodec.decode_response(protocodec.encode_response(resp))
    assert back.statuses[0].rule == protocodec.Limit(3, 2, "")
    assert back.headers == [("H", "1")]
    no_meta = protocodec.decode_response(protocodec.encode_response(Response(OK, [])))
    assert no_meta.dynamic_metadata is None
    assert not rls_pb2.RateLimitResponse.FromString(
        protocodec.encode_response(Response(OK, []))
    ).HasField("dynamic_metadata")


# -- settings to server options ----------------------------------------------------------


def test_server_options_and_address() -> None:
    opts = dict(server_options(Settings()))
    assert opts == {
        "grpc.so_reuseport": 1,
        "grpc.max_connection_age_ms": 24 * 3600 * 1000,
        "grpc.max_connection_age_grace_ms": 3600 * 1000,
    }
    zero = dict(
        server_options(
            Settings(grpc=GrpcSettings(max_connection_age=0.0, max_connection_age_grace=0.0))
        )
    )
    assert zero == {"grpc.so_reuseport": 1}
    huge = dict(server_options(Settings(grpc=GrpcSettings(max_connection_age=10.0**9))))
    assert huge["grpc.max_connection_age_ms"] == 2**31 - 1
    assert listen_address(Settings()) == "0.0.0.0:8081"
    ipv6 = ListenerSettings(grpc_host="::1", grpc_port=9)
    assert listen_address(Settings(listeners=ipv6)) == "[::1]:9"
    uds = ListenerSettings(grpc_uds="/tmp/rl.sock")
    assert listen_address(Settings(listeners=uds)) == "unix:/tmp/rl.sock"


def test_dns_name_matching() -> None:
    assert dns_name_matches("client.example.com", "Client.Example.com")
    assert dns_name_matches("*.example.com", "client.example.com")
    assert not dns_name_matches("*.example.com", "a.b.example.com")
    assert not dns_name_matches("*.example.com", "example.com")
    assert not dns_name_matches("other.example.com", "client.example.com")


# -- decisions over a real channel -------------------------------------------------------


async def test_ok_then_over_limit_with_statuses(harness: Callable[..., Any], serve: Any) -> None:
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
        first = await call(channel, request("test", KV))
        second = await call(channel, request("test", KV))
        third = await call(channel, request("test", KV))
    assert [r.overall_code for r in (first, second, third)] == [OK, OK, OVER_LIMIT]
    st = first.statuses[0]
    assert st.code == OK and st.limit_remaining == 1
    assert st.current_limit == rls_pb2.RateLimitResponse.RateLimit(
        name="kv_limit", requests_per_unit=2, unit=rls_pb2.RateLimitResponse.RateLimit.MINUTE
    )
    assert st.duration_until_reset.seconds == RESET
    assert third.statuses[0].code == OVER_LIMIT and third.statuses[0].limit_remaining == 0
    s = h.stats.service
    assert s.total_requests == 3 and s.response_time_count == 3
    assert s.response_time_sum_ms > 0
    assert h.stat("ratelimit.service.rate_limit.test.k_v.over_limit") == 1


async def test_unknown_domain_unlimited_and_hits(harness: Callable[..., Any], serve: Any) -> None:
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
        unknown = await call(channel, request("nowhere", KV))
        assert unknown.overall_code == OK
        assert len(unknown.statuses) == 1 and not unknown.statuses[0].HasField("current_limit")
        unlimited = await call(channel, request("test", [("unlimited", "x")]))
        assert unlimited.statuses[0].limit_remaining == 0xFFFFFFFF
        # A request-level hits_addend of 2 uses the whole limit at once.
        assert (await call(channel, request("test", KV, hits=2))).overall_code == OK
        # A descriptor hits_addend of 0 checks without consuming.
        msg = request("test", KV)
        msg.descriptors[0].hits_addend.SetInParent()
        check = await call(channel, msg)
        assert check.overall_code == OK and check.statuses[0].limit_remaining == 0
        assert (await call(channel, request("test", KV))).overall_code == OVER_LIMIT


async def test_a_refund_gives_hits_back(harness: Callable[..., Any], serve: Any) -> None:
    # is_negative_hits (Envoy API v1.38, field 4) through each transport's codec.
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
        assert (await call(channel, request("test", KV, hits=2))).statuses[0].limit_remaining == 0
        msg = request("test", KV)
        msg.descriptors[0].hits_addend.value = 1
        msg.descriptors[0].is_negative_hits = True
        refund = await call(channel, msg)
        assert (refund.overall_code, refund.statuses[0].limit_remaining) == (OK, 1)
        assert (await call(channel, request("test", KV))).overall_code == OK
        assert (await call(channel, request("test", KV))).overall_code == OVER_LIMIT
    assert h.stat("ratelimit.service.rate_limit.test.k_v.total_negative_hits") == 1


async def test_headers_and_dynamic_metadata(harness: Callable[..., Any], serve: Any) -> None:
    from ratelimitd.settings import ReloadOptions

    options = ReloadOptions(response_headers=True, response_dynamic_metadata=True)
    h = harness(CONFIG, options=options)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
        resp = await call(channel, request("test", KV))
    headers = {hv.key: hv.value for hv in resp.response_headers_to_add}
    assert headers == {"RateLimit-Limit": "2", "RateLimit-Remaining": "1", "RateLimit-Reset": "20"}
    assert resp.dynamic_metadata["domain"] == "test"


async def test_dynamic_metadata_limit_names(harness: Callable[..., Any], serve: Any) -> None:
    # RESPONSE_DYNAMIC_METADATA_LIMIT_NAME (upstream PR #1239's ask, opt-in): each
    # descriptor's code and deciding limit, and the limit that made the response OVER_LIMIT.
    from ratelimitd.settings import ReloadOptions

    options = ReloadOptions(response_dynamic_metadata=True, dynamic_metadata_limit_name=True)
    h = harness(CONFIG, options=options)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
        first = await call(channel, request("test", KV, [("unlimited", "x")], [("other", "y")]))
        await call(channel, request("test", KV))
        third = await call(channel, request("test", KV))
    described = [dict(d) for d in first.dynamic_metadata["descriptors"]]
    assert [(d["code"], d.get("limitName")) for d in described] == [
        ("OK", "kv_limit"),
        ("OK", None),  # unlimited: no limit applied
        ("OK", None),  # no rule
    ]
    assert "limitName" not in first.dynamic_metadata
    assert third.overall_code == OVER_LIMIT
    assert third.dynamic_metadata["limitName"] == "kv_limit"
    assert third.dynamic_metadata["descriptors"][0]["code"] == "OVER_LIMIT"
    # Off by default: the reference's metadata, unchanged.
    plain = harness(CONFIG, options=ReloadOptions(response_dynamic_metadata=True))
    served = await serve(plain.service, plain.stats)
    async with served.channel() as channel:
        resp = await call(channel, request("test", KV))
    assert set(resp.dynamic_metadata["descriptors"][0]) == {"entries"}


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        (request("", KV), "rate limit domain must not be empty"),
        (request("test"), "rate limit descriptor list must not be empty"),
    ],
)
async def test_service_errors_are_unknown_with_the_text(
    harness: Callable[..., Any], serve: Any, msg: Any, message: str
) -> None:
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
        err = await rpc_error(call(channel, msg))
    assert (err.code(), err.details()) == (grpc.StatusCode.UNKNOWN, message)
    assert h.stats.service.service_error == 1
    assert h.stats.service.total_requests == 1


async def test_no_config_loaded(harness: Callable[..., Any], serve: Any) -> None:
    h = harness(CONFIG)
    service = RateLimitService(h.limiter, h.stats)
    served = await serve(service, h.stats)
    async with served.channel() as channel:
        err = await rpc_error(call(channel, request("test", KV)))
    assert (err.code(), err.details()) == (
        grpc.StatusCode.UNKNOWN,
        "no rate limit configuration loaded",
    )


async def test_backend_error_is_unknown_and_counted(serve: Any) -> None:
    class Unreachable:
        """A backend whose store is down (an async one: the limiter awaits `increment`)."""

        name = "unreachable"

        async def connect(self) -> None:
            return None

        async def increment(self, ops: object) -> list[int]:
            raise BackendError("connection refused to redis at 127.0.0.1:6379")

        async def get(self, ops: object) -> list[int]:
            raise BackendError("connection refused to redis at 127.0.0.1:6379")

        async def close(self) -> None:
            return None

    core = build_core(backend=Unreachable())
    core.load([ConfigFile("config.yaml", CONFIG)])
    served = await serve(core.service, core.stats)
    async with served.channel() as channel:
        err = await rpc_error(call(channel, request("test", KV)))
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == "connection refused to redis at 127.0.0.1:6379"
    assert core.stats.snapshot()["ratelimit.service.call.should_rate_limit.redis_error"] == 1


async def test_unexpected_error_is_unknown_and_logged(
    harness: Callable[..., Any],
    serve: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    real = h.service.should_rate_limit

    async def boom(req: Request) -> Response:
        raise RuntimeError("boom")

    monkeypatch.setattr(h.service, "should_rate_limit", boom)
    async with served.channel() as channel:
        err = await rpc_error(call(channel, request("test", KV)))
        assert (err.code(), err.details()) == (grpc.StatusCode.UNKNOWN, "boom")
        assert "ShouldRateLimit failed unexpectedly" in caplog.text
        monkeypatch.setattr(h.service, "should_rate_limit", real)
        assert (await call(channel, request("test", KV))).overall_code == OK
        # Bytes that are not a RateLimitRequest: grpc-go's INTERNAL, never a crash.
        raw = channel.unary_unary(METHOD_PATH)
        bad = await rpc_error(raw(b"\xff\xff\xff", timeout=TIMEOUT))
        assert bad.code() == grpc.StatusCode.INTERNAL
        assert bad.details().startswith("grpc: error unmarshalling request")


async def test_field_number_zero_is_refused_as_grpc_go_refuses_it(
    harness: Callable[..., Any], serve: Any
) -> None:
    # grpc-go (google.golang.org/protobuf) and upb reject field number 0 in any message.
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
        raw = channel.unary_unary(METHOD_PATH)
        good = _field(1, "test") + _field(2, _field(1, _field(1, "key") + _field(2, "value")))
        for data in (_field(0, 1) + good, good + _field(2, _field(0, b""))):
            bad = await rpc_error(raw(data, timeout=TIMEOUT))
            assert (bad.code(), bad.details()) == (
                grpc.StatusCode.INTERNAL,
                "grpc: error unmarshalling request: proto: cannot parse invalid wire-format data",
            )


# -- health ------------------------------------------------------------------------------


async def test_health_follows_health_state(harness: Callable[..., Any], serve: Any) -> None:
    h = harness(CONFIG)
    health = Health()
    health.register("backend", False)
    served = await serve(h.service, h.stats, health=health)
    async with served.channel() as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def status(name: str) -> int:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=TIMEOUT)
            return reply.status

        serving, not_serving = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        assert await status("ratelimit") == not_serving
        assert await status("") == serving
        health.set("backend", True)
        assert await status("ratelimit") == serving
        health.register("sigterm", False)
        assert await status("ratelimit") == not_serving
        assert await status("") == serving
        err = await rpc_error(stub.Check(health_pb2.HealthCheckRequest(service="other")))
        assert err.code() == grpc.StatusCode.NOT_FOUND
    # ShouldRateLimit stats do not count health checks.
    assert h.stats.service.total_requests == 0


def test_serves_on_uvloop(harness: Callable[..., Any], transport_cls: type[Any]) -> None:
    """The daemon serves gRPC on uvloop (the other async tests use the suite's loop)."""
    h = harness(CONFIG)

    async def main() -> tuple[int, int]:
        transport = transport_cls(plain_settings(), h.service, Health(), h.stats)
        await transport.start()
        try:
            target = f"127.0.0.1:{transport.port}"
            async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
                first = await call(channel, request("test", KV, hits=2))
                second = await call(channel, request("test", KV))
            return first.overall_code, second.overall_code
        finally:
            await transport.stop(0)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == (OK, OVER_LIMIT)
        assert isinstance(runner.get_loop(), uvloop.Loop)


async def test_unix_socket(harness: Callable[..., Any], serve: Any, tmp_path: Path) -> None:
    h = harness(CONFIG)
    path = tmp_path / "ratelimit.sock"
    served = await serve(h.service, h.stats, settings=plain_settings(grpc_uds=str(path)))
    assert served.target == f"unix:{path}" and served.transport.port == 0
    assert path.exists()
    async with served.channel() as channel:
        assert (await call(channel, request("test", KV))).overall_code == OK


# -- TLS (the test PKI `certs` fixture lives in conftest.py) ------------------------------


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


# -- the client CLI ----------------------------------------------------------------------


CLIENT = "import sys; from ratelimitd.cli import client_main; sys.exit(client_main(sys.argv[1:]))"


async def run_client(*args: str) -> tuple[int, str, str]:
    """`ratelimitd client ARGS` as a subprocess (the event loop keeps serving meanwhile)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_client_cli_ok_then_over_limit(harness: Callable[..., Any], serve: Any) -> None:
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    code, out, _ = await run_client(
        "-dial_string", served.target, "-domain", "test", "-descriptors", "k=v"
    )
    assert code == 0
    assert out.splitlines() == [
        'Flag: --descriptors="[ <key=k, value=v> ] "',
        f'Flag: --dial_string="{served.target}"',
        'Flag: --domain="test"',
        'Flag: --grpc-cert-file=""',
        'Flag: --grpc-key-file=""',
        'Flag: --grpc-server-ca-file=""',
        'Flag: --grpc-use-tls="false"',
        'Flag: --hits_addend="1"',
        'Flag: --oltp-protocol=""',
        'response: overall_code:OK statuses:{code:OK current_limit:{name:"kv_limit" '
        "requests_per_unit:2 unit:MINUTE} limit_remaining:1 "
        f"duration_until_reset:{{seconds:{RESET}}}}}",
    ]
    code, out, _ = await run_client(
        f"--dial_string={served.target}", "--domain", "test", "--descriptors=k=v", "-hits_addend=2"
    )
    assert code == 0
    assert 'Flag: --hits_addend="2"' in out
    assert out.splitlines()[-1].startswith(
        "response: overall_code:OVER_LIMIT statuses:{code:OVER_LIMIT"
    )
    code, out, _ = await run_client(
        "--dial_string", served.target, "--domain", "test",
        "--descriptors", "k=v,x=y", "--descriptors", "unlimited=1",
    )  # fmt: skip
    assert code == 0
    assert (
        'Flag: --descriptors="[ <key=k, value=v>  <key=x, value=y> ] [ <key=unlimited, value=1> ] "'
        in out
    )
    assert out.splitlines()[-1] == (
        "response: overall_code:OK statuses:{code:OK} statuses:{code:OK limit_remaining:4294967295}"
    )


@pytest.mark.parametrize("pairs", ["k", "k=v=w", "k=v,", ""])
async def test_client_cli_malformed_pair(pairs: str) -> None:
    code, out, err = await run_client("-domain", "test", "-descriptors", pairs)
    assert code == 1
    assert "invalid descriptor list" in err
    assert out == ""


async def test_client_cli_errors(harness: Callable[..., Any], serve: Any) -> None:
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    code, out, _ = await run_client("-dial_string", served.target, "-domain", "test")
    assert code == 1
    assert out.splitlines()[-1] == (
        "request error: rpc error: code = Unknown "
        "desc = rate limit descriptor list must not be empty"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    code, out, _ = await run_client(
        "-dial_string", f"127.0.0.1:{closed}", "-domain", "test", "-descriptors", "k=v"
    )
    assert code == 1
    assert out.splitlines()[-1].startswith("request error: rpc error: code = Unavailable")
    code, out, _ = await run_client(
        "-grpc-use-tls", "-grpc-server-ca-file", "/nonexistent/ca.pem", "-descriptors", "k=v"
    )
    assert code == 1
    assert out.splitlines()[-1].startswith("error connecting: ")
    code, _, err = await run_client("-no-such-flag")
    assert code == 2 and "flag provided but not defined: -no-such-flag" in err


async def test_client_cli_mtls(serve_tls: Callable[..., Awaitable[Served]], certs: Pki) -> None:
    served = await serve_tls(client_tls_cacert=str(certs.ca))
    code, out, _ = await run_client(
        "--dial_string", served.target, "--domain", "test", "--descriptors", "k=v",
        "--grpc-use-tls", "--grpc-server-ca-file", str(certs.ca),
        "--grpc-cert-file", str(certs.client[0]), "--grpc-key-file", str(certs.client[1]),
    )  # fmt: skip
    assert code == 0, out
    assert 'Flag: --grpc-use-tls="true"' in out
    assert out.splitlines()[-1].startswith("response: overall_code:OK")


def test_client_flag_parsing_and_formatting() -> None:
    flags = parse_flags(["--domain=d", "-descriptors", "a=b", "--grpc-use-tls=false", "rest"])
    assert (flags.domain, flags.descriptors, flags.grpc_use_tls) == ("d", [[("a", "b")]], False)
    assert parse_flags(["-hits_addend", "0x10"]).hits_addend == 16
    assert go_quote('a"b\\c\n\x01é\u00a0') == '"a\\"b\\\\c\\n\\x01é\\u00a0"'
    assert [_go_float(x) for x in (1.0, 1.5, 1e6, 123456.0, 1e-5, 0.0001, -2.5e21)] == [
        "1",
        "1.5",
        "1e+06",
        "123456",
        "1e-05",
        "0.0001",
        "-2.5e+21",
    ]
    msg = rls_pb2.RateLimitResponse(overall_code=1)
    msg.dynamic_metadata.update({"b": 1.0, "a": "x"})
    assert proto_text(msg) == (
        'overall_code:OK dynamic_metadata:{fields:{key:"a" value:{string_value:"x"}} '
        'fields:{key:"b" value:{number_value:1}}}'
    )


# -- drain and deadlines (both transports) -----------------------------------------------


class Gate:
    """A service stand-in whose decisions wait until `release()`."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.cancelled = 0

    async def __call__(self, req: Request) -> Response:
        self.entered.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await self.real(req)


def gated_harness(harness: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Gate]:
    """A harness on CONFIG whose service decides only once its Gate is released."""
    h = harness(CONFIG)
    gate = Gate(h.service.should_rate_limit)
    monkeypatch.setattr(h.service, "should_rate_limit", gate)
    # A limiter that waits (as Redis does): the native transport takes its task path.
    monkeypatch.setattr(h.limiter, "synchronous", False)
    return h, gate


async def test_stop_drains_in_flight_calls(
    harness: Callable[..., Any], serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, gate = gated_harness(harness, monkeypatch)
    health = Health()
    health.register("backend", True)
    served = await serve(h.service, h.stats, health=health)
    async with served.channel() as channel:
        in_flight = asyncio.ensure_future(call(channel, request("test", KV)))
        await asyncio.wait_for(gate.entered.wait(), TIMEOUT)
        stopping = asyncio.ensure_future(served.transport.stop(TIMEOUT))
        await asyncio.sleep(0.2)
        assert not stopping.done()  # waiting for the call
        # No new connections once stopping.
        async with served.channel() as late:
            err = await rpc_error(call(late, request("test", KV)))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
        gate.gate.set()
        assert (await in_flight).overall_code == OK
        await asyncio.wait_for(stopping, TIMEOUT)
    assert h.stats.service.total_requests == 1


async def test_deadline_exceeded_cancels_the_pending_work(
    harness: Callable[..., Any], serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, gate = gated_harness(harness, monkeypatch)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        err = await rpc_error(stub.ShouldRateLimit(request("test", KV), timeout=0.3))
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server side gave up too: the waiting decision was cancelled.
        await asyncio.wait_for(_until(lambda: gate.cancelled == 1), TIMEOUT)
        gate.gate.set()
        assert (await call(channel, request("test", KV))).overall_code == OK


async def _until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.01)
