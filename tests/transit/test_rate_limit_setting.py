"""TRANSIT_RATE_LIMIT=true installs the usage API's rate-limit middleware in the entry point."""

from __future__ import annotations

import subprocess
import sys

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


def test_the_transit_sidecar_imports_nothing_of_the_usage_one() -> None:
    """Every transit module imports without the usage sidecar (what both need is in
    sidecars/common); only TRANSIT_RATE_LIMIT=true brings in the usage API's limiter."""
    probe = (
        "import pkgutil, sys, importlib, sidecars.transit as t\n"
        "for m in pkgutil.walk_packages(t.__path__, 'sidecars.transit.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(n for n in sys.modules if n.startswith('sidecars.usage')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", done.stdout
