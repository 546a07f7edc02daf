# cython: language_level=3
"""Greedy acceptance over a tree of drafts, and the in-place placement of the accepted
path's cache rows (compiled).

Every argument is converted first (1-D C-contiguous native int32/int64 arrays copied with
one memcpy or a widening loop, anything else through ``specfsm.tree._checks.ids64``) into
one int64 block this call allocates, then checked; the node loops run with the GIL
released over that block alone. A node loop reports what it refused as a code, which
``specfsm.tree._checks`` turns into the message the twin raises. ``place_path`` and
``place_path_batch`` write the caller's cache rows (as ``place_rows`` does), at rows
checked against the cache's shape before the GIL is released.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcpy
from cpython.mem cimport PyMem_Malloc, PyMem_Free

import numpy as np

cimport numpy as cnp

from _arrays cimport plain_int_width
from _offsets cimport longest_row

from specfsm._checks import check_count, check_offsets, int64_ids
from specfsm.tree import _checks as _tc
from specfsm.tree._checks import (
    as_base,
    base_error,
    batch_rows_reason,
    check_cache,
    check_lengths,
    empty_tree_reason,
    ids64,
    path_error,
    rows_reason,
    tree_error,
)

cnp.import_array()

__all__ = ["check_tree", "accept_tree", "accept_tree_batch", "place_path", "place_path_batch"]

cdef enum:
    NEGATIVE_TOKEN = 1
    PARENT_BELOW_ROOT = 2
    PARENT_NOT_BEFORE = 3
    DUPLICATE_SIBLING = 4
    PATH_NEGATIVE = 5
    PATH_NOT_INCREASING = 6
    PATH_BEYOND_CACHE = 7
    BASE_NEGATIVE = 8    # place_path_batch only: base[b] < 0
    BASE_BEYOND = 9      # place_path_batch only: base[b] >= L

if (NEGATIVE_TOKEN, PARENT_BELOW_ROOT, PARENT_NOT_BEFORE, DUPLICATE_SIBLING, PATH_NEGATIVE,
        PATH_NOT_INCREASING, PATH_BEYOND_CACHE) != (
        _tc.NEGATIVE_TOKEN, _tc.PARENT_BELOW_ROOT, _tc.PARENT_NOT_BEFORE, _tc.DUPLICATE_SIBLING,
        _tc.PATH_NEGATIVE, _tc.PATH_NOT_INCREASING, _tc.PATH_BEYOND_CACHE):
    raise ImportError("specfsm._core.tree: its refusal codes differ from specfsm.tree._checks")


# -- arguments ---------------------------------------------------------------------------
cdef cnp.ndarray _source(object x, str name):
    """``x`` as a fresh 1-D int64 array no one else holds: a plain int32/int64 array is
    copied (or widened) in C, anything else converted by ``ids64`` (whose refusals it
    raises). The plain array's length, item size and data are read again after the
    allocation (which may run a finalizer, and so another thread, that reshapes or
    re-types the caller's array) and copied at once; if they changed, the conversion
    takes the checked path instead. An ndarray subclass is converted by ``ids64``, as
    in the twin (its own methods could answer otherwise than its memory)."""
    cdef int w = plain_int_width(x) if type(x) is np.ndarray else 0
    cdef Py_ssize_t k, n
    cdef cnp.npy_intp dim
    cdef cnp.ndarray out, a
    cdef const int32_t* s32
    cdef int64_t* d
    if w:
        a = <cnp.ndarray>x
        n = cnp.PyArray_DIM(a, 0)
        dim = n
        out = cnp.PyArray_SimpleNew(1, &dim, cnp.NPY_INT64)
        if plain_int_width(x) == w and cnp.PyArray_DIM(a, 0) == n:   # no Python code since
            d = <int64_t*>cnp.PyArray_DATA(out)
            if w == 8:
                memcpy(d, cnp.PyArray_DATA(a), <size_t>(n * 8))
            else:
                s32 = <const int32_t*>cnp.PyArray_DATA(a)
                for k in range(n):
                    d[k] = s32[k]
            return out
    return ids64(x, name)


cdef inline Py_ssize_t _len(object a) noexcept:
    return cnp.PyArray_DIM(<cnp.ndarray>a, 0)


cdef inline int64_t* _data(cnp.ndarray a) noexcept:
    return <int64_t*>cnp.PyArray_DATA(a)


cdef int64_t* _block(Py_ssize_t n) except NULL:
    cdef int64_t* p = <int64_t*>PyMem_Malloc(<size_t>((n if n > 0 else 1) * 8))
    if p == NULL:
        raise MemoryError()
    return p


cdef cnp.ndarray _array_of(const int64_t* src, Py_ssize_t n):
    cdef cnp.npy_intp dim = n
    cdef cnp.ndarray out = cnp.PyArray_SimpleNew(1, &dim, cnp.NPY_INT64)
    if n:
        memcpy(cnp.PyArray_DATA(out), src, <size_t>(n * 8))
    return out


cdef inline int _same_bytes(object cache, Py_ssize_t nbytes) except -1:
    """Refuse (RuntimeError) a cache that is no longer C-contiguous over ``nbytes``
    bytes: its checks ran Python code (a finalizer may reshape or resize it in place),
    so the moves, which stay within those bytes, read its layout once more, last."""
    cdef cnp.ndarray a = <cnp.ndarray>cache
    if not cnp.PyArray_IS_C_CONTIGUOUS(a) or cnp.PyArray_NBYTES(a) != nbytes:
        raise RuntimeError("cache changed shape while place_path checked it")
    return 0


# -- the node loops ----------------------------------------------------------------------
cdef int _nodes(const int64_t* t, const int64_t* p, Py_ssize_t n, int64_t* first,
                int64_t* nxt, Py_ssize_t* bad_i, Py_ssize_t* bad_j) noexcept nogil:
    """Check a tree of ``n`` nodes and link each node's children (``first[q + 1]`` the
    first child of parent ``q``, ``nxt[i]`` node i's next sibling, both in index order,
    -1 ending a list); returns 0, or the refusal's code at node ``bad_i`` (and
    ``bad_j``, the later sibling with the same token)."""
    cdef Py_ssize_t i, s
    cdef int64_t q
    for i in range(n):
        q = p[i]
        if t[i] < 0 or q < -1 or q >= i:
            bad_i[0] = i
            return NEGATIVE_TOKEN if t[i] < 0 else (PARENT_BELOW_ROOT if q < -1 else PARENT_NOT_BEFORE)
    for i in range(n + 1):
        first[i] = -1
    for i in range(n - 1, -1, -1):   # every p[i] + 1 now lies in [0, i]
        nxt[i] = first[p[i] + 1]
        first[p[i] + 1] = i
    for i in range(n):
        s = nxt[i]
        while s >= 0:
            if t[s] == t[i]:
                bad_i[0] = i
                bad_j[0] = s
                return DUPLICATE_SIBLING
            s = nxt[s]
    return 0


cdef Py_ssize_t _walk(const int64_t* t, const int64_t* first, const int64_t* nxt,
                      const int64_t* rows, int64_t* path) noexcept nogil:
    """The accepted path into ``path`` (at most n entries: each step moves to a child,
    whose index is above its parent's); returns its length. ``rows`` holds n + 1 rows."""
    cdef Py_ssize_t m = 0, cur = -1, c
    cdef int64_t want
    while True:
        want = rows[cur + 1]
        c = first[cur + 1]
        while c >= 0 and t[c] != want:
            c = nxt[c]
        if c < 0:
            return m
        path[m] = c
        m += 1
        cur = c


cdef int _path_code(const int64_t* path, Py_ssize_t m, int64_t base, Py_ssize_t n_rows,
                    Py_ssize_t* bad) noexcept nogil:
    """The first refusal of a path for a root at row ``base`` (0 <= base < n_rows)."""
    cdef Py_ssize_t j
    cdef int64_t v, prev = -1, top = <int64_t>n_rows - 2 - base   # >= -1: no overflow
    for j in range(m):
        v = path[j]
        if v < 0 or (j and v <= prev) or v > top:
            bad[0] = j
            return PATH_NEGATIVE if v < 0 else (PATH_NOT_INCREASING if j and v <= prev else PATH_BEYOND_CACHE)
        prev = v
    return 0


cdef void _move(uint8_t* rows, const int64_t* path, Py_ssize_t m, int64_t base,
                Py_ssize_t row) noexcept nogil:
    """Row ``base + 1 + path[j]`` to row ``base + 1 + j``, for the checked path: path[j]
    > j unless equal, so a source row is never one an earlier move wrote."""
    cdef Py_ssize_t j
    for j in range(m):
        if path[j] != j:
            memcpy(rows + (base + 1 + j) * row, rows + (base + 1 + path[j]) * row, <size_t>row)


# -- acceptance --------------------------------------------------------------------------
def check_tree(tokens, parents):
    cdef int code
    cdef Py_ssize_t n, bi = -1, bj = -1
    cdef int64_t *buf, *t, *p
    cdef cnp.ndarray ta = _source(tokens, "tokens")
    cdef cnp.ndarray pa = _source(parents, "parents")
    n = _len(ta)
    check_lengths(n, _len(pa))
    t = _data(ta)
    p = _data(pa)
    buf = _block(2 * n + 1)
    try:
        with nogil:
            code = _nodes(t, p, n, buf, buf + n + 1, &bi, &bj)
        if code:
            raise tree_error(code, bi, bj, t[bi], p[bi])
        return ta, pa
    finally:
        PyMem_Free(buf)


def accept_tree(tokens, parents, row_tokens):
    cdef int code
    cdef Py_ssize_t n, m, bi = -1, bj = -1
    cdef int64_t *buf, *t, *p, *r, *first, *nxt, *path
    cdef cnp.ndarray ta = _source(tokens, "tokens")
    cdef cnp.ndarray pa = _source(parents, "parents")
    cdef cnp.ndarray ra = _source(row_tokens, "row_tokens")
    n = _len(ta)
    check_lengths(n, _len(pa))
    t = _data(ta)
    p = _data(pa)
    buf = _block(3 * n + 1)
    try:
        first = buf
        nxt = first + n + 1
        path = nxt + n
        with nogil:
            code = _nodes(t, p, n, first, nxt, &bi, &bj)
        if code:
            raise tree_error(code, bi, bj, t[bi], p[bi])
        if _len(ra) != n + 1:
            raise ValueError(rows_reason(_len(ra), n))
        r = _data(ra)
        with nogil:
            m = _walk(t, first, nxt, r, path)
        return _array_of(path, m)
    finally:
        PyMem_Free(buf)


def accept_tree_batch(tokens, parents, offsets, row_tokens):
    cdef int code = 0
    cdef Py_ssize_t total, B, b, lo, nb, m, bad_b = -1, bi = -1, bj = -1, n_path = 0
    cdef int64_t *buf, *t, *p, *r, *o, *first, *nxt, *path, *counts, *resume, *poff
    cdef cnp.ndarray ta = _source(tokens, "tokens")
    cdef cnp.ndarray pa = _source(parents, "parents")
    cdef cnp.ndarray off = int64_ids(offsets, "offsets")
    cdef cnp.ndarray ra = _source(row_tokens, "row_tokens")
    total = _len(ta)
    check_lengths(total, _len(pa), batch=True)
    o = _data(off)   # every array here is the call's own copy
    if longest_row(o, _len(off), total, 0) < 0:
        check_offsets(off, total, None, "offsets", "tokens", "trees")   # raises its message
        raise ValueError("offsets do not tile tokens")   # unreachable: the same conditions
    B = _len(off) - 1
    for b in range(B):
        if o[b] == o[b + 1]:
            raise ValueError(empty_tree_reason(b, o[b]))
    if _len(ra) != total + B:
        raise ValueError(batch_rows_reason(_len(ra), B, total))
    t = _data(ta)
    p = _data(pa)
    r = _data(ra)
    # path, nxt: total each; first: total + B; counts, resume: B; poff: B + 1
    buf = _block(3 * total + 4 * B + 1)
    try:
        path = buf
        nxt = path + total
        first = nxt + total
        counts = first + total + B
        resume = counts + B
        poff = resume + B
        with nogil:
            poff[0] = 0
            for b in range(B):
                lo = o[b]
                nb = o[b + 1] - lo
                code = _nodes(t + lo, p + lo, nb, first + lo + b, nxt + lo, &bi, &bj)
                if code:
                    bad_b = b
                    break
                m = _walk(t + lo, first + lo + b, nxt + lo, r + lo + b, path + n_path)
                counts[b] = m
                resume[b] = path[n_path + m - 1] + 1 if m else 0
                n_path += m
                poff[b + 1] = n_path
        if code:
            lo = o[bad_b]
            raise tree_error(code, bi, bj, t[lo + bi], p[lo + bi], f"tree {bad_b}: ")
        return _array_of(counts, B), _array_of(resume, B), _array_of(path, n_path), _array_of(poff, B + 1)
    finally:
        PyMem_Free(buf)


# -- placement ---------------------------------------------------------------------------
def place_path(cache, base, path):
    cdef int code
    cdef Py_ssize_t m, L, row, bad = -1
    cdef int64_t b0
    cdef int64_t* pp
    cdef uint8_t* rows
    b0_obj = as_base(base)
    cdef cnp.ndarray pa = _source(path, "path")
    _, L, row = check_cache(cache, False)
    if b0_obj >= L:
        raise base_error(b0_obj, L)
    b0 = b0_obj
    m = _len(pa)
    pp = _data(pa)
    code = _path_code(pp, m, b0, L, &bad)
    if code:
        raise path_error(code, bad, pp[bad], pp[bad - 1] if bad else -1, b0, L)
    if row and m:
        _same_bytes(cache, L * row)
        rows = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>cache)
        with nogil:
            _move(rows, pp, m, b0, row)
    return cache


def place_path_batch(cache, base, path, path_offsets):
    cdef int code = 0
    cdef Py_ssize_t B, L, row, P, b, lo, bad = -1, bad_b = -1
    cdef int64_t v
    cdef const int64_t *bs, *o, *pp
    cdef uint8_t* rows
    cdef cnp.ndarray bases = int64_ids(base, "base")
    cdef cnp.ndarray pa = _source(path, "path")
    cdef cnp.ndarray po = int64_ids(path_offsets, "path_offsets")
    B, L, row = check_cache(cache, True)
    if _len(bases) != B:
        raise ValueError(f"base holds {_len(bases)} entries; it needs one per request (B={B})")
    P = _len(pa)
    bs = _data(bases)   # the call's own copies
    o = _data(po)
    pp = _data(pa)
    if _len(po) != B + 1 or longest_row(o, _len(po), P, 0) < 0:
        check_offsets(po, P, B, "path_offsets", "path", "requests")   # raises its message
        raise ValueError("path_offsets do not tile path")   # unreachable: the same conditions
    with nogil:
        for b in range(B):
            v = bs[b]
            if v < 0:
                code = BASE_NEGATIVE
            elif v >= L:
                code = BASE_BEYOND
            else:
                code = _path_code(pp + o[b], o[b + 1] - o[b], v, L, &bad)
            if code:
                bad_b = b
                break
    if code:
        v = bs[bad_b]
        where = f"slot {bad_b}: "
        if code == BASE_NEGATIVE:
            check_count(v, f"base[{bad_b}]")
        if code == BASE_BEYOND:
            raise base_error(v, L, where)
        lo = o[bad_b]
        raise path_error(code, bad, pp[lo + bad], pp[lo + bad - 1] if bad else -1, v, L, where)
    if row and P:
        _same_bytes(cache, B * L * row)
        rows = <uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>cache)
        with nogil:
            for b in range(B):
                _move(rows + b * L * row, pp + o[b], o[b + 1] - o[b], bs[b], row)
    return cache
