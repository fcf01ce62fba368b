# The part of libnghttp2's API (nghttp2/nghttp2.h, 1.52 with Debian's backports) that _h2 uses,
# declared in _nghttp2.h so the build needs the runtime library only (see that file).

from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t


cdef extern from "_nghttp2.h":
    ctypedef struct nghttp2_session:
        pass
    ctypedef struct nghttp2_session_callbacks:
        pass
    ctypedef struct nghttp2_option:
        pass

    ctypedef struct nghttp2_frame_hd:
        size_t length
        int32_t stream_id
        uint8_t type
        uint8_t flags

    ctypedef enum nghttp2_headers_category:
        NGHTTP2_HCAT_REQUEST
        NGHTTP2_HCAT_RESPONSE
        NGHTTP2_HCAT_PUSH_RESPONSE
        NGHTTP2_HCAT_HEADERS

    ctypedef struct nghttp2_headers:
        nghttp2_frame_hd hd
        nghttp2_headers_category cat

    ctypedef struct nghttp2_ping:
        nghttp2_frame_hd hd
        uint8_t opaque_data[8]

    ctypedef union nghttp2_frame:
        nghttp2_frame_hd hd
        nghttp2_headers headers
        nghttp2_ping ping

    ctypedef struct nghttp2_nv:
        uint8_t *name
        uint8_t *value
        size_t namelen
        size_t valuelen
        uint8_t flags

    ctypedef union nghttp2_data_source:
        int fd
        void *ptr

    ctypedef ssize_t (*nghttp2_data_source_read_callback)(
        nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
        uint32_t *data_flags, nghttp2_data_source *source, void *user_data) noexcept

    ctypedef struct nghttp2_data_provider:
        nghttp2_data_source source
        nghttp2_data_source_read_callback read_callback

    ctypedef struct nghttp2_settings_entry:
        int32_t settings_id
        uint32_t value

    enum:
        NGHTTP2_DATA = 0
        NGHTTP2_HEADERS = 1
        NGHTTP2_PRIORITY = 2
        NGHTTP2_SETTINGS = 4
        NGHTTP2_PING = 6
        NGHTTP2_WINDOW_UPDATE = 8
        NGHTTP2_CONTINUATION = 9

        NGHTTP2_FLAG_NONE = 0
        NGHTTP2_FLAG_END_STREAM = 0x01
        NGHTTP2_FLAG_ACK = 0x01

        NGHTTP2_DATA_FLAG_EOF = 0x01
        NGHTTP2_DATA_FLAG_NO_END_STREAM = 0x02

        NGHTTP2_NV_FLAG_NONE = 0

        NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS = 0x03
        NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE = 0x04
        NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE = 0x06

        NGHTTP2_NO_ERROR = 0
        NGHTTP2_PROTOCOL_ERROR = 1
        NGHTTP2_INTERNAL_ERROR = 2
        NGHTTP2_FLOW_CONTROL_ERROR = 3
        NGHTTP2_FRAME_SIZE_ERROR = 6
        NGHTTP2_CANCEL = 8
        NGHTTP2_ENHANCE_YOUR_CALM = 0x0B

        NGHTTP2_ERR_DEFERRED = -508
        NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE = -521
        NGHTTP2_ERR_CALLBACK_FAILURE = -902
        NGHTTP2_ERR_BAD_CLIENT_MAGIC = -903
        NGHTTP2_ERR_FLOODED = -904

    ctypedef int (*nghttp2_on_begin_frame_callback)(
        nghttp2_session *session, const nghttp2_frame_hd *hd, void *user_data) noexcept
    ctypedef int (*nghttp2_on_begin_headers_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept
    ctypedef int (*nghttp2_on_header_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
        size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
        void *user_data) noexcept
    ctypedef int (*nghttp2_on_data_chunk_recv_callback)(
        nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data,
        size_t len, void *user_data) noexcept
    ctypedef int (*nghttp2_on_frame_recv_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept
    ctypedef int (*nghttp2_on_frame_send_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept
    ctypedef int (*nghttp2_on_stream_close_callback)(
        nghttp2_session *session, int32_t stream_id, uint32_t error_code,
        void *user_data) noexcept

    int nghttp2_session_callbacks_new(nghttp2_session_callbacks **callbacks_ptr)
    void nghttp2_session_callbacks_del(nghttp2_session_callbacks *callbacks)
    void nghttp2_session_callbacks_set_on_begin_frame_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_begin_frame_callback cb)
    void nghttp2_session_callbacks_set_on_begin_headers_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_begin_headers_callback cb)
    void nghttp2_session_callbacks_set_on_header_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_header_callback cb)
    void nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_data_chunk_recv_callback cb)
    void nghttp2_session_callbacks_set_on_frame_recv_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_frame_recv_callback cb)
    void nghttp2_session_callbacks_set_on_frame_send_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_frame_send_callback cb)
    void nghttp2_session_callbacks_set_on_stream_close_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_stream_close_callback cb)

    int nghttp2_option_new(nghttp2_option **option_ptr)
    void nghttp2_option_del(nghttp2_option *option)
    void nghttp2_option_set_no_auto_window_update(nghttp2_option *option, int val)
    void nghttp2_option_set_max_outbound_ack(nghttp2_option *option, size_t val)
    void nghttp2_option_set_max_settings(nghttp2_option *option, size_t val)
    void nghttp2_option_set_no_closed_streams(nghttp2_option *option, int val)
    void nghttp2_option_set_stream_reset_rate_limit(
        nghttp2_option *option, uint64_t burst, uint64_t rate)
    void nghttp2_option_set_max_continuations(nghttp2_option *option, size_t val)

    int nghttp2_session_server_new2(
        nghttp2_session **session_ptr, const nghttp2_session_callbacks *callbacks,
        void *user_data, const nghttp2_option *option)
    void nghttp2_session_del(nghttp2_session *session)
    ssize_t nghttp2_session_mem_recv(nghttp2_session *session, const uint8_t *data, size_t inlen)
    ssize_t nghttp2_session_mem_send(nghttp2_session *session, const uint8_t **data_ptr)
    int nghttp2_session_want_read(nghttp2_session *session)
    int nghttp2_session_want_write(nghttp2_session *session)
    int nghttp2_session_resume_data(nghttp2_session *session, int32_t stream_id)
    int nghttp2_session_consume(nghttp2_session *session, int32_t stream_id, size_t size)
    int nghttp2_session_consume_connection(nghttp2_session *session, size_t size)
    int nghttp2_session_consume_stream(
        nghttp2_session *session, int32_t stream_id, size_t size)
    int nghttp2_session_set_local_window_size(
        nghttp2_session *session, uint8_t flags, int32_t stream_id, int32_t window_size)
    int nghttp2_session_set_stream_user_data(
        nghttp2_session *session, int32_t stream_id, void *stream_user_data)
    void *nghttp2_session_get_stream_user_data(nghttp2_session *session, int32_t stream_id)
    int nghttp2_session_get_stream_remote_close(nghttp2_session *session, int32_t stream_id)
    int32_t nghttp2_session_get_last_proc_stream_id(nghttp2_session *session)
    int32_t nghttp2_session_get_stream_remote_window_size(
        nghttp2_session *session, int32_t stream_id)
    uint32_t nghttp2_session_get_remote_settings(nghttp2_session *session, int id)
    int nghttp2_session_terminate_session(nghttp2_session *session, uint32_t error_code)

    int nghttp2_submit_settings(
        nghttp2_session *session, uint8_t flags, const nghttp2_settings_entry *iv, size_t niv)
    int nghttp2_submit_response(
        nghttp2_session *session, int32_t stream_id, const nghttp2_nv *nva, size_t nvlen,
        const nghttp2_data_provider *data_prd)
    int nghttp2_submit_trailer(
        nghttp2_session *session, int32_t stream_id, const nghttp2_nv *nva, size_t nvlen)
    int nghttp2_submit_rst_stream(
        nghttp2_session *session, uint8_t flags, int32_t stream_id, uint32_t error_code)
    int nghttp2_submit_goaway(
        nghttp2_session *session, uint8_t flags, int32_t last_stream_id, uint32_t error_code,
        const uint8_t *opaque_data, size_t opaque_data_len)
    int nghttp2_submit_shutdown_notice(nghttp2_session *session)
    int nghttp2_submit_ping(nghttp2_session *session, uint8_t flags, const uint8_t *opaque_data)
    const char *nghttp2_strerror(int lib_error_code)
