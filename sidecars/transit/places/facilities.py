"""Facilities: stores, helpdesks, schools, stations and PIPs, read from CSV files, joined to
the GTFS stops within walking distance and to the administrative locations.

Input: `<kind>.csv` in the facilities directory for each kind of `KINDS` (see README.md for
the columns). A missing file means the kind is not published (404 `[]`, as the real service
answers a missing key); a header-only file publishes an empty list.
"""

from __future__ import annotations

import csv
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..network import Network, natural_key
from .geo import GridIndex
from .locations import Locations, Place
from .schemas import Contacts, OpeningHours, PipLocation, School, Station, TicketStore

log = logging.getLogger("sidecars.transit.places")

KINDS = (
    "stores",
    "helpdesks",
    "schools",
    "boat_stations",
    "light_rail_stations",
    "subway_stations",
    "train_stations",
    "pips",
)
# `/v2/facilities` lists these; PIPs are served but not listed, as by the real service.
LISTED = KINDS[:-1]
REQUIRED = ("id", "name", "lat", "lon")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

Facility = TicketStore | School | Station | PipLocation


@dataclass(frozen=True, slots=True)
class Problem:
    """A rejected facility row."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


@dataclass(slots=True)
class _Row:
    line: int
    lat: float
    lon: float
    values: dict[str, str]
    place: Place


@dataclass(slots=True)
class FacilitySet:
    """Facility rows of every published kind, with their locations resolved."""

    rows: dict[str, list[_Row]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def load(directory: Path, locations: Locations, place_meters: float) -> FacilitySet:
    """Read every facility file of a directory; bad rows are reported and left out."""
    out = FacilitySet()
    for kind in KINDS:
        path = directory / f"{kind}.csv"
        if not path.is_file():
            continue
        rows: list[_Row] = []
        seen: set[str] = set()
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                out.problems.append(Problem(str(path), 1, f"header lacks {', '.join(missing)}"))
                continue
            for n, raw in enumerate(reader, start=2):
                values = {k: (v or "").strip() for k, v in raw.items() if k is not None}
                try:
                    if None in raw or any(v is None for v in raw.values()):
                        raise ValueError("wrong number of fields")
                    if not values["id"] or not values["name"]:
                        raise ValueError("id and name are required")
                    if values["id"] in seen:
                        raise ValueError(f"duplicate id {values['id']}")
                    lat, lon = float(values["lat"]), float(values["lon"])
                    if not (-90 <= lat <= 90 and -180 <= lon <= 180) or math.isnan(lat + lon):
                        raise ValueError(f"lat/lon out of range: {lat}, {lon}")
                except ValueError as exc:
                    out.problems.append(Problem(str(path), n, str(exc)))
                    continue
                seen.add(values["id"])
                place = locations.resolve(values, lat, lon, place_meters)
                rows.append(_Row(n, lat, lon, values, place))
        rows.sort(key=lambda r: natural_key(r.values["id"]))
        out.rows[kind] = rows
    for problem in out.problems:
        log.warning("facility rejected: %s", problem)
    return out


def stop_grid(network: Network) -> tuple[GridIndex, list[str]]:
    """Grid over the feed's stops (stops without a position are left out)."""
    raw = network.raw
    ids, points = [], []
    for stop_id, stop in zip(raw.stop_ids, raw.stops, strict=True):
        if stop.lat or stop.lon:
            ids.append(stop_id)
            points.append((stop.lat, stop.lon))
    return GridIndex(points, cell_meters=250.0), ids


def _contacts(v: dict[str, str]) -> Contacts:
    return Contacts(
        address=v.get("address", ""),
        email=v.get("email", ""),
        google_place_id=v.get("google_place_id") or None,
        phone=v.get("phone", ""),
        postal_code=v.get("postal_code", ""),
        url=v.get("url", ""),
    )


def _hours(v: dict[str, str]) -> OpeningHours:
    def day(name: str) -> list[str]:
        text = v.get("hours_" + name, "")
        return [part.strip() for part in text.split("|") if part.strip()]

    return OpeningHours(
        friday=day("friday"),
        monday=day("monday"),
        saturday=day("saturday"),
        special=v.get("hours_special", ""),
        sunday=day("sunday"),
        thursday=day("thursday"),
        tuesday=day("tuesday"),
        wednesday=day("wednesday"),
    )


def build(
    kind: str, rows: list[_Row], grid: GridIndex | None, stop_ids: list[str], walk_meters: float
) -> list[Facility]:
    """The records of one kind, each with the stops within `walk_meters`, nearest first."""
    out: list[Facility] = []
    for r in rows:
        v, p = r.values, r.place
        near = (
            [stop_ids[i] for _, i in grid.within(r.lat, r.lon, walk_meters)]
            if grid is not None
            else []
        )
        common: dict[str, Any] = {
            "district_id": p.district_id,
            "district_name": p.district_name,
            "id": v["id"],
            "lat": r.lat,
            "locality": p.locality,
            "lon": r.lon,
            "municipality_id": p.municipality_id,
            "municipality_name": p.municipality_name,
            "name": v["name"],
            "region_id": p.region_id,
            "region_name": p.region_name,
            "stop_ids": near,
        }
        parish: dict[str, Any] = {"parish_id": p.parish_id, "parish_name": p.parish_name}
        if kind == "stores":
            out.append(
                TicketStore(
                    brand_name=v.get("brand_name", ""),
                    contacts=_contacts(v),
                    hours=_hours(v),
                    realtime=None,
                    short_name=v.get("short_name", ""),
                    **common,
                    **parish,
                )
            )
        elif kind == "schools":
            out.append(
                School(
                    contacts=_contacts(v),
                    grouping=v.get("grouping", ""),
                    nature=v.get("nature", ""),
                    **common,
                    **parish,
                )
            )
        elif kind == "pips":
            out.append(PipLocation(**common))
        else:
            out.append(Station(**common, **parish))
    return out
