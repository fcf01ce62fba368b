"""A stalled Redis under BACKEND_FAILURE_POLICY, BACKEND_BREAKER_* and MAX_INFLIGHT_DECISIONS
what a decision is while the store fails, the breaker opening, probing and
closing, its stats and health detail, and the bound on decisions waiting on the store."""

from __future__ import annotations

import asyncio
import time

import pytest
from support import wait_until

from ratelimitd.backends.base import BackendError
from ratelimitd.backends.breaker import BreakerOpen
from ratelimitd.messages import OK, OVER_LIMIT
from ratelimitd.service import Overloaded

from .test_outages import served

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
"""

STALLED = {"REDIS_REQUEST_TIMEOUT": "50ms", "REDIS_TIMEOUT": "300ms"}
BREAKER = {"BACKEND_BREAKER_FAILURES": "3", "BACKEND_BREAKER_PROBE_INTERVAL": "200ms"}


async def codes(d, value: str, n: int) -> list[int]:
    return [(await d.decide("d", [("k", value)])).overall_code for _ in range(n)]


async def test_breaker_opens_answers_at_once_and_closes_after_one_probe(one_server) -> None:
    server, d = await one_server(CONFIG, **STALLED, **BREAKER)
    assert await codes(d, "a", 1) == [OK]
    assert d.health.detail()["breakers"] == {"redis": "closed"}
    server.pause()
    try:
        for _ in range(3):  # each waits for its REDIS_REQUEST_TIMEOUT
            with pytest.raises(BackendError) as info:
                await d.decide("d", [("k", "a")])
            assert not isinstance(info.value, BreakerOpen)
        assert d.stat("ratelimit.redis_pool.breaker_state") == 2
        assert d.health.detail()["breakers"] == {"redis": "open"}
        assert d.health.healthy()  # REDIS_HEALTH_CHECK_ACTIVE_CONNECTION is off: unchanged
        start = time.monotonic()
        for _ in range(100):
            with pytest.raises(BreakerOpen):
                await d.decide("d", [("k", "a")])
        assert time.monotonic() - start < 0.2  # no store round trip, no timeout
        assert d.stat("ratelimit.redis_pool.breaker_refused") == 100
        assert d.stat("ratelimit.service.call.should_rate_limit.redis_error") == 103
    finally:
        server.resume()

    await wait_until(lambda: served(d, "b"), timeout=15)
    assert d.health.detail()["breakers"] == {"redis": "closed"}
    assert d.stat("ratelimit.redis_pool.breaker_state") == 0
    assert d.stat("ratelimit.redis_pool.breaker_opened") == 1
    # Counted exactly once once the store is back: "b" was decided once, then twice more.
    assert await codes(d, "b", 2) == [OK, OVER_LIMIT]


async def clear_of_a_minute_boundary(margin: float = 5.0) -> None:
    """Let the calls that follow fall in one minute window of the daemon's clock: wait out
    the last `margin` seconds of a minute (the `local` policy's counter starts afresh at its
    end, so three calls straddling it were once answered OK, OK, OK)."""
    left = 60 - time.time() % 60
    if left < margin:
        await asyncio.sleep(left + 0.05)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("allow", [OK, OK, OK]), ("deny", [OVER_LIMIT] * 3), ("local", [OK, OK, OVER_LIMIT])],
)
async def test_policy_decides_while_the_store_fails(one_server, policy, expected) -> None:
    server, d = await one_server(CONFIG, BACKEND_FAILURE_POLICY=policy, **STALLED, **BREAKER)
    await clear_of_a_minute_boundary()
    server.pause()
    try:
        got = await codes(d, "x", 3)
        assert got == expected
        statuses = (await d.decide("d", [("k", "x")], [("other", "y")])).statuses
        if policy == "allow":
            assert statuses[0].rule is None  # no limit known: no headers either
        elif policy == "deny":
            assert (statuses[0].limit_remaining, 0 < statuses[0].duration_until_reset <= 60) == (
                0,
                True,
            )
        assert statuses[1].code == OK  # a descriptor without a limit stays OK
        assert d.stat("ratelimit.service.call.should_rate_limit.failure_policy") == 4
        assert d.stat("ratelimit.redis_pool.breaker_state") == 2  # later ones were instant
        # total_hits counted once per request, not again by the local store
        assert d.stat("ratelimit.service.rate_limit.d.k.total_hits") == 4
    finally:
        server.resume()


async def test_without_a_policy_or_breaker_nothing_changes(one_server) -> None:
    server, d = await one_server(CONFIG, **STALLED)
    assert "breakers" not in d.health.detail()
    assert d.stat("ratelimit.redis_pool.breaker_state") == 0  # no such gauge
    assert "ratelimit.redis_pool.breaker_state" not in d.stats.snapshot()
    server.pause()
    try:
        for _ in range(5):  # every one waits and fails: the reference's behaviour
            with pytest.raises(BackendError) as info:
                await d.decide("d", [("k", "a")])
            assert not isinstance(info.value, BreakerOpen)
        snap = d.stats.snapshot()
        assert "ratelimit.service.call.should_rate_limit.failure_policy" not in snap
    finally:
        server.resume()


async def test_in_flight_decisions_are_bounded(one_server) -> None:
    server, d = await one_server(CONFIG, REDIS_REQUEST_TIMEOUT="2s", MAX_INFLIGHT_DECISIONS="5")
    assert await codes(d, "a", 1) == [OK]
    server.pause()
    try:
        waiting = [asyncio.ensure_future(d.decide("d", [("k", f"w{i}")])) for i in range(5)]
        await asyncio.sleep(0.05)
        assert d.service.in_flight == 5
        start = time.monotonic()
        with pytest.raises(Overloaded, match="MAX_INFLIGHT_DECISIONS=5"):
            await d.decide("d", [("k", "more")])
        assert time.monotonic() - start < 0.1
        assert d.stat("ratelimit.service.call.should_rate_limit.overloaded") == 1
    finally:
        server.resume()
    assert [r.overall_code for r in await asyncio.gather(*waiting)] == [OK] * 5
    assert d.service.in_flight == 0
    assert await codes(d, "more", 1) == [OK]


async def test_per_second_instance_has_its_own_breaker(servers, decider) -> None:
    main, per_second = servers(), servers()
    config = CONFIG + "  - key: s\n    rate_limit: {unit: second, requests_per_unit: 100}\n"
    d = await decider(
        {
            "REDIS_URL": main.address,
            "REDIS_PERSECOND": "true",
            "REDIS_PERSECOND_URL": per_second.address,
            "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
            **STALLED,
            **BREAKER,
        },
        config,
    )
    per_second.pause()
    try:
        for _ in range(3):
            with pytest.raises(BackendError):
                await d.decide("d", [("s", "1")])
        assert d.health.detail()["breakers"] == {"redis": "closed", "redis_per_second": "open"}
        assert await codes(d, "m", 1) == [OK]  # the main instance still serves
    finally:
        per_second.resume()


async def test_after_a_restart_the_first_probe_closes_it(servers, one_server) -> None:
    # The pool's reconnect backoff may not have re-dialled yet when the probe is due: the
    # probe dials, so a store that is back closes the breaker within one probe interval.
    server, d = await one_server(
        CONFIG, **STALLED, BACKEND_BREAKER_FAILURES="1", BACKEND_BREAKER_PROBE_INTERVAL="500ms"
    )
    port = server.port
    server.close()
    await wait_until(lambda: not d.backend.main.pools()[0].conns, timeout=15)
    with pytest.raises(BackendError):
        await d.decide("d", [("k", "a")])
    assert d.health.detail()["breakers"] == {"redis": "open"}
    await asyncio.sleep(3)  # the maintainer's backoff grows towards its 1 s cap
    servers(port=port)
    assert await codes(d, "a", 1) == [OK]  # the probe, due already: it dials the new server
    assert d.health.detail()["breakers"] == {"redis": "closed"}
