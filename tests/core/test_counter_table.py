"""The memory store's counter table agrees with the dict it replaces (its pure twin), and its
one-probe count (`TableBump`) with `keys.Bump` on a dict: the same operations, in random
order, give the same contents and the same counts."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ratelimitd.backends import counters
from ratelimitd.backends.memory import MemoryBackend, stored, unpack
from ratelimitd.config import keys

TWINS = ["compiled", "pure"]
NOW = 1_000_000


def table(name: str) -> Any:
    return counters.implementation(name).CounterTable()


@pytest.mark.parametrize("name", TWINS)
def test_random_operations_agree_with_a_dict(name: str) -> None:
    rng = random.Random(7)
    t, d = table(name), {}
    names = [f"d_user_{i:07d}_{NOW}" for i in range(3_000)]
    values: list[Any] = [0, 1, 2**32 + 5, 2**63 - 1, 2**63, 2**95, [(1, 2, 3), 7], [(4, 5), 8]]
    for _ in range(60_000):
        key = rng.choice(names)
        op = rng.random()
        if op < 0.45:
            value = rng.choice(values)
            t[key] = d[key] = value
        elif op < 0.75:  # backward-shift deletion keeps every other key reachable
            assert t.pop(key, None) == d.pop(key, None)
        elif op < 0.85 and key in d:
            del t[key], d[key]
        else:
            assert t.get(key) == d.get(key)
            assert (key in t) == (key in d)
    assert len(t) == len(d)
    assert dict(t.items()) == d and t == d
    assert sorted(t) == sorted(d) and sorted(t.keys()) == sorted(d)
    assert sorted(map(repr, t.values())) == sorted(map(repr, d.values()))
    copy = type(t)(t)
    assert copy == d and copy is not t
    t.clear()
    assert len(t) == 0 and t == {} and list(t) == []
    assert copy == d  # a copy owns its keys and values


@pytest.mark.parametrize("name", TWINS)
def test_the_mapping_errors_are_a_dicts(name: str) -> None:
    t = table(name)
    with pytest.raises(KeyError):
        t["absent"]
    with pytest.raises(KeyError):
        del t["absent"]
    with pytest.raises(KeyError):
        t.pop("absent")
    t["k"] = 5
    assert t.pop("k") == 5 and "k" not in t


def test_the_compiled_table_keys_are_strings() -> None:
    t = table("compiled")
    with pytest.raises(TypeError):
        t[1] = 5

    class Name(str):
        pass

    t[Name("k")] = 5
    assert t["k"] == 5 and type(next(iter(t))) is str


def test_a_held_value_lives_as_long_as_its_slot() -> None:
    t = table("compiled")
    state = [(1, 2), 3]
    t["s"] = state
    assert t["s"] is state
    t["s"] = 4  # the old object released, the int inline
    assert t["s"] == 4
    t["s"] = state
    del state
    assert t["s"] == [(1, 2), 3]


@pytest.mark.parametrize("name", TWINS)
def test_the_count_agrees_with_keys_bump_on_a_dict(name: str) -> None:
    """INCRBY + EXPIRE with creation, expiry, saturation and a state overwritten, on the
    table's count against the dict's."""
    rng = random.Random(11)
    twin = counters.implementation(name)
    ours = MemoryBackend(0, clock=lambda: NOW)
    ours._counters = twin.CounterTable()
    ours.increment_one = twin.TableBump(ours)
    oracle = MemoryBackend(0, clock=lambda: NOW)
    oracle._counters = {}
    oracle.increment_one = keys.Bump(oracle)
    names = [f"k{i}" for i in range(200)]
    for s in (ours, oracle):  # near the top: saturation, and counters past 31 bits
        s._counters["big"] = stored(keys.COUNTER_MAX - 3, NOW + 100)
        s._counters["wide"] = stored(2**31 - 2, NOW + 100)
        s._counters["state"] = [(1, 2), NOW + 100]
    now = NOW
    for _ in range(20_000):
        now += rng.random() < 0.01
        key = rng.choice([*names, "big", "wide", "state"])
        hits, seconds = rng.choice([0, 1, 1, 3, 2**31]), rng.choice([1, 5, 60])
        assert ours.increment_one(key, hits, seconds, now) == oracle.increment_one(
            key, hits, seconds, now
        )
    assert {k: unpack(v) for k, v in ours._counters.items()} == {
        k: unpack(v) for k, v in oracle._counters.items()
    }
    assert ours.used == oracle.used
