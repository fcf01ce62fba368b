"""The rate-limit middleware plugged into the real transit API through its `middleware=` hook,
against real Redis and ratelimitd: anonymous calls are limited by address, token holders are
authenticated, metered into their usage and held to their quota."""

from __future__ import annotations

import httpx
from support.daemon import DaemonProcess
from support.redis_server import RedisServer

from sidecars.transit.app import Services
from sidecars.transit.app import create_app as create_transit_app
from sidecars.transit.settings import (
    DEFAULT_GTFS,
    FeedSettings,
    RealtimeSettings,
    TransitSettings,
)
from sidecars.transit.store import TransitStore
from sidecars.usage.app import rate_limit_middleware
from sidecars.usage.store import UsageStore

from .usage_helpers import TEST_PLANS, account_with_token, bearer, daemon_settings


async def test_transit_api_behind_the_middleware(
    redis_server: RedisServer, daemon: DaemonProcess
) -> None:
    feed = FeedSettings(source=DEFAULT_GTFS)  # the bundled Cairns feed
    transit = TransitStore(TransitSettings(feed=feed, realtime=RealtimeSettings()))
    assert transit.load_static()
    usage = daemon_settings(redis_server, daemon)
    store = UsageStore(usage, TEST_PLANS)
    app = create_transit_app(
        transit.settings,
        services=Services(transit.settings, store=transit),
        middleware=[rate_limit_middleware(usage, store)],
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://transit.test"
    ) as client:
        anonymous = await client.get("/v2/lines")
        assert anonymous.status_code == 200 and len(anonymous.json()) == 22
        assert anonymous.headers["ratelimit-limit"] == "100000"  # the remote_address rule
        bad = await client.get("/v2/lines", headers=bearer("usk_" + "E" * 43))
        assert bad.status_code == 401
        acct, token = await account_with_token(store, "free")  # quota 5
        for _ in range(5):
            assert (await client.get("/v2/stops", headers=bearer(token))).status_code == 200
        over = await client.get("/v2/stops", headers=bearer(token))
        assert over.status_code == 429 and over.json()["error"] == "quota_exceeded"
        # The transit sidecar's own headers are kept on the middleware's answers.
        assert over.headers["access-control-allow-origin"] == "*"
        account = await store.account(acct)
        assert account is not None
        assert (await store.usage(account))[1] == 5
    await store.close()
