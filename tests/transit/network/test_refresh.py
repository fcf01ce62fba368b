"""Feed refresh: a new good feed is swapped in, a bad one is rejected with a precise report in
the log and in /health while the last good feed keeps serving."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import Clock

from sidecars.transit.settings import FeedSettings
from sidecars.transit.store import TransitStore

from ..helpers import SMALL_FEED, http_files, local_ts, write_feed

NOW = local_ts("2026-03-24T09:05")
NEW_STOP = SMALL_FEED["stops.txt"] + "100010,Brand New,38.74,-9.14,\n"


@pytest.fixture
def feed_path(tmp_path: Path) -> Path:
    return write_feed(tmp_path / "feed.zip", {})


@pytest.fixture
def store(feed_path: Path, make_store: Callable[..., TransitStore]) -> TransitStore:
    store = make_store(feed_path, clock=Clock(NOW))
    assert store.load_static()
    return store


def stop_ids(client) -> set[str]:  # type: ignore[no-untyped-def]
    return {s["id"] for s in client.simulate_get("/v2/stops").json}


def test_unchanged_feed_is_not_reparsed(store: TransitStore) -> None:
    before = store.network
    assert store.load_static() is False
    assert store.network is before


def test_good_new_feed_is_swapped_in(store: TransitStore, feed_path: Path, client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for(store)
    old_version, old_etag = store.network.version, client.simulate_get("/v2/stops").headers["etag"]  # type: ignore[union-attr]
    write_feed(feed_path, {"stops.txt": NEW_STOP})
    assert store.load_static() is True
    assert store.network.version != old_version  # type: ignore[union-attr]
    assert "100010" in stop_ids(client)
    fresh = client.simulate_get("/v2/stops", headers={"If-None-Match": old_etag})
    assert fresh.status_code == 200  # a new feed version is a new ETag


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("corrupt", ("feed.zip", None, "not a readable zip archive")),
        ({"stops.txt": None}, ("stops.txt", None, "required file missing")),
        (
            {"routes.txt": "route_id,agency_id,route_short_name\nR1,A,1\n"},
            ("routes.txt", 1, "missing required column(s): route_type"),
        ),
        (
            {"stop_times.txt": SMALL_FEED["stop_times.txt"] + 'T2,"09:30:00\n'},
            ("stop_times.txt", 16, "bad CSV"),
        ),
    ],
)
def test_bad_feed_is_rejected_and_the_old_one_keeps_serving(
    store: TransitStore,
    feed_path: Path,
    client_for,  # type: ignore[no-untyped-def]
    caplog: pytest.LogCaptureFixture,
    change: object,
    expected: tuple[str, int | None, str],
) -> None:
    client = client_for(store)
    serving = store.network
    before = client.simulate_get("/v2/stops").content
    if change == "corrupt":
        feed_path.write_bytes(b"PK\x03\x04 this is not really a zip")
    else:
        write_feed(feed_path, {"stops.txt": NEW_STOP, **change})  # type: ignore[dict-item]
    with caplog.at_level(logging.ERROR, logger="sidecars.transit"):
        assert store.load_static() is False
    assert store.network is serving
    assert client.simulate_get("/v2/stops").content == before
    assert client.simulate_get("/v2/arrivals/by_stop/100001").status_code == 200
    health = client.simulate_get("/health")
    assert health.status_code == 200
    report = health.json
    assert report["status"] == "degraded" and report["feed"]["status"] == "degraded"
    assert report["feed"]["version"] == serving.version  # type: ignore[union-attr]
    file, line, message = expected
    [problem] = report["feed"]["problems"]
    assert problem["file"].endswith(file) and problem["line"] == line
    assert message in problem["message"]
    assert message in report["feed"]["last_error"]
    logged = caplog.text
    assert "rejected" in logged and f"still serving version {serving.version}" in logged  # type: ignore[union-attr]
    assert message in logged
    # Fixing the feed recovers.
    write_feed(feed_path, {"stops.txt": NEW_STOP})
    assert store.load_static() is True
    assert client.simulate_get("/health").json["feed"]["problems"] == []


def test_no_good_feed_yet_is_503_everywhere(tmp_path: Path, make_store, client_for) -> None:  # type: ignore[no-untyped-def]
    broken = write_feed(tmp_path / "f.zip", {"routes.txt": None})
    store = make_store(broken, clock=Clock(NOW))
    assert store.load_static() is False
    client = client_for(store)
    for path in ("/v2/stops", "/v2/lines", "/v2/patterns/x", "/v2/arrivals/by_stop/100001",
                 "/v2/gtfs"):  # fmt: skip
        result = client.simulate_get(path)
        assert result.status_code == 503
        assert result.json["status"] == "error" and "not loaded" in result.json["message"]
        assert result.headers["retry-after"] == "5"
    health = client.simulate_get("/health")
    assert health.status_code == 503
    assert health.json["feed"]["status"] == "error"
    assert health.json["feed"]["problems"][0]["file"] == "routes.txt"


def test_background_refresh_picks_up_a_new_feed(feed_path: Path, make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store(feed_path, clock=Clock(NOW), feed=FeedSettings(refresh_seconds=0.05))
    store.start()
    try:
        deadline = time.monotonic() + 20
        while store.network is None:
            assert time.monotonic() < deadline, "first load did not happen"
            time.sleep(0.01)
        first = store.network.version
        write_feed(feed_path, {"stops.txt": NEW_STOP})
        while store.network.version == first:
            assert time.monotonic() < deadline, "refresh did not pick the new feed up"
            time.sleep(0.01)
        assert "100010" in store.network.stop_index
    finally:
        store.stop()
    assert not store._threads


def test_static_feed_from_a_url(feed_path: Path, make_store, client_for) -> None:  # type: ignore[no-untyped-def]
    payload = feed_path.read_bytes()
    with http_files({"/gtfs.zip": payload}) as base:
        store = make_store(base + "/gtfs.zip", clock=Clock(NOW))
        assert store.load_static()
        client = client_for(store)
        assert "100001" in stop_ids(client)
        assert client.simulate_get("/v2/gtfs").content == payload
        missing = make_store(base + "/missing.zip", clock=Clock(NOW))
        assert not missing.load_static()
        assert "404" in missing.health().feed.problems[0].message


def test_directory_source_is_zipped_for_the_gtfs_endpoint(
    tmp_path: Path,
    make_store,
    client_for,  # type: ignore[no-untyped-def]
) -> None:
    import io
    import zipfile

    store = make_store(write_feed(tmp_path / "dir", {}, as_zip=False), clock=Clock(NOW))
    assert store.load_static()
    result = client_for(store).simulate_get("/v2/gtfs")
    assert result.status_code == 200 and result.headers["content-type"] == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(result.content))
    assert archive.read("stops.txt").decode() == SMALL_FEED["stops.txt"]
