"""End to end: redis-server, ratelimitd and the usage API under real gunicorn.

Accounts and tokens come from the CLI, as in the README.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import REPO, free_port
from support.daemon import DaemonProcess
from support.redis_server import RedisServer
from support.sidecar import Gunicorn

from sidecars.usage.settings import USAGE_PATH

from .conftest import start_sidecar
from .usage_helpers import bearer, session_sqlite_path, unique

# A new connection per request: kept-alive ones would always reach the same worker.
FRESH = {"Connection": "close"}


def cli(target: str | dict[str, str], *argv: str) -> dict:  # type: ignore[type-arg]
    """`python -m sidecars.usage ...` as an operator runs it; its JSON output. `target` is the
    Redis URL (with the session's SQLite file) or the USAGE_* settings."""
    settings = (
        {"USAGE_REDIS_URL": target, "USAGE_SQLITE_PATH": session_sqlite_path()}
        if isinstance(target, str)
        else target
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), **settings}
    out = subprocess.run(
        [sys.executable, "-m", "sidecars.usage", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def account(redis_url: str | dict[str, str], plan: str) -> tuple[str, str, str]:
    """A new account with a token from the CLI: (account id, token, token id)."""
    acct = unique()
    cli(redis_url, "accounts", "create", acct, "--plan", plan)
    issued = cli(redis_url, "tokens", "issue", acct)
    return acct, issued["token"], issued["id"]


def test_metered_requests_appear_in_current_usage_and_revocation_is_immediate(
    sidecar: Gunicorn, redis_server: RedisServer
) -> None:
    acct, token, token_id = account(redis_server.url, "startup")
    headers = {**bearer(token), **FRESH}
    with httpx.Client(base_url=sidecar.base, timeout=10) as client:
        seen = []
        for _ in range(8):
            resp = client.get(USAGE_PATH, headers=headers)
            assert resp.status_code == 200, resp.text
            seen.append(resp.json()["currentUsage"])
        # Both workers answer; each request is metered before its own answer is built, so the
        # count has no lag beyond requests in flight (none here).
        assert seen == list(range(1, 9))
        body = client.get(USAGE_PATH, params={"format": "json"}, headers=headers).json()
        assert body["planName"] == "startup" and body["usageWindow"] == "billing_cycle"
        assert body["currentUsage"] == 9 and body["remainingUsage"] == 100_000 - 9
        assert cli(redis_server.url, "accounts", "show", acct)["currentUsage"] == 9
        cli(redis_server.url, "tokens", "revoke", acct, token_id)
        for _ in range(2):  # whichever worker answers
            revoked = client.get(USAGE_PATH, headers=headers)
            assert revoked.status_code == 401
            assert 'error="invalid_token"' in revoked.headers["www-authenticate"]


def test_http_semantics_over_real_http(sidecar: Gunicorn, redis_server: RedisServer) -> None:
    _, token, _ = account(redis_server.url, "pro")
    with httpx.Client(base_url=sidecar.base, timeout=10) as client:
        head = client.head(USAGE_PATH, headers=bearer(token))
        assert head.status_code == 200 and head.content == b""
        assert int(head.headers["content-length"]) > 0
        options = client.options(USAGE_PATH)
        assert options.status_code == 204 and options.headers["allow"] == "GET, HEAD, OPTIONS"
        post = client.post(USAGE_PATH, headers=bearer(token))
        assert post.status_code == 405 and post.json()["error"] == "method_not_allowed"
        missing = client.get(USAGE_PATH)
        assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith(
            "Bearer"
        )
        bad_format = client.get(USAGE_PATH, params={"format": "xml"}, headers=bearer(token))
        assert bad_format.status_code == 400 and bad_format.json()["supportedValues"] == ["json"]
        assert client.get("/openapi.json").json()["openapi"].startswith("3.1")


@pytest.fixture(scope="module")
def quota_sidecar(
    redis_server: RedisServer, daemon: DaemonProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gunicorn]:
    """One worker, free plan limited to 5, no quota exemption."""
    plans = Path(tmp_path_factory.mktemp("plans")) / "plans.yaml"
    plans.write_text("plans:\n  free: {limit: 5}\n")
    s = start_sidecar(
        {
            "USAGE_REDIS_URL": redis_server.url,
            "USAGE_SQLITE_PATH": session_sqlite_path(),
            "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
            "USAGE_RATELIMIT_TIMEOUT_SECONDS": "2",
            "USAGE_REDIS_TIMEOUT_SECONDS": "2",
            "USAGE_PLANS_FILE": str(plans),
            "USAGE_QUOTA_EXEMPT_PATHS": "",
        },
        plans.parent / "gunicorn.log",
        workers=1,
    )
    yield s
    s.terminate()


def test_quota_enforcement_switches_to_429_at_plan_limit(
    quota_sidecar: Gunicorn, redis_server: RedisServer
) -> None:
    acct, token, _ = account(redis_server.url, "free")
    with httpx.Client(base_url=quota_sidecar.base, timeout=10) as client:
        statuses = [client.get(USAGE_PATH, headers=bearer(token)).status_code for _ in range(5)]
        assert statuses == [200] * 5
        refused = client.get(USAGE_PATH, headers=bearer(token))
        assert refused.status_code == 429 and refused.json()["error"] == "quota_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        # Refused requests are not metered: the sum is still 5.
        assert client.get(USAGE_PATH, headers=bearer(token)).status_code == 429
    assert cli(redis_server.url, "accounts", "show", acct)["currentUsage"] == 5


def test_redis_down_is_503_under_gunicorn(
    daemon: DaemonProcess, redis_server: RedisServer, tmp_path: Path
) -> None:
    _, token, _ = account(redis_server.url, "pro")  # in the database, which is up
    s = start_sidecar(
        {
            "USAGE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "USAGE_SQLITE_PATH": session_sqlite_path(),
            "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
        },
        tmp_path / "gunicorn.log",
        workers=1,
    )
    try:
        with httpx.Client(base_url=s.base, timeout=10) as client:
            started = time.monotonic()
            resp = client.get(USAGE_PATH, headers=bearer(token))
            assert time.monotonic() - started < 2
            assert resp.status_code == 503 and int(resp.headers["retry-after"]) >= 1
            health = client.get("/health")
            assert health.status_code == 200 and health.json()["status"] == "degraded"
            assert health.json()["counters"] == "unavailable"
    finally:
        s.terminate()
