# cython: language_level=3
"""The steady step of an index per batch row: every row only grew by its sampled tokens (compiled)."""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free

import numpy as np

cimport numpy as cnp
from _arrays cimport plain_int_width, array_data, array_len

cnp.import_array()

__all__ = ["steady_rows"]


cdef const void* _array_of(object x, int nd, char kind, Py_ssize_t* shape, str name) except NULL:
    """The data of ``x``, an ``nd``-dimensional, C-contiguous, aligned, native-order
    array of 8-byte integers (``kind`` ``'i'`` signed, ``'u'`` unsigned), its shape in
    ``shape``; ValueError naming it otherwise."""
    cdef cnp.ndarray a
    if cnp.PyArray_Check(x):
        a = <cnp.ndarray>x
        if (cnp.PyArray_NDIM(a) == nd and cnp.PyArray_ISCARRAY_RO(a) and cnp.PyArray_ITEMSIZE(a) == 8
                and (cnp.PyArray_ISSIGNED(a) if kind == c'i' else cnp.PyArray_ISUNSIGNED(a))):
            shape[0] = cnp.PyArray_DIM(a, 0)
            shape[1] = cnp.PyArray_DIM(a, 1) if nd == 2 else 1
            return cnp.PyArray_DATA(a)
    raise ValueError(f"{name} must be a {nd}-D C-contiguous {'u' if kind == c'u' else ''}int64 array")


cdef inline object _int64_empty(Py_ssize_t n, Py_ssize_t m):
    cdef cnp.npy_intp dims[2]
    dims[0] = n
    dims[1] = m
    return cnp.PyArray_EMPTY(2 if m >= 0 else 1, dims, cnp.NPY_INT64, 0)


def steady_rows(sampled, num_tokens, tok, n_old, seen, tail, spos, spread, anchors,
                Py_ssize_t deep_first, Py_ssize_t deep_every, int64_t short, int64_t cap,
                pool_filter, filter_mul):
    """Whether a step of B = ``len(sampled)`` rows is the steady state, and if so the
    new tokens for each row's index.

    Row ``r`` is steady when ``sampled[r]`` is a list of ``ns >= 1`` tokens,
    ``n_old[r] == seen[r]`` (indexed at the last call), ``n_old[r] > short`` and at least
    ``T`` (the rows of ``tail``), ``num_tokens[r] == n_old[r] + ns`` (grown by exactly
    its sampled tokens), ``num_tokens[r] <= tok.shape[1]``, ``num_tokens[r] < cap``, the
    ``T`` tokens of ``tok[r]`` before ``n_old[r]`` equal ``tail[:, r]`` and, for the rows
    ``deep_first, deep_first + deep_every, ...``, ``tok[r, spos[:, r]] == spread[:, r]``.
    ``sampled`` is a list, ``num_tokens`` a 1-D C-contiguous int32 or int64 array of at
    least B entries and ``tok`` a C-contiguous 2-D int32 or int64 array of at least B
    rows (anything else: not steady); ``n_old``, ``seen`` and ``anchors`` are int64
    with at least B entries, ``tail``, ``spos`` and ``spread`` int64 ``[T, >= B]`` /
    ``[S, >= B]`` (position-major), ``pool_filter`` and ``filter_mul`` uint64.

    Returns None when any row is not steady, else ``(lengths, new, offsets, tails, lmax,
    twins, renew)``: the B new lengths (int64), the rows' new tokens
    ``tok[r, n_old[r]:lengths[r]]`` one after another, their B + 1 offsets, the last
    ``T`` tokens at each new length (int64 ``[T, B]``), the largest length, whether some
    row's filter key (its length and last two tokens hashed with ``filter_mul``'s three
    multipliers, wrapping uint64) equals another row's or one in the sorted
    ``pool_filter``, and the list of checked rows whose length reached twice their
    anchor. Arrays that do not fit one another raise ValueError; a row that is not
    steady never does. Makes every array it returns first; then, with no Python code
    running, checks every row and reads only what it checked.
    """
    if type(sampled) is not list or not cnp.PyArray_CheckExact(tok):
        return None
    cdef cnp.ndarray ta = <cnp.ndarray>tok
    cdef int tw = <int>cnp.PyArray_ITEMSIZE(ta)
    if (cnp.PyArray_NDIM(ta) != 2 or not cnp.PyArray_ISCARRAY_RO(ta) or not cnp.PyArray_ISSIGNED(ta)
            or (tw != 4 and tw != 8)):
        return None
    cdef int w = plain_int_width(num_tokens)
    if w == 0:
        return None
    cdef Py_ssize_t sh[2]
    cdef Py_ssize_t b = PyList_GET_SIZE(sampled), T, S, rows, width
    cdef const int64_t* n_old_p = <const int64_t*>_array_of(n_old, 1, c'i', sh, "n_old")
    if sh[0] < b:
        raise ValueError(f"the row arrays must hold at least the {b} rows")
    cdef const int64_t* seen_p = <const int64_t*>_array_of(seen, 1, c'i', sh, "seen")
    if sh[0] < b:
        raise ValueError(f"the row arrays must hold at least the {b} rows")
    cdef const int64_t* anc_p = <const int64_t*>_array_of(anchors, 1, c'i', sh, "anchors")
    if sh[0] < b:
        raise ValueError(f"the row arrays must hold at least the {b} rows")
    cdef const int64_t* tail_p = <const int64_t*>_array_of(tail, 2, c'i', sh, "tail")
    T = sh[0]
    cdef Py_ssize_t tail_rows = sh[1]
    cdef const int64_t* spos_p = <const int64_t*>_array_of(spos, 2, c'i', sh, "spos")
    S = sh[0]
    cdef Py_ssize_t spos_rows = sh[1]
    cdef const int64_t* spread_p = <const int64_t*>_array_of(spread, 2, c'i', sh, "spread")
    if tail_rows < b or spos_rows < b or sh[1] < b:
        raise ValueError(f"the row arrays must hold at least the {b} rows")
    if sh[0] != S or T < 2 or sh[1] != spos_rows:
        raise ValueError("spos and spread must have the same shape, and tail at least 2 rows")
    cdef const uint64_t* pool_p = <const uint64_t*>_array_of(pool_filter, 1, c'u', sh, "pool_filter")
    cdef Py_ssize_t npool = sh[0]
    cdef const uint64_t* mul = <const uint64_t*>_array_of(filter_mul, 1, c'u', sh, "filter_mul")
    if deep_first < 0 or deep_every < 1 or sh[0] < 3:
        raise ValueError("deep_first must be >= 0, deep_every >= 1, filter_mul 3 multipliers")
    rows = cnp.PyArray_DIM(ta, 0)
    width = cnp.PyArray_DIM(ta, 1)
    if b == 0 or rows < b or array_len(num_tokens) < b:
        return None
    # scratch (C memory): each row's sampled count and start, its filter key, the key
    # table and its marks, the rows to renew
    cdef Py_ssize_t m = 4
    while m < 2 * b:
        m *= 2
    cdef void* block = calloc(1, <size_t>(4 * b + 2 + m) * 8 + <size_t>m)
    if block == NULL:
        raise MemoryError()
    cdef int64_t* counts = <int64_t*>block
    cdef int64_t* starts = counts + b
    cdef int64_t* renew = starts + b
    cdef uint64_t* keys = <uint64_t*>(renew + b + 1)
    cdef uint64_t* table = keys + b + 1
    cdef unsigned char* used = <unsigned char*>(table + m)
    cdef Py_ssize_t r, j, slot, mask, nrenew = 0, tstride = tail_rows, sstride = spos_rows
    cdef int64_t n0, n, ns, total = 0, lmax = 0, lo, hi, mid, p
    cdef uint64_t key
    cdef bint twins = False
    cdef object item
    try:
        for r in range(b):
            item = <object>PyList_GET_ITEM(sampled, r)
            if type(item) is not list:
                return None
            counts[r] = PyList_GET_SIZE(item)
            total += counts[r]
        # every array the call returns, made before the checks: from the first data
        # pointer taken below to the last read, no Python code runs
        lengths = _int64_empty(b, -1)
        offsets = _int64_empty(b + 1, -1)
        tails = _int64_empty(T, b)
        new = _int64_empty(total, -1)
        if PyList_GET_SIZE(sampled) != b or array_len(num_tokens) < b:
            return None      # (changed by code the allocations ran)
        # the caller's arrays again, from scratch (the allocations may have run code
        # that replaced what the pointers above saw)
        n_old_p = <const int64_t*>_array_of(n_old, 1, c'i', sh, "n_old")
        if sh[0] < b: return None
        seen_p = <const int64_t*>_array_of(seen, 1, c'i', sh, "seen")
        if sh[0] < b: return None
        anc_p = <const int64_t*>_array_of(anchors, 1, c'i', sh, "anchors")
        if sh[0] < b: return None
        tail_p = <const int64_t*>_array_of(tail, 2, c'i', sh, "tail")
        if sh[0] != T or sh[1] < b: return None
        tstride = sh[1]
        spos_p = <const int64_t*>_array_of(spos, 2, c'i', sh, "spos")
        if sh[0] != S or sh[1] < b: return None
        sstride = sh[1]
        spread_p = <const int64_t*>_array_of(spread, 2, c'i', sh, "spread")
        if sh[0] != S or sh[1] != sstride: return None
        pool_p = <const uint64_t*>_array_of(pool_filter, 1, c'u', sh, "pool_filter")
        npool = sh[0]
        mul = <const uint64_t*>_array_of(filter_mul, 1, c'u', sh, "filter_mul")
        if sh[0] < 3: return None
        if (cnp.PyArray_DIM(ta, 0) < b or cnp.PyArray_DIM(ta, 1) != width
                or plain_int_width(num_tokens) != w):
            return None
        return _check_and_gather(sampled, b, counts, starts, renew, keys, table, used, m,
                                 array_data(num_tokens), w, cnp.PyArray_DATA(ta), tw, width,
                                 n_old_p, seen_p, anc_p, tail_p, T, tstride, spos_p, spread_p, S,
                                 sstride, pool_p, npool, mul, deep_first, deep_every, short, cap,
                                 lengths, offsets, tails, new)
    finally:
        free(block)


cdef object _check_and_gather(list sampled, Py_ssize_t b, int64_t* counts, int64_t* starts,
                              int64_t* renew, uint64_t* keys, uint64_t* table,
                              unsigned char* used, Py_ssize_t m, const void* lens, int w,
                              const void* tokp, int tw, Py_ssize_t width,
                              const int64_t* n_old, const int64_t* seen, const int64_t* anc,
                              const int64_t* tail, Py_ssize_t T, Py_ssize_t tstride,
                              const int64_t* spos, const int64_t* spread, Py_ssize_t S,
                              Py_ssize_t sstride, const uint64_t* pool_f, Py_ssize_t npool,
                              const uint64_t* mul, Py_ssize_t deep_first, Py_ssize_t deep_every,
                              int64_t short, int64_t cap, object lengths, object offsets,
                              object tails, object new):
    """The checks and copies, in C from start to end (no Python code runs)."""
    cdef int64_t* Lv = <int64_t*>array_data(lengths)
    cdef int64_t* ov = <int64_t*>array_data(offsets)
    cdef int64_t* tv = <int64_t*>array_data(tails)
    cdef int64_t* nv = <int64_t*>array_data(new)
    cdef const int32_t* t32 = <const int32_t*>tokp
    cdef const int64_t* t64 = <const int64_t*>tokp
    cdef Py_ssize_t r, j, slot, mask, nrenew = 0
    cdef int64_t n0, n, ns, lmax = 0, lo, hi, mid, p, row
    cdef uint64_t key
    cdef bint twins = False
    ov[0] = 0
    cdef object item
    for r in range(b):
        ns = counts[r]
        item = <object>PyList_GET_ITEM(sampled, r)
        if type(item) is not list or PyList_GET_SIZE(item) != ns:
            return None
        n0 = n_old[r]
        n = (<const int32_t*>lens)[r] if w == 4 else (<const int64_t*>lens)[r]
        if (ns < 1 or n0 != seen[r] or n0 <= short or n0 < T or n != n0 + ns or n > width
                or n >= cap):
            return None
        row = <int64_t>r * width
        for j in range(T):
            if (t32[row + n0 - T + j] if tw == 4 else t64[row + n0 - T + j]) != tail[j * tstride + r]:
                return None
        for j in range(T):
            tv[j * b + r] = t32[row + n - T + j] if tw == 4 else t64[row + n - T + j]
        Lv[r] = n
        ov[r + 1] = ov[r] + ns
        starts[r] = n0
        keys[r] = <uint64_t>n * mul[0] + <uint64_t>tv[(T - 2) * b + r] * mul[1] + <uint64_t>tv[(T - 1) * b + r] * mul[2]
        if n > lmax:
            lmax = n
    r = deep_first
    while r < b:
        row = <int64_t>r * width
        for j in range(S):
            p = spos[j * sstride + r]
            if p < 0 or p >= width or (t32[row + p] if tw == 4 else t64[row + p]) != spread[j * sstride + r]:
                return None
        if Lv[r] >= 2 * anc[r]:
            renew[nrenew] = r
            nrenew += 1
        r += deep_every
    # a twin: a filter key another row or the pool shares
    mask = m - 1
    for r in range(b):
        key = keys[r]
        slot = <Py_ssize_t>(key & <uint64_t>mask)
        while used[slot] and table[slot] != key:
            slot = (slot + 1) & mask
        if used[slot]:
            twins = True
            break
        used[slot] = 1
        table[slot] = key
        lo = 0
        hi = npool
        while lo < hi:
            mid = (lo + hi) // 2
            if pool_f[mid] < key:
                lo = mid + 1
            else:
                hi = mid
        if lo < npool and pool_f[lo] == key:
            twins = True
            break
    # the new tokens
    for r in range(b):
        row = <int64_t>r * width + starts[r]
        for j in range(ov[r + 1] - ov[r]):
            nv[ov[r] + j] = t32[row + j] if tw == 4 else t64[row + j]
    return lengths, new, offsets, tails, lmax, twins, [renew[j] for j in range(nrenew)]
