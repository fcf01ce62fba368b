"""Falcon resources of the transit API: thin adapters from HTTP to the store's data."""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Callable, Collection
from datetime import UTC, date, datetime
from email.utils import formatdate

import falcon
import falcon.asgi
import msgspec

from .arrivals import (
    PIP_SPECIAL,
    Scheduled,
    added_rows,
    build_arrivals,
    in_operational_day,
    pip_estimates,
    schedule_now,
    scheduled_rows,
    with_added,
)
from .bodies import Body, accepts_gzip
from .network import Network
from .realtime import VEHICLE_FILTERS, Realtime
from .schemas import (
    PipMessage,
    RouteNotFound,
    ServerError,
    json_encoder,
    pip_request_decoder,
    sorted_encoder,
)
from .settings import id_matcher
from .store import TransitStore
from .times import days_around, operational_day, parse_service_day

JSON = "application/json; charset=utf-8"
PROTOBUF = "application/octet-stream"
ZIP = "application/zip"
EMPTY_LIST = b"[]"
EMPTY_OBJECT = b"{}"

# Cache-Control per endpoint, as the real service sends it.
CACHE_STATIC = "public, max-age=3600"
CACHE_VEHICLES = "public, max-age=5"
CACHE_REALTIME = "public, max-age=20"
CACHE_NO_CACHE = "public, no-cache"
CACHE_ERROR = "public, max-age=5"


def send_body(
    req: falcon.asgi.Request,
    resp: falcon.asgi.Response,
    body: Body,
    cache_control: str,
    content_type: str = JSON,
    compress: bool = True,
    modified: float | None = None,
) -> None:
    """Send pre-encoded bytes: gzip when accepted, ETag, and 304 on a matching If-None-Match;
    with `modified` (Unix time of the data), Last-Modified and 304 when If-Modified-Since is
    not older (only without If-None-Match, which takes precedence as RFC 9110 says)."""
    gz = body.gzipped() if compress and accepts_gzip(req.get_header("Accept-Encoding")) else None
    etag = body.etag if gz is None else body.gzip_etag
    resp.content_type = content_type
    resp.cache_control = [cache_control]
    resp.set_header("ETag", etag)
    if compress:
        resp.vary = ["Accept-Encoding"]
    last = None
    if modified is not None:
        last, text = _http_date(int(modified))
        resp.set_header("Last-Modified", text)
    match = req.get_header("If-None-Match")
    if match:
        if match.strip() == "*" or body.etag in match or body.gzip_etag in match:
            resp.status = falcon.HTTP_304
            return
    elif last is not None:
        since = _if_modified_since(req)
        if since is not None and last <= since:
            resp.status = falcon.HTTP_304
            return
    if gz is not None:
        resp.set_header("Content-Encoding", "gzip")
        resp.data = gz
    else:
        resp.data = body.data


@functools.lru_cache(maxsize=64)
def _http_date(seconds: int) -> tuple[datetime, str]:
    """A Unix time (HTTP dates have whole seconds) as a datetime and its header text, made
    once: the feed's and the realtime messages' times repeat on every request."""
    return datetime.fromtimestamp(seconds, UTC), formatdate(seconds, usegmt=True)


def _if_modified_since(req: falcon.asgi.Request) -> datetime | None:
    """The If-Modified-Since date, or None when absent or not an HTTP date (ignored then)."""
    try:
        return req.if_modified_since
    except falcon.HTTPBadRequest:
        return None


def send_raw(
    resp: falcon.asgi.Response, status: str | int, data: bytes, cache_control: str | None = None
) -> None:
    """Send a small literal JSON body (the real service's `[]` and `{}` answers)."""
    resp.status = status
    resp.content_type = JSON
    if cache_control:
        resp.cache_control = [cache_control]
    resp.data = data


def refused_id(resp: falcon.asgi.Response, valid: Callable[[str], bool], item_id: str) -> bool:
    """Answer 400 `[]`, as the real service does, to an id the profile's pattern rejects
    (`valid`, an `id_matcher`); whether it did."""
    if valid(item_id):
        return False
    send_raw(resp, falcon.HTTP_400, EMPTY_LIST)
    return True


def server_error(message: str, status: str = falcon.HTTP_500) -> falcon.HTTPError:
    """An HTTPError carrying the real service's error envelope."""
    body = json_encoder.encode(
        ServerError(message=f'Server Error: "{message}"', timestamp=int(time.time() * 1000))
    )
    return EnvelopeError(status, body)


class EnvelopeError(falcon.HTTPError):
    """An error whose body is already encoded in the service envelope."""

    def __init__(self, status: str, body: bytes) -> None:
        super().__init__(status)
        self.body = body


DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


def number_param(req: falcon.asgi.Request, name: str, lo: float, hi: float) -> float | None:
    """A numeric query parameter within [lo, hi], or None when absent; 400 otherwise."""
    text = text_param(req, name)
    if text is None:
        return None
    # Plain decimals only: float() would also take `1_000`, full-width digits, `1e3`, `inf`.
    value = float(text) if DECIMAL.fullmatch(text) else float("nan")
    if not lo <= value <= hi:  # also false for NaN
        raise falcon.HTTPBadRequest(
            description=f"{name}={text!r}: a decimal number from {lo:g} to {hi:g} is expected"
        )
    return value


def text_param(req: falcon.asgi.Request, name: str) -> str | None:
    """A query parameter given once (a repeated one is 400: which would win is not said)."""
    values = req.get_param_as_list(name)
    if values is not None and len(values) > 1:
        raise falcon.HTTPBadRequest(description=f"{name} is given {len(values)} times")
    return values[0] if values else None


class _Base:
    """Resources that read the store; static data needs a loaded feed. `params` are the query
    parameters a resource reads (any other is answered 400, see middleware.KnownParams)."""

    params: tuple[str, ...] = ()

    def __init__(self, store: TransitStore) -> None:
        self.store = store

    def network(self) -> Network:
        net = self.store.network
        if net is None:
            raise server_error("the static GTFS feed is not loaded yet", falcon.HTTP_503)
        return net


class StaticList(_Base):
    """`/v2/stops`, `/v2/lines`, `/v2/routes`: one list encoded per feed version, the
    feed's `name` attribute (`body`, which other lists of the served feed override)."""

    def __init__(self, store: TransitStore, name: str) -> None:
        super().__init__(store)
        self.name = name

    def body(self, net: Network) -> Body:
        """The encoded list of the feed `net`."""
        body: Body = getattr(net, self.name)
        return body

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        net = self.network()
        send_body(req, resp, self.body(net), CACHE_STATIC, modified=net.loaded_at)

    on_head = on_get


class Stops(StaticList):
    """`/v2/stops`, or with `lat`, `lon` and `radius` (metres) the stops within that distance,
    nearest first."""

    params = ("lat", "lon", "radius")

    def __init__(self, store: TransitStore) -> None:
        super().__init__(store, "stops_body")
        self.max_radius = store.settings.limits.max_radius_meters

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        lat = number_param(req, "lat", -90, 90)
        lon = number_param(req, "lon", -180, 180)
        radius = number_param(req, "radius", 0, self.max_radius)
        given = [v is not None for v in (lat, lon, radius)]
        if not any(given):
            await super().on_get(req, resp)
            return
        if not all(given):
            raise falcon.HTTPBadRequest(description="lat, lon and radius go together")
        assert lat is not None and lon is not None and radius is not None
        net = self.network()
        body = Body(net.stops_near(lat, lon, radius))
        send_body(req, resp, body, CACHE_STATIC, modified=net.loaded_at)

    on_head = on_get


class StaticItem(_Base):
    """`/v2/patterns/:id`, `/v2/shapes/:id`: one item's encoded body (`Network.<method>`,
    e.g. `pattern_body`); 404 `{}` when unknown."""

    def __init__(self, store: TransitStore, method: str) -> None:
        super().__init__(store)
        self.method = method

    async def on_get(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, item_id: str
    ) -> None:
        net = self.network()
        body = getattr(net, self.method)(item_id)
        if body is None:
            send_raw(resp, falcon.HTTP_404, EMPTY_OBJECT)
            return
        send_body(req, resp, body, CACHE_STATIC, modified=net.loaded_at)

    on_head = on_get


class GtfsZip(_Base):
    """`/v2/gtfs`: the zip of the feed being served."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        net = self.network()
        send_body(req, resp, net.gtfs_body(), CACHE_STATIC, ZIP, False, net.loaded_at)
        resp.downloadable_as = self.store.settings.feed.filename

    on_head = on_get


class RealtimeFeed(_Base):
    """`/v2/vehicles` and `/v2/alerts` (JSON) or their `.pb` twins (GTFS-RT): the bodies of
    the current realtime snapshot, encoded when it was built."""

    def __init__(self, store: TransitStore, name: str, cache_control: str, protobuf: bool) -> None:
        super().__init__(store)
        self.name = name
        self.attribute = f"{name}_pb" if protobuf else f"{name}_body"
        self.cache_control = cache_control
        self.protobuf = protobuf
        if not protobuf:
            self.params = FILTERS[name]

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        rt = self.store.current_realtime()
        modified = rt.modified.get(self.name)
        if self.protobuf:
            body = getattr(rt, self.attribute)
            send_body(req, resp, body, self.cache_control, PROTOBUF, False, modified)
            return
        wanted = {name: text_param(req, name) for name in self.params}
        if not any(v is not None for v in wanted.values()):
            send_body(req, resp, getattr(rt, self.attribute), self.cache_control, modified=modified)
            return
        if self.name == "vehicles":
            body = rt.vehicles_body_where(wanted)
        else:
            alerts = rt.alerts_for(wanted["route_id"], wanted["line_id"], wanted["stop_id"])
            body = Body(json_encoder.encode(alerts))
        send_body(req, resp, body, self.cache_control, modified=modified)

    on_head = on_get


# The filters of the realtime lists (`?line_id=` ...): equal to the vehicle's field; for alerts
# about that route, line or stop (Realtime.alerts_for).
FILTERS = {"vehicles": VEHICLE_FILTERS, "alerts": ("line_id", "route_id", "stop_id")}


class VehicleItem(_Base):
    """`/v2/vehicles/:id`: one vehicle (`41|1160`, as in the list); 404 `{}` when it is not
    current."""

    async def on_get(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, item_id: str
    ) -> None:
        vehicle = self.store.current_realtime().vehicle_index.get(item_id)
        if vehicle is None:
            send_raw(resp, falcon.HTTP_404, EMPTY_OBJECT)
            return
        send_raw(resp, falcon.HTTP_200, json_encoder.encode(vehicle), CACHE_VEHICLES)

    on_head = on_get


def limit_param(req: falcon.asgi.Request) -> int | None:
    """`?limit=N` of the arrival endpoints: the next N arrivals (1..1000)."""
    value = number_param(req, "limit", 1, 1000)
    if value is not None and value != int(value):
        raise falcon.HTTPBadRequest(description="limit must be a whole number")
    return int(value) if value is not None else None


# An arrival endpoint's item: its memo key, its stop_time positions on a service day, and the
# added trips' rows on some service days (the last three arguments of `send_arrivals`).
_Source = tuple[
    tuple,
    Callable[[date], list[int]],
    Callable[[Realtime, Collection[date]], list[Scheduled]],
]


class _Arrivals(_Base):
    """The arrival endpoints: one service day (`?date=`) of a stop's or a pattern's arrivals,
    or by default what the operational day shows (its own trips and the other service days'
    running inside it: tomorrow's before 04:00, yesterday's past 28:00); `?limit=N`: the next
    N from now, from every service day that can still have one."""

    params = ("date", "limit")
    # Ids the profile's pattern rejects are answered 400 `[]` (the stop endpoint's).
    valid_id: Callable[[str], bool] = staticmethod(lambda item_id: True)

    def source(self, net: Network, item_id: str) -> _Source | None:
        """What `send_arrivals` answers for `item_id`: its key, positions and added rows
        (None: no such item, 404 `[]`)."""
        raise NotImplementedError

    async def on_get(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, item_id: str
    ) -> None:
        if refused_id(resp, self.valid_id, item_id):
            return
        net = self.network()
        source = self.source(net, item_id)
        if source is None:
            send_raw(resp, falcon.HTTP_404, EMPTY_LIST)
            return
        self.send_arrivals(req, resp, net, *source)

    on_head = on_get

    def send_arrivals(
        self,
        req: falcon.asgi.Request,
        resp: falcon.asgi.Response,
        net: Network,
        key: tuple,
        positions: Callable[[date], list[int]],
        added: Callable[[Realtime, Collection[date]], list[Scheduled]],
    ) -> None:
        """Answer the arrivals of `key` (("stop", stop) or ("pattern", id)): `positions(day)`
        are its stop_time positions on a service day, `added(rt, days)` the added trips'
        rows on some service days."""
        now = self.store.now()
        limit = limit_param(req)
        rt = self.store.current_realtime()
        text = req.get_param("date")
        if text is not None:
            try:
                day = parse_service_day(text)
            except ValueError:
                send_raw(resp, falcon.HTTP_400, EMPTY_LIST)
                return
            rows = net.day_memo((*key, day), lambda: scheduled_rows(net, positions(day), day))
            extra = added(rt, (day,))
            memo: tuple = (*key, day)
        else:
            start_hour = self.store.settings.feed.operational_day_start_hour
            op_day = operational_day(now, net.tz, start_hour)
            rows = schedule_now(net, key, positions, op_day, start_hour)
            extra = added(rt, days_around(op_day, net.span_days))
            if limit is None:
                rows = in_operational_day(net, rows, op_day, start_hour, key)
                extra = in_operational_day(net, extra, op_day, start_hour)
            memo = (*key, "now", op_day)
        rows = with_added(rows, extra)
        body = _arrivals_body(net, rt, rows, now, memo, key[0] == "pattern", limit)
        send_body(req, resp, body, CACHE_REALTIME)


class ArrivalsByStop(_Arrivals):
    """`/v2/arrivals/by_stop/:id`: the stop's arrivals; 400 `[]` for an id the profile's
    stop id pattern rejects."""

    def __init__(self, store: TransitStore) -> None:
        super().__init__(store)
        self.valid_id = id_matcher(store.settings.feed.stop_id_pattern)

    def source(self, net: Network, item_id: str) -> _Source | None:
        stop = net.stop_index.get(item_id)
        if stop is None:
            return None
        return (
            ("stop", stop),
            lambda day: net.stop_arrivals(stop, day),
            lambda rt, days: added_rows(net, rt, days, stop),
        )


class ArrivalsByPattern(_Arrivals):
    """`/v2/arrivals/by_pattern/:id`: every stop of the pattern's trips."""

    def source(self, net: Network, item_id: str) -> _Source | None:
        if item_id not in net.pattern_trips:
            return None
        return (
            ("pattern", item_id),
            lambda day: net.pattern_arrivals(item_id, day) or [],
            lambda rt, days: added_rows(net, rt, days, pattern_id=item_id),
        )


def _arrivals_body(
    net: Network,
    rt: Realtime,
    rows: list[Scheduled],
    now: float,
    memo: tuple,
    with_stop: bool,
    limit: int | None,
) -> Body:
    """Encoded arrivals; without realtime trip data (and a limit, which depends on now) the
    bytes only depend on the rows, so they are encoded (and gzipped) once per `memo` (stop or
    pattern, day) and feed version."""
    if rt.has_trips or limit is not None:
        arrivals = build_arrivals(net, rt, rows, now, with_stop, limit)
        return Body(sorted_encoder.encode(arrivals))
    return net.day_memo(
        (*memo, "body"),
        lambda: Body(sorted_encoder.encode(build_arrivals(net, rt, rows, now, with_stop))),
    )


class PipEstimates(_Base):
    """`POST /v2/pips/estimates`: panel rows for a list of stops.

    Bounded: a body over `max_body_bytes` is 413, more than `pip_max_stops` distinct ids 400
    (naming the cap), so one request's work is at most that many stops' schedules.
    """

    def __init__(self, store: TransitStore) -> None:
        super().__init__(store)
        self.valid_id = id_matcher(store.settings.feed.stop_id_pattern)
        self.max_body = store.settings.limits.max_body_bytes
        self.max_stops = store.settings.limits.pip_max_stops

    def _too_large(self) -> falcon.HTTPError:
        return falcon.HTTPContentTooLarge(
            description=f"the body may hold at most {self.max_body} bytes (TRANSIT_MAX_BODY_BYTES)"
        )

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if (req.content_length or 0) > self.max_body:
            raise self._too_large()
        raw = await req.stream.read(self.max_body + 1)
        if len(raw) > self.max_body:
            raise self._too_large()
        try:
            body = pip_request_decoder.decode(raw) if raw else None
        except msgspec.DecodeError as exc:
            # The real service answers a body it cannot parse with its 500 envelope (Fastify's
            # error handler); the client's mistake is a 400 here, in the same envelope.
            raise falcon.HTTPBadRequest(description=f"the body is not JSON: {exc}") from exc
        stops = body.get("stops") if isinstance(body, dict) else None
        if not isinstance(stops, list) or not stops:
            send_raw(resp, falcon.HTTP_400, EMPTY_LIST, CACHE_NO_CACHE)
            return
        given: list = stops
        # Repeated ids are asked once.
        stops = list(dict.fromkeys(s if isinstance(s, str) else repr(s) for s in given))
        if len(stops) > self.max_stops:
            raise falcon.HTTPBadRequest(
                description=f'"stops" holds {len(stops)} distinct ids; at most '
                f"{self.max_stops} are accepted (TRANSIT_PIP_MAX_STOPS)"
            )
        # Special ids are honoured before validation; the first one in the list wins.
        for stop_id in stops:
            special = PIP_SPECIAL.get(stop_id)
            if special is not None:
                send_raw(resp, falcon.HTTP_200, json_encoder.encode(special), CACHE_NO_CACHE)
                return
        if not all(isinstance(s, str) and self.valid_id(s) for s in given):
            send_raw(resp, falcon.HTTP_400, EMPTY_LIST, CACHE_NO_CACHE)
            return
        net = self.network()
        now = self.store.now()
        start_hour = self.store.settings.feed.operational_day_start_hour
        op_day = operational_day(now, net.tz, start_hour)
        rows = pip_estimates(net, self.store.current_realtime(), stops, op_day, now, start_hour)
        send_raw(resp, falcon.HTTP_200, json_encoder.encode(rows), CACHE_NO_CACHE)


class PipMessageItem:
    """`/v2/pips/:pip/message`: the identification text a panel shows."""

    async def on_get(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, item_id: str
    ) -> None:
        send_raw(
            resp,
            falcon.HTTP_200,
            json_encoder.encode(PipMessage(message=f"#{item_id}")),
            CACHE_REALTIME,
        )

    on_head = on_get


class Health(_Base):
    """`/health`: the feed and realtime sources; 503 until a feed is being served.

    Health is per worker (each loads its own feed), so the answer names the worker: a
    readiness check can wait until every worker has said 200.
    """

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        report = self.store.health()
        status = falcon.HTTP_200 if self.store.network is not None else falcon.HTTP_503
        send_raw(resp, status, json_encoder.encode(report), "no-store")
        resp.set_header("Transit-Worker", str(os.getpid()))

    on_head = on_get


class FeedStatusResource(_Base):
    """`/status/feed`: the validation report of the served feed and of the last attempt
    (why a newer version was rejected, with file:line)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        send_raw(resp, falcon.HTTP_200, json_encoder.encode(self.store.feed_status()), "no-store")
        resp.set_header("Transit-Worker", str(os.getpid()))

    on_head = on_get


class Document:
    """`/v2/openapi.json`: the OpenAPI document, encoded once."""

    def __init__(self, document: dict) -> None:
        self.body = Body(json_encoder.encode(document))

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        send_body(req, resp, self.body, CACHE_STATIC)

    on_head = on_get


class Root:
    """`GET /v2/`: the real service's root answer (a plain text in a JSON content type)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        send_raw(resp, falcon.HTTP_200, b"Jusi was here!")

    on_head = on_get


# -- error handlers ----------------------------------------------------------------------------


async def route_not_found(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: Exception, params: dict
) -> None:
    """Unknown path or method: the Fastify 404 body the real service sends."""
    # The real proxy strips /v2 before the app sees the path, so its message has none.
    path = req.path
    if path == "/v2" or path.startswith("/v2/"):
        path = path[3:] or "/"
    body = RouteNotFound(message=f"Route {req.method}:{path} not found")
    send_raw(resp, falcon.HTTP_404, json_encoder.encode(body))


async def envelope_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: EnvelopeError, params: dict
) -> None:
    """Errors raised with the service envelope."""
    send_raw(resp, ex.status, ex.body, CACHE_ERROR)
    if ex.status == falcon.HTTP_503:
        resp.set_header("Retry-After", "5")


async def http_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: falcon.HTTPError, params: dict
) -> None:
    """Any other HTTPError (bad request, payload too large, ...) as the JSON envelope."""
    message = ex.title if not ex.description else f"{ex.title}: {ex.description}"
    body = ServerError(message=message, timestamp=int(time.time() * 1000))
    send_raw(resp, ex.status, json_encoder.encode(body), CACHE_ERROR)
    if ex.headers:
        resp.set_headers(ex.headers)


async def unexpected_error(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, ex: Exception, params: dict
) -> None:
    """Bugs: 500 with the envelope, and the traceback in the log."""
    logging.getLogger("sidecars.transit").exception("error serving %s %s", req.method, req.path)
    body = ServerError(message=f'Server Error: "{ex}"', timestamp=int(time.time() * 1000))
    send_raw(resp, falcon.HTTP_500, json_encoder.encode(body), CACHE_ERROR)
