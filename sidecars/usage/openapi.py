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

from .resources import MAX_HISTORY_DAYS
from .schemas import ThresholdEvent, UsageHealth, UsageHistory, UsageResponse
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
    return {
        "description": description,
        "headers": _headers(required, optional),
        "content": {"application/json": {"schema": {"$ref": _REF.format(name="ApiError")}}},
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
        [UsageResponse, ApiError, UsageHealth, UsageHistory, ThresholdEvent], ref_template=_REF
    )
    usage_schema, _, health_schema, history_schema, event_schema = schemas
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
    usage_ok = {
        "description": "The account's plan and usage in its current window.",
        "headers": ok_headers,
        "content": {"application/json": {"schema": usage_schema}},
    }
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
            "200": {
                "description": "The account's daily usage in the range.",
                "headers": ok_headers,
                "content": {"application/json": {"schema": history_schema}},
            },
            **errors,
        },
    }
    path_item = {
        settings.usage_path: (get_usage, "Usage"),
        settings.history_path: (get_history, "UsageHistory"),
    }
    paths: dict[str, Any] = {
        path: {
            "get": get,
            "head": _head(get, name, ok_headers, errors, responses),
            "options": _options(name),
        }
        for path, (get, name) in path_item.items()
    }
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
                        "200": {
                            "description": "Serving: ok, or degraded under an allow policy.",
                            "headers": _headers(),
                            "content": {"application/json": {"schema": health_schema}},
                        },
                        "431": _ref("HeadersTooLarge"),
                        "503": {
                            "description": "The database is down, or a dependency whose "
                            "failure mode is deny.",
                            "headers": _headers(required=("Retry-After",)),
                            "content": {"application/json": {"schema": health_schema}},
                        },
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
                }
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
