"""`TracedBackend`: a backend whose round trips are CLIENT child spans of the request's span,
with the tracer of `stats.tracing` (the reference's `Redis Pipeline Execution` spans)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .base import Backend, Op

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


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
        self.capabilities = backend.capabilities
        self._tracer = tracer
        self._current_span = trace.get_current_span
        self._client = trace.SpanKind.CLIENT
        self.span_name = backend.capabilities.span

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

    async def peek(self, ops: Sequence[Op]) -> list[Any]:
        """The wrapped store's dry run (`/explain`: not traced)."""
        return await self.backend.peek(ops)

    async def delete(self, keys: Sequence[str]) -> int:
        """The wrapped store's delete (an admin's reset: not traced)."""
        return await self.backend.delete(keys)

    async def close(self) -> None:
        """Close the wrapped backend."""
        await self.backend.close()
