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
from ..messages import Request, TooLarge
from ..service import RateLimitService, ServiceError
from ..stats import StatsStore, Timer
from .protocodec import DecodeError, decode_request, encode_response

if TYPE_CHECKING:
    from ..tracing import ServerSpans

log = logging.getLogger("ratelimitd.transport.grpc")

# gRPC status codes (google.rpc.Code) the handler answers with.
OK = 0
CANCELLED = 1
UNKNOWN = 2
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13

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
        return self.spans is None and self.service.limiter.synchronous

    def decide_now(self, data: bytes) -> Outcome | None:
        """`decide` without a task, for a synchronous limiter (see `synchronous`); None for
        a request too large to decide without letting other requests run (use `decide`)."""
        started = self.clock()
        request = self._decode(data, started)
        if type(request) is tuple:
            return request
        assert isinstance(request, Request)
        if self.service.may_suspend(request):
            return None
        # The service is a coroutine function that, with a synchronous limiter, finishes
        # without suspending: one send() runs it to the end with no task or loop round.
        coro = self.service.should_rate_limit(request)
        try:
            coro.send(None)
        except StopIteration as stop:
            return self._done(started, OK, encode_response(stop.value))
        except Exception as err:
            return self._done(started, _code(err), _failure(err))
        coro.close()
        return self._done(started, UNKNOWN, "internal error: a synchronous decision waited")

    async def decide(self, data: bytes, metadata: dict[str, str] | None = None) -> Outcome:
        """Decide one serialized RateLimitRequest; `metadata` is the tracing carrier."""
        if self.spans is not None:
            return await self.spans.run(
                metadata or {}, data, lambda: self._decide(data), code_of=_code_of
            )
        return await self._decide(data)

    async def _decide(self, data: bytes) -> Outcome:
        started = self.clock()
        request = self._decode(data, started)
        if type(request) is tuple:
            return request
        assert isinstance(request, Request)
        try:
            response = await self.service.should_rate_limit(request)
        except asyncio.CancelledError:
            self._done(started, CANCELLED, "")
            raise
        except Exception as err:
            return self._done(started, _code(err), _failure(err))
        return self._done(started, OK, encode_response(response))

    def _decode(self, data: bytes, started: float) -> Request | Outcome:
        """The request, or the outcome of one that is not decided: undecodable, or past the
        request bounds in force (refused while it is decoded, counted as the service counts
        a request too large)."""
        try:
            return decode_request(data, self.service.snapshot.options)
        except DecodeError as err:
            return self._done(started, INTERNAL, f"grpc: error unmarshalling request: {err}")
        except TooLarge as err:
            self.stats.service.service_error += 1
            return self._done(started, RESOURCE_EXHAUSTED, str(err))

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
    """The gRPC status of an error out of the service: UNKNOWN but for RESOURCE_EXHAUSTED."""
    return err.code if isinstance(err, ServiceError) else UNKNOWN


def _failure(err: Exception) -> str:
    """The UNKNOWN message for an error out of the service."""
    if isinstance(err, ServiceError | BackendError):
        return str(err)
    # The reference would crash here; a server answers and stays up.
    log.error("ShouldRateLimit failed unexpectedly", exc_info=err)
    return str(err) or type(err).__name__


def _code_of(outcome: Outcome) -> int:
    return outcome[0]
