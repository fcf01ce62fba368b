"""OTLP tracing (TRACING_*): the provider and the backend's child spans (the gRPC SERVER
spans are the transports' own: `transport/spans.py`).

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
  status code and the request's `domain` (field 1 of the request bytes): made by the
  transports (`transport/spans.py`) with this module's tracer and propagator;
* one CLIENT child span per backend round trip (`backends.traced.TracedBackend`, with this
  module's tracer), named as the backend declares (`Capabilities.span`: the reference's
  `Redis Pipeline Execution` for Redis), with the number of commands as `pipeline length`.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

from ..settings import Settings

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

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
