# cython: language_level=3
"""The Redis counter path's codec leaves, compiled: same names and results as `_resp_py.py`
(the pure twin, and the notes); `resp.py` selects one.

The payload is written straight into one bytes object (no per-command formatting); the
replies are parsed in C (`Replies`, a `rounds.Reader`: the round, `rounds.py`, calls it in
C); a request's payload joins its pool's flush in C (`Sender`, which opens and writes a
trickle's `rounds.Flush` too): per request and per flush, no Python frame.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.string cimport memcpy

from ratelimitd._slots cimport get, offset_of, put
from ratelimitd.backends._rounds cimport Rounds
from ratelimitd.backends.redis.rounds cimport Batch, Flush, Reader, written

from random import random

import hiredis

from ratelimitd.backends.base import Op
from ratelimitd.config.windows import FIXED_WINDOW as _FIXED_WINDOW

cdef object OP = Op
cdef long long FIXED_WINDOW = _FIXED_WINDOW
cdef Py_ssize_t O_KEY = offset_of(Op, "key")
cdef Py_ssize_t O_HITS = offset_of(Op, "hits")
cdef Py_ssize_t O_SECONDS = offset_of(Op, "seconds")
cdef Py_ssize_t O_ALGORITHM = offset_of(Op, "algorithm")
cdef Py_ssize_t O_REFUND = offset_of(Op, "refund")
cdef Py_ssize_t O_BUDGET = offset_of(Op, "budget")

# The fixed parts of `*3 $6 INCRBY $<n> <key> $<n> <hits>` and `*3 $6 EXPIRE ...`.
cdef bytes INCRBY = b"*3\r\n$6\r\nINCRBY\r\n"
cdef bytes EXPIRE = b"*3\r\n$6\r\nEXPIRE\r\n"
DEF COMMAND = 16  # len(INCRBY) == len(EXPIRE)


# The expiry jitter's draws, in C: xorshift64* (a uniform spread of expiries is all it is
# for), seeded from `random` once at import, so that it draws no Python float per request.
cdef unsigned long long _state = <unsigned long long>(random() * 2.0**53) * 2 + 1


cdef inline double _uniform() noexcept:
    """A draw in [0, 1)."""
    global _state
    _state ^= _state >> 12
    _state ^= _state << 25
    _state ^= _state >> 27
    return <double>((_state * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0)


cdef inline Py_ssize_t _digits(unsigned long long v) noexcept:
    cdef Py_ssize_t n = 1
    while v >= 10:
        v //= 10
        n += 1
    return n


cdef inline Py_ssize_t _signed_digits(long long v) noexcept:
    """Characters of `v` in decimal, its sign included."""
    if v < 0:
        return 1 + _digits(<unsigned long long>(-(v + 1)) + 1)
    return _digits(v)


cdef inline Py_ssize_t _bulk_size(Py_ssize_t n) noexcept:
    """Bytes of a bulk string of `n` bytes: `$`, `n` in decimal, CRLF, the bytes, CRLF."""
    return 1 + _digits(n) + 2 + n + 2


cdef inline char* _number(char* p, unsigned long long v, Py_ssize_t n) noexcept:
    """`v` in decimal (`n` digits) at `p`; past it."""
    cdef Py_ssize_t i = n
    while i:
        i -= 1
        p[i] = <char>(48 + v % 10)
        v //= 10
    return p + n


cdef inline char* _crlf(char* p) noexcept:
    p[0] = 13
    p[1] = 10
    return p + 2


cdef inline char* _bulk(char* p, const char* data, Py_ssize_t n) noexcept:
    p[0] = 36  # '$'
    p = _crlf(_number(p + 1, n, _digits(n)))
    memcpy(p, data, n)
    return _crlf(p + n)


cdef inline char* _bulk_number(char* p, long long v) noexcept:
    cdef Py_ssize_t n = _signed_digits(v)
    p[0] = 36  # '$'
    p = _crlf(_number(p + 1, n, _digits(n)))
    if v < 0:
        p[0] = 45  # '-'
        p = _number(p + 1, <unsigned long long>(-(v + 1)) + 1, n - 1)
    else:
        p = _number(p, v, n)
    return _crlf(p)


def incrby_expire_ops(ops, long long jitter):
    """INCRBY + EXPIRE per op in one payload, or None (see `_resp_py.incrby_expire_ops`)."""
    return _incrby_expire(ops, jitter)


cdef object _incrby_expire(ops, long long jitter):
    cdef Py_ssize_t count = len(ops), i
    cdef long long small[16]
    cdef long long* numbers = small  # hits and seconds per op
    if count > 8:
        numbers = <long long*>PyMem_Malloc(2 * count * sizeof(long long))
        if numbers == NULL:
            raise MemoryError()
    try:
        for i in range(count):
            op = ops[i]
            if (
                <long long>get(op, OP, O_ALGORITHM, "algorithm") != FIXED_WINDOW
                or get(op, OP, O_REFUND, "refund")
                or get(op, OP, O_BUDGET, "budget") is not None
            ):
                return None
            numbers[2 * i] = get(op, OP, O_HITS, "hits")
            numbers[2 * i + 1] = get(op, OP, O_SECONDS, "seconds")
        return _commands([get(op, OP, O_KEY, "key") for op in ops], numbers, jitter)
    finally:
        if numbers != small:
            PyMem_Free(numbers)


cdef bytes _commands(list keys, long long* numbers, long long jitter):
    """`INCRBY keys[i] numbers[2 * i]` + `EXPIRE keys[i] numbers[2 * i + 1]` (plus a draw
    of the jitter, added there) for every key, in one payload."""
    cdef Py_ssize_t count = len(keys), i, size = 0, klen
    cdef const char* key
    cdef char* p
    for i in range(count):  # the jitter drawn, and the payload measured
        if jitter > 0:
            numbers[2 * i + 1] += <long long>(_uniform() * jitter)
        PyUnicode_AsUTF8AndSize(<str>keys[i], &klen)
        size += 2 * (COMMAND + _bulk_size(klen))
        size += _bulk_size(_signed_digits(numbers[2 * i]))
        size += _bulk_size(_signed_digits(numbers[2 * i + 1]))
    out = PyBytes_FromStringAndSize(NULL, size)
    p = PyBytes_AS_STRING(out)
    for i in range(count):  # written
        key = PyUnicode_AsUTF8AndSize(<str>keys[i], &klen)
        memcpy(p, <const char*>INCRBY, COMMAND)
        p = _bulk_number(_bulk(p + COMMAND, key, klen), numbers[2 * i])
        memcpy(p, <const char*>EXPIRE, COMMAND)
        p = _bulk_number(_bulk(p + COMMAND, key, klen), numbers[2 * i + 1])
    return out


cdef class Sender(Rounds):
    """`SingleInstance.increment_later`, compiled (see `_resp_py.Sender`): a request's
    payload joins the flush its pool is building in C, with no Python frame. As a `Rounds`
    it takes a decision's fixed windows as C values (`fixed`), no `Op` made for them.

    The pool (`pool.Pool`) keeps the flush; this reads and writes its slots, opens a flush
    and schedules its write (`write`, the loop's callback: `Pool._flush` in C for a trickle).
    Only a request that would fill a flush goes through `Pool.send` (which writes it at
    once).
    """

    cdef object pool, kind
    cdef long long jitter
    cdef Py_ssize_t o_conns, o_fut, o_cmds, o_limit, o_buf
    cdef Py_ssize_t o_loop, o_receiver, o_scheduled, o_window, o_rr, o_writes, o_most
    # The flush `Pool.submit` last left open and its waiters' list: a request joins it
    # while it is still the pool's.
    cdef object flush
    cdef list entries

    def __init__(self, pool, long long jitter):
        self.pool = pool
        self.kind = type(pool)
        self.jitter = jitter
        self.o_conns = offset_of(self.kind, "conns")
        self.o_fut = offset_of(self.kind, "_fut")
        self.o_cmds = offset_of(self.kind, "_cmds")
        self.o_limit = offset_of(self.kind, "_limit")
        self.o_buf = offset_of(self.kind, "_buf")
        self.o_loop = offset_of(self.kind, "loop")
        self.o_receiver = offset_of(self.kind, "receiver")
        self.o_scheduled = offset_of(self.kind, "_scheduled")
        self.o_window = offset_of(self.kind, "_window")
        self.o_rr = offset_of(self.kind, "_rr")
        self.o_writes = offset_of(self.kind, "writes")
        self.o_most = offset_of(self.kind, "max_in_flight")

    def __call__(self, ops, waiter):
        payload = _incrby_expire(ops, self.jitter)
        if payload is None:
            return False
        self._join(payload, 2 * len(ops), waiter)
        return True

    cdef int fixed(self, list keys, long long* numbers, object waiter) except -1:
        self._join(_commands(keys, numbers, self.jitter), 2 * len(keys), waiter)
        return 1

    cdef int _join(self, bytes payload, Py_ssize_t n, waiter) except -1:
        """Add a request's `n` commands to the pool's next flush."""
        cdef Py_ssize_t offset
        pool = self.pool
        kind = self.kind
        fut = get(pool, kind, self.o_fut, "_fut")
        if fut is not None and fut is self.flush and get(pool, kind, self.o_conns, "conns"):
            offset = get(pool, kind, self.o_cmds, "_cmds")
            if offset + n < <Py_ssize_t>get(pool, kind, self.o_limit, "_limit"):
                # `Pool.send` for a request that neither opens nor fills the flush
                entries = self.entries
                entries.append(waiter)
                entries.append(offset)
                entries.append(n)
                (<list>get(pool, kind, self.o_buf, "_buf")).append(payload)
                put(pool, kind, self.o_cmds, "_cmds", offset + n)
                return 0
        elif fut is None and get(pool, kind, self.o_conns, "conns"):
            if n < <Py_ssize_t>get(pool, kind, self.o_limit, "_limit"):
                self._open(payload, n, waiter)
                return 0
        pool.send(payload, n, waiter)
        fut = get(pool, kind, self.o_fut, "_fut")
        if fut is None:  # written at once (it filled the flush)
            self.flush = None
            self.entries = None
        else:
            self.flush = fut
            self.entries = (<Flush?>fut).entries
        return 0

    cdef void _open(self, bytes payload, Py_ssize_t n, waiter) except *:
        """`Pool.send` for a request that opens a flush and does not fill it: the flush made
        and its write scheduled (once), as `Pool._queue` and `Pool._queued` do."""
        cdef Flush flush
        pool = self.pool
        kind = self.kind
        loop = get(pool, kind, self.o_loop, "loop")
        flush = Flush(loop, get(pool, kind, self.o_receiver, "receiver"))
        flush.entries = [waiter, 0, n]
        (<list>get(pool, kind, self.o_buf, "_buf")).append(payload)
        put(pool, kind, self.o_fut, "_fut", flush)
        put(pool, kind, self.o_cmds, "_cmds", n)
        self.flush = flush
        self.entries = flush.entries
        if not get(pool, kind, self.o_scheduled, "_scheduled"):
            put(pool, kind, self.o_scheduled, "_scheduled", True)
            window = get(pool, kind, self.o_window, "_window")
            if window:
                loop.call_later(window, self.write, True)
            else:
                loop.call_soon(self.write, True)

    def write(self, bint scheduled=False):
        """`Pool._flush`, the loop's callback for a flush this opened: written here when
        the last flush's connection has nothing in flight (a trickle of calls), else by
        `Pool._flush` (its round-robin over busy connections, its failures)."""
        cdef list conns
        cdef Py_ssize_t cmds
        pool = self.pool
        kind = self.kind
        if scheduled:
            put(pool, kind, self.o_scheduled, "_scheduled", False)
        fut = get(pool, kind, self.o_fut, "_fut")
        if fut is None:  # it filled up and was written at once
            return
        conns = <list>get(pool, kind, self.o_conns, "conns")
        cmds = get(pool, kind, self.o_cmds, "_cmds")
        if conns and cmds <= <Py_ssize_t>get(pool, kind, self.o_most, "max_in_flight"):
            conn = conns[<Py_ssize_t>get(pool, kind, self.o_rr, "_rr") % len(conns)]
            if not conn.in_flight:
                payload = b"".join(<list>get(pool, kind, self.o_buf, "_buf"))
                put(pool, kind, self.o_buf, "_buf", [])
                put(pool, kind, self.o_fut, "_fut", None)
                put(pool, kind, self.o_cmds, "_cmds", 0)
                put(pool, kind, self.o_writes, "writes", get(pool, kind, self.o_writes, "writes") + 1)
                written(conn, payload, [Batch(fut, cmds)], cmds, 0.0)  # `conn.write`
                return
        pool._flush()


cdef class Replies(Reader):
    """A connection's reply parser (see `_resp_py.Replies`): integer replies, all the
    counter path gets, are read here in C; any other kind, and what follows it until the
    parser is idle again, by hiredis."""

    cdef object reader  # hiredis.Reader: it holds the bytes while `slow`
    cdef bint slow
    cdef bytes buf  # the bytes not read yet (while not `slow`), from `pos`
    cdef Py_ssize_t pos

    def __init__(self):
        self.reader = hiredis.Reader()
        self.slow = False
        self.buf = b""
        self.pos = 0

    cpdef feed(self, bytes data):
        """Bytes read from the connection."""
        if self.slow:
            self.reader.feed(data)
        elif self.pos < len(self.buf):  # a reply cut by the read: rare
            self.buf = self.buf[self.pos:] + data
            self.pos = 0
        else:
            self.buf = data
            self.pos = 0

    cpdef gets(self):
        """The next reply, or False when none is whole yet (as `hiredis.Reader.gets`)."""
        if not self.slow:
            reply = self._integer()
            if reply is not None:
                return reply
            self.slow = True  # hiredis reads from here
            self.reader.feed(self.buf[self.pos:])
            self.buf = b""
            self.pos = 0
        reply = self.reader.gets()
        if reply is not False and not self.reader.has_data():
            self.slow = False  # idle: no reply begun, no byte held
        return reply

    cdef object _integer(self):
        """The next reply if it is an integer (`:<digits>\r\n`); False if the buffer ends
        before it does; None for any other reply, or a line that is not a well-formed
        integer (hiredis reads it, and refuses it)."""
        cdef Py_ssize_t i = self.pos, end = len(self.buf)
        cdef const char* p
        cdef unsigned long long value = 0
        cdef bint negative = False
        cdef int digits = 0
        if i >= end:
            return False
        p = PyBytes_AS_STRING(self.buf)
        if p[i] != 58:  # ':'
            return None
        i += 1
        if i < end and p[i] == 45:  # '-'
            negative = True
            i += 1
        while i < end and 48 <= p[i] <= 57:
            if digits == 18:  # past what a long long surely holds: hiredis's to read
                return None
            value = value * 10 + (p[i] - 48)
            digits += 1
            i += 1
        if i + 1 >= end:
            return False if i >= end or p[i] == 13 else None
        if digits == 0 or p[i] != 13 or p[i + 1] != 10:
            return None
        self.pos = i + 2
        return -<long long>value if negative else <long long>value
