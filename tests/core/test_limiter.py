"""The limiter core on the memory backend, pinned to envoyproxy/ratelimit.

Cases follow `test/redis/fixed_cache_impl_test.go` (TestRedis, TestNearLimit,
TestOverLimitWithLocalCache, TestOverLimitWithLocalCacheShadowRule, TestRedisWithJitter,
TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig).
Where the Go tests make a mocked Redis answer a value, we preset the counter to
(answer - hits) so the memory backend's INCRBY answers the same.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import counter, preset, rule_counts, suite_config

from ratelimitd.backends import MemoryBackend, Op
from ratelimitd.backends.memory import stored
from ratelimitd.localcache import ENTRY_OVERHEAD, LocalCache
from ratelimitd.messages import MAX_UINT32, OK, OVER_LIMIT, Descriptor

# domain: key_value 10/s, key2_value2.subkey2_subvalue2 10/min, key3_value3 10/h with
# subkey3_subvalue3 10/day, key4_value4 15/h, key5_value5 14/h, shadow_value4 15/h in shadow
# mode; key-only s20, s8, s10 per second, zero 0/min, m10 10/min, w, mo, y 10 per week/month/year.
CONFIG = suite_config("core_limiter")


def stats(h: Any, key: str) -> dict[str, float]:
    """The six per-rule counters of stats key `domain.<key>`."""
    return h.rule_stats(f"domain.{key}")


def d(
    *entries: tuple[str, str], hits: int | None = None, limit: tuple[int, int] | None = None
) -> Descriptor:
    return Descriptor(tuple(entries), limit=limit, hits_addend=hits)


def brief(st: Any) -> tuple:
    """(code, requests_per_unit or None, remaining, duration_until_reset)."""
    return (
        st.code,
        st.rule.requests_per_unit if st.rule is not None else None,
        st.limit_remaining,
        st.duration_until_reset,
    )


# --- TestRedis ----------------------------------------------------------------------


async def test_single_second_limit_within(harness: Any) -> None:
    h = harness(CONFIG, now=1234)
    preset(h, "domain_key_value_1234", 4)
    r = await h.decide("domain", [("key", "value")], hits_addend=1)
    assert [brief(s) for s in r.statuses] == [(OK, 10, 5, 1)]
    assert stats(h, "key_value") == rule_counts(total=1, within=1)
    assert h.backend.ttl("domain_key_value_1234") == 1


async def test_no_limit_descriptor_is_ok_and_not_sent_to_the_backend(harness: Any) -> None:
    h = harness(CONFIG, now=1234)
    preset(h, "domain_key2_value2_subkey2_subvalue2_1200", 10)
    r = await h.decide(
        "domain",
        d(("key2", "value2"), hits=0),
        d(("key2", "value2"), ("subkey2", "subvalue2"), hits=1),
    )
    assert [brief(s) for s in r.statuses] == [(OK, None, 0, 0), (OVER_LIMIT, 10, 0, 60 - 1234 % 60)]
    assert stats(h, "key2_value2.subkey2_subvalue2") == rule_counts(total=1, over=1)
    assert set(h.backend._counters) == {"domain_key2_value2_subkey2_subvalue2_1200"}
    assert h.backend.ttl("domain_key2_value2_subkey2_subvalue2_1200") == 60


async def test_per_descriptor_hits_zero_checks_without_counting(harness: Any) -> None:
    h = harness(CONFIG)  # now 1_000_000
    preset(h, "domain_key3_value3_997200", 11, ttl=5)
    preset(h, "domain_key3_value3_subkey3_subvalue3_950400", 12)
    r = await h.decide(
        "domain",
        d(("key3", "value3"), hits=0),
        d(("key3", "value3"), ("subkey3", "subvalue3"), hits=1),
    )
    assert [brief(s) for s in r.statuses] == [(OVER_LIMIT, 10, 0, 800), (OVER_LIMIT, 10, 0, 36_800)]
    assert stats(h, "key3_value3") == rule_counts()
    assert stats(h, "key3_value3.subkey3_subvalue3") == rule_counts(total=1, over=1)
    # INCRBY 0 still happened: the counter is unchanged and its TTL refreshed to the unit.
    assert counter(h, "domain_key3_value3_997200") == 11
    assert h.backend.ttl("domain_key3_value3_997200") == 3600


async def test_hits_zero_on_an_absent_key_creates_it_at_zero(harness: Any) -> None:
    h = harness(CONFIG)
    r = await h.decide("domain", d(("key4", "value4"), hits=0))
    assert [brief(s) for s in r.statuses] == [(OK, 15, 15, 800)]
    assert counter(h, "domain_key4_value4_997200") == 0
    assert h.backend.ttl("domain_key4_value4_997200") == 3600
    assert stats(h, "key4_value4") == rule_counts()


async def test_request_hits_addend_zero_means_one(harness: Any) -> None:
    h = harness(CONFIG)
    await h.decide("domain", [("key4", "value4")], hits_addend=0)
    assert counter(h, "domain_key4_value4_997200") == 1
    assert stats(h, "key4_value4") == rule_counts(total=1, within=1)


async def test_per_descriptor_hits_beat_request_hits(harness: Any) -> None:
    h = harness(CONFIG)
    await h.decide("domain", d(("key4", "value4"), hits=2), d(("key5", "value5")), hits_addend=5)
    assert counter(h, "domain_key4_value4_997200") == 2
    assert counter(h, "domain_key5_value5_997200") == 5
    assert stats(h, "key4_value4")["total_hits"] == 2
    assert stats(h, "key5_value5")["total_hits"] == 5


# --- TestNearLimit: the over/near/within split ----------------------------------------


async def test_near_limit_sequence(harness: Any) -> None:
    h = harness(CONFIG)
    key = "domain_key4_value4_997200"
    preset(h, key, 10)
    r = await h.decide("domain", [("key4", "value4")])
    assert [brief(s) for s in r.statuses] == [(OK, 15, 4, 800)]
    assert stats(h, "key4_value4") == rule_counts(total=1, within=1)

    preset(h, key, 12)
    r = await h.decide("domain", [("key4", "value4")])
    assert [brief(s) for s in r.statuses] == [(OK, 15, 2, 800)]
    assert stats(h, "key4_value4") == rule_counts(total=2, near=1, within=2)

    # Going over counts over_limit; near_limit does not grow past the limit.
    preset(h, key, 15)
    r = await h.decide("domain", [("key4", "value4")])
    assert [brief(s) for s in r.statuses] == [(OVER_LIMIT, 15, 0, 800)]
    assert stats(h, "key4_value4") == rule_counts(total=3, over=1, near=1, within=2)


@pytest.mark.parametrize(
    ("key", "hits", "before", "status", "counts"),
    [
        ("s20", 3, 2, (OK, 20, 15, 1), rule_counts(total=3, within=3)),  # all under near
        ("s8", 2, 5, (OK, 8, 1, 1), rule_counts(total=2, near=1, within=2)),  # some over near
        ("s20", 3, 16, (OK, 20, 1, 1), rule_counts(total=3, near=3, within=3)),  # all over near
        (
            "s20",
            3,
            19,
            (OVER_LIMIT, 20, 0, 1),
            rule_counts(total=3, over=2, near=1),
        ),  # some over limit
        ("s20", 7, 15, (OVER_LIMIT, 20, 0, 1), rule_counts(total=7, over=2, near=4)),  # all three
        ("s10", 3, 27, (OVER_LIMIT, 10, 0, 1), rule_counts(total=3, over=3)),  # all over limit
        ("s10", 3, 7, (OK, 10, 0, 1), rule_counts(total=3, near=2, within=3)),  # lands on the limit
    ],
)
async def test_multi_hit_split(
    harness: Any, key: str, hits: int, before: int, status: tuple, counts: dict
) -> None:
    h = harness(CONFIG, now=1234)
    preset(h, f"domain_{key}_v_1234", before)
    r = await h.decide("domain", [(key, "v")], hits_addend=hits)
    assert [brief(s) for s in r.statuses] == [status]
    assert stats(h, key) == counts
    assert counter(h, f"domain_{key}_v_1234") == before + hits


async def test_counter_equal_to_limit_is_ok_with_zero_remaining(harness: Any) -> None:
    h = harness(CONFIG, now=1200)
    codes = []
    for _ in range(11):
        r = await h.decide("domain", [("m10", "x")])
        codes.append((r.statuses[0].code, r.statuses[0].limit_remaining))
    assert codes[9] == (OK, 0)
    assert codes[10] == (OVER_LIMIT, 0)
    assert [c[1] for c in codes[:10]] == list(range(9, -1, -1))
    # near threshold 8: hits 9 and 10 are near; hit 11 is over.
    assert stats(h, "m10") == rule_counts(total=11, over=1, near=2, within=10)


async def test_requests_per_unit_zero(harness: Any) -> None:
    h = harness(CONFIG, now=1200)
    r = await h.decide("domain", d(("zero", "a"), hits=0))
    assert [brief(s) for s in r.statuses] == [(OK, 0, 0, 60)]
    r = await h.decide("domain", [("zero", "a")])
    assert [brief(s) for s in r.statuses] == [(OVER_LIMIT, 0, 0, 60)]
    assert stats(h, "zero") == rule_counts(total=1, over=1)


async def test_key_only_rule_counts_each_value_separately_under_one_stats_key(harness: Any) -> None:
    h = harness(CONFIG, now=1200)
    await h.decide("domain", [("m10", "a")], [("m10", "b")], [("m10", "a")])
    assert counter(h, "domain_m10_a_1200") == 2
    assert counter(h, "domain_m10_b_1200") == 1
    assert stats(h, "m10") == rule_counts(total=3, within=3)


# --- windows, TTL, expiry -------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "window", "seconds"),
    [
        ("m10", 1714825800, 60),
        ("w", 1714608000, 604800),
        ("mo", 1713312000, 2592000),
        ("y", 1702944000, 31536000),
    ],
)
async def test_window_keys_and_ttl(harness: Any, key: str, window: int, seconds: int) -> None:
    now = 1714825815
    h = harness(CONFIG, now=now)
    r = await h.decide("domain", [(key, "v")])
    cache_key = f"domain_{key}_v_{window}"
    assert list(h.backend._counters) == [cache_key]
    assert h.backend.ttl(cache_key) == seconds  # TTL is the whole unit, not the window rest
    assert r.statuses[0].duration_until_reset == seconds - now % seconds


async def test_a_rules_key_follows_its_value_and_window(harness: Any) -> None:
    # The compiled count remembers a rule's last key: alternating values, and the next
    # window, each reach their own counter.
    h = harness(CONFIG, now=1200)
    for value in ("a", "b", "a", "a", "b"):
        await h.decide("domain", [("m10", value)])
    assert counter(h, "domain_m10_a_1200") == 3
    assert counter(h, "domain_m10_b_1200") == 2
    h.clock.now = 1260
    r = await h.decide("domain", [("m10", "a")])
    assert counter(h, "domain_m10_a_1260") == 1
    assert brief(r.statuses[0]) == (OK, 10, 9, 60)


async def test_window_rollover(harness: Any) -> None:
    h = harness(CONFIG, now=1200)
    for _ in range(10):
        await h.decide("domain", [("m10", "x")])
    h.clock.now = 1259
    r = await h.decide("domain", [("m10", "x")])
    assert brief(r.statuses[0]) == (OVER_LIMIT, 10, 0, 1)
    h.clock.now = 1260  # next window: a fresh counter
    r = await h.decide("domain", [("m10", "x")])
    assert brief(r.statuses[0]) == (OK, 10, 9, 60)
    assert counter(h, "domain_m10_x_1260") == 1
    assert counter(h, "domain_m10_x_1200") == 11


async def test_duration_until_reset_follows_the_clock(harness: Any) -> None:
    h = harness(CONFIG, now=2222)
    r = await h.decide("domain", [("m10", "x")], [("key", "value")])
    assert [s.duration_until_reset for s in r.statuses] == [58, 1]


async def test_ttl_is_refreshed_on_every_hit(harness: Any) -> None:
    h = harness(CONFIG, now=1200)
    await h.decide("domain", [("m10", "x")])
    h.clock.now = 1230
    assert h.backend.ttl("domain_m10_x_1200") == 30
    await h.decide("domain", [("m10", "x")])
    assert h.backend.ttl("domain_m10_x_1200") == 60


async def test_memory_backend_jitter_bounds() -> None:
    clock = [1000.0]
    backend = MemoryBackend(5, clock=lambda: clock[0])
    await backend.increment([Op(f"k{i}", 1, 60) for i in range(300)])
    ttls = {backend.ttl(f"k{i}") for i in range(300)}
    # EXPIRE unit + rand.Int63n(max): [unit, unit + max).
    assert ttls <= set(range(60, 65))
    assert len(ttls) > 1


async def test_memory_backend_without_jitter_ttl_is_exactly_the_unit() -> None:
    backend = MemoryBackend(0, clock=lambda: 1000.0)
    await backend.increment([Op("a", 1, 3600), Op("b", 2, 1)])
    assert (backend.ttl("a"), backend.ttl("b"), backend.ttl("absent")) == (3600, 1, -2)


async def test_memory_backend_reclaims_expired_keys() -> None:
    clock = [1000.0]
    backend = MemoryBackend(0, clock=lambda: clock[0])
    n = 200
    await backend.increment([Op(f"old{i}", 1, 1) for i in range(n)])
    assert len(backend) == n
    clock[0] = 1002.0
    assert await backend.get([Op("old0", 0, 1)]) == [0]
    # Reclaiming may be incremental (a bounded amount of work per call), never a full scan
    # per request: a bounded number of later increments reclaims every expired key.
    for _ in range(4 * n):
        await backend.increment([Op("live", 1, 60)])
        if len(backend) == 1:
            break
    assert list(backend._counters) == ["live"]


async def test_memory_backend_expired_counter_restarts_at_zero() -> None:
    clock = [1000.0]
    backend = MemoryBackend(0, clock=lambda: clock[0])
    assert await backend.increment([Op("k", 3, 1)]) == [3]
    clock[0] = 1001.0
    assert backend.ttl("k") == -2
    assert await backend.increment([Op("k", 2, 1)]) == [2]


# --- local cache (TestOverLimitWithLocalCache) ----------------------------------------


def gauges(h: Any) -> tuple:
    g = h.local_cache.gauges()
    return (g["hitCount"], g["missCount"], g["lookupCount"], g["expiredCount"], g["entryCount"])


@pytest.mark.parametrize("shadow", [False, True], ids=["rule", "shadow-rule"])
async def test_over_limit_with_local_cache(harness: Any, shadow: bool) -> None:
    h = harness(CONFIG, local_cache_bytes=1 << 20)
    k = "shadow" if shadow else "key4"
    key = f"domain_{k}_value4_997200"
    over = OK if shadow else OVER_LIMIT

    preset(h, key, 10)
    r = await h.decide("domain", [(k, "value4")])
    assert [brief(s) for s in r.statuses] == [(OK, 15, 4, 800)]
    assert stats(h, f"{k}_value4") == rule_counts(total=1, within=1)
    assert gauges(h) == (0, 1, 1, 0, 0)

    preset(h, key, 12)
    r = await h.decide("domain", [(k, "value4")])
    assert [brief(s) for s in r.statuses] == [(OK, 15, 2, 800)]
    assert stats(h, f"{k}_value4") == rule_counts(total=2, near=1, within=2)
    assert gauges(h) == (0, 2, 2, 0, 0)

    preset(h, key, 15)
    r = await h.decide("domain", [(k, "value4")])
    assert [brief(s) for s in r.statuses] == [(over, 15, 0, 800)]
    assert stats(h, f"{k}_value4") == rule_counts(
        total=3, over=1, near=1, within=2, shadow=int(shadow)
    )
    assert gauges(h) == (0, 3, 3, 0, 1)  # stored even for a shadow rule

    # Local-cache hit: no backend call at all (the counter stays at 16).
    r = await h.decide("domain", [(k, "value4")])
    assert [brief(s) for s in r.statuses] == [(over, 15, 0, 800)]
    assert counter(h, key) == 16
    assert stats(h, f"{k}_value4") == rule_counts(
        total=4, over=2, near=1, within=2, olwlc=1, shadow=2 if shadow else 0
    )
    assert gauges(h) == (1, 3, 4, 0, 1)


async def test_local_cache_hit_counts_all_hits_as_over(harness: Any) -> None:
    h = harness(CONFIG, local_cache_bytes=1 << 20, now=1200)
    preset(h, "domain_m10_x_1200", 10, ttl=60)
    await h.decide("domain", [("m10", "x")])  # 11: over, cached
    r = await h.decide("domain", [("m10", "x")], hits_addend=4)
    assert brief(r.statuses[0]) == (OVER_LIMIT, 10, 0, 60)
    assert counter(h, "domain_m10_x_1200") == 11
    assert stats(h, "m10") == rule_counts(total=5, over=5, olwlc=4)


async def test_local_cache_hit_does_not_stop_other_keys_without_stop_mode(harness: Any) -> None:
    h = harness(CONFIG, local_cache_bytes=1 << 20)
    preset(h, "domain_key4_value4_997200", 15)
    await h.decide("domain", [("key4", "value4")])
    r = await h.decide("domain", [("key4", "value4")], [("key5", "value5")])
    assert [s.code for s in r.statuses] == [OVER_LIMIT, OK]
    assert r.overall_code == OVER_LIMIT
    assert counter(h, "domain_key4_value4_997200") == 16
    assert counter(h, "domain_key5_value5_997200") == 1


async def test_local_cache_forgets_a_key_in_the_next_window(harness: Any) -> None:
    h = harness(CONFIG, local_cache_bytes=1 << 20, now=1200)
    preset(h, "domain_m10_x_1200", 10, ttl=60)
    await h.decide("domain", [("m10", "x")])
    h.clock.now = 1260
    r = await h.decide("domain", [("m10", "x")])
    assert brief(r.statuses[0]) == (OK, 10, 9, 60)
    assert counter(h, "domain_m10_x_1260") == 1
    assert stats(h, "m10")["over_limit_with_local_cache"] == 0


async def test_local_cache_disabled_always_asks_the_backend(harness: Any) -> None:
    h = harness(CONFIG, now=1200)
    assert h.local_cache is None
    preset(h, "domain_m10_x_1200", 10, ttl=60)
    for _ in range(3):
        await h.decide("domain", [("m10", "x")])
    assert counter(h, "domain_m10_x_1200") == 13
    assert stats(h, "m10") == rule_counts(total=3, over=3)


def test_local_cache_is_bounded_by_bytes() -> None:
    cache = LocalCache(10 * (ENTRY_OVERHEAD + 8))
    for i in range(100):
        cache.add(f"key{i:05d}", 2000)
    assert len(cache) == 10
    assert cache.gauges()["evacuateCount"] == 90
    # The oldest entries went first.
    assert cache.contains("key00099", 1000) and not cache.contains("key00000", 1000)


def test_local_cache_entry_larger_than_capacity_is_not_stored() -> None:
    cache = LocalCache(50)
    cache.add("x" * 30, 2000)  # 30 + 24 bytes
    assert len(cache) == 0


def test_local_cache_expiry_and_overwrite() -> None:
    cache = LocalCache(1 << 16)
    cache.add("k", 1060)
    cache.add("k", 1060)
    assert cache.contains("k", 1059)
    assert not cache.contains("k", 1060)
    g = cache.gauges()
    assert (
        g["overwriteCount"],
        g["expiredCount"],
        g["entryCount"],
        g["hitCount"],
        g["missCount"],
    ) == (1, 1, 0, 1, 1)


async def test_evicted_local_cache_entry_falls_back_to_the_backend(harness: Any) -> None:
    h = harness(CONFIG, local_cache_bytes=1, now=1200)
    h.local_cache.capacity = (
        ENTRY_OVERHEAD + 20
    )  # room for one key (the reference's least is 512 KiB)
    preset(h, "domain_m10_a_1200", 10, ttl=60)
    preset(h, "domain_m10_b_1200", 10, ttl=60)
    await h.decide("domain", [("m10", "a")])  # a cached
    await h.decide("domain", [("m10", "b")])  # b cached, a evicted
    assert len(h.local_cache) == 1
    r = await h.decide("domain", [("m10", "a")])
    assert r.statuses[0].code == OVER_LIMIT
    assert counter(h, "domain_m10_a_1200") == 12  # went to the backend again
    assert stats(h, "m10")["over_limit_with_local_cache"] == 0


# --- STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT ------------------------------------------


async def test_stop_increment_sequence(harness: Any) -> None:
    h = harness(CONFIG, stop_increment=True, local_cache_bytes=1 << 20)
    k4, k5 = "domain_key4_value4_997200", "domain_key5_value5_997200"
    preset(h, k4, 10)
    preset(h, k5, 10)

    def req(n: int) -> tuple[Descriptor, Descriptor]:
        return d(("key4", "value4"), hits=n), d(("key5", "value5"), hits=n)

    # Nothing would exceed: both incremented.
    r = await h.decide("domain", *req(1))
    assert [brief(s) for s in r.statuses] == [(OK, 15, 4, 800), (OK, 14, 3, 800)]
    assert stats(h, "key4_value4") == rule_counts(total=1, within=1)
    assert stats(h, "key5_value5") == rule_counts(total=1, within=1)
    assert gauges(h) == (0, 2, 2, 0, 0)

    r = await h.decide("domain", *req(2))
    assert [brief(s) for s in r.statuses] == [(OK, 15, 2, 800), (OK, 14, 1, 800)]
    assert stats(h, "key4_value4") == rule_counts(total=3, near=1, within=3)
    assert stats(h, "key5_value5") == rule_counts(total=3, near=2, within=3)
    assert (counter(h, k4), counter(h, k5)) == (13, 13)

    # key5 would exceed (13 + 2 > 14): only it is incremented; key4 reports as if counted.
    r = await h.decide("domain", *req(2))
    assert [brief(s) for s in r.statuses] == [(OK, 15, 2, 800), (OVER_LIMIT, 14, 0, 800)]
    assert (counter(h, k4), counter(h, k5)) == (13, 15)
    assert stats(h, "key4_value4") == rule_counts(total=5, near=2, within=5)
    assert stats(h, "key5_value5") == rule_counts(total=5, over=1, near=3, within=3)
    assert gauges(h)[4] == 1  # key5 went into the local cache

    # key5 is a local-cache hit: every other key gets INCRBY 0 (TTL still refreshed).
    preset(h, k4, 13, ttl=10)
    r = await h.decide("domain", *req(1))
    assert [brief(s) for s in r.statuses] == [(OK, 15, 2, 800), (OVER_LIMIT, 14, 0, 800)]
    assert (counter(h, k4), counter(h, k5)) == (13, 15)
    assert h.backend.ttl(k4) == 3600
    assert stats(h, "key4_value4") == rule_counts(total=6, near=3, within=6)
    assert stats(h, "key5_value5") == rule_counts(total=6, over=2, near=3, within=3, olwlc=1)


async def test_stop_increment_single_key_over(harness: Any) -> None:
    h = harness(CONFIG, stop_increment=True, now=1200)
    preset(h, "domain_m10_x_1200", 10, ttl=60)
    r = await h.decide("domain", [("m10", "x")])
    assert brief(r.statuses[0]) == (OVER_LIMIT, 10, 0, 60)
    assert counter(h, "domain_m10_x_1200") == 11  # a would-exceed key is incremented
    assert stats(h, "m10") == rule_counts(total=1, over=1)


async def test_stop_increment_absent_keys_wrap_before(harness: Any) -> None:
    # key5 at 14 would exceed; key4 is absent so INCRBY 0 answers 0 and before wraps.
    h = harness(CONFIG, stop_increment=True)
    preset(h, "domain_key5_value5_997200", 14)
    r = await h.decide("domain", d(("key4", "value4"), hits=3), d(("key5", "value5"), hits=1))
    assert [brief(s) for s in r.statuses] == [(OK, 15, 15, 800), (OVER_LIMIT, 14, 0, 800)]
    assert counter(h, "domain_key4_value4_997200") == 0
    assert stats(h, "key4_value4") == rule_counts(total=3, within=3)


async def test_stop_increment_off_increments_everything(harness: Any) -> None:
    h = harness(CONFIG)
    preset(h, "domain_key5_value5_997200", 14)
    await h.decide("domain", [("key4", "value4")], [("key5", "value5")])
    assert counter(h, "domain_key4_value4_997200") == 1
    assert counter(h, "domain_key5_value5_997200") == 15


# --- unlimited never reaches the limiter -------------------------------------------------


async def test_unlimited_is_not_counted(harness: Any) -> None:
    h = harness("domain: domain\ndescriptors:\n  - key: u\n    rate_limit: {unlimited: true}\n")
    r = await h.decide("domain", [("u", "x")])
    assert [brief(s) for s in r.statuses] == [(OK, None, MAX_UINT32, 0)]
    assert h.backend._counters == {}
    assert stats(h, "u") == rule_counts()


# --- cache keys end to end ----------------------------------------------------------------

# s: files_files/* 2/min shared, wild_foo* 2/min not shared, nested_parent.files_nested/* 5/min
# shared, k 5/min.
SHARED = suite_config("core_limiter_shared")


async def test_share_threshold_values_share_one_counter(harness: Any) -> None:
    h = harness(SHARED, now=1234)
    r = await h.decide("s", [("files", "files/a")], [("files", "files/b")], [("files", "files/c")])
    assert [s.code for s in r.statuses] == [OK, OK, OVER_LIMIT]
    assert list(h.backend._counters) == ["s_files_files/*_1200"]
    assert counter(h, "s_files_files/*_1200") == 3
    assert h.stat("ratelimit.service.rate_limit.s.files_files/*.total_hits") == 3


async def test_share_threshold_only_replaces_its_own_entry(harness: Any) -> None:
    h = harness(SHARED, now=1234)
    await h.decide("s", [("nested", "parent"), ("files", "nested/x")])
    assert list(h.backend._counters) == ["s_nested_parent_files_nested/*_1200"]


async def test_wildcard_without_share_counts_each_value(harness: Any) -> None:
    h = harness(SHARED, now=1234)
    r = await h.decide("s", [("wild", "foo1")], [("wild", "foo2")], [("wild", "foo1")])
    assert [s.code for s in r.statuses] == [OK, OK, OK]
    assert (counter(h, "s_wild_foo1_1200"), counter(h, "s_wild_foo2_1200")) == (2, 1)
    # One stats key (the pattern, `*` included) for all values.
    assert h.stat("ratelimit.service.rate_limit.s.wild_foo*.total_hits") == 3


async def test_cache_key_prefix_and_empty_value(harness: Any) -> None:
    h = harness(SHARED, now=1234, cache_key_prefix="prefix:")
    await h.decide("s", [("k", "")], [("k", "v")])
    assert sorted(h.backend._counters) == ["prefix:s_k__1200", "prefix:s_k_v_1200"]


async def test_same_key_twice_in_one_request_counts_twice(harness: Any) -> None:
    h = harness(SHARED, now=1234)
    r = await h.decide("s", [("k", "v")], [("k", "v")])
    assert [s.limit_remaining for s in r.statuses] == [4, 3]
    assert counter(h, "s_k_v_1200") == 2


async def test_near_limit_ratio_is_applied_in_float32(harness: Any) -> None:
    config = (
        "domain: n\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}"
    )
    h = harness(config, near_limit_ratio=0.29)
    h.backend._counters["n_k_v_997200"] = stored(28, 1_003_600)
    await h.decide("n", [("k", "v")], hits_addend=2)  # 28 -> 30; float32 threshold is 29
    assert h.stat("ratelimit.service.rate_limit.n.k.near_limit") == 1


def test_local_cache_capacity_is_the_references() -> None:
    """freecache: never under 512 KiB, 24 bytes per entry besides its key.
    A setting of 1000 bytes once cached nothing at 100 bytes per entry; the reference caches
    about 12,000 keys of 19 bytes there."""
    from ratelimitd.core import build_core
    from ratelimitd.localcache import MIN_CAPACITY, reference_capacity
    from ratelimitd.settings import CacheSettings, Settings

    assert reference_capacity(1000) == MIN_CAPACITY == 512 * 1024
    assert reference_capacity(64 << 20) == 64 << 20
    core = build_core(
        Settings(cache=CacheSettings(backend="memory", local_cache_size_in_bytes=1000))
    )
    cache = core.local_cache
    assert cache is not None and cache.capacity == MIN_CAPACITY
    for i in range(13_000):
        cache.add(f"domain_key_v{i:07d}", 2000)  # 19-byte keys: 43 bytes each
    assert len(cache) == MIN_CAPACITY // 43
