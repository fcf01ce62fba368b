# cython: language_level=3
"""The ShouldRateLimit call, compiled: request bytes -> (gRPC status, reply), and the native
transport's routes around it.

`transport/rls.py`'s `RlsHandler` uses it (its own `_call_now` is the pure twin of
`SyncCall`, and holds the notes; `transport/native.py`'s `_should_rate_limit` and `_send`
are the twins of the routes): decode, the service's one way in (`RateLimitService.decide`),
encode, and the call's statistics, in C on the native transport's hot path. `SyncRoute`
answers a synchronous service's call at once; `SendRoute` starts an awaited decision
without a task (`decide` with a waiter) and answers it when the store's round is over
(`Pending`). An answer not ready at once (a coroutine) goes to the transport's task.
Before decoding, the call reads the request's domain in place (`_wire.request_domain`): a
domain the config does not know is answered undecoded (`Engine.unknown_domain`), as is the
last request no rule matched when the same bytes come again.
"""

cimport cython
from posix.time cimport CLOCK_MONOTONIC

from ratelimitd._slots cimport clock_now, get, offset_of, put
from ratelimitd.transport._wire cimport checked_descriptors, request_domain, request_size

import time
from types import CoroutineType

from ratelimitd.messages import Refusal, Response
from ratelimitd.service import Snapshot
from ratelimitd.stats.store import ServiceStats
from ratelimitd.grpcstatus import CANCELLED, OK, RESOURCE_EXHAUSTED
from ratelimitd.transport._wire import decode_request as _decode_request, decoded_size
from ratelimitd.transport.h2 import H2Protocol

cdef object PERF_COUNTER = time.perf_counter
cdef object RESPONSE = Response
cdef object REFUSAL = Refusal
cdef object COROUTINE = CoroutineType
cdef object H2_PROTOCOL = H2Protocol
cdef Py_ssize_t H_CONN = offset_of(H2Protocol, "conn")

cdef class SyncRoute
cdef class SendRoute


cdef Py_ssize_t P_STATUSES = offset_of(Response, "statuses")
cdef object SNAPSHOT = Snapshot
cdef Py_ssize_t S_OPTIONS = offset_of(Snapshot, "options")  # the decoder's bounds
cdef object SERVICE = ServiceStats
cdef Py_ssize_t TOTAL = offset_of(ServiceStats, "total_requests")
cdef Py_ssize_t COUNT = offset_of(ServiceStats, "response_time_count")
cdef Py_ssize_t SUM = offset_of(ServiceStats, "response_time_sum_ms")


cdef class SyncCall:
    """`RlsHandler._call_now`, compiled (see the module docstring)."""

    cdef object decode, service, decide, encode, clock, stats, timer, failure, refused
    cdef bint monotonic
    # The last response encoded and its bytes: the engine answers every request with
    # nothing to count (an unknown domain, no rule matched) with one shared response per
    # number of descriptors, so a run of them is encoded once. Held, so never a new object
    # at the same address.
    cdef object last, last_reply
    # Whether a request is read before it is decoded (the compiled decoder, and a service
    # that answers an unknown domain undecoded): a request for a domain the config does not
    # know is answered without decoding it, so without making any object.
    cdef bint reads
    # The domain last found in the config, and the service's snapshot it was found in: a
    # request for it is decoded at once (the usual request, read only to its domain).
    cdef object known, known_in
    # The last request of a known domain that no rule matched (nothing counted, no
    # statistic), the snapshot that answered it and its response: the same bytes again are
    # answered alike without decoding them, while the snapshot is the same.
    cdef bytes unmatched
    cdef object unmatched_in, unmatched_out

    def __init__(self, decode, service, encode, clock, stats, timer, failure, refused):
        # time.perf_counter is CLOCK_MONOTONIC: read in C (a test may hand another clock)
        self.monotonic = clock is PERF_COUNTER
        self.reads = decode is _decode_request and hasattr(service, "unknown_domain")
        self.decode = decode  # (bytes, bounds) -> Request (raises DecodeError, TooLarge)
        self.service = service  # its snapshot's options are the decoder's bounds
        self.decide = service.decide  # (Request[, Waiter]) -> Response | Refusal | ...
        self.encode = encode  # Response -> bytes
        self.clock = clock
        self.stats = stats  # ServiceStats
        self.timer = timer  # the sink's response_time, or None
        self.failure = failure  # an error out of the decoder or the service -> outcome
        self.refused = refused  # a Refusal -> (status, message)

    cdef inline double _now(self) except? -1.0:
        return clock_now(CLOCK_MONOTONIC, None if self.monotonic else self.clock)

    def __call__(self, bytes data):
        return self.call(data)

    cdef object call(self, bytes data):
        """The call's outcome, or the awaitable of its answer (not decided at once)."""
        cdef double started = self._now()
        try:
            snapshot = self.service.snapshot
            out = self._undecoded(data, snapshot) if self.reads else None
            if out is not None:
                return self._done(started, OK, self._encoded(out))
            out = self.decide(self.decode(data, get(snapshot, SNAPSHOT, S_OPTIONS, "options")))
            if type(out) is RESPONSE:
                code = OK
                if out is self.last and self.reads:  # a shared response: maybe unmatched
                    self._remember(data, out)
                reply = self._encoded(out)
            elif type(out) is REFUSAL:
                code, reply = self.refused(out)
            else:
                return out
        except Exception as err:
            code, reply = self.failure(err)
        return self._done(started, code, reply)

    cdef object _undecoded(self, bytes data, snapshot):
        """The response to a request answered undecoded under the service's `snapshot` (an
        unknown domain: `Engine.unknown_domain`; the last unmatched request again), or
        None: decode it."""
        cdef Py_ssize_t n
        domain = request_domain(data)
        if domain is None:
            return None
        if domain is self.known and snapshot is self.known_in:
            if snapshot is self.unmatched_in and data == self.unmatched:
                return self.unmatched_out
            return None
        n = checked_descriptors(data, snapshot.options)
        if n < 0:
            return None
        out = self.service.unknown_domain(domain, n)
        if out is None:
            self.known = domain
            self.known_in = snapshot
            return None
        if out is False:
            return None
        return out

    cdef void _remember(self, bytes data, out) except *:
        """Keep `data` and its response `out` when nothing was counted for it in a domain
        the config knows (see `unmatched`)."""
        service = self.service
        snapshot = service.snapshot
        if self.known is None or snapshot is not self.known_in:
            return
        nothing = service.nothing
        n = len(<list>get(out, RESPONSE, P_STATUSES, "statuses"))
        if n < len(nothing) and nothing[n] is out and request_domain(data) is self.known:
            self.unmatched = data
            self.unmatched_in = snapshot
            self.unmatched_out = out

    cdef tuple _answered(self, out):
        """The outcome of the service's answer (a Response or a Refusal)."""
        if type(out) is RESPONSE:
            return OK, self._encoded(out)
        return self.refused(out)

    cdef object _encoded(self, response):
        """`encode(response)`, or the bytes of the same response encoded last."""
        if response is self.last:
            return self.last_reply
        reply = self.encode(response)
        self.last = response
        self.last_reply = reply
        return reply

    cdef tuple _done(self, double started, code, reply):
        """The call's statistics, counted; its outcome."""
        cdef double elapsed = (self._now() - started) * 1000.0
        s = self.stats
        put(s, SERVICE, TOTAL, "total_requests", get(s, SERVICE, TOTAL, "total_requests") + 1)
        put(s, SERVICE, COUNT, "response_time_count", get(s, SERVICE, COUNT, "response_time_count") + 1)
        total = get(s, SERVICE, SUM, "response_time_sum_ms")
        if type(total) is float:  # added in C: one float made, not two
            total = <double>total + elapsed
        else:
            total = total + elapsed
        put(s, SERVICE, SUM, "response_time_sum_ms", total)
        if self.timer is not None:
            self.timer.observe(elapsed)
        return code, reply


cdef class Router:
    """The native transport's dispatch (`NativeGrpcTransport._dispatch`'s twin): the route
    of the call's path, or `unknown(stream, proto)`."""

    cdef dict routes
    cdef object unknown
    cdef bytes last_path  # the path last routed, and its route: compared before hashing
    cdef object last_route

    def __init__(self, dict routes, unknown):
        self.routes = routes  # path (bytes) -> route(stream, proto)
        self.unknown = unknown
        self.last_path = None
        self.last_route = None

    def __call__(self, stream, proto):
        self.route(stream, proto)

    def bind(self, proto, failed):
        """The connection `proto`'s `on_request(stream)`: the call routed, or, when that
        raises, `failed(stream)` (`H2Protocol._on_request` is the twin)."""
        cdef Bound bound = Bound.__new__(Bound)
        bound.router = self
        bound.proto = proto
        bound.failed = failed
        return bound

    cdef route(self, stream, proto):
        cdef bytes path = stream.path
        if path is not None and path == self.last_path:  # the usual case: one method
            route = self.last_route
        else:
            route = self.routes.get(path)
            if route is None:
                self.unknown(stream, proto)
                return
            self.last_path = path
            self.last_route = route
        # The compiled routes are called in C, the others through Python.
        if type(route) is SyncRoute:
            (<SyncRoute>route).handle(stream, proto)
        elif type(route) is SendRoute:
            (<SendRoute>route).handle(stream, proto)
        else:
            route(stream, proto)


cdef class Bound:
    """`Router.bind`'s result: one connection's requests, routed."""

    cdef Router router
    cdef object proto, failed

    def __call__(self, stream):
        try:
            self.router.route(stream, self.proto)
        except Exception:
            self.failed(stream)


cdef class SyncRoute:
    """The native transport's ShouldRateLimit route for a synchronous service: the call
    answered at once, or handed to `fallback(stream, proto, answer)` (the transport's own
    route, which makes a task) with the awaitable of the answer the service gives a
    request it decides only asynchronously."""

    cdef SyncCall call
    cdef object fallback

    def __init__(self, SyncCall call, fallback):
        self.call = call
        self.fallback = fallback

    def __call__(self, stream, proto):
        self.handle(stream, proto)

    cdef handle(self, stream, proto):
        outcome = self.call.call(stream.message)
        if type(outcome) is tuple:
            code, reply = outcome
            _answer_now(proto, stream, code, reply)
        else:
            self.fallback(stream, proto, outcome)


cdef inline void _answer_now(proto, stream, code, reply) except *:
    """`H2Protocol.answer` for a call answered within the read that completed it (a
    route's only caller is the connection's `receive`): the reply leaves with that read's
    write, and the call has no task and no deadline to drop."""
    if code:
        proto.conn.finish(stream, code, reply)
    else:
        proto.conn.respond(stream, reply)


@cython.freelist(256)  # one per call waiting on the store: reused, not allocated
cdef class Pending:
    """One call whose store round is under way: the `Waiter` of `RateLimitService.decide`,
    and the stream's `work` (cancelled by its deadline or its client)."""

    cdef SendRoute route
    cdef object stream, proto, request, plan
    cdef double started
    cdef public bint cancelled
    cdef public object task  # set by the service when the round runs in a task

    def __call__(self, results):
        self.route.received(self, results)

    def cancel(self):
        """The client left or the deadline passed: no answer (the round still ends)."""
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()


cdef class SendRoute:
    """The native transport's ShouldRateLimit route for a service that `sends`: the
    request is held in the connection's buffers and its decision started (no task, no
    coroutine); answered at once when it needed no store round, else by its `Pending`
    once the round is over. A request the service does not start (planned in slices)
    goes to `fallback(stream, proto, answer)`, the transport's task awaiting its answer,
    already held."""

    cdef SyncCall call
    cdef object service, dropped, fallback, size
    cdef bint wire_size  # `size` is the compiled codec's: called in C

    def __init__(self, SyncCall call, size, fallback):
        service = call.service
        self.call = call
        # Its `received(Request, Plan, results)` -> Response | Refusal is looked up per
        # call: it is its engine's, which changes with the service's limiter.
        self.service = service
        self.dropped = service.dropped
        self.size = size  # bytes -> the decoded request's estimated size
        self.wire_size = size is decoded_size
        self.fallback = fallback

    def __call__(self, stream, proto):
        self.handle(stream, proto)

    cdef handle(self, stream, proto):
        cdef SyncCall c = self.call
        cdef double started = c._now()
        cdef Pending p
        data = stream.message
        snapshot = c.service.snapshot
        if c.reads:  # an unknown domain: answered at once, nothing held
            try:
                out = c._undecoded(data, snapshot)
            except Exception as err:
                code, reply = c.failure(err)
                c._done(started, code, reply)
                _answer_now(proto, stream, code, reply)
                return
            if out is not None:
                reply = c._encoded(out)
                c._done(started, OK, reply)
                _answer_now(proto, stream, OK, reply)
                return
        conn = get(proto, H2_PROTOCOL, H_CONN, "conn")
        # Its request, decoded, stays in memory while the decision waits: counted in the
        # process's buffers until it is answered (refused at once when they are full).
        if not conn.hold(stream, request_size(data) if self.wire_size else self.size(data)):
            proto.finish(stream, RESOURCE_EXHAUSTED, conn.refusal)
            return
        try:
            request = c.decode(data, get(snapshot, SNAPSHOT, S_OPTIONS, "options"))
            p = Pending.__new__(Pending)
            p.route = self
            p.stream = stream
            p.proto = proto
            p.request = request
            p.started = started
            out = c.decide(request, p)
            if type(out) is RESPONSE or type(out) is REFUSAL:
                if out is c.last and c.reads:  # a shared response: maybe unmatched
                    c._remember(data, out)
                code, reply = c._answered(out)
            elif type(out) is COROUTINE:
                self.fallback(stream, proto, out)
                return
            else:  # the plan whose round is under way
                p.plan = out
                stream.work = p
                if stream.timeout >= 0:
                    proto.server.watch_deadline(stream, proto)
                return
        except Exception as err:
            code, reply = c.failure(err)
        c._done(started, code, reply)
        _answer_now(proto, stream, code, reply)

    cdef received(self, Pending p, results):
        cdef SyncCall c = self.call
        if p.cancelled:
            self.dropped()
            c._done(p.started, CANCELLED, "")
            return
        try:
            code, reply = c._answered(self.service.received(p.request, p.plan, results))
        except Exception as err:
            code, reply = c.failure(err)
        c._done(p.started, code, reply)
        p.proto.answer(p.stream, code, reply)
