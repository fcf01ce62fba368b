"""Refunds (is_negative_hits, upstream #1140) on a real redis-server: one atomic script per key."""

from __future__ import annotations

import asyncio
import time

from support.core import suite_config

from ratelimitd.messages import OK, Descriptor, Request

# d: k 10/hour (main instance), s 10/second (the per-second instance when there is one).
CONFIG = suite_config("redis_refunds")


def hour_key(value: str) -> str:
    return f"d_k_{value}_{int(time.time()) // 3600 * 3600}"


async def decide(d, *descriptors: Descriptor):
    return await d.service.should_rate_limit(Request("d", list(descriptors)))


def refund(value: str, hits: int, key: str = "k") -> Descriptor:
    return Descriptor(((key, value),), hits_addend=hits, is_negative_hits=True)


def consume(value: str, hits: int = 1, key: str = "k") -> Descriptor:
    return Descriptor(((key, value),), hits_addend=hits)


async def test_refund_decrements_floors_and_never_creates(redis_server, decider) -> None:
    d = await decider({"REDIS_URL": redis_server.address}, CONFIG)
    client = redis_server.client()
    r = await decide(d, consume("a", 5))
    assert r.statuses[0].limit_remaining == 5
    r = await decide(d, refund("a", 3))
    assert (r.overall_code, r.statuses[0].code, r.statuses[0].limit_remaining) == (OK, OK, 8)
    assert client.get(hour_key("a")) == b"2"
    assert 3599 <= client.ttl(hour_key("a")) <= 3600  # SET + EXPIRE: the TTL is set again
    r = await decide(d, refund("a", 7))
    assert r.statuses[0].limit_remaining == 10
    assert client.get(hour_key("a")) == b"0"
    # Absent: nothing is created, the answer is the whole limit.
    r = await decide(d, refund("absent", 3))
    assert r.statuses[0].limit_remaining == 10
    assert client.exists(hour_key("absent")) == 0
    assert d.stat("ratelimit.service.rate_limit.d.k.total_negative_hits") == 13
    assert d.stat("ratelimit.service.rate_limit.d.k.total_hits") == 5
    # One script call per refund (EVALSHA): the script was loaded before the backend was
    # ready, so no NOSCRIPT and no EVAL.
    calls = redis_server.commandstats()
    assert (calls["evalsha"], calls.get("eval", 0)) == (3, 0)


async def test_refunds_and_consumptions_race_atomically(redis_server, decider) -> None:
    d = await decider({"REDIS_URL": redis_server.address}, CONFIG)
    await decide(d, consume("race", 10))
    # 200 concurrent requests: 100 refunds of 1 and 100 consumptions of 1, interleaved.
    await asyncio.gather(
        *(decide(d, refund("race", 1) if i % 2 else consume("race", 1)) for i in range(200))
    )
    # Floored at 0 at times, so at least 10 and at most 110; never negative, always an int.
    value = int(redis_server.client().get(hour_key("race")))
    assert 10 <= value <= 110


async def test_refund_after_script_flush_and_on_the_per_second_instance(servers, decider) -> None:
    main, per_second = servers(), servers()
    d = await decider(
        {
            "REDIS_URL": main.address,
            "REDIS_PERSECOND": "true",
            "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
            "REDIS_PERSECOND_URL": per_second.address,
        },
        CONFIG,
    )
    await decide(d, consume("a", 4), consume("b", 4, key="s"))
    main.client().script_flush()
    per_second.client().script_flush()
    # NOSCRIPT: the same call goes again as EVAL, which loads the script.
    r = await decide(d, refund("a", 1), refund("b", 1, key="s"))
    assert [s.limit_remaining for s in r.statuses] in ([7, 7], [7, 10])  # a second may pass
    assert main.client().get(hour_key("a")) == b"3"
    assert per_second.client().keys("d_k_*") == []
    assert main.client().keys("d_s_*") == []
