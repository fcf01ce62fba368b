# cython: language_level=3
"""The gRPC server side of one HTTP/2 connection over libnghttp2, with no I/O.

As httptools is to HTTP/1.1: the asyncio Protocol around it (`transport/h2.py`) hands it the
bytes it reads (`receive`) and writes the bytes it returns (`receive`, `flush`), at most one
`transport.write` per event-loop iteration. nghttp2 does the HTTP/2 framing and its RFC 9113
checks (preface, frame sizes, stream states, pseudo-headers, flow control, the rapid-reset and
CONTINUATION limits); this module adds the flood bounds nghttp2 lacks (`_meter`: frames that
do no work, header block bytes), the RFC 9113 connection errors it leaves to its user (HEADERS
on a used stream id, an overflowing INITIAL_WINDOW_SIZE), and gRPC's request rules as grpc-go
applies them
(:method POST, content-type application/grpc[+-;...], grpc-timeout, grpc-encoding, the
5-byte message prefix, the receive size limit) and answers a malformed call itself, so the
Python side sees only well-formed unary messages: `on_request(stream)` with `stream.path`
and `stream.message`. Replies go back with `respond` (message + OK trailers),
`send_message` / `finish` (server streaming, errors), from the callback or later.

Memory stays bounded per connection: request bytes are acknowledged to the peer's
connection window only once the call is answered (or its bytes discarded), so one connection
holds at most `connection_window` bytes of request bodies, buffered or being decided; a
message whose prefix announces more than `max_message` bytes is refused before it is read;
an answered call drops its request at once, and a reply the peer does not let out is visible
(`Stream.sending_since`) so the transport can reset it (`reset`).

Across connections, the bytes held for clients are charged to the process's `buffers`
(`take`/`give`, `refusal`): requests still incomplete when a read has been processed (a head
waiting for its body, a partial body: refused RESOURCE_EXHAUSTED when they do not fit),
requests the transport `hold`s while an asynchronous decision runs, and replies still
waiting for the peer's flow-control window once written out (reset with CANCEL when they do
not fit). A request read whole and answered within the read, and a reply that leaves at
once, the usual cases, are never charged: the hot path makes no call for them.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from ratelimitd.transport._nghttp2 cimport *

from ratelimitd import grpcstatus

# The gRPC status codes the core itself answers with (declared once, in grpcstatus.py).
cdef int OK = grpcstatus.OK
cdef int UNKNOWN = grpcstatus.UNKNOWN
cdef int INVALID_ARGUMENT = grpcstatus.INVALID_ARGUMENT
cdef int RESOURCE_EXHAUSTED = grpcstatus.RESOURCE_EXHAUSTED
cdef int UNIMPLEMENTED = grpcstatus.UNIMPLEMENTED
cdef int INTERNAL = grpcstatus.INTERNAL

DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024  # grpc-go's default receive limit
DEFAULT_MAX_HEADER_LIST = 64 * 1024
# What an incomplete request costs besides its header and body bytes (its Stream, nghttp2's
# stream state), as charged to the process's request buffers.
STREAM_COST = 1024

# Flood bounds, past which a connection gets GOAWAY ENHANCE_YOUR_CALM and is closed, as
# nghttp2 ends PING, SETTINGS and RST_STREAM floods and Envoy its own (see `_meter`).
# Frames that make no progress (empty DATA, PRIORITY, WINDOW_UPDATE, extension frames)
# since the last one that did (HEADERS, DATA with a payload, a DATA frame of ours): Envoy
# allows 100 PRIORITY frames per stream. A client alone on a core once held it at 100 %
# with empty DATA frames, and another client's decisions went from 0.9 ms to 39-98 ms.
IDLE_FRAMES = 100
# Header block bytes (HEADERS and CONTINUATION payloads, as sent: compressed) per connection,
# a budget refilled at HEADER_BYTES_PER_SECOND up to HEADER_BYTES_BURST. Decoding costs up
# to one header field per byte whatever happens to the fields (refused streams, lists over
# MAX_HEADER_LIST_SIZE are still decoded whole to keep the HPACK state), so this bounds the
# decoding work a connection can ask for: 5,553 HPACK bomb blocks of 147 KB in 10 s on one
# connection once took another client's /json from 1 ms to 99 ms (p50). 1 MiB/s is 7,000
# calls a second with 150-byte heads (a trace context, never indexed), and HPACK makes
# most heads of a connection 20 to 40 bytes.
HEADER_BYTES_BURST = 1 << 20
HEADER_BYTES_PER_SECOND = 1 << 20
# Header block bytes each call the application answers gives back: a head up to this size
# rides on the call it asks for, so a busy connection is never taken for a header flood
# (docs/flood-protection.md, "Why answered calls refill it").
HEADER_BYTES_PER_CALL = 256
cdef double _HEADER_BYTES_PER_CALL = HEADER_BYTES_PER_CALL
# The HTTP/2 client preface, the 24 bytes that precede the first frame.
cdef Py_ssize_t _PREFACE_LENGTH = 24

# The PING payload that times the second GOAWAY of a graceful shutdown.
cdef bytes _SHUTDOWN_PING = b"rlsdrain"

cdef bytes _STATUS_200 = b"200"
cdef bytes _CONTENT_TYPE_GRPC = b"application/grpc"


# The Stream, and the helpers of the framing (a textual include, as uvloop splits loop.pyx).
include "_h2_stream.pxi"


cdef nghttp2_session_callbacks* _CALLBACKS = NULL
cdef nghttp2_option* _OPTION = NULL


cdef class Connection:
    """The server side of one HTTP/2 connection carrying gRPC calls."""

    cdef nghttp2_session* session
    cdef readonly dict streams
    cdef object on_request, on_close
    cdef object metadata_names
    # Paths served as bidirectional streams (`_h2_streaming.pxi`), or None.
    cdef object streaming
    # The :path and content-type last received, given to the next stream that sends the
    # same bytes (`_same`).
    cdef bytes last_path, last_type
    cdef Py_ssize_t max_message, max_header_list
    cdef object error
    cdef bint dead, draining
    cdef uint8_t* out_buf
    cdef size_t out_cap
    # The process's buffers for incomplete requests (take/give/refusal), or None.
    cdef object buffers
    # Streams that may still be incomplete once the current read is processed, and streams
    # whose reply may still be waiting for the peer's window once flushed.
    cdef list pending
    cdef list unsent
    # True once the client's preface and first SETTINGS arrived.
    cdef readonly bint established
    # CLOCK_MONOTONIC seconds since the connection has had no open stream (its creation,
    # or its last stream's close); meaningful only while `streams` is empty.
    cdef readonly double idle_since
    # The frame meter (`_meter`): bytes of the current frame's payload (or of the preface)
    # still to pass, the frame header being read, the frames without progress since the
    # last with some, and the header block bytes the connection may still send (refilled
    # as of `header_refilled`).
    cdef Py_ssize_t meter_skip
    cdef uint8_t meter_head[9]
    cdef int meter_have
    cdef int idle_frames
    cdef int idle_limit
    cdef double header_credit
    cdef double header_burst
    cdef double header_rate
    cdef double header_refilled
    # The highest stream id a HEADERS frame named, and the connection error a callback
    # asked for (0: none; then nghttp2's failure decides).
    cdef int32_t last_stream_id
    cdef uint32_t fatal_code
    # When a SETTINGS frame begins with streams open: the widest of their send windows and
    # the peer's INITIAL_WINDOW_SIZE until then (-1: no stream was open).
    cdef int64_t settings_window
    cdef int64_t settings_initial

    def __cinit__(self):
        self.session = NULL
        self.out_buf = NULL
        self.out_cap = 0

    def __init__(
        self,
        on_request,
        on_close=None,
        *,
        int max_concurrent_streams=100,
        Py_ssize_t max_message=DEFAULT_MAX_MESSAGE,
        Py_ssize_t max_header_list=DEFAULT_MAX_HEADER_LIST,
        int connection_window=0,
        metadata=(),
        buffers=None,
        int idle_frames=IDLE_FRAMES,
        double header_bytes_burst=HEADER_BYTES_BURST,
        double header_bytes_per_second=HEADER_BYTES_PER_SECOND,
        streaming=(),
    ):
        cdef nghttp2_settings_entry iv[2]
        self.streams = {}
        self.meter_skip = _PREFACE_LENGTH
        self.idle_limit = idle_frames
        self.header_credit = self.header_burst = header_bytes_burst
        self.header_rate = header_bytes_per_second
        self.settings_window = -1
        self.buffers = buffers
        self.pending = []
        self.unsent = []
        self.idle_since = self.header_refilled = _monotonic()
        self.on_request = on_request
        self.on_close = on_close
        self.metadata_names = frozenset(m.encode("ascii") for m in metadata) or None
        self.streaming = frozenset(streaming) or None
        self.max_message = max_message
        self.max_header_list = max_header_list
        self.error = None
        if nghttp2_session_server_new2(&self.session, _CALLBACKS, <void*>self, _OPTION) != 0:
            raise H2Error("cannot create an nghttp2 session")
        iv[0].settings_id = NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS
        iv[0].value = max_concurrent_streams
        iv[1].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
        iv[1].value = <uint32_t>max_header_list
        nghttp2_submit_settings(self.session, NGHTTP2_FLAG_NONE, iv, 2)
        if connection_window <= 0:
            # Room for one maximal message plus many small calls in flight.
            connection_window = <int>min(max_message + 5 + (1 << 20), 0x7FFFFFFF)
        nghttp2_session_set_local_window_size(
            self.session, NGHTTP2_FLAG_NONE, 0, connection_window
        )

    def __dealloc__(self):
        if self.session != NULL:
            nghttp2_session_del(self.session)
            self.session = NULL
        free(self.out_buf)

    # -- bytes in, bytes out ---------------------------------------------------------------

    def receive(self, bytes data):
        """Process bytes read from the peer; the bytes to write back (b"" if none)."""
        cdef ssize_t rv
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t cut
        if self.dead:
            return b""
        # The frames up to the one that passes a flood bound are processed, that one and
        # the rest are not.
        cut = _meter(self, p, n)
        rv = nghttp2_session_mem_recv(self.session, p, n if cut < 0 else cut)
        self._raise_stored()
        if rv < 0:
            self._fatal(rv)
        elif cut >= 0:
            self._terminate(NGHTTP2_ENHANCE_YOUR_CALM)
        elif self.pending:
            _charge_pending(self)
        return self.flush()

    def flush(self):
        """The frames nghttp2 has queued (replies, acks, GOAWAY), as one bytes object."""
        cdef size_t used
        if self.session == NULL:
            return b""
        used = self._send(0)
        if self.unsent and self.buffers is not None and _charge_unsent(self):
            used = self._send(used)  # the resets of replies the buffers had no room for
        if used == 0:
            return b""
        return PyBytes_FromStringAndSize(<char*>self.out_buf, used)

    cdef size_t _send(self, size_t used) except? 0:
        """Append what nghttp2 has queued to the output buffer after `used` bytes."""
        cdef const uint8_t* chunk
        cdef ssize_t n
        cdef uint8_t* grown
        while True:
            n = nghttp2_session_mem_send(self.session, &chunk)
            if n <= 0:
                if n < 0:
                    self.dead = True
                break
            if used + n > self.out_cap:
                grown = <uint8_t*>realloc(self.out_buf, max(used + n, self.out_cap * 2, 16384))
                if grown == NULL:
                    raise MemoryError()
                self.out_buf = grown
                self.out_cap = max(used + n, self.out_cap * 2, 16384)
            memcpy(self.out_buf + used, chunk, n)
            used += n
        self._raise_stored()
        return used

    @property
    def wants_close(self):
        """True when the connection is finished: fatal error, or GOAWAY done and drained."""
        if self.dead or self.session == NULL:
            return True
        return not nghttp2_session_want_read(self.session) and not nghttp2_session_want_write(
            self.session
        )

    @property
    def failed(self):
        """True once the connection hit a fatal error (its GOAWAY may still be queued)."""
        return self.dead

    @property
    def draining(self):
        """True once a GOAWAY (graceful or final) was submitted."""
        return self.draining

    cdef void _raise_stored(self) except *:
        if self.error is not None:
            err = self.error
            self.error = None
            raise err

    cdef void _fatal(self, ssize_t rv):
        if rv == NGHTTP2_ERR_BAD_CLIENT_MAGIC:
            self._terminate(NGHTTP2_PROTOCOL_ERROR)
        elif rv == NGHTTP2_ERR_FLOODED:
            self._terminate(NGHTTP2_ENHANCE_YOUR_CALM)
        elif rv == NGHTTP2_ERR_CALLBACK_FAILURE and self.fatal_code:
            self._terminate(self.fatal_code)  # a connection error a callback found
        else:
            self._terminate(NGHTTP2_INTERNAL_ERROR)

    cdef void _terminate(self, uint32_t error_code):
        """The final GOAWAY with `error_code`."""
        nghttp2_session_terminate_session(self.session, error_code)
        self.draining = True
        # What is queued (the GOAWAY) is still flushed; nothing more is read.
        self.dead = True

    # -- replies ---------------------------------------------------------------------------

    def respond(self, Stream stream, bytes message):
        """Answer a unary call: headers, the message, trailers with grpc-status 0."""
        if stream.answered or stream.closed or self.session == NULL:
            return False
        stream.answered = True
        stream.finishing = True
        stream.status = OK
        _header_refund(self)
        stream.out = _frame(message)
        stream.out_pos = 0
        self._answered(stream)
        if stream.headers_sent:
            self._resume(stream)
        else:
            self._submit_headers(stream)
        return True

    def send_message(self, Stream stream, bytes message):
        """Send one message of a server-streaming reply (headers first if not yet sent)."""
        if stream.answered or stream.closed or self.session == NULL:
            return False
        framed = _frame(message)
        if stream.out is None:
            stream.out = framed
        else:
            stream.out = stream.out[stream.out_pos:] + framed
        stream.out_pos = 0
        if stream.sending_since == 0.0:
            stream.sending_since = _monotonic()
        _unsent(self, stream)
        if stream.headers_sent:
            self._resume(stream)
        else:
            self._submit_headers(stream)
        return True

    def finish(self, Stream stream, int code, str message=""):
        """End a call with a status; a call with no message yet gets a trailers-only reply."""
        if stream.answered or stream.closed or self.session == NULL:
            return False
        stream.answered = True
        _header_refund(self)
        if not stream.headers_sent:
            self._trailers_only(stream, _STATUS_200, code, message)
            return True
        stream.finishing = True
        stream.status = code
        stream.status_message = percent_encode(message) if message else None
        self._answered(stream)
        self._resume(stream)
        return True

    def reset(self, Stream stream, uint32_t error_code=NGHTTP2_CANCEL):
        """RST_STREAM a call (a reply the peer never let out); its bytes are freed."""
        if stream.closed or self.session == NULL:
            return False
        stream.answered = True
        stream.out = None
        stream.sending_since = 0.0
        nghttp2_submit_rst_stream(self.session, NGHTTP2_FLAG_NONE, stream.id, error_code)
        self._release(stream)
        return True

    cdef void _answered(self, Stream stream) except *:
        """The reply is queued: the request is dropped; the reply now waits for the peer's
        window."""
        self._drop_request(stream)
        if stream.sending_since == 0.0:
            stream.sending_since = _monotonic()
        _unsent(self, stream)

    def hold(self, Stream stream, Py_ssize_t extra=0):
        """Charge a dispatched call's request (and `extra` bytes: its decoded form) to the
        buffers while its decision runs (given back when it is answered); False, and
        nothing charged, when it does not fit."""
        return _hold(self, stream, extra)

    @property
    def refusal(self):
        """What a call the buffers have no room for is answered (RESOURCE_EXHAUSTED)."""
        return self.buffers.refusal

    cdef void _submit_headers(self, Stream stream):
        cdef nghttp2_nv nva[2]
        cdef nghttp2_data_provider provider
        _nv(&nva[0], b":status", _STATUS_200)
        _nv(&nva[1], b"content-type", _CONTENT_TYPE_GRPC)
        provider.source.ptr = <void*>stream
        provider.read_callback = _read_callback
        stream.headers_sent = True
        nghttp2_submit_response(self.session, stream.id, nva, 2, &provider)

    cdef void _resume(self, Stream stream):
        if stream.deferred:
            stream.deferred = False
            nghttp2_session_resume_data(self.session, stream.id)

    cdef void _trailers_only(self, Stream stream, bytes http_status, int code, str message,
                             bytes extra_name=None, bytes extra_value=None):
        cdef nghttp2_nv nva[5]
        cdef size_t n = 3
        cdef bytes code_text = str(code).encode()
        cdef bytes encoded
        stream.answered = True
        stream.headers_sent = True
        _nv(&nva[0], b":status", http_status)
        _nv(&nva[1], b"content-type", _CONTENT_TYPE_GRPC)
        _nv(&nva[2], b"grpc-status", code_text)
        if message:
            encoded = percent_encode(message)
            _nv(&nva[n], b"grpc-message", encoded)
            n += 1
        if extra_name is not None:
            _nv(&nva[n], extra_name, extra_value)
            n += 1
        nghttp2_submit_response(self.session, stream.id, nva, n, NULL)
        self._release(stream)

    cdef void _release(self, Stream stream) except *:
        """Drop the stream's request, and whatever more of it arrives."""
        stream.body = None
        stream.discard = True
        self._drop_request(stream)

    cdef void _drop_request(self, Stream stream) except *:
        """The request is no longer needed: its bytes go back to the connection window and
        to the buffers."""
        stream.message = None
        if stream.held:
            nghttp2_session_consume_connection(self.session, stream.held)
            stream.held = 0
        if stream.charged:
            _uncharge(self, stream)

    # -- GOAWAY ----------------------------------------------------------------------------

    def shutdown(self):
        """Graceful GOAWAY: a notice now, the final GOAWAY once a PING round trip shows the
        peer has seen it (streams it opened meanwhile are still served)."""
        if self.draining or self.session == NULL:
            return
        self.draining = True
        nghttp2_submit_shutdown_notice(self.session)
        nghttp2_submit_ping(self.session, NGHTTP2_FLAG_NONE,
                            <const uint8_t*>PyBytes_AS_STRING(_SHUTDOWN_PING))

    def goaway(self, uint32_t error_code=NGHTTP2_NO_ERROR):
        """The final GOAWAY: streams after the last one processed are refused."""
        if self.session == NULL:
            return
        self.draining = True
        nghttp2_submit_goaway(
            self.session, NGHTTP2_FLAG_NONE,
            nghttp2_session_get_last_proc_stream_id(self.session), error_code, NULL, 0,
        )

    # -- request side (called from the nghttp2 callbacks) ---------------------------------

    cdef int _begin_headers(self, const nghttp2_frame* frame) except -1:
        cdef Stream stream
        if frame.headers.cat != NGHTTP2_HCAT_REQUEST:
            return 0
        stream = Stream.__new__(Stream)
        stream.id = frame.hd.stream_id
        stream.started = _monotonic()
        self.streams[stream.id] = stream
        nghttp2_session_set_stream_user_data(self.session, stream.id, <void*>stream)
        return 0

    cdef int _header(self, Stream stream, const uint8_t* name, size_t namelen,
                     const uint8_t* value, size_t valuelen) except -1:
        """Keep what the call needs of one header; 1 once the header list is over its limit.

        Then the stream is reset with FRAME_SIZE_ERROR, as grpc-go resets a truncated
        header list, and nghttp2 is told to stop delivering the rest of the block: an HPACK
        bomb of 143,000 references to one 4,000-byte header once cost ~100 ms of loop time
        per block, every reference checked and delivered after the limit was passed.
        """
        stream.header_bytes += namelen + valuelen + 32
        if stream.header_bytes > self.max_header_list:
            if not stream.answered:
                # Ours goes first: nghttp2 adds no RST_STREAM of its own to a closing stream.
                self.reset(stream, NGHTTP2_FRAME_SIZE_ERROR)
            return 1
        if namelen == 5 and memcmp(name, b":path", 5) == 0:
            stream.path = self.last_path = _same(self.last_path, value, valuelen)
        elif namelen == 7 and memcmp(name, b":method", 7) == 0:
            if not (valuelen == 4 and memcmp(value, b"POST", 4) == 0):
                stream.method = PyBytes_FromStringAndSize(<const char*>value, valuelen)
        elif namelen == 12 and memcmp(name, b"content-type", 12) == 0:
            stream.content_type = self.last_type = _same(self.last_type, value, valuelen)
        elif namelen == 12 and memcmp(name, b"grpc-timeout", 12) == 0:
            stream.timeout = _parse_timeout(value, valuelen, stream)
        elif namelen == 13 and memcmp(name, b"grpc-encoding", 13) == 0:
            if not (valuelen == 8 and memcmp(value, b"identity", 8) == 0):
                stream.encoding = PyBytes_FromStringAndSize(<const char*>value, valuelen)
        elif self.metadata_names is not None and namelen and name[0] != 58:  # ':'
            key = PyBytes_FromStringAndSize(<const char*>name, namelen)
            if key in self.metadata_names:
                if stream.metadata is None:
                    stream.metadata = []
                stream.metadata.append(
                    (key.decode("latin-1"), (<bytes>value[:valuelen]).decode("latin-1"))
                )
        return 0

    cdef int _headers_done(self, Stream stream) except -1:
        """The request head is complete: refuse a call grpc-go would refuse."""
        cdef bytes ct = stream.content_type
        if stream.answered:
            return 0
        if stream.method is not None:
            self._trailers_only(
                stream, b"405", INTERNAL,
                'Received a HEADERS frame with :method "%s" which should be POST'
                % stream.method.decode("latin-1"),
            )
        elif ct is None or not (
            ct.startswith(b"application/grpc")
            and (len(ct) == 16 or ct[16] in b"+;")
        ):
            self._trailers_only(
                stream, b"415", INVALID_ARGUMENT,
                'invalid gRPC request content-type "%s"'
                % ("" if ct is None else ct.decode("latin-1")),
            )
        elif stream.timeout_error is not None:
            self._trailers_only(stream, b"400", INTERNAL,
                                "malformed grpc-timeout: " + stream.timeout_error)
        elif stream.encoding is not None:
            self._trailers_only(
                stream, _STATUS_200, UNIMPLEMENTED,
                'grpc: Decompressor is not installed for grpc-encoding "%s"'
                % stream.encoding.decode("latin-1"),
                b"grpc-accept-encoding", b"identity",
            )
        elif self.streaming is not None and stream.path in self.streaming:
            _open_streaming(self, stream)
        else:
            _watch(self, stream)  # usually read whole before this read ends: no charge
        return 0

    cdef int _data(self, Stream stream, const uint8_t* data, size_t n) except -1:
        cdef Py_ssize_t have, length
        cdef const uint8_t* head
        # The stream window is reopened at once; the connection window only when the
        # message is handed over (see the module docstring).
        nghttp2_session_consume_stream(self.session, stream.id, n)
        if stream.discard or stream.answered:
            nghttp2_session_consume_connection(self.session, n)
            return 0
        if stream.streaming:
            return _streaming_data(self, stream, data, n)
        stream.held += n
        if stream.body is None and stream.message is None and n >= 5 and stream.expected < 0:
            # The usual case: the whole message in one chunk, no copy into a buffer.
            length = _prefix_length(data)
            if not self._check_prefix(stream, data[0], length):
                return 0
            if <size_t>length + 5 == n:
                stream.message = PyBytes_FromStringAndSize(<const char*>data + 5, length)
                return 0
        if stream.message is not None:
            self._unary_violation(stream)
            return 0
        _watch(self, stream)
        if stream.body is None:
            stream.body = bytearray()
        stream.body += (<bytes>data[:n]) if n else b""
        have = len(stream.body)
        if stream.expected < 0 and have >= 5:
            head = <const uint8_t*><char*>stream.body
            length = _prefix_length(head)
            if not self._check_prefix(stream, head[0], length):
                return 0
        if stream.expected >= 0 and have > stream.expected + 5:
            self._unary_violation(stream)
        else:
            _watch(self, stream)
        return 0

    cdef bint _check_prefix(self, Stream stream, uint8_t flag, Py_ssize_t length) except -1:
        if flag > 1:
            self._trailers_only(stream, _STATUS_200, INTERNAL,
                                "grpc: received unexpected payload format %d" % flag)
            return False
        if flag == 1:
            self._trailers_only(stream, _STATUS_200, INTERNAL,
                                "grpc: compressed flag set with identity or empty encoding")
            return False
        if length > self.max_message:
            self._trailers_only(
                stream, _STATUS_200, RESOURCE_EXHAUSTED,
                "grpc: received message larger than max (%d vs. %d)" % (length, self.max_message),
            )
            return False
        stream.expected = length
        return True

    cdef void _unary_violation(self, Stream stream) except *:
        self._trailers_only(stream, _STATUS_200, INTERNAL,
                            "grpc: received more than one request message on a unary call")

    cdef int _end_of_request(self, Stream stream) except -1:
        cdef bytearray body
        if stream.streaming:
            return _streaming_end(self, stream)
        if stream.answered or stream.dispatched:
            return 0
        if stream.message is None:
            body = stream.body
            if body is None or len(body) == 0:
                # grpc-go: io.EOF from recvMsg, converted to a status.
                self._trailers_only(stream, _STATUS_200, UNKNOWN, "EOF")
                return 0
            if stream.expected < 0 or len(body) < stream.expected + 5:
                self._trailers_only(stream, _STATUS_200, INTERNAL, "unexpected EOF")
                return 0
            stream.message = bytes(body[5:])
        stream.dispatched = True
        stream.body = None
        if stream.charged:
            _uncharge(self, stream)
        # The connection window reopens when the call is answered (`_answered`), so one
        # connection holds at most one window of requests, buffered or being decided.
        self.on_request(stream)
        return 0

    cdef int _closed(self, int32_t stream_id) except -1:
        cdef Stream stream = self.streams.pop(stream_id, None)
        if stream is None:
            return 0
        stream.closed = True
        stream.out = None
        stream.sending_since = 0.0
        self._release(stream)
        if not self.streams:
            self.idle_since = _monotonic()
        if stream.dispatched and not stream.answered and self.on_close is not None:
            self.on_close(stream)
        stream.work = None
        return 0


# Frames without progress and header block bytes, counted ahead of nghttp2.
include "_h2_meter.pxi"


# What a connection charges to the process's buffers.
include "_h2_buffers.pxi"


# Bidirectional streams: messages handed over one by one as they arrive.
include "_h2_streaming.pxi"


# The nghttp2 callbacks and the library set-up (a textual include, as uvloop splits loop.pyx).
include "_h2_callbacks.pxi"
