"""The native gRPC transport: ShouldRateLimit and grpc.health.v1 on the libnghttp2 core.

The same listener as `grpc.py` (same settings, same statuses, same stats through the shared
`rls.RlsHandler`) without grpc.aio's threads and per-call machinery. A decision on a
synchronous limiter (the memory backend) is made inside the read callback with no task;
one that waits for a backend gets one task, and its reply is written with the other
replies finished in the same loop iteration.

Differences from the grpc.aio transport, on purpose: GRPC_CLIENT_TLS_SAN is checked when the
TLS handshake completes (the connection is refused, as the reference refuses it) instead of
per call; the number of concurrent streams per connection is GRPC_MAX_CONCURRENT_STREAMS.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from ..grpcstatus import CANCELLED, INTERNAL, NOT_FOUND, OK, RESOURCE_EXHAUSTED, UNIMPLEMENTED
from ..health import Health
from ..messages import Request, Response
from ..quota import QuotaService
from ..service import RateLimitService
from ..settings import Settings
from ..stats import StatsStore, Timer
from ..stats.tracing import Tracing
from .grpc import (
    HEALTH_SERVICE,
    CertificateFiles,
    call_on_loop,
    certificate_files,
    dns_name_matches,
    listen_address,
)
from .h2 import H2Protocol, H2Server
from .limits import ConnectionBudget
from .protocodec import METHOD_PATH, SERVICE_NAME, decoded_size, encode_response
from .rlqs import NativeQuotaRoute
from .rls import RlsHandler, outcome_of, router
from .spans import ServerSpans

log = logging.getLogger("ratelimitd.transport.native")

# HealthCheckResponse.ServingStatus
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3
HEALTH_CHECK = b"/grpc.health.v1.Health/Check"
HEALTH_WATCH = b"/grpc.health.v1.Health/Watch"
# A HealthCheckResponse is field 1 (varint) holding the status.
_HEALTH_REPLY = {status: bytes((0x08, status)) for status in (0, 1, 2, 3)}


def unknown_method(path: bytes) -> str:
    """grpc-go's UNIMPLEMENTED text for a path no service serves."""
    text = path.decode("utf-8", "replace")
    name = text[1:] if text.startswith("/") else text
    service, slash, method = name.rpartition("/")
    if not slash:
        return f'malformed method name: "{text}"'
    if service in (SERVICE_NAME, "grpc.health.v1.Health"):
        return f"unknown method {method} for service {service}"
    return f"unknown service {service}"


class SslCertificates(CertificateFiles):
    """The TLS files as an `ssl.SSLContext` (ALPN h2), swapped in for new handshakes when
    a file changes: the listening context's SNI callback, called on every handshake, hands
    the connection the newest context."""

    def _load(self) -> ssl.SSLContext:
        ctx = self._ssl_context()
        ctx.set_alpn_protocols(["h2"])
        ctx.sni_callback = self._select
        return ctx

    def context(self) -> ssl.SSLContext:
        """The context to listen with."""
        self.current: ssl.SSLContext = self.initial
        return self.current

    def _select(self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        fresh = self.fetch()
        if fresh is not None:
            self.current = fresh
        if self.current is not ctx:
            conn.context = self.current


class _Watch:
    """One Health/Watch stream: sent every change of its service's status."""

    __slots__ = ("health", "last", "proto", "service", "stream")

    def __init__(self, health: NativeHealth, service: str, stream: Any, proto: H2Protocol) -> None:
        self.health = health
        self.service = service
        self.stream = stream
        self.proto = proto
        self.last = -1

    def send(self, status: int) -> None:
        if status != self.last:
            self.last = status
            self.proto.send_message(self.stream, _HEALTH_REPLY[status])

    def cancel(self) -> None:
        self.health.watchers.discard(self)


class NativeHealth:
    """grpc.health.v1 statuses: `""` SERVING, `ratelimit` following Health, both
    NOT_SERVING once shutting down (what grpc's HealthServicer does)."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {"": SERVING}
        self.watchers: set[_Watch] = set()
        self.shutting_down = False

    def set(self, service: str, status: int) -> None:
        """Change one service's status and tell its watchers."""
        if self.shutting_down:
            return
        self.statuses[service] = status
        for watch in list(self.watchers):
            if watch.service == service:
                watch.send(status)

    def shutdown(self) -> None:
        """Every service NOT_SERVING from now on."""
        for service in list(self.statuses):
            self.set(service, NOT_SERVING)
        self.shutting_down = True

    def check(self, stream: Any, proto: H2Protocol) -> None:
        """Health/Check."""
        service = _health_service(stream, proto)
        if service is None:
            return
        status = self.statuses.get(service)
        if status is None:
            proto.finish(stream, NOT_FOUND, "")
        else:
            proto.answer(stream, 0, _HEALTH_REPLY[status])

    def watch(self, stream: Any, proto: H2Protocol) -> None:
        """Health/Watch: the current status now, then every change, until the client leaves."""
        service = _health_service(stream, proto)
        if service is None:
            return
        watch = _Watch(self, service, stream, proto)
        self.watchers.add(watch)
        stream.work = watch
        watch.send(self.statuses.get(service, SERVICE_UNKNOWN))
        if stream.timeout >= 0:
            proto.server.watch_deadline(stream, proto)


def _health_service(stream: Any, proto: H2Protocol) -> str | None:
    try:
        return str(health_pb2.HealthCheckRequest.FromString(stream.message).service)
    except DecodeError as err:
        proto.finish(stream, INTERNAL, f"grpc: error unmarshalling request: {err}")
        return None


class _Pending:
    """One call whose store round is under way (`_rls.Pending`'s twin): the `Waiter` of
    `RateLimitService.send`, and the stream's `work`."""

    __slots__ = ("cancelled", "handler", "plan", "proto", "request", "started", "stream", "task")

    def __init__(
        self, handler: RlsHandler, stream: Any, proto: H2Protocol, request: Any, started: float
    ) -> None:
        self.handler = handler
        self.stream = stream
        self.proto = proto
        self.request = request
        self.started = started
        self.plan: Any = None
        self.cancelled = False
        self.task: asyncio.Task[None] | None = None

    def __call__(self, results: Any) -> None:
        handler = self.handler
        if self.cancelled:
            handler.service.dropped()
            handler.done(self.started, CANCELLED, "")
            return
        outcome = handler.received(self.started, self.request, self.plan, results)
        self.proto.answer(self.stream, *outcome)

    def cancel(self) -> None:
        """The client left or the deadline passed: no answer (the round still ends)."""
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()


class NativeGrpcTransport:
    """ShouldRateLimit and health on the native HTTP/2 server; `GrpcTransport`'s interface."""

    def __init__(
        self,
        settings: Settings,
        service: RateLimitService,
        health: Health,
        stats: StatsStore,
        *,
        response_timer: Timer | None = None,
        tracing: Tracing | None = None,
        budget: ConnectionBudget | None = None,
        quota: QuotaService | None = None,
    ) -> None:
        self.settings = settings
        self.service = service
        self.health = health
        self.stats = stats
        spans = ServerSpans(tracing) if tracing is not None else None
        self.handler = RlsHandler(service, stats, response_timer, spans)
        self.health_statuses = NativeHealth()
        handler = self.handler
        if handler.sends:
            decide = handler.send_route(self._send, self._task)
        else:
            decide = handler.route(self._should_rate_limit, self._in_task)
        self.routes = {
            METHOD_PATH.encode(): decide,
            HEALTH_CHECK: self.health_statuses.check,
            HEALTH_WATCH: self.health_statuses.watch,
        }
        streaming = []
        if quota is not None:
            # StreamRateLimitQuotas: a bidirectional stream of the core.
            quota_route = NativeQuotaRoute(quota)
            self.routes[quota_route.path] = quota_route
            streaming.append(quota_route.path)
        g = settings.grpc
        mtls = g.server_use_tls and bool(g.client_tls_cacert)
        self.server = H2Server(
            router(self.routes, self._unknown) or self._dispatch,
            max_concurrent_streams=g.max_concurrent_streams,
            max_connection_age=g.max_connection_age,
            max_connection_age_grace=g.max_connection_age_grace,
            metadata=spans.fields if spans is not None else (),
            client_san=g.client_tls_san if mtls else "",
            san_matches=dns_name_matches,
            max_connections=settings.connections.grpc_max_connections,
            read_timeout=settings.connections.grpc_read_timeout,
            write_timeout=settings.connections.grpc_write_timeout,
            connection_timeout=settings.connections.grpc_connection_timeout,
            budget=budget,
            streaming=streaming,
        )
        self.certificates: SslCertificates | None = None
        self.address = listen_address(settings)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- calls -----------------------------------------------------------------------------

    def _dispatch(self, stream: Any, proto: H2Protocol) -> None:
        # The pure twin of `_rls.Router`.
        route = self.routes.get(stream.path)
        if route is None:
            self._unknown(stream, proto)
        else:
            route(stream, proto)

    @staticmethod
    def _unknown(stream: Any, proto: H2Protocol) -> None:
        proto.finish(stream, UNIMPLEMENTED, unknown_method(stream.path or b""))

    def _should_rate_limit(self, stream: Any, proto: H2Protocol) -> None:
        handler = self.handler
        if handler.synchronous:
            outcome = handler.decide_now(stream.message)
            if outcome is not None:
                proto.answer(stream, *outcome)
                return
        self._in_task(stream, proto)

    def _in_task(self, stream: Any, proto: H2Protocol) -> None:
        if self._held(stream, proto):
            self._task(stream, proto)

    @staticmethod
    def _held(stream: Any, proto: H2Protocol) -> bool:
        # Its request, decoded, stays in memory while the decision waits: counted in the
        # process's buffers until it is answered (refused at once when they are full).
        if proto.conn.hold(stream, decoded_size(stream.message)):
            return True
        proto.finish(stream, RESOURCE_EXHAUSTED, proto.conn.refusal)
        return False

    def _send(self, stream: Any, proto: H2Protocol) -> None:
        """The pure twin of `_rls.SendRoute` (see there): the decision started without a
        task, answered by its `_Pending` when the store's round is over."""
        handler = self.handler
        started = handler.clock()
        if not self._held(stream, proto):
            return
        request = handler.decoded(stream.message, started)
        if not isinstance(request, Request):
            proto.answer(stream, *request)
            return
        pending = _Pending(handler, stream, proto, request, started)
        try:
            out = handler.service.send(request, pending)
            if out is None:
                self._task(stream, proto)
                return
            if type(out) is not Response:  # the plan whose round is under way
                pending.plan = out
                stream.work = pending
                if stream.timeout >= 0:
                    self.server.watch_deadline(stream, proto)
                return
            outcome = handler.done(started, OK, encode_response(out))
        except Exception as err:
            outcome = handler.done(started, *outcome_of(err))
        proto.answer(stream, *outcome)

    def _task(self, stream: Any, proto: H2Protocol) -> None:
        # A held request decided in a task.
        carrier = dict(stream.metadata) if stream.metadata else None
        stream.work = self._loop.create_task(self._decide(stream, proto, carrier))  # type: ignore[union-attr]
        if stream.timeout >= 0:
            self.server.watch_deadline(stream, proto)

    async def _decide(self, stream: Any, proto: H2Protocol, carrier: dict[str, str] | None) -> None:
        code, reply = await self.handler.decide(stream.message, carrier)
        proto.answer(stream, code, reply)

    # -- health ----------------------------------------------------------------------------

    def _on_health(self, healthy: bool) -> None:
        status = SERVING if healthy else NOT_SERVING
        call_on_loop(self._loop, self.health_statuses.set, HEALTH_SERVICE, status)

    # -- server ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind as the settings say, start serving, and follow Health."""
        listeners = self.settings.listeners
        self._loop = asyncio.get_running_loop()
        self.certificates = certificate_files(self.settings, SslCertificates)
        context = self.certificates.context() if self.certificates is not None else None
        uds = listeners.grpc_uds
        if uds.startswith("unix-abstract:"):
            uds = "\0" + uds.removeprefix("unix-abstract:")
        else:
            uds = uds.removeprefix("unix:")
        self.port = await self.server.start(
            listeners.grpc_host,
            listeners.grpc_port,
            uds=uds,
            ssl_context=context,
            reuse_port=self.settings.workers.shares_ports,
        )
        self.health.subscribe(self._on_health)
        log.info("gRPC (native HTTP/2) listening on %s", self.address if uds else self.port)

    async def stop(self, grace: float | None = None) -> None:
        """NOT_SERVING, stop accepting, GOAWAY, let in-flight calls finish for `grace` s."""
        self.health_statuses.shutdown()
        if self._loop is not None:
            await self.server.stop(grace)
        self._loop = None
