# cython: language_level=3
"""The steady step of an index per batch row: every row only grew by its sampled tokens (compiled)."""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.number cimport PyNumber_Index
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free

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


cdef int64_t _int64_arg(object x, str name) except? -1:
    """``x`` as an int64: an integer by ``__index__`` (TypeError otherwise), within int64
    (OverflowError naming it otherwise)."""
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(PyNumber_Index(x), &overflow)
    if overflow:
        raise OverflowError(f"{name} must fit in int64")
    return v


cdef inline object _int64_empty(Py_ssize_t n, Py_ssize_t m):
    cdef cnp.npy_intp dims[2]
    dims[0] = n
    dims[1] = m
    return cnp.PyArray_EMPTY(2 if m >= 0 else 1, dims, cnp.NPY_INT64, 0)


def steady_rows(sampled, num_tokens, tok, n_old, seen, tail, spos, spread, anchors,
                object deep_first, object deep_every, object short, object cap, pool_filter, filter_mul):
    cdef int64_t c_first = _int64_arg(deep_first, "deep_first")
    cdef int64_t c_every = _int64_arg(deep_every, "deep_every")
    cdef int64_t c_short = _int64_arg(short, "short")
    cdef int64_t c_cap = _int64_arg(cap, "cap")
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
    cdef Py_ssize_t b = PyList_GET_SIZE(sampled), r
    cdef views_t v
    v.tw = tw
    _take_views(&v, b, ta, num_tokens, n_old, seen, anchors, tail, spos, spread, pool_filter,
                filter_mul, True)
    if c_first < 0 or c_every < 1:
        raise ValueError("deep_first must be >= 0, deep_every >= 1")
    if b == 0 or v.rows < b or array_len(num_tokens) < b:
        return None
    cdef Py_ssize_t T = v.T, width = v.width
    # scratch (C memory): each row's sampled count and start, its filter key, the key
    # table and its marks, the rows to renew
    cdef Py_ssize_t m = 4
    while m < 2 * b:
        m *= 2
    cdef void* block = calloc(1, <size_t>(4 * b + 2 + m) * 8 + <size_t>m)
    if block == NULL:
        raise MemoryError()
    cdef scratch_t sc
    sc.counts = <int64_t*>block
    sc.starts = sc.counts + b
    sc.renew = sc.starts + b
    sc.keys = <uint64_t*>(sc.renew + b + 1)
    sc.table = sc.keys + b + 1
    sc.used = <unsigned char*>(sc.table + m)
    sc.m = m
    cdef int64_t total = 0
    cdef object item
    try:
        for r in range(b):
            item = <object>PyList_GET_ITEM(sampled, r)
            if type(item) is not list:
                return None
            sc.counts[r] = PyList_GET_SIZE(item)
            total += sc.counts[r]
        # every array the call returns, made before the checks: from the data pointers
        # taken again below to the last read, no Python code runs
        lengths = _int64_empty(b, -1)
        offsets = _int64_empty(b + 1, -1)
        tails = _int64_empty(T, b)
        new = _int64_empty(total, -1)
        # the caller's arrays again, from scratch: the allocations may have run code that
        # changed what the pointers above saw
        if PyList_GET_SIZE(sampled) != b or plain_int_width(num_tokens) != w:
            return None
        if _take_views(&v, b, ta, num_tokens, n_old, seen, anchors, tail, spos, spread,
                       pool_filter, filter_mul, False) or v.T != T or v.width != width:
            return None
        if v.rows < b or array_len(num_tokens) < b:
            return None
        return _check_and_gather(sampled, b, &sc, &v, c_first, c_every, c_short, c_cap,
                                 lengths, offsets, tails, new)
    finally:
        free(block)


ctypedef struct views_t:     # the caller's arrays, as steady_rows reads them
    const void* lens         # num_tokens (int32 or int64, its width w)
    int w
    const void* tok          # tok: rows x width, int32 or int64 (its width tw)
    int tw
    Py_ssize_t rows, width
    const int64_t* n_old
    const int64_t* seen
    const int64_t* anc
    const int64_t* tail      # T x tstride
    Py_ssize_t T, tstride
    const int64_t* spos      # S x sstride, as spread
    const int64_t* spread
    Py_ssize_t S, sstride
    const uint64_t* pool
    Py_ssize_t npool
    const uint64_t* mul


ctypedef struct scratch_t:   # the call's own C memory
    int64_t* counts
    int64_t* starts
    int64_t* renew
    uint64_t* keys
    uint64_t* table
    unsigned char* used
    Py_ssize_t m


cdef int _take_views(views_t* v, Py_ssize_t b, cnp.ndarray ta, object num_tokens, object n_old,
                     object seen, object anchors, object tail, object spos, object spread,
                     object pool_filter, object filter_mul, bint strict) except -1:
    """Fill ``v`` from the arrays, checked (``_array_of``: ValueError for a wrong kind).
    Arrays that do not fit one another: ValueError when ``strict``, else 1."""
    cdef Py_ssize_t sh[2]
    cdef bint fits = True
    v.lens = array_data(num_tokens)
    v.w = plain_int_width(num_tokens)
    v.tok = cnp.PyArray_DATA(ta)
    v.rows = cnp.PyArray_DIM(ta, 0)
    v.width = cnp.PyArray_DIM(ta, 1)
    v.n_old = <const int64_t*>_array_of(n_old, 1, c'i', sh, "n_old")
    fits = fits and sh[0] >= b
    v.seen = <const int64_t*>_array_of(seen, 1, c'i', sh, "seen")
    fits = fits and sh[0] >= b
    v.anc = <const int64_t*>_array_of(anchors, 1, c'i', sh, "anchors")
    fits = fits and sh[0] >= b
    v.tail = <const int64_t*>_array_of(tail, 2, c'i', sh, "tail")
    v.T = sh[0]
    v.tstride = sh[1]
    v.spos = <const int64_t*>_array_of(spos, 2, c'i', sh, "spos")
    v.S = sh[0]
    v.sstride = sh[1]
    v.spread = <const int64_t*>_array_of(spread, 2, c'i', sh, "spread")
    fits = fits and v.tstride >= b and v.sstride >= b
    if not fits:
        if strict:
            raise ValueError(f"the row arrays must hold at least the {b} rows")
        return 1
    if sh[0] != v.S or sh[1] != v.sstride or v.T < 2:
        if strict:
            raise ValueError("spos and spread must have the same shape, and tail at least 2 rows")
        return 1
    v.pool = <const uint64_t*>_array_of(pool_filter, 1, c'u', sh, "pool_filter")
    v.npool = sh[0]
    v.mul = <const uint64_t*>_array_of(filter_mul, 1, c'u', sh, "filter_mul")
    if sh[0] < 3:
        if strict:
            raise ValueError("filter_mul must hold 3 multipliers")
        return 1
    return 0


cdef object _check_and_gather(list sampled, Py_ssize_t b, const scratch_t* sc, const views_t* v,
                              int64_t deep_first, int64_t deep_every, int64_t short,
                              int64_t cap, object lengths, object offsets, object tails,
                              object new):
    """The checks and copies, in C from start to end (no Python code runs): every row's
    (``_check_rows``), the deep rows' (``_check_deep``), the filter keys' twins
    (``_has_twin``), then the new tokens (``_copy_new``); None where a check declines.
    Caller values (lengths, positions, anchors, the deep rows' start and step) are
    compared with bounds before any arithmetic on them, so nothing wraps around int64."""
    cdef int64_t* Lv = <int64_t*>array_data(lengths)
    cdef int64_t* ov = <int64_t*>array_data(offsets)
    cdef int64_t lmax = _check_rows(sampled, b, sc, v, short, cap, Lv, ov,
                                    <int64_t*>array_data(tails))
    if lmax < 0:
        return None
    cdef Py_ssize_t j, nrenew = _check_deep(b, sc, v, deep_first, deep_every, Lv)
    if nrenew < 0:
        return None
    cdef bint twins = _has_twin(b, sc, v)
    _copy_new(b, sc, v, ov, <int64_t*>array_data(new))
    return lengths, new, offsets, tails, lmax, twins, [sc.renew[j] for j in range(nrenew)]


cdef int64_t _check_rows(list sampled, Py_ssize_t b, const scratch_t* sc, const views_t* v,
                         int64_t short, int64_t cap, int64_t* Lv, int64_t* ov,
                         int64_t* tv) noexcept:
    """Every row's checks: its sampled list still of the length counted, its lengths (both within [0,
    width] before their difference is taken, so nothing wraps around int64), its old
    tail still at its old end. Fills each row's length (``Lv``), sampled offset (``ov``,
    b + 1), new tail (``tv``, T x b), start and filter key (``sc``). Returns the longest
    length, or -1 where a row declines."""
    cdef const int64_t* counts = sc.counts
    cdef int64_t* starts = sc.starts
    cdef uint64_t* keys = sc.keys
    cdef const void* lens = v.lens
    cdef int w = v.w, tw = v.tw
    cdef Py_ssize_t width = v.width, T = v.T, tstride = v.tstride
    cdef const int64_t* n_old = v.n_old
    cdef const int64_t* seen = v.seen
    cdef const int64_t* tail = v.tail
    cdef const uint64_t* mul = v.mul
    cdef const int32_t* t32 = <const int32_t*>v.tok
    cdef const int64_t* t64 = <const int64_t*>v.tok
    cdef Py_ssize_t j
    cdef int64_t r, n0, n, ns, lmax = 0, row
    cdef object item
    ov[0] = 0
    for r in range(b):
        ns = counts[r]
        item = <object>PyList_GET_ITEM(sampled, r)
        if type(item) is not list or PyList_GET_SIZE(item) != ns:
            return -1
        n0 = n_old[r]
        n = (<const int32_t*>lens)[r] if w == 4 else (<const int64_t*>lens)[r]
        if (ns < 1 or n0 != seen[r] or n0 <= short or n0 < T or n0 > width or n < 0 or n > width
                or n - n0 != ns or n >= cap):
            return -1
        row = <int64_t>r * width
        for j in range(T):
            if (t32[row + n0 - T + j] if tw == 4 else t64[row + n0 - T + j]) != tail[j * tstride + r]:
                return -1
        for j in range(T):
            tv[j * b + r] = t32[row + n - T + j] if tw == 4 else t64[row + n - T + j]
        Lv[r] = n
        ov[r + 1] = ov[r] + ns
        starts[r] = n0
        keys[r] = <uint64_t>n * mul[0] + <uint64_t>tv[(T - 2) * b + r] * mul[1] + <uint64_t>tv[(T - 1) * b + r] * mul[2]
        if n > lmax:
            lmax = n
    return lmax


cdef Py_ssize_t _check_deep(Py_ssize_t b, const scratch_t* sc, const views_t* v,
                            int64_t deep_first, int64_t deep_every,
                            const int64_t* Lv) noexcept nogil:
    """The deep rows' checks (rows ``deep_first``, then every ``deep_every``-th): each
    spread position in the row and its token as recorded. The rows whose anchor is due
    for renewal go to ``sc.renew``; returns their count, or -1 where a row declines."""
    cdef Py_ssize_t j, nrenew = 0
    cdef Py_ssize_t width = v.width, S = v.S, sstride = v.sstride
    cdef int tw = v.tw
    cdef const int32_t* t32 = <const int32_t*>v.tok
    cdef const int64_t* t64 = <const int64_t*>v.tok
    cdef const int64_t* spos = v.spos
    cdef const int64_t* spread = v.spread
    cdef const int64_t* anc = v.anc
    cdef int64_t* renew = sc.renew
    cdef int64_t r = deep_first, p, row
    while r < b:
        row = <int64_t>r * width
        for j in range(S):
            p = spos[j * sstride + r]
            if p < 0 or p >= width or (t32[row + p] if tw == 4 else t64[row + p]) != spread[j * sstride + r]:
                return -1
        # length >= 2 * anchor, exactly: anchor <= floor(length / 2) (length >= 0)
        if anc[r] <= (Lv[r] >> 1):
            renew[nrenew] = r
            nrenew += 1
        if deep_every >= b - r:  # the next row is past the batch (and r never wraps)
            break
        r += deep_every
    return nrenew


cdef bint _has_twin(Py_ssize_t b, const scratch_t* sc, const views_t* v) noexcept nogil:
    """A twin: a filter key another row or the pool (sorted) shares. The keys go into
    the open-addressing table of ``sc`` (``m`` slots, a power of two, at least 2 b)."""
    cdef const uint64_t* keys = sc.keys
    cdef uint64_t* table = sc.table
    cdef unsigned char* used = sc.used
    cdef const uint64_t* pool_f = v.pool
    cdef Py_ssize_t r, slot, mask = sc.m - 1, npool = v.npool
    cdef int64_t lo, hi, mid
    cdef uint64_t key
    for r in range(b):
        key = keys[r]
        slot = <Py_ssize_t>(key & <uint64_t>mask)
        while used[slot] and table[slot] != key:
            slot = (slot + 1) & mask
        if used[slot]:
            return True
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
            return True
    return False


cdef void _copy_new(Py_ssize_t b, const scratch_t* sc, const views_t* v, const int64_t* ov,
                    int64_t* nv) noexcept nogil:
    """Each row's sampled tokens, read from its buffer from its old end, into ``nv`` at
    the offsets ``ov``."""
    cdef Py_ssize_t j
    cdef int64_t r, row
    cdef Py_ssize_t width = v.width
    cdef const int64_t* starts = sc.starts
    cdef int tw = v.tw
    cdef const int32_t* t32 = <const int32_t*>v.tok
    cdef const int64_t* t64 = <const int64_t*>v.tok
    for r in range(b):
        row = <int64_t>r * width + starts[r]
        for j in range(ov[r + 1] - ov[r]):
            nv[ov[r] + j] = t32[row + j] if tw == 4 else t64[row + j]
