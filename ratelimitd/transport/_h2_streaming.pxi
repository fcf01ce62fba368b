# Included by _h2.pyx: bidirectional streams (the connection's `streaming` paths).
#
# A unary call is dispatched once its request is whole; a streaming call is dispatched at
# its HEADERS (`on_request(stream)` with no message), and the transport puts on
# `stream.work` an object whose `receive(message)` takes each message as it completes and
# `receive(None)` the client's end of stream; replies go out with `send_message` and the
# call ends with `finish`. Each message's bytes go back to the connection window as soon as
# it is handed over, so a long-lived stream holds at most one partial message (bounded by
# `max_message`). Few messages flow this way (quota reports every few seconds): simplicity
# over speed, and the unary hot path is untouched.


cdef int _open_streaming(Connection conn, Stream stream) except -1:
    """Dispatch a streaming call at its HEADERS."""
    stream.streaming = True
    stream.dispatched = True
    conn.on_request(stream)
    return 0


cdef int _streaming_data(Connection conn, Stream stream, const uint8_t* data, size_t n) except -1:
    """Buffer a streaming call's DATA and hand over every message it completes."""
    cdef Py_ssize_t length
    cdef const uint8_t* head
    cdef bytes message
    stream.held += n
    if stream.body is None:
        stream.body = bytearray()
    stream.body += (<bytes>data[:n]) if n else b""
    while len(stream.body) >= 5 and not stream.answered:
        head = <const uint8_t*><char*>stream.body
        length = _prefix_length(head)
        if head[0] != 0:
            _streaming_failed(conn, stream, INTERNAL,
                              "grpc: compressed flag set with identity or empty encoding"
                              if head[0] == 1
                              else "grpc: received unexpected payload format %d" % head[0])
            return 0
        if length > conn.max_message:
            _streaming_failed(
                conn, stream, RESOURCE_EXHAUSTED,
                "grpc: received message larger than max (%d vs. %d)" % (length, conn.max_message),
            )
            return 0
        if len(stream.body) < length + 5:
            break
        message = bytes(stream.body[5:length + 5])
        del stream.body[:length + 5]
        nghttp2_session_consume_connection(conn.session, length + 5)
        stream.held -= length + 5
        if stream.work is not None:
            stream.work.receive(message)
    return 0


cdef int _streaming_end(Connection conn, Stream stream) except -1:
    """The client's END_STREAM: a partial message is an error, else the work is told."""
    if stream.answered:
        return 0
    if stream.body is not None and len(stream.body):
        _streaming_failed(conn, stream, INTERNAL, "unexpected EOF")
    elif stream.work is not None:
        stream.work.receive(None)
    return 0


cdef void _streaming_failed(Connection conn, Stream stream, int code, str message) except *:
    """End a streaming call the core refuses, and stop its work."""
    conn.finish(stream, code, message)
    conn._release(stream)
    if conn.on_close is not None:
        conn.on_close(stream)
