"""HTTP/1.1 mechanics of the HTTP transport's server: keep-alive, Connection: close and
HTTP/1.0, pipelining, chunked bodies, Expect: 100-continue, absolute-form targets, Upgrade,
404 and HEAD, size limits (413, 431), malformed requests, and closing with connections idle
or in flight. Real servers on port 0, the client in support.http_transport.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from support.http_transport import (
    CONFIG,
    ONE_K,
    Conn,
    Servers,
    read_reply,
    request_bytes,
)

from ratelimitd.health import Health
from ratelimitd.transport.http import HttpRequest, HttpServer, start_http_server
from ratelimitd.transport.routes import main_routes

# HTTP/1.1 mechanics


async def test_keep_alive_many_requests_one_connection(srv: Servers) -> None:
    c = await srv.conn()
    for i in range(6):
        reply = await c.call("/healthcheck", method="GET")
        assert reply.status == 200, i
        assert "connection" not in reply.headers
    assert srv.main.connections and len(srv.main.connections) == 1


async def test_connection_close_honoured(srv: Servers) -> None:
    c = await srv.conn()
    reply = await c.call("/healthcheck", method="GET", headers=("Connection: close",))
    assert reply.status == 200
    assert reply.headers["connection"] == "close"
    assert await c.at_eof()


async def test_http10_closes_unless_keep_alive(srv: Servers) -> None:
    c = await srv.conn()
    reply = await c.call("/healthcheck", method="GET", version="1.0")
    assert reply.status == 200
    assert await c.at_eof()
    c = await srv.conn()
    for _ in range(2):
        reply = await c.call(
            "/healthcheck", method="GET", version="1.0", headers=("Connection: keep-alive",)
        )
        assert reply.status == 200
        assert reply.headers["connection"] == "keep-alive"


async def test_pipelined_requests_answered_in_order(srv: Servers) -> None:
    c = await srv.conn()
    await c.send(
        request_bytes("/json", ONE_K)
        + request_bytes("/json", ONE_K)
        + request_bytes("/healthcheck", method="GET")
        + request_bytes("/nope", method="GET")
        + request_bytes("/json", ONE_K)
    )
    replies = [await read_reply(c.reader) for _ in range(5)]
    assert [r.status for r in replies] == [200, 200, 200, 404, 429]
    assert replies[0].json()["statuses"][0]["limitRemaining"] == 1
    assert "limitRemaining" not in replies[1].json()["statuses"][0]
    assert replies[2].body == b"OK"


async def test_chunked_request_body(srv: Servers) -> None:
    c = await srv.conn()
    head = b"POST /json HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    parts = [ONE_K[:10], ONE_K[10:40], ONE_K[40:]]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    await c.send(head + chunked[:7])  # split across packets too
    await asyncio.sleep(0.01)
    await c.send(chunked[7:])
    reply = await read_reply(c.reader)
    assert reply.status == 200
    assert reply.json()["statuses"][0]["limitRemaining"] == 1


async def test_expect_100_continue(srv: Servers) -> None:
    c = await srv.conn()
    await c.send(
        b"POST /json HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
        b"Content-Length: %d\r\n\r\n" % len(ONE_K)
    )
    assert await c.reader.readline() == b"HTTP/1.1 100 Continue\r\n"
    assert await c.reader.readline() == b"\r\n"
    await c.send(ONE_K)
    reply = await read_reply(c.reader)
    assert reply.status == 200


async def test_absolute_form_target(srv: Servers) -> None:
    reply = await srv.call("http://test/healthcheck?x=1", method="GET")
    assert (reply.status, reply.body) == (200, b"OK")


async def test_upgrade_request_answered_then_closed(srv: Servers) -> None:
    c = await srv.conn()
    reply = await c.call(
        "/healthcheck", method="GET", headers=("Connection: Upgrade", "Upgrade: websocket")
    )
    assert (reply.status, reply.body) == (200, b"OK")
    assert await c.at_eof()


async def test_unknown_path_404(srv: Servers) -> None:
    reply = await srv.call("/nope", method="GET")
    assert (reply.status, reply.body) == (404, b"404 page not found\n")


async def test_head_has_no_body(srv: Servers) -> None:
    c = await srv.conn()
    reply = await c.call("/healthcheck", method="HEAD")
    assert (reply.status, reply.headers["content-length"], reply.body) == (200, "2", b"")
    reply = await c.call("/healthcheck", method="GET")  # still in step
    assert reply.body == b"OK"


async def test_oversize_body_413(srv: Servers) -> None:
    c = await srv.conn()
    # Refused from the headers alone: the body is never sent.
    await c.send(b"POST /json HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n")
    reply = await read_reply(c.reader)
    assert reply.status == 413
    assert reply.headers["connection"] == "close"
    assert await c.at_eof()


async def test_oversize_chunked_body_413(harness: Callable[..., Any]) -> None:
    h = harness(CONFIG)
    server = await start_http_server(main_routes(h.service, Health()), "127.0.0.1", 0, max_body=64)
    try:
        c = await Conn.open(server.port)
        head = b"POST /json HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        await c.send(request_bytes("/healthcheck", method="GET") + head + b"50\r\n" + b"x" * 80)
        first = await read_reply(c.reader)
        assert (first.status, first.body) == (200, b"OK")
        second = await read_reply(c.reader)
        assert second.status == 413
        assert await c.at_eof()
        await c.close()
    finally:
        await server.close(grace=1)


async def test_oversize_head_431(srv: Servers) -> None:
    c = await srv.conn()
    await c.send(b"GET /healthcheck HTTP/1.1\r\nHost: t\r\n")
    header = b"X-Big: " + b"a" * 65536 + b"\r\n"
    with contextlib.suppress(ConnectionError):
        for _ in range(20):  # 1.3 MiB of headers, never finished
            await c.send(header)
    reply = await read_reply(c.reader)
    assert reply.status == 431
    assert await c.at_eof()


async def test_malformed_request_400_and_close(srv: Servers) -> None:
    c = await srv.conn()
    await c.send(b"BLAH\x00 / HTTP/1.1\r\n\r\n")
    reply = await read_reply(c.reader)
    assert reply.status == 400
    assert await c.at_eof()


async def test_close_stops_idle_connections(harness: Callable[..., Any]) -> None:
    h = harness(CONFIG)
    server = await start_http_server(main_routes(h.service, Health()), "127.0.0.1", 0)
    c = await Conn.open(server.port)
    assert (await c.call("/json", ONE_K)).status == 200
    await server.close(grace=1)
    assert await c.at_eof()
    assert not server.connections
    await c.close()


async def test_close_drains_in_flight_request() -> None:
    started = asyncio.Event()

    async def slow(request: HttpRequest) -> tuple[int, Any, bytes]:
        started.set()
        await asyncio.sleep(0.2)
        return 200, (), b"done"

    server = HttpServer({"/slow": slow})
    assert server.port == 0
    await server.close()  # never started: nothing to do
    port = await server.start("127.0.0.1", 0)
    c = await Conn.open(port)
    pending = asyncio.create_task(c.call("/slow", method="GET"))
    await started.wait()
    await server.close(grace=5)
    reply = await pending
    assert (reply.status, reply.body, reply.headers["connection"]) == (200, b"done", "close")
    assert await c.at_eof()
    with pytest.raises(OSError):
        await Conn.open(port)
    await c.close()
