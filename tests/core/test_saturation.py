"""Counters saturate, they never overflow, on the memory backend and in the
decision maths, compiled and pure.

A per-descriptor hits_addend of 2^64-1 sent twice once made every later call on that key fail
until the window ended (`Python int too large to convert to C unsigned long`), which Envoy's
default failure_mode_deny=false turns into no limit at all. The rule (docs/compatibility.md,
"counters saturate"): one descriptor's hits are capped at MAX_HITS (2^32, past any uint32 limit by
itself) and a counter never passes COUNTER_MAX (2^63-1, Redis' signed range).
"""

from __future__ import annotations

import pytest
from support.core import memory_decider, suite_config

from ratelimitd.config import keys
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor

# d: k 10/hour fixed window, s sliding window, t token bucket (as tests/redis/test_saturation.py).
CONFIG = suite_config("saturation")
HUGE = 2**64 - 1


def test_the_caps() -> None:
    assert keys.MAX_HITS == 2**32
    assert keys.COUNTER_MAX == 2**63 - 1


@pytest.mark.parametrize("impl", ["compiled", "pure"])
@pytest.mark.parametrize("key", ["k", "s", "t"])
async def test_huge_hits_twice_then_the_key_still_decides(impl: str, key: str) -> None:
    d = memory_decider(CONFIG, impl=impl)
    for _ in range(3):
        r = await d.decide("d", Descriptor(((key, "a"),), None, HUGE))
        assert r.overall_code == OVER_LIMIT
    # Never an error: a fixed window counted the capped hits (over for the window); a sliding
    # window or a token bucket counts only what it admits, so the key is untouched.
    r = await d.decide("d", [(key, "a")])
    assert r.overall_code == (OVER_LIMIT if key == "k" else OK)
    assert (await d.decide("d", [(key, "b")])).overall_code == OK  # other keys untouched
    assert d.stat(f"ratelimit.service.rate_limit.d.{key}.total_hits") == 3 * keys.MAX_HITS + 2


@pytest.mark.parametrize("impl", ["compiled", "pure"])
async def test_a_counter_stops_at_counter_max(impl: str) -> None:
    d = memory_decider(CONFIG, impl=impl)
    await d.decide("d", [("k", "a")])
    (key,) = [k for k in d.backend._counters]
    d.backend._counters[key][0] = keys.COUNTER_MAX - 1
    for _ in range(2):
        r = await d.decide("d", Descriptor((("k", "a"),), None, HUGE))
        assert r.overall_code == OVER_LIMIT
    assert d.backend._counters[key][0] == keys.COUNTER_MAX


@pytest.mark.parametrize("impl", ["compiled", "pure"])
def test_the_status_maths_take_the_extremes(impl: str) -> None:
    k = keys.implementation(impl)
    top = keys.COUNTER_MAX
    assert k.evaluate(10, keys.MAX_HITS, top, k.near_threshold(10, 0.8))[0] is True
    assert k.evaluate(2**32 - 1, keys.MAX_HITS, keys.MAX_HITS, 0)[0] is True
