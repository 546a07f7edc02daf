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

ctypedef fused tok_t:
    int32_t
    int64_t


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
    steady never does. Writes only arrays it returns; reads only what it checked, and
    after its checks only what the call owns.
    """
    if type(sampled) is not list or type(tok) is not np.ndarray or tok.ndim != 2:
        return None
    if not tok.flags.c_contiguous:
        return None
    cdef int w = plain_int_width(num_tokens)
    if w == 0:
        return None
    if tok.dtype == np.int32:
        return _steady[int32_t](sampled, num_tokens, w, tok, n_old, seen, tail, spos, spread,
                                anchors, deep_first, deep_every, short, cap, pool_filter, filter_mul)
    if tok.dtype == np.int64:
        return _steady[int64_t](sampled, num_tokens, w, tok, n_old, seen, tail, spos, spread,
                                anchors, deep_first, deep_every, short, cap, pool_filter, filter_mul)
    return None


cdef inline uint64_t _filter_key(int64_t n, int64_t t2, int64_t t1, const uint64_t[::1] m) noexcept:
    return <uint64_t>n * m[0] + <uint64_t>t2 * m[1] + <uint64_t>t1 * m[2]


cdef object _steady(list sampled, object num_tokens, int w, const tok_t[:, ::1] tok,
                    const int64_t[::1] n_old, const int64_t[::1] seen,
                    const int64_t[:, ::1] tail, const int64_t[:, ::1] spos,
                    const int64_t[:, ::1] spread, const int64_t[::1] anc,
                    Py_ssize_t deep_first, Py_ssize_t deep_every, int64_t short, int64_t cap,
                    const uint64_t[::1] pool_f, const uint64_t[::1] mul):
    cdef Py_ssize_t b = PyList_GET_SIZE(sampled)
    cdef Py_ssize_t T = tail.shape[0], S = spos.shape[0], width = tok.shape[1]
    cdef Py_ssize_t r, j, m, slot, mask, nrenew = 0
    cdef int64_t n0, n, ns, lmax = 0, lo, hi, mid
    cdef uint64_t key
    cdef object item
    if (n_old.shape[0] < b or seen.shape[0] < b or anc.shape[0] < b
            or tail.shape[1] < b or spos.shape[1] < b or spread.shape[1] < b):
        raise ValueError(f"the row arrays must hold at least the {b} rows")
    if spread.shape[0] != S or T < 2:
        raise ValueError("spos and spread must have the same rows, and tail at least 2")
    if deep_first < 0 or deep_every < 1 or mul.shape[0] < 3:
        raise ValueError("deep_first must be >= 0, deep_every >= 1, filter_mul 3 multipliers")
    if b == 0 or tok.shape[0] < b or array_len(num_tokens) < b:
        return None
    # the arrays the call returns and its scratch, made before the checks: no Python
    # code runs from the first check to the last, so nothing can change under them
    lengths = np.empty(b, dtype=np.int64)
    offsets = np.empty(b + 1, dtype=np.int64)
    tails = np.empty((T, b), dtype=np.int64)
    cdef int64_t[::1] Lv = lengths, ov = offsets
    cdef int64_t[:, ::1] tv = tails
    m = 4
    while m < 2 * b:
        m *= 2
    # scratch: each row's start, its filter key, the key table and its marks, the rows to renew
    cdef void* block = calloc(1, <size_t>(3 * b + 2 + m) * 8 + <size_t>m)
    if block == NULL:
        raise MemoryError()
    cdef int64_t* starts = <int64_t*>block
    cdef int64_t* renew = starts + b
    cdef uint64_t* keys = <uint64_t*>(renew + b + 1)
    cdef uint64_t* table = keys + b + 1
    cdef unsigned char* used = <unsigned char*>(table + m)
    cdef const int32_t* L32 = <const int32_t*>array_data(num_tokens)
    cdef const int64_t* L64 = <const int64_t*>array_data(num_tokens)
    cdef bint twins = False
    try:
        if PyList_GET_SIZE(sampled) != b or array_len(num_tokens) < b:
            return None     # (changed by code the allocations ran)
        ov[0] = 0
        for r in range(b):
            item = <object>PyList_GET_ITEM(sampled, r)
            if type(item) is not list:
                return None
            ns = PyList_GET_SIZE(item)
            n0 = n_old[r]
            n = L32[r] if w == 4 else L64[r]
            if (ns < 1 or n0 != seen[r] or n0 <= short or n0 < T or n != n0 + ns or n > width
                    or n >= cap):
                return None
            for j in range(T):
                if tok[r, n0 - T + j] != tail[j, r]:
                    return None
            for j in range(T):
                tv[j, r] = tok[r, n - T + j]
            Lv[r] = n
            ov[r + 1] = ov[r] + ns
            starts[r] = n0
            keys[r] = _filter_key(n, tv[T - 2, r], tv[T - 1, r], mul)
            if n > lmax:
                lmax = n
        r = deep_first
        while r < b:
            for j in range(S):
                n0 = spos[j, r]
                if n0 < 0 or n0 >= width or tok[r, n0] != spread[j, r]:
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
            hi = pool_f.shape[0]
            while lo < hi:
                mid = (lo + hi) // 2
                if pool_f[mid] < key:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < pool_f.shape[0] and pool_f[lo] == key:
                twins = True
                break
        # the new tokens, from the call's own starts and offsets (checked within the rows;
        # the allocation may run Python code, which cannot reach them)
        new = np.empty(ov[b], dtype=np.int64)
        _copy_rows(new, tok, starts, ov, b)
        return lengths, new, offsets, tails, lmax, twins, [renew[j] for j in range(nrenew)]
    finally:
        free(block)


cdef int _copy_rows(object new, const tok_t[:, ::1] tok, const int64_t* starts,
                    const int64_t[::1] ov, Py_ssize_t b) except -1:
    cdef int64_t[::1] nv = new
    cdef Py_ssize_t r, j
    cdef int64_t n0
    for r in range(b):
        n0 = starts[r]
        for j in range(ov[r + 1] - ov[r]):
            nv[ov[r] + j] = tok[r, n0 + j]
    return 0
