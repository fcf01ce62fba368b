"""ShouldRateLimit for every gRPC transport: decode, decide, encode, map errors, count.

Both gRPC transports (grpc.aio in `grpc.py`, the native HTTP/2 one in `native.py`) hand the
request bytes here and get back `(grpc status code, reply bytes or error message)`; they only
turn that into their own kind of reply. The mapping is the reference's (`src/service/ratelimit.go`):
service and backend errors are UNKNOWN carrying the error text, an undecodable message is
grpc-go's INTERNAL `grpc: error unmarshalling request: ...`. Every call, failed or not, counts
in `ratelimit_server.ShouldRateLimit.{total_requests,response_time}`, as the reference's
stats interceptor counts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backends.base import BackendError
from ..messages import Overloaded, RequestTooLarge, ServiceError
from ..service import RateLimitService
from ..stats import StatsStore, Timer
from .grpcstatus import CANCELLED, INTERNAL, OK, RESOURCE_EXHAUSTED, UNKNOWN
from .protocodec import DecodeError, decode_request, encode_response

if TYPE_CHECKING:
    from .spans import ServerSpans

log = logging.getLogger("ratelimitd.transport.grpc")


Outcome = tuple[int, bytes | str]


@dataclass(slots=True, eq=False)
class RlsHandler:
    """The transport-neutral ShouldRateLimit call."""

    service: RateLimitService
    stats: StatsStore
    # The stats sink's `ratelimit_server.ShouldRateLimit.response_time` (None: no sink).
    timer: Timer | None = None
    # OpenTelemetry SERVER spans (None: tracing off, nothing imported).
    spans: ServerSpans | None = None
    clock: Callable[[], float] = time.perf_counter

    @property
    def synchronous(self) -> bool:
        """True when `decide_now` may be used: the decision never waits for I/O."""
        return self.spans is None and self.service.synchronous

    def decide_now(self, data: bytes) -> Outcome | None:
        """`decide` without a task, for a synchronous service (see `synchronous`); None for
        a request the service decides only asynchronously (use `decide`)."""
        started = self.clock()
        try:
            request = decode_request(data)
        except DecodeError as err:
            return self._done(started, INTERNAL, f"grpc: error unmarshalling request: {err}")
        try:
            response = self.service.decide_now(request)
        except Exception as err:
            return self._done(started, _code(err), _failure(err))
        if response is None:
            return None
        return self._done(started, OK, encode_response(response))

    async def decide(self, data: bytes, metadata: dict[str, str] | None = None) -> Outcome:
        """Decide one serialized RateLimitRequest; `metadata` is the tracing carrier."""
        if self.spans is not None:
            return await self.spans.run(
                metadata or {}, data, lambda: self._decide(data), code_of=_code_of
            )
        return await self._decide(data)

    async def _decide(self, data: bytes) -> Outcome:
        started = self.clock()
        try:
            request = decode_request(data)
        except DecodeError as err:
            return self._done(started, INTERNAL, f"grpc: error unmarshalling request: {err}")
        try:
            response = await self.service.should_rate_limit(request)
        except asyncio.CancelledError:
            self._done(started, CANCELLED, "")
            raise
        except Exception as err:
            return self._done(started, _code(err), _failure(err))
        return self._done(started, OK, encode_response(response))

    def _done(self, started: float, code: int, reply: bytes | str) -> Outcome:
        elapsed_ms = (self.clock() - started) * 1000.0
        s = self.stats.service
        s.total_requests += 1
        s.response_time_count += 1
        s.response_time_sum_ms += elapsed_ms
        if self.timer is not None:
            self.timer.observe(elapsed_ms)
        return code, reply


def _code(err: Exception) -> int:
    """The gRPC status of an error out of the service: UNKNOWN, as the reference answers,
    but RESOURCE_EXHAUSTED for a request refused for its size or for the load."""
    return RESOURCE_EXHAUSTED if isinstance(err, RequestTooLarge | Overloaded) else UNKNOWN


def _failure(err: Exception) -> str:
    """The UNKNOWN message for an error out of the service."""
    if isinstance(err, ServiceError | BackendError):
        return str(err)
    # The reference would crash here; a server answers and stays up.
    log.error("ShouldRateLimit failed unexpectedly", exc_info=err)
    return str(err) or type(err).__name__


def _code_of(outcome: Outcome) -> int:
    return outcome[0]
