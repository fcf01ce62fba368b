"""The OpenTelemetry packages import and export in this environment, beside our stubs.

xds-protos would overwrite `opentelemetry/proto/**` with a pre-1.0 OTLP schema; we do not
install it, and our RLS stubs live under `ratelimitd._proto`, so both sets of generated
modules must load side by side in one descriptor pool and encode current OTLP messages.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest

OTEL_MODULES = [
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.propagators.b3",
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    "opentelemetry.proto.trace.v1.trace_pb2",
    "prometheus_client.parser",
]


@pytest.mark.parametrize("name", OTEL_MODULES)
def test_imports_without_warnings(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module(name)


def test_otlp_schema_is_current_and_beside_our_stubs() -> None:
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    from ratelimitd._proto import rls_pb2

    # Present only in OTLP >= 0.15 (what xds-protos' stale copy lacks).
    assert hasattr(common_pb2, "InstrumentationScope")
    assert hasattr(trace_pb2, "ScopeSpans")
    assert "flags" in trace_pb2.Span.DESCRIPTOR.fields_by_name
    # Separate packages on disk: no file of one shadows the other.
    otel_dir = Path(trace_pb2.__file__).resolve().parent
    ours = Path(rls_pb2.__file__).resolve().parent
    assert "site-packages" in str(otel_dir)
    assert ours.name == "_proto" and ours.parent.name == "ratelimitd"
    assert rls_pb2.DESCRIPTOR.package == "envoy.service.ratelimit.v3"


def test_spans_encode_to_otlp_protobuf() -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "probe"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with (
        provider.get_tracer("t").start_as_current_span("outer"),
        provider.get_tracer("t").start_as_current_span("inner", attributes={"domain": "d"}),
    ):
        pass
    provider.shutdown()
    encoded = encode_spans(memory.get_finished_spans()).SerializeToString()
    decoded = trace_service_pb2.ExportTraceServiceRequest.FromString(encoded)
    names = [s.name for rs in decoded.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sorted(names) == ["inner", "outer"]


def test_both_exporters_construct() -> None:
    from ratelimitd.stats.tracing import _exporter

    http = _exporter("http")
    grpc_exporter = _exporter("grpc")
    try:
        assert type(http).__module__.startswith("opentelemetry.exporter.otlp.proto.http")
        assert type(grpc_exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")
    finally:
        http.shutdown()
        grpc_exporter.shutdown()
