"""The OpenAPI 3.1 document of the transit API (`/v2/openapi.json`), generated from the
msgspec Structs it sends, so the document and the bodies cannot drift apart.

Every operation lists the statuses it really answers: the real service's `[]` / `{}` bodies
for an unknown or refused id, the error envelope (`ServerError`) for a bad query parameter
(an unknown one too), and 503 until the first feed is loaded.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .metrics import schemas as m
from .places import schemas as pl
from .places.facilities import KINDS
from .plans import Period, Plan, ServiceDate
from .resources import FILTERS
from .schemas import (
    Alert,
    Arrival,
    FeedStatus,
    Line,
    Pattern,
    PatternArrival,
    PipEstimate,
    PipMessage,
    Route,
    RouteNotFound,
    ServerError,
    Shape,
    Stop,
    TransitHealth,
    Vehicle,
)
from .settings import TransitSettings
from .status import RefreshAnswer, StatusMessage, StatusTime

_REF = "#/components/schemas/{name}"
STRUCTS: tuple[type, ...] = (
    Alert, Arrival, FeedStatus, Line, Pattern, PatternArrival, PipEstimate, PipMessage, Route,
    RouteNotFound, ServerError, Shape, Stop, TransitHealth, Vehicle, ServiceDate, Period, Plan,
    StatusTime, StatusMessage, RefreshAnswer, m.DemandRecord, m.DemandMonthRecord,
    m.DemandPeaksRecord, m.TopLinesByAgency, m.ServiceAll, m.ComplaintCounts, m.Videowall,
    pl.District, pl.Region, pl.Municipality, pl.Parish, pl.Locality, pl.TicketStore, pl.School,
    pl.Station, pl.PipLocation, pl.AvailableFacilities,
)  # fmt: skip
EMPTY_LIST = {"type": "array", "maxItems": 0}
EMPTY_OBJECT = {"type": "object", "maxProperties": 0}
LOCATION_ITEMS = {
    "districts": "District",
    "municipalities": "Municipality",
    "parishes": "Parish",
    "localities": "Locality",
    "regions": "Region",
}
FACILITY_ITEMS = {"stores": "TicketStore", "schools": "School", "pips": "PipLocation"}


def ref(name: str) -> dict[str, str]:
    """A reference to a component schema."""
    return {"$ref": _REF.format(name=name)}


def array(name: str) -> dict[str, Any]:
    """A list of one component."""
    return {"type": "array", "items": ref(name)}


def answer(description: str, schema: dict[str, Any], media: str = "application/json") -> dict:
    """One response."""
    return {"description": description, "content": {media: {"schema": schema}}}


def error(description: str) -> dict[str, Any]:
    """A response with the error envelope."""
    return answer(description, ref("ServerError"))


BAD_PARAMS = "An unknown query parameter (the message lists the known ones) or a bad value."
NOT_LOADED = error("The static feed is not loaded yet (Retry-After: 5).")


def operation(
    summary: str,
    ok: dict[str, Any],
    *,
    params: list[dict[str, Any]] = (),  # type: ignore[assignment]
    extra: dict[str, Any] | None = None,
    feed: bool = True,
    bad_request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A GET operation: its 200, a 400 for bad parameters, 503 while no feed is loaded."""
    responses: dict[str, Any] = {"200": ok, "400": bad_request or error(BAD_PARAMS)}
    if feed:
        responses["503"] = NOT_LOADED
    responses.update(extra or {})
    out: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        out["parameters"] = list(params)
    return out


def protobuf(summary: str) -> dict[str, Any]:
    """A GET answering a GTFS-RT FeedMessage."""
    binary = {"type": "string", "format": "binary"}
    ok = answer("FeedMessage.", binary, "application/octet-stream")
    return {"get": operation(summary, ok, feed=False)}


def query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    """An optional query parameter."""
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema}  # fmt: skip


def path_id(description: str, pattern: str | None = None) -> dict[str, Any]:
    """The `{item_id}` path parameter."""
    schema: dict[str, Any] = {"type": "string", "minLength": 1}
    if pattern:
        schema["pattern"] = f"^{pattern}$"
    return {"name": "item_id", "in": "path", "required": True, "description": description,
            "schema": schema}  # fmt: skip


# Eight digits with a month 01-12 and a day 01-31 (a day past its month's end, 20250230,
# still matches and is `400 []`: the description says so).
DATE_PATTERN = r"^[0-9]{4}(0[1-9]|1[0-2])(0[1-9]|[12][0-9]|3[01])$"


def _network_paths(settings: TransitSettings) -> dict[str, Any]:
    stop_pattern = settings.feed.stop_id_pattern
    date = query(
        "date",
        "Service day, `YYYYMMDD`, a calendar date (`00000000` or `20250230` is `400 []`). "
        "Default: what the operational day now shows (its own trips and those of the next "
        "and previous service days running inside it).",
        {"type": "string", "pattern": DATE_PATTERN},
    )
    limit = query("limit", "Only the next N arrivals from now (by estimate, else schedule).",
                  {"type": "integer", "minimum": 1, "maximum": 1000})  # fmt: skip
    list_400 = answer(
        "`[]`: a malformed `date` (or a stop id the profile refuses), as the real service; "
        "the error envelope for an unknown parameter or a bad `limit`.",
        {"anyOf": [EMPTY_LIST, ref("ServerError")]},
    )
    filters = {
        "line_id": "Only those of this line (`/v2/lines` id).",
        "route_id": "Only those of this route (the operator's route id).",
        "stop_id": "Only those about this stop (an alert about a whole route is about its stops).",
    }

    def filtered(kind: str) -> list[dict[str, Any]]:
        return [query(n, filters[n], {"type": "string"}) for n in FILTERS[kind]]

    radius_max = settings.limits.max_radius_meters
    return {
        "/v2/": {"get": operation(
            "The root: the real service's greeting (plain text in a JSON content type)",
            answer("`Jusi was here!`", {"type": "string"}, "application/json; charset=utf-8"),
            feed=False,
        )},
        "/v2/gtfs": {"get": operation(
            "The served GTFS feed (zip)",
            answer("The zip.", {"type": "string", "format": "binary"}, "application/zip"),
        )},
        "/v2/alerts": {"get": operation(
            "Service alerts active now (GTFS-RT Alert fields, snake_case)",
            answer("Alerts.", array("Alert")), params=filtered("alerts"), feed=False,
        )},
        "/v2/alerts.pb": protobuf("The active alerts as a GTFS-RT FeedMessage"),
        "/v2/vehicles": {"get": operation(
            "Vehicles heard from within TRANSIT_VEHICLES_MAX_AGE_SECONDS",
            answer("Vehicles.", array("Vehicle")), params=filtered("vehicles"), feed=False,
        )},
        "/v2/vehicles.pb": protobuf(
            "The vehicles of /v2/vehicles that are on a trip, as a GTFS-RT FeedMessage"
        ),
        "/v2/vehicles/{item_id}": {"get": operation(
            "One current vehicle, by the id of the list (`41|1160`)",
            answer("The vehicle.", ref("Vehicle")),
            params=[path_id("Vehicle id.")],
            extra={"404": answer("`{}`: no current vehicle has this id.", EMPTY_OBJECT)},
            feed=False,
        )},
        "/v2/stops": {"get": operation(
            "Stops, sorted by id; with lat, lon and radius those within radius metres, nearest "
            "first",
            answer("Stops.", array("Stop")),
            params=[
                query("lat", "Latitude (with lon and radius).",
                      {"type": "number", "minimum": -90, "maximum": 90}),
                query("lon", "Longitude (with lat and radius).",
                      {"type": "number", "minimum": -180, "maximum": 180}),
                query("radius", f"Metres, at most {radius_max:g} (TRANSIT_MAX_RADIUS_METERS).",
                      {"type": "number", "minimum": 0, "maximum": radius_max}),
            ],
        )},
        "/v2/lines": {"get": operation("Lines", answer("Lines.", array("Line")))},
        "/v2/routes": {"get": operation("Routes (the feed's)", answer("Routes.", array("Route")))},
        "/v2/patterns/{item_id}": {"get": operation(
            "The versions of one pattern",
            answer("Pattern versions.", array("Pattern")),
            params=[path_id("Pattern id.")],
            extra={"404": answer("`{}`: unknown pattern.", EMPTY_OBJECT)},
        )},
        "/v2/shapes/{item_id}": {"get": operation(
            "One shape",
            answer("The shape.", ref("Shape")),
            params=[path_id("Shape id.")],
            extra={"404": answer("`{}`: unknown shape.", EMPTY_OBJECT)},
        )},
        "/v2/arrivals/by_stop/{item_id}": {"get": operation(
            "A stop's arrivals on one operational day, with realtime",
            answer("Arrivals in time order.", array("Arrival")),
            params=[path_id("Stop id.", stop_pattern), date, limit],
            extra={"404": answer("`[]`: unknown stop.", EMPTY_LIST)},
            bad_request=list_400,
        )},
        "/v2/arrivals/by_pattern/{item_id}": {"get": operation(
            "A pattern's arrivals at every stop on one operational day",
            answer("Arrivals in time order.", array("PatternArrival")),
            params=[path_id("Pattern id."), date, limit],
            extra={"404": answer("`[]`: unknown pattern.", EMPTY_LIST)},
            bad_request=list_400,
        )},
        "/v2/pips/estimates": {"post": {
            "summary": "Passenger information panel rows for some stops (at most 8)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object",
                "properties": {"stops": {
                    "type": "array", "minItems": 1, "items": {"type": "string"},
                    "description": f"At most {settings.limits.pip_max_stops} distinct ids "
                    "(TRANSIT_PIP_MAX_STOPS; a repeated id counts once).",
                }},
                "required": ["stops"],
            }}}},
            "responses": {
                "200": answer("Panel rows.", array("PipEstimate")),
                "400": answer("`[]` (no stops, a refused id), or the envelope for a body that "
                              "is not JSON or over the cap on distinct stops.",
                              {"anyOf": [EMPTY_LIST, ref("ServerError")]}),
                "413": error("The body is over TRANSIT_MAX_BODY_BYTES."),
                "503": NOT_LOADED,
            },
        }},
        "/v2/pips/{item_id}/message": {"get": operation(
            "A panel's identification text", answer("`#<pip>`.", ref("PipMessage")),
            params=[path_id("Panel id.")], feed=False,
        )},
        "/v2/dates": {"get": operation("Service days", answer("Days.", array("ServiceDate")))},
        "/v2/periods": {"get": operation("Periods", answer("Periods.", array("Period")))},
        "/v2/plans": {"get": operation("Plans", answer("Plans.", array("Plan")))},
        "/v2/status/time": {"get": operation(
            "The server's clock", answer("Times.", ref("StatusTime")), feed=False
        )},
        "/v2/status/message": {"get": operation(
            "What to tell riders about the data", answer("Message.", ref("StatusMessage")),
            feed=False,
        )},
    }  # fmt: skip


def _other_paths() -> dict[str, Any]:
    not_configured = {"404": answer("`[]`: no data configured for it.", EMPTY_LIST)}
    metric_schemas = {
        "demand/by_agency/day": array("DemandRecord"),
        "demand/by_agency/month": array("DemandMonthRecord"),
        "demand/by_agency/year": EMPTY_LIST,
        "demand/by_agency/records": array("DemandPeaksRecord"),
        "demand/by_line": array("DemandRecord"),
        "demand/top_lines/by_agency": ref("TopLinesByAgency"),
        "demand/by_stop": array("DemandRecord"),
        "service/all": ref("ServiceAll"),
        "complaints": array("ComplaintCounts"),
        **{f"videowall/{v}": ref("Videowall")
           for v in ("delays", "empty-rides", "sla", "validations", "vkm")},
    }  # fmt: skip
    paths: dict[str, Any] = {
        f"/v2/metrics/{name}": {
            "get": operation(
                f"Metrics: {name}", answer("Metrics.", schema), feed=False, extra=not_configured
            )
        }
        for name, schema in metric_schemas.items()
    }
    paths["/v2/metrics/demand/by_line/{line_id}"] = {"get": operation(
        "Demand of one line",
        answer("The line's record, or none.", array("DemandRecord")),
        params=[{"name": "line_id", "in": "path", "required": True,
                 "schema": {"type": "string", "minLength": 1}}],
        feed=False, extra=not_configured,
        bad_request=answer("`[]`: an id the profile refuses; the envelope for a bad parameter.",
                           {"anyOf": [EMPTY_LIST, ref("ServerError")]}),
    )}  # fmt: skip
    for kind, item in LOCATION_ITEMS.items():
        envelope = {
            "type": "object",
            "properties": {"data": array(item), "status": {"const": "success"},
                           "timestamp": {"type": "integer"}},
            "required": ["data", "status", "timestamp"],
        }  # fmt: skip
        paths[f"/v2/locations/{kind}"] = {
            "get": operation(f"Locations: {kind}", answer("The list.", envelope), feed=False)
        }
    paths["/v2/facilities"] = {
        "get": operation(
            "The facility kinds served", answer("Kinds.", ref("AvailableFacilities")), feed=False
        )
    }
    for kind in KINDS:
        paths[f"/v2/facilities/{kind}"] = {"get": operation(
            f"Facilities: {kind}", answer("The list.", array(FACILITY_ITEMS.get(kind, "Station"))),
            feed=False, extra=not_configured,
        )}  # fmt: skip
    paths["/health"] = {
        "get": operation(
            "Each source's state and why the service is degraded",
            answer("Serving (ok or degraded).", ref("TransitHealth")),
            feed=False,
            extra={"503": answer("No feed served yet.", ref("TransitHealth"))},
        )
    }
    paths["/status/feed"] = {
        "get": operation(
            "Validation reports of the served feed and the last attempt",
            answer("Reports.", ref("FeedStatus")),
            feed=False,
        )
    }
    paths["/status/feed/refresh"] = {
        "post": {
            "summary": "Fetch the static feed again now, in every worker",
            "description": "With TRANSIT_REFRESH_TOKEN: `Authorization: Bearer <token>`; without, "
            "only callers on this machine, not through a proxy.",
            "responses": {
                "202": answer("Requested.", ref("RefreshAnswer")),
                "400": error(BAD_PARAMS),
                "401": error("No or a wrong bearer token."),
                "403": error("Not a local caller, and no token is configured."),
            },
        }
    }
    paths["/v2/openapi.json"] = {
        "get": operation("This document", answer("OpenAPI 3.1.", {"type": "object"}), feed=False)
    }
    return paths


def openapi_document(settings: TransitSettings) -> dict[str, Any]:
    """The document served at `/v2/openapi.json`."""
    _, components = msgspec.json.schema_components(STRUCTS, ref_template=_REF)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Transit data API",
            "version": "2",
            "description": (
                "Carris Metropolitana's public API (`/v2`) over any GTFS feed and GTFS-RT. "
                "`GET /v2/` answers the real service's text. Unknown paths answer 404 with "
                "`RouteNotFound`; every 4xx/5xx body is JSON."
            ),
        },
        "servers": [{"url": "/", "description": "The API that serves this document."}],
        "paths": {**_network_paths(settings), **_other_paths()},
        "components": {"schemas": components},
    }
