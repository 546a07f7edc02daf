# Inline helpers over Python lists and tuples, shared by the kernels (no runtime import).
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_DECREF

cdef extern from "Python.h":
    Py_ssize_t Py_SIZE(object o)
    PyObject* PySequence_Fast_GET_ITEM(object o, Py_ssize_t i)
    int PyObject_RichCompareBool(PyObject* a, PyObject* b, int op) except -1
    int Py_EQ


cdef inline int obj_eq(object seq_a, Py_ssize_t i, object seq_b, Py_ssize_t j) except -1:
    """seq_a[i] == seq_b[j] for lists/tuples, identity first, holding references while
    user-defined __eq__ runs. The caller guarantees both indices are in range."""
    cdef PyObject* x = PySequence_Fast_GET_ITEM(seq_a, i)
    cdef PyObject* y = PySequence_Fast_GET_ITEM(seq_b, j)
    cdef int r
    if x == y:
        return 1
    Py_INCREF(<object>x)
    Py_INCREF(<object>y)
    try:
        r = PyObject_RichCompareBool(x, y, Py_EQ)
    finally:
        Py_DECREF(<object>x)
        Py_DECREF(<object>y)
    return r
