# cython: language_level=3
# What the compiled hot path shares: the clocks read in C (`clock_now`), and reading and
# writing the slots of its objects (msgspec Structs: Request,
# Descriptor, Status, Response; __slots__ classes: config.Rule, stats.RuleStats) at their
# offsets, for the compiled modules. A generic attribute lookup costs about a hundred
# instructions, a slot read a few: a decision reads some fifty of them. An object of another
# type than the one the offset was taken from (a subclass, a stand-in) takes the ordinary
# attribute path.

from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.ref cimport Py_INCREF, Py_XDECREF
from posix.time cimport clock_gettime, clockid_t, timespec


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        Py_ssize_t offset

    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member


cdef inline Py_ssize_t offset_of(object cls, str name) except -1:
    """The offset of slot `name` of `cls` (its member descriptor's)."""
    for klass in cls.__mro__:
        descriptor = klass.__dict__.get(name)
        if descriptor is not None:
            if type(descriptor).__name__ != "member_descriptor":
                raise TypeError(f"{cls.__name__}.{name} is not a slot")
            return (<PyMemberDescrObject*>descriptor).d_member.offset
    raise AttributeError(f"{cls.__name__} has no slot {name}")


cdef inline tuple offsets(object cls, tuple names):
    """The offsets of several slots of `cls`, in order."""
    return tuple([offset_of(cls, name) for name in names])


cdef inline object get(object obj, object cls, Py_ssize_t offset, str name):
    """`obj.<name>`, straight from its slot when `obj` is exactly a `cls`."""
    cdef PyObject* value
    if <PyTypeObject*>Py_TYPE(obj) is <PyTypeObject*>cls:
        value = (<PyObject**>((<char*><PyObject*>obj) + offset))[0]
        if value is not NULL:
            return <object>value
    return getattr(obj, name)


cdef inline void put(object obj, object cls, Py_ssize_t offset, str name, object value) except *:
    """`obj.<name> = value`, straight into its slot when `obj` is exactly a `cls`."""
    cdef PyObject** slot
    cdef PyObject* old
    if <PyTypeObject*>Py_TYPE(obj) is <PyTypeObject*>cls:
        slot = <PyObject**>((<char*><PyObject*>obj) + offset)
        old = slot[0]
        Py_INCREF(value)
        slot[0] = <PyObject*>value
        Py_XDECREF(old)
        return
    setattr(obj, name, value)


cdef inline double clock_now(clockid_t which, object clock) except? -1.0:
    """`clock()`, read in C when it is the Python function of the clock `which` is
    (`clock` None: time.time is CLOCK_REALTIME, time.perf_counter CLOCK_MONOTONIC)."""
    cdef timespec ts
    if clock is None:
        clock_gettime(which, &ts)
        return ts.tv_sec + ts.tv_nsec * 1e-9
    return clock()
