"""Fixtures for the transit sidecar: the real Cairns feed, small built feeds, a fake clock, apps
with metrics and places registered."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import falcon.testing
import pytest
from support import Clock

from sidecars.transit.app import Services, create_app
from sidecars.transit.settings import (
    FeedSettings,
    MetricsSettings,
    PlacesSettings,
    RealtimeSettings,
    TransitSettings,
)
from sidecars.transit.store import TransitStore

from .helpers import BRISBANE, BULLRUNNER_VP, CAIRNS_ZIP, local_ts, write_feed


@pytest.fixture
def small_feed(tmp_path: Path) -> Path:
    """The SMALL_FEED as a zip."""
    return write_feed(tmp_path / "small.zip", {})


@pytest.fixture
def make_store() -> Callable[..., TransitStore]:
    """Build a store with no background threads; realtime sources off unless given (as
    RealtimeSettings fields), other feed settings in `feed`."""

    def make(
        source: str | Path,
        clock: Callable[[], float] | None = None,
        feed: FeedSettings | None = None,
        **realtime: object,
    ) -> TransitStore:
        settings = TransitSettings(
            feed=dataclasses.replace(feed or FeedSettings(), source=str(source)),
            realtime=RealtimeSettings(**{"vehicles_source": None, **realtime}),  # type: ignore[arg-type]
        )
        return TransitStore(settings, clock=clock)

    return make


@pytest.fixture(scope="session")
def cairns_store() -> TransitStore:
    """The real Cairns feed with the real Bull Runner vehicles, at 2014-06-10 08:00 Brisbane
    (a Tuesday in the feed's validity; the 2017 positions are kept: no vehicle age limit)."""
    settings = TransitSettings(
        feed=FeedSettings(source=str(CAIRNS_ZIP)),
        realtime=RealtimeSettings(vehicles_source=str(BULLRUNNER_VP), vehicles_max_age_seconds=0),
    )
    store = TransitStore(settings, clock=Clock(local_ts("2014-06-10T08:00", BRISBANE)))
    assert store.load_static()
    store.poll_realtime()
    return store


@pytest.fixture
def app_for(
    tmp_path: Path,
) -> Iterator[Callable[..., tuple[Services, falcon.testing.TestClient]]]:
    """The whole app over a ready store: (its services, a TestClient). Keyword arguments are
    MetricsSettings fields over the default: records in a fresh directory, ingested on every
    refresh."""
    made: list[Services] = []
    default_metrics = MetricsSettings(
        records_dir=str(tmp_path / "records"),
        db=str(tmp_path / "metrics.sqlite"),
        ingest_interval=0,
    )

    def make(
        store: TransitStore,
        *,
        places: PlacesSettings | None = None,
        middleware: tuple[object, ...] = (),
        **metrics: object,
    ) -> tuple[Services, falcon.testing.TestClient]:
        settings = dataclasses.replace(
            store.settings,
            metrics=dataclasses.replace(default_metrics, **metrics),  # type: ignore[arg-type]
            places=places or PlacesSettings(),
        )
        services = Services(settings, store=store)
        made.append(services)
        app = create_app(settings, services=services, middleware=middleware)
        return services, falcon.testing.TestClient(app)

    (tmp_path / "records").mkdir()
    yield make
    for services in made:
        services.metrics.stop()
        if services.metrics.db is not None:
            services.metrics.db.close()


@pytest.fixture
def client_for(
    tmp_path: Path, app_for: Callable[..., tuple[Services, falcon.testing.TestClient]]
) -> Callable[[TransitStore], falcon.testing.TestClient]:
    """A falcon TestClient over the whole app serving a given store, for the network and
    realtime tests: metrics off (as deployed by default) and no location or facility files
    (loading the shipped ones takes a fifth of a second per app)."""
    no_places = PlacesSettings(locations_dir=str(tmp_path / "no-places"), facilities_dir=None)

    def make(store: TransitStore) -> falcon.testing.TestClient:
        return app_for(store, places=no_places, records_dir=None, db=None)[1]

    return make


@pytest.fixture
def trip_updates_client(
    tmp_path: Path,
    make_store: Callable[..., TransitStore],
    client_for: Callable[[TransitStore], falcon.testing.TestClient],
) -> Callable[[str | Path, list[dict], float], falcon.testing.TestClient]:
    """A TestClient over a feed with a TripUpdates message of these entities, both loaded,
    the clock pinned at `now` (the message's time)."""
    from .realtime.test_realtime import feed

    def make(source: str | Path, entities: list[dict], now: float) -> falcon.testing.TestClient:
        tu = tmp_path / "tu.pb"
        tu.write_bytes(feed(entities, now))
        store = make_store(source, clock=Clock(now), trip_updates_source=str(tu))
        assert store.load_static()
        store.poll_realtime()
        return client_for(store)

    return make


@pytest.fixture
def cairns(cairns_store: TransitStore, client_for) -> falcon.testing.TestClient:  # type: ignore[no-untyped-def]
    """TestClient on the Cairns store."""
    cairns_store.now.now = local_ts("2014-06-10T08:00", BRISBANE)  # type: ignore[attr-defined]
    return client_for(cairns_store)
