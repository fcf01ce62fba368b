"""The decision request and response, and the errors of a decision, independent of any
transport.

Transports (gRPC, `/json`) decode into `Request` and encode `Response`; the service never
sees protobuf or JSON. Codes and unit numbers are the RLS v3 enum values (a response's
`overall_code`, not a gRPC status). Each transport maps the errors to its own statuses
(`transport/rls.py` to gRPC ones, `transport/http.py` to HTTP ones).
"""

from __future__ import annotations

from typing import Any

import msgspec

# envoy.service.ratelimit.v3.RateLimitResponse.Code (UNKNOWN: a response code, not the
# gRPC status of that name)
UNKNOWN, OK, OVER_LIMIT = 0, 1, 2
CODE_NAMES = ("UNKNOWN", "OK", "OVER_LIMIT")

MAX_UINT32 = 0xFFFFFFFF


class ServiceError(Exception):
    """A request the service refuses, as the reference refuses it (gRPC UNKNOWN, `/json` 400)."""


class RequestTooLarge(ServiceError):
    """More descriptors or entries than MAX_DESCRIPTORS_PER_REQUEST / MAX_ENTRIES_PER_DESCRIPTOR
    allow, refused before any work (gRPC RESOURCE_EXHAUSTED, `/json` 400)."""


class Overloaded(ServiceError):
    """MAX_INFLIGHT_DECISIONS decisions already wait on the store: refused at once rather
    than queued without bound (gRPC RESOURCE_EXHAUSTED, `/json` 503)."""


class Descriptor(msgspec.Struct, gc=False):
    """One request descriptor: ordered (key, value) entries, optional override and hits."""

    entries: tuple[tuple[str, str], ...]
    # RateLimitOverride as (requests_per_unit, unit), or None.
    limit: tuple[int, int] | None = None
    # The per-descriptor hits_addend when set (0 means check without consuming).
    hits_addend: int | None = None
    # is_negative_hits (Envoy API v1.38): the hits are refunded, not consumed.
    is_negative_hits: bool = False


class Request(msgspec.Struct, gc=False):
    """A RateLimitRequest."""

    domain: str
    descriptors: list[Descriptor]
    hits_addend: int = 0


class Status(msgspec.Struct, gc=False):
    """One DescriptorStatus. `rule` supplies current_limit when set: a config.Rule in the
    service, a protocodec.Limit in a decoded response (the client's)."""

    code: int
    rule: Any = None
    limit_remaining: int = 0
    duration_until_reset: int = 0


class Response(msgspec.Struct, gc=False):
    """A RateLimitResponse."""

    overall_code: int
    statuses: list[Status]
    headers: list[tuple[str, str]] = []  # response_headers_to_add
    dynamic_metadata: dict[str, Any] | None = None
    # request_headers_to_add (LIMIT_REQUEST_HEADERS_ENABLED): added to the upstream request.
    request_headers: list[tuple[str, str]] = []
