# cython: language_level=3
"""Cache keys, fixed-window arithmetic and near-limit maths, compiled.

Same public names and results as `_keys_py.py` (the oracle); `keys.py` selects one.
"""

from libc.math cimport floorf

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
    cdef Py_ssize_t i, n = len(entries)
    cdef Py_ssize_t nshare
    cdef tuple entry
    cdef str key, value, pattern
    cdef list parts
    if n == 1 and share is None:
        # The common case: one entry. Cython's f-strings join with precomputed lengths and
        # format the integer in C.
        entry = <tuple>entries[0]
        key = <str>entry[0]
        value = <str>entry[1]
        return f"{prefix}{domain}_{key}_{value}_{start}"
    parts = [prefix, domain]
    nshare = len(share) if share is not None else 0
    for i in range(n):
        entry = <tuple>entries[i]
        value = <str>entry[1]
        if i < nshare:
            pattern = <str>share[i]
            if pattern:
                value = pattern
        parts.append(f"_{<str>entry[0]}_{value}")
    parts.append(f"_{start}")
    return "".join(parts)


def evaluate(unsigned long long limit, unsigned long long hits, unsigned long long after,
             unsigned long long near):
    """Status and stat increments for one counter: (over, remaining, over_add, near_add,
    within_add). `before` wraps in uint64 exactly like the reference."""
    cdef unsigned long long before = after - hits
    cdef unsigned long long near_add = 0
    if after > limit:
        if before >= limit:
            return True, 0, hits, 0, 0
        return True, 0, after - limit, limit - (near if near > before else before), 0
    if after > near:
        near_add = hits if before >= near else after - near
    return False, limit - after, 0, near_add, hits
