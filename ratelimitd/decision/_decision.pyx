# cython: language_level=3
"""Count and verdict: the second and third steps of the decision model (`decision.py` has
the model; `_plan` the first step, cimported: its plans and items are C structs here).

* **count** (`collect`, one store round, then `settle`): `collect` turns every item's
  windows into store operations (`Op`s) at one instant, and answers items known over from
  the local over-limit cache; the limiter runs the ops (`increment`, or the read-only
  `peek` for `/explain`); `settle` reads each window's result as (level after, reset).
  A synchronous store is counted in one call (`count_now`), window by window.
* **verdict** (in `settle`): one place chooses the deciding window of an item (over the
  limit first, the longest wait among those; else the least remaining), and
  `keys.verdict` is the one status split; `overall_code` the one overall code.

A new kind of count (a refund is one: REFUND) is a new `kind`: the plan sets it on the
item, `window_op` builds its store operation, `reading` reads its result, and the backends
execute it; the verdict is shared. A token budget (BUDGET, `budget.calls`) is the one kind
counted whole: one store call for all its windows, whose result gives its status. The key
and window maths are `_keys`'s, called in C.
"""

from posix.time cimport CLOCK_REALTIME

from ratelimitd.config._keys cimport Bump, cache_key, refuse, state_key, verdict
from ratelimitd.decision._plan cimport (
    K_BUDGET, K_CONSUME, K_REFUND, W_ALGORITHM, W_LIMIT, W_PER_SECOND, W_REQUESTS, W_SECONDS,
    W_SUFFIX, W_TICK, W_TICKS, Item, Plan, counted, entries_of,
)
from ratelimitd._slots cimport clock_now, get, offset_of, offsets, put
from ratelimitd.budget.calls cimport budget_key, budget_now, status_of

import time

from ratelimitd.backends.base import Op
from ratelimitd.budget.calls import budget_op
from ratelimitd.config.ruleset import Rule, RuleSet
from ratelimitd.config.windows import FIXED_WINDOW as _FIXED_WINDOW
from ratelimitd.config.keys import METER_TTL_SECONDS as _METER_TTL
from ratelimitd.messages import (
    MAX_UINT32,
    OK as _OK,
    OVER_LIMIT as _OVER_LIMIT,
    Request,
    Response,
    Status,
)
from ratelimitd.stats.store import RuleStats

# A request with more descriptors than this is planned in slices of this many, the loop
# running other requests between them: one huge request must not stall all. Such a request
# is never decided synchronously (`Engine.decide_now`).
SLICE = 256
cdef Py_ssize_t C_SLICE = SLICE
# The status of a descriptor with no limit, and of an unlimited one; shared, never mutated.
NO_LIMIT = Status(_OK)
UNLIMITED = Status(_OK, None, MAX_UINT32, 0)

# The slots read on every decision (see _slots.pxd).
cdef object REQUEST = Request
cdef object RULE = Rule
cdef object RULESET = RuleSet
cdef Py_ssize_t O_TRIES = offset_of(RuleSet, "_tries")
cdef object STATS = RuleStats
cdef object STATUS = Status
cdef Py_ssize_t T_CODE = offset_of(Status, "code")
cdef Py_ssize_t S_TOTAL_HITS = offset_of(RuleStats, "total_hits")
cdef Py_ssize_t R_KEY_MEMO = offset_of(Rule, "key_memo")
cdef Py_ssize_t Q_DOMAIN, Q_DESCRIPTORS
Q_DOMAIN, Q_DESCRIPTORS = offsets(Request, ("domain", "descriptors"))

cdef long long METER_TTL = _METER_TTL
cdef int OK = _OK
cdef long long FIXED_WINDOW = _FIXED_WINDOW
cdef int OVER_LIMIT = _OVER_LIMIT


# -- count ------------------------------------------------------------------------------------


cdef inline list _keys_of(Plan plan, Item item, long long now, str prefix, list names=None):
    # The keys are appended to `names` when given (returned).
    cdef tuple w
    cdef str key, suffix
    if names is None:
        names = []
    entries = entries_of(plan.descriptors[item.index])
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
    if kind == K_REFUND:
        return Op(
            key, hits, w[W_SECONDS], w[W_PER_SECOND], w[W_ALGORITHM], w[W_REQUESTS], 1, 0, True
        )
    if <long long>w[W_ALGORITHM] == FIXED_WINDOW:
        return Op(key, hits, w[W_SECONDS], w[W_PER_SECOND], w[W_ALGORITHM], w[W_REQUESTS])
    tick = w[W_TICK]
    return Op(
        key, hits, w[W_SECONDS], w[W_PER_SECOND], w[W_ALGORITHM], w[W_REQUESTS], tick,
        now_ms // tick,
    )


def window_op(int kind, w, str key, long long hits, long long now_ms):
    """The store operation of `hits` of one `kind` on one window."""
    return _op(kind, <tuple>w, key, hits, now_ms)


def collect(Plan plan, double t, str prefix, local, bint record=True):
    """The store operations of the plan's items at time `t`, in item and window order (each
    item's `first` says where its own start); `total_hits` / `total_negative_hits` counted.

    An item one of whose windows the local over-limit cache knows to be over is answered now
    (`item.status`, its hits in `over_limit_with_local_cache`) and sends nothing; a refund
    drops its keys from that cache (the reference keeps them), unless `record` is false (a
    dry run changes nothing). A budget item is one operation for all its windows, never
    answered from the local cache (a settle frees room before the window ends).
    """
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
            if item.kind == K_BUDGET:
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
        if kind == K_CONSUME:
            put(st, STATS, S_TOTAL_HITS, "total_hits", get(st, STATS, S_TOTAL_HITS, "total_hits") + h)
        elif kind == K_REFUND:
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
        if kind == K_REFUND:
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
    # Answer `item` from the local cache if it knows one of its windows over (the first);
    # without `record`, its hit and miss counts stay as they are.
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
    """The plan's metered hits, each in its descriptor's day bucket (`keys.meter_key`)."""
    return _meter_ops(plan, t, prefix)


cdef list _meter_ops(Plan plan, double t, str prefix):
    cdef list ops = []
    cdef long long now = <long long>t
    if plan.meters is None:
        return ops
    for index, hits in plan.meters:
        entries = entries_of(plan.descriptors[index])
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
    until): a fixed window's counter after; a sliding window's or token bucket's
    `(level after, ticks until reset)` pair. The reset is rounded up: never past the true
    wait."""
    cdef long long after, reset, until
    _read(<tuple>w, result, now, now_ms, &after, &reset, &until)
    return after, reset, until


# -- verdict ----------------------------------------------------------------------------------


def settle(Plan plan, ops, results, double t, double ratio, local):
    """One Status per descriptor from the results of `collect`'s ops, and the stats split;
    windows found over go to the local cache (`local`; None: nothing recorded)."""
    return _settle(plan, [op.key for op in ops], results, t, ratio, local)


def count_now(Plan plan, double t, str prefix, local, double ratio, store):
    """The whole count of a plan on a synchronous store (a `SyncBackend`), then the verdict.

    A consumed window is counted by the store's field-wise calls (`increment_one` for a
    fixed window, `decide_now` for the others: no Op built); any other kind of item, and
    the meters, by `increment_now` on their ops (`window_op`'s, the one place a kind's store
    operation is made).
    """
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
        if item.kind == K_CONSUME:  # window by window, no Op built
            for k in range(n):
                w = <tuple>windows[k]
                if <long long>w[W_ALGORITHM] == FIXED_WINDOW:
                    if isinstance(increment_one, Bump):  # the memory store's: no Python call
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
        if item.kind == K_BUDGET:  # its one call, no Op built
            results[j] = budget_now(store.budget_now, item, item.budget, item.terms, item.hits,
                                    names[j], now_ms)
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
        if item.kind == K_REFUND:
            statuses[item.index] = _refunded(windows, results, j, now)
            continue
        if item.kind == K_BUDGET:
            statuses[item.index] = status_of(item.budget, item.terms, item.hits, item.stats,
                                             results[j], ratio)
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
    # A refund's status: OK, with the remaining of its most constrained window
    # (`max(0, limit - counter after)`); no over/near/within stats, no local cache.
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
    """The response of a plan's statuses: unlimited descriptors, the overall code with quota
    and global shadow mode (counted in `service.global_shadow_mode` when `record`)."""
    return _respond(plan, statuses, options.quota_mode, options.shadow_mode, service, record)


cdef object _respond(Plan plan, list statuses, bint quota, bint shadow, service, bint record):
    cdef list unlimited = plan.unlimited
    cdef int overall = OK
    if unlimited is not None:
        for i in unlimited:
            statuses[i] = UNLIMITED
    for st in statuses:
        if get(st, STATUS, T_CODE, "code") == OVER_LIMIT:
            # nothing over is OK whatever the quota settings
            overall = _overall_code(statuses, unlimited or (), quota)
            break
    if overall == OVER_LIMIT and shadow:
        overall = OK
        if record:
            service.global_shadow_mode += 1
    return Response(overall, statuses)


cdef class Engine:
    """A synchronous service's decision in one call (`RateLimitService.decide_now`): plan,
    count (`count_now`) and verdict (`respond`), with the service's statistics; or its two
    halves around an awaited store round (`prepare`, `finish`). `extras` adds what the
    options ask besides (headers, dynamic metadata): the service's own."""

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
    cdef readonly list nothing
    cdef str known  # the domain `_answered` last found configured (the decoder's same str)
    # `domain_not_found` of the unknown domain answered last, while its series exists: its
    # descriptors since then, added to the store's counter when another domain comes or
    # before the statistics are read (`flush`), so that a run of them makes no int.
    cdef str unknown
    cdef long long unknown_count
    cdef public object start, later, answer, enter  # `send`'s (`_decision_rounds.pxi`)
    cdef public Py_ssize_t most, in_flight

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
        self.unknown = None
        self.unknown_count = 0
        # The same for every config, so kept while the engine lives (the service hands it
        # to the transports: `RateLimitService.nothing`).
        self.nothing = [None] * (SLICE + 1)
        stats.add_flush(self.flush)

    cdef inline double _now(self) except? -1.0:
        # time.time is CLOCK_REALTIME, read in C (a test may hand another clock)
        return clock_now(CLOCK_REALTIME, None if self.realtime else self.clock)

    cdef Plan _planned(self, request):
        """`planned`, with the engine's cached options."""
        return counted(
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
        self.known = None
        if type(ruleset) is RULESET:
            self.tries = <dict>get(ruleset, RULESET, O_TRIES, "_tries")
            self.budgets = dict(ruleset.budgets)

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
        if self.tries is None or not self.answers or not 0 < n <= C_SLICE or n > self.max_descriptors:
            return None
        domain = get(request, REQUEST, Q_DOMAIN, "domain")
        if not domain or domain is self.known:
            return None
        if domain in self.tries or domain in self.budgets:
            self.known = domain
            return None
        for d in descriptors:
            if len(entries_of(d)) > self.max_entries:
                return None
        self._not_found(domain, n)
        return self._nothing(n)

    def unknown_domain(self, str domain, Py_ssize_t n):
        """`_answered` for a request read but not decoded (well formed, within the bounds,
        `n` descriptors): its response if `domain` is unknown to the config, counted as
        `_answered` counts it; None if the config knows `domain`, False if the request is
        to be decoded for another reason."""
        if self.tries is None or not self.answers or n == 0 or n > C_SLICE:
            return False
        if domain in self.tries or domain in self.budgets:
            return None
        self._not_found(domain, n)
        return self._nothing(n)

    cdef inline void _not_found(self, str domain, Py_ssize_t n) except *:
        """Count `n` descriptors under `domain_not_found` (see `unknown`)."""
        if domain is self.unknown:
            self.unknown_count += n
            return
        self.flush()
        # Kept only while its series is the domain's own (not cut to its bounded length,
        # not folded): adding to it later is then what counting each call would have done.
        if self.stats.domain_not_found(domain, n):
            self.unknown = domain

    def flush(self):
        """Add the descriptors counted in C since the last flush to the statistics."""
        if self.unknown_count:
            count = self.unknown_count
            self.unknown_count = 0
            self.stats.domain_not_found(self.unknown, count)
        self.unknown = None

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
        if len(get(request, REQUEST, Q_DESCRIPTORS, "descriptors")) > C_SLICE:
            return None
        planned = self._plan_or_answer(request)
        if type(planned) is not Plan:
            return planned
        p = <Plan>planned
        statuses = _count_now(
            p, self._now(), self.prefix, self.local, self.ratio, self.store, self.increment_one
        )
        return self._respond(request, p, statuses)

    cpdef object prepare(self, request):
        """The first half of an awaited decision: the plan of `request` (at most SLICE
        descriptors), its statistics bound, and its count's store operations (`plan.ops`,
        meters last) at `plan.t`; or the response, when nothing is to be counted."""
        planned = _keyed(self, request)
        if type(planned) is Plan:
            _with_ops(<Plan>planned, self.prefix)
        return planned

    cpdef object finish(self, request, Plan p, results):
        """The second half: the verdict on the results of `plan.ops`, and the response."""
        return self._respond(request, p, _settle(p, p.names, results, p.t, self.ratio, self.local))

    cdef object _respond(self, request, Plan p, list statuses):
        """The response of the verdict `statuses`, with the `extras` the options ask."""
        response = _respond(p, statuses, self.quota, self.shadow, self.service, True)
        if self.extras_on:
            self.extras(request, p, response, self.options)
        return response

    def send(self, request, waiter):
        """`prepare`, and its plan's store round started with `waiter` (see `_send`)."""
        return _send(self, request, waiter)

    def received(self, request, Plan p, results):
        """The answer to a plan `send` started, from its round's results (see `_received`)."""
        return _received(self, request, p, results)


include "_decision_rounds.pxi"


def overall_code(list statuses, unlimited, bint global_quota):
    """OVER_LIMIT iff a regular descriptor is over, or every quota descriptor is.

    A descriptor is a quota one with QUOTA_MODE or its rule's quota_mode (with QUOTA_MODE
    even one without a limit); unlimited descriptors take no part.
    """
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
