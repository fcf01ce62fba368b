"""Counters saturate on memcached.

The reference reads a counter with Go's ParseInt(s, 10, 32): a value past 2^31-1 is a parse
error there, logged, and read as 0 — so one request with a huge hits_addend made its key
unlimited for the rest of the window. Here a numeric counter past the int32 range reads as
saturated (over any uint32 limit); a value that is not a number keeps the reference's handling.
"""

from __future__ import annotations

from ratelimitd.backends.memcache import parse_counter
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


def test_parse_counter() -> None:
    assert parse_counter(b"17") == 17
    assert parse_counter(b"2147483648") == 2**32 - 1  # past int32: saturated
    assert parse_counter(b"18446744073709551615") == 2**32 - 1
    assert parse_counter(b"12abc") is None  # not a number: the reference's error path


async def test_huge_hits_then_the_key_stays_limited(memcached, decider) -> None:
    mc = memcached()
    d = await decider([mc.address], CONFIG)
    r = await d.decide("d", Descriptor((("k", "a"),), None, 2**64 - 1))
    assert r.overall_code == OVER_LIMIT
    await d.backend.flush()
    for _ in range(2):
        assert (await d.decide("d", [("k", "a")])).overall_code == OVER_LIMIT
        await d.backend.flush()
    assert (await d.decide("d", [("k", "b")])).overall_code == OK
