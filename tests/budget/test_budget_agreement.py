"""The Redis script and its memory twin agree (a hypothesis property), on a single server
and on a Cluster; the compiled twin and its source run uncompiled agree; and concurrent
reserves never admit past the limit."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.budget import Scripted, redis_budgets, uncompiled_memory
from support.redis_server import RedisServer, RedisServers

from ratelimitd.backends import memory_budget as memory
from ratelimitd.backends.memory_budget import MemoryBudgets
from ratelimitd.backends.redis.instances import key_slot
from ratelimitd.config import budget_store as model
from ratelimitd.config.budget_store import Call, budget_keys, fixed, sliding

T0 = 1_699_999_200_000 + 590_000  # 10 s before a minute ends
TTL = 90_000
SHAPES = [
    (fixed(60, 50),),
    (sliding(60, 50),),
    (sliding(1, 7),),
    (fixed(60, 40), sliding(3600, 100)),
    (fixed(1, 5), fixed(60, 30)),
]

step = st.tuples(
    st.sampled_from([0, 0, 1, 250, 999, 5_000, 30_000, 40_000, 61_000, 61_000, 95_000]),
    st.sampled_from(
        [model.RESERVE, model.RESERVE, model.SETTLE, model.RELEASE, model.COUNT, model.PEEK]
    ),
    st.integers(0, 1),  # which budget
    st.integers(0, 5),  # which transaction
    st.sampled_from([0, 1, 3, 10, 25, 49, 60]),  # amount
    st.booleans(),  # charge the estimate of what ends without usage
    st.sampled_from([False, False, False, True]),  # force
    st.booleans(),  # remember a refusal
    st.booleans(),  # a release that served nothing (released whatever charge says)
)


@pytest.mark.parametrize("kept", ["as kept", "by the script"])
def test_redis_and_the_memory_twin_agree(redis_server: RedisServer, kept: str) -> None:
    """Budgets as the backend keeps them (fixed windows in plain commands, the rest by the
    script), and every shape by the script (as a budget with an outbox is)."""
    loop = asyncio.new_event_loop()
    backend, budgets = loop.run_until_complete(redis_budgets(redis_server.address))
    if kept == "by the script":
        budgets = Scripted(budgets)  # type: ignore[assignment]
    client = redis_server.client()
    examples = itertools.count()
    try:

        @settings(
            max_examples=300,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        # The transactions a budget may hold: 2 and 4 are reached (6 ids, their tombstones).
        @given(
            st.sampled_from(SHAPES),
            st.sampled_from([2, 4, model.MAX_BUDGET_TXNS]),
            st.lists(step, min_size=1, max_size=60),
        )
        def agree(windows: Any, most: int, steps: list[Any]) -> None:
            memory = MemoryBudgets(most)
            budgets.instance.budget_max_transactions = most
            keys = [budget_keys(f"ex{next(examples)}:", "llm", [("user", u)])[0] for u in "ab"]
            for (dt, *_), call in zip(steps, calls_of(steps, keys, windows), strict=True):
                if dt == 1:  # now and then, a dry run of Redis' state, then of the twin's
                    dry = [call, Call(model.SETTLE, call.key, windows, call.now, "t0", 5, TTL)]
                    got = loop.run_until_complete(budgets.dry_run(dry))
                    assert got == memory.dry_run(dry), dry
                expected = memory.run_now([call])
                got = loop.run_until_complete(budgets.run([call]))
                assert got == expected, call
                kept_for_garbage_collection(client, call.key)

        agree()
    finally:
        loop.run_until_complete(backend.close())
        loop.close()


def kept_for_garbage_collection(client: Any, key: str) -> None:
    """What the stores skip to save work is never missed: every key of a budget carries a
    TTL whenever it exists (the script sets them again only when `e` moves, or on a deadline
    set it made anew; the commands a counter's when they make it, the records' when they
    make the hash or raise `e`), and the script's next sweep, the hash's `d`, is at most
    half a TTL after the first deadline (a sweep runs at most every half TTL)."""
    for name in client.keys(key.replace("{", "[{]") + "*"):
        assert client.pttl(name) != -1, name
    sweep = client.hget(key, "d")
    first = client.zrange(key + "_due", 0, 0, withscores=True)
    if sweep is not None and first:
        assert int(sweep) <= first[0][1] + TTL // 2, (first, sweep)


def calls_of(steps: list[Any], keys: list[str], windows: Any) -> list[Call]:
    """The budget calls of `step`s, from T0."""
    now = T0
    calls = []
    for dt, kind, who, txn, amount, charge, force, remember, unserved in steps:
        now += dt
        calls.append(
            Call(
                kind, keys[who], windows, now, f"t{txn}", amount, TTL,
                charge, force, remember, unserved,
            )
        )  # fmt: skip
    return calls


@pytest.mark.skipif(
    bool(os.environ.get("RATELIMITD_NO_EXTENSIONS")), reason="pure-Python pass of the suite"
)
def test_the_budget_maths_is_compiled() -> None:
    assert memory.__file__ is not None and memory.__file__.endswith(".so")


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(SHAPES),
    st.sampled_from([2, 4, model.MAX_BUDGET_TXNS]),
    st.lists(step, min_size=1, max_size=60),
)
def test_the_compiled_maths_and_its_source_agree(windows: Any, most: int, steps: list[Any]) -> None:
    compiled, source = MemoryBudgets(most, 5), uncompiled_memory().MemoryBudgets(most, 5)
    keys = [budget_keys("", "llm", [("user", u)])[0] for u in "ab"]
    for call in calls_of(steps, keys, windows):
        dry = [call, Call(model.SETTLE, call.key, windows, call.now, "t0", 5, TTL)]
        assert compiled.dry_run(dry) == source.dry_run(dry), dry
        assert compiled.run_now([call]) == source.run_now([call]), call
        assert compiled.txns == source.txns
        for key in keys:
            assert compiled.state(key, call.now) == source.state(key, call.now)


@pytest.mark.parametrize(
    "windows", [(fixed(60, 40), sliding(3600, 100)), (fixed(60, 40), fixed(3600, 100))]
)
async def test_cluster_runs_each_call_on_its_budgets_slot(
    redis_servers: RedisServers, windows: Any
) -> None:
    """By the script (a sliding window), and in plain commands (fixed windows only)."""
    nodes = redis_servers.cluster(3)
    backend, budgets = await redis_budgets(",".join(n.address for n in nodes), cluster=True)
    try:
        memory = MemoryBudgets()
        rng = random.Random(29)
        # Values with braces too: the tag, not the value, picks the slot.
        users = ["alice", "bob", "c{1}", "}d{", "eve", "f{}", "g", "h"]
        keys = [budget_keys("", "llm", [("user", u)])[0] for u in users]
        now = T0
        calls = []
        for i in range(300):
            now += rng.choice([0, 10, 1000])
            kind = rng.choice(
                [model.RESERVE, model.RESERVE, model.SETTLE, model.RELEASE, model.COUNT]
            )
            key = rng.choice(keys)
            calls.append(Call(kind, key, windows, now, f"t{i % 37}", rng.randrange(30), TTL))
        # Several budgets (several slots, several masters) in one round, in order per budget.
        for j in range(0, len(calls), 10):
            batch = calls[j : j + 10]
            assert await budgets.run(batch) == memory.run_now(batch)
        masters = {backend.main.slots[key_slot(k.encode())] for k in keys}  # type: ignore[attr-defined]
        assert len(masters) > 1  # the test did spread over the masters
    finally:
        await backend.close()


def reserve_from_threads(address: str, key: str, threads: int, each: int) -> list[int]:
    """`threads` OS threads, each with its own loop and connections, reserving `each`
    random estimates concurrently on one budget; the estimates admitted."""
    admitted: list[int] = []
    lock = threading.Lock()
    windows = (fixed(3600, 1000),)

    def worker(seed: int) -> None:
        async def run() -> None:
            backend, budgets = await redis_budgets(address, pool_size=4)
            rng = random.Random(seed)
            try:
                calls = [
                    Call(model.RESERVE, key, windows, T0, f"w{seed}-{i}", rng.randrange(1, 60), TTL)
                    for i in range(each)
                ]
                # Every call its own round trip, all in flight together.
                results = await asyncio.gather(*(budgets.run([c]) for c in calls))
                mine = [c.amount for c, (r,) in zip(calls, results, strict=True) if r.outcome == 1]
                with lock:
                    admitted.extend(mine)
            finally:
                await backend.close()

        asyncio.run(run())

    pool = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(60)
    return admitted


async def test_concurrent_reserves_never_admit_past_the_limit(redis_server: RedisServer) -> None:
    key = budget_keys("", "llm", [("user", "crowd")])[0]
    admitted = await asyncio.to_thread(reserve_from_threads, redis_server.address, key, 4, 100)
    # 400 estimates of 30 on average against 1000: most are refused, and what was admitted
    # is exactly what the budget holds, never more than the limit.
    assert sum(admitted) <= 1000
    assert len(admitted) < 400
    backend, budgets = await redis_budgets(redis_server.address)
    try:
        (peek,) = await budgets.run([Call(model.PEEK, key, (fixed(3600, 1000),), T0, "p", 0, TTL)])
        assert peek.levels[0][0] == sum(admitted)
        assert sum(admitted) > 1000 - 60  # and a refusal meant no room for its estimate
    finally:
        await backend.close()


async def test_streams_that_settle_under_their_estimates_never_overshoot(
    redis_server: RedisServer,
) -> None:
    # N concurrent streams in waves: reserve max_tokens, settle a usage at most that.
    backend, budgets = await redis_budgets(redis_server.address, pool_size=4)
    try:
        rng = random.Random(7)
        key = budget_keys("", "llm", [("user", "waves")])[0]
        windows = (fixed(3600, 5000),)
        charged = 0
        now = T0
        for wave in range(20):
            now += 100
            estimates = [rng.randrange(50, 400) for _ in range(40)]
            reserves = [
                Call(model.RESERVE, key, windows, now, f"s{wave}-{i}", e, TTL)
                for i, e in enumerate(estimates)
            ]
            results = await asyncio.gather(*(budgets.run([c]) for c in reserves))
            settles = [
                Call(
                    model.SETTLE, key, windows, now + 50, c.txn, rng.randrange(0, c.amount + 1), TTL
                )
                for c, (r,) in zip(reserves, results, strict=True)
                if r.outcome == model.ADMITTED
            ]
            done = await asyncio.gather(*(budgets.run([c]) for c in settles))
            charged += sum(r.charged for (r,) in done)
        (peek,) = await budgets.run([Call(model.PEEK, key, windows, now + 60, "p", 0, TTL)])
        assert peek.levels[0][0] == charged <= 5000
    finally:
        await backend.close()
