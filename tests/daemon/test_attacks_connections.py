"""Connections that never get to a request cannot lock clients out of any listener.

Before: TLS connections that never finished their handshake were not counted (24,000 used
all 20,000 descriptors: TLS gRPC, /healthcheck and debug failed); 4,100 connections that
never sent the HTTP/2 preface filled GRPC_MAX_CONNECTIONS with no timeout (new clients got
UNAVAILABLE indefinitely); idle HTTP connections at the cap made /healthcheck refuse new
connections (Kubernetes then restarts the pod). Now a connection counts from its accept, a
gRPC one must finish its handshake and preface within GRPC_CONNECTION_TIMEOUT, and a full
listener closes its longest-idle connection with no request in progress to let a new one in.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import grpc
import pytest
from support import attacks
from support.daemon import DaemonProcess, write_config
from support.h2raw import CONFIG
from support.pki import Pki
from support.settings_env import error

from ratelimitd.backends import load_settings
from ratelimitd.messages import OK
from ratelimitd.settings import SettingsError
from ratelimitd.transport.grpc import METHOD_PATH
from ratelimitd.transport.limits import NEVER_USED, USED, Eviction, IdleKey
from ratelimitd.transport.protocodec import decode_response, encode_request

REQUEST = b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n"


async def decision(target: str, creds: grpc.ChannelCredentials | None = None) -> int:
    """One ShouldRateLimit on a new connection: the overall code."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    if creds is None:
        channel = grpc.aio.insecure_channel(target, options=options)
    else:
        channel = grpc.aio.secure_channel(target, creds, options=options)
    async with channel:
        raw = await channel.unary_unary(METHOD_PATH)(
            encode_request("test", [[("k", "v")]]), timeout=5
        )
    return decode_response(raw).overall_code


def start(daemon_env: dict[str, str], start_daemon: Any, **env: str) -> DaemonProcess:
    full = dict(daemon_env, BACKEND_TYPE="memory", LOG_LEVEL="error", **env)
    write_config(full, "test.yaml", CONFIG)
    return start_daemon(full)


def probe(port: int) -> socket.socket:
    """A health probe answered 200 on a connection it keeps open (keep-alive)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(REQUEST)
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    time.sleep(0.02)  # distinct idle times
    return s


async def wait_closed(held: attacks.Held, within: float) -> int:
    """How many of `held`'s sockets the server still has open after at most `within` s."""
    deadline = time.monotonic() + within
    while (left := held.open_sockets()) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return left


async def test_tls_handshakes_count_and_time_out(
    daemon_env: dict[str, str], start_daemon: Any, certs: Pki
) -> None:
    """150 connections sending half a ClientHello at a listener capped at 40: the daemon holds
    at most 40 (the newest; each newcomer closes the oldest unfinished handshake), a real TLS
    client still gets a decision, and the rest are closed after GRPC_CONNECTION_TIMEOUT."""
    d = start(
        daemon_env,
        start_daemon,
        GRPC_MAX_CONNECTIONS="40",
        GRPC_CONNECTION_TIMEOUT="2s",
        **certs.server_env(),
    )
    fds = d.open_fds()
    held = await asyncio.to_thread(attacks.silent_sockets, d.grpc_port, 150, attacks.CLIENT_HELLO)
    try:
        await asyncio.sleep(0.5)
        print(f"daemon descriptors {fds} -> {d.open_fds()} with 150 half handshakes")
        assert d.open_fds() <= fds + 40 + 4
        assert held.open_sockets() <= 40
        assert await decision(d.grpc_target, certs.creds(certs.ca)) == OK
        assert await wait_closed(held, 6) == 0
    finally:
        held.close()


async def test_connections_without_a_preface_do_not_hold_the_cap(
    daemon_env: dict[str, str], start_daemon: Any
) -> None:
    d = start(daemon_env, start_daemon, GRPC_MAX_CONNECTIONS="20", GRPC_CONNECTION_TIMEOUT="1s")
    held = await asyncio.to_thread(attacks.silent_sockets, d.grpc_port, 30)
    try:
        assert await decision(d.grpc_target) == OK  # before: UNAVAILABLE
        assert await wait_closed(held, 5) == 0  # no preface within 1 s: closed
    finally:
        held.close()


async def test_idle_http_connections_make_room_for_health_probes(
    daemon_env: dict[str, str], start_daemon: Any
) -> None:
    """Both listeners full of idle connections (some used, some never): /healthcheck and the
    debug listener still answer new clients; the connections closed for them are the ones
    that never sent a request, then the longest-idle keep-alive one."""
    d = start(daemon_env, start_daemon, HTTP_MAX_CONNECTIONS="10", DEBUG_MAX_CONNECTIONS="4")
    used = attacks.Held(sockets=[probe(d.http_port) for _ in range(4)])  # oldest first
    never = await asyncio.to_thread(attacks.silent_sockets, d.http_port, 6)
    debug = await asyncio.to_thread(attacks.silent_sockets, d.debug_port, 4)
    probes = attacks.Held()
    try:
        for _ in range(6):  # each keeps its connection: the six that never sent go first
            probes.sockets.append(probe(d.http_port))
        assert never.open_sockets() == 0
        assert used.open_sockets() == 4
        probes.sockets.append(probe(d.http_port))  # then the longest-idle keep-alive one
        assert attacks.Held(sockets=used.sockets[:1]).open_sockets() == 0
        assert attacks.Held(sockets=used.sockets[1:]).open_sockets() == 3
        assert d.debug("/rlconfig", timeout=3)[0] == 200
        assert debug.open_sockets() == 3
    finally:
        for group in (used, never, debug, probes):
            group.close()


async def test_a_full_listener_of_requests_in_progress_refuses(
    daemon_env: dict[str, str], start_daemon: Any
) -> None:
    """Every connection in the middle of a request: nothing is idle, so the newcomer is
    closed at once; the other listeners serve as usual."""
    d = start(daemon_env, start_daemon, HTTP_MAX_CONNECTIONS="6", HTTP_READ_TIMEOUT="30s")
    busy = await asyncio.to_thread(attacks.silent_sockets, d.http_port, 6, b"GET /health")
    try:
        await asyncio.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", d.http_port), timeout=5)
        extra.settimeout(3)
        assert extra.recv(1) == b""  # closed at once
        extra.close()
        assert busy.open_sockets() == 6
        assert await decision(d.grpc_target) == OK
        assert d.debug("/rlconfig")[0] == 200
    finally:
        busy.close()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"MAX_BUFFERED_BYTES": "1048576"},
            "MAX_BUFFERED_BYTES: invalid value '1048576' (expected an integer 8388608-2147483647)",
        ),
        (
            {"GRPC_WRITE_TIMEOUT": "0"},
            "GRPC_WRITE_TIMEOUT: invalid value '0' "
            "(expected a Go duration > 0 such as 10s, 150us, 1h30m or 0)",
        ),
        (
            {"GRPC_CONNECTION_TIMEOUT": "soon"},
            "GRPC_CONNECTION_TIMEOUT: invalid value 'soon' "
            "(expected a Go duration > 0 such as 10s, 150us, 1h30m or 0)",
        ),
        (
            {"HTTP_WRITE_TIMEOUT": "-1s"},
            "HTTP_WRITE_TIMEOUT: invalid value '-1s' "
            "(expected a Go duration > 0 such as 10s, 150us, 1h30m or 0)",
        ),
        (
            {"MAX_DESCRIPTOR_VALUE_LENGTH": "0"},
            "MAX_DESCRIPTOR_VALUE_LENGTH: invalid value '0' (expected an integer 1-2147483647)",
        ),
    ],
)
def test_the_settings_refuse_invalid_values(env: dict[str, str], message: str) -> None:
    assert error(**env) == message


@pytest.mark.parametrize(
    "name", ["GRPC_MAX_CONNECTIONS", "GRPC_WRITE_TIMEOUT", "GRPC_CONNECTION_TIMEOUT"]
)
def test_the_native_settings_refuse_grpc_aio(name: str) -> None:
    # Refused with the other settings checks (settings/checks.py), before anything is built.
    value = "7" if name == "GRPC_MAX_CONNECTIONS" else "3s"
    env = {"BACKEND_TYPE": "memory", "GRPC_TRANSPORT": "grpcio", name: value}
    with pytest.raises(SettingsError, match=f"{name}.* need the native gRPC transport"):
        load_settings(env)


class Fake:
    """A connection as limits.Eviction sees it."""

    def __init__(self, key: IdleKey | None, live: set[Fake]) -> None:
        self.key, self.live = key, live
        live.add(self)

    def idle_key(self) -> IdleKey | None:
        return self.key

    def evict(self) -> None:
        self.live.discard(self)


def test_eviction_order_and_its_cost_under_a_flood() -> None:
    now = [0.0]
    live: set[Fake] = set()
    busy = [Fake(None, live) for _ in range(40)]
    old_idle, new_idle = Fake((USED, 5.0), live), Fake((USED, 9.0), live)
    never = Fake((NEVER_USED, 7.0), live)
    eviction = Eviction(clock=lambda: now[0])
    assert eviction.evict(live) and never not in live  # never used: first, whatever its age
    assert eviction.evict(live) and old_idle not in live  # then the longest idle
    assert eviction.evict(live) and new_idle not in live
    assert not eviction.evict(live)  # only requests in progress: refuse
    busy[0].key = (USED, 1.0)  # idle now, but the last scan found nothing idle ...
    assert not eviction.evict(live)  # ... so no scan for a moment, whatever the flood
    now[0] += 0.2
    assert eviction.evict(live) and busy[0] not in live
