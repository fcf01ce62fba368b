"""The memcache backend against real memcached processes."""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest
from support import wait_until
from support.core import suite_config

from ratelimitd.backends.base import BackendError, Op
from ratelimitd.backends.memcache import (
    MemcacheBackend,
    legal_key,
    parse_int32,
    pick_node,
)
from ratelimitd.messages import OK, OVER_LIMIT, Descriptor, Request

# d: k 2/minute, y 5/year. now = 1_000_000: the MINUTE window starts at 999960, HOUR at 997200.
CONFIG = suite_config("memcache")

STAT_NAMES = [
    "ratelimit.memcache.multiget.__code=success",
    "ratelimit.memcache.multiget.__code=error",
    "ratelimit.memcache.increment.__code=success",
    "ratelimit.memcache.increment.__code=miss",
    "ratelimit.memcache.increment.__code=error",
    "ratelimit.memcache.add.__code=success",
    "ratelimit.memcache.add.__code=error",
    "ratelimit.memcache.add.__code=not_stored",
    "ratelimit.memcache.keys_requested",
    "ratelimit.memcache.keys_found",
]


def codes(response) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    """(code, limit_remaining) per status."""
    return [(s.code, s.limit_remaining) for s in response.statuses]


def test_selector_is_gomemcache_crc32_ieee() -> None:
    # The CRC-32/IEEE check value (Go's crc32.ChecksumIEEE("123456789")) is 0xCBF43926.
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert pick_node(b"123456789", 2) == 0
    assert pick_node(b"123456789", 3) == 2
    # Cache keys of this suite, as a Go instance with the same server list would place them.
    assert [pick_node(k, 2) for k in (b"d_k_a_999960", b"d_k_b_999960")] == [0, 1]
    assert [pick_node(k, 3) for k in (b"d_k_a_999960", b"d_k_b_999960")] == [0, 2]
    assert pick_node(b"anything", 1) == 0


def test_key_rules_and_int32_parsing() -> None:
    assert legal_key(b"d_k_v_1200")
    assert legal_key("d_k_é_1200".encode())  # bytes >= 0x80 are legal, as in gomemcache
    assert legal_key(b"x" * 250)
    assert not legal_key(b"x" * 251)
    assert not legal_key(b"d_k_a b_1200")
    assert not legal_key(b"d_k_a\tb_1200")
    assert not legal_key(b"d_k_\x7f_1200")
    assert parse_int32(b"17") == 17
    assert parse_int32(b"-3") == -3
    assert parse_int32(b"2147483647") == 2**31 - 1
    assert parse_int32(b"2147483648") is None
    assert parse_int32(b"12abc") is None
    assert parse_int32(b"") is None


async def test_ok_then_over_limit_keys_ttl_and_stats(memcached, decider) -> None:
    mc = memcached()
    d = await decider([mc.address], CONFIG)
    results = []
    for _ in range(3):
        results.append(codes(await d.decide("d", [("k", "v")])))
        await d.backend.flush()
    assert results == [[(OK, 1)], [(OK, 0)], [(OVER_LIMIT, 0)]]
    # The reference's cache key; every hit is counted, over the limit too.
    assert mc.value("d_k_v_999960") == 3
    # The TTL comes from the add: the unit (jitter 0 here).
    assert 55 <= mc.ttl("d_k_v_999960") <= 60
    snap = d.stats.snapshot()
    assert {n: snap[n] for n in STAT_NAMES} == {
        "ratelimit.memcache.multiget.__code=success": 3,
        "ratelimit.memcache.multiget.__code=error": 0,
        "ratelimit.memcache.increment.__code=success": 2,
        "ratelimit.memcache.increment.__code=miss": 1,
        "ratelimit.memcache.increment.__code=error": 0,
        "ratelimit.memcache.add.__code=success": 1,
        "ratelimit.memcache.add.__code=error": 0,
        "ratelimit.memcache.add.__code=not_stored": 0,
        "ratelimit.memcache.keys_requested": 3,
        "ratelimit.memcache.keys_found": 2,
    }
    assert snap["ratelimit.service.rate_limit.d.k.over_limit"] == 1
    assert d.health.components() == {"backend": True}


async def test_decision_before_increment_lets_concurrent_requests_exceed(
    memcached, decider
) -> None:
    """All requests of one burst read the same value: the reference's documented overshoot."""
    mc = memcached()
    d = await decider([mc.address], CONFIG)
    burst = await asyncio.gather(*(d.decide("d", [("k", "v")]) for _ in range(5)))
    assert [r.overall_code for r in burst] == [OK] * 5  # limit 2, yet 5 passed
    await d.backend.flush()
    assert mc.value("d_k_v_999960") == 5  # ... and all 5 were counted
    assert codes(await d.decide("d", [("k", "v")])) == [(OVER_LIMIT, 0)]


async def test_ttl_jitter_set_only_on_add_and_long_units(memcached, decider) -> None:
    mc = memcached()
    d = await decider([mc.address], CONFIG, jitter_max_seconds=30)
    await d.decide("d", [("k", "jitter")])
    await d.backend.flush()
    assert 55 <= mc.ttl("d_k_jitter_999960") < 90
    # An existing key keeps its TTL: increments never touch it.
    assert mc.command(b"set d_k_old_999960 0 1000 1", b"4") == b"STORED\r\n"
    assert codes(await d.decide("d", [("k", "old")])) == [(OVER_LIMIT, 0)]
    await d.backend.flush()
    assert mc.value("d_k_old_999960") == 5
    assert 990 <= mc.ttl("d_k_old_999960") <= 1000
    # A YEAR TTL is over memcached's 30-day relative limit: sent as an absolute time.
    await d.decide("d", [("y", "1")])
    await d.backend.flush()
    assert mc.value("d_y_1_0") == 1
    assert 365 * 86400 - 10 <= mc.ttl("d_y_1_0") <= 365 * 86400 + 30


async def test_increment_add_not_stored_race(memcached, decider) -> None:
    """Concurrent first increments: one add wins, the others get NOT_STORED and incr again."""
    mc = memcached()
    d = await decider([mc.address], CONFIG, max_idle_conns=1)
    ops = [Op("d_k_race_999960", 1, 60)]
    await asyncio.gather(*(d.backend._increment_all(ops) for _ in range(5)))
    assert mc.value("d_k_race_999960") == 5
    assert d.stat("ratelimit.memcache.increment.__code=miss") == 5
    assert d.stat("ratelimit.memcache.add.__code=success") == 1
    assert d.stat("ratelimit.memcache.add.__code=not_stored") == 4
    assert d.stat("ratelimit.memcache.increment.__code=success") == 4
    assert 55 <= mc.ttl("d_k_race_999960") <= 60


async def test_fails_open_when_memcached_stops(memcached, decider) -> None:
    mc = memcached()
    d = await decider([mc.address], CONFIG, timeout=0.3)
    await d.decide("d", [("k", "v")])
    await d.decide("d", [("k", "v")])
    await d.backend.flush()
    assert codes(await d.decide("d", [("k", "v")])) == [(OVER_LIMIT, 0)]
    await d.backend.flush()
    mc.stop()
    for _ in range(3):  # counters read as 0: every request passes with the full quota
        assert codes(await d.decide("d", [("k", "v")])) == [(OK, 1)]
    await d.backend.flush()
    assert d.stat("ratelimit.memcache.multiget.__code=error") == 3
    assert d.stat("ratelimit.memcache.increment.__code=error") == 3
    assert d.health.components() == {"backend": True}  # fail-open: still answering
    assert d.stat("ratelimit.service.call.should_rate_limit.redis_error") == 0


async def test_unreachable_at_startup_fails_open_then_recovers(memcached, decider) -> None:
    mc = memcached()
    port = mc.port
    mc.stop()
    d = await decider([f"127.0.0.1:{port}"], CONFIG)
    assert d.health.components() == {"backend": True}
    assert codes(await d.decide("d", [("k", "v")])) == [(OK, 1)]
    mc.start()  # same port: the node is dialled again after its backoff

    async def counted() -> bool:
        await d.decide("d", [("k", "v")])
        await d.backend.flush()
        return mc.value("d_k_v_999960") is not None

    await wait_until(counted, what="the node to be dialled again")


async def test_malformed_key_fails_the_whole_get_open(memcached, decider) -> None:
    mc = memcached()
    d = await decider([mc.address], CONFIG)
    assert mc.command(b"set d_k_full_999960 0 60 2", b"10") == b"STORED\r\n"
    assert codes(await d.decide("d", [("k", "full")])) == [(OVER_LIMIT, 0)]
    # With a key holding a space in the same request, nothing is read: both pass.
    response = await d.decide("d", [("k", "full")], [("k", "a b")])
    assert codes(response) == [(OK, 1), (OK, 1)]
    assert codes(await d.decide("d", [("k", "x" * 300)])) == [(OK, 1)]
    await d.backend.flush()
    assert d.stat("ratelimit.memcache.multiget.__code=error") == 2
    # The legal key is still incremented; the malformed ones never reach memcached.
    assert mc.value("d_k_full_999960") == 12
    assert d.stat("ratelimit.memcache.increment.__code=error") == 2


async def test_values_beyond_int32_saturate(memcached, decider) -> None:
    """The reference reads them as 0 (a key made unlimited); we differ: saturated
    (docs/compatibility.md)."""
    mc = memcached()
    d = await decider([mc.address], CONFIG)
    assert mc.command(b"set d_k_big_999960 0 60 10", b"3000000000") == b"STORED\r\n"
    assert codes(await d.decide("d", [("k", "big")])) == [(OVER_LIMIT, 0)]
    await d.backend.flush()
    assert mc.value("d_k_big_999960") == 3000000001


async def test_two_nodes_shard_as_gomemcache(memcached, decider) -> None:
    a, b = memcached(), memcached()
    d = await decider([a.address, b.address], CONFIG)
    # crc32 % 2: d_k_a_999960 -> node 0, d_k_b_999960 -> node 1 (see the selector test).
    response = await d.decide("d", [("k", "a")], [("k", "b")])
    assert codes(response) == [(OK, 1), (OK, 1)]
    await d.backend.flush()
    assert (a.value("d_k_a_999960"), a.value("d_k_b_999960")) == (1, None)
    assert (b.value("d_k_a_999960"), b.value("d_k_b_999960")) == (None, 1)
    # One multiget for the request, however many nodes it spans.
    assert d.stat("ratelimit.memcache.multiget.__code=success") == 1
    # The same list in the other order moves the keys: the list must be identical everywhere.
    e = await decider([b.address, a.address], CONFIG)
    await e.decide("d", [("k", "a")])
    await e.backend.flush()
    assert (a.value("d_k_a_999960"), b.value("d_k_a_999960")) == (1, 1)
    # One node down: the other node's values are kept (as gomemcache's GetMulti returns them).
    await d.decide("d", [("k", "a")], [("k", "b")])
    await d.backend.flush()
    b.stop()
    response = await d.decide("d", [("k", "a")], [("k", "b")])
    assert codes(response) == [(OVER_LIMIT, 0), (OK, 1)]


async def test_close_waits_for_pending_increments(memcached) -> None:
    mc = memcached()
    backend = MemcacheBackend([mc.address])
    await backend.connect()
    assert await backend.increment([Op("k1", 2, 60), Op("k2", 3, 60)]) == [2, 3]
    await backend.close()
    assert (mc.value("k1"), mc.value("k2")) == (2, 3)
    assert await MemcacheBackend([mc.address]).get([]) == []


async def test_delete_after_the_queued_increments(memcached) -> None:
    # An admin's reset (DELETE /counters): the increments already queued go first.
    mc = memcached()
    backend = MemcacheBackend([mc.address])
    await backend.connect()
    try:
        await backend.increment([Op("k1", 2, 60), Op("k2", 3, 60)])
        assert await backend.delete(["k1", "k2", "absent"]) == 2
        assert (mc.value("k1"), mc.value("k2")) == (None, None)
    finally:
        await backend.close()


async def test_timeout_of_a_hung_node_fails_open(memcached, decider) -> None:
    mc = memcached()
    d = await decider([mc.address], CONFIG, timeout=0.2)
    assert mc.proc is not None
    mc.proc.send_signal(19)  # SIGSTOP: accepts nothing, answers nothing
    try:
        start = time.monotonic()
        assert codes(await d.decide("d", [("k", "v")])) == [(OK, 1)]
        assert time.monotonic() - start < 2.0  # timeout 0.2 s; slack for a loaded machine
    finally:
        mc.proc.send_signal(18)  # SIGCONT


async def test_refund_is_a_decr_floored_at_zero_that_never_adds(memcached, decider) -> None:
    # Upstream #1140: the status is decided on the value the decr will leave, the decr
    # follows in the background; memcached floors it at 0 and a missing key stays missing.
    mc = memcached()
    d = await decider(
        [mc.address],
        "domain: d\ndescriptors:\n  - key: k\n    "
        "rate_limit: {unit: minute, requests_per_unit: 10}\n",
    )

    async def decide(hits: int, refund: bool, value: str = "v") -> tuple[int, int]:
        ds = [Descriptor((("k", value),), hits_addend=hits, is_negative_hits=refund)]
        r = await d.service.should_rate_limit(Request("d", ds))
        await d.backend.flush()
        return r.statuses[0].code, r.statuses[0].limit_remaining

    assert await decide(5, False) == (OK, 5)
    assert await decide(3, True) == (OK, 8)
    assert mc.value("d_k_v_999960") == 2
    assert await decide(7, True) == (OK, 10)
    assert mc.value("d_k_v_999960") == 0
    assert await decide(2, True, "absent") == (OK, 10)
    assert mc.value("d_k_absent_999960") is None
    snap = d.stats.snapshot()
    assert snap["ratelimit.memcache.decrement.__code=success"] == 2
    assert snap["ratelimit.memcache.decrement.__code=miss"] == 1
    assert snap["ratelimit.service.rate_limit.d.k.total_negative_hits"] == 12


async def test_a_refunded_counter_left_space_padded_is_read_as_its_number(
    memcached, decider
) -> None:
    # memcached may leave a decr's shorter result space-padded in place ("10" - 3 = "7 ",
    # protocol.txt); Go's ParseInt refuses it, so the reference reads the counter as 0 and
    # the limit starts over. The padding is not part of the number.
    mc = memcached()
    d = await decider(
        [mc.address],
        "domain: d\ndescriptors:\n  - key: k\n    "
        "rate_limit: {unit: minute, requests_per_unit: 12}\n",
    )

    async def decide(hits: int, refund: bool = False) -> tuple[int, int]:
        ds = [Descriptor((("k", "v"),), hits_addend=hits, is_negative_hits=refund)]
        r = await d.service.should_rate_limit(Request("d", ds))
        await d.backend.flush()
        return r.statuses[0].code, r.statuses[0].limit_remaining

    assert await decide(10) == (OK, 2)
    assert await decide(3, refund=True) == (OK, 5)
    assert mc.command(b"get d_k_v_999960").split(b"\r\n")[1] == b"7 "
    assert await decide(0) == (OK, 5)  # before: (OK, 12), the counter read as 0
    assert await decide(5) == (OK, 0)
    assert await decide(1) == (OVER_LIMIT, 0)


async def test_a_node_closed_while_dialling_leaves_no_connection_open(memcached) -> None:
    """A node dropped (SRV refresh, backend close) while a dial is in flight: the dial's
    connection is closed too, not left open on the loop (uvloop's close() waits for every
    open handle: a test run hung at teardown so)."""
    from ratelimitd.backends.memcache.protocol import Node

    mc = memcached()
    node = Node(f"127.0.0.1:{mc.port}", 1, None, 1.0)
    dial = asyncio.ensure_future(node.connection())
    await asyncio.sleep(0)  # the dial has started, not finished
    node.close()
    try:
        with pytest.raises(BackendError, match="node closed"):
            await dial
        assert node._conns == [None]
    finally:
        for conn in node._conns:  # a failure must fail, not hang the loop's close
            if conn is not None:
                conn.close()
