"""Administrative locations: the four `/v2/locations/*` lists and the lookups that fill the
district / municipality / parish fields of facilities.

Input: a directory of CSV files (UTF-8, header first; see README.md):
`districts.csv` (id, name), `municipalities.csv` (id, name, district_id), `parishes.csv` (id,
name, municipality_id, district_id), `localities.csv` (id, name, display, district_id,
municipality_id, parish_id), and optionally `municipality_regions.csv` (municipality_id,
region_id, region_name) and `reference_points.csv` (lat, lon, municipality_id, locality).
A missing file gives an empty list (the real service's locations never 404).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..gtfs.tables import StopRow
from ..network import natural_key
from .geo import GridIndex
from .names import fold, locality_id
from .schemas import District, Locality, Municipality, Parish, Region

_UNION = re.compile(r"^uniao d[ae]s? freguesias d[aeo]s? ")


class LocationsError(ValueError):
    """A locations file is malformed (bad header, dangling parent id)."""


def _read(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise LocationsError(f"{path}:1: header lacks column(s) {', '.join(missing)}")
        rows = []
        for n, row in enumerate(reader, start=2):
            if any(row.get(c) is None for c in columns):
                raise LocationsError(f"{path}:{n}: expected {len(reader.fieldnames or [])} fields")
            rows.append({c: row[c].strip() for c in columns})
        return rows


Listed = TypeVar("Listed", District, Municipality, Parish, Locality)


def _listed(path: Path, kind: type[Listed], columns: tuple[str, ...]) -> list[Listed]:
    """A list file's rows as `kind` (its fields are the file's `columns`), by id in numeric
    collation."""
    return sorted((kind(**row) for row in _read(path, columns)), key=lambda x: natural_key(x.id))


@dataclass(frozen=True, slots=True)
class Place:
    """Location fields resolved for one facility."""

    district_id: str = ""
    district_name: str = ""
    municipality_id: str = ""
    municipality_name: str = ""
    parish_id: str = ""
    parish_name: str = ""
    region_id: str = ""
    region_name: str = ""
    locality: str = ""


class Locations:
    """The location lists, sorted by id (numeric collation), and name / point lookups."""

    def __init__(self, directory: Path | None) -> None:
        """Read the lists of a directory; None: no lists (every list empty)."""
        self.directory = directory
        d = directory if directory is not None else Path("/nonexistent-locations")
        self.districts = _listed(d / "districts.csv", District, ("id", "name"))
        self.municipalities = _listed(
            d / "municipalities.csv", Municipality, ("id", "name", "district_id")
        )
        self.parishes = _listed(
            d / "parishes.csv", Parish, ("id", "name", "municipality_id", "district_id")
        )
        self.localities = _listed(
            d / "localities.csv",
            Locality,
            ("id", "name", "display", "district_id", "municipality_id", "parish_id"),
        )
        self.locality_by_id = {x.id: x for x in self.localities}
        self._locality_names = {(x.municipality_id, fold(x.name)): x for x in self.localities}
        self.district_by_id = {x.id: x for x in self.districts}
        self.municipality_by_id = {x.id: x for x in self.municipalities}
        self.parish_by_id = {x.id: x for x in self.parishes}
        for m in self.municipalities:
            if self.districts and m.district_id not in self.district_by_id:
                raise LocationsError(f"municipality {m.id}: unknown district {m.district_id}")
        for p in self.parishes:
            if self.municipalities and p.municipality_id not in self.municipality_by_id:
                raise LocationsError(f"parish {p.id}: unknown municipality {p.municipality_id}")
        self.regions = {
            r["municipality_id"]: (r["region_id"], r["region_name"])
            for r in _read(
                d / "municipality_regions.csv", ("municipality_id", "region_id", "region_name")
            )
        }
        self.region_list = sorted(
            {Region(id=i, name=n) for i, n in self.regions.values()}
            if not (d / "regions.csv").is_file()
            else {
                Region(id=r["id"], name=r["name"]) for r in _read(d / "regions.csv", ("id", "name"))
            },
            key=lambda x: natural_key(x.id),
        )
        # Names are not unique ("Lagoa" is in Faro and in the Azores): keep every candidate.
        self._municipality_names: dict[str, list[Municipality]] = {}
        for m in self.municipalities:
            self._municipality_names.setdefault(fold(m.name), []).append(m)
        # A union of parishes is also found by its members' names alone ("Lagoa e Carvoeiro"
        # for "União das freguesias de Lagoa e Carvoeiro"), the way people write it.
        self._parish_names: dict[tuple[str, str], Parish] = {}
        for p in self.parishes:
            key = fold(p.name)
            self._parish_names[(p.municipality_id, key)] = p
            short = _UNION.sub("", key)
            if short != key:
                self._parish_names.setdefault((p.municipality_id, short), p)
        points = _read(d / "reference_points.csv", ("lat", "lon", "municipality_id", "locality"))
        self._points = GridIndex(
            [(float(r["lat"]), float(r["lon"])) for r in points],
            cell_meters=1000.0,
        )
        self._point_info = [(r["municipality_id"], r["locality"]) for r in points]

    # -- lookups --------------------------------------------------------------------------

    def municipality_by_name(self, name: str, district_hint: str = "") -> Municipality | None:
        """The municipality of a name; an ambiguous name needs the district (id or name)."""
        found = self._municipality_names.get(fold(name), [])
        if len(found) > 1 and district_hint:
            hint = fold(district_hint)
            found = [
                m
                for m in found
                if m.district_id == district_hint
                or fold(self.district_by_id[m.district_id].name) == hint
            ]
        return found[0] if len(found) == 1 else None

    def resolve_stop(self, row: StopRow) -> tuple[str, str, str, bool]:
        """(district_id, municipality_id, locality_id) of a stop, as ids of these lists, and
        whether every place the stop names was found.

        Ids in the feed win; else the municipality by name and the locality by name within its
        municipality (Carris Metropolitana's stops name their locality: "Alcochete" is
        `1502-alcochete`). A locality gives its municipality, a municipality its district.
        """
        locality = self.locality_by_id.get(row.locality_id)
        muni = self.municipality_by_id.get(row.municipality_id)
        if muni is None and row.municipality_name:
            muni = self.municipality_by_name(row.municipality_name, row.district_id)
        if locality is None and row.locality and muni is not None:
            locality = self._locality_names.get((muni.id, fold(row.locality)))
        if muni is None and locality is not None:
            muni = self.municipality_by_id.get(locality.municipality_id)
        district = self.district_by_id.get(muni.district_id if muni else row.district_id)
        complete = (
            (district is not None or not row.district_id)
            and (muni is not None or not (row.municipality_id or row.municipality_name))
            and (locality is not None or not (row.locality_id or row.locality))
        )
        return (
            district.id if district else "",
            muni.id if muni else "",
            locality.id if locality else "",
            complete,
        )

    def nearest_point(self, lat: float, lon: float, max_meters: float) -> tuple[str, str] | None:
        """(municipality_id, locality) of the nearest reference point within `max_meters`."""
        hit = self._points.nearest(lat, lon, max_meters)
        return self._point_info[hit] if hit is not None else None

    def resolve(
        self,
        record: dict[str, str],
        lat: float,
        lon: float,
        max_meters: float,
    ) -> Place:
        """Location fields of a facility, filled where the input lacks them.

        Order: ids given in the input win; else names (accent- and case-insensitive, parish
        names within their municipality); else, for the municipality and locality only, the
        nearest reference point within `max_meters`. Parishes have no coordinates or polygons
        here, so a parish is never found by position. Parents follow from children.
        """
        parish = self.parish_by_id.get(record.get("parish_id", ""))
        muni = self.municipality_by_id.get(record.get("municipality_id", ""))
        locality = record.get("locality", "")
        if parish is not None and muni is None:
            muni = self.municipality_by_id.get(parish.municipality_id)
        if muni is None and record.get("municipality_name"):
            muni = self.municipality_by_name(
                record["municipality_name"],
                record.get("district_id", "") or record.get("district_name", ""),
            )
        if muni is None:
            near = self.nearest_point(lat, lon, max_meters)
            if near is not None:
                muni = self.municipality_by_id.get(near[0])
                locality = locality or near[1]
        if parish is None and muni is not None and record.get("parish_name"):
            parish = self._parish_names.get((muni.id, fold(record["parish_name"])))
        district_id = muni.district_id if muni is not None else record.get("district_id", "")
        district = self.district_by_id.get(district_id)
        region_id, region_name = self.regions.get(muni.id, ("", "")) if muni else ("", "")
        return Place(
            district_id=district.id if district else district_id,
            district_name=district.name if district else record.get("district_name", ""),
            municipality_id=muni.id if muni else record.get("municipality_id", ""),
            municipality_name=muni.name if muni else record.get("municipality_name", ""),
            parish_id=parish.id if parish else record.get("parish_id", ""),
            parish_name=parish.name if parish else record.get("parish_name", ""),
            region_id=record.get("region_id", "") or region_id,
            region_name=record.get("region_name", "") or region_name,
            locality=locality,
        )


def derived_lists(stops: list[StopRow]) -> dict[str, list]:
    """The location lists an operator's stops imply, when no lists are configured: each
    district, region, municipality, parish and locality a stop names with its id (a locality
    by name gets `locality_id`'s id), so every id a stop serves is in a list."""
    districts: dict[str, District] = {}
    regions: dict[str, Region] = {}
    municipalities: dict[str, Municipality] = {}
    parishes: dict[str, Parish] = {}
    localities: dict[str, Locality] = {}
    for s in stops:
        if s.district_id:
            districts.setdefault(s.district_id, District(id=s.district_id, name=s.district_name))
        if s.region_id:
            regions.setdefault(s.region_id, Region(id=s.region_id, name=s.region_name))
        if s.municipality_id:
            municipalities.setdefault(
                s.municipality_id,
                Municipality(
                    district_id=s.district_id, id=s.municipality_id, name=s.municipality_name
                ),
            )
        if s.parish_id:
            parishes.setdefault(
                s.parish_id,
                Parish(
                    district_id=s.district_id,
                    id=s.parish_id,
                    municipality_id=s.municipality_id,
                    name=s.parish_name,
                ),
            )
        lid = s.locality_id or (
            locality_id(s.municipality_id, s.locality) if s.locality and s.municipality_id else ""
        )
        if lid:
            localities.setdefault(
                lid,
                Locality(
                    display="",
                    district_id=s.district_id,
                    id=lid,
                    municipality_id=s.municipality_id,
                    name=s.locality or lid,
                    parish_id=s.parish_id,
                ),
            )
    return {
        kind: sorted(items.values(), key=lambda x: natural_key(x.id))
        for kind, items in (
            ("districts", districts),
            ("municipalities", municipalities),
            ("parishes", parishes),
            ("localities", localities),
            ("regions", regions),
        )
    }
