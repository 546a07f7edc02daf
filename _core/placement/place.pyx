# cython: language_level=3
"""Row placement on the host: ``dst[b] = src[b, index[b]]`` as raw byte copies, and the
batched settle that chooses ``index`` (compiled).

Arguments are converted (the index and the counts into private copies), then checked
once at the Python boundary by ``specfsm._checks`` and the concept's check module (shared with the twin and the
CuPy path, so every path raises the same errors); the loops then run with the GIL
released over the private copies, the row index re-checked where a row is read.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcpy
from cpython.mem cimport PyMem_Malloc, PyMem_Free

import numpy as np

cimport numpy as cnp

from _arrays cimport plain_int_width

from specfsm.placement._checks import (
    as_host_index,
    as_settle_arrays,
    check_place_arrays,
    host_index_array,
    index_reason,
    check_host_overlap,
    settle_index_reason,
)

cnp.import_array()

__all__ = ["place_rows", "settle_index"]

ctypedef fused index_t:
    int32_t
    int64_t


cdef Py_ssize_t _first_out_of_range(const index_t* idx, Py_ssize_t B, Py_ssize_t K) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(B):
        if idx[b] >= K:
            return b
    return -1


cdef void _copy_rows(const index_t* idx, Py_ssize_t B, const uint8_t* s, uint8_t* d,
                     Py_ssize_t K, Py_ssize_t row) noexcept nogil:
    cdef Py_ssize_t b, k
    for b in range(B):
        k = <Py_ssize_t>idx[b]
        if k >= 0 and k < K:   # checked before the call too; kept where the row is read
            memcpy(d + b * row, s + (b * K + k) * row, <size_t>row)


def place_rows(src, index, dst):
    cdef Py_ssize_t B, K, row, bad, n = 0
    cdef cnp.ndarray s_arr, d_arr, i_arr
    cdef const uint8_t* sp
    cdef uint8_t* dp
    cdef void* ibuf = NULL
    cdef const void* ip = NULL
    cdef int w = 0
    if type(src) is not np.ndarray or type(dst) is not np.ndarray:
        raise TypeError(
            f"src and dst must be numpy arrays here, got {type(src).__name__} and "
            f"{type(dst).__name__}")
    # The index is converted into a private copy first (running whatever the conversion
    # runs), then everything is checked; the copy loop reads only that copy. A plain
    # int32/int64 array is copied with one memcpy into a buffer this call owns.
    if type(index) is np.ndarray:
        w = plain_int_width(index)
    if w:
        n = cnp.PyArray_DIM(<cnp.ndarray>index, 0)
        ibuf = PyMem_Malloc(<size_t>(n * w if n else 1))
        if ibuf == NULL:
            raise MemoryError()
        memcpy(ibuf, cnp.PyArray_DATA(<cnp.ndarray>index), <size_t>(n * w))
        ip = ibuf
    try:
        if not w:
            i_obj = host_index_array(index)
        B, K, row = check_place_arrays(src, dst)
        if w:
            if n != B:
                raise ValueError(f"index has {n} entries; it needs one per request (B={B})")
        else:
            i_arr = as_host_index(i_obj, B, K, False)
            w = <int>cnp.PyArray_ITEMSIZE(i_arr)
            ip = cnp.PyArray_DATA(i_arr)
        if w == 4:
            bad = _first_out_of_range(<const int32_t*>ip, B, K)
        else:
            bad = _first_out_of_range(<const int64_t*>ip, B, K)
        if bad >= 0:
            raise IndexError(index_reason(
                bad, (<const int32_t*>ip)[bad] if w == 4 else (<const int64_t*>ip)[bad], K))
        check_host_overlap(src, index, dst)
        if B == 0 or row == 0 or K == 0:   # nothing to copy (K == 0: every entry is negative)
            return dst
        s_arr = src
        d_arr = dst
        # the checks above ran Python code (a finalizer may reshape or resize an array in
        # place): the copy, which stays within these bytes, reads the layout once more
        if (not cnp.PyArray_IS_C_CONTIGUOUS(s_arr) or not cnp.PyArray_IS_C_CONTIGUOUS(d_arr)
                or cnp.PyArray_NBYTES(s_arr) != B * K * row or cnp.PyArray_NBYTES(d_arr) != B * row):
            raise RuntimeError("src or dst changed shape while place_rows checked them")
        sp = <const uint8_t*>cnp.PyArray_DATA(s_arr)
        dp = <uint8_t*>cnp.PyArray_DATA(d_arr)
        if w == 4:
            with nogil:
                _copy_rows(<const int32_t*>ip, B, sp, dp, K, row)
        else:
            with nogil:
                _copy_rows(<const int64_t*>ip, B, sp, dp, K, row)
    finally:
        PyMem_Free(ibuf)
    return dst


cdef Py_ssize_t _settle(const int64_t* a, const int64_t* d, int64_t* out,
                        Py_ssize_t B) noexcept nogil:
    cdef Py_ssize_t b
    cdef int64_t n, m
    for b in range(B):
        n = a[b]
        m = d[b]
        if m < 0 or n < 0 or n > m:
            return b
        if m == 0:
            out[b] = -1
        elif n == m:
            out[b] = n - 1
        else:
            out[b] = n
    return -1


def settle_index(accepted, draft_lens):
    cdef Py_ssize_t bad, B
    cdef cnp.npy_intp dim
    cdef int64_t* buf
    cdef cnp.ndarray a_arr, d_arr, o_arr
    if (type(accepted) is np.ndarray and type(draft_lens) is np.ndarray
            and _plain_int64(accepted) and _plain_int64(draft_lens)
            and cnp.PyArray_DIM(<cnp.ndarray>accepted, 0) == cnp.PyArray_DIM(<cnp.ndarray>draft_lens, 0)):
        # the common case: both counts copied into one private buffer with a memcpy each
        a_arr = accepted
        d_arr = draft_lens
        B = cnp.PyArray_DIM(a_arr, 0)
        dim = B
        buf = <int64_t*>PyMem_Malloc(<size_t>(2 * B + 1) * sizeof(int64_t))
        if buf == NULL:
            raise MemoryError()
        try:
            # copied before anything that can run Python code (the output's allocation
            # may run a finalizer that resizes the caller's arrays)
            memcpy(buf, cnp.PyArray_DATA(a_arr), <size_t>B * sizeof(int64_t))
            memcpy(buf + B, cnp.PyArray_DATA(d_arr), <size_t>B * sizeof(int64_t))
            o_arr = cnp.PyArray_EMPTY(1, &dim, cnp.NPY_INT64, 0)
            with nogil:
                bad = _settle(buf, buf + B, <int64_t*>cnp.PyArray_DATA(o_arr), B)
            if bad >= 0:
                raise ValueError(settle_index_reason(bad, buf[bad], buf[B + bad]))
        finally:
            PyMem_Free(buf)
        return o_arr
    a, d = as_settle_arrays(accepted, draft_lens)  # private copies
    a_arr = a
    d_arr = d
    B = cnp.PyArray_DIM(a_arr, 0)
    o_arr = cnp.PyArray_EMPTY(1, cnp.PyArray_DIMS(a_arr), cnp.NPY_INT64, 0)
    with nogil:
        bad = _settle(<const int64_t*>cnp.PyArray_DATA(a_arr), <const int64_t*>cnp.PyArray_DATA(d_arr),
                      <int64_t*>cnp.PyArray_DATA(o_arr), B)
    if bad >= 0:
        raise ValueError(settle_index_reason(bad, int(a[bad]), int(d[bad])))
    return o_arr


cdef inline bint _plain_int64(object x):
    """A 1-D, C-contiguous, aligned, native int64 ndarray (read by memcpy)."""
    cdef cnp.ndarray a = <cnp.ndarray>x
    return (cnp.PyArray_NDIM(a) == 1 and cnp.PyArray_ISCARRAY_RO(a)
            and cnp.PyArray_TYPE(a) == cnp.NPY_INT64)
