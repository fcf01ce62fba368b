"""The statsd (TCP) and DogStatsD (UDP) sinks against real listeners.

Decisions run through a RateLimitService on the memory backend (the `harness` fixture);
the sink flushes to a listener started by the test, which checks names, values and tags.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import pytest
from support import wait_until
from support.settings_env import on_memory

from ratelimitd.settings import Settings
from ratelimitd.stats.base import RESPONSE_TIME, statsd_tag_suffix
from ratelimitd.stats.dogstatsd import DogStatsdSink
from ratelimitd.stats.sinks import create_sink
from ratelimitd.stats.statsd import StatsdSink, TcpWriter

from .conftest import CONFIG, LineReceiver, TcpListener, running

USER = "ratelimit.service.rate_limit.obs.user"


def settings(**env: str) -> Settings:
    return on_memory(STATSD_HOST="127.0.0.1", **env)


async def decide_sequence(h: Any) -> None:
    """3 hits for user=alice against 2/minute, 1 hit on path=/a,method=GET, 1 unknown domain."""
    for _ in range(3):
        await h.decide("obs", [("user", "alice")])
    await h.decide("obs", [("path", "/a"), ("method", "GET")])
    await h.decide("nope", [("user", "bob")])


def values(lines: list[str]) -> dict[str, str]:
    """name -> `value|type[...]` of the last line for each name."""
    return dict(line.split(":", 1) for line in lines)


async def test_statsd_tcp_lines_after_known_decisions(
    harness: Any, tcp_statsd: LineReceiver
) -> None:
    h = harness(CONFIG)
    sink = create_sink(settings(STATSD_PORT=str(tcp_statsd.port)), h.stats)
    assert isinstance(sink, StatsdSink)
    async with running(sink):
        await decide_sequence(h)
        sink.timer.observe(1.5)  # type: ignore[union-attr]
        sink.timer.observe(2.0)  # type: ignore[union-attr]
        await sink.flush()
        await wait_until(lambda: any(line.startswith(RESPONSE_TIME) for line in tcp_statsd.lines))
        got = values(tcp_statsd.lines)
        assert got[f"{USER}.total_hits"] == "3|c"
        assert got[f"{USER}.within_limit"] == str(int(h.stat(f"{USER}.within_limit"))) + "|c"
        assert got[f"{USER}.over_limit"] == "1|c"
        assert got["ratelimit.service.rate_limit.obs.path_/a.method_GET.total_hits"] == "1|c"
        assert got["ratelimit.service.rate_limit.nope.domain_not_found"] == "1|c"
        # Counters that never moved are not sent (gostats skips zero deltas).
        assert f"{USER}.shadow_mode" not in got
        assert "ratelimit.service.call.should_rate_limit.redis_error" not in got
        assert sorted(tcp_statsd.named(RESPONSE_TIME)) == [
            f"{RESPONSE_TIME}:1.500000|ms",
            f"{RESPONSE_TIME}:2|ms",
        ]
        # Every counter line matches the store's total (first flush = delta from zero).
        snapshot = h.stats.snapshot()
        for name, text in got.items():
            if text.endswith("|c"):
                assert snapshot[name] == int(text[:-2]), name

        # Second flush: deltas only, and only what changed.
        before = len(tcp_statsd.lines)
        await h.decide("obs", [("user", "alice")])
        await sink.flush()
        await wait_until(lambda: len(tcp_statsd.lines) >= before + 2)
        second = values(tcp_statsd.lines[before:])
        assert second == {f"{USER}.total_hits": "1|c", f"{USER}.over_limit": "1|c"}
    assert tcp_statsd.connections == 1


async def test_statsd_extra_tags_in_the_name(harness: Any, tcp_statsd: LineReceiver) -> None:
    h = harness(CONFIG)
    env = settings(STATSD_PORT=str(tcp_statsd.port), EXTRA_TAGS="zone:eu.west-1,app:rl,empty:")
    sink = create_sink(env, h.stats)
    await sink.start()
    await h.decide("obs", [("user", "alice")])
    h.stats.add_gauge("ratelimit.localcache.entryCount", lambda: 7)
    sink.timer.observe(3.25)  # type: ignore[union-attr]
    await sink.stop()  # the final flush
    await wait_until(lambda: len(tcp_statsd.named(RESPONSE_TIME)) == 1)
    got = values(tcp_statsd.lines)
    tags = ".__app=rl.__zone=eu_west-1"  # sorted by key, `.` in values -> `_`, empties dropped
    assert got[f"{USER}.total_hits{tags}"] == "1|c"
    assert got[f"ratelimit.localcache.entryCount{tags}"] == "7|g"
    assert tcp_statsd.named(RESPONSE_TIME) == [f"{RESPONSE_TIME}{tags}:3.250000|ms"]
    assert all(tags + ":" in line for line in tcp_statsd.lines)
    assert statsd_tag_suffix([("b", "1"), ("a", "x|y:z")]) == ".__a=x_y_z.__b=1"


async def test_gauges_every_flush_and_pool_totals_as_counters(
    harness: Any, tcp_statsd: LineReceiver
) -> None:
    h = harness(CONFIG)
    pool = {"active": 2, "total": 5}
    h.stats.add_gauge("ratelimit.redis_pool.cx_active", lambda: pool["active"])
    h.stats.add_gauge("ratelimit.redis_pool.cx_total", lambda: pool["total"])
    sink = StatsdSink(h.stats, "127.0.0.1", tcp_statsd.port)
    await sink.start()
    await sink.flush()
    pool["total"] = 8
    await sink.flush()
    await sink.stop()
    await wait_until(lambda: len(tcp_statsd.named("ratelimit.redis_pool.cx_active")) == 3)
    assert (
        tcp_statsd.named("ratelimit.redis_pool.cx_active")
        == ["ratelimit.redis_pool.cx_active:2|g"] * 3
    )
    assert tcp_statsd.named("ratelimit.redis_pool.cx_total") == [
        "ratelimit.redis_pool.cx_total:5|c",
        "ratelimit.redis_pool.cx_total:3|c",
    ]


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_dead_statsd_port_does_not_slow_decisions(harness: Any) -> None:
    h = harness(CONFIG)
    sink = StatsdSink(h.stats, "127.0.0.1", _dead_port(), flush_interval=0.001)
    async with running(sink):
        # Decisions interleaved with flushes to a port nobody listens on: every decision
        # completes in the same loop iterations as without a sink, the connect attempts
        # happen in the background, and the buffer stays bounded.
        for i in range(2000):
            await h.decide("obs", [("user", f"u{i % 50}")])
            if i % 100 == 0:
                await asyncio.sleep(0.002)
        await wait_until(lambda: sink.writer.connect_failures >= 2)
    assert h.stat(f"{USER}.total_hits") == 2000
    assert sink.writer.connects == 0
    assert sink.writer.queued <= sink.writer.max_buffered


async def test_unread_statsd_connection_drops_instead_of_blocking(harness: Any) -> None:
    """A server that accepts but never reads: writes time out, data is dropped, not queued
    without bound, and decisions are never awaited on it."""
    stalled: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stalled.append(writer)  # never read

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    h = harness(CONFIG)
    sink = StatsdSink(h.stats, "127.0.0.1", port, max_buffered=256 * 1024)
    await sink.start()
    try:
        await wait_until(lambda: sink.writer.connects == 1)
        big = b"x" * 65536
        sent = sum(sink.writer.send(big) for _ in range(400))  # 25 MiB offered
        decided = 0
        for _ in range(200):
            await h.decide("obs", [("user", "alice")])
            decided += 1
        assert decided == 200
        assert sent < 400  # the bounded buffer refused the excess
        assert sink.writer.queued <= 256 * 1024
        assert sink.writer.dropped_bytes > 0
    finally:
        await sink.writer.close()
        await sink.stop()
        for w in stalled:
            w.close()
        server.close()
        await server.wait_closed()
        for w in stalled:
            with contextlib.suppress(Exception):
                await w.wait_closed()


async def test_statsd_reconnects_when_the_server_comes_back(harness: Any) -> None:
    received = LineReceiver()
    port = _dead_port()
    h = harness(CONFIG)
    sink = StatsdSink(h.stats, "127.0.0.1", port)
    await sink.start()
    listener = TcpListener(received)
    try:
        await wait_until(lambda: sink.writer.connect_failures >= 1)
        await listener.start(port)
        await h.decide("obs", [("user", "alice")])
        await sink.flush()
        await wait_until(lambda: f"{USER}.total_hits:1|c" in received.lines)
        assert sink.writer.connects == 1
    finally:
        await sink.stop()
        await listener.close()


async def test_tcp_writer_reconnects_after_the_server_closes() -> None:
    received = LineReceiver()
    listener = TcpListener(received)
    writer = TcpWriter("127.0.0.1", await listener.start())
    writer.start()
    try:
        writer.send(b"a:1|c\n")
        await wait_until(lambda: received.lines == ["a:1|c"])
        listener.drop_connections()  # the server goes away
        await wait_until(lambda: writer.connects == 2)
        writer.send(b"b:1|c\n")
        await wait_until(lambda: received.lines == ["a:1|c", "b:1|c"])
    finally:
        await writer.close()
        await listener.close()


# -- DogStatsD -----------------------------------------------------------------------------


def dogstatsd_settings(udp_statsd: LineReceiver, **env: str) -> Settings:
    """`settings` for the DogStatsD sink (instead of statsd) sending to `udp_statsd`."""
    return settings(
        USE_STATSD="false", USE_DOG_STATSD="true", STATSD_PORT=str(udp_statsd.port), **env
    )


async def test_dogstatsd_udp_tags(harness: Any, udp_statsd: LineReceiver) -> None:
    h = harness(CONFIG)
    env = dogstatsd_settings(udp_statsd, EXTRA_TAGS="zone:eu.west,app:rl")
    sink = create_sink(env, h.stats)
    assert isinstance(sink, DogStatsdSink)
    await sink.start()
    await decide_sequence(h)
    sink.timer.observe(4.5)  # type: ignore[union-attr]
    await sink.stop()
    await wait_until(lambda: any(line.startswith(RESPONSE_TIME) for line in udp_statsd.lines))
    got = values(udp_statsd.lines)
    assert got[f"{USER}.total_hits"] == "3|c|#app:rl,zone:eu_west"
    assert got[f"{USER}.over_limit"] == "1|c|#app:rl,zone:eu_west"
    assert got[RESPONSE_TIME] == "4.5|ms|#app:rl,zone:eu_west"
    assert all(len(p) <= 1432 for p in udp_statsd.packets)  # type: ignore[attr-defined]


async def test_dogstatsd_mogrifiers_turn_name_parts_into_tags(
    harness: Any, udp_statsd: LineReceiver
) -> None:
    h = harness(CONFIG)
    env = dogstatsd_settings(
        udp_statsd,
        EXTRA_TAGS="app:rl",
        USE_DOG_STATSD_MOGRIFIERS="RULE",
        DOG_STATSD_MOGRIFIER_RULE_PATTERN=r"^ratelimit\.service\.rate_limit\.([^.]*)\.(.*)\.([^.]*)$",
        DOG_STATSD_MOGRIFIER_RULE_NAME="ratelimit.service.rate_limit.$3",
        DOG_STATSD_MOGRIFIER_RULE_TAGS="domain:$1,descriptor:$2",
    )
    sink = create_sink(env, h.stats)
    await sink.start()
    await decide_sequence(h)
    await sink.stop()
    await wait_until(lambda: len(udp_statsd.lines) >= 5)
    lines = set(udp_statsd.lines)
    assert "ratelimit.service.rate_limit.total_hits:3|c|#app:rl,domain:obs,descriptor:user" in lines
    assert (
        "ratelimit.service.rate_limit.total_hits:1|c|#app:rl,domain:obs,descriptor:path_/a.method_GET"
        in lines
    )
    # Names the pattern does not match keep their name and only carry EXTRA_TAGS.
    assert "ratelimit.service.rate_limit.nope.domain_not_found:1|c|#app:rl" in lines


def test_dogstatsd_mogrify_unit() -> None:
    from ratelimitd.settings import DogStatsdMogrifier
    from ratelimitd.stats import StatsStore

    sink = DogStatsdSink(
        StatsStore(),
        "127.0.0.1",
        8125,
        extra_tags=[("COMMIT", "12345")],
        mogrifiers=[
            DogStatsdMogrifier(
                "TAG",
                r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$",
                "ratelimit.service.rate_limit.$3",
                (("domain", "$1"), ("descriptor", "$2")),
            )
        ],
    )
    assert sink.mogrify("ratelimit.service.rate_limit.mongo_cps.database_users.within_limit") == (
        "ratelimit.service.rate_limit.within_limit",
        ["COMMIT:12345", "domain:mongo_cps", "descriptor:database_users"],
    )
    assert sink.mogrify("other.metric") == ("other.metric", ["COMMIT:12345"])


@pytest.mark.parametrize("kind", ["statsd", "dogstatsd"])
async def test_timer_sampling_bounds_lines_and_states_the_rate(
    kind: str, harness: Any, tcp_statsd: LineReceiver, udp_statsd: LineReceiver
) -> None:
    h = harness(CONFIG)
    if kind == "statsd":
        sink: Any = StatsdSink(h.stats, "127.0.0.1", tcp_statsd.port)
        received = tcp_statsd
    else:
        sink = DogStatsdSink(h.stats, "127.0.0.1", udp_statsd.port)
        received = udp_statsd
    timer = h.stats.timer(RESPONSE_TIME)
    await sink.start()
    for _ in range(timer.capacity * 5):
        timer.observe(1.0)
    await sink.stop()
    await wait_until(lambda: len(received.named(RESPONSE_TIME)) >= timer.capacity * 0.9)
    lines = received.named(RESPONSE_TIME)
    assert len(lines) <= timer.capacity
    assert all("|@0.2" in line for line in lines)
    assert timer.count == timer.capacity * 5


async def test_statsd_udp_protocol_sends_datagrams(harness: Any, udp_statsd: LineReceiver) -> None:
    """STATSD_PROTOCOL=udp (gostats' variable): the same lines, as datagrams of <= 1,432 bytes."""
    h = harness(CONFIG)
    sink = create_sink(settings(STATSD_PORT=str(udp_statsd.port), STATSD_PROTOCOL="udp"), h.stats)
    assert isinstance(sink, StatsdSink) and sink.udp is not None
    async with running(sink):
        await decide_sequence(h)
        await sink.flush()
        await wait_until(lambda: f"{USER}.over_limit:1|c" in udp_statsd.lines)
        got = values(udp_statsd.lines)
        assert got[f"{USER}.total_hits"] == "3|c"
        assert got["ratelimit.service.rate_limit.nope.domain_not_found"] == "1|c"
        packets: list[bytes] = udp_statsd.packets  # type: ignore[attr-defined]
        assert packets and all(0 < len(p) <= 1432 and p.endswith(b"\n") for p in packets)


@pytest.mark.parametrize("value", ["UDP", "unix", "udp6"])
def test_statsd_protocol_is_tcp_or_udp(value: str) -> None:
    with pytest.raises(Exception, match=f"STATSD_PROTOCOL: invalid value '{value}'"):
        settings(STATSD_PROTOCOL=value)
