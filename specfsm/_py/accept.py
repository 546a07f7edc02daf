"""Batched acceptance kernels over ragged drafts (pure-Python twin).

B requests' drafts lie end to end in one flat token array; ``offsets`` (B + 1 entries,
starting at 0, non-decreasing, ending at the flat length) says where request ``b``'s
rows are: ``draft[offsets[b]:offsets[b + 1]]``. Per-row inputs (the target's choices,
probability rows) use the same offsets. Every kernel returns ``(tokens, accepted)``:
``tokens`` an int32 ``[B, K_max + 1]`` array padded with -1 whose row ``b`` holds the
``accepted[b]`` accepted draft tokens followed, when a row was rejected, by the token
emitted at that row (exactly the ``row_tokens`` that ``ServingState.accept_rows``
needs); ``accepted`` an int32 ``[B]`` array. With ``specfsm.state``'s convention (a K-row
verify, no bonus row) a row never fills column ``K_max``: it stays -1.

The private ``_prepare_*`` / ``_prob_error`` helpers below are the argument checks and
messages shared with the compiled module (``specfsm._core.accept`` imports them), so
both raise identical errors.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_token_array, check_count

__all__ = [
    "PROB_ATOL",
    "check_probs",
    "exact_batch",
    "min_run_batch",
    "speculative_batch",
    "typical_batch",
]

#: How far a probability row's sum may stray from 1 (absolute, summed in float64).
PROB_ATOL = 1e-3

_INT32_MAX = 2**31 - 1
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_NATIVE_TOKENS = (np.dtype(np.int32), np.dtype(np.int64))
_INT64 = np.dtype(np.int64)

# Error codes shared with the compiled row check.
_OK, _NONFINITE, _NEGATIVE, _BADSUM = 0, 1, 2, 3


# -- shared argument checks (used by the compiled module too) --------------------------
# Every ``_prepare_*`` first converts all of its arguments (running whatever Python code
# that takes: ``__index__``, ``__float__``, ``__array__``, ``__bool__``), taking private
# copies of the small control arrays (draft, choices, offsets, uniforms), and only then
# validates, on those copies. Nothing the caller holds can change them afterwards, so
# the compiled kernels may read them with the GIL released.
def _tokens(x: object, name: str, own: bool = False) -> np.ndarray:
    """A 1-D int32/int64 C-contiguous array from an array, list or tuple of ids; with
    ``own`` an array no one else holds (a copy whenever the input's memory could be)."""
    if own and type(x) is np.ndarray and x.ndim == 1 and x.dtype in _NATIVE_TOKENS:
        return np.array(x, order="C")  # the common case: one copy, already in shape
    fresh = False
    if not isinstance(x, np.ndarray):
        if isinstance(x, (str, bytes)) or not hasattr(x, "__len__"):
            raise TypeError(
                f"{name} must be a 1-D integer array, list or tuple, got {type(x).__name__}"
            )
        fresh = type(x) is list or type(x) is tuple  # np.asarray builds a new array
        arr = np.asarray(x)
        if arr.size == 0 and arr.ndim == 1:
            arr = arr.astype(np.int64)
        x = arr
    elif type(x) is not np.ndarray:
        x = np.asarray(x)  # a subclass: its overrides are not run again below
    out = as_token_array(x, name)
    if own and out is x and not fresh:
        out = out.copy()
    return out


_SMALL = 64  # below this many entries, checks run on Python lists (cheaper than numpy calls)


def _as_offsets(offsets: object, name: str = "offsets") -> np.ndarray:
    """``offsets`` converted to a private int64 array (not yet checked)."""
    if type(offsets) is np.ndarray and offsets.ndim == 1 and offsets.dtype == _INT64:
        return np.array(offsets, order="C")  # the common case: one copy
    off = _tokens(offsets, name, own=True)
    if off.dtype != _INT64:
        off = off.astype(np.int64)
    return off


def _check_offsets(off: np.ndarray, total: int, name: str = "offsets") -> int:
    """K_max, refusing offsets that do not describe ``total`` rows.

    Order is checked by comparing neighbours (never by subtracting int64 values, which
    wraps around near -2**63); the row counts are taken only once the offsets are known
    to run from 0 to ``total`` without decreasing."""
    n = off.shape[0]
    if n == 0:
        raise ValueError(f"{name} must hold B + 1 entries starting at 0, got an empty array")
    if n <= _SMALL:
        # Python ints: the steps are exact, so K_max is gathered on the way
        lst = off.tolist()
        first = prev = lst[0]
        last = lst[-1]
        bad = -1
        k_max = 0
        for i in range(1, n):
            x = lst[i]
            if x < prev:
                bad = i - 1
                break
            if x - prev > k_max:
                k_max = x - prev
            prev = x
    else:
        first, last = int(off[0]), int(off[-1])
        dec = off[:-1] > off[1:]
        bad = int(np.argmax(dec)) if dec.any() else -1
    if first != 0:
        raise ValueError(f"{name}[0] must be 0, got {first}")
    if bad >= 0:
        raise ValueError(
            f"{name} must be non-decreasing, got {name}[{bad}]={int(off[bad])} > "
            f"{name}[{bad + 1}]={int(off[bad + 1])}"
        )
    if last != total:
        raise ValueError(f"{name}[-1]={last} must equal the flat draft length {total}")
    if n <= _SMALL:
        return k_max
    # every entry now lies in [0, total]: the int64 differences cannot wrap
    return int(np.diff(off).max())


def _offsets(offsets: object, total: int, name: str = "offsets") -> tuple[np.ndarray, int]:
    """(offsets as a private int64 array, K_max), refusing offsets that do not describe
    ``total`` rows."""
    off = _as_offsets(offsets, name)
    return off, _check_offsets(off, total, name)


def _check_ids(arr: np.ndarray, name: str, hi: int, what: str) -> None:
    """Refuse ids outside [0, hi)."""
    n = arr.shape[0]
    if n == 0:
        return
    if n <= _SMALL:
        lst = arr.tolist()
        lo_v, hi_v = min(lst), max(lst)
        if lo_v >= 0 and hi_v < hi:
            return
        lo_i, hi_i = lst.index(lo_v), lst.index(hi_v)
    else:
        lo_i, hi_i = int(np.argmin(arr)), int(np.argmax(arr))
    if arr[lo_i] < 0:
        raise ValueError(f"{name}[{lo_i}]={int(arr[lo_i])} is negative; token ids must be >= 0")
    if arr[hi_i] >= hi:
        raise ValueError(f"{name}[{hi_i}]={int(arr[hi_i])} is outside {what} [0, {hi})")


def _prepare_exact(draft: object, choices: object, offsets: object, fast=None):
    """(draft, choices, offsets, K_max) converted into private arrays, then checked.

    ``fast``: the compiled module's ``(check_offsets, check_ids)``, loops in C with the
    same results and errors as ``_check_offsets`` / ``_check_ids`` (which they call to
    raise)."""
    check_offsets, check_ids = fast or (_check_offsets, _check_ids)
    d = _tokens(draft, "draft", own=True)
    c = _tokens(choices, "choices", own=True)
    off = _as_offsets(offsets)
    if c.shape[0] != d.shape[0]:
        raise ValueError(
            f"choices holds {c.shape[0]} entries; it needs one per draft row ({d.shape[0]})"
        )
    if d.dtype != c.dtype:
        d = d.astype(np.int64)
        c = c.astype(np.int64)
    k_max = check_offsets(off, d.shape[0])
    check_ids(d, "draft", _INT32_MAX + 1, "the int32 output range")
    check_ids(c, "choices", _INT32_MAX + 1, "the int32 output range")
    return d, c, off, k_max


def _prepare_min_run(m: object) -> int:
    return check_count(m, "m")


def _probs(x: object, name: str) -> np.ndarray:
    """A C-contiguous, native float32/float64 2-D ndarray (not a subclass) of ``x``;
    read in place when it already is one."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a 2-D float32 or float64 numpy array, got {type(x).__name__}")
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows x vocabulary), got shape {x.shape}")
    if x.dtype not in _FLOATS:
        if x.dtype.kind != "f":
            raise TypeError(f"{name} has dtype {x.dtype}; probabilities must be float32 or float64")
        x = x.astype(np.float64)
    if not x.flags.c_contiguous or not x.dtype.isnative:
        x = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))
    if x.shape[1] == 0:
        raise ValueError(f"{name} has an empty vocabulary (shape {x.shape})")
    return x


def _as_uniforms(uniforms: object):
    """(a private float64 copy of ``uniforms``, None), or (None, the Generator to draw
    them from once every argument has been checked)."""
    if isinstance(uniforms, np.random.Generator):
        return None, uniforms
    if not isinstance(uniforms, np.ndarray):
        raise TypeError(
            "uniforms must be a 1-D float64 numpy array or a numpy.random.Generator, "
            f"got {type(uniforms).__name__}"
        )
    return np.array(uniforms, dtype=np.float64, order="C", copy=True), None


def _check_uniforms(u: np.ndarray, need: int) -> None:
    if u.ndim != 1 or u.shape[0] != need:
        raise ValueError(
            f"uniforms must be 1-D with one draw per draft row plus one per request "
            f"({need}), got shape {u.shape}"
        )
    if need <= _SMALL:
        i = next((i for i, x in enumerate(u.tolist()) if not 0.0 <= x < 1.0), -1)
    else:
        ok = (u >= 0.0) & (u < 1.0)
        i = -1 if ok.all() else int(np.argmax(~ok))
    if i >= 0:
        raise ValueError(f"uniforms[{i}]={float(u[i])!r} is outside [0, 1)")


def _draw_uniforms(gen: np.random.Generator, need: int) -> np.ndarray:
    """``need`` draws from ``gen``, taken only after every argument has been checked (so a
    refused call leaves the generator's stream where it was), in a private array."""
    if type(gen) is np.random.Generator:
        return gen.random(need)  # a new float64 array of draws in [0, 1), ours alone
    u = np.array(gen.random(need), dtype=np.float64, order="C", copy=True)  # a subclass
    _check_uniforms(u, need)
    return u


def _prepare_speculative(draft, offsets, target_probs, draft_probs, uniforms, fast=None):
    """(draft, offsets, P, Q or None, U, K_max, Generator or None) converted, then checked.

    U is None when ``uniforms`` is a Generator: the caller draws from it (with
    ``_draw_uniforms``) after its own remaining checks. ``fast``: as for
    ``_prepare_exact``."""
    check_offsets, check_ids = fast or (_check_offsets, _check_ids)
    d = _tokens(draft, "draft", own=True)
    off = _as_offsets(offsets)
    p = _probs(target_probs, "target_probs")
    q = None if draft_probs is None else _probs(draft_probs, "draft_probs")
    u, gen = _as_uniforms(uniforms)
    k_max = check_offsets(off, d.shape[0])
    n, v = p.shape
    if n != d.shape[0]:
        raise ValueError(
            f"target_probs has {n} rows; it needs one per draft row ({d.shape[0]})"
        )
    if q is not None:
        if q.shape != p.shape:
            raise ValueError(
                f"draft_probs has shape {q.shape}; it must match target_probs {p.shape}"
            )
        if q.dtype != p.dtype:
            q = q.astype(p.dtype)
    check_ids(d, "draft", v, "the vocabulary")
    if u is not None:
        _check_uniforms(u, d.shape[0] + off.shape[0] - 1)
    return d, off, p, q, u, k_max, gen


def _as_real(value: object, name: str) -> float:
    """``value`` converted to a float (not yet checked), or TypeError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def _check_real(x: float, name: str) -> float:
    if not (math.isfinite(x) and x >= 0.0):
        raise ValueError(f"{name} must be finite and >= 0, got {x!r}")
    return x


def _real(value: object, name: str) -> float:
    """``value`` as a finite, non-negative float, or raise naming ``name``."""
    return _check_real(_as_real(value, name), name)


def _prepare_typical(draft, offsets, target_probs, posterior_threshold, posterior_alpha,
                     fast=None):
    """(draft, offsets, P, threshold, alpha, K_max) converted, then checked (``fast``: as
    for ``_prepare_exact``)."""
    check_offsets, check_ids = fast or (_check_offsets, _check_ids)
    thr = _as_real(posterior_threshold, "posterior_threshold")
    alpha = _as_real(posterior_alpha, "posterior_alpha")
    d = _tokens(draft, "draft", own=True)
    off = _as_offsets(offsets)
    p = _probs(target_probs, "target_probs")
    _check_real(thr, "posterior_threshold")
    _check_real(alpha, "posterior_alpha")
    k_max = check_offsets(off, d.shape[0])
    if p.shape[0] != d.shape[0]:
        raise ValueError(
            f"target_probs has {p.shape[0]} rows; it needs one per draft row ({d.shape[0]})"
        )
    check_ids(d, "draft", p.shape[1], "the vocabulary")
    return d, off, p, thr, alpha, k_max


def _prob_error(name: str, code: int, row: int, col: int, value: float) -> ValueError:
    """The error for the first bad probability row (same text from both implementations)."""
    if code == _NONFINITE:
        return ValueError(f"{name}[{row}, {col}] is {value:.6g}: probabilities must be finite")
    if code == _NEGATIVE:
        return ValueError(f"{name}[{row}, {col}]={value:.6g} is a negative probability")
    return ValueError(
        f"{name} row {row} sums to {value:.6g}, not 1 (tolerance {PROB_ATOL:g})"
    )


def _first_bad_row(p: np.ndarray):
    """(code, row, col, value) for the first row of ``p`` that is not a distribution."""
    bad = ~np.isfinite(p)
    bad |= p < 0
    elem_rows = bad.any(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        sums = p.sum(axis=1, dtype=np.float64)
        sum_rows = ~(np.abs(sums - 1.0) <= PROB_ATOL)
    rows = elem_rows | sum_rows
    if not rows.any():
        return _OK, 0, 0, 0.0
    r = int(np.argmax(rows))
    if elem_rows[r]:
        c = int(np.argmax(bad[r]))
        val = float(p[r, c])
        return (_NEGATIVE if val < 0 else _NONFINITE), r, c, val
    return _BADSUM, r, 0, float(sums[r])


def check_probs(probs: object, name: str = "probs") -> np.ndarray:
    """Return ``probs`` as a C-contiguous float32/float64 2-D array, refusing rows that
    hold NaN, infinities or negative entries or do not sum to 1 within ``PROB_ATOL``."""
    p = _probs(probs, name)
    code, r, c, val = _first_bad_row(p)
    if code != _OK:
        raise _prob_error(name, code, r, c, val)
    return p


# -- kernels -------------------------------------------------------------------------
def _new_out(b: int, k_max: int):
    return np.full((b, k_max + 1), -1, dtype=np.int32), np.zeros(b, dtype=np.int32)


def _exact_rows(d, c, off, k_max, m):
    b = off.shape[0] - 1
    out, acc = _new_out(b, k_max)
    dl = d.tolist()
    cl = c.tolist()
    ol = off.tolist()
    for i in range(b):
        lo, hi = ol[i], ol[i + 1]
        n = 0
        while lo + n < hi and dl[lo + n] == cl[lo + n]:
            n += 1
        if n < m:
            n = 0
        k = hi - lo
        row = out[i]
        for j in range(n):
            row[j] = dl[lo + j]
        if n < k:
            row[n] = cl[lo + n]
        acc[i] = n
    return out, acc


def exact_batch(draft, choices, offsets):
    """Greedy exact match for B ragged drafts: request ``b`` keeps its leading rows whose
    draft token equals the target's choice, then emits the choice at the first mismatch.

    ``choices`` is flat like ``draft`` (one target choice per draft row). Refuses ids
    that are negative or beyond int32, bad offsets and length mismatches.
    """
    d, c, off, k_max = _prepare_exact(draft, choices, offsets)
    return _exact_rows(d, c, off, k_max, 0)


def min_run_batch(draft, choices, offsets, m):
    """``exact_batch`` where a request keeps its matched rows only when there are at
    least ``m`` of them (else it accepts 0 and emits its row-0 choice)."""
    mm = _prepare_min_run(m)
    d, c, off, k_max = _prepare_exact(draft, choices, offsets)
    return _exact_rows(d, c, off, k_max, mm)


def speculative_batch(draft, offsets, target_probs, draft_probs, uniforms, check=True):
    """Speculative-sampling acceptance for B ragged drafts.

    ``target_probs`` (and ``draft_probs``, or None for drafts without probabilities,
    treated as one-hot on the drafted token) hold one row per draft row (N x V).
    ``uniforms`` holds N + B draws in [0, 1) (or is a ``numpy.random.Generator``, drawn
    from only once every argument has been checked): request ``b`` reads its K_b
    acceptance draws at ``uniforms[offsets[b] + b : offsets[b + 1] + b]`` and its
    residual draw right after. Row i is accepted when ``p_i(x_i) > 0`` and
    ``u_i * q_i(x_i) <= p_i(x_i)`` (a token the target gives probability 0 is never
    accepted); at the first rejected row the token is drawn by inverse CDF from
    ``max(0, p - q)`` (float64, in the summation order ``_residual_pick`` documents). With ``check`` every probability row is checked first (finite,
    non-negative, sums to 1 within ``PROB_ATOL``); token ids, shapes and uniforms are
    always checked.
    """
    check = bool(check)
    d, off, p, q, u, k_max, gen = _prepare_speculative(
        draft, offsets, target_probs, draft_probs, uniforms
    )
    if check:
        for name, arr in (("target_probs", p), ("draft_probs", q)):
            if arr is not None:
                code, r, c, val = _first_bad_row(arr)
                if code != _OK:
                    raise _prob_error(name, code, r, c, val)
    b = off.shape[0] - 1
    if u is None:
        u = _draw_uniforms(gen, d.shape[0] + b)
    out, acc = _new_out(b, k_max)
    dl = d.tolist()
    ol = off.tolist()
    v = p.shape[1]
    for i in range(b):
        lo, hi = ol[i], ol[i + 1]
        ub = lo + i
        k = hi - lo
        n = 0
        while n < k:
            x = dl[lo + n]
            pp = float(p[lo + n, x])
            qq = float(q[lo + n, x]) if q is not None else 1.0
            if pp > 0.0 and float(u[ub + n]) * qq <= pp:  # p(x) = 0: never accepted
                out[i, n] = x
                n += 1
            else:
                break
        acc[i] = n
        if n < k:
            row = lo + n
            x = dl[row]
            p64 = p[row].astype(np.float64)
            if q is not None:
                q64 = q[row].astype(np.float64)
            else:
                q64 = np.zeros(v, dtype=np.float64)
                q64[x] = 1.0
            out[i, n] = _residual_pick(p64, q64, float(u[ub + k]), x)
    return out, acc


def _residual_pick(p64: np.ndarray, q64: np.ndarray, uu: float, x: int) -> int:
    """Inverse-CDF draw from ``r = max(0, p - q)``, falling back to p when r is empty.

    The summation order is part of the contract (the compiled kernel performs the same
    float64 operations): entries in groups of 8 (zeros past the end), each group summed
    as ``((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))``, group sums added in order; the token is
    the first entry whose running sum, walked from its group's start, exceeds
    ``uu * total`` (else the group's last positive entry; else the row's).
    """
    v = p64.shape[0]
    pad = (-v) % 8
    for r in (p64 - q64, p64.copy()):
        r[~(r > 0.0)] = 0.0
        g = np.concatenate([r, np.zeros(pad)]).reshape(-1, 8)
        gs = ((g[:, 0] + g[:, 1]) + (g[:, 2] + g[:, 3])) + ((g[:, 4] + g[:, 5]) + (g[:, 6] + g[:, 7]))
        run = np.cumsum(gs)
        total = float(run[-1])
        if not total > 0.0:
            continue
        t = uu * total
        gi = int(np.searchsorted(run, t, side="right"))
        if gi == run.shape[0]:
            return int(np.flatnonzero(r > 0.0)[-1])
        a = float(run[gi - 1]) if gi else 0.0
        last = -1
        for j in range(gi * 8, min(gi * 8 + 8, v)):
            rj = float(r[j])
            if rj > 0.0:
                last = j
            a += rj
            if a > t:
                return j
        return last
    return x


def typical_batch(draft, offsets, target_probs, posterior_threshold=0.09, posterior_alpha=0.3,
                  check=True):
    """Typical acceptance for B ragged drafts: row i is accepted while
    ``p_i(x_i) > min(posterior_threshold, posterior_alpha * exp(-H(p_i)))``; at the
    first rejected row the target's greedy choice (first argmax) is emitted.

    ``H(p) = -sum p log p`` over the positive entries, summed in float64 in row order
    with the C library's ``log`` and ``exp`` (what ``math.log``/``math.exp`` call), so
    both implementations agree bit for bit. Refuses thresholds that are negative or not
    finite, and the inputs ``speculative_batch`` refuses.
    """
    check = bool(check)
    d, off, p, thr, alpha, k_max = _prepare_typical(
        draft, offsets, target_probs, posterior_threshold, posterior_alpha
    )
    if check:
        code, r, c, val = _first_bad_row(p)
        if code != _OK:
            raise _prob_error("target_probs", code, r, c, val)
    b = off.shape[0] - 1
    out, acc = _new_out(b, k_max)
    dl = d.tolist()
    ol = off.tolist()
    log, exp = math.log, math.exp
    for i in range(b):
        lo, hi = ol[i], ol[i + 1]
        n = 0
        while lo + n < hi:
            row = p[lo + n].astype(np.float64).tolist()
            if row[dl[lo + n]] > thr:  # accepted whatever the entropy: skip the V logs
                out[i, n] = dl[lo + n]
                n += 1
                continue
            h = 0.0
            for x in row:
                if x > 0.0:
                    h -= x * log(x)
            cut = alpha * exp(-h)
            if thr < cut:
                cut = thr
            if row[dl[lo + n]] > cut:
                out[i, n] = dl[lo + n]
                n += 1
            else:
                best, top = 0, row[0]
                for j, x in enumerate(row):
                    if x > top:
                        best, top = j, x
                out[i, n] = best
                break
        acc[i] = n
    return out, acc
