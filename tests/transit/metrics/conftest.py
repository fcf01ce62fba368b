"""Fixtures of the metrics tests: a clock in Lisbon and a store pinned to it."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import Clock

from sidecars.transit.settings import FeedSettings, RealtimeSettings, TransitSettings
from sidecars.transit.store import TransitStore

from ..helpers import SMALL_FEED, local_ts, write_feed


@pytest.fixture
def clock() -> Clock:
    """2026-11-20 (a Friday) 10:00 in Lisbon."""
    return Clock(local_ts("2026-11-20T10:00"))


@pytest.fixture
def lisbon_store(clock: Clock, tmp_path: Path) -> TransitStore:
    """A store serving a small Lisbon feed of agencies 41 and 42 (the videowall has keys for
    each), loaded before the app starts so every view sees it."""
    agencies = (
        "agency_id,agency_name,agency_url,agency_timezone\n"
        "41,Area 1,http://example.org,Europe/Lisbon\n"
        "42,Area 2,http://example.org,Europe/Lisbon\n"
    )
    routes = SMALL_FEED["routes.txt"].replace("R1,A,", "R1,41,")
    feed = write_feed(tmp_path / "lisbon.zip", {"agency.txt": agencies, "routes.txt": routes})
    settings = TransitSettings(
        feed=FeedSettings(source=str(feed), timezone="Europe/Lisbon"),
        realtime=RealtimeSettings(vehicles_source=None),
    )
    store = TransitStore(settings, clock=clock)
    assert store.load_static()
    return store
