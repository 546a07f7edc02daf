# Inline numpy C-API helpers shared by the kernels (no runtime import). A module that
# cimports this must call cnp.import_array() once at import.
cimport numpy as cnp


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
