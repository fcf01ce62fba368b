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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..backends.base import BackendError
from ..grpcstatus import CANCELLED, INTERNAL, OK, RESOURCE_EXHAUSTED, UNKNOWN
from ..messages import Overloaded, Request, RequestTooLarge, ServiceError, TooLarge
from ..service import RateLimitService
from ..settings import extensions_disabled
from ..stats import StatsStore, Timer
from .protocodec import DecodeError, decode_request, decoded_size, encode_response

if TYPE_CHECKING:
    from .spans import ServerSpans

log = logging.getLogger("ratelimitd.transport.grpc")


def _compiled_call() -> Any:
    # Same switch as the other compiled modules: RATELIMITD_NO_EXTENSIONS=1 forces the twin.
    if extensions_disabled():
        return None
    try:
        from . import _rls  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _rls


_compiled = _compiled_call()
IMPLEMENTATION = "compiled" if _compiled is not None else "pure"


Outcome = tuple[int, bytes | str]
Route = Callable[[Any, Any], None]  # a native transport's route: (stream, protocol)


def router(routes: dict[bytes, Route], unknown: Route) -> Route | None:
    """The native transport's dispatch over `routes` (by path), compiled (`_rls.Router`);
    None without the compiled module (the transport's own `_dispatch` is the twin)."""
    return _compiled.Router(routes, unknown) if _compiled is not None else None  # type: ignore[no-any-return]


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
    # Whether `decide_now` may be used: the decision never waits for I/O (and no span needs
    # a task). Decided once: the service's limiter is fixed when it is built.
    synchronous: bool = field(init=False)
    # Whether the service's `send` may be used: a decision that waits for its store is
    # started without a task (and no span needs one).
    sends: bool = field(init=False)
    # decide(data, metadata=None) -> Outcome: decide one serialized RateLimitRequest;
    # `metadata` is the tracing carrier (only a traced call takes the extra frame).
    decide: Callable[..., Awaitable[Outcome]] = field(init=False)
    # decide_now(data) -> Outcome | None: `decide` without a task, for a synchronous service;
    # None for a request the service decides only asynchronously (use `decide`). Compiled
    # when built (`_rls.SyncCall`).
    decide_now: Callable[[bytes], Outcome | None] = field(init=False)
    # The compiled call (`_rls.SyncCall`) the routes are built on (None: the pure twins).
    _compiled_call: Any = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.synchronous = self.spans is None and self.service.synchronous
        self.sends = self.spans is None and self.service.sends
        self.decide = self._decide if self.spans is None else self._traced
        self.decide_now = self._call_now
        if _compiled is not None and (self.synchronous or self.sends):
            self._compiled_call = _compiled.SyncCall(
                decode_request,
                self.service,
                encode_response,
                self.clock,
                self.stats.service,
                self.timer,
                outcome_of,
            )
            if self.synchronous:
                self.decide_now = self._compiled_call

    def route(
        self, route: Callable[[Any, Any], None], in_task: Callable[[Any, Any], None]
    ) -> Callable[[Any, Any], None]:
        """A native transport's ShouldRateLimit route (stream, proto) for a synchronous
        service: with the compiled call, one C call that answers the stream or hands it to
        `in_task` (a request it does not decide at once); otherwise the transport's own
        `route`."""
        if self.synchronous and self._compiled_call is not None:
            return _compiled.SyncRoute(self._compiled_call, in_task)  # type: ignore[no-any-return,union-attr]
        return route

    def send_route(
        self, route: Callable[[Any, Any], None], task: Callable[[Any, Any], None]
    ) -> Callable[[Any, Any], None]:
        """A native transport's ShouldRateLimit route (stream, proto) for a service that
        `sends`: compiled (`_rls.SendRoute`: `task` takes a request held already that the
        service does not start itself), or the transport's own `route`."""
        if self.sends and self._compiled_call is not None:
            return _compiled.SendRoute(self._compiled_call, decoded_size, task)  # type: ignore[no-any-return,union-attr]
        return route

    def received(self, started: float, request: Request, plan: Any, results: Any) -> Outcome:
        """The outcome of a call `service.send` started, from its round's results
        (`_rls.SendRoute.received`'s twin)."""
        try:
            reply: bytes | str = encode_response(self.service.received(request, plan, results))
            code = OK
        except Exception as err:
            code, reply = outcome_of(err)
        return self.done(started, code, reply)

    def _call_now(self, data: bytes) -> Outcome | None:
        """`decide_now`, the pure twin of `_rls.SyncCall`."""
        started = self.clock()
        service = self.service
        try:
            response = service.decide_now(decode_request(data, service.snapshot.options))
            if response is None:
                return None
            reply: bytes | str = encode_response(response)
            code = OK
        except DecodeError as err:
            code, reply = INTERNAL, f"grpc: error unmarshalling request: {err}"
        except TooLarge as err:  # refused by the decoder: counted as the service counts it
            self.stats.service.service_error += 1
            code, reply = outcome_of(err)
        except Exception as err:
            code, reply = outcome_of(err)
        return self.done(started, code, reply)

    async def _traced(self, data: bytes, metadata: dict[str, str] | None = None) -> Outcome:
        assert self.spans is not None
        return await self.spans.run(
            metadata or {}, data, lambda: self._decide(data), code_of=_code_of
        )

    async def _decide(self, data: bytes, metadata: dict[str, str] | None = None) -> Outcome:
        started = self.clock()
        request = self.decoded(data, started)
        if type(request) is tuple:
            return request
        assert isinstance(request, Request)
        try:
            response = await self.service.should_rate_limit(request)
        except asyncio.CancelledError:
            self.done(started, CANCELLED, "")
            raise
        except Exception as err:
            return self.done(started, *outcome_of(err))
        return self.done(started, OK, encode_response(response))

    def decoded(self, data: bytes, started: float) -> Request | Outcome:
        """The request, or the outcome of one that is not decided: undecodable, or past the
        request bounds in force (refused while it is decoded, counted as the service counts
        a request too large)."""
        try:
            return decode_request(data, self.service.snapshot.options)  # type: ignore[no-any-return]
        except DecodeError as err:
            return self.done(started, INTERNAL, f"grpc: error unmarshalling request: {err}")
        except TooLarge as err:
            self.stats.service.service_error += 1
            return self.done(started, *outcome_of(err))

    def done(self, started: float, code: int, reply: bytes | str) -> Outcome:
        """Count the call (ratelimit_server.ShouldRateLimit.*); its outcome."""
        elapsed_ms = (self.clock() - started) * 1000.0
        s = self.stats.service
        s.total_requests += 1
        s.response_time_count += 1
        s.response_time_sum_ms += elapsed_ms
        if self.timer is not None:
            self.timer.observe(elapsed_ms)
        return code, reply


def outcome_of(err: Exception) -> Outcome:
    """The gRPC status and message of an error out of the service (or of its decoder)."""
    return _code(err), _failure(err)


def _code(err: Exception) -> int:
    """The gRPC status of an error out of the service: UNKNOWN, as the reference answers,
    but RESOURCE_EXHAUSTED for a request refused for its size or for the load."""
    return (
        RESOURCE_EXHAUSTED if isinstance(err, RequestTooLarge | TooLarge | Overloaded) else UNKNOWN
    )


def _failure(err: Exception) -> str:
    """The UNKNOWN message for an error out of the service."""
    if isinstance(err, ServiceError | BackendError | TooLarge):
        return str(err)
    # The reference would crash here; a server answers and stays up.
    log.error("ShouldRateLimit failed unexpectedly", exc_info=err)
    return str(err) or type(err).__name__


def _code_of(outcome: Outcome) -> int:
    return outcome[0]
