# cython: language_level=3
"""Cache keys, fixed-window arithmetic, near-limit maths and the status split, compiled.

Same public names and results as `_keys_py.py` (the oracle); `keys.py` selects one.
"""

from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.object cimport PyObject
from libc.math cimport floorf

from ratelimitd._slots cimport get, offset_of, put

from random import random

from ratelimitd.messages import OK, OVER_LIMIT, Status
from ratelimitd.stats.store import RuleStats

# The slots `verdict` reads and counts in (see _slots.pxd); a rule is any object with
# requests_per_unit and shadow_mode (config.Rule's slots are read directly).
cdef object STATS = RuleStats
cdef Py_ssize_t S_OVER = offset_of(RuleStats, "over_limit")
cdef Py_ssize_t S_NEAR = offset_of(RuleStats, "near_limit")
cdef Py_ssize_t S_WITHIN = offset_of(RuleStats, "within_limit")
cdef Py_ssize_t S_SHADOW = offset_of(RuleStats, "shadow_mode")
cdef object RULE = None
cdef Py_ssize_t R_LIMIT = 0, R_SHADOW = 0


cdef inline void _count(object st, Py_ssize_t offset, str name, unsigned long long n) except *:
    put(st, STATS, offset, name, get(st, STATS, offset, name) + n)


cdef inline object _rule_field(object rule, Py_ssize_t offset, str name):
    global RULE, R_LIMIT, R_SHADOW
    if RULE is None:  # config imports this module: its Rule is known once it is loaded
        from ratelimitd.config.ruleset import Rule

        R_LIMIT = offset_of(Rule, "requests_per_unit")
        R_SHADOW = offset_of(Rule, "shadow_mode")
        RULE = Rule
        offset = R_LIMIT if name == "requests_per_unit" else R_SHADOW
    return get(rule, RULE, offset, name)

cdef long long COUNTER_MAX = 0x7FFFFFFFFFFFFFFF
# A memory store's fixed-window counter: one int, value << 32 | expires (`_keys_py.EXPIRY_BITS`).
# Below SMALL the packed int fits a long long and is made and read in C.
cdef long long EXPIRY_MASK = 0xFFFFFFFF
cdef long long SMALL = 0x7FFFFFFF

UNIT_SECONDS = (0, 1, 60, 3600, 86400, 2592000, 31536000, 604800)
cdef long long _SECONDS[8]
_SECONDS[:] = [0, 1, 60, 3600, 86400, 2592000, 31536000, 604800]


cpdef long long unit_seconds(int unit):
    """Window length of a unit enum number (0 for UNKNOWN or out of range)."""
    if 0 <= unit < 8:
        return _SECONDS[unit]
    return 0


cpdef long long window_start(long long now, long long seconds):
    """Start of the epoch-aligned fixed window containing `now`."""
    return (now // seconds) * seconds


cpdef long long reset_seconds(long long now, long long seconds):
    """Seconds until the current window ends (`unit - now % unit`, never 0)."""
    return seconds - now % seconds


cpdef long long near_threshold(unsigned long long limit, double ratio):
    """floor(limit * ratio) computed in float32, exactly as the reference."""
    cdef float product = (<float>limit) * (<float>ratio)
    return <long long>floorf(product)


cpdef str cache_key(str prefix, str domain, entries, share, long long seconds, long long now):
    """`prefix + domain_k_v[_k_v..]_<windowStart>`, share_threshold patterns replacing values."""
    cdef long long start = (now // seconds) * seconds
    cdef tuple entry
    if len(entries) == 1 and share is None:
        # The common case: one entry. Cython's f-strings join with precomputed lengths and
        # format the integer in C.
        entry = <tuple>entries[0]
        return f"{prefix}{domain}_{<str>entry[0]}_{<str>entry[1]}_{start}"
    return state_key(prefix, domain, entries, share, f"{start}")


cdef inline bint _split(unsigned long long limit, unsigned long long hits,
                        unsigned long long after, unsigned long long near,
                        unsigned long long *over_add, unsigned long long *near_add) noexcept:
    """Over the limit? And the over/near increments (the reference's `GetResponseDescriptorStatus`). `before`
    wraps in uint64 exactly like the reference."""
    cdef unsigned long long before = after - hits
    near_add[0] = 0
    over_add[0] = 0
    if after > limit:
        if before >= limit:
            over_add[0] = hits
        else:
            over_add[0] = after - limit
            near_add[0] = limit - (near if near > before else before)
        return True
    if after > near:
        near_add[0] = hits if before >= near else after - near
    return False


def evaluate(unsigned long long limit, unsigned long long hits, unsigned long long after,
             unsigned long long near):
    """Status and stat increments for one counter: (over, remaining, over_add, near_add,
    within_add). `before` wraps in uint64 exactly like the reference."""
    cdef unsigned long long over_add, near_add
    if _split(limit, hits, after, near, &over_add, &near_add):
        return True, 0, over_add, near_add, 0
    return False, limit - after, 0, near_add, hits


cpdef object over(object rule, object st, unsigned long long over_add, long long now):
    """The Status at `now` of an over-limit counter, with its over_limit (and shadow_mode)
    stats: OVER_LIMIT, or OK when the rule is in shadow mode (only observed)."""
    cdef long long seconds = rule.unit_seconds
    return refuse(rule, st, over_add, seconds - now % seconds)


def settle(object rule, object st, unsigned long long hits, unsigned long long after,
           double ratio, long long now):
    """The Status at `now` of a counter that is `after` once `hits` were added, and the
    over/near/within/shadow split of its stats (the reference's `GetResponseDescriptorStatus`)."""
    cdef long long seconds = rule.unit_seconds
    return verdict(rule, st, hits, after, ratio, seconds - now % seconds)


# -- the extension's algorithms: the same integer maths as `_keys_py` (its docstrings) -----

cpdef str state_key(str prefix, str domain, entries, share, str suffix=""):
    """`prefix + domain_k_v[_k_v..]_ + suffix`: `cache_key` with `suffix` for its window start."""
    cdef Py_ssize_t i, n = len(entries)
    cdef tuple one
    if n == 1 and share is None:
        one = <tuple>entries[0]
        return f"{prefix}{domain}_{<str>one[0]}_{<str>one[1]}_{suffix}"
    cdef Py_ssize_t nshare = len(share) if share is not None else 0
    cdef tuple entry
    cdef str value, pattern
    cdef list parts = [prefix, domain, "_"]
    for i in range(n):
        entry = <tuple>entries[i]
        value = <str>entry[1]
        if i < nshare:
            pattern = <str>share[i]
            if pattern:
                value = pattern
        parts.append(f"{<str>entry[0]}_{value}_")
    parts.append(suffix)
    return "".join(parts)


cdef inline long long _ceil_div(long long a, long long b) noexcept:
    # a >= 0, b > 0
    return (a + b - 1) // b


cpdef tuple sliding_window(long long w, long long c, long long p, long long now,
                           long long window, long long limit, long long hits):
    """One decision of the two-window weighted counter (see `_keys_py.sliding_window`)."""
    cdef long long start = now - now % window
    cdef long long left, pe, ce, after, room, reset
    if w < start:
        p = c if w == start - window else 0
        c = 0
        w = start
    elif w > start:
        now = w
        start = w
    left = start + window - now
    pe = p if p < limit else limit
    after = _ceil_div(pe * left, window) + c + hits
    if after <= limit:
        c += hits
        return after, w, c, p, (left + window if c else left)
    room = limit - c - hits
    if room >= 0:
        reset = left - (room * window) // pe
    elif hits > limit:
        reset = left + window
    else:
        ce = c if c < limit else limit
        reset = left + window - ((limit - hits) * window) // ce if ce else left
    return after, w, c, p, reset


cpdef tuple token_bucket(long long t, long long f, long long now, long long window,
                         long long limit, long long hits):
    """One GCRA decision (see `_keys_py.token_bucket`)."""
    cdef long long d, debt, after
    if limit <= 0:
        return hits, t, f, (window if hits else 0)
    d = t - now
    if d < 0:
        debt = 0
    else:
        if d > window:
            d = window
        debt = d * limit + (f if f < limit else limit - 1)
    after = _ceil_div(debt, window) + hits
    if after <= limit:
        debt += hits * window
        return after, now + debt // limit, debt % limit, _ceil_div(debt, limit)
    if hits <= limit:
        return after, t, f, _ceil_div(debt - (limit - hits) * window, limit)
    return after, t, f, _ceil_div(debt, limit)


def bump(store, str key, long long hits, long long seconds, long long now):
    """INCRBY + EXPIRE in a memory store's map (see `_keys_py.bump`)."""
    return Bump(store).bump(key, hits, seconds, now)


cdef class Bump:
    """`bump` bound to one store (see `_keys_py.Bump`): `_decision` calls its C method, with
    the store's three hot attributes read from their slots (a member descriptor's offset,
    taken once for the store's class) instead of by name."""

    def __init__(self, store):
        self.store = store
        self.cls = type(store)
        try:
            self.o_next_sweep = offset_of(self.cls, "_next_sweep")
            self.o_jitter = offset_of(self.cls, "_jitter")
            self.o_counters = offset_of(self.cls, "_counters")
        except (TypeError, AttributeError):  # not slots: read them by name
            self.cls = None

    def __call__(self, str key, long long hits, long long seconds, long long now):
        return self.bump(key, hits, seconds, now)

    cdef long long bump(self, str key, long long hits, long long seconds, long long now) except? -1:
        cdef long long expires, jitter
        store = self.store
        cls = self.cls
        if now >= <long long>get(store, cls, self.o_next_sweep, "_next_sweep"):
            store._sweep(now)
        expires = now + seconds
        jitter = get(store, cls, self.o_jitter, "_jitter")
        if jitter > 0:
            expires += <long long>(random() * jitter)
        return self.count(store, key, hits, expires, now)

    cdef long long count(self, store, str key, long long hits, long long expires,
                         long long now) except? -1:
        """INCRBY + EXPIRE of the counter at `key` in the store's dict; a store whose
        counters are another map overrides this (`_counters.TableBump`)."""
        cdef long long value, packed
        cdef int overflow = 0
        cdef dict counters
        cdef PyObject *found
        counters = get(store, self.cls, self.o_counters, "_counters")
        found = PyDict_GetItem(counters, key)
        if found is NULL:
            PyDict_SetItem(counters, key, pack(hits, expires))
            store._created(key, expires, now)
            return hits
        value = hits  # expired, not swept yet (or another algorithm's state): a fresh counter
        if type(<object>found) is int:
            packed = PyLong_AsLongLongAndOverflow(<object>found, &overflow)
            if overflow:  # a counter past SMALL: Python's ints
                if <long long>((<object>found) & EXPIRY_MASK) > now:
                    value = (<object>found) >> 32
                    value = value + hits if value <= COUNTER_MAX - hits else COUNTER_MAX
            elif (packed & EXPIRY_MASK) > now:
                value = packed >> 32
                value = value + hits if value <= COUNTER_MAX - hits else COUNTER_MAX  # saturates
        PyDict_SetItem(counters, key, pack(value, expires))
        return value


cdef object pack(long long value, long long expires):
    """A counter as the memory store keeps it: `value << 32 | expires`."""
    if value <= SMALL:
        return PyLong_FromLongLong(value << 32 | expires)
    return (<object>value) << 32 | expires


cpdef object refuse(object rule, object st, unsigned long long over_add, long long reset):
    """`over` with the reset given: OVER_LIMIT (OK in shadow mode) and its stats."""
    _count(st, S_OVER, "over_limit", over_add)
    if _rule_field(rule, R_SHADOW, "shadow_mode"):
        _count(st, S_SHADOW, "shadow_mode", over_add)
        return Status(OK, rule, 0, reset)
    return Status(OVER_LIMIT, rule, 0, reset)


cpdef object verdict(object rule, object st, unsigned long long hits,
                     unsigned long long after, double ratio, long long reset):
    """`settle` with the reset given (any algorithm): the Status and its stats split."""
    cdef unsigned long long limit = _rule_field(rule, R_LIMIT, "requests_per_unit")
    cdef long long near = near_threshold(limit, ratio)
    cdef unsigned long long over_add, near_add
    if near < 0:
        raise OverflowError("can't convert negative value to unsigned int")
    if _split(limit, hits, after, <unsigned long long>near, &over_add, &near_add):
        if near_add:
            _count(st, S_NEAR, "near_limit", near_add)
        return refuse(rule, st, over_add, reset)
    if near_add:
        _count(st, S_NEAR, "near_limit", near_add)
    _count(st, S_WITHIN, "within_limit", hits)
    return Status(OK, rule, limit - after, reset)
