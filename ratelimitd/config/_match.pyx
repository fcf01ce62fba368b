# cython: language_level=3
"""The descriptor trie and the reference lookup algorithm, compiled.

Same public names and behaviour as `_match_py.py` (the oracle the property tests compare
against); `match.py` selects one. See `_match_py.py` for the algorithm's notes.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport PyObject

DEF EXACT = 0
DEF WILDCARD = 1
DEF KEY_ONLY = 2


cpdef bint wildcard_match(tuple parts, str s):
    """Does `s` match a pattern pre-split on `*`? (`*` matches zero or more characters.)"""
    cdef str first = <str>parts[0]
    cdef str mid, last
    cdef Py_ssize_t pos, found, j
    cdef Py_ssize_t last_index = len(parts) - 1
    if not s.startswith(first):
        return False
    pos = len(first)
    for j in range(1, last_index):
        mid = <str>parts[j]
        found = s.find(mid, pos)
        if found < 0:
            return False
        pos = found + len(mid)
    last = <str>parts[last_index]
    return len(s) - len(last) >= pos and s.endswith(last)


cdef class Node:
    """One config descriptor entry, compiled."""

    cdef readonly str key
    cdef readonly str final_key
    cdef readonly bint has_value
    cdef readonly object rule
    cdef readonly bint detailed
    cdef readonly str full_key
    cdef readonly bint value_to_metric
    cdef readonly bint share
    cdef readonly tuple parts
    cdef readonly Level children
    # What a lookup that ends here returns when the stats key is the rule's own (no value
    # in it, nothing shared): made once, not per request.
    cdef tuple found

    def __init__(self, spec):
        self.key = spec.key
        self.final_key = spec.final_key
        self.has_value = bool(spec.value)
        self.rule = spec.rule
        self.detailed = spec.rule is not None and bool(spec.rule.detailed_metric)
        self.full_key = spec.rule.full_key if spec.rule is not None else ""
        self.value_to_metric = bool(spec.value_to_metric)
        self.share = bool(spec.share_threshold) and "*" in spec.final_key
        self.parts = tuple(spec.final_key.split("*"))
        self.children = compile_level(spec.children) if spec.children else None
        self.found = (self.rule, self.full_key, None, True)


cdef class Level:
    """The children of one node (or of a domain root)."""

    cdef readonly dict children
    cdef readonly tuple wildcards
    # The entry last probed here and its composite key: the decoder hands repeated keys and
    # values out as the same objects, so the same entry again finds its key (its hash
    # cached) without building and hashing it again.
    cdef object last_k, last_v
    cdef str last_probe

    def __init__(self, dict children, tuple wildcards):
        self.children = children
        self.wildcards = wildcards


cpdef Level compile_level(specs):
    """Compile config entries into a Level. Composite keys must already be unique."""
    cdef dict children = {}
    cdef list wildcards = []
    cdef Node node
    for spec in specs:
        node = Node(spec)
        children[spec.final_key] = node
        if "*" in spec.final_key:
            wildcards.append(node)
    return Level(children, tuple(wildcards))


cdef inline str _trim_prefix(str s, str prefix):
    if s.startswith(prefix):
        return s[len(prefix):]
    return s


cdef inline str _k_or_kv(str k, str v):
    if v:
        return k + "_" + v
    return k


def lookup(Level root, str domain, entries, list walked=None):
    """Find the limit for one request descriptor.

    Returns None, or (rule, stats_key, share, keep_metadata); `walked` receives the walk.
    See `_match_py.lookup`.
    """
    return lookup_c(root, domain, entries, walked)


cdef object lookup_c(object root, str domain, object entries, list walked):
    """`lookup`, called in C by the compiled decision (`_decision`)."""
    cdef Py_ssize_t n = len(entries)
    # The walk, level by level (borrowed: the trie holds its nodes for the whole call).
    cdef PyObject* path_on_stack[16]
    cdef int hows_on_stack[16]
    cdef PyObject** path = path_on_stack
    cdef int* hows = hows_on_stack
    if n == 0:
        return None
    if n > 16:
        path = <PyObject**>PyMem_Malloc(n * sizeof(PyObject*))
        hows = <int*>PyMem_Malloc(n * sizeof(int))
        if path == NULL or hows == NULL:
            PyMem_Free(path)
            PyMem_Free(hows)
            raise MemoryError()
    try:
        return _lookup(<Level?>root, domain, entries, walked, n, path, hows)
    finally:
        if n > 16:
            PyMem_Free(path)
            PyMem_Free(hows)


cdef object _lookup(Level root, str domain, entries, list walked, Py_ssize_t n,
                    PyObject** path, int* hows):
    cdef Py_ssize_t i
    cdef Level level = root
    cdef Node node = None, w
    cdef object rule = None
    cdef bint leaf = False, dynamic = False
    cdef list share = None
    cdef int how
    cdef str k, v, probe
    cdef tuple entry, share_t
    cdef list parts
    cdef object found
    for i in range(n):
        entry = <tuple>entries[i]
        k = <str>entry[0]
        v = <str>entry[1]
        if k is level.last_k and v is level.last_v:
            probe = level.last_probe
        else:
            probe = f"{k}_{v}"
            level.last_k = k
            level.last_v = v
            level.last_probe = probe
        found = level.children.get(probe)
        how = EXACT
        if found is None:
            for w in level.wildcards:
                if wildcard_match(w.parts, probe):
                    found = w
                    how = WILDCARD
                    break
            if found is None:
                found = level.children.get(k)
                how = KEY_ONLY
                if found is None:
                    if walked is not None:
                        walked.append((-1, None))
                    break
        node = <Node>found
        path[i] = <PyObject*>node
        hows[i] = how
        if walked is not None:
            walked.append((how, node))
        if how == WILDCARD:
            if node.share:
                if share is None:
                    share = [""] * n
                share[i] = _trim_prefix(node.final_key, k + "_")
            if node.value_to_metric or not (node.has_value and k == node.key):
                dynamic = True
        elif how == EXACT:
            if not v:
                dynamic = True
        elif node.value_to_metric and v:
            dynamic = True
        if node.rule is not None and i == n - 1:
            rule = node.rule
        if node.children is None:
            leaf = True
            break
        level = node.children
    if rule is None:
        return None

    node = <Node>path[n - 1]
    share_t = tuple(share) if share is not None else None
    if node.detailed:
        parts = [domain]
        for i in range(n):
            entry = <tuple>entries[i]
            k = <str>entry[0]
            v = <str>entry[1]
            if share_t is not None and share_t[i]:
                parts.append(k + "_" + <str>share_t[i])
            elif share_t is not None:
                parts.append(_k_or_kv(k, v))
            else:
                parts.append(k + "_" + v)
        return rule, ".".join(parts), share_t, not leaf
    if not dynamic:
        return node.found if share_t is None else (rule, node.full_key, share_t, True)
    parts = [domain]
    cdef Node pnode
    for i in range(n):
        entry = <tuple>entries[i]
        k = <str>entry[0]
        v = <str>entry[1]
        pnode = <Node>path[i]
        how = hows[i]
        if how == WILDCARD:
            if share_t is not None and share_t[i]:
                parts.append(k + "_" + <str>share_t[i])
            elif pnode.value_to_metric:
                parts.append(_k_or_kv(k, v))
            else:
                parts.append(k + "_" + _trim_prefix(pnode.final_key, k + "_"))
        elif how == EXACT:
            parts.append(_k_or_kv(k, v))
        elif pnode.value_to_metric and v:
            parts.append(k + "_" + v)
        else:
            parts.append(k)
    cdef str enhanced = ".".join(parts)
    return rule, enhanced, share_t, enhanced == node.full_key
