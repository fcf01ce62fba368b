# cython: language_level=3
"""RLS v3 wire codec, compiled: RateLimitRequest bytes -> Request, Response -> bytes.

The gRPC handler is registered with no serializers, so these two functions are all the
protobuf work of a decision. They produce and accept exactly what the upb-backed generated
classes do (`transport/protocodec.py` holds that twin, and property tests compare the two):
fields written in field-number order, zero scalars omitted, sub-messages present where the
reference sets them, unknown fields skipped.

Malformed input is refused as grpc-go's decoder (google.golang.org/protobuf) refuses it,
with its messages, so that the transports' INTERNAL `grpc: error unmarshalling request:
...` reads as the Go service's: field number 0 or above 2^29-1, truncation and unknown
wire types are "cannot parse invalid wire-format data"; a string field that is not UTF-8
is "string field contains invalid UTF-8". upb refuses the same inputs.

With `bounds` (`messages.Bounds`, or the ReloadOptions in force), a request past them raises
`messages.TooLarge` as soon as the offending descriptor, entry or string is reached: past
the descriptor bound, the rest is only counted (field tags and lengths, nothing decoded) so
the refusal names the request's real size, as the service would.

`request_domain` and `checked_descriptors` (cimported by `_rls`) read a request without
decoding it: its domain, when it is a string the decoder made lately, and whether the
decoder would take it, so that a request for a domain the config does not know is answered
without making any object.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from cpython.object cimport PyObject
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_New
from libc.string cimport memcmp, memcpy

from ratelimitd._slots cimport get, offsets

from google.protobuf.message import DecodeError

from ratelimitd.messages import (
    DESCRIPTOR_BYTES,
    ENTRY_BYTES,
    Descriptor,
    Request,
    Response,
    Status,
    too_long,
    too_many_descriptors,
    too_many_entries,
)

# The slots the encoder reads (see _slots.pxd).
cdef object RESPONSE = Response
cdef object STATUS = Status
# A limit's fields, read from their slots: config imports this module's users, so its Rule is
# looked up once a rule is first encoded.
cdef object RULE = None
cdef Py_ssize_t R_RPU = 0, R_UNIT = 0, R_NAME = 0


cdef int _rule_offsets() except -1:
    global RULE, R_RPU, R_UNIT, R_NAME
    from ratelimitd.config.ruleset import Rule

    R_RPU, R_UNIT, R_NAME = offsets(Rule, ("requests_per_unit", "unit", "name"))
    RULE = Rule
    return 0
cdef Py_ssize_t P_OVERALL, P_STATUSES, P_HEADERS, P_REQUEST_HEADERS, P_METADATA
cdef Py_ssize_t T_CODE, T_RULE, T_REMAINING, T_RESET
P_OVERALL, P_STATUSES, P_HEADERS, P_REQUEST_HEADERS, P_METADATA = offsets(
    Response, ("overall_code", "statuses", "headers", "request_headers", "dynamic_metadata")
)
T_CODE, T_RULE, T_REMAINING, T_RESET = offsets(
    Status, ("code", "rule", "limit_remaining", "duration_until_reset")
)


class WireError(DecodeError, ValueError):
    """Malformed protobuf bytes (a protobuf DecodeError, as the upb twin raises)."""


CORRUPT = "proto: cannot parse invalid wire-format data"
INVALID_UTF8 = "string field contains invalid UTF-8"
# protowire.MaxValidNumber; 0 is never a field number.
cdef unsigned long long _MAX_FIELD_NUMBER = (1 << 29) - 1


cdef inline unsigned long long _varint(const unsigned char* buf, Py_ssize_t end, Py_ssize_t* pos) except? 0xFFFFFFFFFFFFFFFF:
    cdef unsigned long long result = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos[0] >= end or shift > 63:
            raise WireError(CORRUPT)
        b = buf[pos[0]]
        pos[0] += 1
        result |= (<unsigned long long>(b & 0x7F)) << shift
        if b < 0x80:
            return result
        shift += 7


cdef inline Py_ssize_t _length(const unsigned char* buf, Py_ssize_t end, Py_ssize_t* pos) except -1:
    cdef unsigned long long n = _varint(buf, end, pos)
    if n > <unsigned long long>(end - pos[0]):
        raise WireError(CORRUPT)
    return <Py_ssize_t>n


cdef inline int _skip(const unsigned char* buf, Py_ssize_t end, Py_ssize_t* pos, int wire) except -1:
    if wire == 0:
        _varint(buf, end, pos)
    elif wire == 1:
        if end - pos[0] < 8:
            raise WireError(CORRUPT)
        pos[0] += 8
    elif wire == 2:
        pos[0] += _length(buf, end, pos)
    elif wire == 5:
        if end - pos[0] < 4:
            raise WireError(CORRUPT)
        pos[0] += 4
    else:
        raise WireError(CORRUPT)
    return 0


cdef inline unsigned long long _tag(const unsigned char* buf, Py_ssize_t end, Py_ssize_t* pos) except? 0xFFFFFFFFFFFFFFFF:
    """A field's tag; field number 0 (or one too large) is corrupt, as grpc-go and upb say."""
    cdef unsigned long long tag = _varint(buf, end, pos)
    cdef unsigned long long number = tag >> 3
    if number == 0 or number > _MAX_FIELD_NUMBER:
        raise WireError(CORRUPT)
    return tag


# The short strings decoded last (domains, descriptor keys and values repeat from request to
# request), in a table indexed by length and end bytes: a string found here is the same object
# again, its UTF-8 not decoded and its hash (cached in the str) not recomputed by the dict
# lookups that follow. A miss costs one comparison and replaces the slot.
DEF MEMO_SLOTS = 128  # a power of two
DEF MEMO_LONGEST = 64
cdef list _memo = [None] * MEMO_SLOTS


cdef inline str _string(const unsigned char* buf, Py_ssize_t end, Py_ssize_t* pos):
    cdef Py_ssize_t n = _length(buf, end, pos), have
    cdef const unsigned char* data = buf + pos[0]
    cdef const char* known
    cdef Py_ssize_t slot = -1
    cdef str s
    if 0 < n <= MEMO_LONGEST:
        slot = (n * 31 + data[0] * 7 + data[n - 1]) & (MEMO_SLOTS - 1)
        cached = _memo[slot]
        if cached is not None:
            known = PyUnicode_AsUTF8AndSize(cached, &have)
            if have == n and memcmp(known, data, n) == 0:
                pos[0] += n
                return <str>cached
    try:
        s = PyUnicode_DecodeUTF8(<const char*>data, n, NULL)
    except UnicodeDecodeError:
        raise WireError(INVALID_UTF8) from None
    if slot >= 0:
        _memo[slot] = s
    pos[0] += n
    return s


cdef inline str _bounded_string(const unsigned char* buf, Py_ssize_t end, Py_ssize_t* pos,
                                Py_ssize_t most, str field):
    cdef Py_ssize_t start = pos[0]
    cdef Py_ssize_t n = _length(buf, end, pos)
    if n > most:
        raise too_long(field, n, most)
    pos[0] = start
    return _string(buf, end, pos)


cdef tuple _entry(const unsigned char* buf, Py_ssize_t end, Py_ssize_t most):
    cdef Py_ssize_t pos = 0
    cdef unsigned long long tag
    cdef str key = "", value = ""
    while pos < end:
        tag = _tag(buf, end, &pos)
        if tag == 10:
            key = _bounded_string(buf, end, &pos, most, "key")
        elif tag == 18:
            value = _bounded_string(buf, end, &pos, most, "value")
        else:
            _skip(buf, end, &pos, tag & 7)
    return (key, value)


cdef Py_ssize_t _count(const unsigned char* buf, Py_ssize_t end, Py_ssize_t pos,
                       unsigned long long wanted) except -1:
    """How many fields with tag `wanted` from `pos` on, read as tags and lengths only."""
    cdef Py_ssize_t found = 0
    cdef unsigned long long tag
    while pos < end:
        tag = _tag(buf, end, &pos)
        if tag == wanted:
            found += 1
        _skip(buf, end, &pos, tag & 7)
    return found


cdef extern from "Python.h":
    # Steals the reference to `item`.
    void _tuple_set "PyTuple_SET_ITEM" (object tuple, Py_ssize_t i, PyObject* item)


# The entries a descriptor usually has at most: kept in a C array while it is read, then
# moved into its tuple (no list made and thrown away per descriptor); more go to a list.
DEF FEW = 8


cdef object _descriptor(const unsigned char* buf, Py_ssize_t end, Py_ssize_t max_entries,
                        Py_ssize_t max_value):
    cdef Py_ssize_t pos = 0, n, sub, start, i
    cdef unsigned long long tag, rpu, unit, hits
    cdef PyObject* few[FEW]
    cdef Py_ssize_t count = 0  # entries read; the first FEW are owned by `few`
    cdef list more = None
    cdef tuple entries = None
    cdef object limit = None, hits_addend = None
    cdef bint negative = False
    try:
        while pos < end:
            start = pos
            tag = _tag(buf, end, &pos)
            if tag == 10:  # entries
                if count == max_entries:
                    raise too_many_entries(max_entries + _count(buf, end, start, 10), max_entries)
                n = _length(buf, end, &pos)
                entry = _entry(buf + pos, n, max_value)
                if count < FEW:
                    Py_INCREF(entry)
                    few[count] = <PyObject*>entry
                else:
                    if more is None:
                        more = []
                    more.append(entry)
                count += 1
                pos += n
            elif tag == 18:  # limit: RateLimitOverride
                n = _length(buf, end, &pos)
                rpu = unit = 0
                sub = 0
                while sub < n:
                    tag = _tag(buf + pos, n, &sub)
                    if tag == 8:
                        rpu = _varint(buf + pos, n, &sub) & 0xFFFFFFFF
                    elif tag == 16:
                        unit = _varint(buf + pos, n, &sub) & 0xFFFFFFFF
                    else:
                        _skip(buf + pos, n, &sub, tag & 7)
                limit = (rpu, <int>unit)
                pos += n
            elif tag == 26:  # hits_addend: UInt64Value
                n = _length(buf, end, &pos)
                hits = 0
                sub = 0
                while sub < n:
                    tag = _tag(buf + pos, n, &sub)
                    if tag == 8:
                        hits = _varint(buf + pos, n, &sub)
                    else:
                        _skip(buf + pos, n, &sub, tag & 7)
                hits_addend = hits
                pos += n
            elif tag == 32:  # is_negative_hits: bool (any non-zero varint is true)
                negative = _varint(buf, end, &pos) != 0
            else:
                _skip(buf, end, &pos, tag & 7)
        entries = PyTuple_New(count)
        for i in range(FEW, count):
            item = more[i - FEW]
            Py_INCREF(item)
            _tuple_set(entries, i, <PyObject*>item)
    finally:
        # Moved into the tuple once it exists (each reference stolen), else released.
        for i in range(count if count < FEW else FEW):
            if entries is not None:
                _tuple_set(entries, i, few[i])
            else:
                Py_DECREF(<object>few[i])
    if negative:
        return Descriptor(entries, limit, hits_addend, True)
    return Descriptor(entries, limit, hits_addend)


# The bounds `decode_request` was last given (the ReloadOptions in force: frozen, replaced on
# reload), and their values.
cdef object _bounds = None
cdef Py_ssize_t _max_descriptors, _max_entries, _max_value


def decode_request(bytes data, object bounds=None):
    """Parse a serialized RateLimitRequest into a `messages.Request`; with `bounds`, raise
    `messages.TooLarge` for a request past them (see the module docstring)."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t pos = 0, n, start
    cdef unsigned long long tag
    cdef str domain = ""
    cdef list descriptors = []
    cdef unsigned long long hits_addend = 0
    cdef Py_ssize_t max_descriptors = PY_SSIZE_T_MAX
    cdef Py_ssize_t max_entries = PY_SSIZE_T_MAX
    cdef Py_ssize_t max_value = PY_SSIZE_T_MAX
    global _bounds, _max_descriptors, _max_entries, _max_value
    if bounds is not None:
        if bounds is not _bounds:  # read once per (immutable) bounds object
            _max_descriptors = bounds.max_descriptors
            _max_entries = bounds.max_entries
            _max_value = bounds.max_value_length
            _bounds = bounds
        max_descriptors = _max_descriptors
        max_entries = _max_entries
        max_value = _max_value
    while pos < end:
        start = pos
        tag = _tag(buf, end, &pos)
        if tag == 10:
            domain = _string(buf, end, &pos)
        elif tag == 18:
            if len(descriptors) == max_descriptors:
                raise too_many_descriptors(
                    max_descriptors + _count(buf, end, start, 18), max_descriptors
                )
            n = _length(buf, end, &pos)
            descriptors.append(_descriptor(buf + pos, n, max_entries, max_value))
            pos += n
        elif tag == 24:
            hits_addend = _varint(buf, end, &pos) & 0xFFFFFFFF
        else:
            _skip(buf, end, &pos, tag & 7)
    return Request(domain, descriptors, hits_addend)


# The read of a request before it is decoded, for `_rls` (a textual include, as `_h2` splits
# its framing helpers).
include "_wire_peek.pxi"


cdef Py_ssize_t _DESCRIPTOR_BYTES = DESCRIPTOR_BYTES
cdef Py_ssize_t _ENTRY_BYTES = ENTRY_BYTES


def decoded_size(bytes data):
    """About how many bytes `decode_request(data)` takes once decoded (for the transports'
    accounting of requests waiting for their decision): read as tags and lengths only, and
    0 for what is not a well-formed request (it will be refused, not kept)."""
    return request_size(data)


cdef Py_ssize_t request_size(bytes data):
    """`decoded_size`, for `_rls` (no Python call, no int)."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t pos = 0, sub, n, m
    cdef Py_ssize_t size = end
    cdef unsigned long long tag
    try:
        while pos < end:
            tag = _tag(buf, end, &pos)
            if tag != 18:
                _skip(buf, end, &pos, tag & 7)
                continue
            n = _length(buf, end, &pos)
            size += _DESCRIPTOR_BYTES
            sub = 0
            while sub < n:
                tag = _tag(buf + pos, n, &sub)
                if tag == 10:
                    m = _length(buf + pos, n, &sub)
                    size += _ENTRY_BYTES
                    sub += m
                else:
                    _skip(buf + pos, n, &sub, tag & 7)
            pos += n
    except WireError:
        return 0
    return size


cdef inline void _put_varint(bytearray out, unsigned long long v):
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


cdef inline Py_ssize_t _varint_size(unsigned long long v):
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline void _put_bytes(bytearray out, int tag, bytes value):
    out.append(tag)
    _put_varint(out, len(value))
    out.extend(value)


cdef bytes _status(object st):
    cdef bytearray out = bytearray()
    cdef bytearray limit
    cdef object rule = st.rule
    cdef unsigned long long code = st.code
    cdef unsigned long long remaining = st.limit_remaining
    cdef long long reset
    cdef bytes name
    if code:
        out.append(8)
        _put_varint(out, code)
    if rule is not None:
        limit = bytearray()
        if rule.requests_per_unit:
            limit.append(8)
            _put_varint(limit, rule.requests_per_unit)
        if rule.unit:
            limit.append(16)
            _put_varint(limit, rule.unit)
        if rule.name:
            name = (<str>rule.name).encode("utf-8")
            _put_bytes(limit, 26, name)
        out.append(18)
        _put_varint(out, len(limit))
        out.extend(limit)
    if remaining:
        out.append(24)
        _put_varint(out, remaining)
    if rule is not None:
        reset = st.duration_until_reset
        out.append(34)
        if reset:
            out.append(1 + _varint_size(<unsigned long long>reset))
            out.append(8)
            _put_varint(out, <unsigned long long>reset)
        else:
            out.append(0)
    return bytes(out)


cdef void _headers(bytearray out, int tag, list headers):
    cdef bytearray header
    cdef bytes k, v
    for key, value in headers:
        header = bytearray()
        k = (<str>key).encode("utf-8")
        v = (<str>value).encode("utf-8")
        if k:
            _put_bytes(header, 10, k)
        if v:
            _put_bytes(header, 18, v)
        out.append(tag)
        _put_varint(out, len(header))
        out.extend(header)


# The statuses the direct encoder takes (more: the bytearray path).
DEF _DIRECT = 16


cdef struct _St:
    unsigned long long code, remaining, reset, rpu, unit, limit_size, size
    bint limited
    # The rule's name as UTF-8, borrowed from the str (its own buffer, or the UTF-8 copy
    # CPython caches in it): no bytes object per status.
    const char* name
    Py_ssize_t name_size


cdef inline unsigned char* _field(unsigned char* p, unsigned char tag, unsigned long long v) noexcept:
    """Write a tag then a varint."""
    p[0] = tag
    return _put(p + 1, v)


cdef inline unsigned char* _put(unsigned char* p, unsigned long long v) noexcept:
    while v >= 0x80:
        p[0] = (v & 0x7F) | 0x80
        p += 1
        v >>= 7
    p[0] = <unsigned char>v
    return p + 1


def encode_response(object resp, struct=None):
    """Serialize a `messages.Response`; `struct(resp.dynamic_metadata)` serializes its
    dynamic metadata (a google.protobuf.Struct) when it has any."""
    return _encode(resp, struct)


cdef class Encoder:
    """`encode_response` with its Struct serializer bound: one C call per response."""

    cdef object struct

    def __init__(self, struct):
        self.struct = struct

    def __call__(self, resp):
        return _encode(resp, self.struct)


cdef bytes _encode(object resp, struct):
    cdef list statuses = get(resp, RESPONSE, P_STATUSES, "statuses")
    cdef bytes metadata = None
    dynamic = get(resp, RESPONSE, P_METADATA, "dynamic_metadata")
    if struct is not None and dynamic:  # an empty Struct is absent, as upb writes it
        metadata = struct(dynamic)
    if (
        metadata is not None
        or get(resp, RESPONSE, P_HEADERS, "headers")
        or get(resp, RESPONSE, P_REQUEST_HEADERS, "request_headers")
        or len(statuses) > _DIRECT
    ):
        return _encode_general(resp, metadata)
    overall = get(resp, RESPONSE, P_OVERALL, "overall_code")
    return _encode_direct(<unsigned long long>overall, statuses)


cdef bytes _encode_direct(unsigned long long overall, list statuses):
    """The common response (statuses, no headers or metadata), measured then written
    straight into its bytes object: the same bytes as `_encode_general`."""
    cdef _St sts[_DIRECT]
    cdef _St* s
    cdef Py_ssize_t i, n = len(statuses), total = 0
    # The names read from a rule that is not a config.Rule (its `name` may be made on each
    # read): held until they are written. A Rule's is held by its slot.
    cdef list held = None
    cdef bytes out
    cdef unsigned char* p
    if overall:
        total += 1 + _varint_size(overall)
    for i in range(n):
        st = statuses[i]
        s = &sts[i]
        s.code = get(st, STATUS, T_CODE, "code")
        s.remaining = get(st, STATUS, T_REMAINING, "limit_remaining")
        rule = get(st, STATUS, T_RULE, "rule")
        s.limited = rule is not None
        s.size = 0
        s.name = NULL
        s.name_size = 0
        if s.code:
            s.size += 1 + _varint_size(s.code)
        if s.limited:
            if RULE is None:
                _rule_offsets()
            s.rpu = get(rule, RULE, R_RPU, "requests_per_unit")
            s.unit = get(rule, RULE, R_UNIT, "unit")
            rule_name = get(rule, RULE, R_NAME, "name")
            if rule_name:
                s.name = PyUnicode_AsUTF8AndSize(<str>rule_name, &s.name_size)
                if type(rule) is not RULE:
                    if held is None:
                        held = []
                    held.append(rule_name)
            s.reset = <unsigned long long><long long>get(st, STATUS, T_RESET, "duration_until_reset")
            s.limit_size = 0
            if s.rpu:
                s.limit_size += 1 + _varint_size(s.rpu)
            if s.unit:
                s.limit_size += 1 + _varint_size(s.unit)
            if s.name_size:
                s.limit_size += 1 + _varint_size(s.name_size) + s.name_size
            s.size += 1 + _varint_size(s.limit_size) + s.limit_size
            # duration_until_reset: a Duration, present (maybe empty) whenever a limit applied
            s.size += 2 + ((1 + _varint_size(s.reset)) if s.reset else 0)
        if s.remaining:
            s.size += 1 + _varint_size(s.remaining)
        total += 1 + _varint_size(s.size) + s.size
    out = PyBytes_FromStringAndSize(NULL, total)
    p = <unsigned char*>PyBytes_AS_STRING(out)
    if overall:
        p = _field(p, 8, overall)
    for i in range(n):
        s = &sts[i]
        p = _field(p, 18, s.size)
        if s.code:
            p = _field(p, 8, s.code)
        if s.limited:
            p = _field(p, 18, s.limit_size)
            if s.rpu:
                p = _field(p, 8, s.rpu)
            if s.unit:
                p = _field(p, 16, s.unit)
            if s.name_size:
                p = _field(p, 26, s.name_size)
                memcpy(p, s.name, s.name_size)
                p += s.name_size
        if s.remaining:
            p = _field(p, 24, s.remaining)
        if s.limited:
            p[0] = 34
            if s.reset:
                p[1] = 1 + _varint_size(s.reset)
                p[2] = 8
                p = _put(p + 3, s.reset)
            else:
                p[1] = 0
                p += 2
    return out


cdef bytes _encode_general(object resp, bytes dynamic_metadata):
    cdef bytearray out = bytearray()
    cdef bytes body
    cdef unsigned long long overall = resp.overall_code
    if overall:
        out.append(8)
        _put_varint(out, overall)
    for st in resp.statuses:
        body = _status(st)
        _put_bytes(out, 18, body)
    _headers(out, 26, resp.headers)  # response_headers_to_add
    _headers(out, 34, resp.request_headers)  # request_headers_to_add
    if dynamic_metadata is not None:
        _put_bytes(out, 50, dynamic_metadata)
    return bytes(out)
