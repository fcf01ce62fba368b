# The budget maths of `memory_budget.py` compiled in Cython's pure-Python mode: the same source runs
# uncompiled where the extension is not built. The types here are what makes it fast: C
# integers for times and amounts (each bounded far below 2**63: times in ms, amounts under
# USED_MAX plus uint32 estimates, a sliding window's limit x ticks under 2**50 by the rule's
# tick), and attribute slots read in C.

cimport cython

from ratelimitd.backends.budget_txns cimport Txn, pop, push, read, spell

# The budget contract's constants (`config.budget_store`, `config.windows`), imported as C
# integers: a call compares with some twenty of them, each else a global lookup and an
# object comparison.
cdef int PEEK, COUNT, RESERVE, SETTLE, RELEASE
cdef int ADMITTED, REFUSED, DUPLICATE, SETTLED, FINISHED, ORPHAN, UNKNOWN_ID, CONTESTED, FULL
cdef long long FIXED_WINDOW, NEVER, SWEEP_BATCH, USED_MAX


cdef class _Limit:
    cdef readonly str name
    cdef readonly long long algorithm, ticks, tick, limit


cdef class _State:
    cdef public long long w, u, r, p, q

    cpdef _State copy(self)
    cpdef list fields(self)


cdef class _Budget:
    cdef public long long e
    cdef public long long queued
    cdef public long long d
    cdef public dict windows
    cdef public dict txns
    cdef public list due
    cdef public tuple starts
    cdef public str spelt

    cpdef _Budget copy(self)


@cython.locals(left=cython.longlong, pe=cython.longlong)
cpdef long long level(_Limit win, _State s, long long t) except? -1

@cython.locals(end=cython.longlong, c=cython.longlong, pe=cython.longlong, room=cython.longlong,
               ce=cython.longlong)
cpdef long long reset(_Limit win, _State s, long long t, long long asked, long long after) except? -1

@cython.locals(t=cython.longlong, start=cython.longlong, w=cython.longlong)
cdef long long _roll(_Limit win, _State s, long long now) except? -1

@cython.locals(est=cython.longlong, s=_State, win=_Limit, starts=tuple, i=cython.Py_ssize_t,
               k=cython.Py_ssize_t, start=cython.longlong)
cdef _end(_Budget b, list states, Txn txn, long long charge, tuple windows)

cdef _settle(_Budget b, str t, long long deadline, tuple limits, list states, Txn txn,
             long long charge, object out)

cdef _schedule(_Budget b, Txn x, str t, str state, long long estimate, str starts,
               long long deadline)

@cython.locals(last=tuple, k=cython.Py_ssize_t, s=_State, lim=_Limit, held_in=list)
cdef str _starts(_Budget b, tuple limits, list states)

@cython.locals(after=cython.longlong, t=cython.longlong, s=_State, win=_Limit,
               k=cython.Py_ssize_t)
cdef tuple _levels(tuple limits, list states, list ts, long long asked)

@cython.locals(x=Txn, due=list, txns=dict, swept=cython.int, ended=cython.longlong,
               charged_total=cython.longlong, est_total=cython.longlong,
               charge=cython.longlong, deadline=cython.longlong)
cdef bint _sweep(_Budget b, long long now, long long ttl, bint charge_expired, tuple limits,
                 list states, object result) except -1


@cython.final
cdef class MemoryBudgets:
    cdef public dict _budgets
    cdef list _forget
    cdef long long _next_forget
    cdef public long long max_budget_txns
    cdef public long long max_txns
    cdef public long long txns
    cdef object _windows
    cdef tuple _limits

    cpdef _run(self, object call, bint held=*)

    @cython.locals(b=_Budget, txn=Txn, record=Txn, s=_State, lim=_Limit, limits=tuple,
                   peek=cython.bint, stored=cython.bint, written=cython.bint,
                   full=cython.bint, fits=cython.bint, held_before=cython.Py_ssize_t,
                   asked=cython.longlong, e=cython.longlong, end=cython.longlong,
                   span=cython.longlong, ends=cython.longlong, after=cython.longlong,
                   k=cython.Py_ssize_t, states=list, levels=tuple, head=Txn)
    cpdef decide(self, int kind, str key, tuple windows, long long now, str txn_id,
                 long long amount, long long ttl, bint charge, bint force, bint remember,
                 bint unserved, bint held=*)

    cdef _drop_forgotten(self, long long now)
