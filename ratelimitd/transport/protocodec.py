"""RLS v3 protobuf bytes <-> `ratelimitd.messages`, for the gRPC transports and the client,
and the one definition of the method path they serve and call.

Both gRPC transports register ShouldRateLimit with no serializers and hand the bytes to
`rls.RlsHandler`, which calls `decode_request` / `encode_response`; with the compiled codec
it selects and `request_domain` (the span attribute), this module is where the wire format
is known. The hot pair is the compiled `ratelimitd.transport._wire` codec; the upb-backed generated
classes below are its twin (RATELIMITD_NO_EXTENSIONS=1, a build without extensions, and the
oracle of the property tests) and serve the client-side functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from google.protobuf.struct_pb2 import Struct

from ratelimitd._proto.rls_pb2 import RateLimitRequest, RateLimitResponse
from ratelimitd.messages import (
    DESCRIPTOR_BYTES,
    ENTRY_BYTES,
    Descriptor,
    Request,
    Response,
    Status,
    TooLarge,
    check_descriptor,
    check_entries,
)
from ratelimitd.settings import extensions_disabled

# The RPC every gRPC transport serves and every client calls: RLS v3 ShouldRateLimit.
SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"
METHOD_NAME = "ShouldRateLimit"
METHOD_PATH = f"/{SERVICE_NAME}/{METHOD_NAME}"

__all__ = [
    "METHOD_NAME",
    "METHOD_PATH",
    "SERVICE_NAME",
    "DecodeError",
    "Limit",
    "TooLarge",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "request_domain",
    "response_from_bytes",
]


# grpc-go's decoder errors (google.golang.org/protobuf), which both codecs raise: the
# transports answer INTERNAL `grpc: error unmarshalling request: <one of these>`.
GO_CORRUPT = "proto: cannot parse invalid wire-format data"
GO_INVALID_UTF8 = "string field contains invalid UTF-8"


def decode_request_upb(data: bytes, bounds: Any = None) -> Request:
    """Parse a serialized RateLimitRequest. Raises `DecodeError` on malformed bytes, and
    `TooLarge` past `bounds` (checked on upb's message, before any Python object is made)."""
    try:
        msg = RateLimitRequest.FromString(data)
    except DecodeError as exc:
        # upb says "Error parsing message with type '...': Wire format was corrupt" (or
        # "String field had bad UTF-8"); grpc-go's words are the ones on the wire.
        raise DecodeError(GO_INVALID_UTF8 if "UTF-8" in str(exc) else GO_CORRUPT) from None
    descriptors = []
    for i, d in enumerate(msg.descriptors):
        entries = tuple([(e.key, e.value) for e in d.entries])
        if bounds is not None:
            check_descriptor(bounds, i, len(msg.descriptors))
            check_entries(bounds, entries)
        limit = None
        if d.HasField("limit"):
            override = d.limit
            limit = (override.requests_per_unit, override.unit)
        # A present wrapper holding 0 means "check without consuming"; absence defers to
        # the request-level hits_addend.
        hits = d.hits_addend.value if d.HasField("hits_addend") else None
        descriptors.append(Descriptor(entries, limit, hits, d.is_negative_hits))
    return Request(msg.domain, descriptors, msg.hits_addend)


def encode_response_upb(resp: Response) -> bytes:
    """Serialize a decision as a RateLimitResponse."""
    out = RateLimitResponse()
    out.overall_code = resp.overall_code  # type: ignore[assignment]  # enum fields take ints
    statuses = out.statuses
    for st in resp.statuses:
        status = statuses.add(code=st.code, limit_remaining=st.limit_remaining)
        rule = st.rule
        # current_limit and duration_until_reset exist only when a limit applied (the
        # reference leaves both unset for unknown, unlimited and replaced descriptors).
        if rule is not None:
            current = status.current_limit
            current.requests_per_unit = rule.requests_per_unit
            current.unit = rule.unit
            if rule.name:
                current.name = rule.name
            reset = status.duration_until_reset
            # SetInParent keeps a 0 s duration present, as Go's non-nil Duration is.
            reset.SetInParent()
            reset.seconds = st.duration_until_reset
    if resp.headers:
        headers = out.response_headers_to_add
        for key, value in resp.headers:
            headers.add(key=key, value=value)
    if resp.request_headers:
        headers = out.request_headers_to_add
        for key, value in resp.request_headers:
            headers.add(key=key, value=value)
    if resp.dynamic_metadata is not None:
        out.dynamic_metadata.update(resp.dynamic_metadata)
    return out.SerializeToString()


def _struct_bytes(metadata: dict[str, Any]) -> bytes:
    struct = Struct()
    struct.update(metadata)
    return struct.SerializeToString()


def _compiled_codec() -> Any:
    # Same switch as keys.py / match.py: RATELIMITD_NO_EXTENSIONS=1 forces the twin.
    if extensions_disabled():
        return None
    try:
        from ratelimitd.transport import _wire  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _wire


_wire = _compiled_codec()
if _wire is not None:
    # Parse a serialized RateLimitRequest. Raises `DecodeError` on malformed bytes (the
    # compiled codec's WireError is one, with grpc-go's message), and `TooLarge` past
    # `bounds` (a `messages.Bounds` or the ReloadOptions in force).
    decode_request = _wire.decode_request

    # Serialize a decision as a RateLimitResponse: one call into the compiled codec.
    encode_response: Callable[[Response], bytes] = _wire.Encoder(_struct_bytes)

    decoded_size = _wire.decoded_size
    IMPLEMENTATION = "compiled"
else:
    decode_request = decode_request_upb
    encode_response = encode_response_upb
    IMPLEMENTATION = "pure"

    def decoded_size(data: bytes) -> int:
        """About how many bytes `decode_request(data)` takes once decoded (the compiled
        codec's estimate, from the decoded message itself)."""
        try:
            msg = RateLimitRequest.FromString(data)
        except DecodeError:
            return 0
        size = len(data) + DESCRIPTOR_BYTES * len(msg.descriptors)
        return size + ENTRY_BYTES * sum(len(d.entries) for d in msg.descriptors)


def encode_request(
    domain: str,
    descriptors: Iterable[Sequence[tuple[str, str]] | Descriptor],
    hits_addend: int = 0,
) -> bytes:
    """Serialize a RateLimitRequest; a descriptor is a Descriptor or its (key, value) entries."""
    msg = RateLimitRequest(domain=domain, hits_addend=hits_addend)
    for item in descriptors:
        d = msg.descriptors.add()
        desc = item if isinstance(item, Descriptor) else Descriptor(tuple(item))
        for key, value in desc.entries:
            d.entries.add(key=key, value=value)
        if desc.limit is not None:
            d.limit.SetInParent()
            d.limit.requests_per_unit, d.limit.unit = desc.limit
        if desc.hits_addend is not None:
            d.hits_addend.SetInParent()
            d.hits_addend.value = desc.hits_addend
        if desc.is_negative_hits:
            d.is_negative_hits = True
    return msg.SerializeToString()


def response_from_bytes(data: bytes) -> RateLimitResponse:
    """Parse a serialized RateLimitResponse into the generated message (for text output)."""
    return RateLimitResponse.FromString(data)


class Limit(msgspec.Struct, frozen=True, gc=False):
    """A decoded current_limit: the fields of config.Rule that the wire carries."""

    requests_per_unit: int
    unit: int
    name: str = ""


def decode_response(data: bytes) -> Response:
    """Parse a serialized RateLimitResponse into a `messages.Response`.

    A status's `rule` is a `Limit` when the server sent a current_limit, else None.
    dynamic_metadata becomes a dict (numbers as floats, as google.protobuf.Struct holds
    them) or None when absent.
    """
    msg = RateLimitResponse.FromString(data)
    statuses = []
    for s in msg.statuses:
        rule = None
        if s.HasField("current_limit"):
            c = s.current_limit
            rule = Limit(c.requests_per_unit, c.unit, c.name)
        statuses.append(Status(s.code, rule, s.limit_remaining, s.duration_until_reset.seconds))
    headers = [(h.key, h.value) for h in msg.response_headers_to_add]
    metadata = None
    if msg.HasField("dynamic_metadata"):
        metadata = MessageToDict(msg.dynamic_metadata)
    request_headers = [(h.key, h.value) for h in msg.request_headers_to_add]
    return Response(msg.overall_code, statuses, headers, metadata, request_headers)


def request_domain(request: bytes) -> str:
    """Field 1 (`domain`) of a serialized RateLimitRequest, "" when absent or malformed."""
    if not isinstance(request, bytes | bytearray | memoryview):
        return str(getattr(request, "domain", ""))
    data = bytes(request)
    i, n = 0, len(data)
    try:
        while i < n:
            tag, i = _varint(data, i)
            wire = tag & 7
            if tag >> 3 == 1 and wire == 2:
                length, i = _varint(data, i)
                return data[i : i + length].decode("utf-8", "replace")
            if wire == 0:
                _, i = _varint(data, i)
            elif wire == 1:
                i += 8
            elif wire == 2:
                length, i = _varint(data, i)
                i += length
            elif wire == 5:
                i += 4
            else:
                return ""
    except IndexError:
        return ""
    return ""


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
