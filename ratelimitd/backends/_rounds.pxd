# A store round started from C: see _rounds.pyx.


cdef class Rounds:
    cdef int fixed(self, list keys, long long* numbers, object waiter) except -1
