# The types of `calls.py` compiled in Cython's pure-Python mode (the same source runs
# uncompiled where the extension is not built). The decision (`_plan`, `_decision`) cimports
# these: a budget call's recognition, key, store call and status are then C calls, not
# Python calls. (Its items stay objects here: the budget layer is below the decision's.)

cimport cython

from ratelimitd.backends.memory_budget cimport MemoryBudgets
from ratelimitd.config._keys cimport refuse, state_key, verdict

# The budget contract's constants (`config.budget_store`) imported as C integers, as
# `memory_budget.pxd` does: compared on every budget call.
cdef int ADMITTED, COUNT, DUPLICATE, EXTRA, FULL, GUARD, ORPHAN, RELEASE, RESERVE, SETTLE
cdef int SETTLED
cdef long long MAX_TXN_BYTES, TOO_MANY_REQUESTS


# Strings, tuples and C flags: held on a rule (`Rule.budget_terms`) and read in C.
@cython.final
cdef class Terms:
    cdef readonly str full_key, outbox
    cdef readonly tuple windows, limits, requests, ticks
    cdef readonly long long ttl
    cdef readonly bint charge, served, shadow, quota


cpdef Terms terms_of(rule)


@cython.locals(kind=cython.int, txn=str, rest=list, i=cython.Py_ssize_t, entry=tuple, key=str,
               phases=dict)
cpdef tuple recognise(entries, str phase_key, str transaction_key)

cpdef tuple lookup(find, root, str domain, entries, tuple keys, list walked)

@cython.locals(size=cython.Py_ssize_t)
cpdef str transaction_id(str value)

@cython.locals(shadow=cython.bint, quota=cython.bint)
cpdef tuple item_call(tuple call, Terms terms, entries, bint negative, tuple keys)

cpdef bint held_apart(int kind)

@cython.locals(kind=cython.int, closes=list, parts=dict, got=list, kept=set)
cpdef arrange(list held, list items, list metadata)

@cython.locals(crc=cython.uint, readable=str)
cpdef str budget_key(str prefix, str domain, entries, share)

@cython.locals(kind=cython.int, amount=cython.longlong, unserved=cython.bint, asked=tuple,
               terms=Terms)
cpdef object budget_call(item, str key, long long now_ms)

@cython.locals(memory=MemoryBudgets, kind=cython.int, amount=cython.longlong,
               unserved=cython.bint, asked=tuple)
cpdef object budget_now(run, item, tuple asked, Terms terms, long long hits, str key,
                        long long now_ms)

cdef bint _unserved(bint served, long long code)

@cython.locals(k=cython.Py_ssize_t, best_over=cython.bint, best_after=cython.longlong,
               best_reset=cython.longlong, best_left=cython.longlong, after=cython.longlong,
               ticks=cython.longlong, wait=cython.longlong, left=cython.longlong,
               over=cython.bint, kind=cython.int, outcome=cython.int, hits=cython.longlong,
               levels=tuple, limits=tuple, allowed=tuple, tick_ms=tuple, tick=cython.longlong,
               requests=cython.longlong)
cpdef object status_of(tuple asked, Terms terms, long long hits, st, object result, double ratio)

cpdef object budget_status(item, object result, double ratio)
