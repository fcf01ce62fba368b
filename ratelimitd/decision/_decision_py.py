"""Plan, count, verdict: the decision model, the pure-Python twin (`_decision.pyx` is the
compiled one; `decision/__init__.py` selects).

A decision is three steps, and the service and `/explain` both take all three:

* **plan** (`plan`, or `begin` + `extend` + `finish` in slices): the request checked, each
  descriptor looked up in the rule set (the walk kept when asked), request overrides,
  `replaces`, unlimited and metered descriptors resolved; pure (it reads the config, never
  the store or the statistics). Each descriptor that counts is an `Item`: its rule, the
  rule's `windows` (compiled at config load), its stats key, hits and `kind`.
* **count** (`collect`, one store round, then `settle`): `collect` turns every item's
  windows into store operations (`Op`s) at one instant, and answers items known over from
  the local over-limit cache; the limiter runs the ops (`increment`, or the read-only
  `peek` for `/explain`); `settle` reads each window's result as (level after, reset).
* **verdict** (in `settle`): one place chooses the deciding window of an item (over the
  limit first, the longest wait among those; else the least remaining), and
  `keys.verdict` is the one status split; `overall_code` the one overall code.

A new kind of count (a refund is one: `REFUND`) is a new `kind`: `plan` sets it on the
item, `window_op` builds its store operation, `reading` reads its result, and the backends
execute it; the verdict is shared. A token budget (`BUDGET`, `budget.calls`) is the one
kind counted whole: one store call for all its windows, whose result gives its status.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backends.base import Op
from ..budget.calls import add_item, arrange, budget_key, budget_op, budget_status
from ..budget.calls import lookup as budget_lookup
from ..budget.calls import overridden as budget_overridden
from ..config._keys_py import cache_key, refuse, state_key, unit_seconds, verdict
from ..config.keys import MAX_HITS, METER_TTL_SECONDS
from ..config.ruleset import Rule
from ..config.windows import FIXED_WINDOW
from ..messages import (
    MAX_UINT32,
    OK,
    OVER_LIMIT,
    Request,
    RequestTooLarge,
    Response,
    ServiceError,
    Status,
)

# What an item's hits do to its windows; a budget item's do what its call says (`budget`).
CONSUME, REFUND, BUDGET = 0, 1, 2

# A request with more descriptors than this is planned in slices of this many, the loop
# running other requests between them: one huge request must not stall all. Such a request
# is never decided synchronously (`Engine.decide_now`).
SLICE = 256

# The status of a descriptor with no limit, and of an unlimited one; shared, never mutated.
NO_LIMIT = Status(OK)
UNLIMITED = Status(OK, None, MAX_UINT32, 0)


class Item:
    """One descriptor of a plan that counts: its rule and windows, stats key, hits, kind."""

    __slots__ = (
        "budget",
        "first",
        "hits",
        "index",
        "key",
        "kind",
        "rule",
        "share",
        "stats",
        "status",
    )

    def __init__(
        self,
        index: int,
        rule: Any,
        key: str,
        share: tuple[str, ...] | None,
        hits: int,
        kind: int = CONSUME,
    ) -> None:
        self.index = index  # the descriptor's position in the request
        self.rule = rule  # config.Rule (its `windows` are counted)
        self.key = key  # the stats key
        self.share = share  # share_threshold patterns replacing values in store keys
        self.hits = hits
        self.kind = kind
        self.stats: Any = None  # stats.RuleStats, resolved by the caller before the count
        self.first = -1  # the item's first op in `collect`'s list (-1: none)
        self.status: Status | None = None  # decided without the store (local cache)
        # A BUDGET item's call: (kind, transaction id, the budget's entries, force,
        # remember), `budget.calls.item_call`.
        self.budget: tuple[int, str, Sequence[tuple[str, str]], bool, bool] | None = None


class Plan:
    """What one request asks: its items, and the descriptors decided without counting."""

    __slots__ = (
        "budget",
        "cached",
        "closes",
        "default_hits",
        "descriptors",
        "domain",
        "found",
        "items",
        "metadata",
        "meters",
        "names",
        "ops",
        "replaced",
        "root",
        "t",
        "unlimited",
        "walks",
    )

    def __init__(self, request: Request, root: Any, walks: list[Any] | None) -> None:
        self.domain = request.domain
        self.descriptors = request.descriptors
        self.default_hits = min(request.hits_addend or 1, MAX_HITS)
        self.root = root  # the domain's trie; None for an unknown domain
        self.found = root is not None
        self.items: list[Item] = []
        self.unlimited: list[int] | None = None  # descriptors with an unlimited rule
        self.meters: list[tuple[int, int]] | None = None  # (descriptor, hits) to meter
        self.metadata: list[dict[str, Any] | None] | None = None  # rule metadata by descriptor
        self.replaced: dict[str, str] | None = None  # replaced name -> the rule replacing it
        # /explain: per descriptor, (the walk (`match.lookup`'s; None for an override), the
        # rule found or None, its stats key); None unless asked.
        self.walks = walks
        self.cached = False  # set by `collect`: an item was answered from the local cache
        # The domain's budget calls: (phase key, transaction key, SHADOW_MODE, QUOTA_MODE);
        # None for a domain without budget rules. Closes are counted after the settles.
        self.budget: tuple[str, str, bool, bool] | None = None
        self.closes: list[Item] | None = None
        # Set by `Engine.prepare`: the instant of the count, its store keys and operations.
        self.t = 0.0
        self.names: list[str] = []
        self.ops: list[Op] = []


def begin(request: Request, ruleset: Any, options: Any, walks: list[Any] | None = None) -> Plan:
    """A plan with no descriptor looked up yet; raises ServiceError for a request the service
    refuses (RequestTooLarge past MAX_DESCRIPTORS_PER_REQUEST / MAX_ENTRIES_PER_DESCRIPTOR)."""
    if not request.domain:
        raise ServiceError("rate limit domain must not be empty")
    descriptors = request.descriptors
    if not descriptors:
        raise ServiceError("rate limit descriptor list must not be empty")
    if ruleset is None:
        raise ServiceError("no rate limit configuration loaded")
    n = len(descriptors)
    if n > options.max_descriptors:
        most = options.max_descriptors
        raise RequestTooLarge(
            f"{n} descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST={most})"
        )
    most = options.max_entries
    for d in descriptors:
        if len(d.entries) > most:
            raise RequestTooLarge(
                f"a descriptor with {len(d.entries)} entries (MAX_ENTRIES_PER_DESCRIPTOR={most})"
            )
    p = Plan(request, ruleset.domains.get(request.domain), walks)
    if ruleset.budgets:
        keys = ruleset.budgets.get(request.domain)
        if keys is not None:
            p.budget = (keys[0], keys[1], options.shadow_mode, options.quota_mode)
    return p


def extend(plan: Plan, lookup: Any, start: int, stop: int) -> None:
    """Look up descriptors `start` to `stop` of the plan's request (`lookup`: the rule set's)."""
    root = plan.root
    if root is None:
        return
    domain = plan.domain
    descriptors = plan.descriptors
    walks = plan.walks
    budget = plan.budget
    for i in range(start, stop):
        d = descriptors[i]
        share = None
        call = None
        found = None
        if d.limit is not None:
            if budget is not None:  # a budget rule takes the request's limit
                recognised = budget_overridden(lookup, root, domain, d.entries, budget, d.limit)
                if recognised is not None:
                    found, call = recognised
                    rule, key, share, _ = found
            if found is None:
                rule = _override(domain, d.entries, d.limit)
                key = rule.full_key
            if walks is not None:
                walks.append((None, rule, key))
        else:
            walked: list[Any] | None = None
            if walks is not None:
                walked = []
            if budget is not None:  # a budget call is matched without its phase and txn
                recognised = budget_lookup(lookup, root, domain, d.entries, budget, walked)
                if recognised is not None:
                    found, call = recognised
            if found is None:
                found = lookup(root, domain, d.entries, walked)
            if walks is not None:
                walks.append((walked, *(found[:2] if found is not None else (None, None))))
            if found is None:
                continue
            rule, key, share, keep_metadata = found
            if keep_metadata and rule.metadata is not None:
                if plan.metadata is None:
                    plan.metadata = [None] * len(descriptors)
                plan.metadata[i] = rule.metadata
        hits = plan.default_hits if d.hits_addend is None else _capped(d.hits_addend)
        if rule.special:  # replaces, unlimited or metering: rare, so tested once
            if rule.meter and not d.is_negative_hits:
                if plan.meters is None:
                    plan.meters = []
                plan.meters.append((i, hits))
            if rule.replaces:
                if plan.replaced is None:
                    plan.replaced = {}
                for name in rule.replaces:
                    plan.replaced.setdefault(name, rule.name or rule.full_key)
            if rule.unlimited:
                if plan.unlimited is None:
                    plan.unlimited = []
                plan.unlimited.append(i)
                continue
            if rule.budget is not None:
                item = Item(i, rule, key, share, hits, BUDGET)
                add_item(plan, item, call, d.entries, d.is_negative_hits, budget)
                continue
        if d.is_negative_hits:
            for window in rule.windows:
                if window.algorithm != FIXED_WINDOW:
                    raise ServiceError(
                        "is_negative_hits: refunds apply to fixed-window limits only; "
                        f"'{rule.full_key}' is counted by another algorithm"
                    )
            plan.items.append(Item(i, rule, key, share, hits, REFUND))
            continue
        plan.items.append(Item(i, rule, key, share, hits))


def finish(plan: Plan) -> Plan:
    """Apply `replaces` once every descriptor is looked up: the limits it names are dropped
    (their metadata too), whatever the descriptor order; a list keeps its other limits.
    The budget items set apart are arranged first (`budget.calls.arrange`): reserves of one
    transaction merged, guards resolved, closes after settles."""
    if plan.closes is not None:  # budget reserves, guards and closes (`budget.calls.arrange`)
        arrange(plan)
    replaced = plan.replaced
    if replaced:
        kept = []
        for item in plan.items:
            rule = item.rule
            if rule.limits is not None:
                rule = rule.without(replaced)
                item.rule = rule
            if rule is None or (rule.name and rule.name in replaced):
                if plan.metadata is not None:
                    plan.metadata[item.index] = None
            else:
                kept.append(item)
        plan.items = kept
    return plan


def plan(request: Request, ruleset: Any, options: Any, walks: list[Any] | None = None) -> Plan:
    """The whole plan of a request at once (see `begin`)."""
    p = begin(request, ruleset, options, walks)
    extend(p, ruleset.lookup, 0, len(request.descriptors))
    return finish(p)


def bind(plan: Plan, stats_for: Any, own: bool) -> None:
    """Give each item the statistics its count goes to: its rule's own (`own`) when the stats
    key is the rule's, else `stats_for(stats key)` (a dynamic key, an override; a dry run's
    throwaway counters). Apart from `plan`, so that planning stays free of side effects."""
    for item in plan.items:
        st = item.rule.stats
        if own and st is not None and item.key == item.rule.full_key:
            item.stats = st
        else:
            item.stats = stats_for(item.key)


def planned(request: Request, ruleset: Any, options: Any, stats: Any) -> Plan:
    """`plan` for the service: refusals counted as service errors, the descriptors of an
    unknown domain in `domain_not_found`, and the items bound to their statistics (`bind`)."""
    try:
        p = plan(request, ruleset, options)
    except ServiceError:
        stats.service.service_error += 1
        raise
    return bound(p, stats)


def bound(p: Plan, stats: Any) -> Plan:
    """The plan's statistics: `domain_not_found`, or each item's counters (`bind`)."""
    if not p.found:
        stats.domain_not_found(p.domain, len(p.descriptors))
    else:
        bind(p, stats.request_rule_stats, True)
    return p


def _override(domain: str, entries: Sequence[tuple[str, str]], limit: tuple[int, int]) -> Rule:
    """A request's own limit (`descriptor.limit`): no shadow, quota, name or metadata."""
    requests_per_unit, unit = limit
    if not unit_seconds(unit):
        raise ServiceError(f"invalid rate limit override unit {unit}")
    key = domain + "." + ".".join(k + "_" + v if v else k for k, v in entries)
    return Rule(key, requests_per_unit, unit)


def _capped(hits: int) -> int:
    # A descriptor's own hits_addend (uint64 on the wire) counts at most MAX_HITS.
    return hits if hits <= MAX_HITS else MAX_HITS


# -- count ----------------------------------------------------------------------------------


def collect(plan: Plan, t: float, prefix: str, local: Any, record: bool = True) -> list[Op]:
    """The store operations of the plan's items at time `t`, in item and window order (each
    item's `first` says where its own start); `total_hits` / `total_negative_hits` counted.

    An item one of whose windows the local over-limit cache knows to be over is answered now
    (`item.status`, its hits in `over_limit_with_local_cache`) and sends nothing; a refund
    drops its keys from that cache (the reference keeps them, its open issue #1230), unless
    `record` is false (a dry run changes nothing). A budget item is one operation for all
    its windows, never answered from the local cache (a settle frees room before the
    window ends).
    """
    return _ops(plan, _collect(plan, t, prefix, local, record), t)


def _ops(plan: Plan, names: list[str], t: float) -> list[Op]:
    """The store operation of each window `_collect` keyed (`names`)."""
    now_ms = int(t * 1000)
    ops = []
    for item in plan.items:
        j = item.first
        if j >= 0:
            if item.kind == BUDGET:
                ops.append(budget_op(item, names[j], now_ms))
                continue
            for k, w in enumerate(item.rule.windows):
                ops.append(window_op(item.kind, w, names[j + k], item.hits, now_ms))
    return ops


def _collect(plan: Plan, t: float, prefix: str, local: Any, record: bool) -> list[str]:
    """`collect`'s store keys (the ops' keys): what the synchronous count needs."""
    now = int(t)
    out: list[str] = []
    plan.cached = False
    for item in plan.items:
        item.first = -1
        h = item.hits
        st = item.stats
        kind = item.kind
        if kind == CONSUME:
            st.total_hits += h
        elif kind == REFUND:
            st.total_negative_hits += h
        else:  # BUDGET: one key, its hits counted by its verdict (a close's are a status)
            item.first = len(out)
            out.append(budget_key(prefix, plan.domain, item.budget[2], item.share))  # type: ignore[index]
            continue
        names = window_keys(plan, item, now, prefix)
        if local is not None:
            if kind == REFUND:
                if record:
                    for name in names:
                        local.discard(name)
            elif _cached(item, names, local, now, record):
                plan.cached = True
                continue
        item.first = len(out)
        out += names
    return out


def window_keys(plan: Plan, item: Item, now: int, prefix: str) -> list[str]:
    """The store key of each window of `item` at `now` (Unix seconds)."""
    domain = plan.domain
    entries = plan.descriptors[item.index].entries
    share = item.share
    names = []
    for w in item.rule.windows:
        if w.algorithm == FIXED_WINDOW:
            names.append(cache_key(prefix, domain, entries, share, w.seconds, now) + w.suffix)
        else:
            names.append(state_key(prefix, domain, entries, share, w.suffix))
    return names


def _cached(item: Item, names: list[str], local: Any, now: int, record: bool) -> bool:
    """Answer `item` from the local cache if it knows one of its windows over (the first);
    without `record`, its hit and miss counts stay as they are."""
    for w, name in zip(item.rule.windows, names, strict=True):
        if local.contains(name, now) if record else local.expiry(name) > now:
            st = item.stats
            st.over_limit_with_local_cache += item.hits
            item.status = refuse(w.limit, st, item.hits, max(1, local.expiry(name) - now))
            return True
    return False


def window_op(kind: int, w: Any, key: str, hits: int, now_ms: int) -> Op:
    """The store operation of `hits` of one `kind` on one window."""
    if kind == REFUND:  # fixed windows only (`extend` refuses the others)
        return Op(key, hits, w.seconds, w.per_second, limit=w.requests, refund=True)
    if w.algorithm == FIXED_WINDOW:
        return Op(key, hits, w.seconds, w.per_second, limit=w.requests)
    tick = w.tick
    return Op(key, hits, w.seconds, w.per_second, w.algorithm, w.requests, tick, now_ms // tick)


def meter_ops(plan: Plan, t: float, prefix: str) -> list[Op]:
    """The plan's metered hits, each in its descriptor's day bucket (`keys.meter_key`)."""
    ops = []
    now = int(t)
    for index, hits in plan.meters or ():
        entries = plan.descriptors[index].entries
        key = cache_key(prefix + "meter_", plan.domain, entries, None, 86400, now)
        ops.append(Op(key, hits, METER_TTL_SECONDS))
    return ops


def reading(w: Any, result: Any, now: int, now_ms: int) -> tuple[int, int, int]:
    """One window's result as (level after, seconds until reset, Unix second it is over
    until): a fixed window's counter after; a sliding window's or token bucket's
    `(level after, ticks until reset)` pair."""
    if w.algorithm == FIXED_WINDOW:
        reset = w.seconds - now % w.seconds
        return result, reset, now + reset
    after, ticks = result
    reset_ms = ticks * w.tick
    return after, -(-reset_ms // 1000), (now_ms + reset_ms) // 1000  # never past the true wait


def count_now(
    plan: Plan, t: float, prefix: str, local: Any, ratio: float, store: Any
) -> list[Status]:
    """The whole count of a plan on a synchronous store (a `SyncBackend`), then the verdict.

    A consumed window is counted by the store's field-wise calls (`increment_one` for a
    fixed window, `decide_now` for the others: no Op built); any other kind of item, and
    the meters, by `increment_now` on their ops (`window_op`, the one place a kind's store
    operation is made).
    """
    names = _collect(plan, t, prefix, local, True)
    results: list[Any] = [None] * len(names)
    now = int(t)
    now_ms = int(t * 1000)
    for item in plan.items:
        j = item.first
        if j < 0:
            continue
        windows = item.rule.windows
        if item.kind == CONSUME:
            for k, w in enumerate(windows):
                if w.algorithm == FIXED_WINDOW:
                    results[j + k] = store.increment_one(names[j + k], item.hits, w.seconds, now)
                else:
                    tick = w.tick
                    results[j + k] = store.decide_now(
                        names[j + k], w.algorithm, item.hits, w.ticks, w.requests, tick,
                        now_ms // tick, now,
                    )  # fmt: skip
            continue
        if item.kind == BUDGET:
            results[j] = store.increment_now([budget_op(item, names[j], now_ms)], now)[0]
            continue
        ops = [
            window_op(item.kind, w, names[j + k], item.hits, now_ms) for k, w in enumerate(windows)
        ]
        results[j : j + len(windows)] = store.increment_now(ops, now)
    if plan.meters:
        store.increment_now(meter_ops(plan, t, prefix), now)
    return _settled(plan, names, results, t, ratio, local)


# -- verdict -------------------------------------------------------------------------------


def settle(
    plan: Plan,
    ops: Sequence[Op],
    results: Sequence[Any],
    t: float,
    ratio: float,
    local: Any,
) -> list[Status]:
    """One Status per descriptor from the results of `collect`'s ops, and the stats split;
    windows found over go to the local cache (`local`; None: nothing recorded)."""
    return _settled(plan, [op.key for op in ops], results, t, ratio, local)


def _settled(
    plan: Plan, names: Sequence[str], results: Sequence[Any], t: float, ratio: float, local: Any
) -> list[Status]:
    now = int(t)
    now_ms = int(t * 1000)
    statuses: list[Status] = [NO_LIMIT] * len(plan.descriptors)
    for item in plan.items:
        j = item.first
        if j < 0:
            statuses[item.index] = item.status  # type: ignore[assignment]
            continue
        windows = item.rule.windows
        if item.kind == REFUND:
            statuses[item.index] = _refunded(windows, results, j, now)
            continue
        if item.kind == BUDGET:
            statuses[item.index] = budget_status(item, results[j], ratio)
            continue
        # The deciding window (the one place it is chosen): over the limit first, the longest
        # wait among those (the first listed on a tie: the one the client must wait for);
        # otherwise the least remaining.
        best = None
        best_after = best_reset = best_left = 0
        best_over = False
        for w in windows:
            after, reset, until = reading(w, results[j], now, now_ms)
            left = w.requests - after
            over = left < 0
            if over and local is not None and until > now:
                local.add(names[j], until)
            j += 1
            if best is None:
                take = True
            elif over:
                take = not best_over or reset > best_reset
            else:
                take = not best_over and left < best_left
            if take:
                best, best_after, best_reset, best_left, best_over = w, after, reset, left, over
        statuses[item.index] = verdict(
            best.limit,  # type: ignore[union-attr]
            item.stats,
            item.hits,
            best_after,
            ratio,
            best_reset,
        )
    return statuses


def _refunded(windows: Sequence[Any], results: Sequence[Any], j: int, now: int) -> Status:
    """A refund's status: OK, with the remaining of its most constrained window
    (`max(0, limit - counter after)`); no over/near/within stats, no local cache."""
    best = windows[0]
    remaining = max(0, best.requests - results[j])
    for w in windows[1:]:
        j += 1
        left = max(0, w.requests - results[j])
        if left < remaining:
            best, remaining = w, left
    return Status(OK, best.limit, remaining, best.seconds - now % best.seconds)


def respond(
    plan: Plan, statuses: list[Status], options: Any, service: Any, record: bool = True
) -> Response:
    """The response of a plan's statuses: unlimited descriptors, the overall code with quota
    and global shadow mode (counted in `service.global_shadow_mode` when `record`)."""
    unlimited = plan.unlimited
    if unlimited is not None:
        for i in unlimited:
            statuses[i] = UNLIMITED
    overall = OK
    for st in statuses:
        if st.code == OVER_LIMIT:  # nothing over is OK whatever the quota settings
            overall = overall_code(statuses, unlimited or (), options.quota_mode)
            break
    if overall == OVER_LIMIT and options.shadow_mode:
        overall = OK
        if record:
            service.global_shadow_mode += 1
    return Response(overall, statuses)


class Engine:
    """A synchronous service's decision in one call (`RateLimitService.decide_now`): plan,
    count (`count_now`) and verdict (`respond`), with the service's statistics. `extras`
    adds what the options ask besides (headers, dynamic metadata): the service's own."""

    __slots__ = (
        "clock",
        "extras",
        "extras_on",
        "local",
        "options",
        "prefix",
        "ratio",
        "ruleset",
        "stats",
        "store",
    )

    def __init__(self, stats: Any, limiter: Any, extras: Any) -> None:
        self.stats = stats
        self.prefix = limiter.prefix
        self.ratio = limiter.near_limit_ratio
        self.local = limiter.local_cache
        self.clock = limiter.clock
        self.store = limiter.backend
        self.extras = extras
        self.ruleset: Any = None
        self.options: Any = None
        self.extras_on = False

    def use(self, ruleset: Any, options: Any) -> None:
        """The config and reload options in force."""
        self.ruleset = ruleset
        self.options = options
        self.extras_on = bool(
            options.response_headers
            or options.all_descriptors_headers
            or options.request_headers
            or options.response_dynamic_metadata
        )

    def _answered(self, request: Request) -> Response | None:
        """The response to a request for a domain the config does not know (counted in
        `domain_not_found` per descriptor, as the reference does) without a plan; None for
        any other request, or one `begin` would refuse (it refuses it). The compiled
        engine's answer is one shared object per number of descriptors."""
        options = self.options
        ruleset = self.ruleset
        n = len(request.descriptors)
        domain = request.domain
        if (
            ruleset is None
            or options.response_dynamic_metadata
            or not 0 < n <= min(SLICE, options.max_descriptors)
            or not domain
            or domain in ruleset.domains
            or domain in ruleset.budgets
            or any(len(d.entries) > options.max_entries for d in request.descriptors)
        ):
            return None
        self.stats.domain_not_found(domain, n)
        return Response(OK, [NO_LIMIT] * n)

    def _unmatched(self, p: Plan) -> bool:
        """Whether nothing of plan `p` is counted, refused or answered specially: each
        descriptor gets NO_LIMIT (and no statistic, as in the reference)."""
        return (
            not p.items
            and p.unlimited is None
            and p.meters is None
            and p.budget is None
            and not self.options.response_dynamic_metadata
        )

    def decide_now(self, request: Request) -> Response | None:
        """Decide `request` (None past SLICE descriptors: it is planned in slices)."""
        if len(request.descriptors) > SLICE:
            return None
        response = self._answered(request)
        if response is not None:
            return response
        options = self.options
        p = planned(request, self.ruleset, options, self.stats)
        if self._unmatched(p):
            return Response(OK, [NO_LIMIT] * len(p.descriptors))
        statuses = count_now(p, self.clock(), self.prefix, self.local, self.ratio, self.store)
        response = respond(p, statuses, options, self.stats.service)
        if self.extras_on:
            self.extras(request, p, response, options)
        return response

    def prepare(self, request: Request) -> Plan | Response:
        """The first half of an awaited decision: the plan of `request` (at most SLICE
        descriptors), its statistics bound, and its count's store operations (`plan.ops`,
        meters last) at `plan.t`; or the response, when nothing is to be counted."""
        response = self._answered(request)
        if response is not None:
            return response
        p = planned(request, self.ruleset, self.options, self.stats)
        if self._unmatched(p):
            return Response(OK, [NO_LIMIT] * len(p.descriptors))
        p.t = t = self.clock()
        p.names = _collect(p, t, self.prefix, self.local, True)
        p.ops = _ops(p, p.names, t) + meter_ops(p, t, self.prefix)
        return p

    def finish(self, request: Request, p: Plan, results: Sequence[Any]) -> Response:
        """The second half: the verdict on the results of `plan.ops`, and the response."""
        statuses = _settled(p, p.names, results, p.t, self.ratio, self.local)
        response = respond(p, statuses, self.options, self.stats.service)
        if self.extras_on:
            self.extras(request, p, response, self.options)
        return response


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


# What the compiled module provides too (`_twins.select` checks a build against it).
__all__ = [
    "BUDGET",
    "CONSUME",
    "NO_LIMIT",
    "REFUND",
    "SLICE",
    "UNLIMITED",
    "Engine",
    "Item",
    "Plan",
    "begin",
    "bind",
    "bound",
    "collect",
    "count_now",
    "extend",
    "finish",
    "meter_ops",
    "overall_code",
    "plan",
    "planned",
    "reading",
    "respond",
    "settle",
    "window_keys",
    "window_op",
]
