"""The circuit breaker's state machine (BACKEND_BREAKER_*), on a controlled
clock: opens after K consecutive failures, one probe at a time once the interval passed,
closed by the probe's success. Its use on a real Redis is in tests/redis/test_breaker.py."""

from __future__ import annotations

import asyncio

import pytest
from support.clock import Clock

from ratelimitd.backends.base import BackendError
from ratelimitd.backends.breaker import CLOSED, HALF_OPEN, OPEN, Breaker, BreakerOpen


class Store:
    """A store call whose outcome the test sets; counts how often it was asked."""

    def __init__(self) -> None:
        self.fail = False
        self.asked = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, value: int) -> int:
        self.asked += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise BackendError("redis request timed out")
        return value


def breaker(clock: Clock) -> Breaker:
    return Breaker("redis", 3, 1.0, clock=clock)


async def fail(b: Breaker, store: Store, calls: int) -> None:
    """`calls` calls through the breaker that the store, failing from now on, fails."""
    store.fail = True
    for _ in range(calls):
        with pytest.raises(BackendError):
            await b.call(store, 1)


async def tripped(clock: Clock) -> tuple[Store, Breaker]:
    """A breaker opened by three failures of its store (which still fails)."""
    store, b = Store(), breaker(clock)
    await fail(b, store, 3)
    assert b.state == OPEN
    return store, b


async def test_opens_after_k_consecutive_failures_only() -> None:
    store, b = Store(), breaker(Clock())
    await fail(b, store, 2)
    store.fail = False
    assert await b.call(store, 1) == 1  # a success resets the run
    await fail(b, store, 2)
    assert b.state == CLOSED
    with pytest.raises(BackendError):
        await b.call(store, 1)
    assert (b.state, b.state_name, b.opened) == (OPEN, "open", 1)


async def test_open_refuses_without_asking_then_one_probe_closes_it() -> None:
    clock = Clock()
    store, b = await tripped(clock)
    asked = store.asked
    store.fail = False
    for _ in range(5):
        with pytest.raises(BreakerOpen, match="circuit breaker open"):
            await b.call(store, 1)
    assert (store.asked, b.refused) == (asked, 5)
    clock.advance(1.0)
    assert await b.call(store, 7) == 7
    assert (b.state, store.asked) == (CLOSED, asked + 1)


async def test_half_open_lets_one_probe_through_at_a_time() -> None:
    clock = Clock()
    store, b = await tripped(clock)
    clock.advance(1.5)
    store.fail = False
    store.gate = asyncio.Event()
    probe = asyncio.ensure_future(b.call(store, 2))
    await asyncio.sleep(0)
    assert b.state == HALF_OPEN
    with pytest.raises(BreakerOpen):  # the probe is out: the others fail at once
        await b.call(store, 3)
    store.gate.set()
    assert await probe == 2
    assert b.state == CLOSED


async def test_a_failed_probe_opens_it_for_another_interval() -> None:
    clock = Clock()
    store, b = await tripped(clock)
    clock.advance(1.0)
    with pytest.raises(BackendError) as info:
        await b.call(store, 1)
    assert not isinstance(info.value, BreakerOpen)  # the probe asked the store
    assert b.state == OPEN
    clock.advance(0.5)
    with pytest.raises(BreakerOpen):
        await b.call(store, 1)
    clock.advance(0.5)
    store.fail = False
    assert await b.call(store, 1) == 1


async def test_a_cancelled_probe_gives_no_verdict() -> None:
    clock = Clock()
    store, b = await tripped(clock)
    clock.advance(1.0)
    store.gate = asyncio.Event()
    probe = asyncio.ensure_future(b.call(store, 1))
    await asyncio.sleep(0)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert (b.state, b.probing) == (OPEN, False)
    store.gate, store.fail = None, False
    assert await b.call(store, 5) == 5  # the next call probes at once
    assert b.state == CLOSED


async def test_failures_of_calls_from_before_it_opened_do_not_extend_it() -> None:
    clock = Clock()
    store, b = Store(), breaker(clock)
    store.gate = asyncio.Event()
    store.fail = True
    late = [asyncio.ensure_future(b.call(store, 1)) for _ in range(6)]
    await asyncio.sleep(0)
    store.gate.set()
    results = await asyncio.gather(*late, return_exceptions=True)
    assert all(isinstance(r, BackendError) for r in results)
    assert (b.state, b.opened) == (OPEN, 1)
    opened_at = b.opened_at
    assert opened_at == clock.now
