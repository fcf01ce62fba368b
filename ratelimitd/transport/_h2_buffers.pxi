# Included by _h2.pyx: what a connection charges to the process's buffers (`buffers`:
# take/give/refusal). Requests still incomplete once a read is processed, requests the
# transport holds while an asynchronous decision runs, replies still waiting for the peer's
# flow-control window once flushed; what is read, answered and sent within one read never is.


from ratelimitd._slots cimport get, offset_of, put

from ratelimitd.runtime.allocator import Trimmer
from ratelimitd.transport.limits import ClientBuffers

# STREAM_COST as a C number: the charge is reckoned without making an int.
cdef Py_ssize_t COST = STREAM_COST
cdef object BUFFERS = ClientBuffers
cdef Py_ssize_t B_HELD = offset_of(ClientBuffers, "held")
cdef Py_ssize_t B_LIMIT = offset_of(ClientBuffers, "limit")
cdef Py_ssize_t B_TRIMMER = offset_of(ClientBuffers, "trimmer")
cdef object TRIMMER = Trimmer
cdef Py_ssize_t T_PENDING = offset_of(Trimmer, "pending")
cdef Py_ssize_t T_WAKE = offset_of(Trimmer, "wake")


cdef bint _take(buffers, Py_ssize_t n) except -1:
    """`buffers.take(n)`, its usual case (it fits) in C: every call that waits on the store
    takes, and gives back when answered, so this pair was two Python frames a call."""
    cdef Py_ssize_t held
    if type(buffers) is BUFFERS:
        held = get(buffers, BUFFERS, B_HELD, "held")
        if held + n <= <Py_ssize_t>get(buffers, BUFFERS, B_LIMIT, "limit"):
            put(buffers, BUFFERS, B_HELD, "held", held + n)
            return True
    return buffers.take(n)


cdef void _give(buffers, Py_ssize_t n) except *:
    """`buffers.give(n)` in C, alike (the trimmer is called once it has something to do)."""
    if type(buffers) is not BUFFERS:
        buffers.give(n)
        return
    put(buffers, BUFFERS, B_HELD, "held", <Py_ssize_t>get(buffers, BUFFERS, B_HELD, "held") - n)
    trimmer = get(buffers, BUFFERS, B_TRIMMER, "trimmer")
    if trimmer is not None:
        pending = get(trimmer, TRIMMER, T_PENDING, "pending") + n
        put(trimmer, TRIMMER, T_PENDING, "pending", pending)
        if pending >= get(trimmer, TRIMMER, T_WAKE, "wake"):
            trimmer.freed(0)


cdef object _hold(Connection conn, Stream stream, Py_ssize_t extra):
    """Charge a dispatched call's request (and `extra` bytes: its decoded form) to the
    buffers while its decision runs (given back when it is answered); False, and
    nothing charged, when it does not fit."""
    cdef Py_ssize_t need = COST + stream.header_bytes + extra
    if conn.buffers is None:
        return True
    if stream.message is not None:
        need += PyBytes_GET_SIZE(stream.message)
    if not _take(conn.buffers, need):
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
        need = COST + stream.header_bytes
        need += stream.expected + 5 if stream.expected >= 0 else stream.held
        if need <= stream.charged:
            continue
        if _take(conn.buffers, need - stream.charged):
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
            if _take(conn.buffers, need - stream.charged):
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
    _give(conn.buffers, stream.charged)
    stream.charged = 0
