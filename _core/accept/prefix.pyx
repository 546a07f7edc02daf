# cython: language_level=3
"""Prefix matching of a draft against the target's row tokens (compiled)."""

import numpy as np

from specfsm._checks import entries, token_ids

from libc.stdint cimport int32_t, int64_t
cimport numpy as cnp

from _arrays cimport plain_int_width, array_data, array_len

from _typedefs cimport token_t
from _seq cimport obj_eq, Py_SIZE

__all__ = ["common_prefix"]

cnp.import_array()


cdef inline Py_ssize_t _prefix_typed(const token_t* a, const token_t* b, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# Below this many rows the loop is shorter than releasing and retaking the GIL.
cdef enum:
    NOGIL_MIN = 4096


cdef Py_ssize_t _prefix_arrays(object a, object b, int width) noexcept:
    """a and b: plain 1-D arrays (see _arrays.pxd) of one width, 4 or 8 bytes."""
    cdef Py_ssize_t n = min(array_len(a), array_len(b))
    cdef const void* pa = array_data(a)
    cdef const void* pb = array_data(b)
    cdef Py_ssize_t r
    if width == 4:
        if n >= NOGIL_MIN:
            with nogil:
                r = _prefix_typed(<const int32_t*>pa, <const int32_t*>pb, n)
        else:
            r = _prefix_typed(<const int32_t*>pa, <const int32_t*>pb, n)
    else:
        if n >= NOGIL_MIN:
            with nogil:
                r = _prefix_typed(<const int64_t*>pa, <const int64_t*>pb, n)
        else:
            r = _prefix_typed(<const int64_t*>pa, <const int64_t*>pb, n)
    return r


cdef Py_ssize_t _prefix_views(const token_t[::1] a, const token_t[::1] b) noexcept:
    """The typed-memoryview entry, for arrays as_token_array has just made plain."""
    cdef Py_ssize_t n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    cdef Py_ssize_t r
    with nogil:
        r = _prefix_typed(&a[0], &b[0], n)
    return r


cdef Py_ssize_t _prefix_seq(object a, object b) except -1:
    """a and b are lists or tuples; lengths are re-read each step since __eq__ may mutate."""
    cdef Py_ssize_t i = 0
    while i < Py_SIZE(a) and i < Py_SIZE(b):
        if not obj_eq(a, i, b, i):
            break
        i += 1
    return i


cdef object _as_seq(object x, str name):
    t = type(x)
    if t is list or t is tuple:
        return x
    if isinstance(x, np.ndarray):
        return token_ids(x, name).tolist()
    return entries(x, name, listed=True)  # the rare generic path: the twin's rule


def common_prefix(draft, row_tokens):
    ta = type(draft)
    tb = type(row_tokens)
    if (ta is list or ta is tuple) and (tb is list or tb is tuple):
        return _prefix_seq(draft, row_tokens)
    # exact ndarrays only: a subclass (whose own methods could answer otherwise) is
    # converted, as in the twin
    cdef int wa = plain_int_width(draft) if ta is np.ndarray else 0
    if wa and tb is np.ndarray and wa == plain_int_width(row_tokens):
        return _prefix_arrays(draft, row_tokens, wa)
    if isinstance(draft, np.ndarray) and isinstance(row_tokens, np.ndarray):
        # the call's own copies: taking a typed view can run Python code (a finalizer
        # that resizes a caller's array in place), so the loop reads only these
        a = token_ids(draft, "draft", own=True)
        b = token_ids(row_tokens, "row_tokens", own=True)
        if a.dtype != b.dtype:
            a = a.astype(np.int64, copy=False)
            b = b.astype(np.int64, copy=False)
        if a.dtype.itemsize == 4:
            return _prefix_views[int32_t](a, b)
        return _prefix_views[int64_t](a, b)
    return _prefix_seq(_as_seq(draft, "draft"), _as_seq(row_tokens, "row_tokens"))
