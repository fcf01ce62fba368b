"""Falcon resources of `/v2/metrics/*`: serve the bodies `MetricsService` keeps encoded."""

from __future__ import annotations

import falcon
import falcon.asgi

from ..resources import EMPTY_LIST, refused_id, send_body, send_raw
from ..settings import id_matcher
from .service import MetricsService

# Cache-Control per endpoint, as the real service sends it.
CACHE_BY_AGENCY = "public, max-age=1800"
CACHE_DEMAND = "public, max-age=300"
CACHE_SERVICE = "public, max-age=3600"
CACHE_VIDEOWALL = "public, max-age=60"


class MetricsView:
    """One precomputed view; 404 `[]` while no store is configured or rendered (the real
    service's answer for a missing key, without Cache-Control)."""

    def __init__(self, service: MetricsService, name: str, cache_control: str) -> None:
        self.service = service
        self.name = name
        self.cache_control = cache_control

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = self.service.bodies.get(self.name)
        if body is None:
            send_raw(resp, falcon.HTTP_404, EMPTY_LIST)
            return
        send_body(req, resp, body, self.cache_control)

    on_head = on_get


class LineDemand:
    """`/v2/metrics/demand/by_line/:LINE_ID`: 400 `[]` for an id the profile's pattern
    rejects (the "cm" profile: not 4 digits), `[]` for a line
    with no validations, else the line's record in a one-item list."""

    def __init__(self, service: MetricsService, line_id_pattern: str | None) -> None:
        self.service = service
        self.valid = id_matcher(line_id_pattern)

    async def on_get(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, line_id: str
    ) -> None:
        if refused_id(resp, self.valid, line_id):
            return
        body = self.service.line_body(line_id)
        if body is None:
            send_raw(resp, falcon.HTTP_404, EMPTY_LIST)
            return
        send_body(req, resp, body, CACHE_DEMAND)

    on_head = on_get


def routes(service: MetricsService, line_id_pattern: str | None) -> list[tuple[str, object]]:
    """(path, resource) of every metrics endpoint."""
    out: list[tuple[str, object]] = []
    for name in ("day", "month", "year", "records"):
        out.append(
            (
                f"/v2/metrics/demand/by_agency/{name}",
                MetricsView(service, f"by_agency_{name}", CACHE_BY_AGENCY),
            )
        )
    out += [
        ("/v2/metrics/demand/by_line", MetricsView(service, "by_line", CACHE_DEMAND)),
        ("/v2/metrics/demand/by_line/{line_id}", LineDemand(service, line_id_pattern)),
        ("/v2/metrics/demand/top_lines/by_agency", MetricsView(service, "top_lines", CACHE_DEMAND)),
        ("/v2/metrics/demand/by_stop", MetricsView(service, "by_stop", CACHE_DEMAND)),
        ("/v2/metrics/service/all", MetricsView(service, "service", CACHE_SERVICE)),
        ("/v2/metrics/complaints", MetricsView(service, "complaints", CACHE_DEMAND)),
    ]
    for name in ("delays", "empty-rides", "sla", "validations", "vkm"):
        out.append(
            (
                f"/v2/metrics/videowall/{name}",
                MetricsView(service, f"videowall/{name}", CACHE_VIDEOWALL),
            )
        )
    return out
