/* The part of libnghttp2's ABI that _h2 uses, declared here so that the HTTP/2 core builds
 * against the runtime library alone (libnghttp2.so.14, Debian's libnghttp2-14) with no
 * development headers: a wheel or an image build needs no libnghttp2-dev.
 *
 * Every declaration below is copied from nghttp2/nghttp2.h (1.52, with the two option
 * setters Debian 12 backported and upstream has had since 1.57 and 1.61). The soname has
 * been libnghttp2.so.14 since nghttp2 1.0 and upstream keeps it ABI-stable, so these layouts
 * do not move. tests/core/test_nghttp2_abi.py compiles them next to the real header when it
 * is installed: the struct sizes and offsets, the constants and every prototype must agree.
 */
#ifndef RATELIMITD_NGHTTP2_H
#define RATELIMITD_NGHTTP2_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifndef RATELIMITD_NGHTTP2_PROTOTYPES_ONLY

typedef struct nghttp2_session nghttp2_session;
typedef struct nghttp2_session_callbacks nghttp2_session_callbacks;
typedef struct nghttp2_option nghttp2_option;

typedef struct {
  size_t length;
  int32_t stream_id;
  uint8_t type;
  uint8_t flags;
  uint8_t reserved;
} nghttp2_frame_hd;

typedef struct {
  uint8_t *name;
  uint8_t *value;
  size_t namelen;
  size_t valuelen;
  uint8_t flags;
} nghttp2_nv;

typedef struct {
  int32_t stream_id;
  int32_t weight;
  uint8_t exclusive;
} nghttp2_priority_spec;

typedef enum {
  NGHTTP2_HCAT_REQUEST = 0,
  NGHTTP2_HCAT_RESPONSE = 1,
  NGHTTP2_HCAT_PUSH_RESPONSE = 2,
  NGHTTP2_HCAT_HEADERS = 3
} nghttp2_headers_category;

typedef struct {
  nghttp2_frame_hd hd;
  size_t padlen;
  nghttp2_priority_spec pri_spec;
  nghttp2_nv *nva;
  size_t nvlen;
  nghttp2_headers_category cat;
} nghttp2_headers;

typedef struct {
  nghttp2_frame_hd hd;
  uint8_t opaque_data[8];
} nghttp2_ping;

/* The library's union has every frame type; _h2 reads only these members, each of which
 * starts at offset 0 like all of them, and only through pointers the library hands it. */
typedef union {
  nghttp2_frame_hd hd;
  nghttp2_headers headers;
  nghttp2_ping ping;
} nghttp2_frame;

typedef union {
  int fd;
  void *ptr;
} nghttp2_data_source;

typedef ssize_t (*nghttp2_data_source_read_callback)(
    nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
    uint32_t *data_flags, nghttp2_data_source *source, void *user_data);

typedef struct {
  nghttp2_data_source source;
  nghttp2_data_source_read_callback read_callback;
} nghttp2_data_provider;

typedef struct {
  int32_t settings_id;
  uint32_t value;
} nghttp2_settings_entry;

typedef int (*nghttp2_on_begin_frame_callback)(nghttp2_session *session,
                                               const nghttp2_frame_hd *hd, void *user_data);
typedef int (*nghttp2_on_begin_headers_callback)(nghttp2_session *session,
                                                 const nghttp2_frame *frame,
                                                 void *user_data);
typedef int (*nghttp2_on_header_callback)(nghttp2_session *session,
                                          const nghttp2_frame *frame,
                                          const uint8_t *name, size_t namelen,
                                          const uint8_t *value, size_t valuelen,
                                          uint8_t flags, void *user_data);
typedef int (*nghttp2_on_data_chunk_recv_callback)(nghttp2_session *session,
                                                   uint8_t flags, int32_t stream_id,
                                                   const uint8_t *data, size_t len,
                                                   void *user_data);
typedef int (*nghttp2_on_frame_recv_callback)(nghttp2_session *session,
                                              const nghttp2_frame *frame,
                                              void *user_data);
typedef int (*nghttp2_on_frame_send_callback)(nghttp2_session *session,
                                              const nghttp2_frame *frame,
                                              void *user_data);
typedef int (*nghttp2_on_stream_close_callback)(nghttp2_session *session,
                                                int32_t stream_id, uint32_t error_code,
                                                void *user_data);

/* Frame types, flags, settings, error codes and library errors: only those _h2 uses. */
enum { NGHTTP2_DATA = 0, NGHTTP2_HEADERS = 1, NGHTTP2_PRIORITY = 2, NGHTTP2_SETTINGS = 4,
       NGHTTP2_PING = 6, NGHTTP2_WINDOW_UPDATE = 8, NGHTTP2_CONTINUATION = 9 };

enum { NGHTTP2_FLAG_NONE = 0, NGHTTP2_FLAG_END_STREAM = 0x01, NGHTTP2_FLAG_ACK = 0x01 };

enum { NGHTTP2_DATA_FLAG_EOF = 0x01, NGHTTP2_DATA_FLAG_NO_END_STREAM = 0x02 };

enum { NGHTTP2_NV_FLAG_NONE = 0 };

typedef enum {
  NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS = 0x03,
  NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE = 0x04,
  NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE = 0x06
} nghttp2_settings_id;

enum { NGHTTP2_NO_ERROR = 0x00, NGHTTP2_PROTOCOL_ERROR = 0x01, NGHTTP2_INTERNAL_ERROR = 0x02,
       NGHTTP2_FLOW_CONTROL_ERROR = 0x03, NGHTTP2_FRAME_SIZE_ERROR = 0x06, NGHTTP2_CANCEL = 0x08,
       NGHTTP2_ENHANCE_YOUR_CALM = 0x0b };

enum { NGHTTP2_ERR_DEFERRED = -508, NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE = -521,
       NGHTTP2_ERR_CALLBACK_FAILURE = -902, NGHTTP2_ERR_BAD_CLIENT_MAGIC = -903,
       NGHTTP2_ERR_FLOODED = -904 };

#endif /* RATELIMITD_NGHTTP2_PROTOTYPES_ONLY */

int nghttp2_session_callbacks_new(nghttp2_session_callbacks **callbacks_ptr);
void nghttp2_session_callbacks_del(nghttp2_session_callbacks *callbacks);
/* nghttp2_session_callbacks_set_on_<event>_callback, one per callback _h2 sets. */
#define RATELIMITD_NGHTTP2_SETTER(event)                  \
  void nghttp2_session_callbacks_set_on_##event##_callback( \
      nghttp2_session_callbacks *cbs, nghttp2_on_##event##_callback on_##event##_callback)
RATELIMITD_NGHTTP2_SETTER(begin_frame);
RATELIMITD_NGHTTP2_SETTER(begin_headers);
RATELIMITD_NGHTTP2_SETTER(header);
RATELIMITD_NGHTTP2_SETTER(data_chunk_recv);
RATELIMITD_NGHTTP2_SETTER(frame_recv);
RATELIMITD_NGHTTP2_SETTER(frame_send);
RATELIMITD_NGHTTP2_SETTER(stream_close);
#undef RATELIMITD_NGHTTP2_SETTER

int nghttp2_option_new(nghttp2_option **option_ptr);
void nghttp2_option_del(nghttp2_option *option);
void nghttp2_option_set_no_auto_window_update(nghttp2_option *option, int val);
void nghttp2_option_set_max_outbound_ack(nghttp2_option *option, size_t val);
void nghttp2_option_set_max_settings(nghttp2_option *option, size_t val);
void nghttp2_option_set_no_closed_streams(nghttp2_option *option, int val);
void nghttp2_option_set_stream_reset_rate_limit(nghttp2_option *option, uint64_t burst,
                                                uint64_t rate);
void nghttp2_option_set_max_continuations(nghttp2_option *option, size_t val);

int nghttp2_session_server_new2(nghttp2_session **session_ptr,
                                const nghttp2_session_callbacks *callbacks, void *user_data,
                                const nghttp2_option *option);
void nghttp2_session_del(nghttp2_session *session);
ssize_t nghttp2_session_mem_recv(nghttp2_session *session, const uint8_t *in, size_t inlen);
ssize_t nghttp2_session_mem_send(nghttp2_session *session, const uint8_t **data_ptr);
int nghttp2_session_want_read(nghttp2_session *session);
int nghttp2_session_want_write(nghttp2_session *session);
int nghttp2_session_resume_data(nghttp2_session *session, int32_t stream_id);
int nghttp2_session_consume(nghttp2_session *session, int32_t stream_id, size_t size);
int nghttp2_session_consume_connection(nghttp2_session *session, size_t size);
int nghttp2_session_consume_stream(nghttp2_session *session, int32_t stream_id, size_t size);
int nghttp2_session_set_local_window_size(nghttp2_session *session, uint8_t flags,
                                          int32_t stream_id, int32_t window_size);
int nghttp2_session_set_stream_user_data(nghttp2_session *session, int32_t stream_id,
                                         void *stream_user_data);
void *nghttp2_session_get_stream_user_data(nghttp2_session *session, int32_t stream_id);
int nghttp2_session_get_stream_remote_close(nghttp2_session *session, int32_t stream_id);
int32_t nghttp2_session_get_last_proc_stream_id(nghttp2_session *session);
int32_t nghttp2_session_get_stream_remote_window_size(nghttp2_session *session,
                                                      int32_t stream_id);
uint32_t nghttp2_session_get_remote_settings(nghttp2_session *session,
                                             nghttp2_settings_id id);
int nghttp2_session_terminate_session(nghttp2_session *session, uint32_t error_code);

int nghttp2_submit_settings(nghttp2_session *session, uint8_t flags,
                            const nghttp2_settings_entry *iv, size_t niv);
int nghttp2_submit_response(nghttp2_session *session, int32_t stream_id, const nghttp2_nv *nva,
                            size_t nvlen, const nghttp2_data_provider *data_prd);
int nghttp2_submit_trailer(nghttp2_session *session, int32_t stream_id, const nghttp2_nv *nva,
                           size_t nvlen);
int nghttp2_submit_rst_stream(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                              uint32_t error_code);
int nghttp2_submit_goaway(nghttp2_session *session, uint8_t flags, int32_t last_stream_id,
                          uint32_t error_code, const uint8_t *opaque_data,
                          size_t opaque_data_len);
int nghttp2_submit_shutdown_notice(nghttp2_session *session);
int nghttp2_submit_ping(nghttp2_session *session, uint8_t flags, const uint8_t *opaque_data);
const char *nghttp2_strerror(int lib_error_code);

#endif /* RATELIMITD_NGHTTP2_H */
