"""The SERVER span of each gRPC ShouldRateLimit call, as otelgrpc makes it (TRACING_ENABLED):
`ServerSpans` for any gRPC transport (the native one calls it), `ServerInterceptor` for
grpc.aio. The provider and the backend's child spans are `ratelimitd.stats.tracing`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
import grpc.aio

from ..stats.tracing import Tracing
from .protocodec import METHOD_PATH, request_domain

# The span name's RPC (kept under this name for the tracing tests and benchmarks).
SHOULD_RATE_LIMIT = METHOD_PATH

# What a grpc.aio ServerInterceptor is handed and returns.
Details: TypeAlias = grpc.HandlerCallDetails
Handler: TypeAlias = grpc.RpcMethodHandler
Continuation: TypeAlias = Callable[[Details], Awaitable[Handler]]


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

    async def intercept_service(self, continuation: Continuation, details: Details) -> Handler:
        handler = await continuation(details)
        if (
            handler is None
            or details.method != self.method  # type: ignore[attr-defined]
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
