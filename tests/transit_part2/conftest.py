"""Fixtures of the part-2 tests: stores with a fixed clock, apps with part 2 registered."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import falcon.testing
import pytest

from sidecars.transit.app import create_app
from sidecars.transit.part2 import Part2, Part2Settings
from sidecars.transit.settings import Settings
from sidecars.transit.store import TransitStore

from .helpers import CAIRNS_ZIP, Clock, lisbon


@pytest.fixture(scope="session")
def cairns_store() -> TransitStore:
    """The real Cairns feed, loaded once."""
    store = TransitStore(Settings(gtfs_source=str(CAIRNS_ZIP), vehicles_source=None))
    assert store.load_static()
    return store


@pytest.fixture
def clock() -> Clock:
    """2026-11-20 (a Friday) 10:00 in Lisbon."""
    return Clock(lisbon("2026-11-20T10:00"))


@pytest.fixture
def lisbon_store(clock: Clock) -> TransitStore:
    """A store whose feed is never loaded: metrics only need the (fixed) Lisbon timezone."""
    settings = Settings(gtfs_source=str(CAIRNS_ZIP), vehicles_source=None, timezone="Europe/Lisbon")
    return TransitStore(settings, clock=clock)


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
