"""The OpenAPI 3.1 document of the usage API, generated from the msgspec Structs it sends.

Every error response is a reusable `components.responses` entry with the ApiError body and
exactly the headers that answer carries (required when always sent, optional when only
sometimes: RateLimit-* exist only when ratelimitd decided the request). The threshold
webhook the API sends is described under `webhooks` (OpenAPI 3.1), with its signature.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sidecars.common.errors import ApiError

from .meter_api import EVENT_TYPES
from .metering import MAX_BATCH, MAX_WINDOWS, CancelRequest, CloudEvent
from .resources import MAX_HISTORY_DAYS
from .schemas import (
    Cancelled,
    Ingested,
    MeterList,
    MeterQueryResult,
    ThresholdEvent,
    UsageHealth,
    UsageHistory,
    UsageResponse,
)
from .settings import Settings
from .webhooks import SIGNATURE_HEADER

_REF = "#/components/schemas/{name}"
LIMIT_HEADERS = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")


def _headers(required: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"Cache-Control": {"$ref": "#/components/headers/Cache-Control"}}
    for name in required:
        out[name] = {"$ref": f"#/components/headers/{name}-required"}
    for name in optional:
        out[name] = {"$ref": f"#/components/headers/{name}"}
    return out


def _error(
    description: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    return _json_answer(
        description, {"$ref": _REF.format(name="ApiError")}, _headers(required, optional)
    )


def _json_answer(description: str, schema: Any, headers: dict[str, Any]) -> dict[str, Any]:
    """A response with a JSON body of `schema`."""
    return {
        "description": description,
        "headers": headers,
        "content": {"application/json": {"schema": schema}},
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/responses/{name}"}


def _header(description: str, schema: dict[str, Any], required: bool = False) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": schema}


def _head(
    get: dict[str, Any],
    name: str,
    ok_headers: dict[str, Any],
    errors: dict[str, dict[str, str]],
    responses: dict[str, Any],
) -> dict[str, Any]:
    """HEAD of a GET operation: its status and headers, no bodies."""
    return {
        "summary": "The headers GET would answer, without the body",
        "operationId": "head" + name,
        "security": get["security"],
        "parameters": get["parameters"],
        "responses": {
            "200": {"description": "As GET, without a body.", "headers": ok_headers},
            **{
                code: {
                    "description": responses[ref["$ref"].rsplit("/", 1)[1]]["description"],
                    "headers": responses[ref["$ref"].rsplit("/", 1)[1]]["headers"],
                }
                for code, ref in errors.items()
            },
        },
    }


def _errors_of(get: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The error responses (references) of a GET operation."""
    return {code: ref for code, ref in get["responses"].items() if code != "200"}


def _options(name: str) -> dict[str, Any]:
    return {
        "summary": "Allowed methods",
        "operationId": "options" + name,
        "responses": {
            "204": {
                "description": "No content; `Allow` lists the methods.",
                "headers": {"Allow": {"$ref": "#/components/headers/Allow-required"}},
            },
            "431": _ref("HeadersTooLarge"),
        },
    }


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The document served at /openapi.json."""
    schemas, components = msgspec.json.schema_components(
        [
            UsageResponse, ApiError, UsageHealth, UsageHistory, ThresholdEvent, MeterList,
            MeterQueryResult, Ingested, Cancelled, CloudEvent, CancelRequest,
        ],
        ref_template=_REF,
    )  # fmt: skip
    usage_schema, _, health_schema, history_schema, event_schema, *meter_schemas = schemas
    list_schema, query_schema, ingested_schema, cancelled_schema, ce_schema, cancel_schema = (
        meter_schemas
    )
    responses = {
        "BadRequest": _error(
            "`format` has a value other than `json` (`invalid_format`; `supportedValues` lists "
            "the supported values), an unknown query parameter, a bad date range, a malformed "
            "Idempotency-Key, or a trusted proxy's malformed X-Forwarded-For "
            "(`invalid_request`). RateLimit-* when ratelimitd decided first.",
            optional=LIMIT_HEADERS,
        ),
        "UnprocessableContent": _error(
            "The Idempotency-Key was used before with a different request "
            "(`idempotency_key_reused`): a key names one request, its retries repeat it.",
            optional=LIMIT_HEADERS,
        ),
        "Conflict": _error(
            "A retry of an Idempotency-Key whose first answer is not there to give back: the "
            "first request is still being answered (`idempotency_request_in_progress`, with "
            "Retry-After), or its answer was too large to keep "
            "(`idempotency_answer_not_kept`). Not counted.",
            optional=(*LIMIT_HEADERS, "Retry-After"),
        ),
        "ContentTooLarge": _error(
            "A request with an Idempotency-Key and a body over 1 MiB (`payload_too_large`).",
            optional=LIMIT_HEADERS,
        ),
        "Unauthorized": _error(
            "No bearer token (`unauthorized`), or a malformed, unknown, revoked or expired one "
            "(`invalid_token`: the same answer for all, so it does not tell whether an account "
            "exists). RateLimit-* when ratelimitd decided the anonymous call first.",
            required=("WWW-Authenticate",),
            optional=LIMIT_HEADERS,
        ),
        "Forbidden": _error(
            "A valid token of an account that may not be served now: `account_suspended`, or "
            "`subscription_not_started` (the subscription starts later; RateLimit-* when "
            "ratelimitd decided first).",
            optional=LIMIT_HEADERS,
        ),
        "NotFound": _error("No resource at this path (`not_found`).", optional=LIMIT_HEADERS),
        "MethodNotAllowed": _error(
            "The method is not served here (`method_not_allowed`); `Allow` lists those that are.",
            required=("Allow",),
            optional=LIMIT_HEADERS,
        ),
        "TooManyRequests": _error(
            "Over a ratelimitd rate (`rate_limited`, with RateLimit-* of the limit hit), over "
            "the plan's quota (`quota_exceeded`; Retry-After: when the window has room again) "
            "or too many invalid tokens from this address (`too_many_invalid_tokens`).",
            required=("Retry-After",),
            optional=LIMIT_HEADERS,
        ),
        "HeadersTooLarge": _error(
            "Over the header caps: too many fields, too many bytes, or one field too large "
            "(`request_header_fields_too_large`)."
        ),
        "ServiceUnavailable": _error(
            "The account database or the usage counters are unavailable "
            "(`store_unavailable`), or ratelimitd under failure mode deny "
            "(`rate_limiter_unavailable`).",
            required=("Retry-After",),
            optional=LIMIT_HEADERS,
        ),
    }
    errors = {
        "400": _ref("BadRequest"),
        "401": _ref("Unauthorized"),
        "403": _ref("Forbidden"),
        "409": _ref("Conflict"),
        "413": _ref("ContentTooLarge"),
        "422": _ref("UnprocessableContent"),
        "429": _ref("TooManyRequests"),
        "431": _ref("HeadersTooLarge"),
        "503": _ref("ServiceUnavailable"),
    }
    format_param = {
        "name": "format",
        "in": "query",
        "required": False,
        "description": "Response format; `json` (the default) is the only one.",
        "schema": {"type": "string", "enum": ["json"]},
    }
    idempotency_param = {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "description": "Names this request: a retry with the same key (same account, method, "
        "path, query and body) within the key window is not counted again and gets the first "
        "answer back (409 while there is none to give); the same key with another request is "
        "422. 1-255 printable ASCII characters (HTTP drops leading and trailing spaces).",
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": 255,
            "pattern": "^[!-~]([ -~]*[!-~])?$",
        },
    }
    ok_headers = _headers(optional=(*LIMIT_HEADERS, "Idempotent-Replayed"))
    usage_ok = _json_answer(
        "The account's plan and usage in its current window.", usage_schema, ok_headers
    )
    get_usage = {
        "summary": "Plan and quota consumption of the token's account",
        "description": (
            "currentUsage is the sum of the requests counted for the account in its current "
            "window (UTC day buckets); it trails real consumption only by requests in flight. "
            "Windows: billing_cycle is the monthly cycle anchored on the subscription's start "
            "day (clamped to the last day of shorter months); rolling_30_days is the 30 whole "
            "UTC days before today plus today."
        ),
        "operationId": "getUsage",
        "security": [{"bearerAuth": []}],
        "parameters": [format_param, idempotency_param],
        "responses": {"200": usage_ok, **errors},
    }
    day = {"type": "string", "format": "date"}
    history_params = [
        {
            "name": "from",
            "in": "query",
            "required": False,
            "description": "First UTC day (YYYY-MM-DD, inclusive); default: 29 days before `to`.",
            "schema": day,
            "example": "2026-01-01",
        },
        {
            "name": "to",
            "in": "query",
            "required": False,
            "description": "Last UTC day (YYYY-MM-DD, inclusive); default: today.",
            "schema": day,
            "example": "2026-01-31",
        },
        format_param,
        idempotency_param,
    ]
    get_history = {
        "summary": "Daily usage of the token's account",
        "description": (
            "One point per UTC day of [from, to] that the system of record holds: the day's "
            "usage with the plan and quota the account had that day. Days are rolled up from "
            "the counters every USAGE_ROLLUP_INTERVAL_SECONDS (today's point trails the "
            f"current figure by at most that) and kept USAGE_RETENTION_DAYS. At most "
            f"{MAX_HISTORY_DAYS} days per call; `from` after `to` or a longer range is 400."
        ),
        "operationId": "getUsageHistory",
        "security": [{"bearerAuth": []}],
        "parameters": history_params,
        "responses": {
            "200": _json_answer(
                "The account's daily usage in the range.", history_schema, ok_headers
            ),
            **errors,
        },
    }
    get_meters = {
        "summary": "The meters of the token's account",
        "description": "`requests` (the counted requests, the plan's quota) and the meters "
        "declared in the meters file, with the account's plan's limit of each.",
        "operationId": "listMeters",
        "security": [{"bearerAuth": []}],
        "parameters": [format_param, idempotency_param],
        "responses": {
            "200": _json_answer("The meters.", list_schema, ok_headers),
            **errors,
        },
    }
    instant = {
        "oneOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]
    }
    meter_params = [
        {
            "name": "slug",
            "in": "path",
            "required": True,
            "description": "The meter (see listMeters); unknown: 404.",
            "schema": {"type": "string", "pattern": "^[a-z0-9_]{1,64}$"},
        },
        {
            "name": "from",
            "in": "query",
            "required": False,
            "description": "Range start, inclusive: a date (00:00Z) or a date-time with an "
            "offset; default: 30 days before `to`.",
            "schema": instant,
        },
        {
            "name": "to",
            "in": "query",
            "required": False,
            "description": "Range end, exclusive; default: the end of today (UTC).",
            "schema": instant,
        },
        {
            "name": "windowSize",
            "in": "query",
            "required": False,
            "description": "hour or day windows, aligned to UTC (at most "
            f"{MAX_WINDOWS['hour']} hours or {MAX_WINDOWS['day']} days per call); omitted: "
            "one total over the range. `requests` has day windows only.",
            "schema": {"type": "string", "enum": ["hour", "day"]},
        },
        {
            "name": "groupBy",
            "in": "query",
            "required": False,
            "description": "Dimensions of the meter to group by (comma-separated or repeated).",
            "schema": {"type": "string"},
        },
        format_param,
        idempotency_param,
    ]
    get_meter = {
        "summary": "One meter of the token's account over a range",
        "description": "The meter's aggregation per window and group, only where there is "
        "usage. Event meters aggregate the account's metered events that are not cancelled; "
        "`requests` the rolled-up days (trailing the live figure by one rollup interval).",
        "operationId": "queryMeter",
        "security": [{"bearerAuth": []}],
        "parameters": meter_params,
        "responses": {
            "200": _json_answer("The meter's rows.", query_schema, ok_headers),
            **errors,
            "404": _ref("NotFound"),
        },
    }
    path_item = {
        settings.usage_path: (get_usage, "Usage"),
        settings.history_path: (get_history, "UsageHistory"),
        settings.meters_path: (get_meters, "Meters"),
        settings.meters_path + "/{slug}": (get_meter, "Meter"),
    }
    paths: dict[str, Any] = {
        path: {
            "get": get,
            "head": _head(get, name, ok_headers, _errors_of(get), responses),
            "options": _options(name),
        }
        for path, (get, name) in path_item.items()
    }
    if settings.ingest_token:
        paths.update(operator_paths(settings, ingested_schema, cancelled_schema, ce_schema,
                                    cancel_schema))  # fmt: skip
    integer = {"type": "integer", "minimum": 0}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Account usage API",
            "version": "2",
            "description": (
                "Where an account stands against its plan's quota. Any other path answers 404 "
                "(`components.responses.NotFound`), any other method 405 with `Allow` "
                "(`MethodNotAllowed`); both are ApiError bodies like every error here."
            ),
        },
        "servers": [
            {
                "url": "/",
                "description": "The API that serves this document (its own scheme, host, "
                "port); the usage endpoint's path carries USAGE_BASE_PATH.",
            }
        ],
        "paths": {
            **paths,
            "/health": {
                "get": {
                    "summary": "Each dependency and the overall status",
                    "operationId": "health",
                    "responses": {
                        "200": _json_answer(
                            "Serving: ok, or degraded under an allow policy.",
                            health_schema,
                            _headers(),
                        ),
                        "431": _ref("HeadersTooLarge"),
                        "503": _json_answer(
                            "The database is down, or a dependency whose failure mode is deny.",
                            health_schema,
                            _headers(required=("Retry-After",)),
                        ),
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "operationId": "openapi",
                    "responses": {
                        "200": {
                            "description": "The OpenAPI document.",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        "431": _ref("HeadersTooLarge"),
                    },
                }
            },
        },
        "webhooks": {
            "usageThresholdCrossed": {
                "post": {
                    "summary": "An account's usage reached a threshold of its quota",
                    "description": (
                        "Sent to USAGE_WEBHOOK_URL once per account, threshold and window. "
                        f"`{SIGNATURE_HEADER}: t=<unix time>,v1=<hex HMAC-SHA256 of "
                        '"<t>.<body>" with USAGE_WEBHOOK_SECRET>`: verify it and reject '
                        "old timestamps. Answer 2xx; anything else is retried with "
                        "exponential backoff for up to a day. Deduplicate by `id`."
                    ),
                    "operationId": "usageThresholdCrossed",
                    "parameters": [
                        {
                            "name": SIGNATURE_HEADER,
                            "in": "header",
                            "required": True,
                            "schema": {"type": "string", "pattern": "^t=[0-9]+,v1=[0-9a-f]{64}"},
                        },
                        {
                            "name": "Usage-Event-Id",
                            "in": "header",
                            "required": True,
                            "schema": {"type": "string"},
                        },
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": event_schema}},
                    },
                    "responses": {"2XX": {"description": "Received; not sent again."}},
                }
            }
        },
        "components": {
            "schemas": components,
            "responses": responses,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token issued by `python -m sidecars.usage tokens issue`.",
                },
                "ingestAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The operator's USAGE_INGEST_TOKEN (not an account's).",
                },
            },
            "headers": {
                "Cache-Control": _header(
                    "`no-store` on every answer but the OpenAPI document.",
                    {"type": "string", "enum": ["no-store"]},
                ),
                "Retry-After-required": _header(
                    "Seconds to wait before retrying.", {**integer, "minimum": 1}, True
                ),
                "WWW-Authenticate-required": _header(
                    'RFC 6750 challenge, e.g. `Bearer realm="api", error="invalid_token"`.',
                    {"type": "string", "pattern": "^Bearer realm="},
                    True,
                ),
                "Allow-required": _header(
                    "The methods served at this path.", {"type": "string"}, True
                ),
                "RateLimit-Limit": _header(
                    "Requests per unit of the tightest ratelimitd limit (only when ratelimitd "
                    "decided the request).",
                    integer,
                ),
                "RateLimit-Remaining": _header("Requests left in that unit.", integer),
                "RateLimit-Reset": _header("Seconds until that unit resets.", integer),
                "Idempotent-Replayed": _header(
                    "`true`: the request's Idempotency-Key was seen before: the first "
                    "answer, not counted again.",
                    {"type": "string", "enum": ["true"]},
                ),
            },
        },
    }


def operator_paths(
    settings: Settings,
    ingested: dict[str, Any],
    cancelled: dict[str, Any],
    cloud_event: dict[str, Any],
    cancel: dict[str, Any],
) -> dict[str, Any]:
    """The operator's ingestion and cancellation (served when USAGE_INGEST_TOKEN is set)."""
    events = {"oneOf": [cloud_event, {"type": "array", "items": cloud_event, "minItems": 1,
                                      "maxItems": MAX_BATCH}]}  # fmt: skip
    common = {
        "401": _error("Not the ingestion token (`unauthorized`).", required=("WWW-Authenticate",)),
        "415": _error("Not a JSON media type (`unsupported_media_type`)."),
        "503": _error("The database is unavailable (`store_unavailable`).", ("Retry-After",)),
    }
    return {
        settings.events_path: {
            "post": {
                "summary": "Ingest metered events (CloudEvents 1.0, one or a batch)",
                "description": "All or none. De-duplicated by `source` + `id`; `subject` is "
                "the account's id; `time` defaults to receipt, at most "
                "USAGE_EVENT_MAX_AGE_DAYS back and 5 minutes ahead; `data` is a JSON object "
                f"the event type's meters can aggregate. At most {MAX_BATCH} events.",
                "operationId": "ingestEvents",
                "security": [{"ingestAuth": []}],
                "requestBody": {
                    "required": True,
                    "content": {media: {"schema": events} for media in EVENT_TYPES},
                },
                "responses": {
                    "200": _json_answer("Stored (or stored before).", ingested, _headers()),
                    "400": _error(
                        "An event that cannot be stored, named by its index: `invalid_event`, "
                        "`event_too_old`, `event_in_future`, `unknown_subject`."
                    ),
                    "413": _error("A body over 4 MiB (`payload_too_large`)."),
                    **common,
                },
            }
        },
        settings.cancel_path: {
            "post": {
                "summary": "Cancel a metered event within 24 hours of receipt",
                "description": "The event leaves every meter; the thresholds of its meters are "
                "recomputed (a crossing that still holds is not notified again). Cancelling "
                "again answers the same.",
                "operationId": "cancelEvent",
                "security": [{"ingestAuth": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": cancel}},
                },
                "responses": {
                    "200": _json_answer("Cancelled.", cancelled, _headers()),
                    "400": _error("Not `{source, id}` (`invalid_event`)."),
                    "404": _error("No such event (`event_not_found`)."),
                    "409": _error("Received more than 24 hours ago (`cancel_window_passed`)."),
                    **common,
                },
            }
        },
    }
