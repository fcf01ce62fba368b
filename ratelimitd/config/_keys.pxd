# The compiled key and window maths, for the modules that call them at C speed (`_decision`).

cpdef long long unit_seconds(int unit)
cpdef long long window_start(long long now, long long seconds)
cpdef long long reset_seconds(long long now, long long seconds)
cpdef long long near_threshold(unsigned long long limit, double ratio)
cpdef str cache_key(str prefix, str domain, entries, share, long long seconds, long long now)
cpdef object over(object rule, object st, unsigned long long over_add, long long now)
cpdef str state_key(str prefix, str domain, entries, share, str suffix=*)
cpdef tuple sliding_window(long long w, long long c, long long p, long long now,
                           long long window, long long limit, long long hits)
cpdef tuple token_bucket(long long t, long long f, long long now, long long window,
                         long long limit, long long hits)
cpdef object refuse(object rule, object st, unsigned long long over_add, long long reset)
cpdef object verdict(object rule, object st, unsigned long long hits,
                     unsigned long long after, double ratio, long long reset)


cdef class Bump:
    cdef object store, cls
    cdef Py_ssize_t o_next_sweep, o_jitter, o_counters

    cdef long long bump(self, str key, long long hits, long long seconds, long long now) except? -1
    cdef long long count(self, store, str key, long long hits, long long expires,
                         long long now) except? -1


cdef object pack(long long value, long long expires)
