"""`GET /api/v2/user/usage/history` on SQLite and PostgreSQL: the token's account's rolled-up
days with the plan of each day, the range rules (400 past 400 days), and a 400-day call;
under gunicorn, the figures after the workers' own rollup."""

from __future__ import annotations

from pathlib import Path

import httpx
from support import Clock
from support.daemon import DaemonProcess
from support.ready import wait_for
from support.redis_server import RedisServer

from sidecars.usage.rollup import Rollup
from sidecars.usage.settings import HISTORY_PATH, USAGE_PATH, Settings
from sidecars.usage.windows import DAY

from .conftest import start_sidecar
from .test_usage_rollup import NOW, TODAY, day, seed
from .usage_helpers import account_with_token, bearer, provision, serving, settings_for


async def test_history_serves_the_rolled_up_days(
    db_settings: Settings, redis_server: RedisServer
) -> None:
    clock = Clock(NOW - 3 * DAY)
    async with serving(db_settings, middleware=[], clock=clock) as (client, store):
        acct, token = await account_with_token(store, "startup")
        other, _ = await account_with_token(store, "pro")
        clock.now = NOW
        seed(redis_server, store, acct, {-2: 5, -1: 7, 0: 3})
        seed(redis_server, store, other, {-1: 100})
        await Rollup(store).run_once()
        await store.update_account(acct, plan="pro")
        await Rollup(store).run_once()
        auth = bearer(token)
        resp = await client.get(HISTORY_PATH, headers=auth)
        assert resp.status_code == 200, resp.text
        assert resp.headers["cache-control"] == "no-store"
        body = resp.json()
        # Default: the 30 days ending today; only the days the account existed.
        assert (body["from"], body["to"]) == (str(day(-29)), str(TODAY))
        assert body["points"] == [
            {"date": str(day(-3)), "usage": 0, "planName": "startup", "planLimit": 20},
            {"date": str(day(-2)), "usage": 5, "planName": "startup", "planLimit": 20},
            {"date": str(day(-1)), "usage": 7, "planName": "startup", "planLimit": 20},
            {"date": str(day(0)), "usage": 3, "planName": "pro", "planLimit": 1_000_000},
        ]
        one = await client.get(
            HISTORY_PATH, params={"from": str(day(-1)), "to": str(day(-1))}, headers=auth
        )
        assert [p["usage"] for p in one.json()["points"]] == [7]
        # The longest range, and a range in the future: answered, holding what exists.
        full = await client.get(
            HISTORY_PATH, params={"from": str(day(-399)), "to": str(TODAY)}, headers=auth
        )
        assert full.status_code == 200 and len(full.json()["points"]) == 4
        ahead = {"from": str(day(1)), "to": str(day(5)), "format": "json"}
        assert (await client.get(HISTORY_PATH, params=ahead, headers=auth)).json()["points"] == []
        head = await client.head(HISTORY_PATH, headers=auth)
        assert head.status_code == 200 and head.content == b""
        options = await client.options(HISTORY_PATH)
        assert options.status_code == 204 and options.headers["allow"] == "GET, HEAD, OPTIONS"


async def test_history_refuses_what_it_cannot_answer(redis_server: RedisServer) -> None:
    async with serving(settings_for(redis_server.url), middleware=[]) as (client, store):
        _, token = await account_with_token(store, "pro")
        auth = bearer(token)
        cases = {
            "from=2026-02-01&to=2026-01-01": "after",
            "from=2025-01-01&to=2026-02-05": "at most 400",
            "from=2026-02-30": "not a calendar date",
            "from=20260101": "YYYY-MM-DD",
            "from=2026-01-01&from=2026-01-02": "one date",
            "since=2026-01-01": "Unknown query parameter",
            "format=xml": "Unsupported format",
        }
        # The default `from` (30 days before `to`) would be before the first calendar day.
        cases["to=0001-01-05"] = "give the first day too"
        cases["to=0001-01-01"] = "give the first day too"
        for query, message in cases.items():
            resp = await client.get(f"{HISTORY_PATH}?{query}", headers=auth)
            assert resp.status_code == 400, query
            assert message in resp.json()["message"], (query, resp.json())
        assert (await client.get(f"{HISTORY_PATH}?format=xml", headers=auth)).json()[
            "supportedValues"
        ] == ["json"]
        early = await client.get(f"{HISTORY_PATH}?from=0001-01-01&to=0001-01-05", headers=auth)
        assert early.status_code == 200 and early.json()["points"] == []
        # Exactly 400 days is allowed.
        ok = await client.get(f"{HISTORY_PATH}?from=2025-01-01&to=2026-02-04", headers=auth)
        assert ok.status_code == 200
        assert (await client.get(HISTORY_PATH)).status_code == 401


def test_workers_roll_up_by_themselves(
    redis_server: RedisServer, daemon: DaemonProcess, tmp_path: Path
) -> None:
    env = {
        "USAGE_REDIS_URL": redis_server.url,
        "USAGE_SQLITE_PATH": str(tmp_path / "usage.sqlite3"),
        "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
        "USAGE_ROLLUP_INTERVAL_SECONDS": "0.5",
    }
    sidecar = start_sidecar(env, tmp_path / "gunicorn.log")
    try:
        ((acct, token),) = provision(env, "pro")
        with httpx.Client(base_url=sidecar.base, timeout=10) as client:
            for _ in range(3):
                assert client.get(USAGE_PATH, headers=bearer(token)).status_code == 200

            def rolled() -> bool:
                points = client.get(HISTORY_PATH, headers=bearer(token)).json()["points"]
                return bool(points) and points[-1]["usage"] >= 3

            # The history calls count too (quota-exempt paths under the limit are counted).
            wait_for(rolled, 30, f"today's usage of {acct} in the history")
    finally:
        sidecar.terminate()
