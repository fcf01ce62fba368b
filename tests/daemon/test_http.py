"""The HTTP transport's main routes, `/json` and `/healthcheck`, and the JSON codec.

Real servers on port 0 in the test's event loop, spoken to over real sockets with a
minimal HTTP/1.1 client (support.http_transport: raw asyncio streams, so keep-alive,
pipelining and chunked bodies are under the test's control); the `make_servers` and `srv`
fixtures are in conftest.py. HTTP/1.1 mechanics and limits are in test_http_mechanics.py,
the debug server in test_http_debug.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.http_transport import (
    CONFIG,
    ONE_K,
    Conn,
    Servers,
    StubService,
)

from ratelimitd.backends.base import BackendError
from ratelimitd.config.ruleset import UNIT_NAMES, Rule
from ratelimitd.health import Health
from ratelimitd.messages import (
    CODE_UNKNOWN,
    MAX_UINT32,
    OK,
    OVER_LIMIT,
    Descriptor,
    Request,
    Response,
    Status,
)
from ratelimitd.service import ServiceError
from ratelimitd.settings import ReloadOptions
from ratelimitd.transport.http import HttpServer, start_http_server
from ratelimitd.transport.jsoncodec import decode_request, encode_response
from ratelimitd.transport.routes import main_routes

BAD = (400, b"Bad Request\n")


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


# Bodies /json answers 400, by what is wrong with them.
BAD_BODIES = {
    "empty": b"",
    "brace": b"}",
    "null": b"null",
    "array": b"[]",
    "missing-descriptors": b'{"domain":"d"}',
    "empty-descriptors": b'{"domain":"d","descriptors":[]}',
    "empty-domain": b'{"domain":"","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}',
    "no-domain": b'{"descriptors":[{"entries":[{"key":"k","value":"v"}]}]}',
    "unknown-top-field": (
        b'{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"x":1}'
    ),
    "unknown-entry-field": (
        b'{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v","z":""}]}]}'
    ),
    "both-spellings": (
        b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}],"hitsAddend":1,"hits_addend":1}]}'
    ),
    "domain-number": b'{"domain":5,"descriptors":[{"entries":[]}]}',
    "negative-hits": b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hitsAddend":-1}',
    "fractional-hits": b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hitsAddend":1.5}',
    "uint32-overflow": (
        b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}],"hitsAddend":4294967296}'
    ),
    "unknown-unit-name": (
        b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}],'
        b'"limit":{"requestsPerUnit":1,"unit":"FORTNIGHT"}}]}'
    ),
    "override-unit-unknown": (
        b'{"domain":"d","descriptors":[{"entries":[{"key":"k"}],'
        b'"limit":{"requestsPerUnit":1,"unit":"UNKNOWN"}}]}'
    ),
    "entries-object": b'{"domain":"d","descriptors":[{"entries":{}}]}',
    "bad-utf8": b'{"domain":"d\xff","descriptors":[{"entries":[]}]}',
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
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
    server = await stub_server(Response(CODE_UNKNOWN, [Status(CODE_UNKNOWN)]))
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
    assert encode_response(Response(CODE_UNKNOWN, [])) == b"{}"


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
