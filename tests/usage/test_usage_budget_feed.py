"""ratelimitd's token budgets feed the usage API's metering, end to end: streams through a
stock Envoy (examples/llm-budget/usage-feed) with ratelimitd on Redis reserving and settling
per user and model, the daemon appending each settle to its outbox stream, the usage API
under gunicorn consuming it, on SQLite and PostgreSQL. Across a daemon restart and a Redis
outage, the `tokens` meter reports exactly the streams' summed usage.total_tokens per
account and model, and the outbox received exactly one entry per stream."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

import httpx
import pytest
from support.llm_stack import EXAMPLES, llm_stack
from support.process import start_bound
from support.ready import wait_for
from support.redis_server import RedisServer
from support.sidecar import usage_database

from ratelimitd.budget.outbox import event
from sidecars.usage import budgets
from sidecars.usage.budgets import BudgetFeed
from sidecars.usage.metering import Metering
from sidecars.usage.meters import load_meters
from sidecars.usage.settings import METERS_PATH, Settings
from sidecars.usage.store import UsageStore

from .conftest import BACKENDS, postgres_for, start_sidecar
from .usage_helpers import TEST_PLANS, account_with_token, bearer, provision, unique

STREAM = "ratelimitd:settled"
METERS = load_meters()  # the shipped ones: `tokens` sums llm.tokens by model
MODELS = ("gpt-4o", "gpt-4o-mini")


@pytest.fixture(params=BACKENDS)
def database_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The USAGE_* variable naming a fresh database of each kind."""
    return usage_database(request.param, tmp_path, postgres_for(request))


def total_tokens(body: bytes) -> int:
    """usage.total_tokens of a streamed (SSE) answer."""
    found = re.findall(rb'"total_tokens": ?([0-9]+)', body)
    assert len(found) == 1, body
    return int(found[0])


def test_each_settled_budget_is_one_usage_event(
    database_env: dict[str, str], tmp_path: Path
) -> None:
    redis = start_bound(lambda: RedisServer(tmp_path / "redis"))
    env = {
        "USAGE_REDIS_URL": redis.url,
        "USAGE_RATELIMIT_ADDRESS": "",
        "USAGE_REDIS_TIMEOUT_SECONDS": "2",
        "USAGE_BUDGET_STREAM": STREAM,
        **database_env,
    }
    sidecar = start_sidecar(env, tmp_path / "gunicorn.log")
    try:
        (alice, alice_token), (bob, bob_token) = provision(env, "pro", "pro")
        config = (EXAMPLES / "usage-feed" / "config" / "llm.yaml").read_text()
        expected: Counter[tuple[str, str]] = Counter()
        with llm_stack(
            tmp_path / "stack",
            "usage-feed",
            config,
            record=False,
            BACKEND_TYPE="redis",
            REDIS_SOCKET_TYPE="tcp",
            REDIS_URL=redis.address,
            REDIS_REQUEST_TIMEOUT="300ms",
        ) as stack:

            def stream(i: int) -> None:
                user = (alice, bob)[i % 2]
                model = MODELS[i % 3 == 0]
                answer = stack.chat(
                    user, stream=True, model=model, headers={"x-fake-usage": str(100 + 7 * i)}
                )
                assert answer.status == 200 and answer.complete, answer
                expected[user, model] += total_tokens(answer.body)

            for i in range(4):
                stream(i)
            # A daemon restart: the settles of what follows go to a new process.
            stack.daemon.terminate()
            stack.daemon.start()
            for i in range(4, 7):
                stream(i)
            # A Redis outage: the stream's reserve and settle find no store; the daemon
            # keeps the settle and sends it again once Redis answers (charged then, once).
            redis.pause()
            try:
                for i in range(7, 9):
                    stream(i)
            finally:
                redis.resume()
            stream(9)
            client = redis.client()
            wait_for(
                lambda: client.xinfo_stream(STREAM)["entries-added"] >= 10,
                60,
                "ten settles in the outbox",
            )
            # The daemon did meet the outage (its calls failed on the store then).
            stats = stack.daemon.stats()
            assert stats["ratelimit.service.call.should_rate_limit.redis_error"] >= 1

        def reported() -> Counter[tuple[str, str]]:
            got: Counter[tuple[str, str]] = Counter()
            for user, token in ((alice, alice_token), (bob, bob_token)):
                resp = httpx.get(
                    f"{sidecar.base}{METERS_PATH}/tokens",
                    params={"groupBy": "model"},
                    headers=bearer(token),
                    timeout=30,
                )
                assert resp.status_code == 200, resp.text
                for row in resp.json()["data"]:
                    got[user, row["groupBy"]["model"]] += row["value"]
            return got

        wait_for(lambda: reported() == expected, 60, f"the meter at {dict(expected)}")
        # Everything read is acknowledged (and trimmed), and nothing was appended (the
        # stream's count of entries ever added) or counted twice.
        wait_for(lambda: client.xpending(STREAM, "usage")["pending"] == 0, 30, "all acked")
        assert client.xinfo_stream(STREAM)["entries-added"] == 10
        # The worker that acknowledges last sees nothing pending and trims up to the last
        # entry delivered to the group, whichever worker read the rest: that one stays (MINID).
        wait_for(lambda: client.xlen(STREAM) <= 1, 30, "the acknowledged entries trimmed")
        assert reported() == expected
        assert sum(expected.values()) == sum(100 + 7 * i for i in range(10))
    finally:
        sidecar.terminate()
        redis.close()


async def test_a_redelivered_settle_counts_once(
    db_settings: Settings, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that stored a batch and died before its XACK: another worker claims the
    entries and stores them again, and they count once; an entry of no account and a
    malformed one are dropped (acknowledged), not retried forever."""
    stream = f"settled-{unique()}"
    settings = dataclasses.replace(db_settings, budget_stream=stream)
    monkeypatch.setattr(budgets, "CLAIM_IDLE_MS", 0)  # any pending entry may be claimed
    store = UsageStore(settings, TEST_PLANS)
    metering = Metering(store, METERS)
    first, second = BudgetFeed(metering), BudgetFeed(metering)
    second.consumer += "-b"
    try:
        acct, _ = await account_with_token(store, "pro")
        client = redis_server.client()
        at = int(store.clock() * 1000)
        for txn, user, tokens in (("t1", acct, 30), ("t2", acct, 12), ("t3", "nobody", 5)):
            entries = event([("user", user), ("model", "gpt-4o")])
            client.xadd(stream, {"t": txn, "n": tokens, "at": at, "e": entries})
        client.xadd(stream, {"t": "t4", "n": "many"})
        await first._group()
        got = await first.redis().xreadgroup("usage", first.consumer, {stream: ">"}, count=10)
        await first.store(got[0][1])  # stored; the worker dies before XACK
        assert await second.step() == 4  # claimed from the dead worker, stored again
        assert client.xpending(stream, "usage")["pending"] == 0
        assert client.xlen(stream) == 1  # acknowledged entries trimmed but the last
        account = await store.account(acct)
        assert account is not None
        total = await metering.total(account, METERS["tokens"], 0, at + 1)
        assert total == 42
    finally:
        await first.close()
        await second.close()
        await store.close()
