"""`create_app(settings)`: the transit API as a Falcon ASGI application."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import falcon
import falcon.asgi

from sidecars.common.lifecycle import Lifecycle

from . import resources as r
from .middleware import ServiceHeaders
from .settings import Settings
from .store import TransitStore


def create_app(
    settings: Settings,
    *,
    middleware: Iterable[object] = (),
    store: TransitStore | None = None,
    clock: Callable[[], float] | None = None,
) -> falcon.asgi.App:
    """Build the app.

    `middleware` is the hook for request policies that are not this sidecar's business, such
    as the usage API's rate limiter: they run after the CORS/preflight layer and before any
    resource. Pass a ready `store` (tests do) to serve data loaded beforehand; otherwise the
    app makes one and starts its refresh threads on ASGI lifespan startup.
    """
    if store is None:
        store = TransitStore(settings, clock=clock)
    # The store's refresh threads start with the ASGI lifespan and stop with it.
    stack: list[Any] = [
        ServiceHeaders(),
        *middleware,
        Lifecycle(startup=store.start, shutdown=store.stop),
    ]
    app = falcon.asgi.App(middleware=stack)
    # `/v2/stops/` is `/v2/stops`, as with the real service's ignoreTrailingSlash.
    app.req_options.strip_url_path_trailing_slash = True

    app.add_route("/v2/gtfs", r.GtfsZip(store))
    app.add_route("/v2/alerts", r.Alerts(store, protobuf=False))
    app.add_route("/v2/alerts.pb", r.Alerts(store, protobuf=True))
    app.add_route("/v2/vehicles", r.Vehicles(store, protobuf=False))
    app.add_route("/v2/vehicles.pb", r.Vehicles(store, protobuf=True))
    app.add_route("/v2/stops", r.StaticList(store, "stops_body"))
    app.add_route("/v2/lines", r.StaticList(store, "lines_body"))
    app.add_route("/v2/routes", r.StaticList(store, "routes_body"))
    app.add_route("/v2/patterns/{item_id}", r.PatternItem(store))
    app.add_route("/v2/shapes/{item_id}", r.ShapeItem(store))
    app.add_route("/v2/arrivals/by_stop/{item_id}", r.ArrivalsByStop(store))
    app.add_route("/v2/arrivals/by_pattern/{item_id}", r.ArrivalsByPattern(store))
    app.add_route("/v2/pips/estimates", r.PipEstimates(store))
    app.add_route("/v2/pips/{item_id}/message", r.PipMessageItem())
    app.add_route("/health", r.Health(store))

    app.add_error_handler(Exception, r.unexpected_error)
    app.add_error_handler(falcon.HTTPError, r.http_error)
    app.add_error_handler(falcon.HTTPRouteNotFound, r.route_not_found)
    app.add_error_handler(falcon.HTTPMethodNotAllowed, r.route_not_found)
    app.add_error_handler(r.EnvelopeError, r.envelope_error)
    return app
