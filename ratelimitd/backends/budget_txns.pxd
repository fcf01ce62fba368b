# The types of `budget_txns.py` compiled in Cython's pure-Python mode (the same source runs
# uncompiled where the extension is not built); `memory_budget.pxd` cimports them.

cimport cython


# Strings and C integers only: no collector hooks (no cycle can go through it).
@cython.final
cdef class Txn:
    cdef readonly str id
    cdef public str state
    cdef public str starts
    cdef public long long estimate, deadline, due

    cpdef Txn copy(self)


@cython.locals(i=cython.Py_ssize_t)
cpdef str spell(tuple starts)

@cython.locals(out=list, pair=str, name=str, start=str)
cpdef tuple read(str spelt)

cdef inline bint _before(Txn a, Txn b)

@cython.locals(i=cython.Py_ssize_t, parent=cython.Py_ssize_t, p=Txn)
cpdef push(list heap, Txn x)

@cython.locals(last=Txn, top=Txn, c=Txn, n=cython.Py_ssize_t, i=cython.Py_ssize_t,
               child=cython.Py_ssize_t)
cpdef Txn pop(list heap)
