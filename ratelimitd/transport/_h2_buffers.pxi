# Included by _h2.pyx: what a connection charges to the process's buffers (`buffers`:
# take/give/refusal). Requests still incomplete once a read is processed, requests the
# transport holds while an asynchronous decision runs, replies still waiting for the peer's
# flow-control window once flushed; what is read, answered and sent within one read never is.


cdef object _hold(Connection conn, Stream stream, Py_ssize_t extra):
    """Charge a dispatched call's request (and `extra` bytes: its decoded form) to the
    buffers while its decision runs (given back when it is answered); False, and
    nothing charged, when it does not fit."""
    cdef Py_ssize_t need = STREAM_COST + stream.header_bytes + extra
    if conn.buffers is None:
        return True
    if stream.message is not None:
        need += PyBytes_GET_SIZE(stream.message)
    if not conn.buffers.take(need):
        return False
    stream.charged += need
    return True


cdef void _charge_pending(Connection conn) except *:
    """Charge the process's buffers for the requests this read left incomplete: their
    head, and their body as announced by its prefix (or as read so far)."""
    cdef Stream stream
    cdef Py_ssize_t need
    cdef list pending = conn.pending
    conn.pending = []
    for stream in pending:
        stream.pending = False
        if stream.dispatched or stream.answered or stream.closed or conn.buffers is None:
            continue
        need = STREAM_COST + stream.header_bytes
        need += stream.expected + 5 if stream.expected >= 0 else stream.held
        if need <= stream.charged:
            continue
        if conn.buffers.take(need - stream.charged):
            stream.charged = need
        else:
            conn._trailers_only(stream, _STATUS_200, RESOURCE_EXHAUSTED,
                                conn.buffers.refusal)


cdef inline void _watch(Connection conn, Stream stream):
    if not stream.pending:
        stream.pending = True
        conn.pending.append(stream)


cdef bint _charge_unsent(Connection conn) except -1:
    """Charge the replies that did not leave with this flush (the peer's window is
    closed); reset those that do not fit (True if any), give back for those that have
    left."""
    cdef Stream stream
    cdef Py_ssize_t need
    cdef list unsent = conn.unsent
    cdef bint reset = False
    conn.unsent = []
    for stream in unsent:
        if stream.closed:
            stream.unsent = False
            continue
        need = 0
        if stream.out is not None:
            need = PyBytes_GET_SIZE(stream.out) - stream.out_pos
        if need == 0 and not stream.sending_since:
            stream.unsent = False  # gone out
            if stream.charged:
                _uncharge(conn, stream)
            continue
        conn.unsent.append(stream)  # checked again at the next flush
        if need > stream.charged:
            if conn.buffers.take(need - stream.charged):
                stream.charged = need
            else:
                conn.reset(stream, NGHTTP2_CANCEL)
                reset = True
    return reset


cdef inline void _unsent(Connection conn, Stream stream):
    if not stream.unsent:
        stream.unsent = True
        conn.unsent.append(stream)


cdef void _uncharge(Connection conn, Stream stream) except *:
    conn.buffers.give(stream.charged)
    stream.charged = 0
