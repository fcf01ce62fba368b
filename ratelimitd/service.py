"""ShouldRateLimit: request -> response, knowing nothing about transports; of backends, only
that one may fail (`BackendError`, counted as `redis_error`).

The reference's service layer (`src/service/ratelimit.go`): request checks, limit lookup with
overrides, `replaces` and unlimited handling, the limiter round, overall code with quota and
global shadow mode, response headers and dynamic metadata. The RuleSet and the reload-time
options are swapped together as one `Snapshot`, so a request never mixes two configs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import keys
from .backends.base import FIXED_WINDOW, BackendError
from .config import Rule, RuleSet
from .config.ruleset import UNIT_NAMES
from .limiter import NO_LIMIT, Check, Limiter, Meter
from .messages import MAX_UINT32, OK, OVER_LIMIT, Descriptor, Request, Response, Status
from .settings import ReloadOptions
from .stats import StatsStore

MAX_HITS = keys.MAX_HITS


# A request with more descriptors than this is matched in slices of this many, the loop
# running other requests between them (`may_suspend`): one huge request must not stall all.
SLICE = 256
UNKNOWN, RESOURCE_EXHAUSTED = 2, 8  # gRPC status codes


class ServiceError(Exception):
    """A request the service refuses (gRPC UNKNOWN, `/json` 400), as the reference."""

    code = UNKNOWN


class RequestTooLarge(ServiceError):
    """More descriptors or entries than MAX_DESCRIPTORS_PER_REQUEST / MAX_ENTRIES_PER_DESCRIPTOR
    allow (gRPC RESOURCE_EXHAUSTED, `/json` 400), refused before any work."""

    code = RESOURCE_EXHAUSTED


class Overloaded(ServiceError):
    """MAX_INFLIGHT_DECISIONS decisions already wait on the store (gRPC RESOURCE_EXHAUSTED,
    `/json` 503): refused at once rather than queued without bound."""

    code = RESOURCE_EXHAUSTED


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one request runs against."""

    ruleset: RuleSet | None
    options: ReloadOptions


class RateLimitService:
    """Decides RateLimitRequests."""

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
        self.limiter = limiter
        self.stats = stats
        self.clock = clock
        # BACKEND_FAILURE_POLICY: error (raise, as the reference), allow, deny, or local
        # (decide with `fallback`, a limiter over this process's memory store).
        if failure_policy == "local" and fallback is None:
            raise ValueError("failure policy 'local' needs a fallback limiter")
        self.failure_policy = failure_policy
        self.fallback = fallback
        self.max_in_flight = max_in_flight  # MAX_INFLIGHT_DECISIONS; 0: no bound
        self.in_flight = 0  # decisions waiting on the store now
        self.snapshot = Snapshot(None, options or ReloadOptions())
        # The window arithmetic of the `keys` implementation `impl` names (None: selected).
        k = keys.implementation(impl)
        self._unit_seconds: Callable[[int], int] = k.unit_seconds
        self._reset_seconds: Callable[[int, int], int] = k.reset_seconds

    def set_ruleset(self, ruleset: RuleSet, options: ReloadOptions | None = None) -> None:
        """Swap in a newly loaded config (and the options re-read with it) atomically."""
        self.snapshot = Snapshot(ruleset, options or self.snapshot.options)
        self.stats.set_limits(ruleset.limits())

    @property
    def ruleset(self) -> RuleSet | None:
        """The config in force."""
        return self.snapshot.ruleset

    def _refuse(self, message: str) -> ServiceError:
        self.stats.service.service_error += 1
        return ServiceError(message)

    def _too_large(self, message: str) -> RequestTooLarge:
        self.stats.service.service_error += 1
        return RequestTooLarge(message)

    @staticmethod
    def may_suspend(request: Request) -> bool:
        """Whether deciding `request` may wait even on a synchronous limiter (it is matched
        in slices): such a request needs a task, not `RlsHandler.decide_now`."""
        return len(request.descriptors) > SLICE

    async def should_rate_limit(self, request: Request) -> Response:
        """Decide one request. Raises ServiceError, or BackendError from the backend."""
        domain = request.domain
        if not domain:
            raise self._refuse("rate limit domain must not be empty")
        descriptors = request.descriptors
        if not descriptors:
            raise self._refuse("rate limit descriptor list must not be empty")
        snap = self.snapshot
        if snap.ruleset is None:
            raise self._refuse("no rate limit configuration loaded")
        opts = snap.options
        n = len(descriptors)
        if n > opts.max_descriptors:
            limit = opts.max_descriptors
            raise self._too_large(
                f"{n} descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST={limit})"
            )
        most = opts.max_entries
        for d in descriptors:
            if len(d.entries) > most:
                raise self._too_large(
                    f"a descriptor with {len(d.entries)} entries"
                    f" (MAX_ENTRIES_PER_DESCRIPTOR={most})"
                )

        default_hits = min(request.hits_addend or 1, MAX_HITS)
        checks: list[Check] = []
        unlimited: list[int] | None = None
        meters: list[Meter] | None = None
        metadata: list[dict[str, Any] | None] | None = None
        ruleset = snap.ruleset
        root = ruleset.domains.get(domain)
        if root is None:
            for _ in range(n):
                self.stats.domain_not_found(domain)
        else:
            replaced: set[str] | None = None
            lookup = ruleset.lookup  # the matcher of the implementation that compiled it
            for i in range(n):
                if i and i % SLICE == 0:
                    await asyncio.sleep(0)  # only past SLICE: `may_suspend` said so
                d = descriptors[i]
                share = None
                if d.limit is not None:
                    rule = self._override(domain, d)
                    stats = rule.stats
                else:
                    found = lookup(root, domain, d.entries)
                    if found is None:
                        continue
                    rule, key, share, keep_metadata = found
                    stats = (
                        rule.stats if key == rule.full_key else self.stats.request_rule_stats(key)
                    )
                    if keep_metadata and rule.metadata is not None:
                        if metadata is None:
                            metadata = [None] * n
                        metadata[i] = rule.metadata
                if rule.special:  # replaces, unlimited or metering: rare, so tested once
                    if rule.meter and not d.is_negative_hits:
                        if meters is None:
                            meters = []
                        meters.append(
                            Meter(
                                i, default_hits if d.hits_addend is None else _capped(d.hits_addend)
                            )
                        )
                    if rule.replaces:
                        if replaced is None:
                            replaced = set()
                        replaced.update(rule.replaces)
                    if rule.unlimited:
                        if unlimited is None:
                            unlimited = []
                        unlimited.append(i)
                        continue
                hits = default_hits if d.hits_addend is None else _capped(d.hits_addend)
                if d.is_negative_hits:
                    if _decided_by_store(rule):
                        raise self._refuse(
                            f"is_negative_hits: refunds apply to fixed-window limits only; "
                            f"'{rule.full_key}' is counted by another algorithm"
                        )
                    checks.append(Check(i, rule, stats, share, hits, True))
                    continue
                checks.append(Check(i, rule, stats, share, hits))
            if replaced:
                # Replaced limits are dropped whatever the descriptor order, metadata too.
                kept = []
                for check in checks:
                    rule = check.rule
                    if rule.limits is not None:  # several limits: the named ones are dropped
                        rule = rule.without(replaced)
                        check.rule = rule
                    if rule is None or (rule.name and rule.name in replaced):
                        if metadata is not None:
                            metadata[check.index] = None
                    else:
                        kept.append(check)
                checks = kept

        limiter = self.limiter
        if limiter.synchronous:
            statuses = limiter.do_limit_now(domain, descriptors, checks, meters or ())
        else:
            if self.max_in_flight and self.in_flight >= self.max_in_flight:
                self.stats.service.overloaded += 1
                raise Overloaded(
                    f"{self.in_flight} decisions wait on the store "
                    f"(MAX_INFLIGHT_DECISIONS={self.max_in_flight})"
                )
            self.in_flight += 1
            try:
                statuses = await limiter.do_limit(domain, descriptors, checks, meters or ())
            except BackendError:
                self.stats.service.redis_error += 1
                if self.failure_policy == "error":
                    raise
                statuses = self._on_failure(domain, descriptors, checks, meters or ())
            finally:
                self.in_flight -= 1
        if unlimited is not None:
            for i in unlimited:
                statuses[i] = Status(OK, None, MAX_UINT32, 0)

        overall = OK
        for st in statuses:
            if st.code == OVER_LIMIT:  # nothing over is OK whatever the quota settings
                overall = overall_code(statuses, unlimited or (), opts.quota_mode)
                break
        if overall == OVER_LIMIT and opts.shadow_mode:
            overall = OK
            self.stats.service.global_shadow_mode += 1

        response = Response(overall, statuses)
        if opts.response_headers:
            if opts.headers_format == "ietf":
                response.headers = _ietf_headers(
                    statuses, overall, int(self.clock()), self._reset_seconds
                )
            else:
                names = (opts.limit_header, opts.remaining_header, opts.reset_header)
                response.headers = _limit_headers(
                    statuses, names, opts.quota_mode, int(self.clock()), self._reset_seconds
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
                statuses, names, opts.quota_mode, int(self.clock()), self._reset_seconds
            )
        if opts.response_dynamic_metadata:
            response.dynamic_metadata = _dynamic_metadata(
                request,
                statuses,
                unlimited or [],
                metadata or [None] * n,
                opts.dynamic_metadata_limit_name,
            )
        return response

    def _on_failure(
        self,
        domain: str,
        descriptors: Sequence[Descriptor],
        checks: list[Check],
        meters: Sequence[Meter],
    ) -> list[Status]:
        """The statuses BACKEND_FAILURE_POLICY gives when the store failed (or its breaker
        is open): `allow` OK without a limit, `deny` OVER_LIMIT of each limit until its
        window ends, `local` what this process's memory store decides with the same rules
        (its counters are per instance, and are not merged into the store when it is back).
        """
        self.stats.service.failure_policy += 1
        policy = self.failure_policy
        statuses: list[Status] = [NO_LIMIT] * len(descriptors)
        if policy == "allow":
            return statuses
        if policy == "deny":
            now = int(self.clock())
            for check in checks:
                rule = check.rule
                reset = self._reset_seconds(now, rule.unit_seconds)
                statuses[check.index] = Status(OVER_LIMIT, rule, 0, reset)
            return statuses
        # local: the failed round already counted total_hits (and refunds): undo that, the
        # fallback counts them again.
        for check in checks:
            if check.refund:
                check.stats.total_negative_hits -= check.hits
            else:
                check.stats.total_hits -= check.hits
        fallback = self.fallback
        assert fallback is not None and fallback.synchronous  # the constructor said so
        return fallback.do_limit_now(domain, descriptors, checks, meters)

    def _override(self, domain: str, d: Descriptor) -> Rule:
        """A request's own limit (`descriptor.limit`): no shadow, quota, name or metadata."""
        requests_per_unit, unit = d.limit  # type: ignore[misc]
        if not self._unit_seconds(unit):
            raise self._refuse(f"invalid rate limit override unit {unit}")
        key = domain + "." + ".".join(k + "_" + v if v else k for k, v in d.entries)
        return Rule(key, requests_per_unit, unit, stats=self.stats.request_rule_stats(key))


def _capped(hits: int) -> int:
    # A descriptor's own hits_addend (uint64 on the wire) counts at most MAX_HITS.
    return hits if hits <= MAX_HITS else MAX_HITS


def _decided_by_store(rule: Rule) -> bool:
    """Is any limit of `rule` a sliding window or token bucket (no refunds for those)?"""
    return any(limit.algorithm != FIXED_WINDOW for limit in rule.limits or (rule,))


def overall_code(statuses: list[Status], unlimited: Sequence[int], global_quota: bool) -> int:
    """OVER_LIMIT iff a regular descriptor is over, or every quota descriptor is.

    A descriptor is a quota one with QUOTA_MODE or its rule's quota_mode (with QUOTA_MODE
    even one without a limit); unlimited descriptors take no part.
    """
    regular_over = False
    quota_count = quota_over = 0
    for i, st in enumerate(statuses):
        if st.rule is None and i in unlimited:
            continue
        over = st.code == OVER_LIMIT
        if global_quota or (st.rule is not None and st.rule.quota_mode):
            quota_count += 1
            quota_over += over
        elif over:
            regular_over = True
    return OVER_LIMIT if regular_over or (quota_count and quota_over == quota_count) else OK


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
