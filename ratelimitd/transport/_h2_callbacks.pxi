# Included by _h2.pyx: the C callbacks nghttp2 calls into, and the one-time library set-up.

# -- nghttp2 callbacks: C signatures, no exceptions escape (stored on the connection) ----


cdef int _on_begin_frame(nghttp2_session* session, const nghttp2_frame_hd* hd,
                         void* user_data) noexcept:
    cdef Connection conn = <Connection>user_data
    if hd.type == NGHTTP2_HEADERS:
        if hd.stream_id > conn.last_stream_id:
            conn.last_stream_id = hd.stream_id
        elif nghttp2_session_get_stream_user_data(session, hd.stream_id) == NULL:
            # HTTP/2 requires a new stream's id to exceed every earlier one, and
            # a finished stream takes no more HEADERS: a connection error, where nghttp2
            # ignores the block (it forgets closed streams) and the call hung until its
            # deadline. grpc-go, the reference's server, ends the connection as well.
            conn.fatal_code = NGHTTP2_PROTOCOL_ERROR
            return NGHTTP2_ERR_CALLBACK_FAILURE
    elif hd.type == NGHTTP2_SETTINGS and not hd.flags & NGHTTP2_FLAG_ACK:
        if conn.streams:
            conn.settings_window = _widest_window(conn)
            conn.settings_initial = nghttp2_session_get_remote_settings(
                session, NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
            )
        else:
            conn.settings_window = -1
    return 0


cdef int _on_begin_headers(nghttp2_session* session, const nghttp2_frame* frame,
                           void* user_data) noexcept:
    cdef Connection conn = <Connection>user_data
    try:
        conn._begin_headers(frame)
    except BaseException as exc:
        conn.error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef int _on_header(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
                    size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                    void* user_data) noexcept:
    cdef Connection conn = <Connection>user_data
    cdef void* ptr
    if frame.hd.type != NGHTTP2_HEADERS or frame.headers.cat != NGHTTP2_HCAT_REQUEST:
        return 0  # trailers from the client carry nothing we read
    ptr = nghttp2_session_get_stream_user_data(session, frame.hd.stream_id)
    if ptr == NULL:
        return 0
    try:
        if conn._header(<Stream>ptr, name, namelen, value, valuelen):
            # Over the header list limit (the call is answered): nghttp2 resets the stream
            # and only decompresses the rest of the block, with no callback and no checks.
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
    except BaseException as exc:
        conn.error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef int _on_data_chunk(nghttp2_session* session, uint8_t flags, int32_t stream_id,
                        const uint8_t* data, size_t length, void* user_data) noexcept:
    cdef Connection conn = <Connection>user_data
    cdef void* ptr = nghttp2_session_get_stream_user_data(session, stream_id)
    if ptr == NULL:
        nghttp2_session_consume(session, stream_id, length)
        return 0
    try:
        conn._data(<Stream>ptr, data, length)
    except BaseException as exc:
        conn.error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef int _on_frame_recv(nghttp2_session* session, const nghttp2_frame* frame,
                        void* user_data) noexcept:
    cdef Connection conn = <Connection>user_data
    cdef void* ptr
    cdef uint8_t kind = frame.hd.type
    try:
        if kind == NGHTTP2_HEADERS or kind == NGHTTP2_DATA:
            ptr = nghttp2_session_get_stream_user_data(session, frame.hd.stream_id)
            if ptr == NULL:
                return 0
            if kind == NGHTTP2_HEADERS and frame.headers.cat == NGHTTP2_HCAT_REQUEST:
                conn._headers_done(<Stream>ptr)
            if frame.hd.flags & NGHTTP2_FLAG_END_STREAM:
                conn._end_of_request(<Stream>ptr)
        elif kind == NGHTTP2_SETTINGS and not frame.hd.flags & NGHTTP2_FLAG_ACK:
            conn.established = True  # the client preface ends with its SETTINGS
            if conn.settings_window >= 0 and (
                conn.settings_window
                + nghttp2_session_get_remote_settings(
                    session, NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
                )
                - conn.settings_initial
                > 0x7FFFFFFF
            ):
                # An INITIAL_WINDOW_SIZE that takes an open stream's window past 2^31-1 is
                # a connection error in HTTP/2 (the peer's flow-control accounting is
                # broken); nghttp2 resets the stream alone.
                conn.fatal_code = NGHTTP2_FLOW_CONTROL_ERROR
                return NGHTTP2_ERR_CALLBACK_FAILURE
        elif kind == NGHTTP2_PING and frame.hd.flags & NGHTTP2_FLAG_ACK:
            if memcmp(frame.ping.opaque_data, PyBytes_AS_STRING(_SHUTDOWN_PING), 8) == 0:
                conn.goaway()
    except BaseException as exc:
        conn.error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef int _on_frame_send(nghttp2_session* session, const nghttp2_frame* frame,
                        void* user_data) noexcept:
    cdef int32_t sid = frame.hd.stream_id
    if frame.hd.type == NGHTTP2_DATA:
        # A reply went out: the peer's WINDOW_UPDATEs for it are progress.
        (<Connection>user_data).idle_frames = 0
    if (
        (frame.hd.type == NGHTTP2_HEADERS or frame.hd.type == NGHTTP2_DATA)
        and frame.hd.flags & NGHTTP2_FLAG_END_STREAM
        and not nghttp2_session_get_stream_remote_close(session, sid)
    ):
        # We answered before the client finished sending (an early error): tell it to
        # stop, as grpc-go does (RFC 9113 section 8.1).
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, sid, NGHTTP2_NO_ERROR)
    return 0


cdef int _on_stream_close(nghttp2_session* session, int32_t stream_id, uint32_t error_code,
                          void* user_data) noexcept:
    cdef Connection conn = <Connection>user_data
    try:
        conn._closed(stream_id)
    except BaseException as exc:
        conn.error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef ssize_t _read_callback(nghttp2_session* session, int32_t stream_id, uint8_t* buf,
                            size_t length, uint32_t* data_flags, nghttp2_data_source* source,
                            void* user_data) noexcept:
    cdef Stream stream = <Stream>source.ptr
    cdef Py_ssize_t left = 0, k = 0
    cdef nghttp2_nv nva[2]
    cdef size_t n = 1
    cdef bytes code_text
    if stream.out is not None:
        left = PyBytes_GET_SIZE(stream.out) - stream.out_pos
    if left > 0:
        k = left if <size_t>left <= length else <Py_ssize_t>length
        memcpy(buf, PyBytes_AS_STRING(stream.out) + stream.out_pos, k)
        stream.out_pos += k
        if k < left:
            return k
        stream.out = None
        stream.out_pos = 0
    stream.sending_since = 0.0  # all out (or nothing to send): nothing waits for the window
    if stream.finishing:
        # Trailers must be submitted from here, after DATA's EOF without END_STREAM.
        data_flags[0] |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM
        if stream.status == OK:
            _nv(&nva[0], b"grpc-status", b"0")
        else:
            code_text = str(stream.status).encode()
            _nv(&nva[0], b"grpc-status", code_text)
            if stream.status_message is not None:
                _nv(&nva[1], b"grpc-message", stream.status_message)
                n = 2
        nghttp2_submit_trailer(session, stream_id, nva, n)
        return k
    if k:
        return k
    stream.deferred = True
    return NGHTTP2_ERR_DEFERRED


cdef void _init_library() except *:
    global _CALLBACKS, _OPTION
    if nghttp2_session_callbacks_new(&_CALLBACKS) != 0 or nghttp2_option_new(&_OPTION) != 0:
        raise H2Error("cannot initialise nghttp2")
    nghttp2_session_callbacks_set_on_begin_frame_callback(_CALLBACKS, _on_begin_frame)
    nghttp2_session_callbacks_set_on_begin_headers_callback(_CALLBACKS, _on_begin_headers)
    nghttp2_session_callbacks_set_on_header_callback(_CALLBACKS, _on_header)
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(_CALLBACKS, _on_data_chunk)
    nghttp2_session_callbacks_set_on_frame_recv_callback(_CALLBACKS, _on_frame_recv)
    nghttp2_session_callbacks_set_on_frame_send_callback(_CALLBACKS, _on_frame_send)
    nghttp2_session_callbacks_set_on_stream_close_callback(_CALLBACKS, _on_stream_close)
    # The connection window is ours to reopen (see the module docstring).
    nghttp2_option_set_no_auto_window_update(_OPTION, 1)
    # Closed streams are forgotten at once: memory follows the open streams only.
    nghttp2_option_set_no_closed_streams(_OPTION, 1)
    # nghttp2's defaults, stated: 1000 queued PING/SETTINGS ACKs, 32 entries per SETTINGS
    # frame, 8 CONTINUATION frames per header block, and the CVE-2023-44487 bucket of 1000
    # RST_STREAM, refilled at 33 per second; past any of them the connection gets GOAWAY.
    nghttp2_option_set_max_outbound_ack(_OPTION, 1000)
    nghttp2_option_set_max_settings(_OPTION, 32)
    nghttp2_option_set_max_continuations(_OPTION, 8)
    nghttp2_option_set_stream_reset_rate_limit(_OPTION, 1000, 33)


_init_library()
