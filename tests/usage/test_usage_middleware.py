"""The rate-limit middleware against a real ratelimitd on Redis: decisions, metering, quota,
failure policy. Apps run in process (httpx ASGI transport); gunicorn is test_usage_gunicorn."""

from __future__ import annotations

import time

import falcon
import falcon.asgi
import httpx
import pytest
from support import free_port
from support.daemon import DaemonProcess
from support.redis_server import RedisServer

from sidecars.common.ratelimit import RateLimitConfig, RateLimitMiddleware, bearer_token
from sidecars.usage.app import rate_limit_middleware
from sidecars.usage.settings import USAGE_PATH
from sidecars.usage.store import UsageStore

from .usage_helpers import (
    TEST_PLANS,
    account_with_token,
    bearer,
    daemon_settings,
    serving,
    settings_for,
)


def test_bearer_token_parsing() -> None:
    assert bearer_token(None) is None
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("BEARER  abc ") == "abc"
    assert bearer_token("Bearer") == ""
    assert bearer_token("Bearer a b") == ""


async def test_requests_are_metered_into_current_usage(
    redis_server: RedisServer, daemon: DaemonProcess
) -> None:
    settings = daemon_settings(redis_server, daemon)
    async with serving(settings) as (client, store):
        _, token = await account_with_token(store, "pro")
        for expected in range(1, 6):
            resp = await client.get(USAGE_PATH, headers=bearer(token))
            assert resp.status_code == 200, resp.text
            # ratelimitd counts before it answers: the request sees its own hit.
            assert resp.json()["currentUsage"] == expected
            assert int(resp.headers["ratelimit-limit"]) > 0
            assert "ratelimit-remaining" in resp.headers and "ratelimit-reset" in resp.headers


async def test_over_limit_is_429_with_retry_after_and_ratelimit_headers(
    redis_server: RedisServer, daemon: DaemonProcess
) -> None:
    settings = daemon_settings(redis_server, daemon)
    async with serving(settings) as (client, store):
        # The test config limits account `tight` on plan free to 3 per minute.
        _, token = await account_with_token(store, "free", account_id="tight")
        statuses = []
        for _ in range(4):
            resp = await client.get(USAGE_PATH, headers=bearer(token))
            statuses.append(resp.status_code)
        assert statuses[-1] == 429, statuses
        assert resp.json()["error"] == "rate_limited"
        assert 1 <= int(resp.headers["retry-after"]) <= 60
        assert resp.headers["ratelimit-limit"] == "3"
        assert resp.headers["ratelimit-remaining"] == "0"
        assert 0 <= int(resp.headers["ratelimit-reset"]) <= 60


async def test_quota_switches_to_429_at_plan_limit(
    redis_server: RedisServer, daemon: DaemonProcess
) -> None:
    # No exempt paths, so the usage endpoint itself is held to the quota (free: 5).
    settings = daemon_settings(redis_server, daemon, quota_exempt_paths=())
    async with serving(settings) as (client, store):
        _, token = await account_with_token(store, "free")
        for n in range(1, 6):
            resp = await client.get(USAGE_PATH, headers=bearer(token))
            assert resp.status_code == 200, (n, resp.text)
            assert resp.json()["currentUsage"] == n
        refused = await client.get(USAGE_PATH, headers=bearer(token))
        assert refused.status_code == 429
        assert refused.json()["error"] == "quota_exceeded"
        # Rolling window, all usage today: room again when today's bucket ages out, at the
        # start of the 31st day from now.
        assert 30 * 86400 <= int(refused.headers["retry-after"]) <= 31 * 86400 + 1
    # With the default exemption the account can still see where it stands.
    settings = daemon_settings(redis_server, daemon)
    async with serving(settings) as (client, store):
        again = await client.get(USAGE_PATH, headers=bearer(token))
        assert again.status_code == 200
        assert again.json()["remainingUsage"] == 0


async def test_anonymous_callers_are_limited_by_address(
    redis_server: RedisServer, daemon: DaemonProcess
) -> None:
    settings = daemon_settings(redis_server, daemon)
    async with serving(settings) as (client, _):
        resp = await client.get(USAGE_PATH)
        # Decided by ratelimitd (remote_address rule), then refused by the resource.
        assert resp.status_code == 401
        assert resp.headers["ratelimit-limit"] == "100000"
        bad = await client.get(USAGE_PATH, headers=bearer("nope"))
        assert bad.status_code == 401 and 'error="invalid_token"' in bad.headers["www-authenticate"]
        # Exempt paths are never decided.
        health = await client.get("/health")
        assert health.status_code == 200 and "ratelimit-limit" not in health.headers


@pytest.mark.parametrize("mode", ["allow", "deny"])
@pytest.mark.parametrize("where", ["refused", "silent"])
async def test_ratelimitd_unreachable_follows_the_failure_mode(
    redis_server: RedisServer, mode: str, where: str, black_hole: int
) -> None:
    port = free_port() if where == "refused" else black_hole
    address = f"127.0.0.1:{port}"
    settings = settings_for(
        redis_server.url,
        ratelimit_address=address,
        ratelimit_failure_mode=mode,
        ratelimit_timeout_seconds=0.2,
    )
    async with serving(settings) as (client, store):
        _, token = await account_with_token(store, "pro")
        started = time.monotonic()
        resp = await client.get(USAGE_PATH, headers=bearer(token))
        assert time.monotonic() - started < 1.5  # the deadline, not a hang
        if mode == "allow":
            # Served, and still counted: usage is the sidecar's, not ratelimitd's.
            assert resp.status_code == 200 and resp.json()["currentUsage"] == 1
        else:
            assert resp.status_code == 503
            assert resp.json()["error"] == "rate_limiter_unavailable"
            assert resp.headers["retry-after"] == "1"


async def test_store_unavailable_in_the_middleware_is_503(
    daemon: DaemonProcess,
) -> None:
    settings = settings_for(
        f"redis://127.0.0.1:{free_port()}/0",
        ratelimit_address=daemon.grpc_target,
        redis_timeout_seconds=0.3,
    )
    async with serving(settings) as (client, store):
        # Authenticated from the database; the quota's counters (Redis) cannot be read.
        _, token = await account_with_token(store, "pro")
        resp = await client.get(USAGE_PATH, headers=bearer(token))
        assert resp.status_code == 503 and resp.json()["error"] == "store_unavailable"
        assert int(resp.headers["retry-after"]) >= 1


class Hello:
    """A stand-in for another public API (the transit sidecar) behind the middleware."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        principal = getattr(req.context, "principal", None)
        resp.media = {"account": principal.id if principal else None}


async def test_middleware_plugs_into_another_falcon_app(
    redis_server: RedisServer, daemon: DaemonProcess
) -> None:
    settings = daemon_settings(redis_server, daemon)
    store = UsageStore(settings, TEST_PLANS)
    app = falcon.asgi.App(middleware=[rate_limit_middleware(settings, store)])
    app.add_route("/v2/stops", Hello())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://transit.test"
    ) as client:
        acct, token = await account_with_token(store, "free")
        assert (await client.get("/v2/stops")).json() == {"account": None}
        assert (await client.get("/v2/stops", headers=bearer(token))).json() == {"account": acct}
        # The call to the other API was metered like any other.
        _, used = await store.usage(await store.account(acct))  # type: ignore[arg-type]
        assert used == 1
    await store.close()


def test_config_defaults() -> None:
    config = RateLimitConfig(address="")
    mw = RateLimitMiddleware(config, authenticate=_never)
    assert mw.client is None and mw.admit is None and config.failure_mode == "allow"


async def _never(token: str) -> None:
    return None
