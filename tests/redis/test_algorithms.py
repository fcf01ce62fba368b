"""Sliding windows, token buckets, N-unit windows and several limits on a real Redis (and the
same scenarios on the memory backend): exact bounds under 200 concurrent callers.

The limiter's clock drives the decisions (the scripts take the time as an argument), so
the windows are exact even on Redis: each round sets the clock and lets 200 callers ask at
once. The scripts' maths is checked against the pure twin on random sequences, and the
NOSCRIPT fallback after SCRIPT FLUSH. The daemon (2 workers, real time) is in
tests/daemon/test_algorithms.py.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from support import Clock
from support.core import suite_config

from ratelimitd.backends.base import Op
from ratelimitd.config import _keys_py
from ratelimitd.config.windows import SLIDING_WINDOW, TOKEN_BUCKET
from ratelimitd.messages import OK, OVER_LIMIT

T0 = 1_000_000.0
CALLERS = 200

# api: fixed, sliding and bucket 20/s; two 20/s token bucket and 50 per 4 s (per_4s); pair 3
# per 2 s.
CONFIG = suite_config("redis_algorithms")

# Rounds at T0 + 0, 0.25, ... 3.75 (four 1-second windows), 200 callers each.
ROUNDS = [T0 + 0.25 * i for i in range(16)]
# fixed: 20 per window. sliding: the first window 20, then the previous window weighs
# ceil(p x left/1000) (worked out in the README's example): 15, 16, 16. token bucket: the
# burst of 20, then 5 tokens per 0.25 s for 15 rounds. two limits: every limit counts every
# hit, so the 4-second window (50) is over after the first round and decides until it ends.
EXPECTED = {
    "fixed": [20, 0, 0, 0] * 4,
    "sliding": [20, 0, 0, 0, 0, 5, 5, 5, 5, 3, 4, 4, 4, 4, 4, 4],
    "bucket": [20] + [5] * 15,
    "two": [20] + [0] * 15,
}


@pytest.fixture(params=["memory", "redis"])
async def decide(request: pytest.FixtureRequest, harness: Any, redis_server: Any, decider: Any):
    """decide(key) -> Status, on the memory backend or a real Redis; and the clock."""
    clock = Clock(T0)
    if request.param == "memory":
        h = harness(CONFIG)
        h.clock = clock
        h.limiter.clock = h.service.clock = h.backend._clock = clock
        service = h.service
    else:
        d = await decider({"REDIS_URL": redis_server.address}, CONFIG, clock=clock)
        service = d.service
    from ratelimitd.messages import Descriptor, Request

    async def one(key: str, value: str = "a") -> Any:
        response = await service.should_rate_limit(Request("api", [Descriptor(((key, value),))]))
        return response.statuses[0]

    one.clock = clock  # type: ignore[attr-defined]
    return one


async def rounds(decide: Any, key: str, times: list[float]) -> list[int]:
    admitted = []
    for t in times:
        decide.clock.now = t
        statuses = await asyncio.gather(*(decide(key) for _ in range(CALLERS)))
        admitted.append(sum(s.code == OK for s in statuses))
    return admitted


@pytest.mark.parametrize("key", sorted(EXPECTED))
async def test_200_callers_admit_exactly_the_bound(decide: Any, key: str) -> None:
    admitted = await rounds(decide, key, ROUNDS)
    assert admitted == EXPECTED[key]
    per_window = [sum(admitted[i : i + 4]) for i in range(0, 16, 4)]
    if key == "fixed":
        assert per_window == [20] * 4
    if key == "sliding":  # never more than the limit in one window
        assert per_window == [20, 15, 16, 16]
    if key == "bucket":  # burst + refill over 3.75 s
        assert sum(admitted) == 20 + int(3.75 * 20)


async def test_boundary_burst(decide: Any) -> None:
    late = await rounds(decide, "sliding", [T0 + 0.9])
    after = await rounds(decide, "sliding", [T0 + 1.05])
    assert (late, after) == ([20], [1])
    fixed = await rounds(decide, "fixed", [T0 + 0.9, T0 + 1.05])
    assert fixed == [20, 20]


async def test_multiplier_window_across_the_unit_boundary(decide: Any) -> None:
    assert await rounds(decide, "pair", [T0 + 0.5, T0 + 1.5, T0 + 2.1]) == [3, 0, 3]


async def test_second_limit_decides_with_its_name(decide: Any) -> None:
    decide.clock.now = T0
    first = [await decide("two") for _ in range(20)]
    assert {s.rule.name for s in first} == {""}  # the bucket has the least left
    decide.clock.now = T0 + 1
    assert [(await decide("two")).code for _ in range(20)] == [OK] * 20
    decide.clock.now = T0 + 2  # a full bucket, but 10 left of 50 in the 4-second window
    third = [await decide("two") for _ in range(20)]
    assert [s.code for s in third] == [OK] * 10 + [OVER_LIMIT] * 10
    assert {(s.rule.name, s.duration_until_reset) for s in third[5:]} == {("per_4s", 2)}


# -- the scripts against the twin ----------------------------------------------------------


def twin(op: Op, state: dict[str, tuple[int, ...]]) -> tuple[int, int]:
    window = op.seconds * 1000 // op.tick
    if op.algorithm == SLIDING_WINDOW:
        w, c, p = state.get(op.key, (0, 0, 0))
        after, w, c, p, reset = _keys_py.sliding_window(w, c, p, op.now, window, op.limit, op.hits)
        new: tuple[int, ...] = (w, c, p)
    else:
        t, f = state.get(op.key, (0, 0))
        after, t, f, reset = _keys_py.token_bucket(t, f, op.now, window, op.limit, op.hits)
        new = (t, f)
    if after <= op.limit and op.hits:
        state[op.key] = new
    return after, reset


async def test_scripts_compute_what_the_twin_computes(redis_server: Any, decider: Any) -> None:
    d = await decider({"REDIS_URL": redis_server.address}, CONFIG)
    rng = random.Random(16)
    state: dict[str, tuple[int, ...]] = {}
    now = 1_700_000_000_000
    for _ in range(400):
        now += rng.choice([0, 1, 7, 50, 333, 999, 1000, 2500])
        algorithm = rng.choice([SLIDING_WINDOW, TOKEN_BUCKET])
        seconds, limit = rng.choice([(1, 3), (1, 20), (2, 7), (60, 1000), (86400, 10**6)])
        tick = 1 if limit * seconds * 1000 <= 1 << 50 else 1000
        ops = [
            Op(
                f"k{algorithm}{seconds}{rng.randrange(2)}",
                rng.choice([0, 1, 1, 1, 2, 5, limit + 1]),
                seconds,
                algorithm=algorithm,
                limit=limit,
                tick=tick,
                now=now // tick,
            )
        ]
        got = await d.backend.increment(ops)
        assert [tuple(g) for g in got] == [twin(op, state) for op in ops]


async def test_noscript_falls_back_to_eval(redis_server: Any, decider: Any) -> None:
    clock = Clock(T0)
    d = await decider({"REDIS_URL": redis_server.address}, CONFIG, clock=clock)
    first = await d.decide("api", [("sliding", "a")], [("bucket", "a")], [("fixed", "a")])
    assert [s.code for s in first.statuses] == [OK, OK, OK]
    redis_server.client().script_flush()
    again = await d.decide("api", [("sliding", "a")], [("bucket", "a")], [("fixed", "a")])
    assert [s.limit_remaining for s in again.statuses] == [18, 18, 18]
    keys = sorted(redis_server.client().keys())
    assert keys == [
        b"api_bucket_a_1s_token_bucket",
        b"api_fixed_a_1000000",
        b"api_sliding_a_1s_sliding_window",
    ]
    # Each state expires once it cannot matter: the bucket when full, the window after
    # the next one.
    assert 0 < redis_server.client().pttl("api_bucket_a_1s_token_bucket") <= 101
    assert 1000 < redis_server.client().pttl("api_sliding_a_1s_sliding_window") <= 2000


async def test_stop_increment_peeks_without_counting(redis_server: Any, decider: Any) -> None:
    env = {"REDIS_URL": redis_server.address, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}
    d = await decider(env, CONFIG, clock=Clock(T0))
    for _ in range(20):
        await d.decide("api", [("two", "a")])
    over = await d.decide("api", [("two", "a")])
    assert over.statuses[0].code == OVER_LIMIT
    # The per-4s fixed window was not counted for the refused request.
    assert redis_server.client().get("api_two_a_1000000_4s") == b"20"


async def test_per_second_instance_gets_second_unit_limits_of_any_multiplier(
    redis_servers: Any, decider: Any
) -> None:
    main, per_second = redis_servers(), redis_servers()
    env = {
        "REDIS_URL": main.address,
        "REDIS_PERSECOND": "true",
        "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
        "REDIS_PERSECOND_URL": per_second.address,
    }
    text = CONFIG + (
        "  - key: minute\n    rate_limit: {unit: minute, requests_per_unit: 5, "
        "algorithm: sliding_window}\n"
    )
    d = await decider(env, text, clock=Clock(T0))
    r = await d.decide("api", [("pair", "a")], [("bucket", "a")], [("minute", "a")])
    assert [s.code for s in r.statuses] == [OK, OK, OK]
    assert sorted(per_second.client().keys()) == [
        b"api_bucket_a_1s_token_bucket",
        b"api_pair_a_1000000_2s",
    ]
    assert main.client().keys() == [b"api_minute_a_60s_sliding_window"]
