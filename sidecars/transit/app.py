"""`create_app(settings)`: the transit API as deployed, a Falcon ASGI application.

One app serves every part of the API: the network (static GTFS) and realtime endpoints from
the feed store, `/v2/metrics/*` from the metrics service, `/v2/locations/*` and
`/v2/facilities*` from the places. `Services` holds those three for one worker and runs
their background threads with the ASGI lifespan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import falcon
import falcon.asgi

from sidecars.common.lifecycle import Lifecycle

from . import resources as r
from . import status
from .metrics import resources as metrics_resources
from .metrics.service import MetricsService
from .middleware import KnownParams, ServiceHeaders
from .openapi import openapi_document
from .places import resources as places_resources
from .places.locations import Locations
from .places.service import Places
from .settings import TransitSettings
from .store import TransitStore


class Services:
    """What one worker serves: the feed store (network and realtime), metrics and places."""

    def __init__(
        self,
        settings: TransitSettings,
        *,
        store: TransitStore | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """Build them from the settings; pass a ready `store` to serve a feed loaded already."""
        self.settings = settings
        places = settings.places
        # The location lists serve /v2/locations/* and give the stops their location ids.
        locations_dir = Path(places.locations_dir) if places.locations_dir else None
        self.locations = Locations(locations_dir)
        if store is None:
            resolver = self.locations if locations_dir is not None else None
            store = TransitStore(settings, clock=clock, locations=resolver)
        self.store = store
        # Arrivals and metrics count the same operational day, in the same zone.
        feed = self.store.settings.feed
        fixed_tz = ZoneInfo(feed.timezone) if feed.timezone else None

        def timezone() -> ZoneInfo | None:
            if fixed_tz is not None:
                return fixed_tz
            net = self.store.network
            return net.tz if net is not None else None

        self.metrics = MetricsService(
            settings.metrics,
            start_hour=feed.operational_day_start_hour,
            timezone=timezone,
            clock=self.store.now,
            agencies=lambda: self.store.network.agency_ids if self.store.network else [],
        )
        self.places = Places(
            self.locations,
            Path(places.facilities_dir) if places.facilities_dir else None,
            places.walk_meters,
            places.place_match_meters,
            network=lambda: self.store.network,
        )

    def start(self) -> None:
        """Start the refresh threads: feed and realtime, then metrics."""
        self.store.start()
        self.metrics.start()

    def stop(self) -> None:
        """Stop them in the reverse order."""
        self.metrics.stop()
        self.store.stop()


def create_app(
    settings: TransitSettings,
    *,
    services: Services | None = None,
    middleware: Iterable[object] = (),
) -> falcon.asgi.App:
    """Build the whole app, as `sidecars.transit.asgi` serves it.

    With `settings.rate_limit` set, the usage API's rate limiter runs before any resource.
    `middleware` adds other request policies at the same place: after the CORS/preflight
    layer, before any resource. Pass ready `services` (tests do) to serve data loaded
    beforehand; otherwise the app builds them and starts their threads on lifespan startup.
    """
    if services is None:
        services = Services(settings)
    policies = list(middleware)
    if settings.rate_limit is not None:
        # Imported only when it is on: it brings the usage API's Redis and gRPC clients.
        from sidecars.usage.app import rate_limiter

        policies += rate_limiter(settings.rate_limit)
    stack: list[Any] = [
        ServiceHeaders(),
        *policies,
        KnownParams(),
        Lifecycle(startup=services.start, shutdown=services.stop),
    ]
    app = falcon.asgi.App(middleware=stack)
    # `/v2/stops/` is `/v2/stops`, as with the real service's ignoreTrailingSlash.
    app.req_options.strip_url_path_trailing_slash = True

    store = services.store
    app.add_route("/v2", r.Root())
    app.add_route("/v2/gtfs", r.GtfsZip(store))
    for name, cache in (("alerts", r.CACHE_REALTIME), ("vehicles", r.CACHE_VEHICLES)):
        app.add_route(f"/v2/{name}", r.RealtimeFeed(store, name, cache, protobuf=False))
        app.add_route(f"/v2/{name}.pb", r.RealtimeFeed(store, name, cache, protobuf=True))
    app.add_route("/v2/vehicles/{item_id}", r.VehicleItem(store))
    app.add_route("/v2/stops", r.Stops(store))
    app.add_route("/v2/lines", r.StaticList(store, "lines_body"))
    app.add_route("/v2/routes", r.StaticList(store, "routes_body"))
    app.add_route("/v2/patterns/{item_id}", r.StaticItem(store, "pattern_body"))
    app.add_route("/v2/shapes/{item_id}", r.StaticItem(store, "shape_body"))
    app.add_route("/v2/arrivals/by_stop/{item_id}", r.ArrivalsByStop(store))
    app.add_route("/v2/arrivals/by_pattern/{item_id}", r.ArrivalsByPattern(store))
    app.add_route("/v2/pips/estimates", r.PipEstimates(store))
    app.add_route("/v2/pips/{item_id}/message", r.PipMessageItem())
    for kind in ("dates", "periods", "plans"):
        app.add_route(f"/v2/{kind}", status.PlanList(store, kind))
    app.add_route("/v2/status/time", status.TimeNow(store))
    app.add_route("/v2/status/message", status.Message(store))
    app.add_route("/health", r.Health(store))
    app.add_route("/status/feed", r.FeedStatusResource(store))
    app.add_route("/status/feed/refresh", status.FeedRefresh(store))
    app.add_route("/v2/openapi.json", r.Document(openapi_document(settings)))
    metrics_routes = metrics_resources.routes(services.metrics, settings.metrics.line_id_pattern)
    for path, resource in (*metrics_routes, *places_resources.routes(services.places)):
        app.add_route(path, resource)

    app.add_error_handler(Exception, r.unexpected_error)
    app.add_error_handler(falcon.HTTPError, r.http_error)
    app.add_error_handler(falcon.HTTPRouteNotFound, r.route_not_found)
    app.add_error_handler(falcon.HTTPMethodNotAllowed, r.route_not_found)
    app.add_error_handler(r.EnvelopeError, r.envelope_error)
    return app
