"""msgspec Structs of the `/v2/locations/*` and `/v2/facilities*` bodies.

Fields are alphabetical like the rest of the transit structs (the real API sends sorted keys).
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct


class District(Struct):
    """A district (or autonomous region) of `/v2/locations/districts`."""

    id: str
    name: str


class Region(Struct, frozen=True):
    """A region (NUTS III) of `/v2/locations/regions`."""

    id: str
    name: str


class Municipality(Struct):
    """A municipality of `/v2/locations/municipalities`."""

    district_id: str
    id: str
    name: str


class Parish(Struct):
    """A parish of `/v2/locations/parishes`."""

    district_id: str
    id: str
    municipality_id: str
    name: str


class Locality(Struct):
    """A locality of `/v2/locations/localities`."""

    display: str
    district_id: str
    id: str
    municipality_id: str
    name: str
    parish_id: str


class LocationEnvelope(Struct):
    """Body of every `/v2/locations/*` endpoint."""

    # One of the four item types above; a list union cannot be typed more precisely.
    data: list[Any]
    status: str
    timestamp: int


class Contacts(Struct):
    """Contacts of a store or school."""

    address: str
    email: str
    google_place_id: str | None
    phone: str
    postal_code: str
    url: str


class OpeningHours(Struct):
    """Opening hours of a store: `HH:MM-HH:MM` intervals per weekday."""

    friday: list[str]
    monday: list[str]
    saturday: list[str]
    special: str
    sunday: list[str]
    thursday: list[str]
    tuesday: list[str]
    wednesday: list[str]


class _Facility(Struct):
    """What every facility has. A subclass's fields follow its base's, so facilities are
    encoded with `sorted_encoder`: the real service lists their keys alphabetically."""

    district_id: str
    district_name: str
    id: str
    lat: float
    locality: str
    lon: float
    municipality_id: str
    municipality_name: str
    name: str
    region_id: str
    region_name: str
    stop_ids: list[str]


class _ParishFacility(_Facility):
    """A facility placed in a parish (all but the PIPs)."""

    parish_id: str
    parish_name: str


class PipLocation(_Facility):
    """A passenger information panel (`/v2/facilities/pips`; no parish fields)."""


class Station(_ParishFacility):
    """A boat, light-rail, subway or train station, or a helpdesk."""


class TicketStore(_ParishFacility):
    """A ticket store (`/v2/facilities/stores`); `realtime` stays null (no queue feed)."""

    brand_name: str
    contacts: Contacts
    hours: OpeningHours
    realtime: dict[str, Any] | None
    short_name: str


class School(_ParishFacility):
    """A school (`/v2/facilities/schools`)."""

    contacts: Contacts
    grouping: str
    nature: str


class AvailableFacilities(Struct):
    """Body of `/v2/facilities`."""

    available_facilities: list[str]
