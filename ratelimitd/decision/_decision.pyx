# cython: language_level=3
"""Plan, count, verdict: the decision model, compiled.

Same public names and results as `_decision_py.py` (the oracle, and the model's notes);
`decision/__init__.py` selects one. The key and window maths are `_keys`'s, called in C. A rule's
windows are `config.windows.Window` tuples, read here by position.
"""

from posix.time cimport CLOCK_REALTIME

from ratelimitd.config._match cimport lookup_c
from ratelimitd.config._keys cimport Bump, cache_key, refuse, state_key, unit_seconds, verdict
from ratelimitd._slots cimport clock_now, get, offset_of, offsets, put

import time

from ratelimitd.backends.base import Op
from ratelimitd.config import _match
from ratelimitd.budget.calls import add_item, arrange, budget_key, budget_op, budget_status
from ratelimitd.budget.calls import lookup as budget_lookup
from ratelimitd.budget.calls import overridden as budget_overridden
from ratelimitd.config.ruleset import Rule, RuleSet
from ratelimitd.config.windows import FIXED_WINDOW as _FIXED_WINDOW
from ratelimitd.config.keys import MAX_HITS as _MAX_HITS, METER_TTL_SECONDS as _METER_TTL
from ratelimitd.messages import (
    MAX_UINT32,
    OK as _OK,
    OVER_LIMIT as _OVER_LIMIT,
    Descriptor,
    Request,
    RequestTooLarge,
    Response,
    ServiceError,
    Status,
)
from ratelimitd.stats.store import RuleStats

CONSUME = 0
REFUND = 1
BUDGET = 2
SLICE = 256
NO_LIMIT = Status(_OK)
UNLIMITED = Status(_OK, None, MAX_UINT32, 0)

# Window tuple positions (config.windows.Window).
DEF W_LIMIT = 0
DEF W_ALGORITHM = 1
DEF W_SECONDS = 2
DEF W_REQUESTS = 3
DEF W_SUFFIX = 4
DEF W_TICK = 5
DEF W_TICKS = 6
DEF W_PER_SECOND = 7

# The slots read on every decision (see _slots.pxd).
cdef object REQUEST = Request
cdef object DESCRIPTOR = Descriptor
cdef object RULE = Rule
cdef object LOOKUP = _match.lookup
cdef object RULESET = RuleSet
cdef Py_ssize_t O_TRIES = offset_of(RuleSet, "_tries")
cdef Py_ssize_t O_BUDGETS = offset_of(RuleSet, "budgets")
cdef object STATS = RuleStats
cdef object STATUS = Status
cdef Py_ssize_t T_CODE = offset_of(Status, "code")
cdef Py_ssize_t S_TOTAL_HITS = offset_of(RuleStats, "total_hits")
cdef Py_ssize_t Q_DOMAIN, Q_DESCRIPTORS, Q_HITS
cdef Py_ssize_t D_ENTRIES, D_LIMIT, D_HITS, D_NEGATIVE
cdef Py_ssize_t R_SPECIAL, R_WINDOWS, R_METADATA, R_STATS, R_FULL_KEY, R_KEY_MEMO
Q_DOMAIN, Q_DESCRIPTORS, Q_HITS = offsets(Request, ("domain", "descriptors", "hits_addend"))
D_ENTRIES, D_LIMIT, D_HITS, D_NEGATIVE = offsets(
    Descriptor, ("entries", "limit", "hits_addend", "is_negative_hits")
)
R_SPECIAL, R_WINDOWS, R_METADATA, R_STATS, R_FULL_KEY, R_KEY_MEMO = offsets(
    Rule, ("special", "windows", "metadata", "stats", "full_key", "key_memo")
)


cdef inline object _entries(d):
    return get(d, DESCRIPTOR, D_ENTRIES, "entries")


cdef long long MAX_HITS = _MAX_HITS
cdef long long METER_TTL = _METER_TTL
cdef int OK = _OK
cdef long long FIXED_WINDOW = _FIXED_WINDOW
cdef int OVER_LIMIT = _OVER_LIMIT


cdef class Item:
    """One descriptor of a plan that counts (see `_decision_py.Item`)."""

    cdef public Py_ssize_t index
    cdef public object rule
    cdef public str key
    cdef public object share
    cdef public long long hits
    cdef public int kind
    cdef public object stats
    cdef public Py_ssize_t first
    cdef public object status
    cdef public object budget  # a BUDGET item's call (see `_decision_py.Item`)
    cdef readonly tuple windows  # the rule's (read once)

    def __init__(self, Py_ssize_t index, rule, str key, share, long long hits, int kind=0):
        _item(self, index, rule, key, share, hits, kind)


cdef Item _item(Item self, Py_ssize_t index, rule, str key, share, long long hits, int kind):
        self.index = index
        self.rule = rule
        self.windows = get(rule, RULE, R_WINDOWS, "windows")
        self.key = key
        self.share = share
        self.hits = hits
        self.kind = kind
        self.stats = None
        self.first = -1
        self.status = None
        self.budget = None
        return self


cdef class Plan:
    """What one request asks (see `_decision_py.Plan`)."""

    cdef public str domain
    cdef public list descriptors
    cdef public long long default_hits
    cdef public object root
    cdef public bint found
    cdef public list items
    cdef public list unlimited
    cdef public list meters
    cdef public list metadata
    cdef public dict replaced
    cdef public list walks
    cdef public bint cached
    # The domain's budget calls (see `_decision_py.Plan`), and the closes counted last.
    cdef public object budget
    cdef public list closes
    # Set by `Engine.prepare`: the instant of the count, its store keys and operations.
    cdef public double t
    cdef public list names
    cdef public list ops

    def __init__(self, request, root, list walks):
        _init(self, request.domain, request.descriptors, request.hits_addend, root, walks)


cdef Plan _init(Plan self, str domain, list descriptors, object hits_addend, root, list walks):
        cdef long long hits = hits_addend or 1
        self.domain = domain
        self.descriptors = descriptors
        self.default_hits = hits if hits <= MAX_HITS else MAX_HITS
        self.root = root
        self.found = root is not None
        self.items = []
        self.unlimited = None
        self.meters = None
        self.metadata = None
        self.replaced = None
        self.walks = walks
        self.cached = False
        self.budget = None
        self.closes = None
        return self


def begin(request, ruleset, options, list walks=None):
    """A plan with no descriptor looked up yet (see `_decision_py.begin`)."""
    return _begin(
        request, ruleset, options.max_descriptors, options.max_entries, walks,
        options.shadow_mode, options.quota_mode,
    )


cdef Plan _begin(
    request, ruleset, Py_ssize_t max_descriptors, Py_ssize_t most, list walks, bint shadow,
    bint quota,
):
    cdef Plan p
    cdef list descriptors
    cdef Py_ssize_t n
    cdef str domain = get(request, REQUEST, Q_DOMAIN, "domain")
    if not domain:
        raise ServiceError("rate limit domain must not be empty")
    descriptors = get(request, REQUEST, Q_DESCRIPTORS, "descriptors")
    if not descriptors:
        raise ServiceError("rate limit descriptor list must not be empty")
    if ruleset is None:
        raise ServiceError("no rate limit configuration loaded")
    n = len(descriptors)
    if n > max_descriptors:
        raise RequestTooLarge(
            f"{n} descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST={max_descriptors})"
        )
    for d in descriptors:
        n = len(_entries(d))
        if n > most:
            raise RequestTooLarge(
                f"a descriptor with {n} entries (MAX_ENTRIES_PER_DESCRIPTOR={most})"
            )
    if type(ruleset) is RULESET:  # the dict behind its read-only `domains`, in C
        root = (<dict>get(ruleset, RULESET, O_TRIES, "_tries")).get(domain)
        budgets = get(ruleset, RULESET, O_BUDGETS, "budgets")
    else:
        domains = ruleset.domains
        root = domains[domain] if domain in domains else None
        budgets = ruleset.budgets
    p = _init(
        Plan.__new__(Plan),
        domain,
        descriptors,
        get(request, REQUEST, Q_HITS, "hits_addend"),
        root,
        walks,
    )
    if budgets:
        keys = budgets.get(domain)
        if keys is not None:
            p.budget = (keys[0], keys[1], shadow, quota)
    return p


def extend(Plan plan, lookup, Py_ssize_t start, Py_ssize_t stop):
    """Look up descriptors `start` to `stop` (see `_decision_py.extend`)."""
    _extend(plan, lookup, start, stop)


cdef int _extend(Plan plan, lookup, Py_ssize_t start, Py_ssize_t stop) except -1:
    cdef object root = plan.root
    cdef str domain = plan.domain
    cdef list descriptors = plan.descriptors
    cdef list walks = plan.walks
    cdef object budget = plan.budget
    cdef list walked
    cdef Py_ssize_t i
    cdef long long hits
    cdef object d, rule, share, found, raw, call, recognised
    cdef Item item
    cdef str key
    if root is None:
        return 0
    for i in range(start, stop):
        d = descriptors[i]
        share = None
        call = None
        limit = get(d, DESCRIPTOR, D_LIMIT, "limit")
        found = None
        if limit is not None:
            if budget is not None:  # a budget rule takes the request's limit
                recognised = budget_overridden(lookup, root, domain, _entries(d), budget, limit)
                if recognised is not None:
                    found, call = recognised
                    rule, key, share, _ = found
            if found is None:
                rule = _override(domain, _entries(d), limit)
                key = rule.full_key
            if walks is not None:
                walks.append((None, rule, key))
        else:
            walked = [] if walks is not None else None
            if budget is not None:  # a budget call is matched without its phase and txn
                recognised = budget_lookup(lookup, root, domain, _entries(d), budget, walked)
                if recognised is not None:
                    found, call = recognised
            if found is None:
                if lookup is LOOKUP:  # the compiled trie's: called in C
                    found = lookup_c(root, domain, _entries(d), walked)
                else:
                    found = lookup(root, domain, _entries(d), walked)
            if walks is not None:
                if found is None:
                    walks.append((walked, None, None))
                else:
                    walks.append((walked, found[0], found[1]))
            if found is None:
                continue
            rule, key, share, keep_metadata = found
            metadata = get(rule, RULE, R_METADATA, "metadata")
            if keep_metadata and metadata is not None:
                if plan.metadata is None:
                    plan.metadata = [None] * len(descriptors)
                plan.metadata[i] = metadata
        negative = get(d, DESCRIPTOR, D_NEGATIVE, "is_negative_hits")
        raw = get(d, DESCRIPTOR, D_HITS, "hits_addend")
        if raw is None:
            hits = plan.default_hits
        else:
            hits = raw if raw <= MAX_HITS else MAX_HITS
        if get(rule, RULE, R_SPECIAL, "special"):
            if rule.meter and not negative:
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
                item = _item(Item.__new__(Item), i, rule, key, share, hits, BUDGET)
                add_item(plan, item, call, _entries(d), negative, budget)
                continue
        if negative:
            for window in rule.windows:
                if <long long>(<tuple>window)[W_ALGORITHM] != FIXED_WINDOW:
                    raise ServiceError(
                        "is_negative_hits: refunds apply to fixed-window limits only; "
                        f"'{rule.full_key}' is counted by another algorithm"
                    )
            plan.items.append(_item(Item.__new__(Item), i, rule, key, share, hits, REFUND))
            continue
        plan.items.append(_item(Item.__new__(Item), i, rule, key, share, hits, CONSUME))
    return 0


def finish(Plan plan):
    """Apply `replaces` (see `_decision_py.finish`)."""
    return _finish(plan)


cdef Plan _finish(Plan plan):
    cdef dict replaced = plan.replaced
    cdef list kept
    cdef Item item
    if plan.closes is not None:  # budget reserves, guards and closes (`budget.calls.arrange`)
        arrange(plan)
    if replaced:
        kept = []
        for item in plan.items:
            rule = item.rule
            if rule.limits is not None:
                rule = rule.without(replaced)
                item.rule = rule
                if rule is not None:
                    item.windows = rule.windows
            if rule is None or (rule.name and rule.name in replaced):
                if plan.metadata is not None:
                    plan.metadata[item.index] = None
            else:
                kept.append(item)
        plan.items = kept
    return plan


def plan(request, ruleset, options, list walks=None):
    """The whole plan of a request at once (see `_decision_py.plan`)."""
    cdef Plan p = _begin(
        request, ruleset, options.max_descriptors, options.max_entries, walks,
        options.shadow_mode, options.quota_mode,
    )
    _extend(p, ruleset.lookup, 0, len(p.descriptors))
    return _finish(p)


def planned(request, ruleset, options, stats):
    """`plan` for the service, its statistics counted and bound (see
    `_decision_py.planned`)."""
    return _counted(
        request, ruleset, None, options.max_descriptors, options.max_entries,
        options.shadow_mode, options.quota_mode, stats, stats.service,
    )


cdef inline Plan _counted(
    request, ruleset, lookup, Py_ssize_t max_descriptors, Py_ssize_t most, bint shadow,
    bint quota, stats, service,
):
    """The whole plan, a refusal counted as a service error, the statistics bound: what
    `planned` and the engine share. `lookup` None: the ruleset's, read once `_begin` has
    refused a request with no config."""
    cdef Plan p
    try:
        p = _begin(request, ruleset, max_descriptors, most, None, shadow, quota)
        _extend(p, ruleset.lookup if lookup is None else lookup, 0, len(p.descriptors))
        _finish(p)
    except ServiceError:
        service.service_error += 1
        raise
    return _bound(p, stats)


def bound(Plan p, stats):
    """The plan's statistics (see `_decision_py.bound`)."""
    return _bound(p, stats)


cdef Plan _bound(Plan p, stats):
    cdef Py_ssize_t i
    if not p.found:
        stats.domain_not_found(p.domain, len(p.descriptors))
    else:
        _bind(p, None, stats, True)
    return p


def bind(Plan plan, stats_for, bint own):
    """Give each item its statistics (see `_decision_py.bind`)."""
    _bind(plan, stats_for, None, own)


cdef int _bind(Plan plan, stats_for, store, bint own) except -1:
    # `stats_for`, or the StatsStore `store`'s request_rule_stats (looked up only when needed)
    cdef Item item
    for item in plan.items:
        rule = item.rule
        st = get(rule, RULE, R_STATS, "stats")
        if own and st is not None and item.key == get(rule, RULE, R_FULL_KEY, "full_key"):
            item.stats = st
        elif stats_for is not None:
            item.stats = stats_for(item.key)
        else:
            item.stats = store.request_rule_stats(item.key)
    return 0


cdef object _override(str domain, entries, limit):
    requests_per_unit, unit = limit
    if not unit_seconds(unit):
        raise ServiceError(f"invalid rate limit override unit {unit}")
    key = domain + "." + ".".join([k + "_" + v if v else k for k, v in entries])
    return Rule(key, requests_per_unit, unit)


# -- count ------------------------------------------------------------------------------------


cdef inline list _keys_of(Plan plan, Item item, long long now, str prefix, list names=None):
    # The keys are appended to `names` when given (returned).
    cdef tuple w
    cdef str key, suffix
    if names is None:
        names = []
    entries = _entries(plan.descriptors[item.index])
    windows = item.windows
    if len(windows) == 1 and item.share is None and len(entries) == 1:
        w = <tuple>windows[0]
        if <long long>w[W_ALGORITHM] == FIXED_WINDOW and not w[W_SUFFIX]:  # the reference's one window
            names.append(_memo_key(item.rule, prefix, plan.domain, entries, w[W_SECONDS], now))
            return names
    for window in windows:
        w = <tuple>window
        if <long long>w[W_ALGORITHM] == FIXED_WINDOW:
            key = cache_key(prefix, plan.domain, entries, item.share, w[W_SECONDS], now)
            suffix = <str>w[W_SUFFIX]
            names.append(key + suffix if suffix else key)
        else:
            names.append(state_key(prefix, plan.domain, entries, item.share, w[W_SUFFIX]))
    return names


cdef str _memo_key(rule, str prefix, str domain, entries, long long seconds, long long now):
    """`cache_key` of a one-entry descriptor's one fixed window, remembered on its rule: the
    same key object for every request of the same window (until the next window or another
    value), whose hash the store's dict has then computed once (a third of the count)."""
    cdef long long start = (now // seconds) * seconds
    cdef tuple entry = <tuple>entries[0]
    cdef tuple m
    cdef str key
    if type(rule) is not RULE:
        return cache_key(prefix, domain, entries, None, seconds, now)
    memo = get(rule, RULE, R_KEY_MEMO, "key_memo")
    if memo is not None:
        m = <tuple>memo
        if (
            <long long>m[0] == start
            and <str>m[1] == prefix
            and <str>m[2] == domain
            and <str>m[3] == <str>entry[0]
            and <str>m[4] == <str>entry[1]
        ):
            return <str>m[5]
    key = cache_key(prefix, domain, entries, None, seconds, now)
    put(rule, RULE, R_KEY_MEMO, "key_memo", (start, prefix, domain, entry[0], entry[1], key))
    return key


def window_keys(Plan plan, Item item, long long now, str prefix):
    """The store key of each window of `item` at `now` (Unix seconds)."""
    return _keys_of(plan, item, now, prefix)


cdef object _op(int kind, tuple w, str key, long long hits, long long now_ms):
    cdef long long tick
    if kind == REFUND:
        return Op(key, hits, w[W_SECONDS], w[W_PER_SECOND], 0, w[W_REQUESTS], 1, 0, True)
    if <long long>w[W_ALGORITHM] == FIXED_WINDOW:
        return Op(key, hits, w[W_SECONDS], w[W_PER_SECOND], 0, w[W_REQUESTS])
    tick = w[W_TICK]
    return Op(
        key, hits, w[W_SECONDS], w[W_PER_SECOND], w[W_ALGORITHM], w[W_REQUESTS], tick,
        now_ms // tick,
    )


def window_op(int kind, w, str key, long long hits, long long now_ms):
    """The store operation of `hits` of one `kind` on one window."""
    return _op(kind, <tuple>w, key, hits, now_ms)


def collect(Plan plan, double t, str prefix, local, bint record=True):
    """The store operations of the plan's items at `t` (see `_decision_py.collect`)."""
    return _ops(plan, _collect(plan, t, prefix, local, record), t)


cdef list _ops(Plan plan, list names, double t):
    """The store operation of each window `_collect` keyed (`names`)."""
    cdef list ops = []
    cdef long long now_ms = <long long>(t * 1000)
    cdef Item item
    cdef Py_ssize_t k, j
    cdef tuple windows
    for item in plan.items:
        j = item.first
        if j >= 0:
            if item.kind == BUDGET:
                ops.append(budget_op(item, names[j], now_ms))
                continue
            windows = item.windows
            for k in range(len(windows)):
                ops.append(_op(item.kind, <tuple>windows[k], <str>names[j + k], item.hits, now_ms))
    return ops


cdef list _collect(Plan plan, double t, str prefix, local, bint record):
    """The store keys of the plan's windows, in item and window order (`item.first` where
    each item's start; -1 for one the local cache answered); total_hits counted."""
    cdef long long now = <long long>t
    cdef list out = []
    cdef list names
    cdef Item item
    cdef long long h
    cdef int kind
    cdef Py_ssize_t k
    cdef tuple windows
    plan.cached = False
    for item in plan.items:
        item.first = -1
        h = item.hits
        st = item.stats
        kind = item.kind
        if kind == CONSUME:
            put(st, STATS, S_TOTAL_HITS, "total_hits", get(st, STATS, S_TOTAL_HITS, "total_hits") + h)
        elif kind == REFUND:
            st.total_negative_hits += h
        else:  # BUDGET: one key, its hits counted by its verdict
            item.first = len(out)
            out.append(budget_key(prefix, plan.domain, item.budget[2], item.share))
            continue
        windows = item.windows
        if local is None:  # the keys straight into the list
            item.first = len(out)
            _keys_of(plan, item, now, prefix, out)
            continue
        names = _keys_of(plan, item, now, prefix)
        if kind == REFUND:
            if record:
                for name in names:
                    local.discard(name)
        elif _cached(item, windows, names, local, now, record):
            plan.cached = True
            continue
        item.first = len(out)
        out += names
    return out


cdef bint _cached(Item item, tuple windows, list names, local, long long now, bint record):
    cdef Py_ssize_t k
    cdef long long expiry
    for k in range(len(windows)):
        name = names[k]
        if local.contains(name, now) if record else local.expiry(name) > now:
            st = item.stats
            st.over_limit_with_local_cache += item.hits
            expiry = local.expiry(name) - now
            item.status = refuse(
                (<tuple>windows[k])[W_LIMIT], st, item.hits, expiry if expiry > 1 else 1
            )
            return True
    return False


def meter_ops(Plan plan, double t, str prefix):
    """The plan's metered hits, each in its descriptor's day bucket."""
    return _meter_ops(plan, t, prefix)


cdef list _meter_ops(Plan plan, double t, str prefix):
    cdef list ops = []
    cdef long long now = <long long>t
    if plan.meters is None:
        return ops
    for index, hits in plan.meters:
        entries = _entries(plan.descriptors[index])
        key = cache_key(prefix + "meter_", plan.domain, entries, None, 86400, now)
        ops.append(Op(key, hits, METER_TTL))
    return ops


cdef inline void _read(tuple w, object result, long long now, long long now_ms,
                       long long *after, long long *reset, long long *until) except *:
    cdef long long seconds, reset_ms
    if <long long>w[W_ALGORITHM] == FIXED_WINDOW:
        seconds = w[W_SECONDS]
        after[0] = result
        reset[0] = seconds - now % seconds
        until[0] = now + reset[0]
        return
    after[0] = (<tuple>result)[0]
    reset_ms = <long long>(<tuple>result)[1] * <long long>w[W_TICK]
    reset[0] = (reset_ms + 999) // 1000
    until[0] = (now_ms + reset_ms) // 1000


def reading(w, result, long long now, long long now_ms):
    """One window's result as (level after, seconds until reset, Unix second it is over
    until); see `_decision_py.reading`."""
    cdef long long after, reset, until
    _read(<tuple>w, result, now, now_ms, &after, &reset, &until)
    return after, reset, until


# -- verdict ----------------------------------------------------------------------------------


def settle(Plan plan, ops, results, double t, double ratio, local):
    """One Status per descriptor from the results of `collect`'s ops (see
    `_decision_py.settle`)."""
    return _settle(plan, [op.key for op in ops], results, t, ratio, local)


def count_now(Plan plan, double t, str prefix, local, double ratio, store):
    """The whole count of a plan on a synchronous store (see `_decision_py.count_now`)."""
    return _count_now(plan, t, prefix, local, ratio, store, store.increment_one)


cdef list _count_now(Plan plan, double t, str prefix, local, double ratio, store, increment_one):
    cdef list names = _collect(plan, t, prefix, local, True)
    cdef list results = [None] * len(names)
    cdef long long now = <long long>t
    cdef long long now_ms = <long long>(t * 1000)
    cdef long long tick
    cdef Item item
    cdef Py_ssize_t j, k, n
    cdef tuple w, windows
    cdef list ops
    for item in plan.items:
        j = item.first
        if j < 0:
            continue
        windows = item.windows
        n = len(windows)
        if item.kind == CONSUME:  # window by window, no Op built
            for k in range(n):
                w = <tuple>windows[k]
                if <long long>w[W_ALGORITHM] == FIXED_WINDOW:
                    if type(increment_one) is Bump:  # the memory store's: no Python call
                        results[j + k] = (<Bump>increment_one).bump(
                            <str>names[j + k], item.hits, w[W_SECONDS], now
                        )
                    else:
                        results[j + k] = increment_one(names[j + k], item.hits, w[W_SECONDS], now)
                else:
                    tick = w[W_TICK]
                    results[j + k] = store.decide_now(
                        names[j + k], w[W_ALGORITHM], item.hits, w[W_TICKS], w[W_REQUESTS],
                        tick, now_ms // tick, now,
                    )
            continue
        if item.kind == BUDGET:
            results[j] = store.increment_now([budget_op(item, names[j], now_ms)], now)[0]
            continue
        ops = [_op(item.kind, <tuple>windows[k], <str>names[j + k], item.hits, now_ms) for k in range(n)]
        results[j : j + n] = store.increment_now(ops, now)
    if plan.meters is not None:
        store.increment_now(_meter_ops(plan, t, prefix), now)
    return _settle(plan, names, results, t, ratio, local)


cdef list _settle(Plan plan, list names, results, double t, double ratio, local):
    cdef long long now = <long long>t
    cdef long long now_ms = <long long>(t * 1000)
    cdef list statuses = [NO_LIMIT] * len(plan.descriptors)
    cdef Item item
    cdef Py_ssize_t j
    cdef tuple windows, w, best
    cdef long long after, reset, until, left
    cdef long long best_after = 0, best_reset = 0, best_left = 0
    cdef bint over, best_over, take
    for item in plan.items:
        j = item.first
        if j < 0:
            statuses[item.index] = item.status
            continue
        windows = item.windows
        if item.kind == REFUND:
            statuses[item.index] = _refunded(windows, results, j, now)
            continue
        if item.kind == BUDGET:
            statuses[item.index] = budget_status(item, results[j], ratio)
            continue
        # The deciding window: over the limit first, the longest wait among those (the
        # first on a tie); otherwise the least remaining.
        best = None
        best_over = False
        for window in windows:
            w = <tuple>window
            _read(w, results[j], now, now_ms, &after, &reset, &until)
            left = <long long>w[W_REQUESTS] - after
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
                best = w
                best_after = after
                best_reset = reset
                best_left = left
                best_over = over
        statuses[item.index] = verdict(
            best[W_LIMIT], item.stats, item.hits, best_after, ratio, best_reset
        )
    return statuses


cdef object _refunded(tuple windows, results, Py_ssize_t j, long long now):
    cdef tuple best = <tuple>windows[0]
    cdef tuple w
    cdef long long remaining, left, seconds
    cdef Py_ssize_t k
    remaining = <long long>best[W_REQUESTS] - <long long>results[j]
    if remaining < 0:
        remaining = 0
    for k in range(1, len(windows)):
        w = <tuple>windows[k]
        left = <long long>w[W_REQUESTS] - <long long>results[j + k]
        if left < 0:
            left = 0
        if left < remaining:
            best = w
            remaining = left
    seconds = best[W_SECONDS]
    return Status(OK, best[W_LIMIT], remaining, seconds - now % seconds)


def respond(Plan plan, list statuses, options, service, bint record=True):
    """The response of a plan's statuses (see `_decision_py.respond`)."""
    return _respond(plan, statuses, options.quota_mode, options.shadow_mode, service, record)


cdef object _respond(Plan plan, list statuses, bint quota, bint shadow, service, bint record):
    cdef list unlimited = plan.unlimited
    cdef int overall = OK
    if unlimited is not None:
        for i in unlimited:
            statuses[i] = UNLIMITED
    for st in statuses:
        if get(st, STATUS, T_CODE, "code") == OVER_LIMIT:
            overall = _overall_code(statuses, unlimited or (), quota)
            break
    if overall == OVER_LIMIT and shadow:
        overall = OK
        if record:
            service.global_shadow_mode += 1
    return Response(overall, statuses)


cdef class Engine:
    """A synchronous service's decision in one call (see `_decision_py.Engine`)."""

    cdef object stats, service, clock, store, increment_one, local, extras
    cdef str prefix
    cdef double ratio
    cdef public object ruleset, options
    cdef object lookup
    cdef bint extras_on, quota, shadow, realtime, answers
    cdef Py_ssize_t max_descriptors, max_entries
    # `_answered`: the config's domains and budgets (None: a ruleset read through Python),
    # and the response of n descriptors none of which has a limit, made once per n.
    cdef dict tries, budgets
    cdef list nothing

    def __init__(self, stats, limiter, extras):
        self.stats = stats
        self.service = stats.service
        self.prefix = limiter.prefix
        self.ratio = limiter.near_limit_ratio
        self.local = limiter.local_cache
        self.clock = limiter.clock
        self.realtime = limiter.clock is time.time
        self.store = limiter.backend
        self.increment_one = getattr(limiter.backend, "increment_one", None)
        self.extras = extras
        self.ruleset = None
        self.options = None

    cdef inline double _now(self) except? -1.0:
        # time.time is CLOCK_REALTIME, read in C (a test may hand another clock)
        return clock_now(CLOCK_REALTIME, None if self.realtime else self.clock)

    cdef Plan _planned(self, request):
        """`planned`, with the engine's cached options."""
        return _counted(
            request, self.ruleset, self.lookup, self.max_descriptors, self.max_entries,
            self.shadow, self.quota, self.stats, self.service,
        )

    def use(self, ruleset, options):
        """The config and reload options in force."""
        self.ruleset = ruleset
        self.lookup = ruleset.lookup if ruleset is not None else None
        self.options = options
        self.quota = options.quota_mode
        self.shadow = options.shadow_mode
        self.max_descriptors = options.max_descriptors
        self.max_entries = options.max_entries
        self.extras_on = bool(
            options.response_headers
            or options.all_descriptors_headers
            or options.request_headers
            or options.response_dynamic_metadata
        )
        # With no limit in a response, the headers the options ask for are none; only the
        # dynamic metadata (the request echoed) makes it differ from one request to another.
        self.answers = not options.response_dynamic_metadata
        self.tries = self.budgets = None
        if type(ruleset) is RULESET:
            self.tries = <dict>get(ruleset, RULESET, O_TRIES, "_tries")
            self.budgets = dict(ruleset.budgets)
        self.nothing = [None] * (SLICE + 1)

    cdef object _nothing(self, Py_ssize_t n):
        """The response of `n` descriptors without a limit: one object per n, made on first
        use and shared (read only: the transports encode it)."""
        response = self.nothing[n]
        if response is None:
            response = self.nothing[n] = Response(OK, [NO_LIMIT] * n)
        return response

    cdef object _answered(self, request):
        """The response to a request for a domain the config does not know (counted in
        `domain_not_found`, per descriptor, as the reference does), made of nothing new;
        None for any other request, or one `_begin` would refuse (it refuses it)."""
        cdef list descriptors = get(request, REQUEST, Q_DESCRIPTORS, "descriptors")
        cdef Py_ssize_t n = len(descriptors)
        cdef str domain
        if self.tries is None or not self.answers or n == 0 or n > SLICE:
            return None
        if n > self.max_descriptors:
            return None
        domain = get(request, REQUEST, Q_DOMAIN, "domain")
        if not domain or domain in self.tries or domain in self.budgets:
            return None
        for d in descriptors:
            if len(_entries(d)) > self.max_entries:
                return None
        self.stats.domain_not_found(domain, n)
        return self._nothing(n)

    cdef inline bint _unmatched(self, Plan p):
        """Whether nothing of plan `p` is counted, refused or answered specially: each
        descriptor gets NO_LIMIT (and no statistic, as in the reference)."""
        return (
            not p.items and p.unlimited is None and p.meters is None and p.budget is None
            and self.answers
        )

    cdef object _plan_or_answer(self, request):
        """The plan of `request`, statistics bound; or its response when nothing is to be
        counted (an unknown domain, no rule matched)."""
        response = self._answered(request)
        if response is not None:
            return response
        cdef Plan p = self._planned(request)
        if self._unmatched(p):
            return self._nothing(len(p.descriptors))
        return p

    def decide_now(self, request):
        """Decide `request` (None past SLICE descriptors: it is planned in slices)."""
        cdef Plan p
        cdef list statuses
        if len(get(request, REQUEST, Q_DESCRIPTORS, "descriptors")) > SLICE:
            return None
        planned = self._plan_or_answer(request)
        if type(planned) is not Plan:
            return planned
        p = <Plan>planned
        statuses = _count_now(
            p, self._now(), self.prefix, self.local, self.ratio, self.store, self.increment_one
        )
        response = _respond(p, statuses, self.quota, self.shadow, self.service, True)
        if self.extras_on:
            self.extras(request, p, response, self.options)
        return response

    def prepare(self, request):
        """The first half of an awaited decision: the plan of `request` (at most SLICE
        descriptors), its statistics bound, and its count's store operations (`plan.ops`,
        meters last) at `plan.t`; or the response, when nothing is to be counted."""
        cdef Plan p
        planned = self._plan_or_answer(request)
        if type(planned) is not Plan:
            return planned
        p = <Plan>planned
        p.t = self._now()
        p.names = _collect(p, p.t, self.prefix, self.local, True)
        p.ops = _ops(p, p.names, p.t)
        if p.meters is not None:
            p.ops += _meter_ops(p, p.t, self.prefix)
        return p

    def finish(self, request, Plan p, results):
        """The second half: the verdict on the results of `plan.ops`, and the response."""
        statuses = _settle(p, p.names, results, p.t, self.ratio, self.local)
        response = _respond(p, statuses, self.quota, self.shadow, self.service, True)
        if self.extras_on:
            self.extras(request, p, response, self.options)
        return response


def overall_code(list statuses, unlimited, bint global_quota):
    """OVER_LIMIT iff a regular descriptor is over, or every quota descriptor is (see
    `_decision_py.overall_code`)."""
    return _overall_code(statuses, unlimited, global_quota)


cdef int _overall_code(list statuses, unlimited, bint global_quota) except -1:
    cdef bint regular_over = False, over
    cdef Py_ssize_t quota_count = 0, quota_over = 0, i
    for i in range(len(statuses)):
        st = statuses[i]
        if st.rule is None and i in unlimited:
            continue
        over = st.code == OVER_LIMIT
        if global_quota or (st.rule is not None and st.rule.quota_mode):
            quota_count += 1
            quota_over += over
        elif over:
            regular_over = True
    return OVER_LIMIT if regular_over or (quota_count and quota_over == quota_count) else OK
