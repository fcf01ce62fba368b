"""`TracedBackend`: a backend whose round trips are CLIENT child spans of the request's span,
with the tracer of `stats.tracing` (the reference's `Redis Pipeline Execution` spans)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .base import Backend, Op, PassThrough

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


class TracedBackend(PassThrough):
    """A Backend whose round trips are child spans of the request's span.

    Only when the current span is recording (a sampled request) is a span started, so an
    unsampled request pays one context lookup. It implements `Backend` and nothing more:
    not being a `SyncBackend`, it makes the limiter await `increment`, so each round is one
    span. `connect`, `peek` (`/explain`), `delete` (an admin's reset) and `close` are not
    requests and pass through untraced. What else the wrapped store offers is reached
    through `.backend`.
    """

    def __init__(self, backend: Backend, tracer: Tracer) -> None:
        from opentelemetry import trace

        super().__init__(backend)
        self.name = backend.name
        self.capabilities = backend.capabilities
        self._tracer = tracer
        self._current_span = trace.get_current_span
        self._client = trace.SpanKind.CLIENT
        self.span_name = backend.capabilities.span

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
