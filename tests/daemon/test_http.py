"""The HTTP transports: `/json` and `/healthcheck`, the debug server, the JSON codec.

Real servers on port 0 in the test's event loop, spoken to over real sockets with a
minimal HTTP/1.1 client (raw asyncio streams, so keep-alive, pipelining and chunked
bodies are under the test's control).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimitd.backends.base import BackendError
from ratelimitd.config.ruleset import UNIT_NAMES, Rule
from ratelimitd.health import Health
from ratelimitd.messages import (
    MAX_UINT32,
    OK,
    OVER_LIMIT,
    UNKNOWN,
    Descriptor,
    Request,
    Response,
    Status,
)
from ratelimitd.service import ServiceError
from ratelimitd.settings import DebugSettings, ReloadOptions
from ratelimitd.transport.debug import debug_routes
from ratelimitd.transport.http import HttpRequest, HttpServer, main_routes, start_http_server
from ratelimitd.transport.jsoncodec import decode_request, encode_response

# Harness clock: 1_000_000 s, so a MINUTE window resets in 20 s and a SECOND one in 1 s.
CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: s
    rate_limit: {unit: second, requests_per_unit: 50, name: per-second}
  - key: meta
    rate_limit: {unit: hour, requests_per_unit: 10}
    metadata:
      svc: {name: one}
"""

ONE_K = b'{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}'
BAD = (400, b"Bad Request\n")

# The debug server's profile endpoint on (it is off by default).
PROFILING = DebugSettings(profile_enabled=True)


class Reply:
    """A parsed HTTP response."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


async def read_reply(reader: asyncio.StreamReader, *, head: bool = False) -> Reply:
    """One response from the stream (Content-Length bodies, as our server sends)."""
    status_line = await reader.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head else int(headers["content-length"])
    body = await reader.readexactly(length)
    return Reply(status, headers, body)


def request_bytes(
    path: str,
    body: bytes | None = None,
    *,
    method: str = "POST",
    version: str = "1.1",
    headers: tuple[str, ...] = (),
) -> bytes:
    """A request with a Content-Length body (or none)."""
    lines = [f"{method} {path} HTTP/{version}", "Host: test", *headers]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


class Conn:
    """One client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def call(self, path: str, body: bytes | None = None, **kwargs: Any) -> Reply:
        await self.send(request_bytes(path, body, **kwargs))
        return await read_reply(self.reader, head=kwargs.get("method") == "HEAD")

    async def at_eof(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 5) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):  # the server may have closed first
            await self.writer.wait_closed()


class Servers:
    """The main and debug servers over one harness."""

    def __init__(self, h: Any, health: Health, main: HttpServer, debug: HttpServer) -> None:
        self.h = h
        self.health = health
        self.main = main
        self.debug = debug
        self._conns: list[Conn] = []

    async def conn(self, debug: bool = False) -> Conn:
        c = await Conn.open(self.debug.port if debug else self.main.port)
        self._conns.append(c)
        return c

    async def call(self, path: str, body: bytes | None = None, **kwargs: Any) -> Reply:
        c = await self.conn()
        return await c.call(path, body, **kwargs)

    async def debug_call(self, path: str) -> Reply:
        c = await self.conn(debug=True)
        return await c.call(path, method="GET")

    async def close(self) -> None:
        for c in self._conns:
            await c.close()
        await self.main.close(grace=1)
        await self.debug.close(grace=1)


@pytest.fixture
async def make_servers(harness: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """make_servers(yaml, **harness_kwargs) -> Servers (closed at teardown)."""
    started: list[Servers] = []

    async def make(
        config: str = CONFIG, debug_settings: DebugSettings = PROFILING, **kwargs: Any
    ) -> Servers:
        h = harness(config, **kwargs)
        health = Health()
        health.register("backend", True)
        main = await start_http_server(main_routes(h.service, health), "127.0.0.1", 0)
        debug = await start_http_server(
            debug_routes(h.service, h.stats, settings=debug_settings), "127.0.0.1", 0
        )
        servers = Servers(h, health, main, debug)
        started.append(servers)
        return servers

    yield make
    for servers in started:
        await servers.close()


@pytest.fixture
async def srv(make_servers: Callable[..., Any]) -> Servers:
    return await make_servers()


class StubService:
    """A stand-in service whose decision the test chooses."""

    def __init__(self, outcome: Response | Exception) -> None:
        self.outcome = outcome
        self.ruleset = None

    async def should_rate_limit(self, request: Any) -> Response:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


async def stub_server(outcome: Response | Exception) -> HttpServer:
    health = Health()
    return await start_http_server(main_routes(StubService(outcome), health), "127.0.0.1", 0)  # type: ignore[arg-type]


# /json


def one_k_spent(code: str) -> dict[str, Any]:
    """The /json reply to ONE_K once its 2/minute limit has no hit left: `code` overall and for
    the one status, no limitRemaining (0 is omitted)."""
    return {
        "overallCode": code,
        "statuses": [
            {
                "code": code,
                "currentLimit": {"requestsPerUnit": 2, "unit": "MINUTE"},
                "durationUntilReset": "20s",
            }
        ],
    }


async def test_json_ok_then_over_limit(srv: Servers) -> None:
    c = await srv.conn()
    first = await c.call("/json", ONE_K)
    assert first.status == 200
    assert first.headers["content-type"] == "application/json"
    assert first.body == (
        b'{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":'
        b'{"requestsPerUnit":2,"unit":"MINUTE"},"limitRemaining":1,"durationUntilReset":"20s"}]}'
    )
    second = await c.call("/json", ONE_K)
    assert second.status == 200
    # limitRemaining 0 is omitted.
    assert second.json() == one_k_spent("OK")
    third = await c.call("/json", ONE_K)
    assert third.status == 429
    assert third.json() == one_k_spent("OVER_LIMIT")


async def test_json_named_limit_and_second_unit(srv: Servers) -> None:
    body = b'{"domain":"d","descriptors":[{"entries":[{"key":"s","value":"x"}]}]}'
    reply = await srv.call("/json", body)
    assert reply.status == 200
    assert reply.body == (
        b'{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"name":"per-second",'
        b'"requestsPerUnit":50,"unit":"SECOND"},"limitRemaining":49,"durationUntilReset":"1s"}]}'
    )


async def test_json_unknown_domain_is_ok(srv: Servers) -> None:
    body = b'{"domain":"nope","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}'
    reply = await srv.call("/json", body)
    assert (reply.status, reply.body) == (200, b'{"overallCode":"OK","statuses":[{"code":"OK"}]}')


async def test_json_any_method(srv: Servers) -> None:
    for method in ("GET", "PUT", "PATCH"):
        reply = await srv.call("/json", ONE_K, method=method)
        assert reply.status in (200, 429)


async def test_json_both_spellings_accepted(srv: Servers) -> None:
    c = await srv.conn()
    camel = {
        "domain": "d",
        "descriptors": [
            {
                "entries": [{"key": "x", "value": "1"}],
                "limit": {"requestsPerUnit": 10, "unit": "MINUTE"},
                "hitsAddend": "3",
            }
        ],
    }
    reply = await c.call("/json", json.dumps(camel).encode())
    assert reply.json()["statuses"] == [
        {
            "code": "OK",
            "currentLimit": {"requestsPerUnit": 10, "unit": "MINUTE"},
            "limitRemaining": 7,
            "durationUntilReset": "20s",
        }
    ]
    snake = {
        "domain": "d",
        "descriptors": [
            {
                "entries": [{"key": "x", "value": "1"}],
                "limit": {"requests_per_unit": 10, "unit": 2},
                "hits_addend": 2,
            }
        ],
    }
    reply = await c.call("/json", json.dumps(snake).encode())
    assert reply.json()["statuses"][0]["limitRemaining"] == 5
    # Request-level hits_addend, both spellings.
    for field in ("hitsAddend", "hits_addend"):
        req: dict[str, Any] = {
            "domain": "d",
            "descriptors": [{"entries": [{"key": "s", "value": field}]}],
        }
        req[field] = 4
        reply = await c.call("/json", json.dumps(req).encode())
        assert reply.json()["statuses"][0]["limitRemaining"] == 46


async def test_json_refund_both_spellings(srv: Servers) -> None:
    c = await srv.conn()
    entries = [{"key": "x", "value": "refund"}]
    limit = {"requestsPerUnit": 10, "unit": "MINUTE"}
    consume = {
        "domain": "d",
        "descriptors": [{"entries": entries, "limit": limit, "hitsAddend": 6}],
    }
    assert (await c.call("/json", json.dumps(consume).encode())).json()["statuses"][0][
        "limitRemaining"
    ] == 4
    for field, remaining in (("isNegativeHits", 6), ("is_negative_hits", 8)):
        d = {"entries": entries, "limit": limit, "hitsAddend": 2, field: True}
        reply = await c.call("/json", json.dumps({"domain": "d", "descriptors": [d]}).encode())
        assert (reply.status, reply.json()["statuses"][0]["limitRemaining"]) == (200, remaining)
    # A bool it must be, as protojson: a string is a bad request.
    d = {"entries": entries, "limit": limit, "isNegativeHits": "true"}
    reply = await c.call("/json", json.dumps({"domain": "d", "descriptors": [d]}).encode())
    assert reply.status == 400


async def test_json_response_headers_and_dynamic_metadata(
    make_servers: Callable[..., Any],
) -> None:
    options = ReloadOptions(response_headers=True, response_dynamic_metadata=True)
    srv = await make_servers(CONFIG, options=options)
    body = json.dumps(
        {
            "domain": "d",
            "descriptors": [
                {"entries": [{"key": "meta", "value": "a"}]},
                {"entries": [{"key": "k", "value": "v"}], "hitsAddend": 1},
            ],
            "hitsAddend": 1,
        }
    ).encode()
    reply = await srv.call("/json", body)
    assert reply.status == 200
    doc = reply.json()
    assert doc["responseHeadersToAdd"] == [
        {"key": "RateLimit-Limit", "value": "2"},
        {"key": "RateLimit-Remaining", "value": "1"},
        {"key": "RateLimit-Reset", "value": "20"},
    ]
    assert doc["dynamicMetadata"] == {
        "descriptors": [{"entries": ["meta=a"]}, {"entries": ["k=v"], "hitsAddend": 1}],
        "domain": "d",
        "hitsAddend": 1,
        "metadata": {"svc": {"name": "one"}},
    }
    # Field order as protojson writes it; the Struct's keys sorted.
    assert list(doc) == ["overallCode", "statuses", "responseHeadersToAdd", "dynamicMetadata"]
    assert list(doc["dynamicMetadata"]) == ["descriptors", "domain", "hitsAddend", "metadata"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"}", id="brace"),
        pytest.param(b"null", id="null"),
        pytest.param(b"[]", id="array"),
        pytest.param(b'{"domain":"d"}', id="missing-descriptors"),
        pytest.param(b'{"domain":"d","descriptors":[]}', id="empty-descriptors"),
        pytest.param(
            b'{"domain":"","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}',
            id="empty-domain",
        ),
        pytest.param(b'{"descriptors":[{"entries":[{"key":"k","value":"v"}]}]}', id="no-domain"),
        pytest.param(
            b'{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"x":1}',
            id="unknown-top-field",
        ),
        pytest.param(
            b'{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v","z":""}]}]}',
            id="unknown-entry-field",
        ),
        pytest.param(
            b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}],'
            b'"hitsAddend":1,"hits_addend":1}]}',
            id="both-spellings",
        ),
        pytest.param(b'{"domain":5,"descriptors":[{"entries":[]}]}', id="domain-number"),
        pytest.param(
            b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hitsAddend":-1}',
            id="negative-hits",
        ),
        pytest.param(
            b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hitsAddend":1.5}',
            id="fractional-hits",
        ),
        pytest.param(
            b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hitsAddend":4294967296}',
            id="uint32-overflow",
        ),
        pytest.param(
            b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}],'
            b'"limit":{"requestsPerUnit":1,"unit":"FORTNIGHT"}}]}',
            id="unknown-unit-name",
        ),
        pytest.param(
            b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}],'
            b'"limit":{"requestsPerUnit":1,"unit":"UNKNOWN"}}]}',
            id="override-unit-unknown",
        ),
        pytest.param(b'{"domain":"d","descriptors":[{"entries":{}}]}', id="entries-object"),
        pytest.param(b'{"domain":"d\xff","descriptors":[{"entries":[]}]}', id="bad-utf8"),
    ],
)
async def test_json_bad_request(srv: Servers, body: bytes) -> None:
    reply = await srv.call("/json", body)
    assert (reply.status, reply.body) == BAD
    assert reply.headers["content-type"] == "text/plain; charset=utf-8"


async def test_json_service_and_backend_errors_are_400() -> None:
    for error in (ServiceError("no rate limit configuration loaded"), BackendError("down")):
        server = await stub_server(error)
        try:
            c = await Conn.open(server.port)
            reply = await c.call("/json", ONE_K)
            assert (reply.status, reply.body) == BAD
            await c.close()
        finally:
            await server.close(grace=1)


async def test_json_unknown_overall_code_is_500() -> None:
    server = await stub_server(Response(UNKNOWN, [Status(UNKNOWN)]))
    try:
        c = await Conn.open(server.port)
        reply = await c.call("/json", ONE_K)
        assert (reply.status, reply.body) == (500, b'{"statuses":[{}]}')
        await c.close()
    finally:
        await server.close(grace=1)


async def test_json_unexpected_error_is_500_and_server_survives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stub = StubService(RuntimeError("boom"))
    server = await start_http_server(main_routes(stub, Health()), "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        c = await Conn.open(server.port)
        reply = await c.call("/json", ONE_K)
        assert (reply.status, reply.body) == (500, b"Internal Server Error\n")
        assert "boom" in caplog.text
        stub.outcome = Response(OK, [Status(OK)])
        reply = await c.call("/json", ONE_K)  # same connection still served
        assert (reply.status, reply.body) == (
            200,
            b'{"overallCode":"OK","statuses":[{"code":"OK"}]}',
        )
        await c.close()
    finally:
        await server.close(grace=1)


# /healthcheck


async def test_healthcheck(srv: Servers) -> None:
    c = await srv.conn()
    reply = await c.call("/healthcheck", method="GET")
    assert (reply.status, reply.body) == (200, b"OK")
    srv.health.set("backend", False)
    reply = await c.call("/healthcheck", method="POST", body=b"")
    assert (reply.status, reply.body) == (500, b"")
    srv.health.set("backend", True)
    reply = await c.call("/healthcheck", method="GET")
    assert reply.status == 200


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
    assert "should_rate_limit" in text


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


# codec


def test_encode_response_zero_values_omitted() -> None:
    rule = Rule("d.k", 0, 2)
    resp = Response(
        OK,
        [Status(OK), Status(OK, None, MAX_UINT32), Status(OVER_LIMIT, rule, 0, 7)],
    )
    assert encode_response(resp) == (
        b'{"overallCode":"OK","statuses":[{"code":"OK"},{"code":"OK","limitRemaining":4294967295},'
        b'{"code":"OVER_LIMIT","currentLimit":{"unit":"MINUTE"},"durationUntilReset":"7s"}]}'
    )
    assert encode_response(Response(UNKNOWN, [])) == b"{}"


def test_decode_request_forms() -> None:
    req = decode_request(
        b'{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"1"},{"key":"b"}],'
        b'"limit":{"requestsPerUnit":"5","unit":"WEEK"},"hitsAddend":"18446744073709551615"},'
        b'{"entries":null,"limit":null,"hitsAddend":null}],"hitsAddend":1e1}'
    )
    assert req.domain == "d"
    assert req.hits_addend == 10
    assert req.descriptors == [
        Descriptor((("a", "1"), ("b", "")), (5, 7), 2**64 - 1),
        Descriptor(()),
    ]
    # A per-descriptor hits_addend of 0 is "set" (check without consuming).
    zero = decode_request(b'{"domain":"d","descriptors":[{"entries":[],"hits_addend":0}]}')
    assert zero.descriptors[0].hits_addend == 0


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
FIELD_NAMES = st.sampled_from(
    [
        "domain",
        "descriptors",
        "entries",
        "key",
        "value",
        "limit",
        "unit",
        "hitsAddend",
        "hits_addend",
        "requestsPerUnit",
        "requests_per_unit",
        "other",
    ]
)
SHAPED = st.recursive(
    JSON_VALUES,
    lambda inner: st.dictionaries(FIELD_NAMES, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_random_bytes_only_value_error(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        decode_request(data)


@settings(max_examples=200, deadline=None)
@given(SHAPED)
def test_decode_random_json_only_value_error(doc: Any) -> None:
    try:
        req = decode_request(json.dumps(doc).encode())
    except ValueError:
        return
    # Whatever is accepted is well formed.
    assert isinstance(req.domain, str)
    for d in req.descriptors:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in d.entries)
        assert d.hits_addend is None or 0 <= d.hits_addend < 2**64
    assert 0 <= req.hits_addend < 2**32


def json_uint(n: int) -> st.SearchStrategy[Any]:
    """A proto3 JSON integer: the number, or the number as a string."""
    return st.sampled_from([n, str(n)])


@st.composite
def valid_requests(draw: st.DrawFn) -> tuple[Any, Request]:
    """A RateLimitRequest as JSON (random spellings and integer forms) and its decoding."""
    domain = draw(st.text(max_size=8))
    doc: dict[str, Any] = {"domain": domain}
    descriptors = []
    for _ in range(draw(st.integers(0, 3))):
        entries = draw(st.lists(st.tuples(st.text(max_size=4), st.text(max_size=4)), max_size=3))
        d: dict[str, Any] = {"entries": [{"key": k, "value": v} for k, v in entries]}
        limit = hits = None
        if draw(st.booleans()):
            rpu = draw(st.integers(0, 2**32 - 1))
            unit = draw(st.sampled_from(sorted(UNIT_NAMES)))
            spelling = draw(st.sampled_from(["requestsPerUnit", "requests_per_unit"]))
            d["limit"] = {
                spelling: draw(json_uint(rpu)),
                "unit": draw(st.sampled_from([unit, UNIT_NAMES[unit]])),
            }
            limit = (rpu, unit)
        if draw(st.booleans()):
            hits = draw(st.integers(0, 2**64 - 1))
            d[draw(st.sampled_from(["hitsAddend", "hits_addend"]))] = draw(json_uint(hits))
        doc.setdefault("descriptors", []).append(d)
        descriptors.append(Descriptor(tuple(entries), limit, hits))
    hits_addend = 0
    if draw(st.booleans()):
        hits_addend = draw(st.integers(0, 2**32 - 1))
        doc[draw(st.sampled_from(["hitsAddend", "hits_addend"]))] = draw(json_uint(hits_addend))
    return doc, Request(domain, descriptors, hits_addend)


@settings(max_examples=200, deadline=None)
@given(valid_requests())
def test_decode_valid_requests(case: tuple[Any, Request]) -> None:
    doc, expected = case
    assert decode_request(json.dumps(doc).encode()) == expected
