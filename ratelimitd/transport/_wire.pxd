# cython: language_level=3
# What the compiled call (`_rls`) reads of a request before, or instead of, decoding it.

cdef str known_domain(bytes data, object bounds, Py_ssize_t* descriptors)
