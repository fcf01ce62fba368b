"""Redis going away, hanging and coming back: bounded failures, health, recovery."""

from __future__ import annotations

import asyncio
import time

import pytest
from support import wait_until

from ratelimitd.backends.base import BackendError, Op
from ratelimitd.backends.redis import RedisBackend
from ratelimitd.backends.redis.resp import STALL_FACTOR
from ratelimitd.messages import OK
from ratelimitd.settings import RedisSettings

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1000000}
"""

TIMEOUT = 0.05
# Margin for a loaded 2-core CI machine: the deadline timer fires on the event loop.
SLACK = 0.25


class LoopWatch:
    """Measures how long the event loop itself stalls (GC pauses, a starved CPU).

    Latency bounds are asserted as timeout + slack + stalls, so a loaded CI machine does
    not turn a correct bound into a flaky test.
    """

    def __init__(self) -> None:
        self.stalled = 0.0
        self._running = True
        self._task = asyncio.ensure_future(self._beat())

    async def _beat(self) -> None:
        while self._running:
            start = time.monotonic()
            await asyncio.sleep(0.005)
            self.stalled += max(0.0, time.monotonic() - start - 0.025)

    async def stop(self) -> None:
        self._running = False
        await self._task


async def timed(d, value: str) -> tuple[float, object]:
    start = time.monotonic()
    try:
        result: object = await d.decide("d", [("k", value)])
    except BackendError as exc:
        result = exc
    return time.monotonic() - start, result


async def served(d, value: str) -> bool:
    """True when a decision on (k, value) is served (no BackendError)."""
    _, result = await timed(d, value)
    return not isinstance(result, BackendError)


async def test_stopped_redis_fails_fast_and_recovers(servers, one_server) -> None:
    server, d = await one_server(
        CONFIG, REDIS_HEALTH_CHECK_ACTIVE_CONNECTION="true", REDIS_REQUEST_TIMEOUT="50ms"
    )
    assert (await d.decide("d", [("k", "a")])).overall_code == OK
    assert d.health.healthy()

    server.stop()
    await wait_until(lambda: not d.health.healthy(), timeout=15)
    watch = LoopWatch()
    for i in range(20):
        elapsed, result = await timed(d, f"down{i}")
        assert isinstance(result, BackendError), result
        assert elapsed < TIMEOUT + SLACK + watch.stalled
    await watch.stop()
    assert d.stat("ratelimit.service.call.should_rate_limit.redis_error") == 20
    assert d.stat("ratelimit.redis_pool.cx_active") == 0

    servers(port=server.port)  # Redis returns on the same address: no restart of ours

    await wait_until(lambda: served(d, "back"), timeout=15)
    await wait_until(lambda: d.stat("ratelimit.redis_pool.cx_active") == 2, timeout=15)
    assert d.health.healthy()
    assert d.stat("ratelimit.redis_pool.cx_total") >= 4


async def test_paused_redis_bounded_latency_no_pile_up(one_server) -> None:
    server, d = await one_server(
        CONFIG, REDIS_TIMEOUT="300ms", REDIS_POOL_SIZE="2", REDIS_REQUEST_TIMEOUT="50ms"
    )
    assert (await d.decide("d", [("k", "a")])).overall_code == OK
    pools = d.backend.main.pools()

    watch = LoopWatch()
    server.pause()
    try:
        worst = 0.0
        # Longer than STALL_FACTOR timeouts, so the hung connections are given up.
        deadline = time.monotonic() + TIMEOUT * STALL_FACTOR + 0.5
        rounds = 0
        while time.monotonic() < deadline:
            results = await asyncio.gather(*(timed(d, f"p{i}") for i in range(50)))
            rounds += 1
            for elapsed, result in results:
                assert isinstance(result, BackendError), result
                worst = max(worst, elapsed)
            # No request waits behind the hung server once its deadline passed: batches
            # still queued for their (late) replies have all been answered already.
            assert all(b.future.done() for p in pools for c in p.conns for b in c.pending)
        # Bounded by the request timeout, give or take what the loop lost to stalls.
        assert worst < TIMEOUT + SLACK + watch.stalled, (worst, watch.stalled)
        assert rounds > 3
        # The hung connections were closed locally and replaced (in the background).
        assert d.stat("ratelimit.redis_pool.cx_local_close") >= 1
    finally:
        server.resume()
        await watch.stop()

    await wait_until(lambda: served(d, "back"), timeout=15)
    assert server.client().get("d_k_back_" + str(int(time.time()) // 60 * 60)) is not None


def bounded_backend(server, **settings) -> RedisBackend:
    """A RedisBackend on `server` (RedisSettings `settings`) with 10 commands in flight at most
    per connection."""
    return RedisBackend(
        RedisSettings(type="single", socket_type="tcp", url=server.address, **settings),
        max_in_flight=10,
    )


async def test_in_flight_bound_fails_fast(servers) -> None:
    server = servers()
    backend = bounded_backend(server, pool_size=1, request_timeout=2.0)
    await backend.connect()
    try:
        server.pause()
        first = [asyncio.ensure_future(backend.increment([Op("a", 1, 60)])) for _ in range(3)]
        await asyncio.sleep(0)  # flushed: 6 commands in flight on the hung connection
        await asyncio.sleep(0)
        start = time.monotonic()
        with pytest.raises(BackendError, match="pipeline full"):
            await backend.increment([Op("b", 1, 60), Op("c", 1, 60), Op("d", 1, 60)])
        assert time.monotonic() - start < 0.5
        assert all(not f.done() for f in first)
        server.resume()
        assert [await f for f in first] == [[1], [2], [3]]
    finally:
        server.resume()
        await backend.close()


async def test_burst_is_split_over_connections_up_to_the_bound(servers) -> None:
    server = servers()
    backend = bounded_backend(server, pool_size=2)
    await backend.connect()
    try:
        ok = await asyncio.gather(*(backend.increment([Op("a", 1, 60)]) for _ in range(10)))
        assert sorted(r[0] for r in ok) == list(range(1, 11))
        assert backend.writes == 2  # two flushes of 10 commands, one per connection
        results = await asyncio.gather(
            *(backend.increment([Op("b", 1, 60)]) for _ in range(15)), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BackendError)]
        assert len(failed) == 5 and all("pipeline full" in str(e) for e in failed)
        assert server.client().get("b") == b"10"
    finally:
        await backend.close()


async def test_a_momentary_stall_fails_its_requests_but_keeps_the_connections(
    one_server,
) -> None:
    server, d = await one_server(CONFIG, REDIS_POOL_SIZE="2", REDIS_REQUEST_TIMEOUT="50ms")
    assert (await d.decide("d", [("k", "a")])).overall_code == OK
    closed_before = d.stat("ratelimit.redis_pool.cx_local_close")
    server.pause()
    try:
        results = await asyncio.gather(*(timed(d, f"s{i}") for i in range(20)))
        assert all(isinstance(r, BackendError) for _, r in results)
    finally:
        server.resume()
    # The late replies are read and dropped; the same connections serve what follows.
    for i in range(20):
        assert (await d.decide("d", [("k", f"after{i}")])).overall_code == OK
    assert d.stat("ratelimit.redis_pool.cx_local_close") == closed_before
