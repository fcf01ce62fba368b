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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..grpcstatus import CANCELLED, GRPC, INTERNAL, OK, REFUSED
from ..messages import Refusal, Request, Response
from ..service import RateLimitService
from ..settings import extensions_disabled
from ..stats import StatsStore, Timer
from .protocodec import DecodeError, decode_request, decoded_size, encode_response

if TYPE_CHECKING:
    from .spans import ServerSpans


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
    # decide_now(data) -> Outcome | Awaitable: `decide` without a task, for a synchronous
    # service; an awaitable of the answer (`finish` it) for a request the service decides
    # only asynchronously. Compiled when built (`_rls.SyncCall`).
    decide_now: Callable[[bytes], Any] = field(init=False)
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
                self.failed,
                refused,
            )
            if self.synchronous:
                self.decide_now = self._compiled_call

    def route(
        self, route: Callable[[Any, Any], None], in_task: Callable[[Any, Any, Any], None]
    ) -> Callable[[Any, Any], None]:
        """A native transport's ShouldRateLimit route (stream, proto) for a synchronous
        service: with the compiled call, one C call that answers the stream or hands it to
        `in_task` with the awaitable of its answer (a request not decided at once);
        otherwise the transport's own `route`."""
        if self.synchronous and self._compiled_call is not None:
            return _compiled.SyncRoute(self._compiled_call, in_task)  # type: ignore[no-any-return,union-attr]
        return route

    def send_route(
        self, route: Callable[[Any, Any], None], task: Callable[[Any, Any, Any], None]
    ) -> Callable[[Any, Any], None]:
        """A native transport's ShouldRateLimit route (stream, proto) for a service that
        `sends`: compiled (`_rls.SendRoute`: `task` takes a request held already whose
        answer the service gives as an awaitable), or the transport's own `route`."""
        if self.sends and self._compiled_call is not None:
            return _compiled.SendRoute(self._compiled_call, decoded_size, task)  # type: ignore[no-any-return,union-attr]
        return route

    def received(self, started: float, request: Request, plan: Any, results: Any) -> Outcome:
        """The outcome of a call the service started with a waiter, from its round's
        results (`_rls.SendRoute.received`'s twin)."""
        return self.outcome(started, self.service.received(request, plan, results))

    def _call_now(self, data: bytes) -> Any:
        """`decide_now`, the pure twin of `_rls.SyncCall`."""
        started = self.clock()
        request = self.decoded(data, started)
        if type(request) is tuple:
            return request
        out = self.entered(request)  # type: ignore[arg-type]
        if type(out) is Response or type(out) is Refusal:
            return self.outcome(started, out)
        return out

    async def _traced(self, data: bytes, metadata: dict[str, str] | None = None) -> Outcome:
        assert self.spans is not None
        return await self.spans.run(
            metadata or {}, data, lambda: self._decide(data), code_of=_code_of
        )

    async def _decide(self, data: bytes, metadata: dict[str, str] | None = None) -> Outcome:
        started = self.clock()
        request = self.decoded(data, started)
        if type(request) is tuple:
            return request  # type: ignore[return-value]
        out = self.entered(request)  # type: ignore[arg-type]
        if type(out) is Response or type(out) is Refusal:
            return self.outcome(started, out)
        return await self.finish(started, out)

    def entered(self, request: Request, waiter: Any = None) -> Any:
        """`service.decide(request[, waiter])`, a defect out of it answered as the service
        answers one (`_rls.SyncCall` catches it the same way)."""
        service = self.service
        try:
            return service.decide(request) if waiter is None else service.decide(request, waiter)
        except Exception as err:
            return service.answer(err)

    async def finish(self, started: float, out: Any) -> Outcome:
        """The outcome of a call whose answer `out` is not ready yet, once it is."""
        try:
            answer = await out
        except asyncio.CancelledError:
            self.done(started, CANCELLED, "")
            raise
        except Exception as err:  # a defect: the service answers its own failures
            answer = self.service.answer(err)
        return self.outcome(started, answer)

    def outcome(self, started: float, answer: Response | Refusal) -> Outcome:
        """The outcome of the service's answer, counted."""
        if isinstance(answer, Refusal):
            return self.done(started, *refused(answer))
        return self.done(started, OK, encode_response(answer))

    def failed(self, err: Exception) -> Outcome:
        """The status and message of an error out of the decoder, or out of the service's
        entry itself (the service answers its own failures)."""
        if isinstance(err, DecodeError):
            return INTERNAL, f"grpc: error unmarshalling request: {err}"
        return refused(self.service.answer(err))  # type: ignore[arg-type]

    def decoded(self, data: bytes, started: float) -> Request | Outcome:
        """The request, or the outcome of one that is not decided: undecodable, or past the
        request bounds in force (refused while it is decoded)."""
        try:
            return decode_request(data, self.service.snapshot.options)  # type: ignore[no-any-return]
        except Exception as err:
            return self.done(started, *self.failed(err))

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


def refused(refusal: Refusal) -> Outcome:
    """The gRPC status and message of a refusal (`grpcstatus.REFUSED`)."""
    return REFUSED[refusal.kind][GRPC], refusal.message


def _code_of(outcome: Outcome) -> int:
    return outcome[0]
