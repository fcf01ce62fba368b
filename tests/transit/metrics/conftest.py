"""Fixtures of the metrics tests: a clock in Lisbon and a store pinned to it."""

from __future__ import annotations

import pytest
from support import Clock

from sidecars.transit.settings import FeedSettings, RealtimeSettings, TransitSettings
from sidecars.transit.store import TransitStore

from ..helpers import CAIRNS_ZIP, local_ts


@pytest.fixture
def clock() -> Clock:
    """2026-11-20 (a Friday) 10:00 in Lisbon."""
    return Clock(local_ts("2026-11-20T10:00"))


@pytest.fixture
def lisbon_store(clock: Clock) -> TransitStore:
    """A store whose feed is never loaded: metrics only need the (fixed) Lisbon timezone."""
    settings = TransitSettings(
        feed=FeedSettings(source=str(CAIRNS_ZIP), timezone="Europe/Lisbon"),
        realtime=RealtimeSettings(vehicles_source=None),
    )
    return TransitStore(settings, clock=clock)
