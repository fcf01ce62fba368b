# The read of a request before it is decoded (`request_domain`, `checked_descriptors`),
# included by `_wire.pyx`: its string table (`_memo`) and bounds are the decoder's own. A
# walk that raises nothing and makes nothing; what it cannot vouch for (malformed, or a
# string whose UTF-8 the decoder would have to check) goes to `decode_request`.
cdef inline bint _peek_varint(const unsigned char* buf, Py_ssize_t end, Py_ssize_t* pos,
                              unsigned long long* out) noexcept:
    cdef unsigned long long result = 0
    cdef int shift = 0
    cdef unsigned char b
    while pos[0] < end and shift <= 63:
        b = buf[pos[0]]
        pos[0] += 1
        result |= (<unsigned long long>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = result
            return True
        shift += 7
    return False


cdef inline Py_ssize_t _peek_field(const unsigned char* buf, Py_ssize_t end, Py_ssize_t* pos,
                                   unsigned long long* tag) noexcept:
    """A field's tag, then its value skipped: the length of a length-delimited value (its
    bytes end at `pos`), 0 for another wire type, -1 for what `decode_request` refuses."""
    cdef unsigned long long v, number
    cdef int wire
    if not _peek_varint(buf, end, pos, tag):
        return -1
    number = tag[0] >> 3
    if number == 0 or number > _MAX_FIELD_NUMBER:
        return -1
    wire = tag[0] & 7
    if wire == 0:
        return 0 if _peek_varint(buf, end, pos, &v) else -1
    if wire == 1 or wire == 5:
        v = 8 if wire == 1 else 4
        if <unsigned long long>(end - pos[0]) < v:
            return -1
        pos[0] += v
        return 0
    if wire == 2:
        if not _peek_varint(buf, end, pos, &v) or v > <unsigned long long>(end - pos[0]):
            return -1
        pos[0] += v
        return <Py_ssize_t>v
    return -1


cdef inline bint _ascii(const unsigned char* p, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] >= 0x80:
            return False
    return True


cdef inline bint _peek_fields(const unsigned char* buf, Py_ssize_t end) noexcept:
    """Whether a sub-message the decoder walks field by field (a limit override, a hits
    addend) is well formed."""
    cdef Py_ssize_t pos = 0
    cdef unsigned long long tag
    while pos < end:
        if _peek_field(buf, end, &pos, &tag) < 0:
            return False
    return True


cdef Py_ssize_t _peek_descriptor(const unsigned char* buf, Py_ssize_t end,
                                 Py_ssize_t max_entries, Py_ssize_t max_value) noexcept:
    """1 if `decode_request` would decode this descriptor within the bounds, its strings
    ASCII (valid UTF-8 without decoding them); else 0."""
    cdef Py_ssize_t pos = 0, n, sub, m, entries = 0
    cdef unsigned long long tag, inner
    while pos < end:
        n = _peek_field(buf, end, &pos, &tag)
        if n < 0:
            return 0
        if tag == 10:  # an entry: key and value strings
            entries += 1
            if entries > max_entries:
                return 0
            sub = pos - n
            while sub < pos:
                m = _peek_field(buf, pos, &sub, &inner)
                if m < 0:
                    return 0
                if inner == 10 or inner == 18:
                    if m > max_value or not _ascii(buf + sub - m, m):
                        return 0
        elif tag == 18 or tag == 26:  # limit override, hits_addend
            if not _peek_fields(buf + pos - n, n):
                return 0
    return 1


cdef str request_domain(bytes data):
    """The domain of a serialized RateLimitRequest when it is the string `decode_request`
    decoded last (held in the string table: the same object, its hash known), read without
    decoding anything or making any object; None otherwise, or for what is not a well-formed
    request at its top level (its descriptors are skipped: `checked_descriptors`)."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t pos = 0, n, slot, at = -1, size = 0, have
    cdef unsigned long long tag
    cdef const char* known
    while pos < end:
        n = _peek_field(buf, end, &pos, &tag)
        if n < 0:
            return None
        if tag == 10:  # the last one counts, as in the decoder
            at = pos - n
            size = n
    if not 0 < size <= MEMO_LONGEST:
        return None
    slot = (size * 31 + buf[at] * 7 + buf[at + size - 1]) & (MEMO_SLOTS - 1)
    cached = _memo[slot]
    if cached is None:
        return None
    known = PyUnicode_AsUTF8AndSize(cached, &have)
    if have != size or memcmp(known, buf + at, size) != 0:
        return None
    return <str>cached


cdef Py_ssize_t checked_descriptors(bytes data, object bounds):
    """How many descriptors a serialized RateLimitRequest has, when `decode_request(data,
    bounds)` would decode it without an error (its strings ASCII, so valid UTF-8 unread);
    -1 otherwise. Read without making any object."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t pos = 0, n, count = 0
    cdef unsigned long long tag
    global _bounds, _max_descriptors, _max_entries, _max_value
    if bounds is not _bounds:
        _max_descriptors = bounds.max_descriptors
        _max_entries = bounds.max_entries
        _max_value = bounds.max_value_length
        _bounds = bounds
    while pos < end:
        n = _peek_field(buf, end, &pos, &tag)
        if n < 0:
            return -1
        if tag == 18:
            count += 1
            if count > _max_descriptors:
                return -1
            if not _peek_descriptor(buf + pos - n, n, _max_entries, _max_value):
                return -1
    return count
