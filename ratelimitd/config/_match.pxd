# The compiled trie's lookup, for the compiled decision (`_decision`) to call in C.

cdef object lookup_c(object root, str domain, object entries, list walked)
