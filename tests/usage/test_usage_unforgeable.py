"""Metering nobody else can move, in the documented production setup (sidecars/usage/README.md,
"Production setup"): ratelimitd serves gRPC only on a unix socket in a directory only the
sidecar's user can enter, its HTTP listener on loopback with `/json` off, no `meter: true`
rule; usage is counted by the sidecar in Redis. An outside caller replays the attack of issue
19 (`POST /json` with `hitsAddend: 99900` on the account descriptor) and tries gRPC over TCP:
neither moves the account's usage, while the sidecar keeps deciding through the socket."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.daemon import DaemonProcess, start_redis_daemon
from support.redis_server import RedisServer

from ratelimitd.transport.client import RateLimitClient, RateLimitError
from sidecars.usage.settings import USAGE_PATH

from .conftest import RATELIMIT_CONFIG, start_sidecar
from .test_usage_gunicorn import account, cli
from .usage_helpers import bearer, session_sqlite_path


@pytest.fixture
def production_daemon(redis_server: RedisServer) -> Iterator[tuple[DaemonProcess, str]]:
    """ratelimitd as the production setup runs it; (daemon, the sidecar's gRPC target)."""
    # A short path: unix socket paths are limited to 107 bytes.
    run = Path(tempfile.mkdtemp(prefix="rl-"))
    socket_dir = run / "ratelimitd"
    socket_dir.mkdir(mode=0o700)
    daemon = start_redis_daemon(
        run,
        redis_server.address,
        RATELIMIT_CONFIG.read_text(),
        GRPC_UDS=str(socket_dir / "grpc.sock"),
        HTTP_JSON_ENABLED="false",
    )
    yield daemon, "unix:" + str(socket_dir / "grpc.sock")
    daemon.close()
    shutil.rmtree(run, ignore_errors=True)


def test_an_outside_caller_cannot_move_an_accounts_usage(
    production_daemon: tuple[DaemonProcess, str],
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    daemon, target = production_daemon
    socket_dir = Path(target.removeprefix("unix:")).parent
    assert os.stat(socket_dir).st_mode & 0o777 == 0o700  # only the sidecar's user enters
    env = {
        "USAGE_REDIS_URL": redis_server.url,
        "USAGE_SQLITE_PATH": session_sqlite_path(),
        "USAGE_RATELIMIT_ADDRESS": target,
        "USAGE_RATELIMIT_FAILURE_MODE": "deny",  # every answer below went through ratelimitd
        "USAGE_INVALID_TOKEN_LIMIT": "1000000",
    }
    sidecar = start_sidecar(env, tmp_path / "gunicorn.log", workers=1)
    acct, token, _ = account(env, "startup")
    try:
        with httpx.Client(base_url=sidecar.base, timeout=10) as client:
            for _ in range(3):
                resp = client.get(USAGE_PATH, headers=bearer(token))
                assert resp.status_code == 200, resp.text
                assert "ratelimit-limit" in resp.headers  # decided over the socket
            assert resp.json()["currentUsage"] == 3

            # The attack: /json on ratelimitd's HTTP port, hitsAddend 99900.
            attack = {
                "domain": "api",
                "descriptors": [{"entries": [{"key": "account", "value": acct}]}],
                "hitsAddend": 99900,
            }
            status, _ = daemon.http("/json", json.dumps(attack).encode())
            assert status == 404
            # gRPC over TCP: nothing listens on GRPC_PORT when GRPC_UDS is set.
            assert not _grpc_tcp_answers(daemon)

            after = client.get(USAGE_PATH, headers=bearer(token))
            assert after.status_code == 200
            assert after.json()["currentUsage"] == 4  # its own request, nothing else
        assert cli(env, "accounts", "show", acct)["currentUsage"] == 4
    finally:
        sidecar.terminate()


def _grpc_tcp_answers(daemon: DaemonProcess) -> bool:
    async def call() -> bool:
        async with RateLimitClient(daemon.grpc_target, timeout=1) as client:
            try:
                await client.should_rate_limit("api", [[("account", "x")]], hits_addend=99900)
            except RateLimitError:
                return False
            return True

    return asyncio.run(call())
