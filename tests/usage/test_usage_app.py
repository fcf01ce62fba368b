"""The usage endpoint in process (httpx ASGI transport) on a real Redis: body, auth, methods."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime

import msgspec
import pytest
from support import Clock, free_port
from support.redis_server import RedisServer

from ratelimitd.config.keys import meter_key
from sidecars.common.errors import ApiError
from sidecars.usage.schemas import UsageResponse
from sidecars.usage.settings import USAGE_PATH
from sidecars.usage.store import UsageStore
from sidecars.usage.windows import DAY, day_start, epoch

from .usage_helpers import account_with_token, bearer, serving, settings_for

NOW = datetime(2026, 3, 10, 15, 30, tzinfo=UTC).timestamp()


@pytest.fixture
async def app(redis_server: RedisServer) -> AsyncIterator[tuple[object, UsageStore, Clock]]:
    """Client, store and clock of an in-process app without ratelimitd."""
    clock = Clock(NOW)
    settings = settings_for(redis_server.url)
    async with serving(settings, middleware=[], clock=clock) as (client, store):
        yield client, store, clock


def meter(redis_server: RedisServer, account: str, day: float, hits: int) -> None:
    """Write hits into a day bucket as ratelimitd does."""
    redis_server.client().incrby(meter_key("", "api", [("account", account)], int(day)), hits)


async def test_usage_body_for_billing_cycle(app, redis_server: RedisServer) -> None:  # type: ignore[no-untyped-def]
    client, store, clock = app
    # Anchored on the 15th: the cycle at NOW (Mar 10) is Feb 15 .. Mar 15.
    acct, token = await account_with_token(
        store, "startup", start=date(2026, 1, 15), end=date(2027, 1, 15)
    )
    meter(redis_server, acct, epoch(date(2026, 2, 14)), 1000)  # previous cycle: not counted
    meter(redis_server, acct, epoch(date(2026, 2, 15)), 3)
    meter(redis_server, acct, NOW, 4)
    meter(redis_server, acct, NOW + DAY, 500)  # tomorrow (a clock skew): not counted
    resp = await client.get(USAGE_PATH, headers=bearer(token))
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["cache-control"] == "no-store"
    body = msgspec.json.decode(resp.content, type=UsageResponse)
    assert resp.json() == {
        "planName": "startup",
        "planLimit": 20,
        "currentUsage": 7,
        "remainingUsage": 13,
        "usageWindow": "billing_cycle",
        "subscriptionPeriod": {"start": "2026-01-15", "end": "2027-01-15"},
        "usagePeriod": {"start": "2026-02-15T00:00:00Z", "end": "2026-03-15T00:00:00Z"},
    }
    assert body.currentUsage == 7
    # At the cycle boundary the old days drop out.
    clock.now = datetime(2026, 3, 15, tzinfo=UTC).timestamp()
    assert (await client.get(USAGE_PATH, headers=bearer(token))).json()["currentUsage"] == 0


async def test_usage_body_for_rolling_window_and_clamped_remaining(app, redis_server) -> None:  # type: ignore[no-untyped-def]
    client, store, clock = app
    acct, token = await account_with_token(store, "free", start=date(2025, 6, 1))
    today = day_start(NOW)
    meter(redis_server, acct, today - 31 * DAY, 100)  # 31st whole day back: outside
    meter(redis_server, acct, today - 30 * DAY, 2)  # oldest whole day inside
    meter(redis_server, acct, today, 4)
    body = (await client.get(USAGE_PATH, params={"format": "json"}, headers=bearer(token))).json()
    assert body["usageWindow"] == "rolling_30_days"
    assert body["currentUsage"] == 6
    assert body["remainingUsage"] == 0  # limit 5: never negative
    assert body["subscriptionPeriod"] == {"start": "2025-06-01", "end": None}
    assert body["usagePeriod"] == {"start": "2026-02-08T00:00:00Z", "end": "2026-03-11T00:00:00Z"}
    # Next UTC day: the oldest bucket leaves the window.
    clock.now = today + DAY
    assert (await client.get(USAGE_PATH, headers=bearer(token))).json()["currentUsage"] == 4


async def test_account_window_overrides_plan_default(app) -> None:  # type: ignore[no-untyped-def]
    client, store, _ = app
    acct, token = await account_with_token(store, "free", window="billing_cycle")
    assert (await client.get(USAGE_PATH, headers=bearer(token))).json()["usageWindow"] == (
        "billing_cycle"
    )
    await store.update_account(acct, plan="pro", window="")
    body = (await client.get(USAGE_PATH, headers=bearer(token))).json()
    assert (body["planName"], body["usageWindow"], body["planLimit"]) == (
        "pro",
        "billing_cycle",
        1_000_000,
    )


@pytest.mark.parametrize("value", ["xml", "", "JSON", "json,xml"])
async def test_unsupported_format_is_400_naming_the_supported_values(app, value: str) -> None:  # type: ignore[no-untyped-def]
    client, store, _ = app
    _, token = await account_with_token(store)
    resp = await client.get(USAGE_PATH, params={"format": value}, headers=bearer(token))
    assert resp.status_code == 400
    body = msgspec.json.decode(resp.content, type=ApiError)
    assert body.error == "invalid_format" and body.supportedValues == ["json"]
    repeated = await client.get(USAGE_PATH + "?format=json&format=json", headers=bearer(token))
    assert repeated.status_code == 400


async def test_unknown_query_parameters_are_400(app) -> None:  # type: ignore[no-untyped-def]
    client, store, _ = app
    _, token = await account_with_token(store)
    resp = await client.get(USAGE_PATH, params={"fromat": "json"}, headers=bearer(token))
    assert resp.status_code == 400
    assert resp.json()["error"] == "invalid_request" and "fromat" in resp.json()["message"]


def challenge(resp) -> str:  # type: ignore[no-untyped-def]
    """The WWW-Authenticate header of a 401, after checking the JSON body."""
    assert resp.status_code == 401
    assert resp.headers["content-type"] == "application/json"
    msgspec.json.decode(resp.content, type=ApiError)
    return str(resp.headers["www-authenticate"])


async def test_every_auth_failure_is_401(app) -> None:  # type: ignore[no-untyped-def]
    client, store, _ = app
    acct, token = await account_with_token(store)
    missing = await client.get(USAGE_PATH)
    assert challenge(missing) == 'Bearer realm="api"'
    assert missing.json()["error"] == "unauthorized"
    other_scheme = await client.get(USAGE_PATH, headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert challenge(other_scheme) == 'Bearer realm="api"'

    invalid: dict[str, bytes] = {}
    cases = {
        "empty": "Bearer ",
        "malformed": "Bearer not-a-token",
        "two credentials": f"Bearer {token} {token}",
        "unknown": "Bearer usk_" + "A" * 43,
        "wrong case of a real token": "Bearer " + token.upper(),
    }
    for name, header in cases.items():
        resp = await client.get(USAGE_PATH, headers={"Authorization": header})
        assert 'error="invalid_token"' in challenge(resp), name
        invalid[name] = resp.content
    # Revoked: the same answer as unknown, so nobody learns the token or account existed.
    info = (await store.list_tokens(acct))[0]
    assert (await client.get(USAGE_PATH, headers=bearer(token))).status_code == 200
    await store.revoke_token(acct, info.id)
    revoked = await client.get(USAGE_PATH, headers=bearer(token))
    assert 'error="invalid_token"' in challenge(revoked)
    assert revoked.content == invalid["unknown"] == invalid["malformed"]
    # Lowercase scheme is accepted (schemes are case-insensitive).
    _, other = await account_with_token(store)
    ok = await client.get(USAGE_PATH, headers={"Authorization": f"bearer {other}"})
    assert ok.status_code == 200


async def test_head_options_and_other_methods(app) -> None:  # type: ignore[no-untyped-def]
    client, store, _ = app
    _, token = await account_with_token(store)
    get = await client.get(USAGE_PATH, headers=bearer(token))
    head = await client.head(USAGE_PATH, headers=bearer(token))
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["content-length"] == get.headers["content-length"]
    assert (await client.head(USAGE_PATH)).status_code == 401
    options = await client.options(USAGE_PATH)
    assert options.status_code == 204 and options.headers["allow"] == "GET, HEAD, OPTIONS"
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        resp = await client.request(method, USAGE_PATH, headers=bearer(token))
        assert resp.status_code == 405, method
        assert "GET" in resp.headers["allow"]
        assert resp.json()["error"] == "method_not_allowed"
    nowhere = await client.get("/api/v2/user/nowhere")
    assert nowhere.status_code == 404 and nowhere.json()["error"] == "not_found"


async def test_openapi_document_is_served(app) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = app
    doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    op = doc["paths"][USAGE_PATH]["get"]
    assert set(op["responses"]) == {
        *("200", "400", "401", "403", "409", "413", "422", "429", "431", "503")
    }
    assert doc["servers"] == [{"url": "/", "description": doc["servers"][0]["description"]}]
    schema = doc["components"]["schemas"]["UsageResponse"]
    assert schema["properties"]["usageWindow"]["enum"] == ["billing_cycle", "rolling_30_days"]
    assert set(schema["required"]) == {
        "planName",
        "planLimit",
        "currentUsage",
        "remainingUsage",
        "usageWindow",
        "subscriptionPeriod",
        "usagePeriod",
    }
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


@pytest.mark.parametrize("where", ["refused", "silent"])
async def test_store_unavailable_is_503_with_retry_after_not_a_hang(
    where: str, black_hole: int
) -> None:
    port = free_port() if where == "refused" else black_hole
    settings = settings_for(f"redis://127.0.0.1:{port}/0", redis_timeout_seconds=0.3)
    async with serving(settings, middleware=[]) as (client, store):
        # The account and token are in the database; only the counters (Redis) are down.
        _, token = await account_with_token(store, "pro")
        started = time.monotonic()
        resp = await client.get(USAGE_PATH, headers=bearer(token))
        assert time.monotonic() - started < 2.0
        assert resp.status_code == 503, resp.text
        assert int(resp.headers["retry-after"]) >= 1
        # Health: the counters are down, served under USAGE_COUNTER_FAILURE_MODE=allow.
        health = await client.get("/health")
        assert health.status_code == 200 and time.monotonic() - started < 4.0
        assert health.json() == {
            "status": "degraded",
            "database": "ok",
            "counters": "unavailable",
            "rateLimiter": "disabled",
            "bufferedHits": 0,
        }


async def test_health_ok(app) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = app
    resp = await client.get("/health")
    assert resp.status_code == 200 and resp.json() == {
        "status": "ok",
        "database": "ok",
        "counters": "ok",
        "rateLimiter": "disabled",
        "bufferedHits": 0,
    }
