"""No HTTP client can pin memory on the `/json` (and debug) listener.

Before: a client that pipelined 1 MiB requests and never read the answers kept up to 64 of
them queued (50 MB per connection), beyond HTTP_READ_TIMEOUT and HTTP_IDLE_TIMEOUT; and
partial bodies were bounded per connection only (1 MiB each, any number of connections).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from support import attacks
from support.daemon import DaemonProcess, write_config

MIB = 1024 * 1024


def start(daemon_env: dict[str, str], start_daemon: Any, **env: str) -> DaemonProcess:
    full = dict(daemon_env, BACKEND_TYPE="memory", LOG_LEVEL="error", **env)
    write_config(full, "d.yaml", attacks.JSON_CONFIG)
    d = start_daemon(full)
    for _ in range(3):  # the allocator's first arenas
        assert d.decide_json("d", {"k": "warm"})[0] == 200
    return d


async def test_a_client_that_never_reads_is_bounded_and_closed(
    daemon_env: dict[str, str], start_daemon: Any
) -> None:
    """64 pipelined 1 MiB requests whose ~90 KB answers are never read: at most MAX_PIPELINE
    requests or 1 MiB of bodies wait (before: 64, held forever), and the connection is closed
    HTTP_WRITE_TIMEOUT after its answers stopped leaving."""
    d = start(daemon_env, start_daemon, HTTP_WRITE_TIMEOUT="2s")
    base = d.rss_kib()
    held = await asyncio.to_thread(attacks.slow_json_reader, d.http_port, 64, MIB, 1.0)
    try:
        grown = d.rss_kib() - base
        print(f"RSS +{grown} KiB with a client pipelining 1 MiB requests, never reading")
        assert _answer(held.sockets[0]) == b"HTTP/1.1 200"  # valid requests, answered
        # Queued bodies (1 MiB + one read) and the answers in the socket's buffers.
        assert grown < 16 * 1024
        deadline = time.monotonic() + 8
        while held.open_sockets() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert held.open_sockets() == 0
    finally:
        held.close()


async def test_partial_bodies_are_bounded_per_process(
    daemon_env: dict[str, str], start_daemon: Any
) -> None:
    """32 connections each announce a 1 MiB body and send 900 KB of it: MAX_BUFFERED_BYTES
    (8 MiB here) takes 7 of them; the others are answered 503 and closed (before: +28 MB)."""
    d = start(daemon_env, start_daemon, MAX_BUFFERED_BYTES=str(8 * MIB))
    base = d.rss_kib()
    head = b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % MIB
    held = await asyncio.to_thread(attacks.silent_sockets, d.http_port, 32, head + b" " * 900_000)
    try:
        await asyncio.sleep(0.5)
        grown = d.rss_kib() - base
        print(f"RSS +{grown} KiB with 32 partial 1 MiB bodies")
        assert grown < 8 * 1024 + 4 * 1024
        answers = [_answer(s) for s in held.sockets]
        assert answers.count(b"HTTP/1.1 503") >= 24
        assert answers.count(b"") == 32 - answers.count(b"HTTP/1.1 503")  # still waiting
        assert d.decide_json("d", {"k": "v"})[0] == 200  # a whole request is never charged
    finally:
        held.close()


def _answer(sock: socket.socket) -> bytes:
    """The status line the server sent on `sock` so far (b"" if none)."""
    sock.setblocking(False)
    try:
        return sock.recv(65536)[:12]
    except (BlockingIOError, ConnectionError):
        return b""
