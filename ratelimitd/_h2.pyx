# cython: language_level=3
"""The gRPC server side of one HTTP/2 connection over libnghttp2, with no I/O.

As httptools is to HTTP/1.1: the asyncio Protocol around it (`transport/h2.py`) hands it the
bytes it reads (`receive`) and writes the bytes it returns (`receive`, `flush`), at most one
`transport.write` per event-loop iteration. nghttp2 does the HTTP/2 framing and its RFC 9113
checks (preface, frame sizes, stream states, pseudo-headers, flow control, the rapid-reset and
CONTINUATION limits); this module adds gRPC's request rules as grpc-go applies them
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
from libc.stdint cimport int32_t, uint8_t, uint32_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from ratelimitd._nghttp2 cimport *

# gRPC status codes the core itself answers with.
cdef enum:
    OK = 0
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13

DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024  # grpc-go's default receive limit
DEFAULT_MAX_HEADER_LIST = 64 * 1024
# What an incomplete request costs besides its header and body bytes (its Stream, nghttp2's
# stream state), as charged to the process's request buffers.
STREAM_COST = 1024

# The PING payload that times the second GOAWAY of a graceful shutdown.
cdef bytes _SHUTDOWN_PING = b"rlsdrain"

cdef bytes _STATUS_200 = b"200"
cdef bytes _CONTENT_TYPE_GRPC = b"application/grpc"


class H2Error(Exception):
    """A connection the core could not set up (out of memory)."""


cdef inline double _monotonic() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


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


cdef nghttp2_session_callbacks* _CALLBACKS = NULL
cdef nghttp2_option* _OPTION = NULL


cdef class Connection:
    """The server side of one HTTP/2 connection carrying gRPC calls."""

    cdef nghttp2_session* session
    cdef readonly dict streams
    cdef object on_request
    cdef object on_close
    cdef object metadata_names
    cdef Py_ssize_t max_message
    cdef Py_ssize_t max_header_list
    cdef object error
    cdef bint dead
    cdef bint draining
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
    ):
        cdef nghttp2_settings_entry iv[2]
        self.streams = {}
        self.buffers = buffers
        self.pending = []
        self.unsent = []
        self.idle_since = _monotonic()
        self.on_request = on_request
        self.on_close = on_close
        self.metadata_names = frozenset(m.encode("ascii") for m in metadata) or None
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
        if self.dead:
            return b""
        rv = nghttp2_session_mem_recv(
            self.session, <const uint8_t*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)
        )
        self._raise_stored()
        if rv < 0:
            self._fatal(rv)
        elif self.pending:
            self._charge_pending()
        return self.flush()

    def flush(self):
        """The frames nghttp2 has queued (replies, acks, GOAWAY), as one bytes object."""
        cdef size_t used
        if self.session == NULL:
            return b""
        used = self._send(0)
        if self.unsent and self.buffers is not None and self._charge_unsent():
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
            nghttp2_session_terminate_session(self.session, NGHTTP2_PROTOCOL_ERROR)
        elif rv == NGHTTP2_ERR_FLOODED:
            nghttp2_session_terminate_session(self.session, NGHTTP2_ENHANCE_YOUR_CALM)
        else:
            nghttp2_session_terminate_session(self.session, NGHTTP2_INTERNAL_ERROR)
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
        self._unsent(stream)
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
        self._unsent(stream)

    def hold(self, Stream stream, Py_ssize_t extra=0):
        """Charge a dispatched call's request (and `extra` bytes: its decoded form) to the
        buffers while its decision runs (given back when it is answered); False, and
        nothing charged, when it does not fit."""
        cdef Py_ssize_t need = STREAM_COST + stream.header_bytes + extra
        if self.buffers is None:
            return True
        if stream.message is not None:
            need += PyBytes_GET_SIZE(stream.message)
        if not self.buffers.take(need):
            return False
        stream.charged += need
        return True

    @property
    def refusal(self):
        """What a call the buffers have no room for is answered (RESOURCE_EXHAUSTED)."""
        return self.buffers.refusal

    cdef bint _charge_unsent(self) except -1:
        """Charge the replies that did not leave with this flush (the peer's window is
        closed); reset those that do not fit (True if any), give back for those that have
        left."""
        cdef Stream stream
        cdef Py_ssize_t need
        cdef list unsent = self.unsent
        cdef bint reset = False
        self.unsent = []
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
                    self._uncharge(stream)
                continue
            self.unsent.append(stream)  # checked again at the next flush
            if need > stream.charged:
                if self.buffers.take(need - stream.charged):
                    stream.charged = need
                else:
                    self.reset(stream, NGHTTP2_CANCEL)
                    reset = True
        return reset

    cdef inline void _unsent(self, Stream stream):
        if not stream.unsent:
            stream.unsent = True
            self.unsent.append(stream)

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
            self._uncharge(stream)

    cdef void _uncharge(self, Stream stream) except *:
        self.buffers.give(stream.charged)
        stream.charged = 0

    cdef void _charge_pending(self) except *:
        """Charge the process's buffers for the requests this read left incomplete: their
        head, and their body as announced by its prefix (or as read so far)."""
        cdef Stream stream
        cdef Py_ssize_t need
        cdef list pending = self.pending
        self.pending = []
        for stream in pending:
            stream.pending = False
            if stream.dispatched or stream.answered or stream.closed or self.buffers is None:
                continue
            need = STREAM_COST + stream.header_bytes
            need += stream.expected + 5 if stream.expected >= 0 else stream.held
            if need <= stream.charged:
                continue
            if self.buffers.take(need - stream.charged):
                stream.charged = need
            else:
                self._trailers_only(stream, _STATUS_200, RESOURCE_EXHAUSTED,
                                    self.buffers.refusal)

    cdef inline void _watch(self, Stream stream):
        if not stream.pending:
            stream.pending = True
            self.pending.append(stream)

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
            stream.path = PyBytes_FromStringAndSize(<const char*>value, valuelen)
        elif namelen == 7 and memcmp(name, b":method", 7) == 0:
            if not (valuelen == 4 and memcmp(value, b"POST", 4) == 0):
                stream.method = PyBytes_FromStringAndSize(<const char*>value, valuelen)
        elif namelen == 12 and memcmp(name, b"content-type", 12) == 0:
            stream.content_type = PyBytes_FromStringAndSize(<const char*>value, valuelen)
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
        else:
            self._watch(stream)  # usually read whole before this read ends: no charge
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
        self._watch(stream)
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
            self._watch(stream)
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
            self._uncharge(stream)
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


# The nghttp2 callbacks and the library set-up (a textual include, as uvloop splits loop.pyx).
include "_h2_callbacks.pxi"
