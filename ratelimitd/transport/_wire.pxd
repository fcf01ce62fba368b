# cython: language_level=3
# What the compiled call (`_rls`) reads of a request before, or instead of, decoding it.

cdef str request_domain(bytes data)
cdef Py_ssize_t checked_descriptors(bytes data, object bounds)
cdef Py_ssize_t request_size(bytes data)
