"""The in-process statistics store: every counter and gauge by its full emitted name.

Names are the reference's. Per-rule counters live on a `RuleStats` object
resolved once per rule when a RuleSet is built (or once per distinct dynamic stats key),
so the hot path increments attributes and never formats a stat name. Sinks (statsd,
Prometheus, the debug `/stats` page) read `snapshot()`.

Threads: a reload builds its RuleSet, and so creates its rules' `RuleStats`, in a worker
thread while the event loop may be taking a snapshot. The table of rule stats is therefore
only grown under a lock, and `snapshot()` copies it under the same lock before formatting.
A lock rather than copy-on-write: the loop also creates stats (dynamic keys, request
overrides), and copying a table of 100 000 rules for each new key would put that copy on the
request path; the lookup of an existing key (every request) takes no lock.

Series named by request content (limit overrides, `detailed_metric` values, unknown domains)
are bounded: past `max_request_series` a new one is folded into the `_overflow` series and
counted in `ratelimit.service.stats_series_folded` (100,000 override descriptors once made
/stats 127 MB). They are bounded in bytes too: a stats key made from request content longer
than `max_request_key_bytes` (UTF-8) is cut to its first `max_request_key_bytes` - 17 bytes
(on a character boundary) followed by `_` and 16 hex digits of its BLAKE2b-64 digest, so
distinct long keys stay distinct series and every sink (statsd, DogStatsD, Prometheus,
/stats) sees the same bounded name; a shorter key is named exactly as the reference names
it (11 requests of 1,000 overrides with 4,000-byte values once made /stats 244 MB). The
config's own rules are never folded or cut. `snapshot_sliced()` formats in
slices with the loop free between them: a store of 100,000 rules is 600,000 series.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import random
import re
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

RULE_STATS = (
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "over_limit_with_local_cache",
    "shadow_mode",
)

# A token budget's series (docs/budgets.md), per stats key of a
# budget rule: the tokens reserved now (a gauge: what this process reserved less what it saw
# end, so the sum over processes is the store's), the tokens charged to usage by settles,
# closes and expiry, and how reservations ended.
BUDGET_STATS = (
    "budget_reserved",
    "budget_charged",
    "budget_settled",
    "budget_released",
    "budget_expired",
    "budget_orphaned",
    "budget_duplicate",
)
BUDGET_GAUGE = "budget_reserved"

# The series every folded request-made series is counted in.
OVERFLOW_KEY = "_overflow"
# Rules formatted between two yields of `snapshot_sliced` (6 series each).
_SNAPSHOT_SLICE = 5_000

_IPV4 = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}")
_RESERVED = str.maketrans({":": "_", "|": "_"})


# The suffix that replaces the end of a request-made stats key past its byte bound.
_DIGEST_BYTES = 8
_CUT_SUFFIX = 1 + 2 * _DIGEST_BYTES


def bounded_key(key: str, max_bytes: int) -> str:
    """`key` itself when its UTF-8 form has at most `max_bytes` bytes; otherwise its first
    `max_bytes` - 17 bytes (whole characters only) + `_` + 16 hex digits of its digest."""
    if len(key) * 4 <= max_bytes:  # no character is longer than 4 bytes in UTF-8
        return key
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return key
    digest = hashlib.blake2b(raw, digest_size=_DIGEST_BYTES).hexdigest()
    head = raw[: max_bytes - _CUT_SUFFIX].decode("utf-8", "ignore")
    return f"{head}_{digest}"


def rule_series(stats: RuleStats) -> tuple[str, ...]:
    """The counters of a stats key shown now (the names of its series after the key)."""
    names: tuple[str, ...] = RULE_STATS
    if stats.total_negative_hits:
        # Only once a refund happened: the reference's statsd sink sends a counter when it
        # changes, so its Prometheus exporter has no such series before.
        names += ("total_negative_hits",)
    if stats.budget:
        names += BUDGET_STATS
        if stats.budget_full:
            names += ("budget_full",)
    return names


def _by_key(stats: RuleStats) -> str:
    return stats.key


def sanitize_stat_name(name: str) -> str:
    """The reference's SanitizeStatName: `:`/`|` -> `_`, and dots inside IPv4 addresses."""
    return _IPV4.sub(lambda m: m.group(0).replace(".", "_"), name.translate(_RESERVED))


# The STATS_RATE_LIMIT_GAUGES gauges end so: they describe the config, not traffic.
CONFIG_GAUGE_SUFFIX = ".rate_limit"


@dataclass(slots=True, eq=False)
class RuleStats:
    """The counters of one stats key (`ratelimit.service.rate_limit.<key>.*`): the six of
    RULE_STATS, `total_negative_hits` (refunds, upstream #1140), shown once non-zero, and a
    budget rule's BUDGET_STATS (shown once `budget` is set)."""

    key: str
    total_hits: int = 0
    over_limit: int = 0
    near_limit: int = 0
    within_limit: int = 0
    over_limit_with_local_cache: int = 0
    shadow_mode: int = 0
    total_negative_hits: int = 0
    budget: bool = False
    budget_reserved: int = 0
    budget_charged: int = 0
    budget_settled: int = 0
    budget_released: int = 0
    budget_expired: int = 0
    budget_orphaned: int = 0
    budget_duplicate: int = 0
    # Reserves refused because the budget (or the process) held its most transactions
    # (BUDGET_MAX_TRANSACTIONS, MEMORY_MAX_BUDGET_TRANSACTIONS); shown once non-zero.
    budget_full: int = 0


@dataclass(slots=True, eq=False)
class ServiceStats:
    """Service- and server-level counters (`ratelimit.service.*`, `ratelimit_server.*`)."""

    config_load_success: int = 0
    config_load_error: int = 0
    global_shadow_mode: int = 0
    redis_error: int = 0
    service_error: int = 0
    # Extensions: requests answered by BACKEND_FAILURE_POLICY (allow, deny,
    # local) instead of UNKNOWN, and refused past MAX_INFLIGHT_DECISIONS.
    failure_policy: int = 0
    overloaded: int = 0
    # Token budgets' stream-end calls sent again once the store took them, and dropped
    # from a full retry buffer.
    budget_retried: int = 0
    budget_retry_dropped: int = 0
    total_requests: int = 0
    response_time_count: int = 0
    response_time_sum_ms: float = 0.0


class StatsStore:
    """Every statistic of one process."""

    def __init__(
        self,
        max_request_series: int = 10_000,
        rate_limit_gauges: bool = False,
        max_request_key_bytes: int = 256,
    ) -> None:
        self.service = ServiceStats()
        self.rate_limit_gauges = rate_limit_gauges
        # `<stats key>.rate_limit` -> the configured limit, replaced whole at each config
        # load (only with STATS_RATE_LIMIT_GAUGES): a removed rule's gauge goes with it.
        self._limits: dict[str, int] = {}
        self._gauge_names: frozenset[str] = frozenset()
        self.max_request_series = max_request_series
        self.max_request_key_bytes = max_request_key_bytes
        self._request_series = 0  # made by `request_rule_stats` and `domain_not_found`
        self.folded = 0  # ratelimit.service.stats_series_folded
        # Grown under _lock only (see the module docstring); read without it by key.
        self._rules: dict[str, RuleStats] = {}
        self._lock = threading.Lock()
        # Grown by requests only, so only on the loop, where snapshots are taken too.
        self._domain_not_found: dict[str, int] = {}
        self._gauges: dict[str, Callable[[], float]] = {}
        # The budget rules' reserved gauges met by a snapshot so far.
        self._budget_gauges: set[str] = set()
        # Created by the sinks when they are built, before anything is served.
        self._timers: dict[str, Timer] = {}
        # Series a component keeps itself (the quota service's buckets and streams), read
        # at snapshot time: counters and gauges by full name.
        self._sources: list[Callable[[], tuple[dict[str, float], dict[str, float]]]] = []
        self._source_gauges: frozenset[str] = frozenset()
        # Counts a compiled path keeps in C between reads, moved into this store by each
        # of these before anything is read.
        self._flushes: list[Callable[[], None]] = []

    def rule_stats(self, key: str) -> RuleStats:
        """The counters of a stats key (config path or dynamic key), created on first use."""
        stats = self._rules.get(key)
        if stats is None:
            with self._lock:  # another thread may be creating it, or snapshotting
                stats = self._rules.get(key)
                if stats is None:
                    stats = self._rules[key] = RuleStats(sanitize_stat_name(key))
        return stats

    def request_rule_stats(self, key: str) -> RuleStats:
        """`rule_stats` for a key made from request content: past `max_request_series` such
        keys, a new one is counted in the overflow series instead; a long key is cut to
        `max_request_key_bytes` (`bounded_key`)."""
        stats = self._rules.get(key)
        if stats is not None:
            return stats
        key = bounded_key(key, self.max_request_key_bytes)
        stats = self._rules.get(key)
        if stats is not None:
            return stats
        if self._request_series >= self.max_request_series:
            self.folded += 1
            return self.rule_stats(OVERFLOW_KEY)
        self._request_series += 1
        return self.rule_stats(key)

    def domain_not_found(self, domain: str, n: int = 1) -> bool:
        """Count `n` descriptors of a request for an unknown domain (bounded as above);
        whether they went to the domain's own series (neither cut nor folded)."""
        table = self._domain_not_found
        key = bounded_key(domain, self.max_request_key_bytes)
        if key not in table:
            if self._request_series >= self.max_request_series:
                self.folded += 1
                key = OVERFLOW_KEY
            else:
                self._request_series += 1
        table[key] = table.get(key, 0) + n
        return key is domain

    def add_gauge(self, name: str, read: Callable[[], float]) -> None:
        """Register a gauge read at snapshot time (local cache, connection pools, ...)."""
        self._gauges[name] = read
        self._gauge_names = self._gauge_set()

    def add_flush(self, flush: Callable[[], None]) -> None:
        """Register `flush()`, called before every read: it adds what its component
        counted in C since the last read (the decision's `domain_not_found`)."""
        self._flushes.append(flush)

    def add_source(self, read: Callable[[], tuple[dict[str, float], dict[str, float]]]) -> None:
        """Register series a component keeps itself: `read()` -> (counters, gauges)."""
        self._sources.append(read)

    def set_limits(self, limits: Iterable[tuple[str, int]]) -> None:
        """The configured limit of each stats key, from the config now in force."""
        if not self.rate_limit_gauges:
            return
        prefix = "ratelimit.service.rate_limit."
        suffix = CONFIG_GAUGE_SUFFIX
        self._limits = {f"{prefix}{sanitize_stat_name(k)}{suffix}": n for k, n in limits}
        self._gauge_names = self._gauge_set()

    def _gauge_set(self) -> frozenset[str]:
        return frozenset(self._gauges) | frozenset(self._limits) | self._budget_gauges

    def snapshot(self) -> dict[str, float]:
        """Every counter and gauge by full name (counters are totals since start)."""
        out: dict[str, float] = {}
        rules = self._rule_list()
        self._rule_series(rules, out)
        self._other_series(out)
        return out

    async def snapshot_sliced(self) -> dict[str, float]:
        """`snapshot()`, yielding to the loop between slices of rules."""
        out: dict[str, float] = {}
        rules = self._rule_list()
        for i in range(0, len(rules), _SNAPSHOT_SLICE):
            self._rule_series(rules[i : i + _SNAPSHOT_SLICE], out)
            await asyncio.sleep(0)
        self._other_series(out)
        return out

    def _rule_list(self) -> list[RuleStats]:
        with self._lock:  # a reload may be adding rules from its thread
            return list(self._rules.values())

    def _rule_series(self, rules: list[RuleStats], out: dict[str, float]) -> None:
        prefix = "ratelimit.service.rate_limit."
        for stats in rules:
            base = prefix + stats.key + "."
            for name in rule_series(stats):
                out[base + name] = getattr(stats, name)
            if stats.budget:
                gauge = base + BUDGET_GAUGE
                if gauge not in self._budget_gauges:
                    self._budget_gauges.add(gauge)
                    self._gauge_names = self._gauge_names | {gauge}

    def page(self) -> Iterator[tuple[str, float]]:
        """Every series as `snapshot()` names it, by name (the `/stats` page), each value read
        as it is reached: what a reader holds is the list of the rules, not their names.
        The rules come by stats key, each one's series by name (a key that another key
        extends with a `.` puts its series after the longer key's)."""
        rules = sorted(self._rule_list(), key=_by_key)
        other: dict[str, float] = {}
        self._other_series(other)
        prefix = "ratelimit.service.rate_limit."

        def of_rules() -> Iterator[tuple[str, float]]:
            for stats in rules:
                base = prefix + stats.key + "."
                for name in sorted(rule_series(stats)):
                    yield base + name, getattr(stats, name)

        return heapq.merge(of_rules(), sorted(other.items()))

    def _other_series(self, out: dict[str, float]) -> None:
        for flush in self._flushes:
            flush()
        prefix = "ratelimit.service.rate_limit."
        for domain, count in self._domain_not_found.items():
            out[prefix + sanitize_stat_name(domain) + ".domain_not_found"] = count
        s = self.service
        out["ratelimit.service.config_load_success"] = s.config_load_success
        out["ratelimit.service.config_load_error"] = s.config_load_error
        out["ratelimit.service.global_shadow_mode"] = s.global_shadow_mode
        out["ratelimit.service.call.should_rate_limit.redis_error"] = s.redis_error
        out["ratelimit.service.call.should_rate_limit.service_error"] = s.service_error
        out["ratelimit_server.ShouldRateLimit.total_requests"] = s.total_requests
        call = "ratelimit.service.call.should_rate_limit."
        if s.failure_policy:  # extensions' counters: absent until they count
            out[call + "failure_policy"] = s.failure_policy
        if s.overloaded:
            out[call + "overloaded"] = s.overloaded
        if s.budget_retried or s.budget_retry_dropped:
            out["ratelimit.service.budget.retried"] = s.budget_retried
            out["ratelimit.service.budget.retry_dropped"] = s.budget_retry_dropped
        if self.folded:  # an extension's counter: absent until something is folded
            out["ratelimit.service.stats_series_folded"] = self.folded
        out.update(self._limits)
        for name, read in self._gauges.items():
            out[name] = read()
        if self._sources:
            gauges: set[str] = set()
            for source in self._sources:
                counters, values = source()
                out.update(counters)
                out.update(values)
                gauges.update(values)
            self._source_gauges = frozenset(gauges)

    def gauge_names(self) -> frozenset[str]:
        """The names in `snapshot()` that are gauges; every other name is a counter (the
        sources' gauges as of the last snapshot)."""
        if self._source_gauges:
            return self._gauge_names | self._source_gauges
        return self._gauge_names

    def timer(self, name: str) -> Timer:
        """The timer of that full name (milliseconds), created on first use."""
        timer = self._timers.get(name)
        if timer is None:
            timer = self._timers[name] = Timer(name)
        return timer

    def timers(self) -> list[Timer]:
        """Every timer created so far."""
        return list(self._timers.values())


class Timer:
    """Observations of one timer in milliseconds, for the sinks.

    Keeps exact totals and histogram bucket counts (the bounds are set by the Prometheus
    sink), plus a uniform sample of at most `capacity` values since the last `drain()`
    (reservoir sampling) for the statsd sinks, which send one line per value as gostats
    does; the sample rate tells the statsd server how many calls each line stands for.
    A capacity of 0 keeps no sample (the Prometheus sink needs only the buckets).
    """

    __slots__ = (
        "_bisect",
        "_random",
        "bounds",
        "buckets",
        "capacity",
        "count",
        "name",
        "sample",
        "seen",
        "sum",
    )

    def __init__(self, name: str, capacity: int = 2000) -> None:
        self._bisect = bisect_left
        self.name = name
        self.capacity = capacity
        self.count = 0
        self.sum = 0.0
        self.bounds: tuple[float, ...] = ()
        self.buckets = [0]
        self.sample: list[float] = []
        self.seen = 0
        self._random = random.random

    def set_bounds(self, bounds: tuple[float, ...]) -> None:
        """Histogram upper bounds (ms, ascending); bucket counts restart from zero."""
        self.bounds = tuple(bounds)
        self.buckets = [0] * (len(self.bounds) + 1)

    def observe(self, ms: float) -> None:
        """Record one value."""
        self.count += 1
        self.sum += ms
        self.buckets[self._bisect(self.bounds, ms)] += 1
        self.seen = seen = self.seen + 1
        if seen <= self.capacity:
            self.sample.append(ms)
        elif self.capacity:
            slot = int(self._random() * seen)
            if slot < self.capacity:
                self.sample[slot] = ms

    def drain(self) -> tuple[list[float], int]:
        """The sampled values and the number of observations since the last drain."""
        sample, seen = self.sample, self.seen
        self.sample, self.seen = [], 0
        return sample, seen
