# cython: language_level=3
"""Plan: the first step of the decision model (`decision.py` has the model; `_decision`
the count and the verdict).

A plan (`plan`, or `begin` + `extend` + `finish` in slices) is the request checked, each
descriptor looked up in the rule set (the walk kept when asked), request overrides,
`replaces`, unlimited and metered descriptors resolved. It is pure: it reads the config,
never the store or the statistics (`bind` gives the items their counters, apart). Each
descriptor that counts is an `Item`: its rule, the rule's `windows` (compiled at config
load: `config.windows.Window` tuples, read here by position), its stats key, hits and
`kind`.
"""

cimport cython

from ratelimitd.config._match cimport lookup_c
from ratelimitd.config._keys cimport unit_seconds
from ratelimitd._slots cimport get, offset_of, offsets
from ratelimitd.budget.calls cimport (
    Terms, arrange, held_apart, item_call, lookup as budget_lookup, terms_of,
)

from ratelimitd.config import _match
from ratelimitd.budget.calls import relimit as budget_relimit
from ratelimitd.config.ruleset import Rule, RuleSet
from ratelimitd.config.windows import FIXED_WINDOW as _FIXED_WINDOW, Window
from ratelimitd.config.keys import MAX_HITS as _MAX_HITS
from ratelimitd.messages import Descriptor, Request, RequestTooLarge, ServiceError

# What an item's hits do to its windows; a budget item's do what its call says (`budget`).
CONSUME, REFUND, BUDGET = K_CONSUME, K_REFUND, K_BUDGET

if Window._fields[W_PER_SECOND + 1 :] or [
    Window._fields[W_LIMIT], Window._fields[W_ALGORITHM], Window._fields[W_SECONDS],
    Window._fields[W_REQUESTS], Window._fields[W_SUFFIX], Window._fields[W_TICK],
    Window._fields[W_TICKS], Window._fields[W_PER_SECOND],
] != ["limit", "algorithm", "seconds", "requests", "suffix", "tick", "ticks", "per_second"]:
    raise ImportError("config.windows.Window's fields moved: renumber W_* in _plan.pxd")

# The slots read on every decision (see _slots.pxd).
cdef object REQUEST = Request
cdef object DESCRIPTOR = Descriptor
cdef object RULE = Rule
cdef object LOOKUP = _match.lookup
cdef object RULESET = RuleSet
cdef Py_ssize_t O_TRIES = offset_of(RuleSet, "_tries")
cdef Py_ssize_t O_BUDGETS = offset_of(RuleSet, "budgets")
cdef Py_ssize_t Q_DOMAIN, Q_DESCRIPTORS, Q_HITS
cdef Py_ssize_t D_ENTRIES, D_LIMIT, D_HITS, D_NEGATIVE
cdef Py_ssize_t R_SPECIAL, R_WINDOWS, R_METADATA, R_STATS, R_FULL_KEY
cdef Py_ssize_t R_METER, R_REPLACES, R_UNLIMITED, R_BUDGET, R_BUDGET_TERMS
Q_DOMAIN, Q_DESCRIPTORS, Q_HITS = offsets(Request, ("domain", "descriptors", "hits_addend"))
D_ENTRIES, D_LIMIT, D_HITS, D_NEGATIVE = offsets(
    Descriptor, ("entries", "limit", "hits_addend", "is_negative_hits")
)
R_SPECIAL, R_WINDOWS, R_METADATA, R_STATS, R_FULL_KEY = offsets(
    Rule, ("special", "windows", "metadata", "stats", "full_key")
)
R_METER, R_REPLACES, R_UNLIMITED, R_BUDGET, R_BUDGET_TERMS = offsets(
    Rule, ("meter", "replaces", "unlimited", "budget", "budget_terms")
)

cdef long long MAX_HITS = _MAX_HITS
cdef long long FIXED_WINDOW = _FIXED_WINDOW


cdef inline object _entries(d):
    return get(d, DESCRIPTOR, D_ENTRIES, "entries")


cdef object entries_of(object d):
    """A descriptor's entries, from its slot: for the count (`_decision`)."""
    return get(d, DESCRIPTOR, D_ENTRIES, "entries")


# A freelist each: a plan and its items are made for every decision, and a Redis-backed
# one keeps them while its round is out (a pipelined flush holds about a hundred).
@cython.freelist(256)
cdef class Item:
    """One descriptor of a plan that counts: its rule and windows, stats key, hits, kind
    (the fields: `_plan.pxd`)."""

    def __init__(
        self, Py_ssize_t index, rule, str key, share, long long hits, int kind=K_CONSUME
    ):
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
    self.terms = None
    return self


@cython.freelist(256)
cdef class Plan:
    """What one request asks: its items, and the descriptors decided without counting (the
    fields: `_plan.pxd`)."""

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
    """A plan with no descriptor looked up yet; raises ServiceError for a request the service
    refuses (RequestTooLarge past MAX_DESCRIPTORS_PER_REQUEST / MAX_ENTRIES_PER_DESCRIPTOR)."""
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
    """Look up descriptors `start` to `stop` of the plan's request (`lookup`: the rule set's)."""
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
    cdef object d, rule, share, found, raw, call, recognised, held
    cdef tuple asked
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
                recognised = budget_lookup(lookup, root, domain, _entries(d), budget, None)
                if recognised is not None:
                    found, call = recognised
                    found = budget_relimit(found, limit)
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
        else:  # a descriptor's own hits_addend (uint64 on the wire) counts at most MAX_HITS
            hits = raw if raw <= MAX_HITS else MAX_HITS
        # Replaces, unlimited, metering or a budget: rare but for budget calls, whose rule's
        # fields are read at their offsets too.
        if get(rule, RULE, R_SPECIAL, "special"):
            if get(rule, RULE, R_METER, "meter") and not negative:
                if plan.meters is None:
                    plan.meters = []
                plan.meters.append((i, hits))
            if get(rule, RULE, R_REPLACES, "replaces"):
                if plan.replaced is None:
                    plan.replaced = {}
                for name in rule.replaces:
                    plan.replaced.setdefault(name, rule.name or rule.full_key)
            if get(rule, RULE, R_UNLIMITED, "unlimited"):
                if plan.unlimited is None:
                    plan.unlimited = []
                plan.unlimited.append(i)
                continue
            if get(rule, RULE, R_BUDGET, "budget") is not None:
                item = _item(Item.__new__(Item), i, rule, key, share, hits, K_BUDGET)
                held = get(rule, RULE, R_BUDGET_TERMS, "budget_terms")
                item.terms = terms_of(rule) if held is None else <Terms>held
                item.budget = asked = item_call(call, item.terms, _entries(d), negative, budget)
                if held_apart(asked[0]):  # for `arrange`, once every descriptor is planned
                    if plan.closes is None:
                        plan.closes = []
                    plan.closes.append(item)
                else:
                    plan.items.append(item)
                continue
        if negative:
            for window in rule.windows:
                if <long long>(<tuple>window)[W_ALGORITHM] != FIXED_WINDOW:
                    raise ServiceError(
                        "is_negative_hits: refunds apply to fixed-window limits only; "
                        f"'{rule.full_key}' is counted by another algorithm"
                    )
            plan.items.append(_item(Item.__new__(Item), i, rule, key, share, hits, K_REFUND))
            continue
        plan.items.append(_item(Item.__new__(Item), i, rule, key, share, hits, K_CONSUME))
    return 0


def finish(Plan plan):
    """Apply `replaces` once every descriptor is looked up: the limits it names are dropped
    (their metadata too), whatever the descriptor order; a list keeps its other limits.
    The budget items set apart are arranged first (`budget.calls.arrange`): reserves of one
    transaction merged, guards resolved, closes after settles."""
    return _finish(plan)


cdef Plan _finish(Plan plan):
    cdef dict replaced = plan.replaced
    cdef list kept
    cdef Item item
    cdef list held = plan.closes
    if held is not None:  # budget reserves, guards and closes (`budget.calls.arrange`)
        plan.closes = None
        arrange(held, plan.items, plan.metadata)
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
    """The whole plan of a request at once (see `begin`)."""
    cdef Plan p = _begin(
        request, ruleset, options.max_descriptors, options.max_entries, walks,
        options.shadow_mode, options.quota_mode,
    )
    _extend(p, ruleset.lookup, 0, len(p.descriptors))
    return _finish(p)


def planned(request, ruleset, options, stats):
    """`plan` for the service: refusals counted as service errors, the descriptors of an
    unknown domain in `domain_not_found`, and the items bound to their statistics (`bind`)."""
    return counted(
        request, ruleset, None, options.max_descriptors, options.max_entries,
        options.shadow_mode, options.quota_mode, stats, stats.service,
    )


cdef Plan counted(
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
    """The plan's statistics: `domain_not_found`, or each item's counters (`bind`)."""
    return _bound(p, stats)


cdef Plan _bound(Plan p, stats):
    cdef Py_ssize_t i
    if not p.found:
        stats.domain_not_found(p.domain, len(p.descriptors))
    else:
        _bind(p, None, stats, True)
    return p


def bind(Plan plan, stats_for, bint own):
    """Give each item the statistics its count goes to: its rule's own (`own`) when the stats
    key is the rule's, else `stats_for(stats key)` (a dynamic key, an override; a dry run's
    throwaway counters). Apart from `plan`, so that planning stays free of side effects."""
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
    # A request's own limit (`descriptor.limit`): no shadow, quota, name or metadata.
    requests_per_unit, unit = limit
    if not unit_seconds(unit):
        raise ServiceError(f"invalid rate limit override unit {unit}")
    key = domain + "." + ".".join([k + "_" + v if v else k for k, v in entries])
    return Rule(key, requests_per_unit, unit)

