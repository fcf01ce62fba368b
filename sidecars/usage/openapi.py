"""The OpenAPI 3.1 document of the usage API, generated from the msgspec Structs it sends.

Every error response is a reusable `components.responses` entry with the ApiError body and
exactly the headers that answer carries (required when always sent, optional when only
sometimes: RateLimit-* exist only when ratelimitd decided the request).
"""

from __future__ import annotations

from typing import Any

import msgspec

from sidecars.common.errors import ApiError

from .schemas import UsageHealth, UsageResponse
from .settings import Settings

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


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The document served at /openapi.json."""
    (usage_schema, _error_schema, health_schema), components = msgspec.json.schema_components(
        [UsageResponse, ApiError, UsageHealth], ref_template=_REF
    )
    responses = {
        "BadRequest": _error(
            "`format` has a value other than `json` (`invalid_format`; `supportedValues` lists "
            "the supported values), an unknown query parameter, or a trusted proxy's malformed "
            "X-Forwarded-For (`invalid_request`). RateLimit-* when ratelimitd decided first.",
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
    ok_headers = _headers(optional=LIMIT_HEADERS)
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
        "parameters": [format_param],
        "responses": {"200": usage_ok, **errors},
    }
    head_usage = {
        "summary": "The headers GET would answer, without the body",
        "operationId": "headUsage",
        "security": [{"bearerAuth": []}],
        "parameters": [format_param],
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
    options = {
        "summary": "Allowed methods",
        "operationId": "optionsUsage",
        "responses": {
            "204": {
                "description": "No content; `Allow` lists the methods.",
                "headers": {"Allow": {"$ref": "#/components/headers/Allow-required"}},
            },
            "431": _ref("HeadersTooLarge"),
        },
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
            settings.usage_path: {"get": get_usage, "head": head_usage, "options": options},
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
            },
        },
    }
