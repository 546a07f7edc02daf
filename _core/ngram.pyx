# cython: language_level=3
"""Prompt-lookup (n-gram) drafting (compiled)."""

import numpy as np

from specfsm._validate import as_token_array, check_count

from libc.stdint cimport int32_t, int64_t

from _typedefs cimport token_t
from _seq cimport obj_eq, Py_SIZE

__all__ = ["prompt_lookup"]

cdef enum:
    BLOCK = 32          # candidates tested per vectorised step of the backward scan
    NOGIL_MIN = 2048    # below this many entries the scan is shorter than a GIL release


cdef Py_ssize_t _match_end_typed(const token_t[::1] h, Py_ssize_t ngram) noexcept nogil:
    """End of the most recent earlier occurrence of h's last ngram entries, or -1.

    Scans candidate end positions backwards, BLOCK at a time: a block with no entry equal
    to the needle's last token is skipped with one branch (the compiler vectorises the
    comparison), otherwise its candidates are checked one by one, newest first.
    """
    cdef Py_ssize_t n = h.shape[0]
    if ngram == 0 or n <= ngram:
        return -1
    cdef const token_t* p = &h[0]
    cdef const token_t* needle = p + (n - ngram)
    cdef token_t last = p[n - 1]
    cdef Py_ssize_t lo = ngram - 1       # lowest candidate end (start 0)
    cdef Py_ssize_t e = n - 2            # highest candidate end (start n - ngram - 1)
    cdef Py_ssize_t k, j, s
    cdef int hit
    while e >= lo:
        if e - (BLOCK - 1) >= lo:
            hit = 0
            for k in range(e - (BLOCK - 1), e + 1):
                hit |= (p[k] == last)
            if not hit:
                e -= BLOCK
                continue
            # a hit in this block: test its candidates individually, newest first
            for k in range(BLOCK):
                if p[e] == last:
                    s = e - lo
                    j = 0
                    while j < lo and p[s + j] == needle[j]:
                        j += 1
                    if j == lo:
                        return e + 1
                e -= 1
            continue
        if p[e] == last:
            s = e - lo
            j = 0
            while j < lo and p[s + j] == needle[j]:
                j += 1
            if j == lo:
                return e + 1
        e -= 1
    return -1


cdef Py_ssize_t _match_end_array(object arr, Py_ssize_t ngram) except -2:
    cdef const int32_t[::1] h32
    cdef const int64_t[::1] h64
    cdef Py_ssize_t r
    if arr.dtype.itemsize == 4:
        h32 = arr
        if h32.shape[0] >= NOGIL_MIN:
            with nogil:
                r = _match_end_typed(h32, ngram)
        else:
            r = _match_end_typed(h32, ngram)
    else:
        h64 = arr
        if h64.shape[0] >= NOGIL_MIN:
            with nogil:
                r = _match_end_typed(h64, ngram)
        else:
            r = _match_end_typed(h64, ngram)
    return r


cdef Py_ssize_t _match_end_seq(object h, Py_ssize_t ngram) except -2:
    """The same scan over a list or tuple of arbitrary entries compared with ==."""
    cdef Py_ssize_t n = Py_SIZE(h)
    if ngram == 0 or n <= ngram:
        return -1
    cdef Py_ssize_t base = n - ngram
    cdef Py_ssize_t lo = ngram - 1
    cdef Py_ssize_t e, j, s
    for e in range(n - 2, lo - 1, -1):
        if Py_SIZE(h) != n:
            raise RuntimeError("history changed size during prompt_lookup")
        if obj_eq(h, e, h, n - 1):
            s = e - lo
            j = 0
            while j < lo:
                if Py_SIZE(h) != n:
                    raise RuntimeError("history changed size during prompt_lookup")
                if not obj_eq(h, s + j, h, base + j):
                    break
                j += 1
            if j == lo:
                return e + 1
    return -1


def prompt_lookup(history, ngram, max_k):
    """Draft up to ``max_k`` entries that followed the most recent earlier occurrence of
    ``history``'s last ``ngram`` entries.

    Returns an empty draft when ``ngram`` or ``max_k`` is 0, when ``history`` is not
    longer than ``ngram``, or when there is no earlier occurrence. A numpy ``history``
    gives a numpy draft of the same dtype; anything else gives a list.
    """
    cdef Py_ssize_t g, k, end, n
    if type(ngram) is not int or ngram < 0:
        ngram = check_count(ngram, "ngram")
    if type(max_k) is not int or max_k < 0:
        max_k = check_count(max_k, "max_k")
    th = type(history)
    if th is list or th is tuple:
        seq = history
    elif isinstance(history, np.ndarray):
        arr = as_token_array(history, "history")
        g = min(<object>ngram, arr.shape[0])
        k = min(<object>max_k, arr.shape[0])
        end = -1 if k == 0 else _match_end_array(arr, g if g == ngram else arr.shape[0])
        if end < 0:
            return history[:0].copy()
        return history[end : end + min(arr.shape[0] - end, k)].copy()
    else:
        from specfsm._py._seq import as_entries  # generic sequences: same rules as the twin
        seq = as_entries(history, "history")
    n = Py_SIZE(seq)
    g = min(<object>ngram, n)
    k = min(<object>max_k, n)
    end = -1 if k == 0 else _match_end_seq(seq, g if g == ngram else n)
    if end < 0:
        return []
    return list(seq[end : end + min(n - end, k)])
