"""msgspec Structs of the usage API's bodies (camelCase, like the endpoint's documented fields).

The OpenAPI document (openapi.py) is generated from these; the error body is the one both
sidecars share (`sidecars.common.errors.ApiError`).
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Literal

import msgspec
from msgspec import Struct

PlanName = Literal["free", "startup", "pro"]
UsageWindowKind = Literal["billing_cycle", "rolling_30_days"]
_Count = Annotated[int, msgspec.Meta(ge=0)]


class SubscriptionPeriod(Struct):
    """The account's subscription term as UTC calendar dates; `end` is exclusive, null = open."""

    start: Annotated[
        _dt.date, msgspec.Meta(description="First UTC day of the subscription (ISO 8601 date).")
    ]
    end: Annotated[
        _dt.date | None,
        msgspec.Meta(
            description="UTC day the subscription ends (exclusive: it ends at 00:00Z of that "
            "day); null while it renews with no end date."
        ),
    ]


class UsagePeriod(Struct):
    """The instants the current counting window covers, half-open [start, end), in UTC."""

    start: Annotated[_dt.datetime, msgspec.Meta(description="Window start, 00:00Z of a UTC day.")]
    end: Annotated[
        _dt.datetime,
        msgspec.Meta(
            description="When this window ends: the next billing cycle's start, or for "
            "rolling_30_days the next 00:00Z, when the window slides by one day."
        ),
    ]


class UsageResponse(Struct):
    """Body of `GET /api/v2/user/usage`."""

    planName: Annotated[PlanName, msgspec.Meta(description="The account's current plan.")]
    planLimit: Annotated[_Count, msgspec.Meta(description="Requests the plan allows per window.")]
    currentUsage: Annotated[
        _Count, msgspec.Meta(description="Requests counted in the current window.")
    ]
    remainingUsage: Annotated[_Count, msgspec.Meta(description="max(planLimit - currentUsage, 0).")]
    usageWindow: Annotated[
        UsageWindowKind,
        msgspec.Meta(
            description="billing_cycle: the monthly cycle anchored on the subscription start "
            "day; rolling_30_days: the 30 whole UTC days before today plus today."
        ),
    ]
    subscriptionPeriod: SubscriptionPeriod
    usagePeriod: UsagePeriod


Component = Literal["ok", "unavailable"]


class UsageHealth(Struct):
    """Body of the usage sidecar's `/health`: the overall status and each dependency."""

    status: Annotated[
        Literal["ok", "degraded", "unavailable"],
        msgspec.Meta(
            description="ok: everything answers (200). degraded (200): serving under a failure "
            "mode `allow` (ratelimitd or Redis down, or usage hits still buffered). "
            "unavailable (503): the database is down, or a dependency whose failure mode is "
            "`deny` is."
        ),
    ]
    database: Component
    counters: Annotated[Component, msgspec.Meta(description="The Redis of the usage counters.")]
    rateLimiter: Literal["ok", "unavailable", "disabled"]
    bufferedHits: Annotated[
        int, msgspec.Meta(ge=0, description="Usage hits this worker holds until Redis is back.")
    ]


class DailyPoint(Struct):
    """One UTC day of an account's usage, with the plan it had that day."""

    date: Annotated[_dt.date, msgspec.Meta(description="The UTC calendar day (ISO 8601).")]
    usage: Annotated[_Count, msgspec.Meta(description="Requests counted that day.")]
    planName: Annotated[PlanName, msgspec.Meta(description="The account's plan that day.")]
    planLimit: Annotated[
        _Count, msgspec.Meta(description="The plan's quota per window, as it was that day.")
    ]


class UsageHistory(Struct):
    """Body of `GET /api/v2/user/usage/history`."""

    from_: Annotated[
        _dt.date, msgspec.Meta(description="First day asked for (UTC, inclusive).")
    ] = msgspec.field(name="from")
    to: Annotated[_dt.date, msgspec.Meta(description="Last day asked for (UTC, inclusive).")]
    points: Annotated[
        list[DailyPoint],
        msgspec.Meta(
            description="One point per day of the range that the system of record holds, "
            "oldest first: days before the account existed, beyond retention, or not yet "
            "rolled up from the counters have none."
        ),
    ]


class EventWindow(Struct):
    """The counting window a threshold was crossed in, half-open [start, end), UTC."""

    kind: UsageWindowKind
    start: _dt.datetime
    end: _dt.datetime


class ThresholdEvent(Struct):
    """Body of a threshold webhook: an account's usage reached `threshold` percent of its
    plan's quota in `window`. One event per account, threshold and window."""

    id: Annotated[
        str, msgspec.Meta(description="Unique event id (`evt_...`); the same on resends.")
    ]
    type: Literal["usage.threshold.crossed"]
    created: Annotated[_dt.datetime, msgspec.Meta(description="When the crossing was seen.")]
    account: str
    plan: PlanName
    threshold: Annotated[int, msgspec.Meta(ge=1, le=100, description="Percent of the quota.")]
    usage: Annotated[_Count, msgspec.Meta(description="Usage in the window at the crossing.")]
    limit: Annotated[_Count, msgspec.Meta(description="The plan's quota per window.")]
    window: EventWindow
    meter: Annotated[
        str,
        msgspec.Meta(
            description="The meter crossed: `requests` (the plan's request quota) or an "
            "event meter with limits (`usage` and `limit` are then that meter's)."
        ),
    ] = "requests"


class Ingested(Struct):
    """Body of an ingestion: events stored by this request, events stored before (by
    `source` + `id`: a replay counts once)."""

    accepted: Annotated[_Count, msgspec.Meta(description="Events stored now.")]
    duplicates: Annotated[_Count, msgspec.Meta(description="Events already stored.")]


class Cancelled(Struct):
    """Body of a cancellation: the event, its account, when it was cancelled."""

    source: str
    id: str
    subject: Annotated[str, msgspec.Meta(description="The event's account.")]
    cancelled: _dt.datetime


class MeterInfo(Struct):
    """A declared meter, as the account sees it."""

    slug: str
    description: str
    eventType: Annotated[
        str | None,
        msgspec.Meta(description="The CloudEvents type aggregated; null for `requests`."),
    ]
    aggregation: Literal["sum", "count", "max", "unique_count"]
    groupBy: Annotated[list[str], msgspec.Meta(description="Dimensions a query may group by.")]
    windowSizes: list[Literal["hour", "day"]]
    limit: Annotated[
        int | None,
        msgspec.Meta(
            description="The account's plan's quota of this meter per usage window (threshold "
            "webhooks); null: none."
        ),
    ]


class MeterList(Struct):
    """Body of `GET /api/v2/user/usage/meters`."""

    meters: list[MeterInfo]


class MeterRow(Struct):
    """One window (and group) of a meter query with events in it."""

    windowStart: _dt.datetime
    windowEnd: _dt.datetime
    value: Annotated[float, msgspec.Meta(description="The aggregation over the window.")]
    groupBy: Annotated[
        dict[str, str | int | float | None],
        msgspec.Meta(description="The group's dimension values (null: absent)."),
    ] = {}


class MeterQueryResult(Struct):
    """Body of `GET /api/v2/user/usage/meters/{slug}`."""

    meter: str
    from_: Annotated[_dt.datetime, msgspec.Meta(description="Range start, inclusive.")] = (
        msgspec.field(name="from")
    )
    to: Annotated[_dt.datetime, msgspec.Meta(description="Range end, exclusive.")]
    windowSize: Annotated[
        Literal["hour", "day"] | None,
        msgspec.Meta(
            description="Windows aligned to UTC hours or days; null: one window, the range."
        ),
    ]
    groupBy: list[str]
    data: Annotated[
        list[MeterRow],
        msgspec.Meta(description="Windows and groups with usage, oldest first, then by group."),
    ]
