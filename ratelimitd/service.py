"""ShouldRateLimit: request -> response. It knows no transport (its errors are
`messages`' transport-neutral ones) and, of backends, only that one may fail
(`BackendError`, counted as `redis_error`).

The reference's service layer (`src/service/ratelimit.go`) as plan, count, verdict
(`decision`): the plan (request checks, limit lookup with overrides, `replaces`, unlimited),
the limiter's count, then the response: overall code with quota and global shadow mode,
response headers and dynamic metadata. `dry_run` takes the same three steps with the store
only read: `/explain` cannot disagree with the service. The RuleSet and the reload-time
options are swapped together as one `Snapshot`, so a request never mixes two configs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from . import decision
from .backends.base import BackendError, Op, PipelinedBackend, Waiter
from .budget.retry import StreamEnds
from .config import RuleSet, keys
from .config.ruleset import UNIT_NAMES
from .decision import NO_LIMIT, SLICE, Plan
from .limiter import Limiter
from .messages import (
    FAULT,
    INVALID,
    MAX_UINT32,
    OVER_LIMIT,
    OVERLOADED,
    STORE_FAILED,
    TOO_LARGE,
    Overloaded,
    Refusal,
    Request,
    RequestTooLarge,
    Response,
    ServiceError,
    Status,
    TooLarge,
)
from .settings import ReloadOptions
from .stats import RuleStats, StatsStore

__all__ = [
    "SLICE",
    "Overloaded",
    "RateLimitService",
    "RequestTooLarge",
    "ServiceError",
    "Snapshot",
    "settled",
]

log = logging.getLogger("ratelimitd.service")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one request runs against."""

    ruleset: RuleSet | None
    options: ReloadOptions


@dataclass(slots=True)
class DryRun:
    """`RateLimitService.dry_run`: the plan, its store operations and their results, and the
    response the request would get."""

    plan: Plan
    t: float  # the limiter's clock when it counted
    ops: list[Op]
    results: list[Any]
    response: Response


# What `RateLimitService.decide` gives: the answer now, the Plan whose round a waiter
# awaits, or an awaitable of the answer (`DryRun` for a dry run).
Decided: TypeAlias = "Response | Refusal | Plan | Awaitable[Response | Refusal | DryRun]"


async def settled(out: Decided) -> Any:
    """`decide`'s answer, awaited when it is not ready yet (never a Plan: no waiter)."""
    if out.__class__ is Response or out.__class__ is Refusal:
        return out
    return await out  # type: ignore[misc]


class RateLimitService:
    """Decides RateLimitRequests: plan, count, verdict (see `decision`).

    `decide` is the one way in, and `answer` the one place where a failure (a refused
    request, a store that failed, an unexpected error) becomes an answer: a Response (the
    failure policy's) or a `Refusal`, which each transport turns into its own status through
    `transport.grpcstatus.REFUSED`.
    """

    def __init__(
        self,
        limiter: Limiter,
        stats: StatsStore,
        options: ReloadOptions | None = None,
        clock: Callable[[], float] = time.time,
        *,
        impl: str | None = None,
        failure_policy: str = "error",
        fallback: Limiter | None = None,
        max_in_flight: int = 0,
    ) -> None:
        self.stats = stats
        self.clock = clock
        # BACKEND_FAILURE_POLICY: error (refused, as the reference), allow, deny, or local
        # (decide with `fallback`, a limiter over this process's memory store).
        if failure_policy == "local" and fallback is None:
            raise ValueError("failure policy 'local' needs a fallback limiter")
        self.failure_policy = failure_policy
        self.fallback = fallback
        self.max_in_flight = max_in_flight  # MAX_INFLIGHT_DECISIONS; 0: no bound
        # Token budgets' stream-end calls (settle, close) a failed store round could not
        # take: sent again until it takes them (never charged twice).
        self.stream_ends = StreamEnds(limiter.backend, limiter.near_limit_ratio, stats.service)
        self.decision = decision
        self.snapshot = Snapshot(None, options or ReloadOptions())
        self.limiter = limiter  # the decision's fast paths are chosen for it (`limiter`)
        # The window arithmetic of the `keys` implementation `impl` names (None: selected).
        self._reset_seconds: Callable[[int, int], int] = keys.implementation(impl).reset_seconds

    @property
    def limiter(self) -> Limiter:
        """What counts the plans; set, it chooses the decision's paths for itself."""
        return self._limiter

    @limiter.setter
    def limiter(self, limiter: Limiter) -> None:
        self._limiter = limiter
        # Plan, count and verdict in compiled calls: the whole decision for a limiter that
        # never waits (`decide_now` is its method), its halves around the store's round for
        # one that does (`prepare`, `finish`); swapped configs reach it with the snapshot.
        engine = self.decision.Engine(self.stats, limiter, self._extras)
        previous = getattr(self, "_engine", None)
        if previous is not None:  # the decisions still waiting on the store
            engine.in_flight = previous.in_flight
        self._engine = engine
        snap = self.snapshot
        self._engine.use(snap.ruleset, snap.options)
        # An awaited decision takes the halves unless the limiter's own round is needed
        # (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT checks before it counts).
        self._halves = not limiter.synchronous and not limiter.stop_increment
        # The whole decision in one compiled call, for a limiter that never waits (None:
        # one that does).
        self._decide_now = self._engine.decide_now if limiter.synchronous else None
        # (domain, n) -> the response to a request for an unknown domain, or None: for a
        # transport that reads the domain of a request before decoding it (`_rls`).
        self.unknown_domain = self._engine.unknown_domain
        # The engine's responses with nothing counted, by number of descriptors (None: not
        # made yet): one that answered a request of a domain the config knows answers that
        # request again while the config is the same (no rule matched it).
        self.nothing = self._engine.nothing
        # A waiter may be given to `decide`: the store starts a round without a coroutine
        # (Redis), and the request's round is the plan's one (not STOP_CACHE_KEY_INCREMENT_
        # WHEN_OVERLIMIT's two).
        backend = limiter.backend
        self.sends = self._halves and isinstance(backend, PipelinedBackend)
        if self.sends:
            # The send half and `received` are the engine's, in C (`Engine.send`): the
            # store's round started by its `increment_later`, failures `answer`ed here.
            engine.start = backend.increment_later  # type: ignore[attr-defined]
            engine.later = self._start_later
            engine.answer = self.answer
            engine.enter = self._enter
            engine.most = self.max_in_flight
        # The answer to a plan `decide` started with a waiter, from its round's results
        # (the store's list, or the exception the round raised: `answer`ed): the engine's
        # `received`, looked up per call by the transports, as the engine changes with the
        # limiter.
        self.received: Callable[[Request, Plan, Any], Response | Refusal] = engine.received

    @property
    def in_flight(self) -> int:
        """Decisions waiting on the store now (the engine counts those it started)."""
        return self._engine.in_flight  # type: ignore[no-any-return]

    @property
    def synchronous(self) -> bool:
        """Whether `decide` answers at once (the limiter never waits for I/O), but for a
        request of more than SLICE descriptors."""
        return self.limiter.synchronous

    def set_ruleset(self, ruleset: RuleSet, options: ReloadOptions | None = None) -> None:
        """Swap in a newly loaded config (and the options re-read with it) atomically."""
        self.snapshot = snap = Snapshot(ruleset, options or self.snapshot.options)
        self._engine.use(snap.ruleset, snap.options)
        self.stats.set_limits(ruleset.limits())

    @property
    def ruleset(self) -> RuleSet | None:
        """The config in force."""
        return self.snapshot.ruleset

    async def close(self) -> None:
        """Shutdown, before the backend closes: the budget calls still waiting for the
        store get one last round."""
        await self.stream_ends.close()

    # -- the one way in -----------------------------------------------------------------

    def decide(
        self,
        request: Request,
        waiter: Waiter | None = None,
        *,
        dry_run: bool = False,
        walks: list[Any] | None = None,
    ) -> Decided:
        """Decide `request`: the one way in, for every transport.

        Sync-first, so the hot paths take no coroutine: the Response (or the `Refusal`)
        when it is decided at once, as a limiter that never waits decides it, or when
        nothing is to be counted; otherwise an awaitable of it (`settled` awaits either).

        With a `waiter`, a service that `sends` starts the store's round without a
        coroutine and returns the request's Plan: `waiter(results)` is called once the
        round is over (its `task` is set when the store could not start the round without
        one), and `received(request, plan, results)` then gives the answer, or `dropped()`
        forgets a waiter no longer wanted.

        `dry_run`: an awaitable of what the request would get now, by the same plan,
        count and verdict (a `DryRun`), with the store only read and nothing counted (no
        statistic moves, nothing enters the local cache); `walks` receives each
        descriptor's walk. Never raises: failures are `answer`ed.
        """
        if waiter is not None and self.sends and not dry_run:
            if len(request.descriptors) <= SLICE:
                # The round started without a coroutine, in C (`Engine.send`): every
                # Redis-backed call's path.
                return self._engine.send(request, waiter)  # type: ignore[no-any-return]
            return self._awaited(request)
        if dry_run:
            return self._dry_run(request, walks)
        decide_now = self._decide_now
        if decide_now is not None:
            try:
                response = decide_now(request)
            except Exception as exc:
                return self.answer(exc, request)
            if response is not None:
                return response  # type: ignore[no-any-return]
        return self._awaited(request)

    def answer(
        self,
        error: Exception,
        request: Request | None = None,
        plan: Plan | None = None,
        *,
        record: bool = True,
    ) -> Response | Refusal:
        """The one place where a failure becomes an answer: the store failed (BackendError,
        counted as `redis_error`, answered as BACKEND_FAILURE_POLICY says when the request
        was planned and `record`), the request was refused (ServiceError, RequestTooLarge,
        a decoder's TooLarge, Overloaded), or something unexpected failed (logged: the
        reference would crash here; a server answers and stays up)."""
        if isinstance(error, BackendError):
            if not record:
                return Refusal(STORE_FAILED, error)
            self.stats.service.redis_error += 1
            if plan is None:
                return Refusal(STORE_FAILED, error)
            # A budget's settles and closes are kept to be sent again: their answer does
            # not matter (Envoy discards it), their usage does; its reserves are decided
            # by the policy.
            if plan.budget is not None:
                self.stream_ends.keep(plan)
            if self.failure_policy == "error" or request is None:
                return Refusal(STORE_FAILED, error)
            statuses = self._on_failure(plan)
            return self._respond(request, plan, statuses, self.snapshot.options)
        if isinstance(error, Overloaded):
            return Refusal(OVERLOADED, error)
        if isinstance(error, TooLarge):  # refused by a decoder: counted as the service counts it
            self.stats.service.service_error += 1
            return Refusal(TOO_LARGE, error)
        if isinstance(error, RequestTooLarge):
            return Refusal(TOO_LARGE, error)
        if isinstance(error, ServiceError):
            return Refusal(INVALID, error)
        log.error("ShouldRateLimit failed unexpectedly", exc_info=error)
        return Refusal(FAULT, error)

    async def should_rate_limit(self, request: Request) -> Response:
        """`decide`'s awaited branch, for a caller in this process that wants the failure
        as an exception: ServiceError (Overloaded, RequestTooLarge), or BackendError
        (policy `error`). The same plan, count and verdict in Python calls that read the
        limiter's clock and store as they are now (a test may swap them)."""
        out = await self._awaited(request)
        if out.__class__ is Refusal:
            raise out.error  # type: ignore[union-attr]
        return out  # type: ignore[return-value]

    # -- the awaited path ---------------------------------------------------------------

    async def _awaited(self, request: Request) -> Response | Refusal:
        """`decide` for a request that waits: on the store, or planned in slices."""
        plan: Plan | None = None
        try:
            if self._halves and len(request.descriptors) <= SLICE:
                engine = self._engine
                plan = engine.prepare(request)
                if plan.__class__ is Response:  # nothing to count
                    return plan  # type: ignore[return-value]
                if not plan.ops:  # type: ignore[union-attr]
                    return engine.finish(request, plan, ())  # type: ignore[no-any-return]
                self._enter()
                try:
                    results = await self.limiter.backend.increment(plan.ops)  # type: ignore[union-attr]
                finally:
                    self._engine.in_flight -= 1
                return engine.finish(request, plan, results)  # type: ignore[no-any-return]
            snap = self.snapshot
            if len(request.descriptors) > SLICE:
                sliced = await self._planned_in_slices(request, snap)
                if isinstance(sliced, Refusal):
                    return sliced
                plan = sliced
            else:
                plan = self._planned(request, snap)
            if self.limiter.synchronous:
                statuses = self.limiter.count_now(plan)
            else:
                self._enter()
                try:
                    statuses = await self.limiter.count(plan)
                finally:
                    self._engine.in_flight -= 1
            return self._respond(request, plan, statuses, snap.options)
        except Exception as exc:
            return self.answer(exc, request, plan)

    def _enter(self) -> None:
        """One more decision waits on the store, within MAX_INFLIGHT_DECISIONS."""
        engine = self._engine
        if self.max_in_flight and engine.in_flight >= self.max_in_flight:
            self.stats.service.overloaded += 1
            raise Overloaded(
                f"{engine.in_flight} decisions wait on the store "
                f"(MAX_INFLIGHT_DECISIONS={self.max_in_flight})"
            )
        engine.in_flight += 1

    # -- the callback path (`sends`) ------------------------------------------------------

    def dropped(self) -> None:
        """A round `decide` started with a waiter is over, and its waiter no longer wants
        the answer (its client left): the decision is forgotten."""
        self._engine.in_flight -= 1

    def _start_later(self, ops: list[Op], waiter: Waiter) -> None:
        """The round of a plan `decide` started with a waiter, in a task: the store could
        not start it without a coroutine (`increment_later` said False)."""
        waiter.task = asyncio.get_running_loop().create_task(self._later(ops, waiter))  # type: ignore[attr-defined]

    async def _later(self, ops: list[Op], waiter: Waiter) -> None:
        """The round of a plan `decide` started with a waiter, awaited (a store that cannot
        start it without a coroutine); cancelled with its waiter's task."""
        try:
            results: Any = await self.limiter.backend.increment(ops)
        except asyncio.CancelledError:
            waiter.cancelled = True
            waiter(None)
            raise
        except Exception as exc:
            results = exc
        waiter(results)

    # -- the dry run --------------------------------------------------------------------

    async def _dry_run(self, request: Request, walks: list[Any] | None) -> DryRun | Refusal:
        """`decide(request, dry_run=True)` (see there)."""
        snap = self.snapshot
        d = self.decision
        try:
            plan = d.plan(request, snap.ruleset, snap.options, walks)
            d.bind(plan, RuleStats, False)
            t = self.limiter.clock()
            ops, results, statuses = await self.limiter.peek(plan, t)
        except Exception as exc:
            refusal = self.answer(exc, record=False)
            assert refusal.__class__ is Refusal  # nothing planned: no policy answers
            return refusal  # type: ignore[return-value]
        response = self._respond(request, plan, statuses, snap.options, record=False)
        return DryRun(plan, t, ops, results, response)

    # -- plan ---------------------------------------------------------------------------

    def _planned(self, request: Request, snap: Snapshot) -> Plan:
        """The request's plan with its stats bound; refusals counted as service errors."""
        return self.decision.planned(request, snap.ruleset, snap.options, self.stats)  # type: ignore[no-any-return]

    async def _planned_in_slices(self, request: Request, snap: Snapshot) -> Plan | Refusal:
        """`_planned` with the loop running other requests every SLICE descriptors; the
        refusal of a request it refuses."""
        d = self.decision
        try:
            plan = d.begin(request, snap.ruleset, snap.options)
            lookup = snap.ruleset.lookup  # type: ignore[union-attr]  # `begin` checked it
            n = len(request.descriptors)
            for start in range(0, n, SLICE):
                if start:
                    await asyncio.sleep(0)
                d.extend(plan, lookup, start, min(n, start + SLICE))
            d.finish(plan)
        except ServiceError as exc:  # counted here as `planned` counts it
            self.stats.service.service_error += 1
            return self.answer(exc)  # type: ignore[return-value]
        return d.bound(plan, self.stats)  # type: ignore[no-any-return]

    def _on_failure(self, plan: Plan) -> list[Status]:
        """The statuses BACKEND_FAILURE_POLICY gives when the store failed (or its breaker
        is open): `allow` OK without a limit, `deny` OVER_LIMIT of each limit until its
        window ends, `local` what this process's memory store decides with the same rules
        (its counters are per instance, and are not merged into the store when it is back).
        """
        self.stats.service.failure_policy += 1
        policy = self.failure_policy
        statuses: list[Status] = [NO_LIMIT] * len(plan.descriptors)
        if policy == "allow":
            return statuses
        if policy == "deny":
            now = int(self.clock())
            for item in plan.items:
                rule = item.rule
                reset = self._reset_seconds(now, rule.unit_seconds)
                statuses[item.index] = Status(OVER_LIMIT, rule, 0, reset)
            return statuses
        # local: the failed round already counted total_hits (and refunds): undo that, the
        # fallback counts them again (a budget's hits are counted by its verdict only).
        for item in plan.items:
            if item.kind == decision.REFUND:
                item.stats.total_negative_hits -= item.hits
            elif item.kind == decision.CONSUME:
                item.stats.total_hits -= item.hits
        fallback = self.fallback
        assert fallback is not None and fallback.synchronous  # the constructor said so
        return fallback.count_now(plan)

    # -- verdict ------------------------------------------------------------------------

    def _respond(
        self,
        request: Request,
        plan: Plan,
        statuses: list[Status],
        opts: ReloadOptions,
        *,
        record: bool = True,
    ) -> Response:
        """The response (`decision.respond`: unlimited descriptors, the overall code with
        quota and global shadow mode, counted when `record`), then headers and dynamic
        metadata as the options ask."""
        response: Response = self.decision.respond(plan, statuses, opts, self.stats.service, record)
        if (
            opts.response_headers
            or opts.all_descriptors_headers
            or opts.request_headers
            or opts.response_dynamic_metadata
        ):
            self._extras(request, plan, response, opts)
        return response

    def _extras(
        self, request: Request, plan: Plan, response: Response, opts: ReloadOptions
    ) -> None:
        """What the options add to a response: headers, dynamic metadata."""
        if opts.response_headers or opts.all_descriptors_headers or opts.request_headers:
            self._headers(response, opts)
        if opts.response_dynamic_metadata:
            response.dynamic_metadata = _dynamic_metadata(
                request,
                response.statuses,
                plan.unlimited or [],
                plan.metadata or [None] * len(response.statuses),
                opts.dynamic_metadata_limit_name,
            )

    def _headers(self, response: Response, opts: ReloadOptions) -> None:
        statuses = response.statuses
        now = int(self.clock())
        if opts.response_headers:
            if opts.headers_format == "ietf":
                response.headers = _ietf_headers(
                    statuses, response.overall_code, now, self._reset_seconds
                )
            else:
                names = (opts.limit_header, opts.remaining_header, opts.reset_header)
                response.headers = _limit_headers(
                    statuses, names, opts.quota_mode, now, self._reset_seconds
                )
        if opts.all_descriptors_headers:
            response.headers = [*response.headers, *_per_descriptor_headers(statuses)]
        if opts.request_headers:  # LIMIT_REQUEST_HEADERS_ENABLED: for the upstream request
            names = (
                opts.request_limit_header,
                opts.request_remaining_header,
                opts.request_reset_header,
            )
            response.request_headers = _limit_headers(
                statuses, names, opts.quota_mode, now, self._reset_seconds
            )


def _limit_headers(
    statuses: list[Status],
    names: tuple[str, str, str],
    quota_mode: bool,
    now: int,
    reset_seconds: Callable[[int, int], int],
) -> list[tuple[str, str]]:
    """The limit, remaining and reset headers (`names`) from the reference's "minimum"
    descriptor; the same for the response (LIMIT_*) and the upstream request (LIMIT_REQUEST_*).

    The limited status with the least remaining, except that any non-quota OVER_LIMIT
    status overrides it (the last one wins).
    """
    chosen: Status | None = None
    least = MAX_UINT32
    for st in statuses:
        if st.rule is not None and st.limit_remaining < least:
            chosen = st
            least = st.limit_remaining
    for st in statuses:
        if st.code == OVER_LIMIT and not (quota_mode or st.rule.quota_mode):
            chosen = st
    if chosen is None or chosen.rule is None:
        return []
    rule = chosen.rule
    reset = _reset(chosen, now, reset_seconds)
    limit, remaining, reset_name = names
    return [
        (limit, str(rule.requests_per_unit)),
        (remaining, str(chosen.limit_remaining)),
        (reset_name, str(reset)),
    ]


def _reset(st: Status, now: int, reset_seconds: Callable[[int, int], int]) -> int:
    """Seconds until `st`'s window resets: the reference's (a fresh clock, the unit), or the
    extension's own for its limits."""
    rule = st.rule
    return st.duration_until_reset if rule.extended else reset_seconds(now, rule.unit_seconds)


def _sf_string(text: str) -> str:
    """`text` as an RFC 9651 String: printable ASCII, `\\` and `"` escaped."""
    printable = "".join(c if " " <= c <= "~" else "_" for c in text)
    return '"' + printable.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ietf_headers(
    statuses: list[Status], overall: int, now: int, reset_seconds: Callable[[int, int], int]
) -> list[tuple[str, str]]:
    """LIMIT_RESPONSE_HEADERS_FORMAT=ietf: draft-ietf-httpapi-ratelimit-headers-11's fields
    for every descriptor with a limit, named after its rule (`name`, else its stats key):
    `RateLimit-Policy: "n";q=<limit>;w=<window s>` and `RateLimit: "n";r=<remaining>;t=<reset s>`,
    plus `Retry-After` (the latest reset of the descriptors over the limit) when refused."""
    policies: list[str] = []
    current: list[str] = []
    retry = 0
    for st in statuses:
        rule = st.rule
        if rule is None:
            continue
        name = _sf_string(rule.name or rule.full_key)
        reset = _reset(st, now, reset_seconds)
        policies.append(f"{name};q={rule.requests_per_unit};w={rule.unit_seconds}")
        current.append(f"{name};r={st.limit_remaining};t={reset}")
        if st.code == OVER_LIMIT:
            retry = max(retry, reset)
    if not policies:
        return []
    headers = [("RateLimit-Policy", ", ".join(policies)), ("RateLimit", ", ".join(current))]
    if overall == OVER_LIMIT:
        headers.append(("Retry-After", str(retry)))
    return headers


def _per_descriptor_headers(statuses: list[Status]) -> list[tuple[str, str]]:
    """LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED (the reference's open PR #1190): for every
    descriptor with a limit, in request order, `ratelimit-limit-<unit>s` and
    `ratelimit-remaining-<unit>s` (e.g. `ratelimit-limit-seconds: 10`)."""
    headers = []
    for st in statuses:
        rule = st.rule
        if rule is None:
            continue
        unit = UNIT_NAMES.get(rule.unit, "unknown").lower()
        headers.append((f"ratelimit-limit-{unit}s", str(rule.requests_per_unit)))
        headers.append((f"ratelimit-remaining-{unit}s", str(st.limit_remaining)))
    return headers


def _dynamic_metadata(
    request: Request,
    statuses: list[Status],
    unlimited: list[int],
    metadata: list[dict[str, Any] | None],
    limit_names: bool = False,
) -> dict[str, Any]:
    """RESPONSE_DYNAMIC_METADATA: the request echoed, plus merged rule metadata.

    Metadata of every passed descriptor (not OVER_LIMIT, not unlimited; shadowed ones
    pass) is merged in descriptor order, the first value of a key winning.

    With `limit_names` (RESPONSE_DYNAMIC_METADATA_LIMIT_NAME, after upstream PR #1239) each
    descriptor also gets its `code` and, when a limit applied, `limitName`: the deciding
    limit's `name`, or its stats key when it has none; and the whole response gets the
    `limitName` of the first descriptor over its limit, the one that made it OVER_LIMIT.
    """
    descriptors = []
    over_name = None
    for i, d in enumerate(request.descriptors):
        entry: dict[str, Any] = {"entries": [f"{k}={v}" for k, v in d.entries]}
        if limit_names:
            st = statuses[i]
            entry["code"] = "OVER_LIMIT" if st.code == OVER_LIMIT else "OK"
            if st.rule is not None:
                entry["limitName"] = st.rule.name or st.rule.full_key
                if st.code == OVER_LIMIT and over_name is None:
                    over_name = entry["limitName"]
        if d.limit is not None:
            rpu, unit = d.limit
            entry["limit"] = f"requests_per_unit:{rpu} unit:{UNIT_NAMES.get(unit, unit)}"
        if d.hits_addend is not None:
            entry["hitsAddend"] = d.hits_addend
        descriptors.append(entry)
    out: dict[str, Any] = {"domain": request.domain, "descriptors": descriptors}
    if request.hits_addend:
        out["hitsAddend"] = request.hits_addend
    if over_name is not None:
        out["limitName"] = over_name
    merged: dict[str, Any] = {}
    for i, st in enumerate(statuses):
        meta = metadata[i]
        if meta and st.code != OVER_LIMIT and i not in unlimited:
            _merge_first_wins(merged, meta)
    if merged:
        out["metadata"] = merged
    return out


def _merge_first_wins(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if key not in into:
            into[key] = value
        elif isinstance(into[key], dict) and isinstance(value, dict):
            merged = dict(into[key])
            _merge_first_wins(merged, value)
            into[key] = merged
