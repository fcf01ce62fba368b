"""Token budgets while Redis hangs: BACKEND_FAILURE_POLICY decides a reserve; a stream end
the store could not take is kept in a bounded buffer and sent again once it is back, and
charged once either way: the call never reached the store (its retry settles), or it did
and only its reply was lost (its retry finds the transaction finished)."""

from __future__ import annotations

import pytest
from support import wait_until
from support.budget import Budget

from ratelimitd.backends.base import BackendError
from ratelimitd.messages import OK, OVER_LIMIT

CONFIG = """
domain: llm
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10000}
    budget: {}
"""
STALLED = {"REDIS_REQUEST_TIMEOUT": "50ms", "REDIS_TIMEOUT": "300ms"}
RETRIED = "ratelimit.service.budget.retried"
DROPPED = "ratelimit.service.budget.retry_dropped"


def held_writes(server) -> int:
    """How many of the server's clients wait with a budget write (CLIENT PAUSE holds it): a
    script's call, or a claim or charge of a budget kept in plain commands."""
    clients = server.command("CLIENT", "LIST")
    return sum(clients.count(b"cmd=" + c) for c in (b"evalsha", b"hincrby", b"incrby"))


async def reachable(b: Budget) -> bool:
    try:
        await b.held()
    except BackendError:
        return False
    return True


@pytest.mark.parametrize("policy", ["error", "allow", "deny", "local"])
async def test_the_failure_policy_decides_a_reserve(one_server, policy: str) -> None:
    server, d = await one_server(CONFIG, BACKEND_FAILURE_POLICY=policy, **STALLED)
    b = Budget(d)
    assert (await b.reserve("warm", 1)).overall_code == OK
    server.pause()
    try:
        if policy == "error":  # Envoy's failure_mode_deny decides
            with pytest.raises(BackendError):
                await b.reserve("t1", 700)
        else:
            answer = await b.reserve("t1", 700)
            # local: this process's memory budgets decide (700 of 10,000 fits).
            assert answer.overall_code == (OVER_LIMIT if policy == "deny" else OK)
    finally:
        server.resume()
    await wait_until(lambda: reachable(b), timeout=15)
    # Whether or not the hung reserve reached the store, its stream end charges the
    # usage once (a settle of an unknown transaction is charged as it comes).
    await b.end("warm", 1)
    await b.end("t1", 500)
    await b.end("t1", 500)
    assert await b.held() == (501, 0)


async def test_a_stream_end_the_store_missed_is_retried_and_charged_once(one_server) -> None:
    server, d = await one_server(CONFIG, **STALLED)
    b = Budget(d)
    assert (await b.reserve("t1", 700)).overall_code == OK
    assert (await b.reserve("t2", 900)).overall_code == OK
    server.pause()
    try:
        # Envoy discards a stream end's answer: the error is the service's to ride out.
        with pytest.raises(BackendError):
            await b.end("t1", 500)
        with pytest.raises(BackendError):
            await b.end("t2", None)
        assert len(d.service.stream_ends) == 3  # t1's settle and close, t2's close
    finally:
        server.resume()
    await wait_until(lambda: len(d.service.stream_ends) == 0, timeout=15)
    assert d.stat(RETRIED) == 3
    # Whether the hung calls reached Redis when it woke (they were written before it
    # hung) or only their retries did, each is applied once: t1's usage, and t2's
    # reservation (its close after a 200 without usage charges it: charge_served).
    assert await b.held() == (500 + 900, 0)
    assert d.stat("ratelimit.service.call.should_rate_limit.redis_error") == 2
    await b.end("t1", 500)  # and Envoy's own duplicate changes nothing either
    assert await b.held() == (500 + 900, 0)


async def test_the_retry_buffer_is_bounded(one_server) -> None:
    server, d = await one_server(CONFIG, **STALLED)
    b = Budget(d)
    d.service.stream_ends.capacity = 3
    for txn in ("t1", "t2"):
        assert (await b.reserve(txn, 100)).overall_code == OK
    server.pause()
    try:
        for txn in ("t1", "t2"):
            with pytest.raises(BackendError):
                await b.end(txn, 60)
        # The oldest call goes first; dropped calls are counted.
        assert (len(d.service.stream_ends), d.stat(DROPPED)) == (3, 1)
    finally:
        server.resume()
    await wait_until(lambda: len(d.service.stream_ends) == 0, timeout=15)
    assert d.stat(RETRIED) == 3


async def test_a_stream_end_that_never_reached_the_store_is_settled_by_its_retry(
    one_server,
) -> None:
    server, d = await one_server(CONFIG, **STALLED)
    b = Budget(d)
    assert (await b.reserve("t1", 700)).overall_code == OK
    # Writes held by the server until the client gives the connection up: the held call is
    # dropped with it, so only the retry reaches the store.
    server.command("CLIENT", "PAUSE", "60000", "WRITE")
    try:
        with pytest.raises(BackendError):
            await b.end("t1", 500)
        await wait_until(lambda: not held_writes(server), timeout=20)
    finally:
        server.command("CLIENT", "UNPAUSE")
    await wait_until(lambda: len(d.service.stream_ends) == 0, timeout=20)
    assert await b.held() == (500, 0)
    s = b.series()  # the retry's own answer counted: exact
    assert (s["budget_reserved"], s["budget_charged"], s["budget_settled"]) == (0, 500, 1)
