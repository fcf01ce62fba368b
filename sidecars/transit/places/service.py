"""`Places`: the encoded locations and facilities bodies of one worker.

Configured location lists never change while the process runs and are encoded once; without
them the lists are derived from the served feed's stops (every district, municipality,
parish, locality and region a stop names, so the stops' ids join), like the facilities
(their `stop_ids`) rebuilt when the store swaps in a new feed version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..bodies import Body
from ..network import Network
from ..schemas import json_encoder, sorted_encoder
from . import facilities as fac
from .locations import Locations, derived_lists
from .schemas import AvailableFacilities, LocationEnvelope

LOCATION_KINDS = ("districts", "municipalities", "parishes", "localities", "regions")


class Places:
    """Locations (encoded once) and facilities (encoded once per feed version)."""

    def __init__(
        self,
        locations: Locations,
        facilities_dir: Path | None,
        walk_meters: float,
        place_meters: float,
        network: Callable[[], Network | None],
    ) -> None:
        self.locations = locations
        self.walk_meters = walk_meters
        self.network = network
        self.facilities = (
            fac.load(facilities_dir, self.locations, place_meters)
            if facilities_dir is not None
            else fac.FacilitySet()
        )
        # The kinds this deployment has files for (the real service has all of them).
        listed = [kind for kind in fac.LISTED if kind in self.facilities.rows]
        self.available = Body(json_encoder.encode(AvailableFacilities(available_facilities=listed)))
        # The real service stamps the envelope at request time; here it is the time the lists
        # were loaded, so each list (parishes: 200 kB) is encoded and gzipped once.
        self.derived = locations.directory is None
        lists = {kind: getattr(self.locations, kind) for kind in LOCATION_KINDS[:-1]}
        self._location_bodies = _envelopes({**lists, "regions": self.locations.region_list})
        self._lock = threading.Lock()
        self._built: tuple[str | None, dict[str, Body]] | None = None
        self._derived: tuple[str | None, dict[str, Body]] | None = None

    def location_body(self, kind: str) -> Body:
        """The envelope of one list (derived from the served feed's stops when no lists are
        configured)."""
        if not self.derived:
            return self._location_bodies[kind]
        net = self.network()
        version = net.version if net is not None else None
        built = self._derived
        if built is None or built[0] != version:
            lists = derived_lists(net.raw.stops) if net is not None else {}
            built = self._derived = (version, _envelopes(lists))
        return built[1].get(kind) or self._location_bodies[kind]

    def facility_body(self, kind: str) -> Body | None:
        """Encoded list of one kind, or None when the kind has no input file."""
        net = self.network()
        version = net.version if net is not None else None
        built = self._built
        if built is None or built[0] != version:
            with self._lock:
                built = self._built
                if built is None or built[0] != version:
                    built = (version, self._build(net))
                    self._built = built
        return built[1].get(kind)

    def _build(self, net: Network | None) -> dict[str, Body]:
        grid, ids = fac.stop_grid(net) if net is not None else (None, [])
        return {
            kind: Body(sorted_encoder.encode(fac.build(kind, rows, grid, ids, self.walk_meters)))
            for kind, rows in self.facilities.rows.items()
        }


def _envelopes(lists: dict[str, list]) -> dict[str, Body]:
    """Each list in the envelope, encoded once."""
    stamp = int(time.time() * 1000)
    return {
        kind: Body(
            json_encoder.encode(
                LocationEnvelope(data=lists.get(kind, []), status="success", timestamp=stamp)
            )
        )
        for kind in LOCATION_KINDS
    }
