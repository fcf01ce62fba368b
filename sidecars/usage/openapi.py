"""The OpenAPI 3.1 document of the usage API, generated from the msgspec Structs it sends."""

from __future__ import annotations

from typing import Any

import msgspec

from sidecars.common.errors import ApiError

from .schemas import UsageHealth, UsageResponse
from .settings import Settings

_REF = "#/components/schemas/{name}"


def _error(description: str, *headers: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(name="ApiError")}}},
    }
    if headers:
        out["headers"] = {h: {"$ref": f"#/components/headers/{h}"} for h in headers}
    return out


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The document served at /openapi.json."""
    (usage_schema, _error_schema, health_schema), components = msgspec.json.schema_components(
        [UsageResponse, ApiError, UsageHealth], ref_template=_REF
    )
    limit_headers = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")
    refused = {
        "400": _error(
            "`format` has a value other than `json` (`invalid_format`; `supportedValues` lists "
            "the supported values), or an unknown query parameter (`invalid_request`)."
        ),
        "401": _error(
            "No bearer token, or a malformed, unknown or revoked one (the same answer for all "
            "three, so the response does not tell whether an account exists).",
            "WWW-Authenticate",
        ),
        "403": _error(
            "A valid token of an account that may not be served now: `account_suspended`, or "
            "`subscription_not_started` (the subscription starts later)."
        ),
        "429": _error(
            "Over a rate limit (`rate_limited`) or the plan's quota (`quota_exceeded`).",
            "Retry-After",
        ),
        "503": _error("The account store or the rate limiter is unavailable.", "Retry-After"),
    }
    format_param = {
        "name": "format",
        "in": "query",
        "required": False,
        "description": "Response format; `json` (the default) is the only one.",
        "schema": {"type": "string", "enum": ["json"]},
    }
    ok_headers = {h: {"$ref": f"#/components/headers/{h}"} for h in limit_headers}
    usage_ok = {
        "description": "The account's plan and usage in its current window.",
        "headers": ok_headers,
        "content": {"application/json": {"schema": usage_schema}},
    }
    get_usage = {
        "summary": "Plan and quota consumption of the token's account",
        "description": (
            "currentUsage is the sum of the requests counted for the account in its "
            "current window (UTC day buckets); it trails real consumption only by requests in "
            "flight. Windows: billing_cycle is the monthly cycle anchored on the subscription's "
            "start day (clamped to the last day of shorter months); rolling_30_days is the 30 "
            "whole UTC days before today plus today."
        ),
        "operationId": "getUsage",
        "security": [{"bearerAuth": []}],
        "parameters": [format_param],
        "responses": {"200": usage_ok, **refused},
    }
    head_usage = {
        "summary": "The headers GET would answer, without the body",
        "operationId": "headUsage",
        "security": [{"bearerAuth": []}],
        "parameters": [format_param],
        "responses": {
            "200": {"description": "As GET, without a body.", "headers": ok_headers},
            **{code: {"description": r["description"]} for code, r in refused.items()},
        },
    }
    options = {
        "summary": "Allowed methods",
        "operationId": "optionsUsage",
        "responses": {
            "204": {
                "description": "No content; `Allow` lists the methods.",
                "headers": {"Allow": {"schema": {"type": "string"}}},
            }
        },
    }
    integer = {"schema": {"type": "integer", "minimum": 0}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Account usage API",
            "version": "2",
            "description": "Where an account stands against its plan's quota.",
        },
        "paths": {
            settings.usage_path: {"get": get_usage, "head": head_usage, "options": options},
            "/health": {
                "get": {
                    "summary": "Each dependency and the overall status",
                    "operationId": "health",
                    "responses": {
                        "200": {
                            "description": "Serving: ok, or degraded under an allow policy.",
                            "content": {"application/json": {"schema": health_schema}},
                        },
                        "503": {
                            "description": "The database is down, or a dependency whose "
                            "failure mode is deny.",
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
                        }
                    },
                }
            },
        },
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token issued by `python -m sidecars.usage tokens issue`.",
                }
            },
            "headers": {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    **integer,
                },
                "WWW-Authenticate": {
                    "description": 'RFC 6750 challenge, e.g. `Bearer realm="api", '
                    'error="invalid_token"`.',
                    "schema": {"type": "string"},
                },
                "RateLimit-Limit": {
                    "description": "Requests per unit of the tightest limit.",
                    **integer,
                },
                "RateLimit-Remaining": {"description": "Requests left in that unit.", **integer},
                "RateLimit-Reset": {"description": "Seconds until that unit resets.", **integer},
            },
        },
    }
