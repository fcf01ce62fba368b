"""No client can exhaust the daemon's connections or hold one forever.

Before: 21,000 idle TCP connections exhausted the open-file limit (then /healthcheck failed,
new gRPC connections hung and the debug port died), slowloris connections (1 byte/s) were
kept forever, and a gRPC stream whose body never completed was never answered.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import grpc
import pytest
from support import http_get, wait_until
from support.core import single_rule
from support.daemon import (
    DaemonProcess,
    LowNofileDaemon,
    metrics_port,
    prometheus_env,
    write_config,
)
from support.process import Proc

from ratelimitd.messages import OK
from ratelimitd.transport.grpc import METHOD_PATH
from ratelimitd.transport.protocodec import decode_response, encode_request

CONFIG = single_rule("d", "hour", 1000)
REQUEST = b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
BODY = b'{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}'


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` within `within` seconds (EOF or reset)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


async def grpc_ok(target: str) -> bool:
    async with grpc.aio.insecure_channel(
        target, options=[("grpc.use_local_subchannel_pool", 1)]
    ) as channel:
        raw = await channel.unary_unary(METHOD_PATH)(
            encode_request("d", [[("k", "v")]]), timeout=10
        )
    return decode_response(raw).overall_code == OK


@pytest.fixture
def daemon(daemon_env: dict[str, str], start_daemon: Any) -> DaemonProcess:
    env = dict(
        daemon_env,
        BACKEND_TYPE="memory",
        HTTP_READ_TIMEOUT="1s",
        HTTP_IDLE_TIMEOUT="1s",
        GRPC_READ_TIMEOUT="1s",
    )
    write_config(env, "d.yaml", CONFIG)
    return start_daemon(env)


def test_slowloris_is_closed_after_the_read_timeout(daemon: DaemonProcess) -> None:
    with connect(daemon.http_port) as s:
        start = time.monotonic()
        head = REQUEST % len(BODY)
        closed = False
        for byte in head:  # one byte every 0.2 s: the head would take 10 s
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.2)
            if time.monotonic() - start > 4:
                break
        assert closed or closed_by_server(s, 3)
        assert time.monotonic() - start < 5


def test_an_idle_keep_alive_connection_is_closed(daemon: DaemonProcess) -> None:
    with connect(daemon.http_port) as s:
        s.sendall(REQUEST % len(BODY) + BODY)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        assert closed_by_server(s, 4)


async def test_an_incomplete_grpc_request_is_answered(daemon: DaemonProcess) -> None:
    """HEADERS, then a body that never ends: answered DEADLINE_EXCEEDED after 1 s."""
    from hpack import Decoder, Encoder
    from hyperframe.frame import DataFrame, HeadersFrame, SettingsFrame

    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.grpc_port)
    head = Encoder().encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", METHOD_PATH),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )
    writer.write(
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + SettingsFrame(0).serialize()
        + HeadersFrame(1, head, flags=["END_HEADERS"]).serialize()
        + DataFrame(1, b"\x00\x00\x00\x00\x10partial").serialize()  # 16 bytes promised
    )
    await writer.drain()
    decoder, status = Decoder(), None
    start = time.monotonic()
    while status is None and time.monotonic() - start < 5:
        frame = await asyncio.wait_for(reader.readexactly(9), 5)
        payload = await reader.readexactly(int.from_bytes(frame[:3], "big"))
        if frame[3] == 0x1 and int.from_bytes(frame[5:9], "big") == 1:  # HEADERS, stream 1
            status = dict(decoder.decode(payload)).get("grpc-status")
    assert status == "4"  # DEADLINE_EXCEEDED
    assert 0.9 <= time.monotonic() - start < 4
    writer.close()


async def test_fds_are_kept_for_the_rest_when_clients_flood(
    daemon_env: dict[str, str], tmp_path: Any
) -> None:
    """600 descriptors: 600 - 256 in reserve = 344 for clients, at most 172 per listener."""
    env = dict(daemon_env, BACKEND_TYPE="memory", RUNTIME_WATCH_ROOT="false")
    write_config(env, "d.yaml", CONFIG)
    d = LowNofileDaemon(env, tmp_path / "low.log", 600).wait_ready()
    flood: list[socket.socket] = []
    try:
        for _ in range(400):
            flood.append(connect(d.http_port))
        await asyncio.sleep(0.5)
        alive = [s for s in flood if not closed_by_server(s, 0.01)]
        assert len(alive) == 172
        assert await grpc_ok(d.grpc_target)  # a new gRPC connection still gets in
        assert d.debug("/rlconfig")[0] == 200
        # A config reload still reads its files.
        write_config(env, "e.yaml", CONFIG.replace("domain: d", "domain: e"))
        await wait_until(lambda: b"e.k" in d.debug("/rlconfig")[1], timeout=15)
    finally:
        for s in flood:
            s.close()
        Proc.close(d)


async def test_the_metrics_listener_counts_in_the_budget(
    daemon_env: dict[str, str], tmp_path: Any
) -> None:
    """USE_PROMETHEUS: 400 idle connections to PROMETHEUS_ADDR under 600 descriptors. The
    metrics listener takes the debug listener's cap (DEBUG_MAX_CONNECTIONS, 64) in the one
    budget and closes its idlest connection for a newcomer, so a scrape still gets in and
    the other listeners keep theirs (before: it had its own 4,096 and took every
    descriptor: /healthcheck and debug failed, new gRPC calls UNAVAILABLE)."""
    env = dict(daemon_env, BACKEND_TYPE="memory", RUNTIME_WATCH_ROOT="false", **prometheus_env())
    port = metrics_port(env)
    write_config(env, "d.yaml", CONFIG)
    d = LowNofileDaemon(env, tmp_path / "low.log", 600).wait_ready()
    flood: list[socket.socket] = []
    try:
        for _ in range(400):
            flood.append(connect(port))
        await asyncio.sleep(0.5)
        alive = [s for s in flood if not closed_by_server(s, 0.01)]
        assert len(alive) <= 64
        assert await grpc_ok(d.grpc_target)
        assert d.http("/healthcheck")[0] == 200
        assert d.debug("/rlconfig")[0] == 200
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and b"ratelimit" in body
    finally:
        for s in flood:
            s.close()
        Proc.close(d)


def test_a_second_instance_on_the_same_ports_is_refused(
    daemon: DaemonProcess, serve_until_exit: Any
) -> None:
    """A lone daemon binds its ports without SO_REUSEPORT: a second instance (or one left
    over) fails with "address in use" as the reference does, instead of binding them too
    and taking part of the traffic (only RATELIMITD_WORKERS' workers share them)."""
    done = serve_until_exit(daemon.env, 30)
    assert done.returncode == 1
    assert "address already in use" in (done.stdout + done.stderr).lower()
    assert daemon.ready()
