# cython: language_level=3
# The plan step of the decision model, for the count and verdict (`_decision`), which
# cimports it: the plan's and items' fields are read as C struct members and the plan is
# made by C calls, so splitting the model in two modules costs no Python call.

# What an item's hits do to its windows (the Python names CONSUME, REFUND, BUDGET).
cdef enum:
    K_CONSUME = 0
    K_REFUND = 1
    K_BUDGET = 2

# The positions of a window tuple's fields (config.windows.Window; `_plan` checks them at
# import against its `_fields`).
cdef enum:
    W_LIMIT = 0
    W_ALGORITHM = 1
    W_SECONDS = 2
    W_REQUESTS = 3
    W_SUFFIX = 4
    W_TICK = 5
    W_TICKS = 6
    W_PER_SECOND = 7


from ratelimitd.budget.calls cimport Terms


cdef class Item:
    cdef public Py_ssize_t index  # the descriptor's position in the request
    cdef public object rule  # config.Rule (its `windows` are counted)
    cdef public str key  # the stats key
    cdef public object share  # share_threshold patterns replacing values in store keys
    cdef public long long hits
    cdef public int kind
    cdef public object stats  # stats.RuleStats, resolved by the caller before the count
    cdef public Py_ssize_t first  # the item's first op in `collect`'s list (-1: none)
    cdef public object status  # decided without the store (local cache)
    # A BUDGET item's call: (kind, transaction id, the budget's entries, force, remember),
    # `budget.calls.item_call`.
    cdef public object budget
    cdef public Terms terms  # a BUDGET item's rule's (`budget.calls.terms_of`); else None
    cdef readonly tuple windows  # the rule's (read once)


cdef class Plan:
    cdef public str domain
    cdef public list descriptors
    cdef public long long default_hits
    cdef public object root  # the domain's trie; None for an unknown domain
    cdef public bint found
    cdef public list items
    cdef public list unlimited  # descriptors with an unlimited rule
    cdef public list meters  # (descriptor, hits) to meter
    cdef public list metadata  # rule metadata by descriptor
    cdef public dict replaced  # replaced name -> the rule replacing it
    # /explain: per descriptor, (the walk (`match.lookup`'s; None for an override), the rule
    # found or None, its stats key); None unless asked.
    cdef public list walks
    cdef public bint cached  # set by `collect`: an item was answered from the local cache
    # The domain's budget calls: (phase key, transaction key, SHADOW_MODE, QUOTA_MODE); None
    # for a domain without budget rules. Closes are counted after the settles.
    cdef public object budget
    cdef public list closes
    # Set by `Engine.prepare`: the instant of the count, its store keys and operations.
    cdef public double t
    cdef public list names
    cdef public list ops


cdef object entries_of(object d)
cdef Plan counted(
    request, ruleset, lookup, Py_ssize_t max_descriptors, Py_ssize_t most, bint shadow,
    bint quota, stats, service,
)
