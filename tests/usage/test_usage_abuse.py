"""Abuse: invalid-token attempts limited per client address, X-Forwarded-For believed only from
configured proxies, header and token size caps; in process and under real gunicorn."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support.redis_server import RedisServer

from sidecars.common.clients import client_address, parse_networks
from sidecars.usage.app import create_app
from sidecars.usage.settings import USAGE_PATH, Settings, SettingsError
from sidecars.usage.store import UsageStore

from .conftest import start_sidecar
from .test_usage_gunicorn import account
from .usage_helpers import TEST_PLANS, account_with_token, bearer, settings_for

BAD = "usk_" + "Q" * 43


def client_from(settings: Settings, address: str) -> tuple[httpx.AsyncClient, UsageStore]:
    """An in-process client whose connections come from `address`."""
    store = UsageStore(settings, TEST_PLANS)
    transport = httpx.ASGITransport(app=create_app(settings, store=store), client=(address, 5000))
    return httpx.AsyncClient(transport=transport, base_url="http://usage.test"), store


async def test_invalid_tokens_are_limited_per_client_address(redis_server: RedisServer) -> None:
    settings = settings_for(redis_server.url, invalid_token_limit=3)
    attacker, store = client_from(settings, "192.0.2.10")
    neighbour, store2 = client_from(settings, "192.0.2.11")
    async with attacker, neighbour:
        _, token = await account_with_token(store, "pro")
        statuses = [
            (await attacker.get(USAGE_PATH, headers=bearer(BAD))).status_code for _ in range(3)
        ]
        assert statuses == [401, 401, 401]
        over = await attacker.get(USAGE_PATH, headers=bearer(BAD))
        assert over.status_code == 429 and over.json()["error"] == "too_many_invalid_tokens"
        assert 1 <= int(over.headers["retry-after"]) <= 60
        # Blocked: even a valid token from that address is refused without a lookup ...
        assert (await attacker.get(USAGE_PATH, headers=bearer(token))).status_code == 429
        # ... while other addresses are served, and anonymous calls are not concerned.
        assert (await neighbour.get(USAGE_PATH, headers=bearer(token))).status_code == 200
        assert (await attacker.get(USAGE_PATH)).status_code == 401
    await store.close()
    await store2.close()


def test_client_address_believes_forwarded_for_only_from_trusted_proxies() -> None:
    proxies = parse_networks(["10.0.0.0/8", "2001:db8::1"])
    assert client_address("203.0.113.5", "198.51.100.1", proxies) == "203.0.113.5"
    assert client_address("10.1.2.3", "198.51.100.1", proxies) == "198.51.100.1"
    # A client's own entries left of an untrusted hop are never believed.
    assert client_address("10.1.2.3", "1.1.1.1, 198.51.100.1, 10.9.9.9", proxies) == (
        "198.51.100.1"
    )
    assert client_address("2001:db8::1", "2001:db8::2", proxies) == "2001:db8::2"
    assert client_address("10.1.2.3", None, proxies) == "10.1.2.3"
    with pytest.raises(SettingsError, match="not an IP"):
        Settings.from_env({"USAGE_TRUSTED_PROXIES": "10.0.0.0/8, proxy.local"})


async def test_forwarded_for_from_a_trusted_proxy(redis_server: RedisServer) -> None:
    settings = settings_for(
        redis_server.url, invalid_token_limit=1, trusted_proxies=("10.0.0.0/8",)
    )
    proxy, store = client_from(settings, "10.0.0.7")
    async with proxy:
        first = await proxy.get(
            USAGE_PATH, headers={**bearer(BAD), "X-Forwarded-For": "198.51.100.7"}
        )
        assert first.status_code == 401
        # Counted for the forwarded client, not the proxy.
        assert redis_server.client().get("usage:invalid_token:198.51.100.7") == b"1"
        assert redis_server.client().get("usage:invalid_token:10.0.0.7") is None
        # Another client behind the same proxy is not blocked by the first one.
        other = await proxy.get(
            USAGE_PATH, headers={**bearer(BAD), "X-Forwarded-For": "198.51.100.8"}
        )
        assert other.status_code == 401
        bad = await proxy.get(USAGE_PATH, headers={"X-Forwarded-For": "198.51.100.7, evil"})
        assert bad.status_code == 400 and "X-Forwarded-For" in bad.json()["message"]
    await store.close()


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"X-Big": "a" * 5000}, 431),  # one field over 4096 bytes
        ({f"X-H{i}": "b" * 300 for i in range(30)}, 431),  # over 8192 bytes in total
        ({f"X-N{i}": "c" for i in range(70)}, 431),  # over 64 fields
        (bearer("usk_" + "A" * 2000), 401),  # an overlong token: malformed, no lookup
        ({"Authorization": "Bearer " + "A" * 5000}, 431),
    ],
)
async def test_header_and_token_size_caps(
    redis_server: RedisServer, headers: dict[str, str], status: int
) -> None:
    client, store = client_from(settings_for(redis_server.url), "192.0.2.50")
    async with client:
        resp = await client.get(USAGE_PATH, headers=headers)
        assert resp.status_code == status, resp.text
        if status == 431:
            assert resp.json()["error"] == "request_header_fields_too_large"
    await store.close()


def test_forwarded_for_is_not_believed_from_loopback_under_gunicorn(
    redis_server: RedisServer, tmp_path: Path, sidecar_env: dict[str, str]
) -> None:
    # uvicorn alone would believe X-Forwarded-For from 127.0.0.1 (FORWARDED_ALLOW_IPS): a
    # local attacker could then rotate its address and guess tokens without limit.
    env = {**sidecar_env, "USAGE_INVALID_TOKEN_LIMIT": "3", "USAGE_KEY_PREFIX": "abuse:"}
    sidecar = start_sidecar(env, tmp_path / "gunicorn.log", workers=1)
    _, token, _ = account(env, "pro")
    try:
        with httpx.Client(base_url=sidecar.base, timeout=10) as client:
            statuses = [
                client.get(
                    USAGE_PATH, headers={**bearer(BAD), "X-Forwarded-For": f"198.51.100.{i}"}
                ).status_code
                for i in range(5)
            ]
            assert statuses == [401, 401, 401, 429, 429]
            # The 5th attempt was refused by the block, before any count.
            assert redis_server.client().get("abuse:invalid_token:127.0.0.1") == b"4"
            assert client.get(USAGE_PATH, headers=bearer(token)).status_code == 429
    finally:
        sidecar.terminate()
