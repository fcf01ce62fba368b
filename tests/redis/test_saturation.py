"""Counters saturate on Redis: huge hits_addend never poisons a key.

Before: 2^64-1 was refused by INCRBY (`value is not an integer or out of range`) and a counter
at 2^63-1 failed every later INCRBY (`increment or decrement would overflow`) until its window
ended: every call on that key answered UNKNOWN, which Envoy's default failure_mode_deny=false
turns into no limit at all.
"""

from __future__ import annotations

import pytest
from support.core import suite_config

from ratelimitd.config import keys
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor

# d: k 10/hour fixed window, s sliding window, t token bucket (as tests/core/test_saturation.py).
CONFIG = suite_config("saturation")
HUGE = 2**64 - 1


@pytest.mark.parametrize("key", ["k", "s", "t"])
async def test_huge_hits_twice_then_the_key_still_decides(redis_server, decider, key) -> None:
    d = await decider({"REDIS_URL": redis_server.address}, CONFIG)
    for _ in range(3):
        r = await d.decide("d", Descriptor(((key, "a"),), None, HUGE))
        assert r.overall_code == OVER_LIMIT
    # Never an error: a fixed window counted the capped hits (over for the window); a sliding
    # window or a token bucket counts only what it admits, so the key is untouched.
    r = await d.decide("d", [(key, "a")])
    assert r.overall_code == (OVER_LIMIT if key == "k" else OK)
    assert (await d.decide("d", [(key, "b")])).overall_code == OK


async def test_a_counter_at_the_top_of_redis_range_saturates(redis_server, decider) -> None:
    d = await decider({"REDIS_URL": redis_server.address}, CONFIG)
    await d.decide("d", [("k", "a")])
    client = redis_server.client()
    (key,) = client.keys("*")
    client.set(key, keys.COUNTER_MAX - 1, keepttl=True)
    for _ in range(2):  # Redis refuses the INCRBY that would pass 2^63-1: saturated
        r = await d.decide("d", Descriptor((("k", "a"),), None, 5))
        assert r.overall_code == OVER_LIMIT
    assert int(client.get(key)) == keys.COUNTER_MAX - 1
    assert 0 < client.ttl(key) <= 3600  # its window still ends
    assert (await d.decide("d", [("k", "b")])).overall_code == OK


async def test_a_request_past_4096_descriptors_is_decided(redis_server, decider) -> None:
    """Its 2 x 5,000 commands exceed one connection's in-flight cap (8,192): before, `redis
    pipeline full`; now the flush goes to a connection under the cap."""
    d = await decider(
        {"REDIS_URL": redis_server.address, "MAX_DESCRIPTORS_PER_REQUEST": "5000"}, CONFIG
    )
    r = await d.decide("d", *[[("k", f"v{i}")] for i in range(5000)])
    assert r.overall_code == OK and len(r.statuses) == 5000
    assert len(redis_server.client().keys("*")) == 5000
