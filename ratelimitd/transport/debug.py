"""The debug listener's routes: `/`, `/rlconfig`, `/stats`, a CPU-profile endpoint and, with
ADMIN_TOKEN set, the admin endpoints `/counters` and `/explain` (`ratelimitd.admin`).

As the reference's debug server, except that `/stats` shows our own
counters and gauges (`<name>: <value>` lines sorted by name) rather than Go's expvars, and
`/debug/pprof/profile` returns a `cProfile` report as text instead of a pprof protobuf.

The profile covers the event-loop thread only (cProfile hooks the thread that enables
it): that is where decisions, the transports and the backends' client code run; work in
other threads (gRPC's C core, executors) is not in it.

Profiling slows every request while it runs, so unlike the reference's the endpoint is
off unless DEBUG_PROFILE_ENABLED=true, lasts at most DEBUG_PROFILE_MAX_DURATION (10 s by
default), runs one at a time, and with ADMIN_TOKEN set answers only requests bearing it
(`Authorization: Bearer <token>`, compared in constant time).

Why the admin endpoints live here: the debug listener is already the operator's port (kept
off the data path, bound to DEBUG_HOST, bounded to DEBUG_MAX_CONNECTIONS), so reading and
resetting counters needs no new listener to secure. Without ADMIN_TOKEN they do not exist
(404, as any unknown path); with it every request must bear the token:

    GET    /counters?domain=D&entry=K=V[&entry=K2=V2...]   the rule, keys, windows (JSON)
    DELETE /counters?domain=D&entry=K=V...                 reset every window; audited
    GET    /counters?rlqs[&domain=D]                       the quota buckets held now (JSON)
    POST   /explain   body: a RateLimitRequest as JSON     the dry run of `Admin.explain`
"""

from __future__ import annotations

import asyncio
import cProfile
import hmac
import io
import json
import pstats
from collections.abc import AsyncIterator, Mapping
from itertools import islice
from urllib.parse import parse_qs

from ..admin import Admin, AdminError
from ..grpcstatus import DEBUG, REFUSED
from ..messages import STORE_FAILED
from ..quota import QuotaService
from ..service import RateLimitService
from ..settings import DebugSettings
from ..stats import StatsStore
from .http import ERROR_HEADERS, JSON, TEXT_PLAIN, Handler, HttpRequest, Reply
from .jsoncodec import decode_request

__all__ = ["DEFAULT_PROFILE_SECONDS", "debug_routes"]

# pprof's default; cut to the configured maximum.
DEFAULT_PROFILE_SECONDS = 30
# Lines of the /stats page formatted per chunk sent (with the loop free between two): 600,000
# lines must not hold the loop, and an unread answer holds one chunk (~300 KiB) at most.
_PAGE_SLICE = 1_000

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


def _unauthorized(request: HttpRequest, token: bytes) -> Reply | None:
    """401 unless the request bears `token` (compared in constant time)."""
    scheme, _, credentials = (request.header(b"authorization") or b"").partition(b" ")
    if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(), token):
        return 401, _UNAUTHORIZED_HEADERS, b"this endpoint needs the admin token\n"
    return None


def _json(status: int, body: object) -> Reply:
    return status, JSON, json.dumps(body).encode()


def _refused(exc: AdminError) -> Reply:
    """An admin request refused: 400, or the debug listener's status for the service's
    refusal (`grpcstatus.REFUSED`)."""
    refusal = exc.refusal
    if refusal is None:
        return _json(400, {"error": str(exc)})
    prefix = "counter store: " if refusal.kind == STORE_FAILED else ""
    return _json(REFUSED[refusal.kind][DEBUG], {"error": f"{prefix}{exc}"})


def _admin_endpoints(
    admin: Admin, token: bytes, quota: QuotaService | None = None
) -> dict[str, tuple[str, Handler]]:
    """`/counters` and `/explain` (see the module docstring), all behind the token."""

    def quota_buckets(request: HttpRequest) -> Reply:
        # The RLQS buckets every stream holds: their descriptor, limit, and per stream the
        # demand, the tokens its Envoy holds and the strategy last sent.
        query = parse_qs(request.query.decode("utf-8", "replace"), keep_blank_values=True)
        unknown = set(query) - {"domain", "rlqs"}
        if unknown:
            return _json(400, {"error": f"unknown parameter(s): {', '.join(sorted(unknown))}"})
        domains = query.get("domain", [])
        buckets = quota.buckets(domains[0] if domains else None) if quota is not None else []
        return _json(200, {"buckets": buckets})

    def descriptor(request: HttpRequest) -> tuple[str, list[tuple[str, str]]]:
        query = parse_qs(request.query.decode("utf-8", "replace"), keep_blank_values=True)
        domains = query.get("domain", [])
        if len(domains) != 1 or not domains[0]:
            raise AdminError("give one non-empty domain= parameter")
        entries = []
        for raw in query.get("entry", []):
            key, sep, value = raw.partition("=")
            if not sep or not key:
                raise AdminError(f"entry={raw!r}: expected entry=KEY=VALUE")
            entries.append((key, value))
        if not entries:
            raise AdminError("give the descriptor as one or more entry=KEY=VALUE parameters")
        unknown = set(query) - {"domain", "entry"}
        if unknown:
            raise AdminError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
        return domains[0], entries

    async def counters(request: HttpRequest) -> Reply:
        refused = _unauthorized(request, token)
        if refused is not None:
            return refused
        if request.method not in (b"GET", b"DELETE"):
            return 405, (*ERROR_HEADERS, ("Allow", "GET, DELETE")), b"GET or DELETE\n"
        if request.method == b"GET" and b"rlqs" in {
            p.partition(b"=")[0] for p in request.query.split(b"&")
        }:
            return quota_buckets(request)
        try:
            domain, entries = descriptor(request)
            if request.method == b"GET":
                return _json(200, await admin.counter(domain, entries))
            return _json(200, await admin.reset(domain, entries, who=request.peer))
        except AdminError as exc:
            return _refused(exc)
        except LookupError as exc:
            return _json(404, {"error": str(exc.args[0])})

    async def explain(request: HttpRequest) -> Reply:
        refused = _unauthorized(request, token)
        if refused is not None:
            return refused
        if request.method != b"POST":
            return 405, (*ERROR_HEADERS, ("Allow", "POST")), b"POST a RateLimitRequest as JSON\n"
        try:
            decoded = decode_request(request.body)
        except ValueError as exc:
            return _json(400, {"error": f"not a RateLimitRequest: {exc}"})
        try:
            return _json(200, await admin.explain(decoded))
        except AdminError as exc:
            return _refused(exc)

    return {
        "/counters": ("GET or DELETE (reset) a descriptor's counters (admin token)", counters),
        "/explain": ("POST a RateLimitRequest: the dry run of its decision (admin token)", explain),
    }


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
            return _unauthorized(request, self.token)
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


async def _stats_lines(stats: StatsStore) -> AsyncIterator[bytes]:
    """The /stats page (`<name>: <value>` by name), in chunks of _PAGE_SLICE lines, made as
    the client reads them (`StatsStore.page`)."""
    lines = stats.page()
    while chunk := list(islice(lines, _PAGE_SLICE)):
        yield "".join(f"{n}: {_format_value(v)}\n" for n, v in chunk).encode()
        await asyncio.sleep(0)


def debug_routes(
    service: RateLimitService,
    stats: StatsStore,
    *,
    settings: DebugSettings | None = None,
    extra: Mapping[str, tuple[str, Handler]] | None = None,
    quota: QuotaService | None = None,
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
        return 200, TEXT_PLAIN, _stats_lines(stats)

    endpoints["/debug/pprof/"] = ("root of various pprof endpoints. hit for help.", pprof_index)
    endpoints["/debug/pprof/profile"] = ("CPU profiling endpoint", profiler)
    endpoints["/rlconfig"] = (
        "print out the currently loaded configuration for debugging",
        rlconfig,
    )
    endpoints["/stats"] = ("print out stats", stats_page)
    if profiler.token:  # the admin endpoints exist only with ADMIN_TOKEN set
        endpoints.update(_admin_endpoints(Admin(service), profiler.token, quota))
    if extra:
        endpoints.update(extra)

    index_body = "".join(f"{path}: {endpoints[path][0]}\n" for path in sorted(endpoints)).encode()

    async def index(request: HttpRequest) -> Reply:
        return 200, TEXT_PLAIN, index_body

    routes = {path: handler for path, (_, handler) in endpoints.items()}
    routes["/"] = index
    return routes
