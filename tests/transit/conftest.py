"""Fixtures for the transit sidecar: the real Cairns feed, small built feeds, a fake clock, apps
with metrics and places registered."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import falcon.testing
import pytest

from sidecars.transit.app import create_app
from sidecars.transit.part2 import Part2, Part2Settings
from sidecars.transit.settings import Settings
from sidecars.transit.store import TransitStore

from .helpers import BRISBANE, BULLRUNNER_VP, CAIRNS_ZIP, Clock, local_ts, write_feed


@pytest.fixture
def small_feed(tmp_path: Path) -> Path:
    """The SMALL_FEED as a zip."""
    return write_feed(tmp_path / "small.zip", {})


@pytest.fixture
def make_store() -> Callable[..., TransitStore]:
    """Build a store with no background threads; realtime sources off unless given."""

    def make(
        source: str | Path, clock: Callable[[], float] | None = None, **kw: object
    ) -> TransitStore:
        options: dict[str, object] = {"vehicles_source": None, **kw}
        settings = Settings(gtfs_source=str(source), **options)  # type: ignore[arg-type]
        return TransitStore(settings, clock=clock)

    return make


@pytest.fixture(scope="session")
def cairns_store() -> TransitStore:
    """The real Cairns feed with the real Bull Runner vehicles, at 2014-06-10 08:00 Brisbane
    (a Tuesday in the feed's validity; vehicles.pb keeps every vehicle)."""
    settings = Settings(
        gtfs_source=str(CAIRNS_ZIP),
        vehicles_source=str(BULLRUNNER_VP),
        vehicles_pb_max_age_seconds=0,
    )
    store = TransitStore(settings, clock=Clock(local_ts("2014-06-10T08:00", BRISBANE)))
    assert store.load_static()
    store.poll_realtime()
    return store


@pytest.fixture
def client_for() -> Iterator[Callable[[TransitStore], falcon.testing.TestClient]]:
    """A falcon TestClient over an app serving a given store."""

    def make(store: TransitStore) -> falcon.testing.TestClient:
        return falcon.testing.TestClient(create_app(store.settings, store=store))

    yield make


@pytest.fixture
def cairns(cairns_store: TransitStore, client_for) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    """TestClient on the Cairns store."""
    cairns_store.now.now = local_ts("2014-06-10T08:00", BRISBANE)  # type: ignore[attr-defined]
    return client_for(cairns_store)


@pytest.fixture
def part2_app(
    tmp_path: Path,
) -> Iterator[Callable[..., tuple[Part2, falcon.testing.TestClient]]]:
    """Build part 1's app over a store, register part 2 on it, and return (part2, client)."""
    made: list[Part2] = []

    def make(store: TransitStore, **options: object) -> tuple[Part2, falcon.testing.TestClient]:
        values: dict[str, object] = {
            "records_dir": str(tmp_path / "records"),
            "metrics_db": str(tmp_path / "metrics.sqlite"),
            "ingest_interval": 0,
            **options,
        }
        settings = Part2Settings(**values)  # type: ignore[arg-type]
        app = create_app(store.settings, store=store)
        part2 = Part2(settings, store)
        part2.register(app)
        made.append(part2)
        return part2, falcon.testing.TestClient(app)

    (tmp_path / "records").mkdir()
    yield make
    for part2 in made:
        part2.metrics.stop()
        if part2.metrics.db is not None:
            part2.metrics.db.close()
