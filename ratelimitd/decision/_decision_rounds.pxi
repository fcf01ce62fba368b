# Included by _decision.pyx: the two halves of an awaited decision around a store round
# started without a coroutine (`RateLimitService.decide` with a waiter: every Redis-backed
# call of the native transport), `Engine.send` and `Engine.received`. In C, so that such a
# call runs one Python frame (`decide`, the one way in) where it ran three (`decide`, its
# send half, `received`). The engine's attributes they use, set by the service:
# `start(ops, waiter)` the backend's `increment_later`; `later(ops, waiter)` when that
# cannot start the round (a task awaits `increment`); `answer(error, request, plan)` the
# service's one place where a failure becomes an answer; `enter()` raises Overloaded, past
# `most` decisions waiting on the store (MAX_INFLIGHT_DECISIONS; 0: no bound), which the
# engine counts (`in_flight`).
#
# A plan whose windows are all consumed fixed ones (the reference's counts) makes no `Op`:
# a store whose `increment_later` is a `Rounds` (Redis's, compiled) is handed each window's
# key, hits and seconds in C, and writes its own commands from them.

from cpython.mem cimport PyMem_Free, PyMem_Malloc

from ratelimitd.backends._rounds cimport Rounds


cdef object _send(Engine e, request, waiter):
    """The plan of `request` whose round is started (`waiter(results)` is called once it
    is over, and `_received` makes the answer), or the answer now: nothing to count, a
    refusal, a round that could not start."""
    cdef Plan p
    plan = None
    try:
        plan = _keyed(e, request)
        if type(plan) is not Plan:  # nothing to count
            return plan
        p = <Plan>plan
        if not p.names and not p.meters:
            return e.finish(request, p, ())
        if e.most and e.in_flight >= e.most:
            e.enter()  # raises Overloaded
        e.in_flight += 1
    except Exception as exc:
        return e.answer(exc, request, plan)
    try:
        if not _start(e, p, waiter):
            e.later(p.ops, waiter)
    except Exception as exc:
        return _received(e, request, p, exc)
    return p


cdef object _received(Engine e, request, Plan p, results):
    """The answer from the round's results: the store's list, or the exception the round
    raised (`answer`ed)."""
    e.in_flight -= 1
    if type(results) is list:
        return e.finish(request, p, results)
    return e.answer(results, request, p)


cdef object _keyed(Engine e, request):
    """`Engine.prepare` but the ops: the plan with its instant and store keys, or the
    response."""
    cdef Plan p
    planned = e._plan_or_answer(request)
    if type(planned) is not Plan:
        return planned
    p = <Plan>planned
    p.t = e._now()
    p.names = _collect(p, p.t, e.prefix, e.local, True)
    return p


cdef int _with_ops(Plan p, str prefix) except -1:
    """The store operations of a keyed plan (`plan.ops`, meters last)."""
    p.ops = _ops(p, p.names, p.t)
    if p.meters is not None:
        p.ops += _meter_ops(p, p.t, prefix)
    return 0


cdef bint _start(Engine e, Plan p, waiter) except -1:
    """Start the round of a keyed plan: through the store's C entry when it has one and
    every window is a consumed fixed one, else `start` on its ops (made here); False when
    the store cannot start it (`later`: a task awaits it)."""
    start = e.start
    if isinstance(start, Rounds) and not p.meters and _fixed(<Rounds>start, p, waiter):
        return True
    _with_ops(p, e.prefix)
    return start(p.ops, waiter)


cdef int _fixed(Rounds store, Plan p, waiter) except -1:
    """`store.fixed` on the plan's windows (hits and seconds per store key); 0, nothing
    started, when a window is not a consumed fixed one or the store declines."""
    cdef list names = p.names
    cdef Py_ssize_t n = len(names), j, k
    cdef long long small[16]
    cdef long long* numbers = small  # hits, seconds per window
    cdef Item item
    cdef tuple windows, w
    if n > 8:
        numbers = <long long*>PyMem_Malloc(2 * n * sizeof(long long))
        if numbers == NULL:
            raise MemoryError()
    try:
        for item in p.items:
            j = item.first
            if j < 0:  # answered from the local cache: no key
                continue
            if item.kind != K_CONSUME:
                return 0
            windows = item.windows
            for k in range(len(windows)):
                w = <tuple>windows[k]
                if <long long>w[W_ALGORITHM] != FIXED_WINDOW:
                    return 0
                numbers[2 * (j + k)] = item.hits
                numbers[2 * (j + k) + 1] = w[W_SECONDS]
        return store.fixed(names, numbers, waiter)
    finally:
        if numbers != small:
            PyMem_Free(numbers)
