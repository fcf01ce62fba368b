"""The ratelimitd daemon: settings -> backend, config, service -> gRPC, HTTP and debug servers.

`build(settings)` wires the pieces around the decision core of `core.build_core` (the
factory the tests and benchmarks build their cores with); `Daemon.run()` starts
them in the reference's order — backend connected and first config loaded before any port
opens — and shuts down in a fixed order on SIGTERM/SIGINT: report unhealthy, stop
accepting, drain in-flight calls, close the backend, exit 0. SIGHUP reloads the config.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from ..backends.base import Backend, BackendError
from ..config.provider import FileLayout
from ..config.xds_client import XdsSettingsError
from ..core import build_core
from ..health import Health
from ..quota import QuotaService
from ..runtime import allocator
from ..runtime.aio import cancel
from ..service import RateLimitService
from ..settings import (
    ReloadOptions,
    Settings,
    SettingsError,
    reload_options_from_env,
)
from ..settings.checks import refuse_native_only
from ..stats import StatsStore
from ..stats.base import Sink, SinkError
from ..stats.sinks import create_sink
from ..stats.tracing import Tracing, create_tracing
from ..transport.debug import debug_routes
from ..transport.grpc import GrpcConfigError, GrpcTransport
from ..transport.http import Handler, HttpServer
from ..transport.limits import ConnectionBudget
from ..transport.routes import main_routes
from ..transport.spans import server_interceptor
from .reloader import ConfigReloader

try:
    from ..transport.native import NativeGrpcTransport
except ImportError:  # the HTTP/2 core was not built (no libnghttp2.so.14 at install)
    NativeGrpcTransport = None  # type: ignore[assignment,misc]

log = logging.getLogger("ratelimitd")

# How long in-flight calls may take to finish after SIGTERM.
DRAIN_GRACE_SECONDS = 10.0
# Allocations between young-generation collections (CPython's default is 700).
GC_GEN0_THRESHOLD = 20_000


@dataclass
class Daemon:
    """Everything one ratelimitd process runs."""

    settings: Settings
    stats: StatsStore
    health: Health
    backend: Backend
    service: RateLimitService
    reloader: ConfigReloader
    grpc: GrpcTransport | NativeGrpcTransport
    http: HttpServer
    debug: HttpServer
    sink: Sink
    tracing: Tracing | None = None
    quota: QuotaService | None = None

    def __post_init__(self) -> None:
        self._stop: asyncio.Event | None = None

    def request_stop(self) -> None:
        """Begin shutdown: unhealthy at once, then the run loop drains and exits."""
        self.health.set("sigterm", False)
        if self._stop is not None:
            self._stop.set()

    async def _unless_stopped(self, work: Coroutine[Any, Any, None]) -> bool:
        """Run `work` unless a stop is asked for first (it is then cancelled); whether it
        ran to the end (its errors are raised)."""
        assert self._stop is not None
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
        await cancel(stop)
        if task.done():
            task.result()
            return True
        await cancel(task)
        return False

    async def run(self) -> int:
        """Serve until a termination signal; the process exit status."""
        s = self.settings
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        # The reference stops on SIGHUP too; here it reloads the config (docs/compatibility.md).
        loop.add_signal_handler(signal.SIGHUP, self.reloader.request_reload)

        # A pod that cannot reach its backend must still stop when asked: the start-up
        # retries (REDIS_STARTUP_*) once ignored SIGTERM for as long as they went on.
        if not await self._unless_stopped(self.backend.connect()):
            log.info("stopped before the backend was reached")
            await self.backend.close()
            return 0
        self.health.set("backend", True)

        # The reference opens no port before its first config loads, unless forced.
        while not await self.reloader.load():
            if s.config.force_start_without_initial_config or self._stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.reloader.poll_interval * 2)
        if self._stop.is_set():
            await self.backend.close()
            return 0

        await self.grpc.start()
        listeners = s.listeners
        shared = s.workers.shares_ports
        # The debug listener first: the HTTP listener serves /healthcheck, and a client told
        # the daemon is ready must find every listener open.
        await self.debug.start(listeners.debug_host, listeners.debug_port, reuse_port=shared)
        await self.http.start(listeners.host, listeners.port, reuse_port=shared)
        await self.sink.start()
        self.reloader.start()
        # Everything built so far (modules, rule set, servers) lives as long as the process:
        # move it out of the cyclic GC's reach, and let young collections run less often
        # than every 700 allocations. Requests allocate short-lived acyclic objects that
        # reference counting frees; this cut server CPU per decision by 10-20% under load.
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, 50, 100)
        log.info(
            "ratelimitd serving: grpc %s, http %s:%d, debug %s:%d, backend %s",
            self.grpc.address,
            listeners.host,
            self.http.port,
            listeners.debug_host,
            self.debug.port,
            self.backend.name,
        )

        await self._stop.wait()
        log.info("shutting down: draining in-flight requests")
        await self.reloader.stop()
        if self.quota is not None:
            # Quota assignments expire now (TTL 0), not a TTL after the last refresh.
            await self.quota.shutdown()
        await asyncio.gather(
            self.grpc.stop(DRAIN_GRACE_SECONDS),
            self.http.close(DRAIN_GRACE_SECONDS),
            self.debug.close(DRAIN_GRACE_SECONDS),
        )
        await self.sink.stop()  # the final flush
        if self.tracing is not None:
            await self.tracing.shutdown()
        await self.service.close()
        await self.backend.close()
        log.info("ratelimitd stopped")
        return 0


def build(settings: Settings) -> Daemon:
    """Wire a daemon from settings (no I/O until `run`)."""
    stats = StatsStore(
        max_request_series=settings.stats.max_request_series,
        max_request_key_bytes=settings.stats.max_request_key_bytes,
        rate_limit_gauges=settings.stats.rate_limit_gauges,
    )
    health = Health()
    health.register("backend", False)
    if settings.config.healthy_with_at_least_one_config_loaded:
        health.register("config", False)
    health.register("sigterm", True)

    # Every listener's clients together leave FD_RESERVE descriptors to the rest, and hold
    # at most MAX_BUFFERED_BYTES of requests and replies.
    limits = settings.connections
    budget = ConnectionBudget.for_process(limits.max_buffered_bytes)

    def http_server(routes: Mapping[str, Handler], name: str, max_connections: int) -> HttpServer:
        # The HTTP listeners share the HTTP timeouts and the process's budget.
        return HttpServer(
            routes,
            name=name,
            max_connections=max_connections,
            read_timeout=limits.http_read_timeout,
            idle_timeout=limits.http_idle_timeout,
            write_timeout=limits.http_write_timeout,
            budget=budget,
        )

    def metrics_server(routes: Mapping[str, Handler]) -> HttpServer:
        # The Prometheus listener (USE_PROMETHEUS) is an operational one like debug, and
        # takes its cap: its own default of 4,096 connections outside the budget once let
        # 3,000 idle connections take every descriptor of the process.
        return http_server(routes, "metrics", limits.debug_max_connections)

    sink = create_sink(
        settings,
        stats,
        worker_index=settings.workers.index,
        share_dir=settings.workers.stats_dir or None,
        serve=metrics_server,
    )
    tracing = create_tracing(settings)
    core = build_core(settings, stats=stats, health=health, tracing=tracing)
    service = core.service
    quota = QuotaService(service, settings.quota, stats)

    def reload_options() -> ReloadOptions:
        # The reference re-reads these from the environment on every load.
        try:
            return reload_options_from_env()
        except SettingsError as exc:
            log.error("keeping the previous settings: %s", exc)
            return settings.reload

    runtime = settings.runtime
    source = (
        settings.xds
        if settings.config.type == "GRPC_XDS_SOTW"
        else FileLayout(
            root=runtime.root,
            subdirectory=runtime.subdirectory,
            appdirectory=runtime.appdirectory,
            watch_root=runtime.watch_root,
            ignore_dotfiles=runtime.ignoredotfiles,
        )
    )
    reloader = ConfigReloader(
        source,
        service,
        stats,
        health,
        reload_options,
        track_config_health=settings.config.healthy_with_at_least_one_config_loaded,
    )
    return Daemon(
        settings=settings,
        stats=stats,
        health=health,
        backend=core.backend,
        service=service,
        reloader=reloader,
        grpc=grpc_transport(settings, service, health, stats, sink, tracing, budget, quota),
        http=http_server(
            main_routes(service, health, settings.listeners), "HTTP", limits.http_max_connections
        ),
        debug=http_server(
            debug_routes(service, stats, settings=settings.debug, quota=quota),
            "debug",
            limits.debug_max_connections,
        ),
        sink=sink,
        tracing=tracing,
        quota=quota,
    )


def grpc_transport(
    settings: Settings,
    service: RateLimitService,
    health: Health,
    stats: StatsStore,
    sink: Sink,
    tracing: Tracing | None,
    budget: ConnectionBudget | None = None,
    quota: QuotaService | None = None,
) -> GrpcTransport | NativeGrpcTransport:
    """The gRPC listener GRPC_TRANSPORT asks for: native HTTP/2 by default when built."""
    choice = settings.grpc.transport
    if choice != "grpcio" and NativeGrpcTransport is not None:
        return NativeGrpcTransport(
            settings,
            service,
            health,
            stats,
            response_timer=sink.timer,
            tracing=tracing,
            budget=budget,
            quota=quota,
        )
    if choice == "native":
        raise GrpcConfigError(
            "GRPC_TRANSPORT=native: the native transport was not built "
            "(install libnghttp2-14, the runtime library, and reinstall ratelimitd)"
        )
    if choice == "":
        # GRPC_TRANSPORT=grpcio's settings checks, now that grpc.aio will serve.
        try:
            refuse_native_only(settings)
        except SettingsError as exc:
            raise GrpcConfigError(str(exc)) from None
        log.warning(
            "the native gRPC transport was not built (no libnghttp2.so.14 at install): "
            "serving gRPC with grpc.aio"
        )
    return GrpcTransport(
        settings,
        service,
        health,
        stats,
        response_timer=sink.timer,
        # Tracing needs the interceptor; the response-time timer is fed by the handler.
        extra_interceptors=[i for i in (server_interceptor(tracing),) if i is not None],
        quota=quota,
    )


def serve(settings: Settings) -> int:
    """Run one daemon process on uvloop until it is told to stop."""
    import uvloop

    if settings.cache.backend_defaulted:
        log.warning(
            "no REDIS_* or MEMCACHE_* setting found: using the embedded in-memory backend "
            "(BACKEND_TYPE=memory); counters are local to this process"
        )
    # Large buffers are unmapped when freed, so a flood's peak is not kept (glibc).
    allocator.tune()
    try:
        daemon = build(settings)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(daemon.run())
    except (BackendError, GrpcConfigError, SinkError, XdsSettingsError, OSError) as exc:
        # Start-up failures (backend unreachable past its retries, bad TLS files, a port
        # in use) end the process with one line, not a traceback.
        log.critical("ratelimitd cannot start: %s", exc)
        return 1
