"""The debug listener's routes: `/`, `/rlconfig`, `/stats` and a CPU-profile endpoint.

As the reference's debug server (section 10.5), except that `/stats` shows our own
counters and gauges (`<name>: <value>` lines sorted by name) rather than Go's expvars, and
`/debug/pprof/profile` returns a `cProfile` report as text instead of a pprof protobuf.

The profile covers the event-loop thread only (cProfile hooks the thread that enables
it): that is where decisions, the transports and the backends' client code run; work in
other threads (gRPC's C core, executors) is not in it.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
from collections.abc import Mapping
from urllib.parse import parse_qs

from ..service import RateLimitService
from ..stats import StatsStore
from .http import ERROR_HEADERS, TEXT_PLAIN, Handler, HttpRequest, Reply

__all__ = ["DEFAULT_PROFILE_SECONDS", "MAX_PROFILE_SECONDS", "debug_routes"]

DEFAULT_PROFILE_SECONDS = 30
MAX_PROFILE_SECONDS = 300

_PPROF_HELP = (
    b"ratelimitd profiling endpoints\n"
    b"\n"
    b"/debug/pprof/profile?seconds=N  CPU profile of the event-loop thread for N seconds\n"
    b"    (default 30, at most 300), as cProfile/pstats text sorted by cumulative time.\n"
    b"    One profile runs at a time; a concurrent request gets 409.\n"
)


def _format_value(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class _Profiler:
    """The profile endpoint and its one-at-a-time guard."""

    def __init__(self) -> None:
        self.busy = False

    async def __call__(self, request: HttpRequest) -> Reply:
        raw = parse_qs(request.query.decode("latin-1")).get("seconds")
        seconds = DEFAULT_PROFILE_SECONDS
        if raw:
            try:
                seconds = int(raw[-1])
            except ValueError:
                seconds = 0
            if not 0 < seconds <= MAX_PROFILE_SECONDS:
                message = f"seconds must be an integer from 1 to {MAX_PROFILE_SECONDS}\n"
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
    extra: Mapping[str, tuple[str, Handler]] | None = None,
) -> dict[str, Handler]:
    """The debug server's route table; `extra` adds `path -> (help, handler)` endpoints."""
    endpoints: dict[str, tuple[str, Handler]] = {}

    async def pprof_index(request: HttpRequest) -> Reply:
        return 200, TEXT_PLAIN, _PPROF_HELP

    async def rlconfig(request: HttpRequest) -> Reply:
        ruleset = service.ruleset
        return 200, TEXT_PLAIN, (ruleset.dump() if ruleset is not None else "").encode()

    async def stats_page(request: HttpRequest) -> Reply:
        snapshot = stats.snapshot()
        text = "".join(f"{name}: {_format_value(snapshot[name])}\n" for name in sorted(snapshot))
        return 200, TEXT_PLAIN, text.encode()

    endpoints["/debug/pprof/"] = ("root of various pprof endpoints. hit for help.", pprof_index)
    endpoints["/debug/pprof/profile"] = ("CPU profiling endpoint", _Profiler())
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
