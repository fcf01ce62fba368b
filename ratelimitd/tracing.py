"""OTLP tracing (TRACING_*): the provider, backend child spans, and SERVER spans for gRPC.

`create_tracing(settings)` is None unless TRACING_ENABLED: then nothing of OpenTelemetry is
imported and the request path is untouched. Otherwise it builds, without touching any
OpenTelemetry global, a TracerProvider with the resource attributes `service.name`,
`service.namespace` and `service.instance.id` (a random UUID v4 when
TRACING_SERVICE_INSTANCE_ID is unset), a parent-based TraceIdRatioBased(TRACING_SAMPLING_RATE)
sampler, and a BatchSpanProcessor exporting over OTLP/HTTP or OTLP/gRPC as
TRACING_EXPORTER_PROTOCOL says. The exporters read the standard OTEL_EXPORTER_OTLP_*
variables themselves (endpoint, headers, timeout, certificates, compression).

Spans, as the reference emits them (otelgrpc's server span, then its own spans):

* one SERVER span per ShouldRateLimit, `envoy.service.ratelimit.v3.RateLimitService/
  ShouldRateLimit`, continuing the trace of the incoming gRPC metadata (W3C `traceparent`
  and `baggage`, B3 single `b3` or multi `x-b3-*` headers), with `rpc.*` attributes, the
  status code and the request's `domain` (field 1 of the request bytes);
* one CLIENT child span per backend round trip (`TracedBackend`), named as the reference's
  Redis span (`Redis Pipeline Execution`; other backends use their own name), with the
  number of commands as `pipeline length`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from .settings import Settings
from .transport.protocodec import METHOD_PATH, request_domain

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

    from .backends.base import Backend, Op

# The span name's RPC (kept under this name for the tracing tests and benchmarks).
SHOULD_RATE_LIMIT = METHOD_PATH
INSTRUMENTATION_NAME = "ratelimitd"


class Tracing:
    """An OpenTelemetry tracer provider, its tracer and the incoming-context propagator."""

    def __init__(
        self,
        provider: TracerProvider,
        propagator: TextMapPropagator,
        sampling_rate: float = 1.0,
    ) -> None:
        self.provider = provider
        self.propagator = propagator
        self.tracer: Tracer = provider.get_tracer(INSTRUMENTATION_NAME)
        # The metadata keys the propagators read (lower case, as gRPC delivers them); B3's
        # single header is read by B3MultiFormat without being listed in its fields.
        self.fields = frozenset({*(f.lower() for f in propagator.fields), "b3"})
        # With a rate of 0 the parent-based sampler drops every request that arrives
        # without a trace context: such requests skip OpenTelemetry entirely.
        self.drop_roots = sampling_rate <= 0.0

    def traced_backend(self, backend: Backend) -> TracedBackend:
        """The backend with a child span around each round trip."""
        return TracedBackend(backend, self.tracer)

    async def force_flush(self, timeout: float = 10.0) -> bool:
        """Export every finished span now (in a thread: the exporters block)."""
        millis = int(timeout * 1000)
        return await asyncio.to_thread(self.provider.force_flush, millis)

    async def shutdown(self) -> None:
        """Export what is pending and stop the exporter (in a thread: it blocks)."""
        await asyncio.to_thread(self.provider.shutdown)


def _exporter(protocol: str) -> SpanExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()


def create_tracing(settings: Settings, exporter: SpanExporter | None = None) -> Tracing | None:
    """Tracing per TRACING_*, or None when TRACING_ENABLED is false (zero cost)."""
    tracing = settings.tracing
    if not tracing.enabled:
        return None
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.b3 import B3MultiFormat
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    attributes = {
        "service.name": tracing.service_name,
        "service.instance.id": tracing.service_instance_id or str(uuid.uuid4()),
    }
    if tracing.service_namespace:
        attributes["service.namespace"] = tracing.service_namespace
    provider = TracerProvider(
        resource=Resource.create(attributes),
        sampler=ParentBased(TraceIdRatioBased(tracing.sampling_rate)),
    )
    provider.add_span_processor(
        BatchSpanProcessor(exporter or _exporter(tracing.exporter_protocol))
    )
    # B3MultiFormat extracts the single `b3` header as well as the `x-b3-*` ones.
    propagator = CompositePropagator(
        [TraceContextTextMapPropagator(), W3CBaggagePropagator(), B3MultiFormat()]
    )
    return Tracing(provider, propagator, tracing.sampling_rate)


# -- backend child spans -------------------------------------------------------------------


class TracedBackend:
    """A Backend whose round trips are child spans of the request's span.

    Only when the current span is recording (a sampled request) is a span started, so an
    unsampled request pays one context lookup. It implements `Backend` and nothing more:
    not being a `SyncBackend`, it makes the limiter await `increment`, so each round is one
    span. What else the wrapped store offers is reached through `.backend`.
    """

    def __init__(self, backend: Backend, tracer: Tracer) -> None:
        from opentelemetry import trace

        self.backend = backend
        self.name = backend.name
        from .backends.base import capabilities

        self.algorithms = capabilities(backend)[1]
        self._tracer = tracer
        self._current_span = trace.get_current_span
        self._client = trace.SpanKind.CLIENT
        self.span_name = (
            "Redis Pipeline Execution"
            if backend.name == "redis"
            else f"{backend.name.capitalize()} Pipeline Execution"
        )

    async def connect(self) -> None:
        """Connect the wrapped backend (not traced: start-up, not a request)."""
        await self.backend.connect()

    def _span(self, commands: int) -> Any:
        if not self._current_span().is_recording():
            return None
        return self._tracer.start_as_current_span(
            self.span_name, kind=self._client, attributes={"pipeline length": commands}
        )

    async def increment(self, ops: Sequence[Op]) -> list[Any]:
        """INCRBY + EXPIRE per op, in a span."""
        span = self._span(2 * len(ops))
        if span is None:
            return await self.backend.increment(ops)
        with span:
            return await self.backend.increment(ops)

    async def get(self, ops: Sequence[Op]) -> list[int]:
        """GET per key, in a span."""
        span = self._span(len(ops))
        if span is None:
            return await self.backend.get(ops)
        with span:
            return await self.backend.get(ops)

    async def delete(self, keys: Sequence[str]) -> int:
        """The wrapped store's delete (an admin's reset: not traced)."""
        return await self.backend.delete(keys)

    async def close(self) -> None:
        """Close the wrapped backend."""
        await self.backend.close()


# -- SERVER spans ---------------------------------------------------------------------------


class ServerSpans:
    """The SERVER span of a call, as otelgrpc makes it, for any gRPC transport.

    The span continues the trace of the call's propagation headers (`carrier`, lower-case
    names), carries the `rpc.*` attributes, the request's `domain` and the status code, and
    is the current span while `call` runs, so backend round trips become its children.
    """

    def __init__(self, tracing: Tracing, method: str = SHOULD_RATE_LIMIT) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.tracing = tracing
        self.fields = tracing.fields
        self._tracer = tracing.tracer
        self._extract = tracing.propagator.extract
        self._drop_roots = tracing.drop_roots
        self._server_kind = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)
        service, _, rpc_method = method.lstrip("/").partition("/")
        self._span_name = method.lstrip("/")
        self._base_attributes = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": rpc_method,
        }

    async def run(
        self,
        carrier: dict[str, str],
        request: Any,
        call: Callable[[], Awaitable[Any]],
        code_of: Callable[[Any], int] | None = None,
        code_on_error: Callable[[], int] | None = None,
    ) -> Any:
        """`await call()` inside the call's span; `code_of(result)` is its status code."""
        if not carrier and self._drop_roots:
            return await call()
        with self._tracer.start_as_current_span(
            self._span_name,
            context=self._extract(carrier) if carrier else None,
            kind=self._server_kind,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            if not span.is_recording():
                return await call()
            span.set_attributes(self._base_attributes)
            span.set_attribute("domain", request_domain(request))
            try:
                result = await call()
            except BaseException:
                self._set_code(span, code_on_error() if code_on_error else 2)
                raise
            self._set_code(span, code_of(result) if code_of else 0)
            return result

    def _set_code(self, span: Any, code: int) -> None:
        span.set_attribute("rpc.grpc.status_code", code)
        if code in _ERROR_CODES:
            span.set_status(self._error)


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """The SERVER span of each ShouldRateLimit on the grpc.aio transport (`ServerSpans`).

    The wrapped handler is built once per registered handler (grpc hands the same one to
    every call), so a call pays one extra coroutine frame and the span. (The response-time
    timer is not fed here: the transports' shared handler, `transport.rls`, times every
    call, traced or not.)
    """

    def __init__(self, tracing: Tracing, method: str = SHOULD_RATE_LIMIT) -> None:
        self.tracing = tracing
        self.method = method
        self._inner: Any = None
        self._wrapped: Any = None
        self._spans = ServerSpans(tracing, method)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or handler_call_details.method != self.method  # type: ignore[attr-defined]
            or handler.unary_unary is None
        ):
            return handler
        if handler is not self._inner:
            self._wrapped = handler._replace(  # type: ignore[attr-defined]
                unary_unary=self._wrap(handler.unary_unary)
            )
            self._inner = handler
        return self._wrapped  # type: ignore[no-any-return]

    def _wrap(self, inner: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]) -> Any:
        spans = self._spans
        fields = spans.fields

        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            # Only the propagation headers: most calls carry just user-agent and the like.
            carrier = {
                m.key: m.value for m in (context.invocation_metadata() or ()) if m.key in fields
            }
            return await spans.run(
                carrier,
                request,
                lambda: inner(request, context),
                code_on_error=lambda: _status_code(context),
            )

        return traced


# otelgrpc marks a server span as failed for these codes only.
_ERROR_CODES = frozenset(
    c.value[0]
    for c in (
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    )
)


def _status_code(context: grpc.aio.ServicerContext) -> int:
    with contextlib.suppress(Exception):
        code = context.code()
        if isinstance(code, grpc.StatusCode):
            return int(code.value[0])
        if isinstance(code, int):
            return code
    return grpc.StatusCode.UNKNOWN.value[0]  # type: ignore[no-any-return]


def server_interceptor(tracing: Tracing | None) -> grpc.aio.ServerInterceptor | None:
    """The interceptor to append to a grpc.aio server's list, None when tracing is off."""
    if tracing is None:
        return None
    return ServerInterceptor(tracing)
