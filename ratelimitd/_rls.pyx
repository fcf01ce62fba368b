# cython: language_level=3
"""The synchronous ShouldRateLimit call, compiled: request bytes -> (gRPC status, reply).

`transport/rls.py`'s `RlsHandler` uses it for a synchronous service (its own `_call_now`
is the pure twin, and holds the notes): decode, the service's `decide_now`, encode, and the
call's statistics, in one C call per request on the native transport's hot path.
"""

from posix.time cimport CLOCK_MONOTONIC

from ratelimitd._slots cimport clock_now, get, offset_of, put

from google.protobuf.message import DecodeError

import time

from ratelimitd.messages import TooLarge
from ratelimitd.stats.store import ServiceStats
from ratelimitd.transport.grpcstatus import INTERNAL, OK

cdef object PERF_COUNTER = time.perf_counter

cdef object SERVICE = ServiceStats
cdef Py_ssize_t TOTAL = offset_of(ServiceStats, "total_requests")
cdef Py_ssize_t COUNT = offset_of(ServiceStats, "response_time_count")
cdef Py_ssize_t SUM = offset_of(ServiceStats, "response_time_sum_ms")
cdef Py_ssize_t ERRORS = offset_of(ServiceStats, "service_error")


cdef class SyncCall:
    """`RlsHandler._call_now`, compiled (see the module docstring)."""

    cdef object decode, service, decide, encode, clock, stats, timer, failure
    cdef bint monotonic

    def __init__(self, decode, service, encode, clock, stats, timer, failure):
        # time.perf_counter is CLOCK_MONOTONIC: read in C (a test may hand another clock)
        self.monotonic = clock is PERF_COUNTER
        self.decode = decode  # (bytes, bounds) -> Request (raises DecodeError, TooLarge)
        self.service = service  # its snapshot's options are the decoder's bounds
        self.decide = service.decide_now  # Request -> Response | None
        self.encode = encode  # Response -> bytes
        self.clock = clock
        self.stats = stats  # ServiceStats
        self.timer = timer  # the sink's response_time, or None
        self.failure = failure  # an error out of the service -> (status, message)

    cdef inline double _now(self) except? -1.0:
        return clock_now(CLOCK_MONOTONIC, None if self.monotonic else self.clock)

    def __call__(self, bytes data):
        return self.call(data)

    cdef object call(self, bytes data):
        cdef double started = self._now()
        cdef double elapsed
        try:
            response = self.decide(self.decode(data, self.service.snapshot.options))
            if response is None:
                return None
            code = OK
            reply = self.encode(response)
        except DecodeError as err:
            code = INTERNAL
            reply = f"grpc: error unmarshalling request: {err}"
        except TooLarge as err:  # refused by the decoder: counted as the service counts it
            s = self.stats
            put(s, SERVICE, ERRORS, "service_error", get(s, SERVICE, ERRORS, "service_error") + 1)
            code, reply = self.failure(err)
        except Exception as err:
            code, reply = self.failure(err)
        elapsed = (self._now() - started) * 1000.0
        s = self.stats
        put(s, SERVICE, TOTAL, "total_requests", get(s, SERVICE, TOTAL, "total_requests") + 1)
        put(s, SERVICE, COUNT, "response_time_count", get(s, SERVICE, COUNT, "response_time_count") + 1)
        put(s, SERVICE, SUM, "response_time_sum_ms", get(s, SERVICE, SUM, "response_time_sum_ms") + elapsed)
        if self.timer is not None:
            self.timer.observe(elapsed)
        return code, reply


cdef class SyncRoute:
    """The native transport's ShouldRateLimit route for a synchronous service: the call
    answered at once, or handed to `fallback(stream, proto)` (the transport's own route,
    which makes a task) for a request the service decides only asynchronously."""

    cdef SyncCall call
    cdef object fallback

    def __init__(self, SyncCall call, fallback):
        self.call = call
        self.fallback = fallback

    def __call__(self, stream, proto):
        outcome = self.call.call(stream.message)
        if outcome is None:
            self.fallback(stream, proto)
        else:
            code, reply = outcome
            proto.answer(stream, code, reply)
