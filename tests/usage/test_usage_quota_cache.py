"""QuotaCache with controllable clocks: refresh bound, local hits, window moves, one read."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from support import Clock

from sidecars.common.ratelimit import QuotaCache
from sidecars.usage.store import StoreUnavailable


async def test_refresh_bound_local_hits_and_window_move() -> None:
    mono, wall = Clock(0.0), Clock(1000.0)
    stored = {"used": 3}
    reads = []

    async def probe(principal: object) -> tuple[int, int, float]:
        reads.append(mono.now)
        return stored["used"], 10, 2000.0

    cache = QuotaCache(probe, refresh=2.0, max_entries=10, clock=mono, wall_clock=wall)
    acct = SimpleNamespace(id="a", plan="free")
    assert await cache.state(acct) == (3, 10, 2000.0)
    cache.count(acct)
    cache.count(acct)
    stored["used"] = 7  # other workers' hits, not seen until the next read
    mono.now = 1.99
    assert (await cache.state(acct))[0] == 5 and reads == [0.0]
    mono.now = 2.0  # at most `refresh` seconds old
    assert (await cache.state(acct))[0] == 7 and reads == [0.0, 2.0]
    wall.now = 2000.0  # the window moved: read at once
    await cache.state(acct)
    assert reads == [0.0, 2.0, 2.0]


async def test_concurrent_requests_share_one_read_and_errors_propagate() -> None:
    gate = asyncio.Event()
    calls = 0

    async def probe(principal: object) -> tuple[int, int, float]:
        nonlocal calls
        calls += 1
        await gate.wait()
        if calls == 2:
            raise StoreUnavailable("down")
        return 1, 5, 1e12

    cache = QuotaCache(probe, refresh=0.0, max_entries=1)
    acct = SimpleNamespace(id="a", plan="free")
    tasks = [asyncio.create_task(cache.state(acct)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert [await t for t in tasks] == [(1, 5, 1e12)] * 5 and calls == 1
    with pytest.raises(StoreUnavailable):
        await cache.state(acct)
    # Bounded: the oldest account is dropped.
    other = SimpleNamespace(id="b", plan="free")
    await cache.state(other)
    assert list(cache._entries) == ["b"]


async def test_a_cancelled_reader_does_not_fail_the_requests_waiting_on_it() -> None:
    gate = asyncio.Event()
    calls = 0

    async def probe(principal: object) -> tuple[int, int, float]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(3600)  # the first reader's client goes away
        await gate.wait()
        return 2, 5, 1e12

    cache = QuotaCache(probe, refresh=0.0, max_entries=10)
    acct = SimpleNamespace(id="a", plan="free")
    first = asyncio.create_task(cache.state(acct))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cache.state(acct))
    await asyncio.sleep(0)
    first.cancel()
    gate.set()
    assert await waiter == (2, 5, 1e12) and calls == 2
    assert first.cancelled()
