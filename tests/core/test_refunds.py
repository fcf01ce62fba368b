"""Refunds: a descriptor's `is_negative_hits` (Envoy API v1.38, upstream #1140), memory backend.

Cases follow the reference's tests of #1140 (`test/redis/fixed_cache_impl_test.go`
TestNegativeHits*, `test/integration` TestNegativeHitsIntegration): the counter goes down by
the hits, floored at 0, a refund never creates a counter, always answers OK with
`max(0, limit - counter)`, counts only `total_negative_hits`, skips the local over-limit cache
and STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT's check. Beyond the reference (its open #1230):
the refund also drops the key from this process's local over-limit cache.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import counter, preset, suite_config

from ratelimitd.backends.memory import unpack
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor
from ratelimitd.service import ServiceError

# domain: key_value 10/s, basic 50/s, hour 10/h, two 10/min and 100/h, bucket 10/min token bucket.
CONFIG = suite_config("core_refunds")
KEY = "domain_key_value_1000000"
STAT = "ratelimit.service.rate_limit.domain.key_value."


def refund(*entries: tuple[str, str], hits: int) -> Descriptor:
    return Descriptor(tuple(entries), hits_addend=hits, is_negative_hits=True)


def consume(*entries: tuple[str, str], hits: int) -> Descriptor:
    return Descriptor(tuple(entries), hits_addend=hits)


def brief(st: Any) -> tuple:
    return (st.code, st.rule.requests_per_unit, st.limit_remaining, st.duration_until_reset)


async def test_a_refund_decrements_and_answers_the_remaining(harness: Any) -> None:
    # TestNegativeHits: counter 5, refund 3 -> 2, remaining 8.
    h = harness(CONFIG)
    preset(h, KEY, 5)
    r = await h.decide("domain", refund(("key", "value"), hits=3))
    assert r.overall_code == OK
    assert brief(r.statuses[0]) == (OK, 10, 8, 1)
    assert counter(h, KEY) == 2
    assert h.stat(STAT + "total_negative_hits") == 3
    assert h.stat(STAT + "total_hits") == 0
    assert h.stat(STAT + "within_limit") == h.stat(STAT + "over_limit") == 0


async def test_a_refund_is_floored_at_zero(harness: Any) -> None:
    # TestNegativeHitsFloorAtZero: counter 2, refund 5 -> 0, remaining 10.
    h = harness(CONFIG)
    preset(h, KEY, 2)
    r = await h.decide("domain", refund(("key", "value"), hits=5))
    assert brief(r.statuses[0]) == (OK, 10, 10, 1)
    assert counter(h, KEY) == 0
    assert h.stat(STAT + "total_negative_hits") == 5


async def test_a_refund_still_over_the_limit_answers_ok(harness: Any) -> None:
    # TestNegativeHitsStillOverLimitReturnsOK: counter 15, refund 3 -> 12 > 10: OK, remaining 0.
    h = harness(CONFIG)
    preset(h, KEY, 15)
    r = await h.decide("domain", refund(("key", "value"), hits=3))
    assert (r.overall_code, brief(r.statuses[0])) == (OK, (OK, 10, 0, 1))
    assert counter(h, KEY) == 12
    assert h.stat(STAT + "over_limit") == 0


async def test_a_refund_never_creates_a_counter(harness: Any) -> None:
    h = harness(CONFIG)
    r = await h.decide("domain", refund(("key", "value"), hits=3))
    assert brief(r.statuses[0]) == (OK, 10, 10, 1)
    assert counter(h, KEY) is None
    # hits 0 too: a refund of nothing reads the counter, it does not make one.
    r = await h.decide("domain", refund(("key", "value"), hits=0))
    assert counter(h, KEY) is None


async def test_a_refund_sets_the_ttl_again(harness: Any) -> None:
    h = harness(CONFIG)
    preset(h, "domain_hour_x_997200", 4, ttl=5)
    await h.decide("domain", refund(("hour", "x"), hits=1))
    assert h.backend.ttl("domain_hour_x_997200") == 3600


async def test_consume_refund_consume_the_integration_sequence(harness: Any) -> None:
    # TestNegativeHitsIntegration: 50/s; consume 5 -> 45, refund 3 -> 48, consume 1 -> 47.
    h = harness(CONFIG)
    r = await h.decide("domain", consume(("basic", "foo"), hits=5))
    assert r.statuses[0].limit_remaining == 45
    r = await h.decide("domain", refund(("basic", "foo"), hits=3))
    assert (r.overall_code, r.statuses[0].limit_remaining) == (OK, 48)
    r = await h.decide("domain", consume(("basic", "foo"), hits=1))
    assert r.statuses[0].limit_remaining == 47


async def test_a_refund_skips_and_clears_the_local_over_limit_cache(harness: Any) -> None:
    h = harness(CONFIG, local_cache_bytes=1 << 20)
    preset(h, KEY, 10)
    r = await h.decide("domain", [("key", "value")])  # 11: over, and cached as over
    assert r.overall_code == OVER_LIMIT
    assert h.local_cache.contains(KEY, 1_000_000)
    # TestNegativeHitsSkipsOverLimitCheck: the refund reaches the counter anyway...
    r = await h.decide("domain", refund(("key", "value"), hits=3))
    assert brief(r.statuses[0]) == (OK, 10, 2, 1)
    assert counter(h, KEY) == 8
    assert h.stat(STAT + "over_limit_with_local_cache") == 0
    # ...and, unlike the reference (#1230), the next request is decided by the counter.
    r = await h.decide("domain", [("key", "value")])
    assert brief(r.statuses[0]) == (OK, 10, 1, 1)
    assert counter(h, KEY) == 9


async def test_a_refund_skips_the_stop_increment_check(harness: Any) -> None:
    # TestNegativeHitsWithStopCacheKeyIncrementWhenOverlimit: counter 5, refund 3 -> 2.
    h = harness(CONFIG, stop_increment=True)
    preset(h, KEY, 5)
    r = await h.decide("domain", refund(("key", "value"), hits=3))
    assert brief(r.statuses[0]) == (OK, 10, 8, 1)
    assert counter(h, KEY) == 2


async def test_a_refund_is_decremented_even_beside_an_over_limit_key(harness: Any) -> None:
    # With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT the over key holds the others back; a
    # refund in the same request is not held back.
    h = harness(CONFIG, stop_increment=True)
    preset(h, KEY, 5)
    preset(h, "domain_hour_x_997200", 10)
    r = await h.decide("domain", [("hour", "x")], refund(("key", "value"), hits=3))
    assert [s.code for s in r.statuses] == [OVER_LIMIT, OK]
    assert counter(h, KEY) == 2


async def test_several_fixed_window_limits_are_all_refunded(harness: Any) -> None:
    h = harness(CONFIG)
    await h.decide("domain", consume(("two", "a"), hits=7))
    r = await h.decide("domain", refund(("two", "a"), hits=2))
    # The minute limit is the tighter one: 10 - 5.
    assert brief(r.statuses[0]) == (OK, 10, 5, 20)
    assert sorted(unpack(v)[0] for v in h.backend._counters.values()) == [5, 5]


async def test_a_refund_of_a_token_bucket_is_refused(harness: Any) -> None:
    h = harness(CONFIG)
    with pytest.raises(ServiceError, match="refunds apply to fixed-window limits only"):
        await h.decide("domain", refund(("bucket", "a"), hits=1))
    assert h.stat("ratelimit.service.call.should_rate_limit.service_error") == 1


async def test_the_request_level_hits_addend_is_refunded_too(harness: Any) -> None:
    h = harness(CONFIG)
    preset(h, KEY, 5)
    d = Descriptor((("key", "value"),), is_negative_hits=True)
    r = await h.decide("domain", d, hits_addend=4)
    assert brief(r.statuses[0]) == (OK, 10, 9, 1)
    assert h.stat(STAT + "total_negative_hits") == 4


async def test_the_sync_path_and_the_batch_path_agree(harness: Any) -> None:
    # Without a local cache the memory backend decides descriptor by descriptor; with one,
    # as one batch. A refund and a consumption of one key in one request: same result.
    for local in (0, 1 << 20):
        h = harness(CONFIG, local_cache_bytes=local)
        preset(h, KEY, 5)
        r = await h.decide(
            "domain", refund(("key", "value"), hits=3), consume(("key", "value"), hits=1)
        )
        assert [brief(s) for s in r.statuses] == [(OK, 10, 8, 1), (OK, 10, 7, 1)]
        assert counter(h, KEY) == 3
