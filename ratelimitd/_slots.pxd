# cython: language_level=3
# Reading and writing the slots of the hot path's objects (msgspec Structs: Request,
# Descriptor, Status, Response; __slots__ classes: config.Rule, stats.RuleStats) at their
# offsets, for the compiled modules. A generic attribute lookup costs about a hundred
# instructions, a slot read a few: a decision reads some fifty of them. An object of another
# type than the one the offset was taken from (a subclass, a stand-in) takes the ordinary
# attribute path.

from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.ref cimport Py_INCREF, Py_XDECREF


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
