# Included by _h2.pyx: a call's state (`Stream`) and the helpers of the gRPC framing.


class H2Error(Exception):
    """A connection the core could not set up (out of memory)."""


cdef inline double _monotonic() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef inline bytes _same(bytes last, const uint8_t* value, size_t n):
    """`last` when it holds the `n` bytes at `value`, else a new bytes object of them: a
    client calls one method with one content type, so a connection's streams share one
    :path and one content-type object (no bytes made per call, and the path's hash, for
    the lookup in `streaming`, computed once)."""
    if last is not None and <size_t>PyBytes_GET_SIZE(last) == n and (
        memcmp(PyBytes_AS_STRING(last), value, n) == 0
    ):
        return last
    return PyBytes_FromStringAndSize(<const char*>value, n)


cdef inline void _nv(nghttp2_nv* nv, bytes name, bytes value) noexcept:
    # nghttp2 copies submitted header blocks, so the bytes only need to outlive the call.
    nv.name = <uint8_t*>PyBytes_AS_STRING(name)
    nv.namelen = PyBytes_GET_SIZE(name)
    nv.value = <uint8_t*>PyBytes_AS_STRING(value)
    nv.valuelen = PyBytes_GET_SIZE(value)
    nv.flags = NGHTTP2_NV_FLAG_NONE


def percent_encode(str message):
    """grpc-message encoding: UTF-8, then %XX for bytes outside 0x20-0x7E and for '%'."""
    cdef bytes raw = message.encode("utf-8", "replace")
    cdef bytearray out
    cdef unsigned char b
    for b in raw:
        if b < 0x20 or b > 0x7E or b == 0x25:
            break
    else:
        return raw
    out = bytearray()
    for b in raw:
        if b < 0x20 or b > 0x7E or b == 0x25:
            out += b"%%%02X" % b
        else:
            out.append(b)
    return bytes(out)


cdef class Stream:
    """One call: what the request carried, and the state of its reply."""

    cdef readonly int32_t id
    cdef readonly bytes path
    # Seconds from grpc-timeout, -1.0 when the client set no deadline.
    cdef readonly double timeout
    # (name, value) pairs of the headers named in the connection's `metadata`, or None.
    cdef readonly object metadata
    cdef readonly bytes message
    cdef readonly bint closed
    # CLOCK_MONOTONIC seconds (time.monotonic()'s clock) when its HEADERS arrived.
    cdef readonly double started
    # True once the whole request was read and handed to the transport.
    cdef readonly bint dispatched
    # Whatever the transport attaches (a pending task, a health watcher).
    cdef public object work
    # The transport's deadline entry for this call, dropped when it is answered.
    cdef public object deadline
    # CLOCK_MONOTONIC seconds since reply bytes wait for the peer's flow-control window
    # (0.0: nothing waiting).
    cdef readonly double sending_since

    cdef bytes method
    cdef bytes content_type
    cdef bytes encoding
    cdef str timeout_error
    cdef Py_ssize_t header_bytes
    cdef bytearray body
    cdef Py_ssize_t held
    cdef Py_ssize_t expected
    cdef bint discard
    cdef bint answered
    # Bytes charged to the connection's buffers (its request, then its reply); queued for
    # a charge check of its request, or of its reply.
    cdef Py_ssize_t charged
    cdef bint pending
    cdef bint unsent
    # A bidirectional stream (`_h2_streaming.pxi`): dispatched at its HEADERS, each
    # message handed to `work.receive` as it completes.
    cdef readonly bint streaming

    cdef bytes out
    cdef Py_ssize_t out_pos
    cdef bint headers_sent
    cdef bint finishing
    cdef bint deferred
    cdef int status
    cdef bytes status_message

    def __cinit__(self):
        self.timeout = -1.0
        self.expected = -1
        self.content_type = None

    @property
    def answered(self):
        """True once the final status was submitted."""
        return self.answered


cdef double _parse_timeout(const uint8_t* value, size_t n, Stream stream) except? -2.0:
    """grpc-timeout ("1-8 digits" + H/M/S/m/u/n) in seconds; sets `timeout_error` if malformed."""
    cdef size_t i
    cdef uint8_t unit
    cdef double amount = 0
    if n < 2:
        stream.timeout_error = "timeout string is too short: %r" % (<bytes>value[:n]).decode("latin-1")
        return -1.0
    if n > 9:
        stream.timeout_error = "timeout string is too long: %r" % (<bytes>value[:n]).decode("latin-1")
        return -1.0
    for i in range(n - 1):
        if value[i] < 48 or value[i] > 57:
            stream.timeout_error = "invalid timeout value: %r" % (<bytes>value[:n]).decode("latin-1")
            return -1.0
        amount = amount * 10 + (value[i] - 48)
    unit = value[n - 1]
    if unit == 72:  # H
        return amount * 3600.0
    if unit == 77:  # M
        return amount * 60.0
    if unit == 83:  # S
        return amount
    if unit == 109:  # m
        return amount / 1e3
    if unit == 117:  # u
        return amount / 1e6
    if unit == 110:  # n
        return amount / 1e9
    stream.timeout_error = "timeout unit is not recognized: %r" % (<bytes>value[:n]).decode("latin-1")
    return -1.0


cdef inline Py_ssize_t _prefix_length(const uint8_t* head) noexcept:
    """The big-endian uint32 length of a gRPC message prefix (bytes 1-4), unsigned: a length
    of 2^31 or more is a message too large, not a negative one."""
    return <Py_ssize_t>(
        (<uint32_t>head[1] << 24) | (<uint32_t>head[2] << 16) | (<uint32_t>head[3] << 8)
        | <uint32_t>head[4]
    )


cdef inline bytes _frame(bytes message):
    """The 5-byte gRPC prefix (uncompressed, big-endian length) and the message."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(message)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n + 5)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    p[0] = 0
    p[1] = (n >> 24) & 0xFF
    p[2] = (n >> 16) & 0xFF
    p[3] = (n >> 8) & 0xFF
    p[4] = n & 0xFF
    memcpy(p + 5, PyBytes_AS_STRING(message), n)
    return out
