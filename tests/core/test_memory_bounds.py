"""The memory backend holds at most MEMORY_MAX_KEYS keys (long keys count more).

Before: no bound. 10,000 new keys a second for 60 s added 146 MB; 300 unique 1 MB descriptor
values added 591 MB for the whole window (those are now refused by the request bounds:
tests/core/test_request_bounds_decoding.py).
"""

from __future__ import annotations

import asyncio

import pytest
from support.settings_env import error, load

from ratelimitd.backends.memory import KEY_UNIT, MemoryBackend
from ratelimitd.config.windows import SLIDING_WINDOW
from ratelimitd.runtime import allocator
from ratelimitd.runtime.allocator import Trimmer

NOW = 1_000_000


def store(max_keys: int, trimmer: Trimmer | None = None) -> MemoryBackend:
    return MemoryBackend(0, clock=lambda: NOW, max_keys=max_keys, trimmer=trimmer)


def test_a_full_store_evicts_the_keys_closest_to_expiry() -> None:
    s = store(64)
    for i in range(64):  # key i expires at NOW + 100 + i
        s.increment_one(f"k{i}", 1, 100 + i, NOW)
    assert len(s) == 64 and s.evicted == 0
    s.increment_one("new", 1, 1000, NOW)
    # The bound less its slack (1/64): the two that expire first made room.
    assert len(s) == 63 and s.evicted == 2
    assert s.ttl("k0") == -2 and s.ttl("k1") == -2 and s.ttl("k2") == 102
    assert s.ttl("new") == 1000


def test_expired_keys_go_before_live_ones() -> None:
    s = store(64)
    for i in range(60):
        s.increment_one(f"old{i}", 1, 10, NOW - 20)  # expired 10 s ago, not swept yet
    s._next_sweep = NOW + 100  # no sweep on the way: the bound must sweep itself
    for i in range(10):
        s.increment_one(f"live{i}", 1, 100, NOW)
    assert s.evicted == 0
    assert all(s.ttl(f"live{i}") == 100 for i in range(10))


def test_a_refreshed_key_is_not_evicted_for_its_old_expiry() -> None:
    s = store(4)
    s.increment_one("a", 1, 10, NOW)  # due at NOW + 10 ...
    for k in ("b", "c", "d"):
        s.increment_one(k, 1, 50, NOW)
    s.increment_one("a", 1, 500, NOW)  # ... refreshed: now due at NOW + 500
    s.increment_one("e", 1, 60, NOW)
    assert s.ttl("a") == 500 and s.ttl("b") == -2


def test_long_keys_count_once_per_started_256_bytes() -> None:
    s = store(16)
    long = "x" * (3 * KEY_UNIT)  # 4 units each
    for i in range(4):
        s.increment_one(f"{i}{long}", 1, 100 + i, NOW)
    assert s.used == 16 and s.evicted == 0
    s.increment_one("short", 1, 1000, NOW)
    assert s.used <= 16 and s.evicted == 1


def test_sliding_and_token_states_are_bounded_too() -> None:
    s = store(32)
    for i in range(100):
        s.decide_now(f"w{i}", SLIDING_WINDOW, 1, 1000, 10, 1000, NOW * 1000, NOW)
    assert len(s) <= 32 and s.evicted >= 68


def test_the_dict_is_rebuilt_and_memory_handed_back_after_a_flood() -> None:
    freed: list[int] = []
    trimmer = Trimmer(after=1, release=lambda: freed.append(1) or True)
    s = MemoryBackend(0, clock=lambda: NOW, trimmer=trimmer)
    for i in range(70_000):
        s.increment_one(f"flood{i}", 1, 5, NOW)
    table = s._counters
    s.increment_one("after", 1, 100, NOW + 10)  # the sweep drops the flood
    assert len(s) == 1 and s.used == 1
    assert s._counters is not table  # a new, small dict
    assert freed


def test_the_setting() -> None:
    assert load().cache.memory_max_keys == 1_000_000
    assert load(MEMORY_MAX_KEYS="5000").cache.memory_max_keys == 5000
    assert error(MEMORY_MAX_KEYS="0") == (
        "MEMORY_MAX_KEYS: invalid value '0' (expected an integer 1-2147483647)"
    )
    assert "has no effect with BACKEND_TYPE=redis" in error(
        BACKEND_TYPE="redis", MEMORY_MAX_KEYS="5000"
    )
    env = {"BACKEND_TYPE": "redis", "BACKEND_FAILURE_POLICY": "local", "MEMORY_MAX_KEYS": "9"}
    assert load(**env).cache.memory_max_keys == 9


@pytest.mark.parametrize("name", ["MAX_DESCRIPTOR_VALUE_LENGTH"])
def test_the_value_length_setting(name: str) -> None:
    assert load().reload.max_value_length == 4096
    assert load(**{name: "64"}).reload.max_value_length == 64
    assert error(**{name: "x"}).startswith(f"{name}: invalid value 'x'")


async def test_the_trimmer_trims_after_enough_is_freed_and_when_freeing_stops() -> None:
    now = [100.0]
    trims: list[float] = []
    t = Trimmer(
        after=800,
        interval=1.0,
        quiet=0.05,
        clock=lambda: now[0],
        release=lambda: trims.append(now[0]) or True,
    )
    t.freed(50)  # under an eighth: nothing
    t.freed(850)  # past `after`: at once
    assert trims == [100.0]
    t.freed(900)  # again, but within the interval: at its end
    assert trims == [100.0]
    now[0] = 101.5
    t.freed(1)
    assert trims == [100.0, 101.5]
    t.freed(200)  # an eighth or more: once the freeing has stopped
    assert len(trims) == 2
    assert t.wake == 800  # until then only a full `after` changes anything
    await asyncio.sleep(0.1)
    assert len(trims) == 3 and t.pending == 0
    assert t.wake == 100


def test_tune_fixes_the_mmap_threshold_under_glibc() -> None:
    assert allocator.tune() is True  # Debian: glibc
    assert allocator.trim() in (True, False)
