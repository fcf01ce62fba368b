"""Failure modes against real processes: ratelimitd and Redis stopped and started again under a
gunicorn sidecar. With `allow` the API keeps serving, usage hits are buffered in the worker and
flushed when Redis is back, /health says degraded, ratelimitd is used again within 1 s of its
return, and each outage and recovery is logged once. `deny` answers 503."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.daemon import DaemonProcess, start_redis_daemon
from support.process import start_bound
from support.redis_server import RedisServer

from ratelimitd.config.keys import meter_key
from sidecars.usage.settings import USAGE_PATH

from .conftest import TEST_CONFIG, start_sidecar
from .test_usage_gunicorn import account
from .usage_helpers import bearer, serving, session_sqlite_path, settings_for


@pytest.fixture
def own_servers(tmp_path: Path) -> Iterator[tuple[RedisServer, DaemonProcess]]:
    """A Redis and a ratelimitd of this test's own, so it may stop and start them."""
    redis = start_bound(lambda: RedisServer(tmp_path / "redis"))
    daemon = start_redis_daemon(tmp_path, redis.address, TEST_CONFIG)
    yield redis, daemon
    daemon.close()
    redis.close()


def test_outages_of_ratelimitd_and_redis_with_allow(
    own_servers: tuple[RedisServer, DaemonProcess], tmp_path: Path
) -> None:
    redis, daemon = own_servers
    env = {
        "USAGE_REDIS_URL": redis.url,
        "USAGE_SQLITE_PATH": session_sqlite_path(),
        "USAGE_RATELIMIT_ADDRESS": daemon.grpc_target,
        "USAGE_RATELIMIT_TIMEOUT_SECONDS": "0.5",
        "USAGE_REDIS_TIMEOUT_SECONDS": "0.5",
        "USAGE_QUOTA_EXEMPT_PATHS": "",
        # /openapi.json goes through the middleware too: a metered path the app serves
        # without reading Redis, as another API behind the middleware would.
        "USAGE_EXEMPT_PATHS": "/health",
    }
    # One worker: its log lines and buffer are the whole story.
    sidecar = start_sidecar(env, tmp_path / "gunicorn.log", workers=1)
    acct, token, _ = account(env, "pro")
    auth = bearer(token)
    key = meter_key("", "api", [("account", acct)], int(time.time()))
    try:
        with httpx.Client(base_url=sidecar.base, timeout=10) as client:
            assert client.get(USAGE_PATH, headers=auth).status_code == 200
            assert client.get("/health").json()["status"] == "ok"

            # --- ratelimitd down: served (allow), still counted; health degraded.
            daemon.kill()
            # Down for 3 s of traffic: long enough for the channel's reconnect backoff to
            # reach its cap, so the reconnect time below is the worst case.
            served = []
            killed = time.monotonic()
            while time.monotonic() - killed < 3:
                served.append(client.get(USAGE_PATH, headers=auth))
            assert {r.status_code for r in served} == {200}
            assert "ratelimit-limit" not in served[-1].headers  # undecided: no ratelimitd
            assert served[-1].json()["currentUsage"] == 1 + len(served)  # counted all the same
            health = client.get("/health")
            assert health.status_code == 200
            assert health.json()["status"] == "degraded"
            assert health.json()["rateLimiter"] == "unavailable"
            daemon.start()
            back = time.monotonic()
            while "ratelimit-limit" not in client.get(USAGE_PATH, headers=auth).headers:
                assert time.monotonic() - back < 5, "ratelimitd not used again"
                time.sleep(0.02)
            reconnect = time.monotonic() - back
            assert client.get("/health").json()["status"] == "ok"

            # --- Redis down (and restarted empty): served, buffered, flushed when it is back.
            redis.stop()
            served_down = [client.get("/openapi.json", headers=auth) for _ in range(7)]
            assert {r.status_code for r in served_down} == {200}
            # The usage figure itself cannot be read: 503, and its hit is taken back.
            assert client.get(USAGE_PATH, headers=auth).status_code == 503
            health = client.get("/health")
            assert health.status_code == 200
            assert health.json()["status"] == "degraded"
            assert health.json()["counters"] == "unavailable"
            buffered = health.json()["bufferedHits"]
            assert buffered == 7
            redis.start()
            restarted = time.monotonic()
            while int(redis.client().get(key) or 0) != buffered:
                assert time.monotonic() - restarted < 5, "buffer not flushed"
                time.sleep(0.02)
            flush_delay = time.monotonic() - restarted
            health = client.get("/health").json()
            assert health["status"] == "ok" and health["bufferedHits"] == 0
            flushed = int(redis.client().get(key) or 0)
        log = sidecar.log()
        # Each outage logged once, then its end once: ratelimitd's own (killed), then the
        # one it had while its Redis was down (it answered UNKNOWN).
        events = [
            "unavailable" if "unavailable (" in line else "back"
            for line in log.splitlines()
            if "sidecars.outage: ratelimitd at" in line
        ]
        assert events == ["unavailable", "back", "unavailable", "back"], log
        assert "unavailable (UNAVAILABLE)" in log and "unavailable (UNKNOWN)" in log
        assert log.count("Redis (usage counters) unavailable") == 1, log
        assert log.count("Redis (usage counters) back after") == 1, log
        assert "flushed 7 buffered hits" in log
        print(
            f"\noutage figures: ratelimitd down 3 s ({len(served)} requests served and counted), "
            f"used again {reconnect * 1000:.0f} ms after it was ready (limit 1000 ms); "
            f"Redis down: {buffered} hits buffered, {flushed} flushed "
            f"{flush_delay * 1000:.0f} ms after Redis was ready"
        )
    finally:
        sidecar.terminate()
    assert reconnect < 1.0


async def test_counters_deny_is_503_and_the_buffer_is_bounded(black_hole: int) -> None:
    down = f"redis://127.0.0.1:{black_hole}/0"
    for mode, capacity, expected in (("deny", 10, [503, 503]), ("allow", 1, [200, 503])):
        settings = settings_for(
            down,
            redis_timeout_seconds=0.2,
            counter_failure_mode=mode,
            counter_buffer_hits=capacity,
            exempt_paths=("/health",),
        )
        async with serving(settings) as (client, store):
            await store.db.ping()
            acct = f"deny-{mode}-{time.monotonic_ns()}"
            await store.create_account(acct, "pro")
            token, _ = await store.issue_token(acct)
            statuses = [
                (await client.get("/openapi.json", headers=bearer(token))).status_code
                for _ in expected
            ]
            assert statuses == expected, mode
            health = await client.get("/health")
            if mode == "deny":
                assert health.status_code == 503 and health.json()["status"] == "unavailable"
            else:
                assert health.status_code == 200 and health.json()["bufferedHits"] == 1
            store.buffer.hits.clear()  # nothing to flush into a black hole at close
            store.buffer.total = 0
