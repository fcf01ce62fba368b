"""The gRPC transport against a real grpc.aio server on a free port, called over real channels.

Covers the RLS v3 wire format (our own protos against hand-encoded bytes), the codec, settings
to server options, decisions and statuses, the reference's error statuses and texts, health,
uvloop and unix sockets. TLS / mTLS is in test_grpc_tls.py, `ratelimitd client` in
test_grpc_client.py, drain and deadlines in test_grpc_drain.py; the shared client side is
support.grpc_rls and the `serve` fixtures are in conftest.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import uvloop
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.core import StoreDouble
from support.grpc_rls import (
    CHANNEL_OPTIONS,
    CONFIG,
    KV,
    RESET,
    TIMEOUT,
    call,
    plain_settings,
    request,
    rpc_error,
)

from ratelimitd._proto import base_pb2, ratelimit_pb2, ratelimit_unit_pb2, rls_pb2
from ratelimitd.backends.base import BackendError
from ratelimitd.config import ConfigFile, Rule
from ratelimitd.core import build_core
from ratelimitd.health import Health
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor, Request, Response, Status
from ratelimitd.service import RateLimitService
from ratelimitd.settings import GrpcSettings, ListenerSettings, Settings, WorkerSettings
from ratelimitd.transport import protocodec
from ratelimitd.transport.grpc import (
    METHOD_PATH,
    dns_name_matches,
    listen_address,
    server_options,
)

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
        "grpc.so_reuseport": 0,  # a lone daemon: a second one on the port fails to bind
        "grpc.max_connection_age_ms": 24 * 3600 * 1000,
        "grpc.max_connection_age_grace_ms": 3600 * 1000,
    }
    zero = dict(
        server_options(
            Settings(grpc=GrpcSettings(max_connection_age=0.0, max_connection_age_grace=0.0))
        )
    )
    assert zero == {"grpc.so_reuseport": 0}
    worker = Settings(workers=WorkerSettings(count=1, index=0))
    assert dict(server_options(worker))["grpc.so_reuseport"] == 1
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
    class Unreachable(StoreDouble):
        """A backend whose store is down (an async one: the limiter awaits `increment`)."""

        name = "unreachable"

        async def increment(self, ops: object) -> list[int]:
            raise BackendError("connection refused to redis at 127.0.0.1:6379")

        get = increment

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
    broken = harness(CONFIG)

    def boom(req: Request, waiter: object = None) -> Response:
        raise RuntimeError("boom")

    # The service's one entry, broken before the transport takes it.
    monkeypatch.setattr(broken.service, "decide", boom)
    async with (await serve(broken.service, broken.stats)).channel() as channel:
        err = await rpc_error(call(channel, request("test", KV)))
        assert (err.code(), err.details()) == (grpc.StatusCode.UNKNOWN, "boom")
        assert "ShouldRateLimit failed unexpectedly" in caplog.text
    h = harness(CONFIG)
    served = await serve(h.service, h.stats)
    async with served.channel() as channel:
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
