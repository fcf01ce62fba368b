"""The usage API's rate limiter in the transit API (TRANSIT_RATE_LIMIT=true): an
Idempotency-Key's retry gets the first answer back and is not counted, and the key names the
request's body too (a POST of other stops with the same key is refused)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import falcon.testing
import httpx
from support.redis_server import RedisServer

from sidecars.transit.app import Services
from sidecars.transit.store import TransitStore
from sidecars.usage.app import rate_limiter
from sidecars.usage.settings import Settings as UsageSettings

from .helpers import BRISBANE, local_ts

App = Callable[..., tuple[Services, falcon.testing.TestClient]]
PIPS = "/v2/pips/estimates"


async def test_a_keyed_post_is_replayed_not_served_again(
    cairns_store: TransitStore, app_for: App, redis_server: RedisServer, tmp_path: Path
) -> None:
    cairns_store.now.now = local_ts("2014-06-10T08:00", BRISBANE)  # type: ignore[attr-defined]
    usage = UsageSettings(
        redis_url=redis_server.url,
        sqlite_path=str(tmp_path / "usage.sqlite3"),
        ratelimit_address="",
        redis_timeout_seconds=2.0,
    )
    policies = rate_limiter(usage)
    store = policies[0].admit.__self__  # type: ignore[attr-defined]
    _, client = app_for(cairns_store, records_dir=None, db=None, middleware=tuple(policies))
    try:
        await store.create_account("acct-1", "free")
        token, _ = await store.issue_token("acct-1")
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "pip-1"}
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://transit.test") as http:
            body = json.dumps({"stops": ["750000", "750001"]})
            first = await http.post(PIPS, content=body, headers=headers)
            assert first.status_code == 200 and "idempotent-replayed" not in first.headers
            again = await http.post(PIPS, content=body, headers=headers)
            assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
            assert again.content == first.content
            assert again.headers["content-type"] == first.headers["content-type"]
            other = json.dumps({"stops": ["750002"]})
            reused = await http.post(PIPS, content=other, headers=headers)
            assert reused.status_code == 422
            assert reused.json()["error"] == "idempotency_key_reused"
        account = await store.account("acct-1")
        assert account is not None and (await store.usage(account))[1] == 1
    finally:
        await store.close()
