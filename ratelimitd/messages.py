"""The decision request and response, and the errors of a decision, independent of any
transport.

Transports (gRPC, `/json`) decode into `Request` and encode `Response`; the service never
sees protobuf or JSON. Codes and unit numbers are the RLS v3 enum values (a response's
`overall_code`, not a gRPC status). Each transport maps the errors to its own statuses
(`transport/rls.py` to gRPC ones, `transport/http.py` to HTTP ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

# envoy.service.ratelimit.v3.RateLimitResponse.Code; its UNKNOWN is CODE_UNKNOWN here, a response
# code and not the gRPC status of that name (`transport.grpcstatus.UNKNOWN`).
CODE_UNKNOWN, OK, OVER_LIMIT = 0, 1, 2
CODE_NAMES = ("UNKNOWN", "OK", "OVER_LIMIT")

MAX_UINT32 = 0xFFFFFFFF
# What a decoded Request costs in memory besides its strings' bytes: per descriptor (its
# Descriptor and entries tuple) and per entry (a pair, two str objects). Measured on CPython
# 3.11, rounded up; the codecs' `decoded_size` estimates with them.
DESCRIPTOR_BYTES = 160
ENTRY_BYTES = 176


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


class TooLarge(ValueError):
    """A request past MAX_DESCRIPTORS_PER_REQUEST, MAX_ENTRIES_PER_DESCRIPTOR or
    MAX_DESCRIPTOR_VALUE_LENGTH, refused by its decoder as soon as it is seen, before any
    work (gRPC RESOURCE_EXHAUSTED, `/json` 400): a 4 MiB request of 466,000 descriptors was
    once decoded whole, 320 ms of loop time, only to be refused."""


class Bounds(msgspec.Struct, frozen=True, gc=False):
    """The request bounds a decoder enforces (settings.ReloadOptions carries the same
    three fields and may be passed instead)."""

    max_descriptors: int = 1024
    max_entries: int = 64
    max_value_length: int = 4096


def too_many_descriptors(n: int, limit: int) -> TooLarge:
    """The refusal of a request of `n` descriptors."""
    return TooLarge(f"{n} descriptors in one request (MAX_DESCRIPTORS_PER_REQUEST={limit})")


def too_many_entries(n: int, limit: int) -> TooLarge:
    """The refusal of a descriptor of `n` entries."""
    return TooLarge(f"a descriptor with {n} entries (MAX_ENTRIES_PER_DESCRIPTOR={limit})")


def too_long(field: str, n: int, limit: int) -> TooLarge:
    """The refusal of an entry whose `field` ("key" or "value") is `n` UTF-8 bytes long."""
    return TooLarge(f"a descriptor {field} of {n} bytes (MAX_DESCRIPTOR_VALUE_LENGTH={limit})")


def check_descriptor(bounds: Any, i: int, count: int) -> None:
    """Raise TooLarge when descriptor number `i` (from 0) of `count` is one past `bounds`:
    the pure decoders check in the compiled codec's order, descriptor by descriptor."""
    if i == bounds.max_descriptors:
        raise too_many_descriptors(count, bounds.max_descriptors)


def check_entries(bounds: Any, entries: tuple[tuple[str, str], ...]) -> None:
    """Raise TooLarge for one descriptor's entries past `bounds`, in the compiled codec's
    order: entry by entry, its key and value, the count when one entry too many is reached."""
    most = bounds.max_value_length
    for i, (key, value) in enumerate(entries):
        if i == bounds.max_entries:
            raise too_many_entries(len(entries), bounds.max_entries)
        # chars <= UTF-8 bytes <= 4 x chars: encode only when the length cannot tell.
        if len(key) * 4 > most and (n := len(key.encode())) > most:
            raise too_long("key", n, most)
        if len(value) * 4 > most and (n := len(value.encode())) > most:
            raise too_long("value", n, most)


# Why a request got no decision (`Refusal.kind`, given by `RateLimitService.answer`). What
# each becomes on the wire is each transport's, in one table: `grpcstatus.REFUSED`.
INVALID = 0  # ServiceError: a request the reference refuses
TOO_LARGE = 1  # RequestTooLarge, or a decoder's TooLarge: past the request bounds
OVERLOADED = 2  # Overloaded: MAX_INFLIGHT_DECISIONS decisions wait on the store already
STORE_FAILED = 3  # BackendError, answered as BACKEND_FAILURE_POLICY=error answers it
FAULT = 4  # anything else: a defect, logged


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request answered without a decision: why (`kind`), and the error that said so."""

    kind: int
    error: Exception

    @property
    def message(self) -> str:
        """The error's text, as the reference's UNKNOWN status carries it."""
        return str(self.error) or type(self.error).__name__
