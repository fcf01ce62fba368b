"""Falcon resources of the metering: the operator's ingestion and cancellation (Bearer
USAGE_INGEST_TOKEN), and the account's meters (Bearer account token, as the usage endpoint).

    POST {base}/api/v2/usage/events            one CloudEvent or a batch  -> Ingested
    POST {base}/api/v2/usage/events/cancel     {"source", "id"}           -> Cancelled
    GET  {base}/api/v2/user/usage/meters                                  -> MeterList
    GET  {base}/api/v2/user/usage/meters/{slug}?from&to&windowSize&groupBy -> MeterQuery
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta

import falcon
import falcon.asgi
import msgspec

from sidecars.common.errors import ApiError, answer

from .metering import MAX_BODY, MAX_WINDOWS, Metering, MeteringError
from .meters import WINDOW_SIZES, Meter
from .resources import AccountResource, BadRequest, respond, store_unavailable
from .schemas import MeterInfo, MeterList, MeterQueryResult, MeterRow
from .store import Account, StoreUnavailable, UsageStore
from .windows import DEFAULT_RANGE_DAYS, utc_date

# What the ingestion reads: CloudEvents' structured mode (one event) and batched mode (an
# array), and plain JSON of either shape.
EVENT_TYPES = (
    "application/cloudevents+json",
    "application/cloudevents-batch+json",
    "application/json",
)


class Operator:
    """A POST of the operator (not an account): its token, the JSON body, the answer."""

    def __init__(self, metering: Metering, retry_after: int) -> None:
        self.metering = metering
        self.retry_after = retry_after

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """Check the token and the media type, run `handle` on the body."""
        try:
            self.metering.operator(req.get_header("Authorization"))
            media = (req.content_type or "").split(";")[0].strip().lower()
            if media not in EVENT_TYPES:
                raise MeteringError(
                    415,
                    "unsupported_media_type",
                    f"Content-Type must be one of {', '.join(EVENT_TYPES)}.",
                )
            if (req.content_length or 0) > MAX_BODY:
                raise MeteringError(413, "payload_too_large", f"At most {MAX_BODY} bytes.")
            body = await req.stream.read(MAX_BODY + 1)
            result = await self.handle(body, media)
        except MeteringError as err:
            answer(resp, ApiError(err.status, err.error, err.message))
            if err.status == 401:
                resp.set_header("WWW-Authenticate", 'Bearer realm="ingest"')
            return
        except StoreUnavailable as exc:
            store_unavailable(resp, exc, self.retry_after)
            return
        respond(resp, result)

    async def handle(self, body: bytes, media: str) -> msgspec.Struct:
        """The answer to a checked request."""
        raise NotImplementedError


class Events(Operator):
    """`POST {base}/api/v2/usage/events`: store CloudEvents (see metering.Metering)."""

    async def handle(self, body: bytes, media: str) -> msgspec.Struct:
        """Ingest one event or a batch; a batch media type needs an array."""
        if media == "application/cloudevents-batch+json" and not body.lstrip().startswith(b"["):
            raise MeteringError(400, "invalid_event", "A batch is a JSON array of CloudEvents.")
        return await self.metering.ingest(body)


class EventCancel(Operator):
    """`POST {base}/api/v2/usage/events/cancel`: cancel one event within 24 hours."""

    async def handle(self, body: bytes, media: str) -> msgspec.Struct:
        """Cancel the event the body names."""
        return await self.metering.cancel(body)


def meter_info(meter: Meter, account: Account) -> MeterInfo:
    """What an account sees of a meter."""
    return MeterInfo(
        slug=meter.slug,
        description=meter.description,
        eventType=meter.event_type or None,
        aggregation=meter.aggregation,
        groupBy=[name for name, _ in meter.group_by],
        windowSizes=list(meter.window_sizes()),
        limit=meter.limit(account.plan),
    )


class Meters(AccountResource):
    """`GET|HEAD|OPTIONS {base}/api/v2/user/usage/meters`: the declared meters."""

    def __init__(self, store: UsageStore, metering: Metering, realm: str, retry_after: int):
        super().__init__(store, realm, retry_after)
        self.metering = metering

    async def answer(self, req: falcon.asgi.Request, account: Account) -> msgspec.Struct:
        """Every meter, the built-in `requests` first."""
        return MeterList([meter_info(m, account) for m in self.metering.meters.values()])


def instant(req: falcon.asgi.Request, name: str) -> datetime | None:
    """A query parameter as an instant: a `YYYY-MM-DD` date (00:00Z) or an RFC 3339 date-time
    with an offset."""
    values = req.get_param_as_list(name)
    if values is None:
        return None
    text = values[0] if len(values) == 1 else ""
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC)
        value = datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise BadRequest(
            f"{name!r} must be one date (YYYY-MM-DD) or date-time with an offset "
            "(2026-02-01T10:00:00Z)."
        )
    return value


class MeterQuery(Meters):
    """`GET|HEAD|OPTIONS {base}/api/v2/user/usage/meters/{slug}`: one meter of the token's
    account over a range, in hour or day windows (or one total), by dimensions."""

    parameters = frozenset({"format", "from", "to", "windowSize", "groupBy"})

    async def on_get(  # type: ignore[override]
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, slug: str
    ) -> None:
        """The query of meter `slug` (404 for an unknown one)."""
        req.context.meter = slug
        await super().on_get(req, resp)

    async def on_head(  # type: ignore[override]
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, slug: str
    ) -> None:
        """GET's status and headers."""
        await self.on_get(req, resp, slug)

    async def on_options(  # type: ignore[override]
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, slug: str
    ) -> None:
        """No content; the allowed methods."""
        await super().on_options(req, resp)

    def check_query(self, req: falcon.asgi.Request) -> None:
        """Also the meter, the range, the window size and the dimensions."""
        super().check_query(req)
        self.request(req)

    def request(
        self, req: falcon.asgi.Request
    ) -> tuple[Meter, datetime, datetime, str | None, tuple[str, ...]]:
        """(meter, from, to, windowSize, groupBy) of the query, checked."""
        slug = req.context.meter
        meter = self.metering.meters.get(slug)
        if meter is None:
            raise falcon.HTTPNotFound()
        size = req.get_param("windowSize")
        if size is not None and size not in meter.window_sizes():
            raise BadRequest(
                f"windowSize {size!r}: meter {slug!r} has {', '.join(meter.window_sizes())}."
            )
        # Default: through the end of today (UTC), so everything counted so far is in.
        last = instant(req, "to") or datetime.combine(
            utc_date(self.store.clock()) + timedelta(days=1), datetime.min.time(), UTC
        )
        first = instant(req, "from") or last - timedelta(days=DEFAULT_RANGE_DAYS)
        if first >= last:
            raise BadRequest(f"'from' ({first.isoformat()}) must be before 'to'.")
        span = WINDOW_SIZES[size or "day"]
        aligned = first.timestamp() // span * span
        windows = math.ceil((last.timestamp() - aligned) / span)
        if windows > MAX_WINDOWS[size]:
            raise BadRequest(
                f"The range has {windows} {size or 'day'} windows; at most {MAX_WINDOWS[size]}."
            )
        names = tuple(n for v in req.get_param_as_list("groupBy") or () for n in v.split(",") if n)
        known = [name for name, _ in meter.group_by]
        unknown = [n for n in names if n not in known]
        if unknown or len(set(names)) != len(names):
            raise BadRequest(
                f"groupBy {','.join(names)!r}: meter {slug!r} has the dimensions "
                f"{', '.join(known) or 'none'} (each at most once)."
            )
        return meter, first, last, size, names

    async def answer(self, req: falcon.asgi.Request, account: Account) -> msgspec.Struct:
        """The meter's rows."""
        meter, first, last, size, names = self.request(req)
        start_ms, end_ms = int(first.timestamp() * 1000), int(last.timestamp() * 1000)
        rows: list[MeterRow] = await self.metering.query(
            account, meter, start_ms, end_ms, size, names
        )
        return MeterQueryResult(meter.slug, first, last, size, list(names), rows)  # type: ignore[arg-type]  # checked against the meter
