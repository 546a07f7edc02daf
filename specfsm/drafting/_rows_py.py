"""The steady step of an index per batch row: every row only grew by its sampled tokens (pure-Python twin)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["steady_rows"]


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _plain_int(x: Any) -> bool:
    """A 1-D, C-contiguous, aligned, native-order int32/int64 ndarray (as the compiled
    module's ``plain_int_width`` reads it)."""
    if not isinstance(x, np.ndarray) or x.ndim != 1:
        return False
    f = x.flags
    return bool(f.c_contiguous and f.aligned and x.dtype.isnative and x.dtype.kind == "i" and x.itemsize in (4, 8))


def steady_rows(sampled: Any, num_tokens: Any, tok: Any, n_old: Any, seen: Any, tail: Any, spos: Any,
                spread: Any, anchors: Any, deep_first: int, deep_every: int, short: int, cap: int,
                pool_filter: Any, filter_mul: Any) -> tuple | None:
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
    steady never does."""
    deep_first, deep_every, short, cap = int(deep_first), int(deep_every), int(short), int(cap)
    if type(sampled) is not list or type(tok) is not np.ndarray or tok.ndim != 2:
        return None
    if not (tok.flags.c_contiguous and tok.flags.aligned) or not _plain_int(num_tokens):
        return None
    if tok.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        return None
    arrays = [np.asarray(a) for a in (n_old, seen, tail, spos, spread, anchors)]
    for a in arrays:
        _need(a.dtype == np.int64, "the row arrays must be int64")
    n_old, seen, tail, spos, spread, anc = arrays
    pool_f = np.asarray(pool_filter)
    mul = np.asarray(filter_mul)
    _need(pool_f.dtype == np.uint64 and mul.dtype == np.uint64, "pool_filter and filter_mul must be uint64")
    b = len(sampled)
    T, width = tail.shape[0], tok.shape[1]
    _need(min(n_old.shape[0], seen.shape[0], anc.shape[0], tail.shape[1], spos.shape[1],
              spread.shape[1]) >= b, f"the row arrays must hold at least the {b} rows")
    _need(spread.shape == spos.shape and T >= 2, "spos and spread must have the same shape, and tail at least 2 rows")
    _need(mul.shape[0] >= 3, "filter_mul must hold 3 multipliers")
    _need(deep_first >= 0 and deep_every >= 1, "deep_first must be >= 0, deep_every >= 1")
    if b == 0 or tok.shape[0] < b or num_tokens.shape[0] < b:
        return None
    if any(type(s) is not list for s in sampled):
        return None
    ns = np.fromiter(map(len, sampled), dtype=np.int64, count=b)
    n0, n = n_old[:b], num_tokens[:b].astype(np.int64)
    if not ((ns >= 1).all() and (n0 == seen[:b]).all() and (n0 > short).all() and (n0 >= T).all()
            and (n == n0 + ns).all() and (n <= width).all() and (n < cap).all()):
        return None
    rows = np.arange(b)
    old = tok[rows.reshape(-1, 1), n0.reshape(-1, 1) + np.arange(-T, 0)]
    if not (old.T == tail[:, :b]).all():
        return None
    deep = np.arange(deep_first, b, deep_every)
    at = spos[:, deep]
    if ((at < 0) | (at >= width)).any() or not (tok[deep, at.clip(0, width - 1)] == spread[:, deep]).all():
        return None
    tails = np.ascontiguousarray(tok[rows.reshape(-1, 1), n.reshape(-1, 1) + np.arange(-T, 0)].T, dtype=np.int64)
    offsets = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(ns, out=offsets[1:])
    new = np.concatenate([tok[r, n0[r] : n[r]] for r in range(b)]).astype(np.int64)
    keys = n.astype(np.uint64) * mul[0] + tails[T - 2].astype(np.uint64) * mul[1] + tails[T - 1].astype(np.uint64) * mul[2]
    twins = bool(np.unique(keys).shape[0] < b or np.isin(keys, pool_f).any())
    renew = deep[n[deep] >= 2 * anc[deep]].tolist()
    return n, new, offsets, tails, int(n.max()), twins, renew
