# The frame meter of a connection (a textual include of _h2.pyx): the frames read ahead of
# nghttp2 and counted against the flood bounds, the header block bytes a connection may still
# send (refilled with time and by answered calls), and the widest send window when SETTINGS change it.

cdef Py_ssize_t _meter(Connection conn, const uint8_t* p, Py_ssize_t n) noexcept:
    """Read the frame headers in these bytes (they may straddle reads) before nghttp2 does;
    the offset of the frame that passes a flood bound (0 if it began in an earlier read),
    or -1.

    Counted here, ahead of the library, because nghttp2 skips some frames without a
    callback (extension types, DATA on a closed stream, the rest of a header block it no
    longer delivers) and they cost the loop all the same.
    """
    cdef Py_ssize_t i = 0, k, start
    cdef size_t length
    cdef uint8_t kind
    cdef uint8_t* h = conn.meter_head
    while i < n:
        if conn.meter_skip:
            k = conn.meter_skip if conn.meter_skip < n - i else n - i
            conn.meter_skip -= k
            i += k
            continue
        start = i - conn.meter_have
        k = 9 - conn.meter_have
        if k > n - i:
            k = n - i
        memcpy(h + conn.meter_have, p + i, k)
        conn.meter_have += k
        i += k
        if conn.meter_have < 9:
            break
        conn.meter_have = 0
        length = (<size_t>h[0] << 16) | (<size_t>h[1] << 8) | h[2]
        kind = h[3]
        conn.meter_skip = length
        if kind == NGHTTP2_HEADERS or kind == NGHTTP2_CONTINUATION:
            if not _header_credit(conn, length):
                return start if start > 0 else 0
            if kind == NGHTTP2_HEADERS:
                conn.idle_frames = 0
        elif kind == NGHTTP2_DATA and length:
            conn.idle_frames = 0  # bounded by flow control
        elif (
            kind == NGHTTP2_DATA or kind == NGHTTP2_PRIORITY
            or kind == NGHTTP2_WINDOW_UPDATE or kind > NGHTTP2_CONTINUATION
        ):
            conn.idle_frames += 1
            if conn.idle_frames > conn.idle_limit:
                return start if start > 0 else 0
    return -1


cdef inline bint _header_credit(Connection conn, size_t length) noexcept:
    """Spend `length` header block bytes of the connection's budget; False when short."""
    cdef double now
    if conn.header_credit < length:
        now = _monotonic()
        conn.header_credit = min(
            conn.header_burst,
            conn.header_credit + (now - conn.header_refilled) * conn.header_rate,
        )
        conn.header_refilled = now
        if conn.header_credit < length:
            return False
    conn.header_credit -= length
    return True


cdef inline void _header_refund(Connection conn) noexcept:
    """An answered call gives HEADER_BYTES_PER_CALL back, up to the burst."""
    conn.header_credit += _HEADER_BYTES_PER_CALL
    if conn.header_credit > conn.header_burst:
        conn.header_credit = conn.header_burst


cdef int64_t _widest_window(Connection conn) noexcept:
    """The largest send window of the connection's open streams."""
    cdef int64_t widest = -0x80000000, w
    for stream_id in conn.streams:
        w = nghttp2_session_get_stream_remote_window_size(conn.session, <int32_t>stream_id)
        if w > widest:
            widest = w
    return widest
