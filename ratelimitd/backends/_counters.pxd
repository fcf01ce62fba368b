# The memory store's counter table, for the modules that count in it at C speed (`_decision`).

from libc.stdint cimport int64_t, uint32_t, uint64_t
from cpython.object cimport PyObject

from ratelimitd.config._keys cimport Bump


cdef struct Slot:
    uint64_t hash     # the key's str hash (Python's keyed SipHash)
    uint32_t check    # a second, independent hash of the key's characters
    uint32_t boxed    # 1: `value` is a PyObject* (a state list, a counter past 31 bits)
    PyObject *key     # NULL: an empty slot
    int64_t value     # value << 32 | expires, or the boxed object


cdef class CounterTable:
    cdef Slot *slots
    cdef Py_ssize_t mask, used
    cdef size_t bytes

    cdef Slot *find(self, str key, uint64_t *hash, uint32_t *check) except? NULL
    cdef int put(self, str key, uint64_t hash, uint32_t check, object value) except -1
    cdef Slot *_slot(self, uint64_t h, uint32_t c) noexcept
    cdef int _resize(self, Py_ssize_t size) except -1
    cdef void _remove(self, Slot *s) noexcept
    cdef void _clear(self) noexcept


cdef class TableBump(Bump):
    cdef long long count(self, store, str key, long long hits, long long expires,
                         long long now) except? -1
