"""OTLP tracing and the gRPC interceptor: spans received by a real OTLP/HTTP endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from support.ready import wait_until
from support.settings_env import on_memory

from ratelimitd._proto import rls_pb2
from ratelimitd.backends.base import Backend, Op, SyncBackend
from ratelimitd.backends.traced import TracedBackend
from ratelimitd.health import Health
from ratelimitd.limiter import Limiter
from ratelimitd.settings import ListenerSettings, Settings
from ratelimitd.stats.base import RESPONSE_TIME
from ratelimitd.stats.tracing import Tracing, create_tracing
from ratelimitd.transport.grpc import GrpcTransport
from ratelimitd.transport.protocodec import request_domain
from ratelimitd.transport.spans import SHOULD_RATE_LIMIT, server_interceptor

from .conftest import CONFIG, OtlpReceiver

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"


def tracing_settings(**env: str) -> Settings:
    return on_memory(
        TRACING_ENABLED="true",
        TRACING_SERVICE_NAME="rl-test",
        TRACING_SERVICE_NAMESPACE="edge",
        **env,
    )


def make_request(domain: str, *descriptors: list[tuple[str, str]]) -> Any:
    msg = rls_pb2.RateLimitRequest(domain=domain)
    for entries in descriptors:
        d = msg.descriptors.add()
        for key, value in entries:
            d.entries.add(key=key, value=value)
    return msg


class Served:
    def __init__(self, server: grpc.aio.Server, port: int) -> None:
        self.server = server
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.call = self.channel.unary_unary(
            SHOULD_RATE_LIMIT,
            request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
            response_deserializer=rls_pb2.RateLimitResponse.FromString,
        )


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    """A GrpcTransport on a grpc.aio server (port 0), timed, with the tracing interceptor
    appended when `tracing` is given."""
    started: list[Served] = []

    async def start(h: Any, tracing: Tracing | None = None) -> Served:
        settings = Settings(listeners=ListenerSettings(grpc_host="127.0.0.1", grpc_port=0))
        health = Health()
        health.register("backend", True)
        timer = h.stats.timer(RESPONSE_TIME)
        transport = GrpcTransport(settings, h.service, health, h.stats, response_timer=timer)
        interceptor = server_interceptor(tracing)
        extra = [interceptor] if interceptor is not None else []
        server = grpc.aio.server(interceptors=[*transport.interceptors(), *extra])
        transport.register(server)
        port = transport.bind(server)
        await server.start()
        served = Served(server, port)
        started.append(served)
        return served

    yield start
    for served in started:
        await served.channel.close()
        await served.server.stop(0)


def traced(h: Any, settings: Settings) -> Tracing:
    """Tracing for a harness: its limiter rebuilt around the traced backend, as `build_core`
    does (a limiter chooses its synchronous or awaited path once, when it is built)."""
    tracing = create_tracing(settings)
    assert tracing is not None
    old = h.limiter
    h.limiter = Limiter(
        TracedBackend(h.backend, tracing.tracer),
        near_limit_ratio=old.near_limit_ratio,
        prefix=old.prefix,
        local_cache=old.local_cache,
        stop_increment=old.stop_increment,
        clock=old.clock,
    )
    h.service.limiter = h.limiter
    return tracing


def attrs(obj: Any) -> dict[str, Any]:
    out = {}
    for kv in obj.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


async def test_spans_reach_an_otlp_http_receiver(
    harness: Any, serve: Any, otlp_http: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_http.url)
    h = harness(CONFIG)
    settings = tracing_settings(TRACING_SERVICE_INSTANCE_ID="instance-7")
    tracing = traced(h, settings)
    served = await serve(h, tracing)
    metadata = (("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN}-01"),)
    for _ in range(2):
        response = await served.call(make_request("obs", [("user", "alice")]), metadata=metadata)
        assert response.overall_code == rls_pb2.RateLimitResponse.OK
    await tracing.shutdown()

    assert otlp_http.paths and set(otlp_http.paths) == {"/v1/traces"}
    spans = otlp_http.spans()
    servers = [(r, s) for r, s in spans if s.name == SHOULD_RATE_LIMIT.lstrip("/")]
    children = [s for _, s in spans if s.name == "Memory Pipeline Execution"]
    assert len(servers) == 2 and len(children) == 2
    resource, server = servers[0]
    assert attrs(resource)["service.name"] == "rl-test"
    assert attrs(resource)["service.namespace"] == "edge"
    assert attrs(resource)["service.instance.id"] == "instance-7"
    assert server.trace_id.hex() == TRACE_ID
    assert server.parent_span_id.hex() == PARENT_SPAN
    assert server.kind == server.SPAN_KIND_SERVER
    a = attrs(server)
    assert a["domain"] == "obs"
    assert a["rpc.system"] == "grpc"
    assert a["rpc.service"] == "envoy.service.ratelimit.v3.RateLimitService"
    assert a["rpc.method"] == "ShouldRateLimit"
    assert a["rpc.grpc.status_code"] == 0
    # One child span per backend round trip, under the request's span.
    server_ids = {s.span_id for _, s in servers}
    for child in children:
        assert child.parent_span_id in server_ids
        assert child.trace_id.hex() == TRACE_ID
        assert child.kind == child.SPAN_KIND_CLIENT
        assert attrs(child)["pipeline length"] == 2
    # The handler fed the response-time timer too.
    assert h.stats.timer(RESPONSE_TIME).count == 2
    assert h.stats.service.total_requests == 2


async def test_b3_headers_and_failed_calls(
    harness: Any, serve: Any, otlp_http: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_http.url)
    h = harness(CONFIG)
    tracing = traced(h, tracing_settings())
    served = await serve(h, tracing)
    b3 = (("b3", f"{TRACE_ID}-{PARENT_SPAN}-1"),)
    await served.call(make_request("obs", [("user", "x")]), metadata=b3)
    multi = (
        ("x-b3-traceid", TRACE_ID),
        ("x-b3-spanid", "00f067aa0ba902b7"),
        ("x-b3-sampled", "1"),
    )
    await served.call(make_request("obs", [("user", "y")]), metadata=multi)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await served.call(make_request("", [("user", "z")]))  # no domain: UNKNOWN
    assert info.value.code() == grpc.StatusCode.UNKNOWN

    def server_spans() -> list[Any]:
        return [s for _, s in otlp_http.spans() if s.name == SHOULD_RATE_LIMIT.lstrip("/")]

    async def all_three_exported() -> bool:
        # The client has the failed call's status before the server has closed its span.
        await tracing.force_flush()
        return len(server_spans()) == 3

    await wait_until(all_three_exported, what="the SERVER span of each call")
    await tracing.shutdown()

    servers = server_spans()
    assert len(servers) == 3
    by_parent = {s.parent_span_id.hex(): s for s in servers}
    assert by_parent[PARENT_SPAN].trace_id.hex() == TRACE_ID
    assert by_parent["00f067aa0ba902b7"].trace_id.hex() == TRACE_ID
    failed = by_parent[""]  # a root span: no incoming context
    assert attrs(failed)["rpc.grpc.status_code"] == grpc.StatusCode.UNKNOWN.value[0]
    assert failed.status.code == failed.status.STATUS_CODE_ERROR
    # The resource instance id is a random UUID v4 when unset.
    instance = attrs(otlp_http.spans()[0][0])["service.instance.id"]
    assert len(instance) == 36 and instance[14] == "4"


async def test_sampling_rate_zero_sends_no_span(
    harness: Any, serve: Any, otlp_http: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_http.url)
    h = harness(CONFIG)
    tracing = traced(h, tracing_settings(TRACING_SAMPLING_RATE="0"))
    served = await serve(h, tracing)
    for _ in range(5):
        await served.call(make_request("obs", [("user", "alice")]))
    assert await tracing.force_flush()
    await tracing.shutdown()
    assert otlp_http.spans() == []
    assert h.stats.timer(RESPONSE_TIME).count == 5  # timing does not depend on sampling


async def test_the_handler_times_every_call_without_tracing(harness: Any, serve: Any) -> None:
    h = harness(CONFIG)
    assert server_interceptor(None) is None  # no tracing: no interceptor at all
    served = await serve(h)
    for _ in range(3):
        await served.call(make_request("obs", [("user", "alice")]))
    timer = h.stats.timer(RESPONSE_TIME)
    assert timer.count == 3 == h.stats.service.total_requests
    assert timer.sum > 0
    sample, seen = timer.drain()
    assert seen == 3 and len(sample) == 3


def test_tracing_disabled_is_none_and_costs_nothing() -> None:
    assert create_tracing(on_memory()) is None
    assert server_interceptor(None) is None


def test_request_domain_reads_field_one() -> None:
    msg = make_request("dom-ä", [("k", "v")])
    msg.hits_addend = 3
    assert request_domain(msg.SerializeToString()) == "dom-ä"
    # Field order on the wire is free: descriptors and hits_addend before the domain.
    wire = msg.SerializeToString()
    reordered = rls_pb2.RateLimitRequest(hits_addend=3).SerializeToString()
    reordered += make_request("", [("k", "v")]).SerializeToString()
    reordered += rls_pb2.RateLimitRequest(domain="late").SerializeToString()
    assert request_domain(reordered) == "late"
    assert request_domain(b"") == ""
    assert request_domain(b"\x0a\xff") == ""  # truncated
    assert request_domain(wire[:1]) == ""


async def test_traced_backend_delegates(harness: Any) -> None:
    h = harness(CONFIG)
    settings = tracing_settings()
    tracing = create_tracing(settings, exporter=_NullExporter())  # type: ignore[arg-type]
    assert tracing is not None
    backend = TracedBackend(h.backend, tracing.tracer)
    assert backend.name == "memory"
    # A Backend, not a SyncBackend: the limiter awaits `increment` (one span per round).
    assert isinstance(backend, Backend)
    assert not isinstance(backend, SyncBackend)
    assert not Limiter(backend).synchronous
    assert Limiter(h.backend).synchronous
    await backend.connect()
    assert await backend.increment([Op("a", 2, 60)]) == [2]
    assert await backend.get([Op("a", 0, 60)]) == [2]
    assert backend.backend.ttl("a") == h.backend.ttl("a")  # the rest through `.backend`
    await backend.close()
    await tracing.shutdown()


class _NullExporter:
    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


async def test_native_transport_traces_and_times_like_grpc_aio(
    harness: Any, otlp_http: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native HTTP/2 transport makes the same spans (from the request's headers) and
    feeds the same timer, through the shared handler."""
    from ratelimitd.transport.native import NativeGrpcTransport

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_http.url)
    h = harness(CONFIG)
    tracing = traced(h, tracing_settings())
    settings = Settings(listeners=ListenerSettings(grpc_host="127.0.0.1", grpc_port=0))
    health = Health()
    health.register("backend", True)
    transport = NativeGrpcTransport(
        settings,
        h.service,
        health,
        h.stats,
        response_timer=h.stats.timer(RESPONSE_TIME),
        tracing=tracing,
    )
    await transport.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{transport.port}") as channel:
            call = channel.unary_unary(
                SHOULD_RATE_LIMIT,
                request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
                response_deserializer=rls_pb2.RateLimitResponse.FromString,
            )
            metadata = (("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN}-01"),)
            for _ in range(2):
                reply = await call(make_request("obs", [("user", "a")]), metadata=metadata)
                assert reply.overall_code == rls_pb2.RateLimitResponse.OK
            with pytest.raises(grpc.aio.AioRpcError):
                await call(make_request("", [("user", "a")]), metadata=metadata)
    finally:
        await transport.stop(0)
    await tracing.shutdown()
    spans = otlp_http.spans()
    servers = [s for _, s in spans if s.name == SHOULD_RATE_LIMIT.lstrip("/")]
    children = [s for _, s in spans if s.name == "Memory Pipeline Execution"]
    assert len(servers) == 3 and len(children) == 2
    assert {s.trace_id.hex() for s in servers} == {TRACE_ID}
    assert {s.parent_span_id.hex() for s in servers} == {PARENT_SPAN}
    assert sorted(attrs(s)["rpc.grpc.status_code"] for s in servers) == [0, 0, 2]
    assert {c.parent_span_id for c in children} <= {s.span_id for s in servers}
    assert h.stats.timer(RESPONSE_TIME).count == 3
    assert h.stats.service.total_requests == 3
