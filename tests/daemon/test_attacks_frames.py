"""Frames that do no work, and header blocks that cost the loop, are bounded per connection
(the native transport's frame meter: GOAWAY ENHANCE_YOUR_CALM, then the connection closes).

Before (each measured on the 2-core machine): one connection streaming empty DATA frames on
an open stream, PRIORITY frames on idle streams or frames of an unknown type kept a core at
100 % (another client's decisions 0.9 ms -> 39-98 ms) and was never cut off; 5,553 HPACK
bomb blocks of 147 KB in 10 s on one connection took another client's /json p50 from 1 to
99 ms. Each test here sends far more than the bound and expects the GOAWAY, the close, and
the server still answering a fresh client.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import pytest
from ratelimitd.transport._h2 import HEADER_BYTES_BURST, IDLE_FRAMES  # type: ignore[import-not-found]
from support import attacks
from support.h2raw import ENHANCE_YOUR_CALM, GOAWAY, REQUEST, RST_STREAM, Raw, still_serves

# Far more than the bound: without it, the server reads them all and answers nothing.
FLOOD = 50 * IDLE_FRAMES


@pytest.mark.parametrize("kind", sorted(attacks.IDLE_FRAME_KINDS))
async def test_frames_without_progress_end_the_connection(
    native_server: Any, raw_client: Any, kind: str
) -> None:
    t = await native_server()
    c: Raw = await raw_client(t.port)
    await attacks.idle_frames(c, kind, FLOOD)
    frames = await c.until_closed()
    goaway = [f for f in frames if f.type == GOAWAY]
    assert goaway and goaway[-1].error_code() == ENHANCE_YOUR_CALM, frames[-4:]
    await still_serves(t.port)


async def test_frames_between_calls_are_within_the_bound(
    native_server: Any, raw_client: Any
) -> None:
    """A client that sends a few frames without progress between its calls (WINDOW_UPDATEs,
    an empty DATA, a PRIORITY) is never cut off: progress resets the count."""
    t = await native_server()
    c: Raw = await raw_client(t.port)
    for i in range(20):
        stream = 1 + 2 * i
        await attacks.idle_frames(c, "window_update", IDLE_FRAMES // 2)
        c.call(stream)
        assert (await c.stream_end(stream))["grpc-status"] == "0"
    assert not any(f.type == GOAWAY for f in c.frames)


async def test_an_hpack_bomb_stream_ends_the_connection(
    native_server: Any, raw_client: Any
) -> None:
    """Bomb blocks (147 KB each, ~143,000 references to one 4,000-byte header) sent without
    pause: each stream is reset at the header list limit, and once the connection has sent
    HEADER_BYTES_BURST of header blocks faster than they refill, it gets GOAWAY
    ENHANCE_YOUR_CALM (before: every block was decoded, for as long as the client went on)."""
    t = await native_server()
    blocks = attacks.hpack_bomb_blocks(40)
    c: Raw = await raw_client(t.port)
    for data in blocks:
        c.send(data)
    frames = await c.until_closed()
    goaway = [f for f in frames if f.type == GOAWAY]
    assert goaway and goaway[-1].error_code() == ENHANCE_YOUR_CALM
    resets = [f for f in frames if f.type == RST_STREAM]
    # At most the burst's worth of blocks was decoded.
    assert 1 <= len(resets) <= HEADER_BYTES_BURST // len(blocks[1]) + 1
    await still_serves(t.port)


async def test_a_busy_connection_is_not_a_flood(native_server: Any, tmp_path: Any) -> None:
    """One connection asking far faster than the header bytes refill with time (h2load,
    32 streams, 48-byte heads: 1 MiB of them in about 21,700 calls) is never cut off: each
    answered call gives its head's bytes back. Before, past ~22k calls/s a connection got
    GOAWAY ENHANCE_YOUR_CALM, and an Envoy that busy lost every limit."""
    h2load = shutil.which("h2load")
    assert h2load, "h2load (nghttp2-client) is installed by scripts/bootstrap.sh"
    t = await native_server(max_concurrent_streams=64)
    body = tmp_path / "request.bin"
    body.write_bytes(REQUEST)
    calls = 20 * HEADER_BYTES_BURST // 48
    proc = await asyncio.create_subprocess_exec(
        h2load,
        "-c",
        "1",
        "-m",
        "32",
        "-n",
        str(calls),
        f"--data={body}",
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        f"http://127.0.0.1:{t.port}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    report = out.decode()
    assert f"{calls} succeeded, 0 failed, 0 errored" in report, report
