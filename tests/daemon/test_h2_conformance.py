"""HTTP/2 and gRPC conformance of the native transport, with raw frames (in the spirit of h2spec).

The client side is hand-built frames (hyperframe, hpack: the `h2` test dependency), so any
malformed or abusive sequence can be sent; the server's frames are parsed back the same way.
Each case checks the answer RFC 9113 (or grpc-go, for gRPC-level input) gives, and that the
server still serves a well-behaved client afterwards.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from ratelimitd.transport._h2 import percent_encode  # type: ignore[import-not-found]
from support.daemon import write_config
from support.h2raw import (
    CONFIG,
    DATA,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    REQUEST,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    TIMEOUT,
    Raw,
    grpc_message,
    still_serves,
)

from ratelimitd.messages import OK
from ratelimitd.transport.native import NativeGrpcTransport
from ratelimitd.transport.protocodec import decode_response

# The transport and a raw client connected to it (the `connected` fixture).
Connected = tuple[NativeGrpcTransport, Raw]


@pytest.fixture
async def connected(native_server: Any, raw_client: Any) -> Connected:
    """`t, c = connected`: a native transport on the default settings and a raw client on it
    (its preface and SETTINGS sent), as most cases here start."""
    t = await native_server()
    return t, await raw_client(t.port)


# -- connection level ---------------------------------------------------------------------


async def test_a_unary_call_over_raw_frames(connected: Connected) -> None:
    _, c = connected
    c.call(1)
    end = await c.stream_end(1)
    assert (end[":status"], end["content-type"], end["grpc-status"]) == (
        "200",
        "application/grpc",
        "0",
    )
    body = b"".join(f.payload for f in c.frames if f.type == DATA and f.stream == 1)
    assert decode_response(body[5:]).overall_code == OK
    c.close()


async def test_bad_connection_preface(native_server: Any, raw_client: Any) -> None:
    t = await native_server()
    c = await raw_client(t.port, preface=False)
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await c.goaway()).error_code() == PROTOCOL_ERROR
    await c.until_closed()
    await still_serves(t.port)


async def test_data_on_an_idle_stream_is_a_connection_error(connected: Connected) -> None:
    t, c = connected
    c.send(DataFrame(1, b"x", flags=["END_STREAM"]).serialize())
    assert (await c.goaway()).error_code() == PROTOCOL_ERROR
    await still_serves(t.port)


async def test_data_on_a_half_closed_stream(connected: Connected) -> None:
    """After the client's END_STREAM, more DATA is a stream error STREAM_CLOSED."""
    t, c = connected
    # Health/Watch keeps its stream open (half-closed remote) after the request.
    c.call(1, grpc_message(b""), _path="/grpc.health.v1.Health/Watch")
    await c.read_until(lambda f: f.stream == 1 and f.type == DATA)
    c.send(DataFrame(1, b"late").serialize())
    frame = (await c.read_until(lambda f: f.type in (RST_STREAM, GOAWAY)))[-1]
    assert frame.error_code() == STREAM_CLOSED
    await still_serves(t.port)


async def test_data_on_a_closed_stream_is_ignored(connected: Connected) -> None:
    """A frame on a stream closed both ways: RFC 9113 lets the server ignore it."""
    _, c = connected
    c.call(1)
    await c.stream_end(1)
    c.send(DataFrame(1, b"late").serialize())
    c.call(3)
    assert (await c.stream_end(3))["grpc-status"] == "0"


@pytest.mark.parametrize("reused", [False, True], ids=["lower", "reused"])
async def test_headers_on_a_lower_or_used_stream_id(connected: Connected, reused: bool) -> None:
    """A new stream's id must exceed every earlier one, and a closed stream takes no more
    HEADERS (HTTP/2's stream states): a connection error PROTOCOL_ERROR, as grpc-go ends
    the connection. Before: nghttp2 ignored the block and the call hung until its deadline."""
    t, c = connected
    c.call(5)
    assert (await c.stream_end(5))["grpc-status"] == "0"
    c.call(5 if reused else 3)
    assert (await c.goaway()).error_code() == PROTOCOL_ERROR
    await still_serves(t.port)


async def test_initial_window_size_overflow_is_a_connection_error(connected: Connected) -> None:
    """A SETTINGS_INITIAL_WINDOW_SIZE that takes an open stream's send window past 2^31-1
    is a connection error FLOW_CONTROL_ERROR in HTTP/2; before, nghttp2
    reset the stream alone."""
    t, c = connected
    # Health/Watch keeps its stream open; its window grown to the largest allowed.
    c.call(1, grpc_message(b""), _path="/grpc.health.v1.Health/Watch")
    await c.read_until(lambda f: f.stream == 1 and f.type == DATA)
    c.send(WindowUpdateFrame(1, 2**31 - 1 - 65535).serialize())
    c.send(SettingsFrame(0, settings={0x4: 65536}).serialize())
    assert (await c.goaway()).error_code() == FLOW_CONTROL_ERROR
    await still_serves(t.port)


async def test_oversized_frame(connected: Connected) -> None:
    t, c = connected
    head = HeadersFrame(1, c.block(c.headers()), flags=["END_HEADERS"]).serialize()
    # A DATA frame one byte over the default SETTINGS_MAX_FRAME_SIZE (16 384).
    big = (16385).to_bytes(3, "big") + bytes([DATA, 0]) + (1).to_bytes(4, "big")
    c.send(head + big + b"\x00" * 16385)
    assert (await c.goaway()).error_code() == FRAME_SIZE_ERROR
    await still_serves(t.port)


@pytest.mark.parametrize(
    "headers",
    [
        {"_path": None},  # missing :path
        {"_method": None},  # missing :method
        {"_foo": "bar"},  # an unknown pseudo-header
        {"Content-Type": "application/grpc"},  # an uppercase name
        {"connection": "keep-alive"},  # a connection-specific header
        {"te": "gzip"},  # TE other than "trailers"
    ],
)
async def test_malformed_request_heads_are_stream_errors(
    connected: Connected, headers: dict[str, Any]
) -> None:
    _, c = connected
    block = c.headers(**{k: v for k, v in headers.items() if k != "Content-Type"})
    if "Content-Type" in headers:
        block = [(k, v) for k, v in block if k != "content-type"]
        block.append(("Content-Type", "application/grpc"))
    frame = HeadersFrame(1, c.block(block), flags=["END_HEADERS", "END_STREAM"])
    c.send(frame.serialize())
    assert (await c.stream_end(1))["rst"] == str(PROTOCOL_ERROR)
    # The connection survives a stream error.
    c.call(3)
    assert (await c.stream_end(3))["grpc-status"] == "0"
    c.close()


async def test_pseudo_header_after_a_regular_one(connected: Connected) -> None:
    _, c = connected
    block = [(k, v) for k, v in c.headers() if k != ":authority"] + [(":authority", "x")]
    c.send(HeadersFrame(1, c.block(block), flags=["END_HEADERS", "END_STREAM"]).serialize())
    assert (await c.stream_end(1))["rst"] == str(PROTOCOL_ERROR)


async def test_header_list_over_the_limit(connected: Connected) -> None:
    t, c = connected
    block = c.headers() + [(f"x-filler-{i}", "v" * 4000) for i in range(20)]  # ~80 KiB
    encoded = c.block(block)
    frames = [encoded[i : i + 16000] for i in range(0, len(encoded), 16000)]
    out = HeadersFrame(1, frames[0], flags=["END_STREAM"]).serialize()
    for i, chunk in enumerate(frames[1:], 1):
        flags = ["END_HEADERS"] if i == len(frames) - 1 else []
        out += ContinuationFrame(1, chunk, flags=flags).serialize()
    c.send(out)
    # grpc-go resets a truncated header list with FRAME_SIZE_ERROR (no HTTP answer).
    assert (await c.stream_end(1))["rst"] == str(FRAME_SIZE_ERROR)
    await still_serves(t.port)


async def test_rst_stream_in_the_middle_of_a_request(connected: Connected) -> None:
    _, c = connected
    c.send(HeadersFrame(1, c.block(c.headers()), flags=["END_HEADERS"]).serialize())
    c.send(DataFrame(1, REQUEST[:4]).serialize() + RstStreamFrame(1, 8).serialize())
    c.call(3)
    assert (await c.stream_end(3))["grpc-status"] == "0"
    assert not [f for f in c.frames if f.stream == 1 and f.type in (HEADERS, DATA)]
    c.close()


async def test_data_beyond_the_stream_window(connected: Connected) -> None:
    t, c = connected
    c.send(HeadersFrame(1, c.block(c.headers()), flags=["END_HEADERS"]).serialize())
    c.send(DataFrame(1, b"\x00" + struct.pack(">I", 4 << 20)).serialize())
    # 3 MiB without reading a WINDOW_UPDATE: far past the 65 535-byte initial window.
    c.send(DataFrame(1, b"x" * 16384).serialize() * 192)
    frame = (await c.read_until(lambda f: f.type in (RST_STREAM, GOAWAY)))[-1]
    assert frame.error_code() == FLOW_CONTROL_ERROR
    await still_serves(t.port)


async def test_max_concurrent_streams(native_server: Any, raw_client: Any) -> None:
    t = await native_server(max_concurrent_streams=4)
    c = await raw_client(t.port)
    await c.read_until(lambda f: f.type == SETTINGS and f.flags & 1)  # ours acknowledged
    settings = next(f for f in c.frames if f.type == SETTINGS and not f.flags & 1)
    values = dict(struct.iter_unpack(">HI", settings.payload))
    assert values[0x3] == 4
    for stream in (1, 3, 5, 7, 9):  # five open streams (no END_STREAM): the fifth is refused
        c.send(HeadersFrame(stream, c.block(c.headers()), flags=["END_HEADERS"]).serialize())
    # RFC 9113 5.1.2 allows a stream error; nghttp2 makes it a connection error.
    last = (await c.read_until(lambda f: f.type in (RST_STREAM, GOAWAY)))[-1]
    assert last.error_code() in (REFUSED_STREAM, PROTOCOL_ERROR)
    assert last.type == GOAWAY or last.stream == 9
    c.close()


# -- floods: answered, bounded, and the server keeps serving -----------------------------


def rss_kib() -> int:
    """This process's resident set (the server runs in it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def assert_rss_bounded(before: int) -> None:
    """The flood left at most 64 MiB behind (printed: `pytest -s` shows the figures)."""
    after = rss_kib()
    print(f"RSS {before} -> {after} KiB")
    assert after - before < 64 * 1024


async def test_continuation_flood(connected: Connected) -> None:
    t, c = connected
    out = HeadersFrame(1, c.block(c.headers())).serialize()  # no END_HEADERS
    out += b"".join(ContinuationFrame(1, b"").serialize() for _ in range(10_000))
    c.send(out)
    assert (await c.goaway()).error_code() != NO_ERROR
    await still_serves(t.port)


async def test_ping_flood_bounded(native_server: Any, raw_client: Any) -> None:
    t = await native_server()
    before = rss_kib()
    c = await raw_client(t.port)
    ping = PingFrame(0, b"12345678").serialize()
    for _ in range(50):
        c.send(ping * 2000)  # 100 000 PINGs, never reading the ACKs
        await asyncio.sleep(0)
    frames = await c.read_until(lambda f: f.type == GOAWAY, timeout=TIMEOUT * 2)
    assert frames[-1].type == GOAWAY and frames[-1].error_code() == ENHANCE_YOUR_CALM
    await still_serves(t.port)
    assert_rss_bounded(before)


async def test_settings_flood_bounded(native_server: Any, raw_client: Any) -> None:
    t = await native_server()
    before = rss_kib()
    c = await raw_client(t.port)
    settings = SettingsFrame(0, settings={0x4: 65535}).serialize()
    for _ in range(50):
        c.send(settings * 2000)
        await asyncio.sleep(0)
    frames = await c.read_until(lambda f: f.type == GOAWAY, timeout=TIMEOUT * 2)
    assert frames[-1].error_code() == ENHANCE_YOUR_CALM
    await still_serves(t.port)
    assert_rss_bounded(before)


async def test_rapid_reset(native_server: Any, raw_client: Any) -> None:
    """CVE-2023-44487: streams opened and reset at once do not count against the limit,
    so the server limits the reset rate and ends such a connection."""
    t = await native_server()
    before = rss_kib()
    c = await raw_client(t.port)
    out = bytearray()
    for i in range(5000):
        stream = 1 + 2 * i
        out += HeadersFrame(
            stream, c.encoder.encode(c.headers()), flags=["END_HEADERS"]
        ).serialize()
        out += RstStreamFrame(stream, 8).serialize()
    c.send(bytes(out))
    goaway = await c.goaway()
    # nghttp2 ends the connection (INTERNAL_ERROR) once its reset bucket (1000) is empty.
    assert goaway.error_code() != NO_ERROR
    last_stream = int.from_bytes(goaway.payload[:4], "big")
    assert last_stream < 2 * 1100
    await still_serves(t.port)
    assert_rss_bounded(before)


# -- gRPC level ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "body", "status", "grpc_status", "message"),
    [
        ({"content_type": "application/json"}, REQUEST, "415", "3",
         'invalid gRPC request content-type "application/json"'),
        ({"content_type": None}, REQUEST, "415", "3", 'invalid gRPC request content-type ""'),
        ({"_method": "PUT"}, REQUEST, "405", "13",
         'Received a HEADERS frame with :method "PUT" which should be POST'),
        ({"grpc_timeout": "18f6n"}, REQUEST, "400", "13",
         "malformed grpc-timeout: timeout string is too long: '18f6n'"[:15]),
        ({"grpc_encoding": "gzip"}, REQUEST, "200", "12",
         'grpc: Decompressor is not installed for grpc-encoding "gzip"'),
        ({}, b"\x01" + REQUEST[1:], "200", "13",
         "grpc: compressed flag set with identity or empty encoding"),
        ({}, b"\x00" + struct.pack(">I", 5 << 20), "200", "8",
         "grpc: received message larger than max (5242880 vs. 4194304)"),
        ({}, grpc_message(b"\xff\xff\xff"), "200", "13", "grpc: error unmarshalling request"),
        ({}, REQUEST[:7], "200", "13", "unexpected EOF"),
        ({}, b"", "200", "2", "EOF"),
        ({"_path": "/envoy.service.ratelimit.v3.RateLimitService/Nope"}, REQUEST, "200", "12",
         "unknown method Nope for service envoy.service.ratelimit.v3.RateLimitService"),
        ({"_path": "/x.Y/Z"}, REQUEST, "200", "12", "unknown service x.Y"),
        ({"_path": "/nonsense"}, REQUEST, "200", "12", 'malformed method name: "/nonsense"'),
    ],
)  # fmt: skip
async def test_grpc_requests_grpc_go_refuses(
    connected: Connected,
    headers: dict[str, Any],
    body: bytes,
    status: str,
    grpc_status: str,
    message: str,
) -> None:
    t, c = connected
    c.call(1, body, **headers)
    end = await c.stream_end(1)
    assert (end[":status"], end["grpc-status"]) == (status, grpc_status)
    assert end["grpc-message"].replace("%22", '"').replace("%27", "'").startswith(message)
    await still_serves(t.port)


async def test_an_oversized_message_is_refused_before_it_is_read(connected: Connected) -> None:
    _, c = connected
    c.send(HeadersFrame(1, c.block(c.headers()), flags=["END_HEADERS"]).serialize())
    c.send(DataFrame(1, b"\x00" + struct.pack(">I", 5 << 20) + b"x" * 1000).serialize())
    end = await c.stream_end(1)
    assert end["grpc-status"] == "8"
    # The client is told to stop sending the rest (RST_STREAM NO_ERROR after the trailers).
    frames = await c.read_until(lambda f: f.stream == 1 and f.type == RST_STREAM)
    assert frames[-1].error_code() == NO_ERROR
    c.send(WindowUpdateFrame(0, 1).serialize())
    c.call(3)
    assert (await c.stream_end(3))["grpc-status"] == "0"


def test_grpc_message_percent_encoding() -> None:
    assert percent_encode("plain text") == b"plain text"
    assert percent_encode("50% off\n") == b"50%25 off%0A"
    assert percent_encode("café") == b"caf%C3%A9"


async def test_max_connection_age_sends_goaway_then_closes(
    native_server: Any, raw_client: Any
) -> None:
    t = await native_server(max_connection_age=0.3, max_connection_age_grace=0.3)
    c = await raw_client(t.port)
    c.send(HeadersFrame(1, c.block(c.headers()), flags=["END_HEADERS"]).serialize())
    first = await c.goaway()  # the notice (last stream 2^31-1), then the final one
    assert first.error_code() == NO_ERROR
    # The open stream keeps the connection until the grace ends, then it is closed.
    frames = await c.until_closed()
    assert [f for f in frames if f.type == GOAWAY]


# -- deadlines ----------------------------------------------------------------------------


async def test_deadlines_under_a_millisecond_apart_keep_the_connection(
    daemon_env: dict[str, str], start_daemon: Any, redis_server: Any, raw_client: Any
) -> None:
    """grpc-timeouts that expire within uvloop's 1 ms timer resolution, on calls that wait for
    Redis: every call is answered and the connection lives (the deadline timer was once a
    plain Handle there, and the next call's comparison with it reset the whole connection)."""
    env = dict(
        daemon_env, BACKEND_TYPE="redis", REDIS_SOCKET_TYPE="tcp", REDIS_URL=redis_server.address
    )
    write_config(env, "test.yaml", CONFIG)
    daemon = start_daemon(env)
    c = await raw_client(int(daemon.grpc_target.rpartition(":")[2]))
    streams = range(1, 40, 2)
    c.send(
        b"".join(
            HeadersFrame(
                s, c.block(c.headers(grpc_timeout="200u")), flags=["END_HEADERS"]
            ).serialize()
            + DataFrame(s, REQUEST, flags=["END_STREAM"]).serialize()
            for s in streams
        )
    )
    for s in streams:
        end = await c.stream_end(s)
        assert end.get("grpc-status") in ("0", "4"), end  # OK or DEADLINE_EXCEEDED
    c.call(41, grpc_timeout="5S")
    assert (await c.stream_end(41))["grpc-status"] == "0"
    assert not c.closed
