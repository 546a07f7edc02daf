"""Batched acceptance kernels over ragged drafts (pure-Python twin).

B requests' drafts lie end to end in one flat token array; ``offsets`` (B + 1 entries,
starting at 0, non-decreasing, ending at the flat length) says where request ``b``'s
rows are: ``draft[offsets[b]:offsets[b + 1]]``. Per-row inputs (the target's choices,
probability rows) use the same offsets. Every kernel returns ``(tokens, accepted)``:
``tokens`` an int32 ``[B, K_max + 1]`` array padded with -1 whose row ``b`` holds the
``accepted[b]`` accepted draft tokens followed, when a row was rejected, by the token
emitted at that row (exactly the ``row_tokens`` that ``ServingState.accept_rows``
needs); ``accepted`` an int32 ``[B]`` array. With ``specfsm.machine.state``'s convention (a K-row
verify, no bonus row) a row never fills column ``K_max``: it stays -1.

The argument checks and messages (``prepare_*``, ``prob_error``) live in
``specfsm._checks`` and the concept's check module, shared with the compiled module, so both raise identical errors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._checks import check_count
from ._checks import (
    PROB_ATOL,
    PROB_BADSUM,
    PROB_NEGATIVE,
    PROB_NONFINITE,
    PROB_OK,
    as_prob_rows,
    check_name,
    draw_uniforms,
    prepare_exact,
    prepare_speculative,
    prepare_typical,
    prob_error,
)

__all__ = [
    "PROB_ATOL",
    "check_probs",
    "exact_batch",
    "min_run_batch",
    "speculative_batch",
    "typical_batch",
]


# -- the probability-row check ---------------------------------------------------------
#: rows summed per block by ``_row_sums`` (bounds its float64 temporary)
_SUM_BLOCK = 1 << 20


def _row_sums(p: np.ndarray) -> np.ndarray:
    """Each row's sum in float64, in the compiled check's order (``accept_kernels.h``):
    eight lanes, lane ``l`` summing entries ``l, l + 8, ...`` of the row's first
    ``V - V % 8`` in order, the last ``V % 8`` entries added to lane 0 in order, then
    ``((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))``. The same operations in the
    same order give the same sum to the last bit, so a row near the tolerance is
    accepted or refused alike by both implementations (numpy's pairwise ``sum`` is not
    that order)."""
    n, v = p.shape
    v8 = v - v % 8
    sums = np.empty(n, dtype=np.float64)
    step = max(1, _SUM_BLOCK // max(v, 1))
    with np.errstate(invalid="ignore", over="ignore"):
        for r0 in range(0, n, step):
            blk = p[r0 : r0 + step]
            m = blk.shape[0]
            if v8:
                # cumsum adds strictly in order; + 0.0 is the compiled lanes' 0.0 start
                lanes = np.cumsum(blk[:, :v8].reshape(m, v8 // 8, 8), axis=1, dtype=np.float64)[:, -1, :] + 0.0
            else:
                lanes = np.zeros((m, 8), dtype=np.float64)
            for j in range(v8, v):
                lanes[:, 0] += blk[:, j]
            l_ = lanes.T
            sums[r0 : r0 + m] = ((l_[0] + l_[1]) + (l_[2] + l_[3])) + ((l_[4] + l_[5]) + (l_[6] + l_[7]))
    return sums


def _first_bad_row(p: np.ndarray):
    """(code, row, col, value) for the first row of ``p`` that is not a distribution."""
    bad = ~np.isfinite(p)
    bad |= p < 0
    elem_rows = bad.any(axis=1)
    sums = _row_sums(p)
    with np.errstate(invalid="ignore"):
        sum_rows = ~(np.abs(sums - 1.0) <= PROB_ATOL)
    rows = elem_rows | sum_rows
    if not rows.any():
        return PROB_OK, 0, 0, 0.0
    r = int(np.argmax(rows))
    if elem_rows[r]:
        c = int(np.argmax(bad[r]))
        val = float(p[r, c])
        return (PROB_NEGATIVE if val < 0 else PROB_NONFINITE), r, c, val
    return PROB_BADSUM, r, 0, float(sums[r])


def check_probs(probs: object, name: str = "probs") -> np.ndarray:
    """Return ``probs`` as a C-contiguous float32/float64 2-D array, refusing rows that
    hold NaN, infinities or negative entries or do not sum to 1 within ``PROB_ATOL``
    (ValueError naming ``name``), and a ``name`` that is not a str (TypeError)."""
    check_name(name)
    p = as_prob_rows(probs, name)
    code, r, c, val = _first_bad_row(p)
    if code != PROB_OK:
        raise prob_error(name, code, r, c, val)
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


def exact_batch(draft: Any, choices: Any, offsets: Any) -> tuple[np.ndarray, np.ndarray]:
    """Greedy exact match for B ragged drafts: request ``b`` keeps its leading rows whose
    draft token equals the target's choice, then emits the choice at the first mismatch.

    ``choices`` is flat like ``draft`` (one target choice per draft row). Refuses ids
    that are negative or beyond int32, bad offsets and length mismatches.
    """
    d, c, off, k_max = prepare_exact(draft, choices, offsets)
    return _exact_rows(d, c, off, k_max, 0)


def min_run_batch(draft: Any, choices: Any, offsets: Any, m: Any) -> tuple[np.ndarray, np.ndarray]:
    """``exact_batch`` where a request keeps its matched rows only when there are at
    least ``m`` of them (else it accepts 0 and emits its row-0 choice). ``m`` is any
    non-negative integer, however large (TypeError/ValueError naming it otherwise)."""
    mm = check_count(m, "m")
    d, c, off, k_max = prepare_exact(draft, choices, offsets)
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
    d, off, p, q, u, k_max, gen = prepare_speculative(
        draft, offsets, target_probs, draft_probs, uniforms
    )
    if check:
        for name, arr in (("target_probs", p), ("draft_probs", q)):
            if arr is not None:
                code, r, c, val = _first_bad_row(arr)
                if code != PROB_OK:
                    raise prob_error(name, code, r, c, val)
    b = off.shape[0] - 1
    if u is None:
        u = draw_uniforms(gen, d.shape[0] + b)
    out, acc = _new_out(b, k_max)
    dl = d.tolist()
    ol = off.tolist()
    v = p.shape[1]
    for i in range(b):
        lo, hi = ol[i], ol[i + 1]
        u_base = lo + i
        k = hi - lo
        n = 0
        while n < k:
            x = dl[lo + n]
            pp = float(p[lo + n, x])
            qq = float(q[lo + n, x]) if q is not None else 1.0
            if pp > 0.0 and float(u[u_base + n]) * qq <= pp:  # p(x) = 0: never accepted
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
            out[i, n] = _residual_pick(p64, q64, float(u[u_base + k]), x)
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
    d, off, p, thr, alpha, k_max = prepare_typical(
        draft, offsets, target_probs, posterior_threshold, posterior_alpha
    )
    if check:
        code, r, c, val = _first_bad_row(p)
        if code != PROB_OK:
            raise prob_error("target_probs", code, r, c, val)
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
