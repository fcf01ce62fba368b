"""The debug listener's routes: `/`, `/rlconfig`, `/stats` and a CPU-profile endpoint.

As the reference's debug server (section 10.5), except that `/stats` shows our own
counters and gauges (`<name>: <value>` lines sorted by name) rather than Go's expvars, and
`/debug/pprof/profile` returns a `cProfile` report as text instead of a pprof protobuf.

The profile covers the event-loop thread only (cProfile hooks the thread that enables
it): that is where decisions, the transports and the backends' client code run; work in
other threads (gRPC's C core, executors) is not in it.

Profiling slows every request while it runs, so unlike the reference's the endpoint is
off unless DEBUG_PROFILE_ENABLED=true, lasts at most DEBUG_PROFILE_MAX_DURATION (10 s by
default), runs one at a time, and with ADMIN_TOKEN set answers only requests bearing it
(`Authorization: Bearer <token>`, compared in constant time).
"""

from __future__ import annotations

import asyncio
import cProfile
import hmac
import io
import pstats
from collections.abc import Mapping
from urllib.parse import parse_qs

from ..service import RateLimitService
from ..settings import DebugSettings
from ..stats import StatsStore
from .http import ERROR_HEADERS, TEXT_PLAIN, Handler, HttpRequest, Reply

__all__ = ["DEFAULT_PROFILE_SECONDS", "debug_routes"]

# pprof's default; cut to the configured maximum.
DEFAULT_PROFILE_SECONDS = 30
# Lines of the /stats page formatted between two yields to the loop.
_PAGE_SLICE = 20_000

_PPROF_HELP = (
    "ratelimitd profiling endpoints\n"
    "\n"
    "/debug/pprof/profile?seconds=N  CPU profile of the event-loop thread for N seconds\n"
    "    (default and maximum {max} s), as cProfile/pstats text sorted by cumulative time.\n"
    "    One profile runs at a time; a concurrent request gets 409. {access}\n"
)
_DISABLED = (
    b"profiling is disabled: set DEBUG_PROFILE_ENABLED=true, or ADMIN_TOKEN to allow it\n"
    b"to requests bearing that token\n"
)
_UNAUTHORIZED_HEADERS = (*ERROR_HEADERS, ("WWW-Authenticate", 'Bearer realm="ratelimitd debug"'))


def _format_value(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class _Profiler:
    """The profile endpoint: its access rule, its length bound, its one-at-a-time guard."""

    def __init__(self, settings: DebugSettings) -> None:
        self.busy = False
        self.enabled = settings.profile_enabled or bool(settings.admin_token)
        self.token = settings.admin_token.encode()
        self.max_seconds = max(1, int(settings.profile_max_seconds))

    def refusal(self, request: HttpRequest) -> Reply | None:
        """403 when profiling is off, 401 without the admin token when one is set."""
        if not self.enabled:
            return 403, ERROR_HEADERS, _DISABLED
        if self.token:
            scheme, _, credentials = (request.header(b"authorization") or b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                credentials.strip(), self.token
            ):
                return 401, _UNAUTHORIZED_HEADERS, b"this endpoint needs the admin token\n"
        return None

    async def __call__(self, request: HttpRequest) -> Reply:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        raw = parse_qs(request.query.decode("latin-1")).get("seconds")
        seconds = min(DEFAULT_PROFILE_SECONDS, self.max_seconds)
        if raw:
            try:
                seconds = int(raw[-1])
            except ValueError:
                seconds = 0
            if not 0 < seconds <= self.max_seconds:
                message = f"seconds must be an integer from 1 to {self.max_seconds}\n"
                return 400, ERROR_HEADERS, message.encode()
        if self.busy:
            return 409, ERROR_HEADERS, b"a CPU profile is already running\n"
        self.busy = True
        profile = cProfile.Profile()
        try:
            profile.enable()
            try:
                # Stop early if the client goes away.
                await asyncio.wait([request.disconnected], timeout=seconds)
            finally:
                profile.disable()
        finally:
            self.busy = False
        out = io.StringIO()
        out.write(f"CPU profile of the event-loop thread, {seconds} s\n")
        pstats.Stats(profile, stream=out).sort_stats(pstats.SortKey.CUMULATIVE).print_stats()
        return 200, TEXT_PLAIN, out.getvalue().encode()


def debug_routes(
    service: RateLimitService,
    stats: StatsStore,
    *,
    settings: DebugSettings | None = None,
    extra: Mapping[str, tuple[str, Handler]] | None = None,
) -> dict[str, Handler]:
    """The debug server's route table; `extra` adds `path -> (help, handler)` endpoints."""
    endpoints: dict[str, tuple[str, Handler]] = {}
    profiler = _Profiler(settings or DebugSettings())
    access = (
        "It needs the admin token (Authorization: Bearer ...)."
        if profiler.token
        else ("It is open." if profiler.enabled else "It is disabled (DEBUG_PROFILE_ENABLED).")
    )
    pprof_help = _PPROF_HELP.format(max=profiler.max_seconds, access=access).encode()

    async def pprof_index(request: HttpRequest) -> Reply:
        return 200, TEXT_PLAIN, pprof_help

    async def rlconfig(request: HttpRequest) -> Reply:
        ruleset = service.ruleset
        return 200, TEXT_PLAIN, (ruleset.dump() if ruleset is not None else "").encode()

    async def stats_page(request: HttpRequest) -> Reply:
        snapshot = await stats.snapshot_sliced()
        names = sorted(snapshot)
        parts = []
        for i in range(0, len(names), _PAGE_SLICE):  # 600,000 lines must not hold the loop
            parts.append(
                "".join(f"{n}: {_format_value(snapshot[n])}\n" for n in names[i : i + _PAGE_SLICE])
            )
            await asyncio.sleep(0)
        return 200, TEXT_PLAIN, "".join(parts).encode()

    endpoints["/debug/pprof/"] = ("root of various pprof endpoints. hit for help.", pprof_index)
    endpoints["/debug/pprof/profile"] = ("CPU profiling endpoint", profiler)
    endpoints["/rlconfig"] = (
        "print out the currently loaded configuration for debugging",
        rlconfig,
    )
    endpoints["/stats"] = ("print out stats", stats_page)
    if extra:
        endpoints.update(extra)

    index_body = "".join(f"{path}: {endpoints[path][0]}\n" for path in sorted(endpoints)).encode()

    async def index(request: HttpRequest) -> Reply:
        return 200, TEXT_PLAIN, index_body

    routes = {path: handler for path, (_, handler) in endpoints.items()}
    routes["/"] = index
    return routes
