"""What a static feed source may cost and whom it may tell: credentials configured for a
source never go past its origin on a redirect (two real local HTTP servers, different ports),
and a feed over the size or row bounds is refused before it is read, the previous good one
kept serving."""

from __future__ import annotations

import dataclasses
import zipfile
from collections.abc import Callable
from email.message import Message
from pathlib import Path

import pytest
from support import Clock

from sidecars.transit.settings import FeedSettings, TransitSettings
from sidecars.transit.store import TransitStore

from ..helpers import CAIRNS_ZIP, http_files, local_ts, write_feed

NOW = local_ts("2026-03-24T09:05")
KEY, HEADER, USER, PASSWORD = "query-key-3141", "header-key-2718", "operator", "basic-pw-1618"


def test_credentials_stay_on_the_sources_origin(
    tmp_path: Path, make_store: Callable[..., TransitStore]
) -> None:
    feed_zip = write_feed(tmp_path / "f.zip", {}).read_bytes()
    seen: list[tuple[str, str, dict[str, str]]] = []

    def record(name: str) -> Callable[[str, Message], bool]:
        def authorize(path: str, headers: Message) -> bool:
            seen.append((name, path, {k.lower(): v for k, v in headers.items()}))
            return True

        return authorize

    with http_files({"/cdn/feed.zip": feed_zip}, record("cdn")) as cdn:
        redirects = {"/gtfs.zip": f"{cdn}/cdn/feed.zip", "/old.zip": "/gtfs.zip"}
        with http_files({}, record("operator"), redirects) as operator:
            host = operator.removeprefix("http://")
            source = f"http://{USER}:{PASSWORD}@{host}/old.zip?api_key={KEY}"
            store = make_store(
                source, clock=Clock(NOW), feed=FeedSettings(headers={"x-api-key": HEADER})
            )
            assert store.load_static()
    # The operator's server got the credentials twice (the same-origin redirect keeps
    # them); the CDN on another port got none of them.
    assert [(name, path) for name, path, _ in seen] == [
        ("operator", f"/old.zip?api_key={KEY}"),
        ("operator", "/gtfs.zip"),
        ("cdn", "/cdn/feed.zip"),
    ]
    for _, _, headers in seen[:2]:
        assert headers["x-api-key"] == HEADER and headers["authorization"].startswith("Basic ")
    (_, path, headers) = seen[2]
    assert "x-api-key" not in headers and "authorization" not in headers
    assert not any(secret in str(headers) + path for secret in (KEY, HEADER, PASSWORD))


def test_too_many_redirects_is_a_source_error(
    tmp_path: Path, make_store: Callable[..., TransitStore]
) -> None:
    with http_files({}, redirects={"/loop.zip": "/loop.zip"}) as base:
        store = make_store(f"{base}/loop.zip", clock=Clock(NOW))
        assert not store.load_static()
    [notice] = store.feed_status().last_attempt.notices  # type: ignore[union-attr]
    assert (
        notice.code == "unreadable_file" and "more than 5 redirects" in notice.examples[0].message
    )


def cairns_rows() -> int:
    with zipfile.ZipFile(CAIRNS_ZIP) as z:
        return sum(z.read(n).count(b"\n") for n in z.namelist() if n.endswith(".txt"))


@pytest.mark.parametrize(
    "bound, code, message",
    [
        (
            {"max_bytes": 100_000},
            "feed_too_large",
            "more than 100,000 bytes (TRANSIT_FEED_MAX_BYTES)",
        ),
        (
            {"max_uncompressed_bytes": 200_000},
            "feed_too_large",
            "its files hold more than 200,000 bytes (TRANSIT_FEED_MAX_UNCOMPRESSED_BYTES)",
        ),
        ({"max_rows": 5_000}, "too_many_rows", "more than 5,000 rows (TRANSIT_FEED_MAX_ROWS)"),
    ],
)
@pytest.mark.parametrize("over_http", [False, True])
def test_a_feed_over_a_bound_is_refused_and_the_served_one_kept(
    tmp_path: Path,
    make_store: Callable[..., TransitStore],
    client_for,  # type: ignore[no-untyped-def]
    bound: dict[str, int],
    code: str,
    message: str,
    over_http: bool,
) -> None:
    small = write_feed(tmp_path / "small.zip", {}).read_bytes()
    files = {"/gtfs.zip": small}
    with http_files(files) as base:
        path = tmp_path / "feed.zip"
        path.write_bytes(small)
        source = f"{base}/gtfs.zip" if over_http else str(path)
        settings = dataclasses.replace(FeedSettings(), **bound)  # type: ignore[arg-type]
        store = make_store(source, clock=Clock(NOW), feed=settings)
        assert store.load_static()
        served = store.network
        assert served is not None
        # Cairns: a 405 KB zip of about 2 MB in 28,000 rows.
        assert cairns_rows() > 5_000
        files["/gtfs.zip"] = CAIRNS_ZIP.read_bytes()
        path.write_bytes(CAIRNS_ZIP.read_bytes())
        assert not store.load_static()
    assert store.network is served
    attempt = store.feed_status().last_attempt
    assert attempt is not None and not attempt.accepted
    [notice] = [n for n in attempt.notices if n.severity == "fatal"]
    assert notice.code == code and message in notice.examples[0].message
    health = client_for(store).simulate_get("/health").json
    assert health["status"] == "degraded" and message in health["feed"]["last_error"]


def test_the_bounds_are_settings() -> None:
    env = {
        "TRANSIT_GTFS_SOURCE": "feed.zip",
        "TRANSIT_FEED_MAX_BYTES": "1000",
        "TRANSIT_FEED_MAX_UNCOMPRESSED_BYTES": "0",
        "TRANSIT_FEED_MAX_ROWS": "20",
    }
    feed = TransitSettings.from_env(env).feed
    assert (feed.max_bytes, feed.max_uncompressed_bytes, feed.max_rows) == (1000, 0, 20)
    assert feed.bounds.max_bytes == 1000 and feed.bounds.max_uncompressed_bytes is None
    defaults = TransitSettings.from_env({"TRANSIT_GTFS_SOURCE": "feed.zip"}).feed
    assert (defaults.max_bytes, defaults.max_uncompressed_bytes, defaults.max_rows) == (
        128 << 20,
        512 << 20,
        8_000_000,
    )
