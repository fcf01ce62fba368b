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
    cdef list parts = [prefix, domain, "_"]
    cdef tuple entry
    cdef Py_ssize_t i, n = len(entries)
    cdef str pattern
    cdef Py_ssize_t nshare
    if share is None:
        for i in range(n):
            entry = <tuple>entries[i]
            parts.append(<str>entry[0])
            parts.append("_")
            parts.append(<str>entry[1])
            parts.append("_")
    else:
        nshare = len(share)
        for i in range(n):
            entry = <tuple>entries[i]
            pattern = <str>share[i] if i < nshare else ""
            parts.append(<str>entry[0])
            parts.append("_")
            parts.append(pattern if pattern else <str>entry[1])
            parts.append("_")
    parts.append(str((now // seconds) * seconds))
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
