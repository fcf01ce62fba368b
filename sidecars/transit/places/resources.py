"""Falcon resources of `/v2/locations/*` and `/v2/facilities*`."""

from __future__ import annotations

import falcon
import falcon.asgi

from ..resources import EMPTY_LIST, send_body, send_raw
from .facilities import KINDS
from .service import LOCATION_KINDS, Places

CACHE_LOCATIONS = "public, max-age=3600"
CACHE_STORES = "public, max-age=30"
CACHE_FACILITIES = "public, max-age=3600"


class LocationList:
    """One location list in its envelope (always 200, as by the real service)."""

    def __init__(self, places: Places, kind: str) -> None:
        self.places = places
        self.kind = kind

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        send_body(req, resp, self.places.location_body(self.kind), CACHE_LOCATIONS)

    on_head = on_get


class FacilityIndex:
    """`/v2/facilities`: the published kinds (the real service sends no Cache-Control)."""

    def __init__(self, places: Places) -> None:
        self.places = places

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        send_body(req, resp, self.places.available, CACHE_FACILITIES)
        resp.cache_control = None

    on_head = on_get


class FacilityList:
    """One facility kind; 404 `[]` when it has no input file."""

    def __init__(self, places: Places, kind: str) -> None:
        self.places = places
        self.kind = kind
        self.cache_control = CACHE_STORES if kind == "stores" else CACHE_FACILITIES

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = self.places.facility_body(self.kind)
        if body is None:
            send_raw(resp, falcon.HTTP_404, EMPTY_LIST)
            return
        send_body(req, resp, body, self.cache_control)

    on_head = on_get


def routes(places: Places) -> list[tuple[str, object]]:
    """(path, resource) of every locations and facilities endpoint."""
    out: list[tuple[str, object]] = [
        (f"/v2/locations/{kind}", LocationList(places, kind)) for kind in LOCATION_KINDS
    ]
    out.append(("/v2/facilities", FacilityIndex(places)))
    out += [(f"/v2/facilities/{kind}", FacilityList(places, kind)) for kind in KINDS]
    return out
