"""`POST /status/feed/refresh`: who may trigger it (the token, else local callers not behind
a proxy), and that it reaches every worker's refresh loop at once, not at the next interval."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import falcon.testing
from support import Clock

from sidecars.transit.settings import FeedSettings, ServerSettings
from sidecars.transit.store import TransitStore

from ..helpers import SMALL_FEED, local_ts, write_feed

NOW = local_ts("2026-03-24T09:05")
REFRESH = "/status/feed/refresh"


def test_only_local_callers_without_a_token(
    small_feed: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    store = make_store(small_feed, Clock(NOW))
    assert store.load_static()
    client = client_for(store)
    ok = client.simulate_post(REFRESH)
    assert ok.status_code == 202 and ok.json["status"] == "refresh requested"
    assert ok.json["serving"] == store.network.version  # type: ignore[union-attr]
    # Through a proxy every caller looks local: refused.
    proxied = client.simulate_post(REFRESH, headers={"X-Forwarded-For": "203.0.113.9"})
    assert proxied.status_code == 403 and "TRANSIT_REFRESH_TOKEN" in proxied.json["message"]
    remote = client.simulate_post(REFRESH, remote_addr="203.0.113.9")
    assert remote.status_code == 403
    assert client.simulate_get(REFRESH).status_code == 404  # GET is not a refresh


def test_with_a_token_anyone_holding_it(
    small_feed: Path, make_store: Callable[..., TransitStore], client_for
) -> None:  # type: ignore[no-untyped-def]
    store = make_store(small_feed, Clock(NOW))
    store.settings = dataclasses.replace(
        store.settings, server=ServerSettings(refresh_token="s3cret-token")
    )
    assert store.load_static()
    client: falcon.testing.TestClient = client_for(store)
    missing = client.simulate_post(REFRESH)
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    wrong = client.simulate_post(REFRESH, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "s3cret" not in wrong.text
    right = client.simulate_post(
        REFRESH, headers={"Authorization": "Bearer s3cret-token"}, remote_addr="203.0.113.9"
    )
    assert right.status_code == 202


def test_a_refresh_reaches_every_worker_at_once(
    tmp_path: Path, make_store: Callable[..., TransitStore]
) -> None:
    path = write_feed(tmp_path / "feed.zip", {})
    # Two stores of one server (as two gunicorn workers), refreshing hourly.
    workers = [
        make_store(path, Clock(NOW), feed=FeedSettings(refresh_seconds=3600)) for _ in range(2)
    ]
    for store in workers:
        store.start()
    try:
        _until(lambda: all(s.network is not None for s in workers))
        first = workers[0].network.version  # type: ignore[union-attr]
        stops = SMALL_FEED["stops.txt"] + "100010,New,38.74,-9.14,\n"
        write_feed(path, {"stops.txt": stops})
        workers[0].request_refresh()  # what the endpoint does, in one worker
        _until(lambda: all(s.network.version != first for s in workers))  # type: ignore[union-attr]
        assert all("100010" in s.network.stop_index for s in workers)  # type: ignore[union-attr]
    finally:
        for store in workers:
            store.stop()


def _until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
