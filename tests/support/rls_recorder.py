"""A recording tap between Envoy and the rate-limit service: every ShouldRateLimit call is
forwarded byte for byte to the real service, and recorded (when, what Envoy sent, what the
service answered). Envoy's own calls are what the budget tests reason about: which phase,
which hits_addend, which descriptors a stream end carried.

It is a gRPC server in this process (grpcio, its own threads) with a channel to the
service; the bytes the service receives are Envoy's, only the HTTP/2 framing is grpcio's.
Tests of a transport itself point Envoy at the daemon directly instead.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass

import grpc

from ratelimitd._proto import rls_pb2
from ratelimitd.transport.protocodec import METHOD_NAME, METHOD_PATH, SERVICE_NAME

from .ready import free_port

__all__ = ["Call", "Entry", "RlsRecorder"]

Entry = tuple[str, str]


@dataclass(frozen=True)
class Descriptor:
    """One descriptor as Envoy sent it."""

    entries: tuple[Entry, ...]
    hits_addend: int | None  # the per-descriptor hits_addend when Envoy set one
    is_negative_hits: bool

    def get(self, key: str) -> str | None:
        """The value of entry `key` (None when absent)."""
        for k, v in self.entries:
            if k == key:
                return v
        return None


@dataclass(frozen=True)
class Call:
    """One ShouldRateLimit call: when it arrived (monotonic), the request, the answer."""

    at: float
    domain: str
    hits_addend: int
    descriptors: tuple[Descriptor, ...]
    overall_code: int  # 0 when the service failed the call
    error: str = ""


class RlsRecorder:
    """A tap on a free port of 127.0.0.1 forwarding to the service at `target`."""

    def __init__(self, target: str, timeout: float = 5.0) -> None:
        self.port = free_port()
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._timeout = timeout
        self._channel = grpc.insecure_channel(target)
        self._forward = self._channel.unary_unary(METHOD_PATH)
        handler = grpc.method_handlers_generic_handler(
            SERVICE_NAME, {METHOD_NAME: grpc.unary_unary_rpc_method_handler(self._call)}
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        self._server.start()

    def _call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        at = time.monotonic()
        msg = rls_pb2.RateLimitRequest.FromString(request)
        descriptors = tuple(
            Descriptor(
                tuple((e.key, e.value) for e in d.entries),
                d.hits_addend.value if d.HasField("hits_addend") else None,
                d.is_negative_hits,
            )
            for d in msg.descriptors
        )
        try:
            reply: bytes = self._forward(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            self._record(Call(at, msg.domain, msg.hits_addend, descriptors, 0, str(exc.code())))
            context.abort(exc.code(), exc.details() or "")
            raise  # abort raises; for the type checker
        code = rls_pb2.RateLimitResponse.FromString(reply).overall_code
        self._record(Call(at, msg.domain, msg.hits_addend, descriptors, code))
        return reply

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def snapshot(self) -> list[Call]:
        """The calls so far, in arrival order."""
        with self._lock:
            return list(self.calls)

    def phase(self, phase: str, key: str = "phase") -> list[Descriptor]:
        """Every descriptor recorded whose `key` entry is `phase`."""
        return [d for c in self.snapshot() for d in c.descriptors if d.get(key) == phase]

    def close(self) -> None:
        """Stop the server and the channel."""
        self._server.stop(0).wait(5)
        self._channel.close()
