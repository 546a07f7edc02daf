# cython: language_level=3
"""Batched acceptance kernels over ragged drafts (compiled).

Same names, results and errors as the twin ``specfsm.accept._accept_py`` (read its module
docstring for the layout). Arguments are converted, copied (the small control arrays)
and checked once in Python by ``specfsm._checks`` and the concept's check module (shared with the twin); the
probability-row check and the kernels then run over typed memoryviews with the GIL
released, reading only the call's own copies and the probability rows. The row check
and the residual draw are C, in ``accept_kernels.h``.
"""

import numpy as np

from specfsm._checks import check_count
from specfsm.accept._checks import (
    PROB_ATOL,
    PROB_OK,
    as_prob_rows,
    check_id_range,
    check_name,
    draft_offsets,
    draw_uniforms,
    prepare_exact,
    prepare_speculative,
    prepare_typical,
    prob_error,
)

from libc.math cimport exp, log
from libc.stdint cimport int32_t, int64_t
from cython cimport floating

from _typedefs cimport token_t
from _offsets cimport longest_row
cimport numpy as cnp

cnp.import_array()

__all__ = [
    "PROB_ATOL",
    "check_probs",
    "exact_batch",
    "min_run_batch",
    "speculative_batch",
    "typical_batch",
]

cdef extern from "accept_kernels.h":
    int specfsm_check_rows_f32(const float* p, Py_ssize_t n, Py_ssize_t v, double atol,
                               Py_ssize_t* row, Py_ssize_t* col, double* value) noexcept nogil
    int specfsm_check_rows_f64(const double* p, Py_ssize_t n, Py_ssize_t v, double atol,
                               Py_ssize_t* row, Py_ssize_t* col, double* value) noexcept nogil
    Py_ssize_t specfsm_pick_f32(const float* p, const float* q, Py_ssize_t v, Py_ssize_t x,
                                double u, double* scratch) noexcept nogil
    Py_ssize_t specfsm_pick_f64(const double* p, const double* q, Py_ssize_t v, Py_ssize_t x,
                                double u, double* scratch) noexcept nogil

cdef double _ATOL = PROB_ATOL


# -- probability rows ------------------------------------------------------------------
cdef inline int _unmoved(object arr, const floating[:, ::1] view, str name) except -1:
    """Refuse (RuntimeError) probability rows that are no longer where ``view`` reads
    them: taking a view can run Python code (a finalizer that resizes the caller's
    array in place frees what the view points at), so the array's data and shape are
    compared with the view's last, just before the GIL is released."""
    cdef cnp.ndarray a = <cnp.ndarray>arr
    if view.shape[0] == 0:
        return 0
    if (cnp.PyArray_DATA(a) != <const void*>&view[0, 0] or cnp.PyArray_NDIM(a) != 2
            or cnp.PyArray_DIM(a, 0) != view.shape[0] or cnp.PyArray_DIM(a, 1) != view.shape[1]):
        raise RuntimeError(f"{name} was resized while the call read it")
    return 0


cdef object _first_bad(object arr):
    cdef const float[:, ::1] f32
    cdef const double[:, ::1] f64
    cdef Py_ssize_t r = 0, c = 0
    cdef double val = 0.0
    cdef int code = 0  # SPECFSM_OK
    if arr.shape[0] == 0:
        return code, r, c, val
    if arr.dtype.itemsize == 4:
        f32 = arr
        _unmoved(arr, f32, "probs")
        with nogil:
            code = specfsm_check_rows_f32(&f32[0, 0], f32.shape[0], f32.shape[1], _ATOL, &r, &c, &val)
    else:
        f64 = arr
        _unmoved(arr, f64, "probs")
        with nogil:
            code = specfsm_check_rows_f64(&f64[0, 0], f64.shape[0], f64.shape[1], _ATOL, &r, &c, &val)
    return code, r, c, val


cdef _raise_if_bad(object arr, object name):
    code, r, c, val = _first_bad(arr)
    if code != PROB_OK:
        raise prob_error(name, code, r, c, val)


def check_probs(probs, name="probs"):
    if type(name) is not str:
        check_name(name)
    p = as_prob_rows(probs, name)
    _raise_if_bad(p, name)
    return p


# -- the shared checks, as C loops ------------------------------------------------------
# Same results as ``specfsm.accept._checks.draft_offsets`` / ``check_id_range``, which they call to raise
# the very same error when something is wrong. Both read only the call's private copies
# (C-contiguous, native int64 offsets; int32/int64 ids), with the GIL held.

def _fast_check_offsets(off, Py_ssize_t total, name="offsets"):
    cdef cnp.ndarray a = <cnp.ndarray?>off
    cdef Py_ssize_t n = cnp.PyArray_DIM(a, 0)
    cdef int64_t k_max
    if (cnp.PyArray_TYPE(a) != cnp.NPY_INT64 or not cnp.PyArray_ISCARRAY_RO(a)
            or cnp.PyArray_NDIM(a) != 1):
        return draft_offsets(off, total, name)
    k_max = longest_row(<const int64_t*>cnp.PyArray_DATA(a), n, total, 0)
    if k_max < 0:
        return draft_offsets(off, total, name)  # raises
    return k_max


cdef inline bint _ids_in_range(const token_t* p, Py_ssize_t n, int64_t hi) noexcept nogil:
    cdef Py_ssize_t i
    cdef bint ok = True
    for i in range(n):
        ok &= (p[i] >= 0) & (<int64_t>p[i] < hi)
    return ok


def _fast_check_ids(arr, name, hi, what):
    cdef cnp.ndarray a = <cnp.ndarray?>arr
    cdef Py_ssize_t n = cnp.PyArray_DIM(a, 0)
    cdef int t = cnp.PyArray_TYPE(a)
    cdef bint ok
    if hi > 2**62 or cnp.PyArray_NDIM(a) != 1 or not cnp.PyArray_ISCARRAY_RO(a):
        return check_id_range(arr, name, hi, what)
    if t == cnp.NPY_INT32:
        ok = _ids_in_range(<const int32_t*>cnp.PyArray_DATA(a), n, <int64_t>hi)
    elif t == cnp.NPY_INT64:
        ok = _ids_in_range(<const int64_t*>cnp.PyArray_DATA(a), n, <int64_t>hi)
    else:
        ok = False
    if not ok:
        return check_id_range(arr, name, hi, what)  # raises (or checks an unusual dtype)


_FAST = (_fast_check_offsets, _fast_check_ids)


# -- exact / min-run -----------------------------------------------------------------
# The kernels read only arrays this call owns (private copies of the draft, choices,
# offsets and uniforms made by ``specfsm.accept._checks.prepare_*``) plus the probability
# rows in place. Every index they derive is still checked where it is used (a request's
# rows against the draft and the output, a drafted id against the vocabulary): a check
# that fails returns the request's number + 1 and the call raises RuntimeError, where
# an unchecked read would have left the buffers.

cdef inline bint _rows_ok(Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n_rows,
                          Py_ssize_t width) noexcept nogil:
    """0 <= lo <= hi <= n_rows and hi - lo < width (the output row's length)."""
    return 0 <= lo and lo <= hi and hi <= n_rows and hi - lo < width


cdef Py_ssize_t _exact_kernel(const token_t[::1] d, const token_t[::1] c,
                              const int64_t[::1] off, Py_ssize_t m, int32_t[:, ::1] out,
                              int32_t[::1] acc) noexcept nogil:
    cdef Py_ssize_t b = off.shape[0] - 1, i, lo, hi, n, j
    if b > acc.shape[0] or b > out.shape[0] or c.shape[0] != d.shape[0]:
        return 1
    for i in range(b):
        lo = off[i]
        hi = off[i + 1]
        if not _rows_ok(lo, hi, d.shape[0], out.shape[1]):
            return i + 1
        n = 0
        while lo + n < hi and d[lo + n] == c[lo + n]:
            n += 1
        if n < m:
            n = 0
        for j in range(n):
            out[i, j] = <int32_t>d[lo + j]
        if lo + n < hi:
            out[i, n] = <int32_t>c[lo + n]
        acc[i] = <int32_t>n
    return 0


cdef _kernel_failed(Py_ssize_t bad, str what):
    raise RuntimeError(
        f"{what}: request {bad - 1} indexes outside the call's checked arrays (an argument "
        "changed while it was being read)"
    )


cdef _exact_run(object d, object c, object off, Py_ssize_t k_max, Py_ssize_t m):
    cdef Py_ssize_t b = off.shape[0] - 1, bad
    out = np.full((b, k_max + 1), -1, dtype=np.int32)
    acc = np.zeros(b, dtype=np.int32)
    cdef int32_t[:, ::1] o = out
    cdef int32_t[::1] a = acc
    cdef const int64_t[::1] offv = off
    cdef const int32_t[::1] d32, c32
    cdef const int64_t[::1] d64, c64
    if d.dtype.itemsize == 4:
        d32 = d
        c32 = c
        with nogil:
            bad = _exact_kernel(d32, c32, offv, m, o, a)
    else:
        d64 = d
        c64 = c
        with nogil:
            bad = _exact_kernel(d64, c64, offv, m, o, a)
    if bad:
        _kernel_failed(bad, "exact_batch")
    return out, acc


def exact_batch(draft, choices, offsets):
    d, c, off, k_max = prepare_exact(draft, choices, offsets, _FAST)
    return _exact_run(d, c, off, k_max, 0)


def min_run_batch(draft, choices, offsets, m):
    mm = check_count(m, "m")
    d, c, off, k_max = prepare_exact(draft, choices, offsets, _FAST)
    # no run is longer than the longest draft: every m beyond it refuses every run alike,
    # and the count handed to C stays within it (m may be any Python int)
    return _exact_run(d, c, off, k_max, min(mm, k_max + 1))


# -- speculative sampling ----------------------------------------------------------------
cdef inline Py_ssize_t _pick(const floating[:, ::1] p, const floating[:, ::1] q, bint has_q,
                             Py_ssize_t row, Py_ssize_t x, double u, double* scratch) noexcept nogil:
    if floating is float:
        return specfsm_pick_f32(&p[row, 0], &q[row, 0] if has_q else NULL, p.shape[1], x, u, scratch)
    else:
        return specfsm_pick_f64(&p[row, 0], &q[row, 0] if has_q else NULL, p.shape[1], x, u, scratch)


cdef Py_ssize_t _spec_kernel(const token_t[::1] d, const int64_t[::1] off,
                             const floating[:, ::1] p, const floating[:, ::1] q, bint has_q,
                             const double[::1] u, int32_t[:, ::1] out,
                             int32_t[::1] acc, double* scratch) noexcept nogil:
    cdef Py_ssize_t b = off.shape[0] - 1, v = p.shape[1], i, lo, k, u_base, n, x
    cdef Py_ssize_t n_rows = d.shape[0]
    cdef double pp, qq
    if b > acc.shape[0] or b > out.shape[0] or p.shape[0] < n_rows:
        return 1
    if has_q and (q.shape[0] < n_rows or q.shape[1] != v):
        return 1
    for i in range(b):
        lo = off[i]
        if not _rows_ok(lo, off[i + 1], n_rows, out.shape[1]):
            return i + 1
        k = off[i + 1] - lo
        u_base = lo + i
        if u_base + k >= u.shape[0]:
            return i + 1
        n = 0
        while n < k:
            x = <Py_ssize_t>d[lo + n]
            if x < 0 or x >= v:
                return i + 1
            pp = <double>p[lo + n, x]
            qq = <double>q[lo + n, x] if has_q else 1.0
            # p(x) = 0 (a masked or greedy target) is never accepted, whatever u and q
            if pp > 0.0 and u[u_base + n] * qq <= pp:
                out[i, n] = <int32_t>x
                n += 1
            else:
                break
        acc[i] = <int32_t>n
        if n < k:
            out[i, n] = <int32_t>_pick(p, q, has_q, lo + n, <Py_ssize_t>d[lo + n], u[u_base + k], scratch)
    return 0


def speculative_batch(draft, offsets, target_probs, draft_probs, uniforms, check=True):
    check = bool(check)
    d, off, p, q, u, k_max, gen = prepare_speculative(
        draft, offsets, target_probs, draft_probs, uniforms, _FAST
    )
    if check:
        _raise_if_bad(p, "target_probs")
        if q is not None:
            _raise_if_bad(q, "draft_probs")
    cdef Py_ssize_t b = off.shape[0] - 1, bad
    if u is None:
        u = draw_uniforms(gen, d.shape[0] + b)
    cdef bint has_q = q is not None
    if not has_q:
        q = p  # never read: a same-typed placeholder for the memoryview
    out = np.full((b, k_max + 1), -1, dtype=np.int32)
    acc = np.zeros(b, dtype=np.int32)
    scratch_arr = np.empty((p.shape[1] + 7) // 8, dtype=np.float64)
    cdef double[::1] sc = scratch_arr
    cdef double* scratch = &sc[0]
    cdef int32_t[:, ::1] o = out
    cdef int32_t[::1] a = acc
    cdef const int64_t[::1] offv = off
    cdef const double[::1] uv = u
    cdef const int32_t[::1] d32
    cdef const int64_t[::1] d64
    cdef const float[:, ::1] p32, q32
    cdef const double[:, ::1] p64, q64
    cdef bint d4 = d.dtype.itemsize == 4
    if d4:
        d32 = d
    else:
        d64 = d
    # the probability views are taken last and compared with their arrays (_unmoved):
    # the draft, offsets and uniforms are the call's own
    if p.dtype.itemsize == 4:
        p32 = p
        q32 = q
        _unmoved(p, p32, "target_probs")
        if has_q:
            _unmoved(q, q32, "draft_probs")
        if d4:
            with nogil:
                bad = _spec_kernel(d32, offv, p32, q32, has_q, uv, o, a, scratch)
        else:
            with nogil:
                bad = _spec_kernel(d64, offv, p32, q32, has_q, uv, o, a, scratch)
    else:
        p64 = p
        q64 = q
        _unmoved(p, p64, "target_probs")
        if has_q:
            _unmoved(q, q64, "draft_probs")
        if d4:
            with nogil:
                bad = _spec_kernel(d32, offv, p64, q64, has_q, uv, o, a, scratch)
        else:
            with nogil:
                bad = _spec_kernel(d64, offv, p64, q64, has_q, uv, o, a, scratch)
    if bad:
        _kernel_failed(bad, "speculative_batch")
    return out, acc


# -- typical acceptance ----------------------------------------------------------------------
cdef Py_ssize_t _typical_kernel(const token_t[::1] d, const int64_t[::1] off,
                                const floating[:, ::1] p, double thr, double alpha,
                                int32_t[:, ::1] out, int32_t[::1] acc) noexcept nogil:
    cdef Py_ssize_t b = off.shape[0] - 1, v = p.shape[1], i, lo, hi, n, j, row, best, x
    cdef double h, y, cut, top
    if b > acc.shape[0] or b > out.shape[0] or p.shape[0] < d.shape[0]:
        return 1
    for i in range(b):
        lo = off[i]
        hi = off[i + 1]
        if not _rows_ok(lo, hi, d.shape[0], out.shape[1]):
            return i + 1
        n = 0
        while lo + n < hi:
            row = lo + n
            x = <Py_ssize_t>d[row]
            if x < 0 or x >= v:
                return i + 1
            # above the threshold a row is accepted whatever its entropy: skip the V logs
            if <double>p[row, x] > thr:
                out[i, n] = <int32_t>x
                n += 1
                continue
            h = 0.0
            for j in range(v):
                y = <double>p[row, j]
                if y > 0.0:
                    h -= y * log(y)
            cut = alpha * exp(-h)
            if thr < cut:
                cut = thr
            if <double>p[row, x] > cut:
                out[i, n] = <int32_t>x
                n += 1
            else:
                best = 0
                top = <double>p[row, 0]
                for j in range(v):
                    if <double>p[row, j] > top:
                        best = j
                        top = <double>p[row, j]
                out[i, n] = <int32_t>best
                break
        acc[i] = <int32_t>n
    return 0


def typical_batch(draft, offsets, target_probs, posterior_threshold=0.09, posterior_alpha=0.3,
                  check=True):
    check = bool(check)
    d, off, p, thr, alpha, k_max = prepare_typical(
        draft, offsets, target_probs, posterior_threshold, posterior_alpha, _FAST
    )
    if check:
        _raise_if_bad(p, "target_probs")
    cdef Py_ssize_t b = off.shape[0] - 1, bad
    out = np.full((b, k_max + 1), -1, dtype=np.int32)
    acc = np.zeros(b, dtype=np.int32)
    cdef int32_t[:, ::1] o = out
    cdef int32_t[::1] a = acc
    cdef const int64_t[::1] offv = off
    cdef double t = thr, al = alpha
    cdef const int32_t[::1] d32
    cdef const int64_t[::1] d64
    cdef const float[:, ::1] p32
    cdef const double[:, ::1] p64
    cdef bint d4 = d.dtype.itemsize == 4
    if d4:
        d32 = d
    else:
        d64 = d
    if p.dtype.itemsize == 4:
        p32 = p
        _unmoved(p, p32, "target_probs")   # taken last, compared with its array
        if d4:
            with nogil:
                bad = _typical_kernel(d32, offv, p32, t, al, o, a)
        else:
            with nogil:
                bad = _typical_kernel(d64, offv, p32, t, al, o, a)
    else:
        p64 = p
        _unmoved(p, p64, "target_probs")
        if d4:
            with nogil:
                bad = _typical_kernel(d32, offv, p64, t, al, o, a)
        else:
            with nogil:
                bad = _typical_kernel(d64, offv, p64, t, al, o, a)
    if bad:
        _kernel_failed(bad, "typical_batch")
    return out, acc
