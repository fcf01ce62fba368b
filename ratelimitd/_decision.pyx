# cython: language_level=3
"""Plan, count, verdict: the decision model, compiled.

Same public names and results as `_decision_py.py` (the oracle, and the model's notes);
`decision.py` selects one. The key and window maths are `_keys`'s, called in C. A rule's
windows are `config.windows.Window` tuples, read here by position.
"""

from ratelimitd._keys cimport cache_key, refuse, state_key, unit_seconds, verdict

from ratelimitd.backends.base import Op
from ratelimitd.config.ruleset import Rule
from ratelimitd.keys import MAX_HITS as _MAX_HITS, METER_TTL_SECONDS as _METER_TTL
from ratelimitd.messages import (
    MAX_UINT32,
    OK as _OK,
    OVER_LIMIT as _OVER_LIMIT,
    RequestTooLarge,
    ServiceError,
    Status,
)

CONSUME = 0
REFUND = 1
NO_LIMIT = Status(_OK)
UNLIMITED = Status(_OK, None, MAX_UINT32, 0)

# Window tuple positions (config.windows.Window).
DEF W_LIMIT = 0
DEF W_ALGORITHM = 1
DEF W_SECONDS = 2
DEF W_REQUESTS = 3
DEF W_SUFFIX = 4
DEF W_TICK = 5
DEF W_PER_SECOND = 7

cdef long long MAX_HITS = _MAX_HITS
cdef long long METER_TTL = _METER_TTL
cdef int OK = _OK
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

    def __init__(self, Py_ssize_t index, rule, str key, share, long long hits, int kind=0):
        self.index = index
        self.rule = rule
        self.key = key
        self.share = share
        self.hits = hits
        self.kind = kind
        self.stats = None
        self.first = -1
        self.status = None


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

    def __init__(self, request, root, list walks):
        cdef long long hits = request.hits_addend or 1
        self.domain = request.domain
        self.descriptors = request.descriptors
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


def begin(request, ruleset, options, list walks=None):
    """A plan with no descriptor looked up yet (see `_decision_py.begin`)."""
    cdef list descriptors
    cdef Py_ssize_t n, most
    if not request.domain:
        raise ServiceError("rate limit domain must not be empty")
    descriptors = request.descriptors
    if not descriptors:
        raise ServiceError("rate limit descriptor list must not be empty")
    if ruleset is None:
        raise ServiceError("no rate limit configuration loaded")
    n = len(descriptors)
    if n > options.max_descriptors:
        raise RequestTooLarge(
            f"{n} descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST={options.max_descriptors})"
        )
    most = options.max_entries
    for d in descriptors:
        if len(d.entries) > most:
            raise RequestTooLarge(
                f"a descriptor with {len(d.entries)} entries (MAX_ENTRIES_PER_DESCRIPTOR={most})"
            )
    return Plan(request, ruleset.domains.get(request.domain), walks)


def extend(Plan plan, lookup, Py_ssize_t start, Py_ssize_t stop):
    """Look up descriptors `start` to `stop` (see `_decision_py.extend`)."""
    cdef object root = plan.root
    cdef str domain = plan.domain
    cdef list descriptors = plan.descriptors
    cdef list walks = plan.walks
    cdef list walked
    cdef Py_ssize_t i
    cdef long long hits
    cdef object d, rule, share, found, raw
    cdef str key
    if root is None:
        return
    for i in range(start, stop):
        d = descriptors[i]
        share = None
        if d.limit is not None:
            rule = _override(domain, d.entries, d.limit)
            key = rule.full_key
            if walks is not None:
                walks.append((None, rule, key))
        else:
            walked = [] if walks is not None else None
            found = lookup(root, domain, d.entries, walked)
            if walks is not None:
                if found is None:
                    walks.append((walked, None, None))
                else:
                    walks.append((walked, found[0], found[1]))
            if found is None:
                continue
            rule, key, share, keep_metadata = found
            if keep_metadata and rule.metadata is not None:
                if plan.metadata is None:
                    plan.metadata = [None] * len(descriptors)
                plan.metadata[i] = rule.metadata
        raw = d.hits_addend
        if raw is None:
            hits = plan.default_hits
        else:
            hits = raw if raw <= MAX_HITS else MAX_HITS
        if rule.special:
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
        if d.is_negative_hits:
            for window in rule.windows:
                if (<tuple>window)[W_ALGORITHM] != 0:
                    raise ServiceError(
                        "is_negative_hits: refunds apply to fixed-window limits only; "
                        f"'{rule.full_key}' is counted by another algorithm"
                    )
            plan.items.append(Item(i, rule, key, share, hits, REFUND))
            continue
        plan.items.append(Item(i, rule, key, share, hits, CONSUME))


def finish(Plan plan):
    """Apply `replaces` (see `_decision_py.finish`)."""
    cdef dict replaced = plan.replaced
    cdef list kept
    cdef Item item
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


def plan(request, ruleset, options, list walks=None):
    """The whole plan of a request at once (see `_decision_py.plan`)."""
    cdef Plan p = begin(request, ruleset, options, walks)
    extend(p, ruleset.lookup, 0, len(request.descriptors))
    return finish(p)


def bind(Plan plan, stats_for, bint own):
    """Give each item its statistics (see `_decision_py.bind`)."""
    cdef Item item
    for item in plan.items:
        rule = item.rule
        st = rule.stats
        if own and st is not None and item.key == rule.full_key:
            item.stats = st
        else:
            item.stats = stats_for(item.key)


cdef object _override(str domain, entries, limit):
    requests_per_unit, unit = limit
    if not unit_seconds(unit):
        raise ServiceError(f"invalid rate limit override unit {unit}")
    key = domain + "." + ".".join([k + "_" + v if v else k for k, v in entries])
    return Rule(key, requests_per_unit, unit)


# -- count ------------------------------------------------------------------------------------


cdef inline list _keys_of(Plan plan, Item item, long long now, str prefix):
    cdef list names = []
    cdef tuple w
    entries = (<object>plan.descriptors[item.index]).entries
    for window in item.rule.windows:
        w = <tuple>window
        if <long long>w[W_ALGORITHM] == 0:
            names.append(
                cache_key(prefix, plan.domain, entries, item.share, w[W_SECONDS], now)
                + <str>w[W_SUFFIX]
            )
        else:
            names.append(state_key(prefix, plan.domain, entries, item.share, w[W_SUFFIX]))
    return names


def window_keys(Plan plan, Item item, long long now, str prefix):
    """The store key of each window of `item` at `now` (Unix seconds)."""
    return _keys_of(plan, item, now, prefix)


cdef object _op(int kind, tuple w, str key, long long hits, long long now_ms):
    cdef long long tick
    if kind == REFUND:
        return Op(key, hits, w[W_SECONDS], w[W_PER_SECOND], 0, w[W_REQUESTS], 1, 0, True)
    if <long long>w[W_ALGORITHM] == 0:
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
    cdef long long now = <long long>t
    cdef long long now_ms = <long long>(t * 1000)
    cdef list ops = []
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
        if kind == REFUND:
            st.total_negative_hits += h
        else:
            st.total_hits += h
        names = _keys_of(plan, item, now, prefix)
        windows = item.rule.windows
        if local is not None:
            if kind == REFUND:
                if record:
                    for name in names:
                        local.discard(name)
            elif _cached(item, windows, names, local, now, record):
                plan.cached = True
                continue
        item.first = len(ops)
        for k in range(len(windows)):
            ops.append(_op(kind, <tuple>windows[k], <str>names[k], h, now_ms))
    return ops


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
    cdef list ops = []
    cdef long long now = <long long>t
    if plan.meters is None:
        return ops
    for index, hits in plan.meters:
        entries = (<object>plan.descriptors[index]).entries
        key = cache_key(prefix + "meter_", plan.domain, entries, None, 86400, now)
        ops.append(Op(key, hits, METER_TTL))
    return ops


cdef inline void _read(tuple w, object result, long long now, long long now_ms,
                       long long *after, long long *reset, long long *until) except *:
    cdef long long seconds, reset_ms
    if <long long>w[W_ALGORITHM] == 0:
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
        windows = item.rule.windows
        if item.kind == REFUND:
            statuses[item.index] = _refunded(windows, results, j, now)
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
                local.add(ops[j].key, until)
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


def overall_code(list statuses, unlimited, bint global_quota):
    """OVER_LIMIT iff a regular descriptor is over, or every quota descriptor is (see
    `_decision_py.overall_code`)."""
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
