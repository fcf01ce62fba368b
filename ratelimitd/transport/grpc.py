"""The grpc.aio gRPC listener: RLS v3 ShouldRateLimit and grpc.health.v1 on a grpc.aio server.

ShouldRateLimit is registered with no serializers: grpc hands the handler the request bytes
and sends back the bytes it returns, and the shared `rls.RlsHandler` (also the native
transport's) decodes, decides, encodes, maps errors to statuses and counts the call.

Behaviour follows the reference (`src/service/ratelimit.go`, `src/server`): service errors
and backend errors become status UNKNOWN carrying the error text; health service `ratelimit`
follows the process's Health while `""` stays SERVING; TLS and mTLS come from GRPC_SERVER_* /
GRPC_CLIENT_* with certificate files re-read when they change on disk.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from ratelimitd.health import Health
from ratelimitd.quota import QuotaService
from ratelimitd.runtime.tlsfiles import unreadable
from ratelimitd.service import RateLimitService
from ratelimitd.settings import Settings
from ratelimitd.stats import StatsStore, Timer

from .protocodec import METHOD_NAME, SERVICE_NAME
from .protocodec import METHOD_PATH as METHOD_PATH  # re-exported for existing importers
from .rlqs import register_grpcio
from .rls import RlsHandler
from .spans import Continuation, Details, Handler

log = logging.getLogger(__name__)

# The health service name whose status follows `Health` (the reference's).
HEALTH_SERVICE = "ratelimit"

# grpc's StatusCode by number, for the shared handler's codes.
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}

# grpc channel arguments are C ints; core reads INT_MAX as "never".
_INT_MAX = 2**31 - 1


_Files = TypeVar("_Files", bound="CertificateFiles")


class GrpcConfigError(ValueError):
    """The GRPC_* settings cannot describe a listener (e.g. TLS without a certificate)."""


def server_options(settings: Settings) -> list[tuple[str, int]]:
    """grpc.aio server options from GRPC_MAX_CONNECTION_AGE(_GRACE), plus SO_REUSEPORT.

    grpc core applies +/-10% jitter to max_connection_age itself (as grpc-go does for the
    reference), so connections opened together are not all closed at the same moment. A zero
    duration means "no limit", grpc-go's meaning of an unset value.
    """
    # Only workers of one daemon share the port; grpc core sets SO_REUSEPORT by default on
    # Linux, which let a second instance bind it silently and take part of the traffic.
    options = [("grpc.so_reuseport", int(settings.workers.shares_ports))]
    age = settings.grpc.max_connection_age
    if age > 0:
        options.append(("grpc.max_connection_age_ms", _millis(age)))
    grace = settings.grpc.max_connection_age_grace
    if grace > 0:
        options.append(("grpc.max_connection_age_grace_ms", _millis(grace)))
    return options


def _millis(seconds: float) -> int:
    return max(1, min(_INT_MAX, round(seconds * 1000)))


def listen_address(settings: Settings) -> str:
    """The grpc bind address: `unix:<GRPC_UDS>` when set, else GRPC_HOST:GRPC_PORT."""
    listeners = settings.listeners
    uds = listeners.grpc_uds
    if uds:
        return uds if uds.startswith(("unix:", "unix-abstract:")) else "unix:" + uds
    host = listeners.grpc_host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"{host}:{listeners.grpc_port}"


class CertificateFiles:
    """The server's TLS files, re-read whenever one of them changes on disk.

    `_load` builds what a transport uses from them: grpc's certificate configuration here,
    an `ssl.SSLContext` in the native transport's subclass.

    grpc calls `fetch` before each new TLS handshake; a stat per file there is cheap, and a
    changed file (rewritten in place or replaced by rename) is picked up by the next
    connection while established ones keep their session. A file that cannot be read or
    parsed keeps the previous certificates (and logs why), as the reference's watcher does.
    """

    def __init__(self, cert: str, key: str, client_ca: str = "") -> None:
        self.paths = tuple(p for p in (cert, key, client_ca) if p)
        self._cert, self._key, self._ca = cert, key, client_ca
        self._stamp = self._stat()
        self.initial = self._load()

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in self.paths:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def _ssl_context(self) -> ssl.SSLContext:
        """The files as a server SSLContext; a file that does not parse raises ValueError
        naming its variable (the reference refuses such files at start-up)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self._cert, self._key)
        except ssl.SSLError as err:
            raise ValueError(
                "GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY: cannot load the key pair "
                f"({self._cert}, {self._key}): {err.reason or err}"
            ) from None
        if self._ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            try:
                ctx.load_verify_locations(self._ca)
            except ssl.SSLError as err:
                raise ValueError(
                    f"GRPC_CLIENT_TLS_CACERT: no CA certificate in {self._ca}: {err.reason or err}"
                ) from None
        return ctx

    def _load(self) -> Any:
        self._ssl_context()  # grpc would only fail at bind or handshake time, and less clearly
        with open(self._cert, "rb") as f:
            cert = f.read()
        with open(self._key, "rb") as f:
            key = f.read()
        ca = None
        if self._ca:
            with open(self._ca, "rb") as f:
                ca = f.read()
        return grpc.ssl_server_certificate_configuration(((key, cert),), root_certificates=ca)

    def fetch(self) -> Any:
        """The new configuration when a file changed since the last load, else None."""
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return None
            config = self._load()
        except (OSError, ValueError) as err:
            log.warning("keeping the previous gRPC TLS certificates: %s", err)
            return None
        self._stamp = stamp
        log.info("reloaded gRPC TLS certificates from %s", ", ".join(self.paths))
        return config

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that consult `fetch`; client certs required iff a CA is set."""
        return grpc.dynamic_ssl_server_credentials(
            self.initial, self.fetch, require_client_authentication=bool(self._ca)
        )


def certificate_files(settings: Settings, kind: type[_Files]) -> _Files | None:
    """The server's TLS files per GRPC_SERVER_USE_TLS and GRPC_*_TLS_*, or None for plaintext."""
    s = settings.grpc
    if not s.server_use_tls:
        return None
    if not s.server_tls_cert or not s.server_tls_key:
        raise GrpcConfigError(
            "GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
        )
    problem = unreadable(
        (
            ("GRPC_SERVER_TLS_CERT", s.server_tls_cert),
            ("GRPC_SERVER_TLS_KEY", s.server_tls_key),
            ("GRPC_CLIENT_TLS_CACERT", s.client_tls_cacert),
        )
    )
    if problem:
        raise GrpcConfigError(problem)
    try:
        return kind(s.server_tls_cert, s.server_tls_key, s.client_tls_cacert)
    except ValueError as err:
        raise GrpcConfigError(str(err)) from err
    except OSError as err:
        raise GrpcConfigError(f"cannot read the gRPC TLS files: {err}") from err


def call_on_loop(loop: asyncio.AbstractEventLoop | None, callback: Any, *args: Any) -> None:
    """`callback(*args)` now when on `loop`, else soon on it (Health may change from a signal
    handler or a watcher thread); nothing when the transport is not started."""
    if loop is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        callback(*args)
    else:
        loop.call_soon_threadsafe(callback, *args)


def dns_name_matches(pattern: str, name: str) -> bool:
    """Whether a certificate DNS name (`*.example.com` wildcards allowed) covers `name`."""
    pattern, name = pattern.lower().rstrip("."), name.lower().rstrip(".")
    if pattern == name:
        return True
    if pattern.startswith("*.") and "." in name:
        # A wildcard covers exactly one left-most label, as crypto/x509 matches it.
        return name.split(".", 1)[1] == pattern[2:] and bool(name.split(".", 1)[0])
    return False


class _RequireClientSan(grpc.aio.ServerInterceptor):
    """GRPC_CLIENT_TLS_SAN: every call's client certificate must carry that DNS name.

    grpc Python has no hook into certificate verification, so the check runs per call on the
    handshake's auth context (the reference rejects at the handshake); calls from a client
    without the name fail UNAUTHENTICATED. Installed only when the setting is present. It
    wraps the kinds our server has: unary-unary, unary-stream (health) and stream-stream
    (StreamRateLimitQuotas).
    """

    def __init__(self, san: str) -> None:
        self._san = san
        self._refusal = f"client certificate does not match the required SAN {san!r}"

    def _allowed(self, context: grpc.aio.ServicerContext) -> bool:
        names = context.auth_context().get("x509_subject_alternative_name", ())
        return any(dns_name_matches(n.decode("utf-8", "replace"), self._san) for n in names)

    async def _admit(self, context: grpc.aio.ServicerContext) -> None:
        """Abort the call UNAUTHENTICATED unless its client certificate names the SAN."""
        if not self._allowed(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, self._refusal)

    async def intercept_service(self, continuation: Continuation, details: Details) -> Handler:
        handler = await continuation(details)
        if handler is None:
            return handler
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await self._admit(context)
                return await inner_uu(request, context)

            return handler._replace(unary_unary=unary_unary)  # type: ignore[attr-defined]
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await self._admit(context)
                result = inner_us(request, context)
                if inspect.isasyncgen(result):
                    # A generator-style servicer: forward what it yields.
                    async for item in result:
                        await context.write(item)
                    return None
                return await result  # a context.write()-style servicer (grpc's health)

            return handler._replace(unary_stream=unary_stream)  # type: ignore[attr-defined]
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream

            async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                await self._admit(context)
                async for item in inner_ss(requests, context):
                    yield item

            return handler._replace(stream_stream=stream_stream)  # type: ignore[attr-defined]
        return handler


@dataclass(eq=False)
class GrpcTransport:
    """ShouldRateLimit and health on one grpc.aio server bound as the settings say.

    The daemon calls `await start()` (build, register, bind, start) and `await stop(grace)`.
    `register(server)` alone adds the two services to a server built elsewhere.
    """

    settings: Settings
    service: RateLimitService
    health: Health
    stats: StatsStore
    _: KW_ONLY
    # The stats sink's `ratelimit_server.ShouldRateLimit.response_time` (None: no sink).
    response_timer: Timer | None = None
    # Tracing stays the interceptor's (extra_interceptors) on grpc.aio.
    extra_interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
    # StreamRateLimitQuotas is served when given.
    quota: QuotaService | None = None

    def __post_init__(self) -> None:
        self.handler = RlsHandler(self.service, self.stats, self.response_timer)
        self.server: grpc.aio.Server | None = None
        self.address = listen_address(self.settings)
        self.port = 0
        self.certificates: CertificateFiles | None = None
        self.health_servicer = health_aio.HealthServicer()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Keeps pending health updates alive until they ran (the loop holds weak refs).
        self._health_tasks: set[asyncio.Task[None]] = set()

    # -- ShouldRateLimit -------------------------------------------------------------------

    async def should_rate_limit(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The raw-bytes ShouldRateLimit handler: the shared call, its status as an abort."""
        code, reply = await self.handler.decide(request)
        if code:
            await context.abort(_STATUS_CODES[code], reply)  # type: ignore[arg-type]
        return reply  # type: ignore[return-value]

    # -- health ----------------------------------------------------------------------------

    def _on_health(self, healthy: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if healthy
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        call_on_loop(self._loop, self._set_health, status)

    def _set_health(self, status: int) -> None:
        task = asyncio.ensure_future(self.health_servicer.set(HEALTH_SERVICE, status))  # type: ignore[arg-type]
        self._health_tasks.add(task)
        task.add_done_callback(self._health_tasks.discard)

    # -- server ----------------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        """Add ShouldRateLimit (raw bytes in and out) and grpc.health.v1.Health to `server`."""
        # No request_deserializer / response_serializer: the handler sees and returns bytes.
        handler = grpc.unary_unary_rpc_method_handler(self.should_rate_limit)
        # A registered (pre-declared) method is matched by grpc core when the call arrives,
        # skipping the per-call Python lookup through generic handlers.
        server.add_registered_method_handlers(SERVICE_NAME, {METHOD_NAME: handler})
        health_pb2_grpc.add_HealthServicer_to_server(self.health_servicer, server)
        if self.quota is not None:
            register_grpcio(server, self.quota)

    def credentials(self) -> grpc.ServerCredentials | None:
        """TLS credentials per GRPC_SERVER_USE_TLS and the cert settings, or None for plaintext."""
        self.certificates = certificate_files(self.settings, CertificateFiles)
        return None if self.certificates is None else self.certificates.credentials()

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """The SAN check when mTLS with GRPC_CLIENT_TLS_SAN is configured, else none."""
        s = self.settings.grpc
        out: list[grpc.aio.ServerInterceptor] = []
        if s.server_use_tls and s.client_tls_cacert and s.client_tls_san:
            out.append(_RequireClientSan(s.client_tls_san))
        return [*out, *self.extra_interceptors]

    def bind(self, server: grpc.aio.Server) -> int:
        """Listen on the configured address; the bound TCP port (0 for a unix socket)."""
        creds = self.credentials()
        if creds is None:
            port = server.add_insecure_port(self.address)
        else:
            port = server.add_secure_port(self.address, creds)
        self.port = 0 if self.address.startswith("unix") else port
        return self.port

    async def start(self) -> None:
        """Build the server, register the services, bind, start, and follow Health."""
        self._loop = asyncio.get_running_loop()
        server = grpc.aio.server(
            interceptors=self.interceptors(), options=server_options(self.settings)
        )
        self.register(server)
        self.bind(server)
        await server.start()
        self.server = server
        self.health.subscribe(self._on_health)
        log.info("gRPC listening on %s", self.address if not self.port else self.port)

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, stop accepting, let in-flight calls finish for `grace` s."""
        await self.health_servicer.enter_graceful_shutdown()
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None
        self._loop = None
