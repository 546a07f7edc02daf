# cython: language_level=3
"""Prompt-lookup (n-gram) drafting (compiled)."""

import numpy as np

from specfsm._checks import check_count, entries, token_id, token_ids

from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy
from cpython.mem cimport PyMem_Malloc, PyMem_Free
cimport numpy as cnp

from _arrays cimport plain_int_width, array_data, array_len

from _typedefs cimport token_t
from cpython.object cimport PyObject
from _seq cimport Py_SIZE, PySequence_Fast_GET_ITEM

__all__ = ["prompt_lookup"]

cnp.import_array()

from _scan cimport find_last as _find_last

cdef enum:
    NOGIL_MIN = 2048    # below this many entries the scan is shorter than a GIL release


cdef Py_ssize_t _match_end_typed(const token_t* p, Py_ssize_t n, Py_ssize_t ngram) noexcept nogil:
    """End of the most recent earlier occurrence of p[:n]'s last ngram entries, or -1.

    Candidate end positions are found newest first by a vectorised backward search for
    the needle's last token (scan.h); each candidate then has its other ngram - 1
    entries compared.
    """
    if ngram == 0 or n <= ngram:
        return -1
    cdef const token_t* needle = p + (n - ngram)
    cdef Py_ssize_t lo = ngram - 1       # lowest candidate end (start 0)
    cdef Py_ssize_t e = n - 2            # highest candidate end (start n - ngram - 1)
    cdef Py_ssize_t j, s
    while True:
        e = _find_last(p, lo, e, p[n - 1])
        if e < 0:
            return -1
        s = e - lo
        j = 0
        while j < lo and p[s + j] == needle[j]:
            j += 1
        if j == lo:
            return e + 1
        e -= 1


cdef Py_ssize_t _match_end_plain(object arr, int width, Py_ssize_t ngram) noexcept:
    """arr: a plain 1-D array (see _arrays.pxd) of 4- or 8-byte ids; GIL released when long."""
    cdef Py_ssize_t n = array_len(arr)
    cdef const void* p = array_data(arr)
    cdef Py_ssize_t r
    if width == 4:
        if n >= NOGIL_MIN:
            with nogil:
                r = _match_end_typed(<const int32_t*>p, n, ngram)
        else:
            r = _match_end_typed(<const int32_t*>p, n, ngram)
    else:
        if n >= NOGIL_MIN:
            with nogil:
                r = _match_end_typed(<const int64_t*>p, n, ngram)
        else:
            r = _match_end_typed(<const int64_t*>p, n, ngram)
    return r


cdef Py_ssize_t _match_end_views(const token_t[::1] h, Py_ssize_t ngram) noexcept:
    """The typed-memoryview entry, for arrays as_token_array has just made plain."""
    cdef Py_ssize_t n = h.shape[0]
    if n == 0:
        return -1
    cdef Py_ssize_t r
    with nogil:
        r = _match_end_typed(&h[0], n, ngram)
    return r


cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        pass
    PyTypeObject PyLong_Type
    PyTypeObject* Py_TYPE(PyObject* o)
    long long _as_longlong "PyLong_AsLongLongAndOverflow"(PyObject* o, int* overflow)


cdef int _id_slow(object h, Py_ssize_t i, Py_ssize_t n, int64_t* out) except -1:
    """Entry i by ``specfsm._checks.token_id`` (the twin's rule: it refuses non-ids),
    then the size checked again (a numpy-integer subclass's ``__index__`` may change h)."""
    value = token_id(<object>PySequence_Fast_GET_ITEM(h, i), "history", i)
    if Py_SIZE(h) != n:
        raise RuntimeError("history changed size during prompt_lookup")
    out[0] = value
    return 0


cdef inline int _id_at(object h, Py_ssize_t i, Py_ssize_t n, int64_t* out) except -1:
    """Entry i of the list or tuple h (n entries) as a token id, into out: an exact int
    within int64 read in C, anything else through ``_id_slow``."""
    cdef PyObject* x = PySequence_Fast_GET_ITEM(h, i)
    cdef int overflow = 0
    cdef long long v
    if Py_TYPE(x) == &PyLong_Type:
        v = _as_longlong(x, &overflow)
        if not overflow:
            out[0] = v
            return 0
    return _id_slow(h, i, n, out)


cdef inline Py_ssize_t _find_last_id(object h, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n,
                                     int64_t last, PyObject* last_obj) except -2:
    """The largest e in [lo, hi] whose entry of h (a list or tuple of n entries) is the id
    ``last``, or -1. An entry that is ``last_obj`` itself (the needle's last entry, already
    read) matches without being read again; an exact int is read in C."""
    cdef Py_ssize_t e
    cdef PyObject* item
    cdef int overflow
    cdef long long value
    cdef int64_t slow
    for e in range(hi, lo - 1, -1):
        item = PySequence_Fast_GET_ITEM(h, e)
        if item == last_obj:
            return e
        if Py_TYPE(item) == &PyLong_Type:
            overflow = 0
            value = _as_longlong(item, &overflow)
            if not overflow:
                if value == last:
                    return e
                continue
        _id_slow(h, e, n, &slow)  # refuses a non-id, and an int beyond int64
        if slow == last:
            return e
    return -1


cdef enum:
    NEEDLE_ON_STACK = 16


cdef Py_ssize_t _match_end_ids(object h, Py_ssize_t ngram) except -2:
    """The same search over a list or tuple of token ids, reading its entries in the
    twin's order (the needle first, then candidate ends newest first, then a candidate's
    other entries from the front), so both refuse the same first bad entry."""
    cdef Py_ssize_t n = Py_SIZE(h)
    if ngram == 0 or n <= ngram:
        return -1
    cdef Py_ssize_t base = n - ngram, lo = ngram - 1, e, j, s
    cdef int64_t on_stack[NEEDLE_ON_STACK]
    cdef int64_t* needle = on_stack
    cdef int64_t x
    if ngram > NEEDLE_ON_STACK:
        needle = <int64_t*>PyMem_Malloc(ngram * sizeof(int64_t))
        if needle == NULL:
            raise MemoryError()
    try:
        for j in range(ngram):
            _id_at(h, base + j, n, &needle[j])
        # a strong reference: the address of the needle's last entry is not reused while
        # the scan runs, whatever happens to h's entries
        last_ref = <object>PySequence_Fast_GET_ITEM(h, n - 1)
        e = n - 2
        while True:
            e = _find_last_id(h, lo, e, n, needle[lo], <PyObject*>last_ref)
            if e < 0:
                return -1
            s = e - lo
            j = 0
            while j < lo:
                _id_at(h, s + j, n, &x)
                if x != needle[j]:
                    break
                j += 1
            if j == lo:
                return e + 1
            e -= 1
    finally:
        if needle != on_stack:
            PyMem_Free(needle)


cdef list _ids_from(object h, Py_ssize_t start, Py_ssize_t stop):
    """Entries start..stop - 1 of h as Python ints (exact ints as they are)."""
    cdef Py_ssize_t n = Py_SIZE(h), i
    cdef int64_t x
    cdef list out = []
    for i in range(start, stop):
        item = <object>PySequence_Fast_GET_ITEM(h, i)
        if type(item) is int and -9223372036854775808 <= item <= 9223372036854775807:
            out.append(item)
        else:
            _id_at(h, i, n, &x)
            out.append(x)
    return out


def prompt_lookup(history, ngram, max_k):
    cdef Py_ssize_t g, k, end, n
    cdef const void* data
    if type(ngram) is not int or ngram < 0:
        ngram = check_count(ngram, "ngram")
    if type(max_k) is not int or max_k < 0:
        max_k = check_count(max_k, "max_k")
    th = type(history)
    # an exact ndarray only: a subclass (whose own methods could answer otherwise) takes
    # the converting path, as in the twin
    cdef int width = plain_int_width(history) if th is np.ndarray else 0
    cdef cnp.npy_intp take
    if width:
        # the fast path: ids read in place, the draft copied into a new array of its dtype
        n = array_len(history)
        g = min(<object>ngram, n)
        k = min(<object>max_k, n)
        end = -1 if k == 0 else _match_end_plain(history, width, g if g == ngram else n)
        take = 0 if end < 0 else min(n - end, k)
        data = array_data(history)
        out = cnp.PyArray_SimpleNew(1, &take, cnp.PyArray_TYPE(<cnp.ndarray>history))
        # the allocation may run Python code (a finalizer) that resizes the history in
        # place: copy only from the array that was searched
        if plain_int_width(history) != width or array_len(history) != n or array_data(history) != data:
            raise RuntimeError("history changed size during prompt_lookup")
        if take:
            memcpy(cnp.PyArray_DATA(<cnp.ndarray>out), <const char*>data + end * width, take * width)
        return out
    if th is list or th is tuple:
        seq = history
    elif isinstance(history, np.ndarray):
        # read once: the draft is cut from the converted ids, in the caller's dtype
        dt = history.dtype
        # the call's own copy: taking a typed view can run Python code (a finalizer that
        # resizes the caller's array in place), so the search reads only this
        arr = token_ids(history, "history", own=True)
        n = arr.shape[0]
        g = min(<object>ngram, n)
        k = min(<object>max_k, n)
        if k == 0:
            end = -1
        elif arr.dtype.itemsize == 4:
            end = _match_end_views[int32_t](arr, g if g == ngram else n)
        else:
            end = _match_end_views[int64_t](arr, g if g == ngram else n)
        if end < 0:
            return np.empty(0, dtype=dt)
        return np.array(arr[end : end + min(n - end, k)], dtype=dt)
    else:
        seq = entries(history, "history", listed=True)  # other sequences: as a list, the twin's rule
    n = Py_SIZE(seq)
    g = min(<object>ngram, n)
    k = min(<object>max_k, n)
    end = -1 if k == 0 else _match_end_ids(seq, g if g == ngram else n)
    if end < 0:
        return []
    return _ids_from(seq, end, end + min(n - end, k))
