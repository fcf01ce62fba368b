# cython: language_level=3
"""The memory store's counter map, compiled: one cache line per lookup at a million keys.

A dict of a million counters costs a decision about five cache misses: its index, its
entry, the stored key's characters (compared when the hashes agree), the packed int the
entry points to, and the page-table walks of all of them. This table keeps what a lookup
needs in one 32-byte slot (two per line): the key's hash, a second hash of its characters
and the packed counter `value << 32 | expires` itself. Keys are told apart by the two
hashes, 96 bits (Python's keyed SipHash and a keyed multiply-xorshift of a random seed),
never by reading the stored key: two live keys agree on both with a chance near
K² / 2^97, 10^-17 at a million. The stored key is read only to list the table.

Linear probing, deletion by backward shift (no tombstones), doubled past 3/4 full, so a
million keys sit in 2^21 slots (64 MB, about what the dict and its ints took). A table of
2 MB or more asks for transparent huge pages: a random probe then misses one page-table
entry per 2 MB, not per 4 kB.

The table is a `MutableMapping` of str to whatever the store keeps (an int: the packed
counter, inline while it fits 63 bits; anything else, a sliding window's `[state,
expires]`, held by reference), so the store's cold paths and the tests use it as the dict it
replaces (`_counters_py`: the pure twin is a dict). Values are ints and lists of tuples of
ints: they cannot form a cycle through the table, so it is not tracked by the collector.
"""

from collections.abc import MutableMapping
from os import urandom

from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.object cimport PyObject, PyObject_Hash
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset

from ratelimitd._slots cimport get
from ratelimitd.config._keys cimport Bump, pack

cdef extern from "Python.h":
    int PyUnicode_KIND(object)
    void *PyUnicode_DATA(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)

cdef extern from *:
    """
    #include <string.h>
    #include <stdlib.h>
    #include <sys/mman.h>

    /* A keyed multiply-xorshift of the key's bytes: the table's second hash. */
    static inline uint32_t rl_check(const unsigned char *p, size_t n, uint64_t seed) {
        uint64_t h = seed ^ ((uint64_t)n * 0x9E3779B97F4A7C15ULL), w;
        while (n >= 8) {
            memcpy(&w, p, 8);
            h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
            h ^= h >> 32;
            p += 8;
            n -= 8;
        }
        w = 0;
        memcpy(&w, p, n);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
        h ^= h >> 29;
        h *= 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        return (uint32_t)h;
    }

    #define RL_HUGE ((size_t)2 << 20)

    /* Zeroed slots; from 2 MB on, aligned to and advised as huge pages. */
    static void *rl_alloc(size_t bytes) {
        void *p;
        if (bytes < RL_HUGE)
            return calloc(1, bytes);
        if (posix_memalign(&p, RL_HUGE, bytes))
            return NULL;
    #ifdef MADV_HUGEPAGE
        madvise(p, bytes, MADV_HUGEPAGE);
    #endif
        memset(p, 0, bytes);
        return p;
    }
    """
    uint32_t rl_check(const unsigned char *p, size_t n, uint64_t seed) noexcept
    void *rl_alloc(size_t bytes) noexcept

# A process's second-hash key: a table's hashes never leave the process.
cdef uint64_t SEED = int.from_bytes(urandom(8), "little")
cdef Py_ssize_t MIN_SLOTS = 8
cdef long long EXPIRY_MASK = 0xFFFFFFFF
cdef long long SMALL = 0x7FFFFFFF  # a value up to this packs into an int64
cdef long long COUNTER_MAX = 0x7FFFFFFFFFFFFFFF
cdef object _MISSING = object()  # `pop` without a default


cdef inline uint32_t _check(str key) noexcept:
    return rl_check(
        <const unsigned char *>PyUnicode_DATA(key),
        <size_t>(PyUnicode_GET_LENGTH(key) * PyUnicode_KIND(key)),
        SEED,
    )


cdef inline str _key(object key):
    if type(key) is str:
        return <str>key
    if isinstance(key, str):  # a subclass: its characters are the key
        return str.__str__(key)
    raise TypeError(f"counter keys are str, not {type(key).__name__}")


cdef inline object _value(Slot *s):
    if s.boxed:
        return <object><PyObject *>s.value
    return PyLong_FromLongLong(s.value)


cdef inline void _release(Slot *s) noexcept:
    """Drop what slot `s` holds, once it is no longer reachable from the table."""
    Py_DECREF(<object>s.key)
    if s.boxed:
        Py_DECREF(<object><PyObject *>s.value)


cdef class CounterTable:
    """str -> packed counter (or a state object): a dict with the counter inline."""

    def __cinit__(self):
        self.slots = <Slot *>calloc(MIN_SLOTS, sizeof(Slot))
        if self.slots is NULL:
            raise MemoryError()
        self.mask = MIN_SLOTS - 1
        self.used = 0
        self.bytes = MIN_SLOTS * sizeof(Slot)

    def __init__(self, other=None):
        if other is not None:
            self.update(other)

    def __dealloc__(self):
        self._clear()
        free(self.slots)

    cdef Slot *find(self, str key, uint64_t *hash, uint32_t *check) except? NULL:
        """Key's slot, or the empty one where it would go; its two hashes set."""
        cdef uint64_t h = <uint64_t>PyObject_Hash(key)
        cdef uint32_t c = _check(key)
        cdef Py_ssize_t i = <Py_ssize_t>(h & <uint64_t>self.mask)
        cdef Slot *s
        hash[0] = h
        check[0] = c
        while True:
            s = &self.slots[i]
            if s.key is NULL or (s.hash == h and s.check == c):
                return s
            i = (i + 1) & self.mask

    cdef int put(self, str key, uint64_t hash, uint32_t check, object value) except -1:
        """Set `key` (whose hashes are given) to `value`: inline if it is a packed counter
        that fits, else held."""
        cdef int overflow = 0
        cdef long long packed = 0
        cdef bint boxed = True
        cdef Slot *s
        cdef PyObject *old = NULL
        if type(value) is int:
            packed = PyLong_AsLongLongAndOverflow(value, &overflow)
            boxed = overflow != 0 or packed < 0
        s = self._slot(hash, check)
        if s.key is NULL:
            if (self.used + 1) * 4 > (self.mask + 1) * 3:
                self._resize((self.mask + 1) * 2)
                s = self._slot(hash, check)
            Py_INCREF(key)
            s.key = <PyObject *>key
            s.hash = hash
            s.check = check
            self.used += 1
        elif s.boxed:
            old = <PyObject *>s.value
        if boxed:
            Py_INCREF(value)
            s.value = <int64_t><PyObject *>value
        else:
            s.value = packed
        s.boxed = boxed
        if old is not NULL:  # after the slot is consistent: its release may run code
            Py_DECREF(<object>old)
        return 0

    cdef Slot *_slot(self, uint64_t h, uint32_t c) noexcept:
        cdef Py_ssize_t i = <Py_ssize_t>(h & <uint64_t>self.mask)
        cdef Slot *s
        while True:
            s = &self.slots[i]
            if s.key is NULL or (s.hash == h and s.check == c):
                return s
            i = (i + 1) & self.mask

    cdef int _resize(self, Py_ssize_t size) except -1:
        cdef size_t bytes = <size_t>size * sizeof(Slot)
        cdef Slot *new = <Slot *>rl_alloc(bytes)
        cdef Slot *old = self.slots
        cdef Py_ssize_t i, j, mask = size - 1
        if new is NULL:
            raise MemoryError()
        for i in range(self.mask + 1):
            if old[i].key is not NULL:
                j = <Py_ssize_t>(old[i].hash & <uint64_t>mask)
                while new[j].key is not NULL:
                    j = (j + 1) & mask
                new[j] = old[i]
        self.slots = new
        self.mask = mask
        self.bytes = bytes
        free(old)
        return 0

    cdef void _remove(self, Slot *s) noexcept:
        """Empty slot `s` (its contents already taken), shifting its successors back so
        that every key stays reachable from its home slot without tombstones."""
        cdef Py_ssize_t mask = self.mask
        cdef Py_ssize_t i = s - self.slots, j = i, home
        while True:
            j = (j + 1) & mask
            if self.slots[j].key is NULL:
                break
            home = <Py_ssize_t>(self.slots[j].hash & <uint64_t>mask)
            # Slot j may move to i unless its home lies cyclically in (i, j].
            if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            self.slots[i] = self.slots[j]
            i = j
        self.slots[i].key = NULL
        self.slots[i].boxed = 0
        self.used -= 1

    cdef void _clear(self) noexcept:
        cdef Py_ssize_t i
        cdef Slot s
        if self.used == 0:
            return
        for i in range(self.mask + 1):
            s = self.slots[i]
            if s.key is not NULL:
                self.slots[i].key = NULL
                self.slots[i].boxed = 0
                _release(&s)
        self.used = 0

    # -- the mapping ------------------------------------------------------------------------

    def __len__(self):
        return self.used

    def __contains__(self, key):
        cdef uint64_t h
        cdef uint32_t c
        return self.find(_key(key), &h, &c).key is not NULL

    def __getitem__(self, key):
        cdef uint64_t h
        cdef uint32_t c
        cdef Slot *s = self.find(_key(key), &h, &c)
        if s.key is NULL:
            raise KeyError(key)
        return _value(s)

    def get(self, key, default=None):
        """The value of `key`, `default` when absent."""
        cdef uint64_t h
        cdef uint32_t c
        cdef Slot *s = self.find(_key(key), &h, &c)
        if s.key is NULL:
            return default
        return _value(s)

    def __setitem__(self, key, value):
        cdef uint64_t h
        cdef uint32_t c
        cdef str k = _key(key)
        self.find(k, &h, &c)
        self.put(k, h, c, value)

    def __delitem__(self, key):
        cdef uint64_t h
        cdef uint32_t c
        cdef Slot *s = self.find(_key(key), &h, &c)
        cdef Slot taken
        if s.key is NULL:
            raise KeyError(key)
        taken = s[0]
        self._remove(s)
        _release(&taken)

    def pop(self, key, default=_MISSING):
        """Remove `key`; its value, or `default` when absent (KeyError without one)."""
        cdef uint64_t h
        cdef uint32_t c
        cdef Slot *s = self.find(_key(key), &h, &c)
        cdef Slot taken
        if s.key is NULL:
            if default is _MISSING:
                raise KeyError(key)
            return default
        taken = s[0]
        value = _value(s)
        self._remove(s)
        _release(&taken)
        return value

    def clear(self):
        """Remove every key, keeping the slots."""
        self._clear()

    def items(self):
        """(key, value) pairs (a list: the table may change while they are used)."""
        cdef Py_ssize_t i
        cdef list out = []
        for i in range(self.mask + 1):
            if self.slots[i].key is not NULL:
                out.append((<object>self.slots[i].key, _value(&self.slots[i])))
        return out

    def keys(self):
        """The keys, as `items`."""
        return [key for key, _ in self.items()]

    def values(self):
        """The values, as `items`."""
        return [value for _, value in self.items()]

    def __iter__(self):
        return iter(self.keys())

    def update(self, other):
        """Set every key of mapping `other` (or of its (key, value) pairs)."""
        cdef uint64_t h
        cdef uint32_t c
        cdef str k
        pairs = other.items() if hasattr(other, "items") else other
        for key, value in pairs:
            k = _key(key)
            self.find(k, &h, &c)
            self.put(k, h, c, value)

    def copy(self):
        """A new table of the same keys, sized for them."""
        return CounterTable(self)

    def __eq__(self, other):
        if isinstance(other, (CounterTable, dict)) or isinstance(other, MutableMapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __repr__(self):
        return f"CounterTable({dict(self.items())!r})"

    @property
    def nbytes(self):
        """Bytes of slots (keys and held objects not included)."""
        return self.bytes


MutableMapping.register(CounterTable)


cdef class TableBump(Bump):
    """`keys.Bump` on a store whose counters are a `CounterTable`: INCRBY + EXPIRE of one
    fixed-window counter with one probe of the table (`Bump` does the sweep and jitter)."""

    cdef long long count(self, store, str key, long long hits, long long expires,
                         long long now) except? -1:
        cdef long long value, packed
        cdef uint64_t h
        cdef uint32_t c
        cdef CounterTable table
        cdef Slot *s
        table = <CounterTable?>get(store, self.cls, self.o_counters, "_counters")
        s = table.find(key, &h, &c)
        if s.key is NULL:
            table.put(key, h, c, pack(hits, expires))
            store._created(key, expires, now)
            return hits
        value = hits  # expired, not swept yet (or another algorithm's state): a fresh counter
        if not s.boxed:
            packed = s.value
            if (packed & EXPIRY_MASK) > now:
                value = packed >> 32
                value = value + hits if value <= COUNTER_MAX - hits else COUNTER_MAX  # saturates
            if value <= SMALL:  # the common case: in place
                s.value = value << 32 | expires
                return value
        else:
            found = <object><PyObject *>s.value
            if type(found) is int and <long long>(found & EXPIRY_MASK) > now:  # past 31 bits
                value = found >> 32
                value = value + hits if value <= COUNTER_MAX - hits else COUNTER_MAX
        table.put(key, h, c, pack(value, expires))
        return value
