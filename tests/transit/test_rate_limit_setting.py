"""TRANSIT_RATE_LIMIT=true installs the usage API's rate-limit middleware in the entry point."""

from __future__ import annotations

import httpx
import pytest
from support import free_port

from sidecars.transit import asgi


@pytest.mark.parametrize("enabled", [False, True])
async def test_entry_point_rate_limits_when_enabled(
    monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    monkeypatch.setenv("TRANSIT_RATE_LIMIT", "true" if enabled else "false")
    monkeypatch.setenv("TRANSIT_DEMO", "true")
    monkeypatch.setenv("TRANSIT_VEHICLES_SOURCE", "")
    # ratelimitd is unreachable and the policy is deny: only a rate-limited app refuses.
    monkeypatch.setenv("USAGE_RATELIMIT_ADDRESS", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("USAGE_RATELIMIT_FAILURE_MODE", "deny")
    monkeypatch.setenv("USAGE_RATELIMIT_TIMEOUT_SECONDS", "0.5")
    app = asgi.app()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://transit.test") as client:
        response = await client.get("/v2/lines")
    # The middleware answers before any resource: its own error body, not the feed's.
    assert (response.json().get("error") == "rate_limiter_unavailable") is enabled
