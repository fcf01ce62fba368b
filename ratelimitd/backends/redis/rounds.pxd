# The types of `rounds.py` compiled in Cython's pure-Python mode (the same source runs
# uncompiled where the extension is not built). `_resp.pyx` cimports them: its `Replies` is a
# `Reader`, and its `Sender` opens a `Flush` and writes it (`written`) in C.

cimport cython


# The reply parser's two calls, virtual: compiled, the round calls `_resp.Replies`'s in C.
cdef class Reader:
    cpdef feed(self, bytes data)
    cpdef gets(self)


@cython.locals(_k=Py_ssize_t)
cpdef bint read_replies(Reader reader, list replies, Py_ssize_t n) except -1

@cython.locals(failed=bint, i=Py_ssize_t, first=Py_ssize_t, offset=Py_ssize_t, n=Py_ssize_t,
               k=Py_ssize_t, mine=list)
cpdef resolve(replies, list entries, breaker, counts)


@cython.final
cdef class Resolver:
    cdef readonly object instance, counts

    cpdef resolve(self, replies, list entries)


@cython.final
cdef class Flush:
    cdef public list entries
    cdef public object future
    cdef readonly object loop, receiver
    cdef bint _done

    cpdef bint done(self)
    cpdef set_result(self, result)
    @cython.locals(resolver=Resolver)
    cpdef deliver(self, list replies)


@cython.final
cdef class Batch:
    cdef public object future
    cdef public Py_ssize_t n
    cdef public list replies
    cdef public double deadline


@cython.locals(reader=Reader, batch=Batch, flush=Flush)
cpdef received(conn, bytes data)

@cython.locals(b=Batch, deadline=double)
cpdef written(conn, bytes payload, list batches, Py_ssize_t commands, double timeout=*)
