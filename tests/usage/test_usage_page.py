"""The account's usage page under gunicorn, with ratelimitd, Redis and each database, loaded
in a real headless Chromium: a screenshot in the test's output directory, and every number
on the page equal to what the API answers for the same account."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest
from support import Clock
from support.browser import dom, screenshot
from support.daemon import DaemonProcess
from support.redis_server import RedisServer
from support.sidecar import usage_database

from sidecars.usage.plans import load_plans
from sidecars.usage.rollup import Rollup
from sidecars.usage.settings import (
    EVENTS_PATH,
    HISTORY_PATH,
    METERS_PATH,
    PAGE_PATH,
    USAGE_PATH,
    Settings,
)
from sidecars.usage.store import UsageStore
from sidecars.usage.windows import DAY, epoch, utc_date

from .conftest import BACKENDS, postgres_for, start_sidecar
from .usage_helpers import account_with_token, bearer

INGEST = "ingest-token-0123456789"
LIMIT = 50


def _text(page: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', page)
    assert match, f"no #{element_id} on the page"
    return match.group(1)


@pytest.fixture(params=BACKENDS)
def database_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The USAGE_* variable naming a fresh database of each kind."""
    return usage_database(request.param, tmp_path, postgres_for(request))


def test_page_in_chromium_shows_the_apis_numbers(
    database_env: dict[str, str],
    redis_server: RedisServer,
    daemon: DaemonProcess,
    tmp_path: Path,
) -> None:
    (tmp_path / "plans.yaml").write_text(f"plans: {{free: {{limit: {LIMIT}}}}}\n")
    (tmp_path / "meters.yaml").write_text(
        "meters:\n  - {slug: tokens, description: LLM tokens, eventType: llm.tokens,\n"
        "     valueProperty: $.tokens, aggregation: sum, groupBy: {model: $.model},\n"
        "     limits: {free: 1000}}\n"
    )
    env = {
        "USAGE_REDIS_URL": redis_server.url,
        "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
        "USAGE_RATELIMIT_TIMEOUT_SECONDS": "2",
        "USAGE_REDIS_TIMEOUT_SECONDS": "2",
        "USAGE_PLANS_FILE": str(tmp_path / "plans.yaml"),
        "USAGE_METERS_FILE": str(tmp_path / "meters.yaml"),
        "USAGE_INGEST_TOKEN": INGEST,
        "USAGE_ROLLUP_INTERVAL_SECONDS": "0",  # rolled up below, once: the figures hold still
        # At the quota these are served uncounted: the API's figures hold still while read.
        "USAGE_QUOTA_EXEMPT_PATHS": ",".join(
            (USAGE_PATH, HISTORY_PATH, PAGE_PATH, f"{METERS_PATH}/tokens")
        ),
        **database_env,
    }
    settings = Settings.from_env(env)

    sidecar = start_sidecar(env, tmp_path / "gunicorn.log")
    try:
        acct, token = asyncio.run(_created_days_ago(settings, 5))
        auth = bearer(token)
        with httpx.Client(base_url=sidecar.base, timeout=30) as client:
            # Past days as the counters hold them, then requests up to the quota: at the limit
            # the quota-exempt reads below are served uncounted, so the figures hold still.
            asyncio.run(_seed(settings, redis_server, acct, {-3: 10, -2: 20, -1: 15}))
            statuses = [client.get(USAGE_PATH, headers=auth).status_code for _ in range(5)]
            assert statuses == [200] * 5
            assert client.get("/nothing-here", headers=auth).status_code == 429
            events = [
                {"specversion": "1.0", "id": f"e{i}", "source": "gw", "type": "llm.tokens",
                 "subject": acct, "data": {"model": "m1", "tokens": tokens}}
                for i, tokens in enumerate((300, 200))
            ]  # fmt: skip
            ingested = client.post(
                EVENTS_PATH,
                json=events,
                headers={**bearer(INGEST), "Content-Type": "application/cloudevents-batch+json"},
            )
            assert ingested.json() == {"accepted": 2, "duplicates": 0}
            asyncio.run(_roll_up(settings))

            usage = client.get(USAGE_PATH, headers=auth).json()
            history = client.get(HISTORY_PATH, headers=auth).json()
            window = {"from": usage["usagePeriod"]["start"]}
            tokens = client.get(f"{METERS_PATH}/tokens", params=window, headers=auth).json()
        assert usage["currentUsage"] == LIMIT and usage["remainingUsage"] == 0
        (tokens_used,) = [row["value"] for row in tokens["data"]]

        link = f"{sidecar.base}{PAGE_PATH}?token={token}"
        shot = screenshot(link, tmp_path / "usage-page.png")
        assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
        page = dom(link)
        assert _text(page, "account") == acct
        assert _text(page, "plan-name") == usage["planName"]
        assert int(_text(page, "plan-limit")) == usage["planLimit"]
        assert int(_text(page, "current-usage")) == usage["currentUsage"]
        assert int(_text(page, "remaining-usage")) == usage["remainingUsage"]
        # The chart: one bar per day with usage, the history's figures.
        bars = dict(re.findall(r'data-date="([0-9-]+)" data-usage="([0-9]+)"', page))
        assert {d: int(u) for d, u in bars.items()} == {
            p["date"]: p["usage"] for p in history["points"] if p["usage"]
        }
        assert int(_text(page, "range-total")) == sum(p["usage"] for p in history["points"])
        # Thresholds: 80 % and 100 % of the quota reached; the token meter's 500 of 1000 not.
        states = re.findall(
            r'data-meter="([a-z]+)" data-threshold="([0-9]+)">.*?class="(reached|open)"', page
        )
        assert states == [
            ("requests", "80", "reached"),
            ("requests", "100", "reached"),
            ("tokens", "80", "open"),
            ("tokens", "100", "open"),
        ]
        used = re.search(r'class="meter-used" data-meter="tokens">([0-9]+)<', page)
        assert used and int(used.group(1)) == tokens_used == 500
        # Without the token: the sign-in message, 401.
        anonymous = httpx.get(f"{sidecar.base}{PAGE_PATH}", timeout=30)
        assert anonymous.status_code == 401 and "text/html" in anonymous.headers["content-type"]
        assert "default-src 'none'" in anonymous.headers["content-security-policy"]
        signed_in = httpx.get(link, timeout=30)
        assert signed_in.status_code == 303 and signed_in.headers["location"] == PAGE_PATH
        assert "HttpOnly" in signed_in.headers["set-cookie"]
        # With the header (quota-exempt: served at the limit) or the cookie, as the API does.
        by_header = httpx.get(f"{sidecar.base}{PAGE_PATH}", headers=auth, timeout=30)
        assert by_header.status_code == 200
        assert _text(by_header.text, "current-usage") == str(LIMIT)
        cookie = {"usage_session": token}
        bad = httpx.get(f"{sidecar.base}{PAGE_PATH}?to=0001-01-05", cookies=cookie, timeout=30)
        assert bad.status_code == 400 and "give the first day too" in bad.text
    finally:
        sidecar.terminate()


async def _created_days_ago(settings: Settings, days: int) -> tuple[str, str]:
    """An account created `days` ago (the rollup writes its days from then on) and a token."""
    clock = Clock(time.time() - days * DAY)
    store = UsageStore(settings, load_plans(settings.plans_file), clock=clock)
    try:
        return await account_with_token(store, "free")
    finally:
        await store.close()


async def _seed(
    settings: Settings, redis_server: RedisServer, acct: str, days: dict[int, int]
) -> None:
    store = UsageStore(settings, load_plans(settings.plans_file))
    today = epoch(utc_date(time.time()))
    try:
        keys = store.bucket_keys_for_days(acct, [today + n * DAY for n in days])
        redis_server.client().mset(dict(zip(keys, days.values(), strict=True)))
    finally:
        await store.close()


async def _roll_up(settings: Settings) -> None:
    store = UsageStore(settings, load_plans(settings.plans_file))
    try:
        await Rollup(store).run_once()
    finally:
        await store.close()
