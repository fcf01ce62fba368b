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


cdef object _send(Engine e, request, waiter):
    """The plan of `request` whose round is started (`waiter(results)` is called once it
    is over, and `_received` makes the answer), or the answer now: nothing to count, a
    refusal, a round that could not start."""
    cdef Plan p
    plan = None
    try:
        plan = e.prepare(request)
        if type(plan) is not Plan:  # nothing to count
            return plan
        p = <Plan>plan
        if not p.ops:
            return e.finish(request, p, ())
        if e.most and e.in_flight >= e.most:
            e.enter()  # raises Overloaded
        e.in_flight += 1
    except Exception as exc:
        return e.answer(exc, request, plan)
    try:
        if not e.start(p.ops, waiter):
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
