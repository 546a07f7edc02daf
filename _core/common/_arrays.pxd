# Inline numpy C-API helpers shared by the kernels (no runtime import), and the fast
# readers of small integer arguments (``fast_len``, ``fast_read``). A module that cimports
# this must call cnp.import_array() once at import.
cimport numpy as cnp
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.ref cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy


cdef inline int plain_int_width(object x) noexcept:
    """4 or 8 for a 1-D, C-contiguous, aligned, native-order int32/int64 ndarray (the
    layout the kernels read directly), else 0: such arrays skip the Python-level checks
    and the buffer acquisition; anything else goes through specfsm._checks.token_ids."""
    if not cnp.PyArray_Check(x):
        return 0
    cdef cnp.ndarray a = <cnp.ndarray>x
    if cnp.PyArray_NDIM(a) != 1 or not cnp.PyArray_ISCARRAY_RO(a):
        return 0
    if not cnp.PyArray_ISSIGNED(a):
        return 0
    cdef Py_ssize_t w = cnp.PyArray_ITEMSIZE(a)
    if w == 4 or w == 8:
        return <int>w
    return 0


cdef inline const void* array_data(object x) noexcept:
    return cnp.PyArray_DATA(<cnp.ndarray>x)


cdef inline Py_ssize_t array_len(object x) noexcept:
    return cnp.PyArray_DIM(<cnp.ndarray>x, 0)


# A call's fast path for its usual arguments: a 1-D C-contiguous native int32/int64
# array, or a list or tuple of plain ints, is copied into memory of the call's own and
# checked there in C. Whatever these do not take makes the call decline, with nothing
# changed, to its general path (specfsm._checks and the concept's checks), which raises
# the one message: a fast path changes which code runs, never a result or an error.
cdef inline Py_ssize_t fast_len(object x) noexcept:
    """The entry count of an argument ``fast_read`` takes, or -1."""
    if type(x) is list:
        return PyList_GET_SIZE(x)
    if type(x) is tuple:
        return PyTuple_GET_SIZE(x)
    if plain_int_width(x):
        return array_len(x)
    return -1


cdef inline int fast_read(object x, Py_ssize_t n, int64_t* dst) noexcept:
    """Copy the ``n`` entries of ``x`` (``fast_len(x) == n``, checked again: code run since
    may have changed a list) into ``dst``; 0 when every entry is a plain int within int64,
    else -1. Runs no Python code."""
    cdef Py_ssize_t q
    cdef PyObject* v
    cdef int ovf = 0
    cdef const int32_t* p32
    cdef bint listed = type(x) is list
    if listed or type(x) is tuple:
        if (PyList_GET_SIZE(x) if listed else PyTuple_GET_SIZE(x)) != n:
            return -1
        for q in range(n):
            v = PyList_GET_ITEM(x, q) if listed else PyTuple_GET_ITEM(x, q)
            if not PyLong_CheckExact(<object>v):
                return -1
            dst[q] = PyLong_AsLongLongAndOverflow(<object>v, &ovf)
            if ovf:
                return -1
        return 0
    cdef int width = plain_int_width(x)
    if width == 0 or array_len(x) != n:
        return -1
    if width == 8:
        memcpy(dst, array_data(x), n * sizeof(int64_t))
    else:
        p32 = <const int32_t*>array_data(x)
        for q in range(n):
            dst[q] = p32[q]
    return 0
