"""The proto3 JSON mapping of RateLimitRequest / RateLimitResponse, as the reference's protojson.

In: lowerCamelCase and proto field names both accepted (one of each pair, as protojson: a
field given under both spellings is a duplicate), integers as JSON numbers or decimal
strings, enums by name or number, `null` meaning "not set", unknown fields rejected.
Anything malformed raises `ValueError` (msgspec's errors are ValueErrors too).

Out: lowerCamelCase, enum names, zero values omitted, durations as `"58s"`, fields in
proto declaration order, `dynamicMetadata` (a Struct) as a plain object with sorted keys.

Deviation: a field repeated under the *same* spelling is taken last-wins (msgspec's
behaviour), where protojson rejects it.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from ..config.ruleset import UNIT_BY_NAME, UNIT_NAMES
from ..messages import Descriptor, Request, Response, check_descriptor, check_entries

__all__ = ["decode_request", "encode_response"]

_MAX_UINT32 = 0xFFFFFFFF
_MAX_UINT64 = 0xFFFFFFFFFFFFFFFF
_MIN_INT32, _MAX_INT32 = -(2**31), 2**31 - 1

# A proto3 JSON integer: a number (`1`, `1.0`, `1e2`) or the same inside a string.
_Int = int | float | str | None
# An enum: its name or its number.
_Enum = int | float | str | None


class _Entry(Struct, forbid_unknown_fields=True, gc=False):
    key: str | None = None
    value: str | None = None


class _Override(Struct, forbid_unknown_fields=True, gc=False):
    requestsPerUnit: _Int | UnsetType = UNSET
    requests_per_unit: _Int | UnsetType = UNSET
    unit: _Enum = None


class _Descriptor(Struct, forbid_unknown_fields=True, gc=False):
    entries: list[_Entry] | None = None
    limit: _Override | None = None
    # google.protobuf.UInt64Value: a uint64, or null for "not set".
    hitsAddend: _Int | UnsetType = UNSET
    hits_addend: _Int | UnsetType = UNSET
    # A bool (Envoy API v1.38); null means "not set" (false).
    isNegativeHits: bool | UnsetType | None = UNSET
    is_negative_hits: bool | UnsetType | None = UNSET


class _Request(Struct, forbid_unknown_fields=True, gc=False):
    domain: str | None = None
    descriptors: list[_Descriptor] | None = None
    hitsAddend: _Int | UnsetType = UNSET
    hits_addend: _Int | UnsetType = UNSET


# Output, in proto declaration order; omit_defaults gives protojson's "zero values omitted".
# Only a message field (currentLimit, durationUntilReset) is written when set but zero.


class _LimitOut(Struct, omit_defaults=True, gc=False):
    name: str = ""
    requestsPerUnit: int = 0
    unit: str | int | None = None


class _StatusOut(Struct, omit_defaults=True, gc=False):
    code: str | int | None = None
    currentLimit: _LimitOut | None = None
    limitRemaining: int = 0
    durationUntilReset: str | None = None


class _HeaderOut(Struct, omit_defaults=True, gc=False):
    key: str = ""
    value: str = ""


class _ResponseOut(Struct, omit_defaults=True):
    overallCode: str | int | None = None
    statuses: list[_StatusOut] = []
    responseHeadersToAdd: list[_HeaderOut] = []
    requestHeadersToAdd: list[_HeaderOut] = []
    dynamicMetadata: dict[str, Any] | None = None


_decoder = msgspec.json.Decoder(_Request)
# "deterministic" sorts dict keys (protojson writes a Struct's keys sorted) and keeps the
# Structs' field order.
_encoder = msgspec.json.Encoder(order="deterministic")

# The body of a JSON number, as protojson accepts it inside a string.
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _either(camel: Any, snake: Any, name: str) -> Any:
    """The value of a field that may arrive under either spelling (UNSET when absent)."""
    if snake is UNSET:
        return camel
    if camel is not UNSET:
        raise ValueError(f"duplicate field {name}")
    return snake


def _integer(value: int | float | str, lo: int, hi: int, name: str) -> int:
    """A proto3 JSON integer in [lo, hi]: integral numbers, or such a number as a string."""
    if type(value) is int:
        n = value
    elif type(value) is float:
        if not value.is_integer():
            raise ValueError(f"invalid value for {name}: {value!r}")
        n = int(value)
    else:
        text = str(value)
        if not _NUMBER.fullmatch(text):
            raise ValueError(f"invalid value for {name}: {text!r}")
        try:
            exact = Decimal(text)
        except InvalidOperation as exc:  # pragma: no cover - the pattern already vetted it
            raise ValueError(f"invalid value for {name}: {text!r}") from exc
        if exact.is_zero():
            n = 0
        elif exact.adjusted() > 20:  # far beyond uint64; never build a huge int
            raise ValueError(f"value out of range for {name}: {text!r}")
        elif exact != exact.to_integral_value():
            raise ValueError(f"invalid value for {name}: {text!r}")
        else:
            n = int(exact)
    if not lo <= n <= hi:
        raise ValueError(f"value out of range for {name}: {n}")
    return n


def _unit(value: int | float | str) -> int:
    """A RateLimitUnit by name, or by (any int32) number as proto3 open enums allow."""
    if type(value) is str:
        number = UNIT_BY_NAME.get(value)
        if number is None:
            raise ValueError(f"invalid value for enum unit: {value!r}")
        return number
    return _integer(value, _MIN_INT32, _MAX_INT32, "unit")


def _descriptor(d: _Descriptor) -> Descriptor:
    entries = d.entries
    pairs = tuple((e.key or "", e.value or "") for e in entries) if entries is not None else ()
    limit = None
    override = d.limit
    if override is not None:
        rpu = _either(override.requestsPerUnit, override.requests_per_unit, "requests_per_unit")
        number = 0
        if rpu is not UNSET and rpu is not None:
            number = _integer(rpu, 0, _MAX_UINT32, "requests_per_unit")
        unit = 0 if override.unit is None else _unit(override.unit)
        limit = (number, unit)
    hits = None
    raw = _either(d.hitsAddend, d.hits_addend, "hits_addend")
    if raw is not UNSET and raw is not None:
        hits = _integer(raw, 0, _MAX_UINT64, "hits_addend")
    negative = _either(d.isNegativeHits, d.is_negative_hits, "is_negative_hits")
    return Descriptor(pairs, limit, hits, negative is True)


def decode_request(body: bytes, bounds: Any = None) -> Request:
    """A RateLimitRequest from its proto3 JSON; ValueError when malformed, its subclass
    `messages.TooLarge` past `bounds` (checked before a descriptor is built)."""
    r = _decoder.decode(body)

    hits = 0
    if r.hitsAddend is not UNSET or r.hits_addend is not UNSET:
        raw = _either(r.hitsAddend, r.hits_addend, "hits_addend")
        if raw is not None:
            hits = _integer(raw, 0, _MAX_UINT32, "hits_addend")
    out = []
    if r.descriptors:
        count = len(r.descriptors)
        for i, d in enumerate(r.descriptors):
            if bounds is not None:
                check_descriptor(bounds, i, count)
            # Inline the common shape (entries only): this is the `/json` hot path.
            if (
                d.limit is None
                and d.hitsAddend is UNSET
                and d.hits_addend is UNSET
                and d.isNegativeHits is UNSET
                and d.is_negative_hits is UNSET
            ):
                entries = d.entries
                pairs = tuple([(e.key or "", e.value or "") for e in entries]) if entries else ()
                if bounds is not None:
                    check_entries(bounds, pairs)
                out.append(Descriptor(pairs))
            else:
                desc = _descriptor(d)
                if bounds is not None:
                    check_entries(bounds, desc.entries)
                out.append(desc)
    return Request(r.domain or "", out, hits)


# Enum numbers to protojson names; zero (the default) maps to None so it is omitted, and
# numbers without a name stay numbers.
_CODES: dict[int, str | None] = {0: None, 1: "OK", 2: "OVER_LIMIT"}
_UNITS: dict[int, str | None] = {n: (name if n else None) for n, name in UNIT_NAMES.items()}


def encode_response(resp: Response) -> bytes:
    """The protojson form of a RateLimitResponse."""
    codes = _CODES
    statuses = []
    for st in resp.statuses:
        rule = st.rule
        code = st.code
        if rule is None:
            statuses.append(
                _StatusOut(
                    codes.get(code, code),
                    None,
                    st.limit_remaining,
                    f"{st.duration_until_reset}s" if st.duration_until_reset else None,
                )
            )
        else:
            unit = rule.unit
            statuses.append(
                _StatusOut(
                    codes.get(code, code),
                    _LimitOut(rule.name, rule.requests_per_unit, _UNITS.get(unit, unit)),
                    st.limit_remaining,
                    f"{st.duration_until_reset}s",
                )
            )
    code = resp.overall_code
    out = _ResponseOut(codes.get(code, code), statuses)
    if resp.headers:
        out.responseHeadersToAdd = [_HeaderOut(k, v) for k, v in resp.headers]
    if resp.request_headers:
        out.requestHeadersToAdd = [_HeaderOut(k, v) for k, v in resp.request_headers]
    if resp.dynamic_metadata is not None:
        out.dynamicMetadata = resp.dynamic_metadata
    return _encoder.encode(out)
