"""The debug server (the reference's debug port): its index, /rlconfig, /stats and the
/debug/pprof/profile endpoint with its setting, bounds and admin token. Real servers on port
0, the client in support.http_transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support.http_transport import (
    ONE_K,
    Conn,
    Servers,
    StubService,
    request_bytes,
    unread_answer,
)

from ratelimitd.service import ServiceError
from ratelimitd.settings import DebugSettings
from ratelimitd.transport.debug import debug_routes
from ratelimitd.transport.http import HttpServer, start_http_server

# debug server


async def test_debug_index(srv: Servers) -> None:
    reply = await srv.debug_call("/")
    assert reply.status == 200
    assert reply.body == (
        b"/debug/pprof/: root of various pprof endpoints. hit for help.\n"
        b"/debug/pprof/profile: CPU profiling endpoint\n"
        b"/rlconfig: print out the currently loaded configuration for debugging\n"
        b"/stats: print out stats\n"
    )
    assert (await srv.debug_call("/debug/pprof/")).status == 200
    assert (await srv.debug_call("/nope")).status == 404


async def test_debug_rlconfig(srv: Servers) -> None:
    reply = await srv.debug_call("/rlconfig")
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/plain; charset=utf-8"
    assert reply.body == (
        b"d.k: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"
        b"d.s: unit=SECOND requests_per_unit=50, shadow_mode: false, quota_mode: false\n"
        b"d.meta: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false\n"
    )


async def test_debug_rlconfig_empty_without_config() -> None:
    from ratelimitd.stats import StatsStore

    server = await start_http_server(
        debug_routes(StubService(ServiceError("x")), StatsStore()),  # type: ignore[arg-type]
        "127.0.0.1",
        0,
    )
    try:
        c = await Conn.open(server.port)
        reply = await c.call("/rlconfig", method="GET")
        assert (reply.status, reply.body) == (200, b"")
        await c.close()
    finally:
        await server.close(grace=1)


async def test_debug_stats_sorted_lines(srv: Servers) -> None:
    srv.h.stats.add_gauge("ratelimit.test.gauge_int", lambda: 3.0)
    srv.h.stats.add_gauge("ratelimit.test.gauge_float", lambda: 2.5)
    c = await srv.conn()
    for _ in range(3):
        await c.call("/json", ONE_K)
    reply = await srv.debug_call("/stats")
    assert reply.status == 200
    lines = reply.body.decode().splitlines()
    names = [line.split(": ", 1)[0] for line in lines]
    assert names == sorted(names)
    values = dict(line.split(": ", 1) for line in lines)
    assert values["ratelimit.service.rate_limit.d.k.total_hits"] == "3"
    assert values["ratelimit.service.rate_limit.d.k.over_limit"] == "1"
    assert values["ratelimit.service.rate_limit.d.k.within_limit"] == "2"
    assert values["ratelimit.service.rate_limit.d.s.total_hits"] == "0"
    assert values["ratelimit.service.config_load_error"] == "0"
    assert values["ratelimit.test.gauge_int"] == "3"
    assert values["ratelimit.test.gauge_float"] == "2.5"


async def test_debug_profile(srv: Servers) -> None:
    c = await srv.conn(debug=True)
    profiled = asyncio.create_task(c.call("/debug/pprof/profile?seconds=1", method="GET"))
    await asyncio.sleep(0.2)
    # Work during the profile, and a second profile refused meanwhile.
    for _ in range(3):
        await srv.call("/json", ONE_K)
    busy = await srv.debug_call("/debug/pprof/profile?seconds=1")
    assert busy.status == 409
    reply = await profiled
    assert reply.status == 200
    text = reply.body.decode()
    assert "function calls" in text
    assert "Ordered by: cumulative time" in text
    assert "service.py" in text and "(decide)" in text  # the decisions' one way in


@pytest.mark.parametrize("query", ["seconds=abc", "seconds=0", "seconds=-1", "seconds=11"])
async def test_debug_profile_bad_seconds(srv: Servers, query: str) -> None:
    reply = await srv.debug_call("/debug/pprof/profile?" + query)
    assert reply.status == 400
    assert reply.body == b"seconds must be an integer from 1 to 10\n"


async def test_debug_profile_is_off_unless_enabled(make_servers: Callable[..., Any]) -> None:
    srv = await make_servers(debug_settings=DebugSettings())
    reply = await srv.debug_call("/debug/pprof/profile?seconds=1")
    assert reply.status == 403
    assert b"DEBUG_PROFILE_ENABLED=true" in reply.body and b"ADMIN_TOKEN" in reply.body
    # The rest of the debug server is unchanged.
    assert (await srv.debug_call("/rlconfig")).status == 200


async def test_debug_profile_duration_is_bounded_by_the_setting(
    make_servers: Callable[..., Any],
) -> None:
    srv = await make_servers(debug_settings=DebugSettings(True, 1.0))
    reply = await srv.debug_call("/debug/pprof/profile?seconds=2")
    assert (reply.status, reply.body) == (400, b"seconds must be an integer from 1 to 1\n")
    # No `seconds`: pprof's 30 s default, cut to the maximum.
    reply = await srv.debug_call("/debug/pprof/profile")
    assert reply.status == 200 and reply.body.startswith(
        b"CPU profile of the event-loop thread, 1 s"
    )


async def test_debug_profile_needs_the_admin_token_when_one_is_set(
    make_servers: Callable[..., Any],
) -> None:
    # ADMIN_TOKEN alone enables the endpoint for whoever presents it (bearer auth).
    srv = await make_servers(debug_settings=DebugSettings(admin_token="s3cret"))
    c = await srv.conn(debug=True)
    for headers in [(), ("Authorization: Bearer wrong",), ("Authorization: Basic s3cret",)]:
        reply = await c.call("/debug/pprof/profile?seconds=1", method="GET", headers=headers)
        assert reply.status == 401
        assert reply.headers["www-authenticate"] == 'Bearer realm="ratelimitd debug"'
        assert b"s3cret" not in reply.body
    for scheme in ("Bearer", "bearer"):
        reply = await c.call(
            "/debug/pprof/profile?seconds=1",
            method="GET",
            headers=(f"Authorization: {scheme} s3cret",),
        )
        assert reply.status == 200
    # With the token set, DEBUG_PROFILE_ENABLED does not open the endpoint to everyone.
    both = await make_servers(debug_settings=DebugSettings(True, admin_token="s3cret"))
    assert (await both.debug_call("/debug/pprof/profile?seconds=1")).status == 401


async def test_an_unread_stats_page_holds_one_chunk_then_is_closed() -> None:
    """/stats is streamed: a client that does not read holds the high-water mark and one
    chunk of the page, not the page (an unread 244 MB /stats once stayed in the transport's
    buffer), and is closed after the write timeout as any unread answer."""
    from ratelimitd.stats import StatsStore

    stats = StatsStore()
    for i in range(5_000):
        stats.rule_stats(f"d.k_{i:05d}_" + "v" * 200).total_hits = i
    server = HttpServer(
        debug_routes(StubService(ServiceError("x")), stats),  # type: ignore[arg-type]
        write_timeout=1.0,
    )
    await server.start("127.0.0.1", 0)
    page_bytes = 5_000 * 6 * 260  # 7.8 MB of lines
    try:
        held = await unread_answer(server, "/stats")
        assert held < 600 * 1024 < page_bytes // 10, held

        # A client that reads gets the whole page, in order.
        c = await Conn.open(server.port)
        reply = await c.call("/stats", method="GET")
        await c.close()
        assert reply.headers["transfer-encoding"] == "chunked"
        lines = reply.body.decode().splitlines()
        assert len(lines) >= 30_000 and lines == sorted(lines)
        last = "ratelimit.service.rate_limit.d.k_04999_" + "v" * 200 + ".total_hits: 4999"
        assert last in lines
    finally:
        await server.close(grace=1)


async def test_a_streamed_page_to_http_10_and_head(srv: Servers) -> None:
    """HTTP/1.0 has no chunked coding: the page ends with the connection. HEAD: the head
    only, and the connection stays usable."""
    full = (await srv.debug_call("/stats")).body
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.debug.port)
    writer.write(request_bytes("/stats", method="GET", version="1.0"))
    raw = await reader.read()  # until the server closes
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding" not in head
    assert b"Connection: close" in head
    assert body.splitlines()[:3] == full.splitlines()[:3] and len(body) > 1000
    c = await srv.conn(debug=True)
    head_reply = await c.call("/stats", method="HEAD")
    assert head_reply.status == 200 and head_reply.body == b""
    assert head_reply.headers["transfer-encoding"] == "chunked"
    again = await c.call("/stats", method="GET")
    assert again.status == 200 and again.body.startswith(full.splitlines()[0])
    await c.close()
