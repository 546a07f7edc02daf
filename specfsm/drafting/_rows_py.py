"""The steady step of an index per batch row: every row only grew by its sampled tokens (pure-Python twin)."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = ["steady_rows"]


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
#: the type numbers numpy's PyArray_ISSIGNED / PyArray_ISUNSIGNED accept
_SIGNED = frozenset(np.dtype(c).num for c in "bhilq")
_UNSIGNED = frozenset(np.dtype(c).num for c in "BHILQ")


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _int64_arg(x: Any, name: str) -> int:
    """``x`` as an int64: an integer by ``__index__`` (TypeError otherwise), within int64
    (OverflowError naming it otherwise), as the compiled kernel takes it."""
    v = operator.index(x)
    if not _I64_MIN <= v <= _I64_MAX:
        raise OverflowError(f"{name} must fit in int64")
    return v


def _carray(x: Any, nd: int) -> np.ndarray | None:
    """``x`` as a plain ndarray when it is an ndarray (a subclass included) of ``nd``
    dimensions, C-contiguous, aligned and native-order (numpy's PyArray_ISCARRAY_RO),
    else None."""
    if not issubclass(type(x), np.ndarray):
        return None
    a = np.asarray(x)  # a subclass as a plain view: its own methods never run below
    f = a.flags
    if a.ndim != nd or not (f.c_contiguous and f.aligned and a.dtype.isnative):
        return None
    return a


def _plain_int(x: Any) -> np.ndarray | None:
    """``x`` as a plain ndarray when it is 1-D, C-contiguous, aligned, native-order int32 or
    int64 (as the compiled module's ``plain_int_width`` reads it), else None."""
    a = _carray(x, 1)
    if a is None or a.dtype.num not in _SIGNED or a.itemsize not in (4, 8):
        return None
    return a


def _array_of(x: Any, nd: int, kind: str, name: str) -> np.ndarray:
    """``x`` as an ``nd``-dimensional, C-contiguous, aligned, native-order array of 8-byte
    integers (``kind`` ``"i"`` signed, ``"u"`` unsigned); ValueError naming it otherwise
    (the compiled module's ``_array_of``)."""
    a = _carray(x, nd)
    if a is None or a.itemsize != 8 or a.dtype.num not in (_SIGNED if kind == "i" else _UNSIGNED):
        raise ValueError(f"{name} must be a {nd}-D C-contiguous {'u' if kind == 'u' else ''}int64 array")
    return a


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
    steady never does.

    The integers ``deep_first``, ``deep_every``, ``short`` and ``cap`` are taken, in that
    order, by ``__index__`` (TypeError otherwise) within int64 (OverflowError naming them
    otherwise); the array arguments other than ``num_tokens`` and ``tok`` must be ndarrays
    of exactly their dimensions, C-contiguous, aligned, native-order, of 8-byte signed
    (``pool_filter``, ``filter_mul``: unsigned) integers, else ValueError naming them,
    checked in the order ``n_old``, ``seen``, ``anchors``, ``tail``, ``spos``, ``spread``,
    then their sizes, ``pool_filter``, ``filter_mul``: the compiled kernel's checks, in its
    order, with its exception types and messages. Every comparison of a row's lengths and
    anchor is exact for all int64 values (nothing is added or doubled before it is
    bounded).
    """
    deep_first = _int64_arg(deep_first, "deep_first")
    deep_every = _int64_arg(deep_every, "deep_every")
    short = _int64_arg(short, "short")
    cap = _int64_arg(cap, "cap")
    if type(sampled) is not list or type(tok) is not np.ndarray:
        return None
    tok = _carray(tok, 2)
    if tok is None or tok.dtype.num not in _SIGNED or tok.itemsize not in (4, 8):
        return None
    num_tokens = _plain_int(num_tokens)
    if num_tokens is None:
        return None
    b = len(sampled)
    n_old = _array_of(n_old, 1, "i", "n_old")
    seen = _array_of(seen, 1, "i", "seen")
    anc = _array_of(anchors, 1, "i", "anchors")
    tail = _array_of(tail, 2, "i", "tail")
    spos = _array_of(spos, 2, "i", "spos")
    spread = _array_of(spread, 2, "i", "spread")
    _need(min(n_old.shape[0], seen.shape[0], anc.shape[0], tail.shape[1], spos.shape[1]) >= b,
          f"the row arrays must hold at least the {b} rows")
    T, width = tail.shape[0], tok.shape[1]
    _need(spread.shape == spos.shape and T >= 2, "spos and spread must have the same shape, and tail at least 2 rows")
    pool_f = _array_of(pool_filter, 1, "u", "pool_filter")
    mul = _array_of(filter_mul, 1, "u", "filter_mul")
    _need(mul.shape[0] >= 3, "filter_mul must hold 3 multipliers")
    _need(deep_first >= 0 and deep_every >= 1, "deep_first must be >= 0, deep_every >= 1")
    if b == 0 or tok.shape[0] < b or num_tokens.shape[0] < b:
        return None
    if any(type(s) is not list for s in sampled):
        return None
    ns = np.fromiter(map(len, sampled), dtype=np.int64, count=b)
    n0, n = n_old[:b], num_tokens[:b].astype(np.int64)
    # both lengths within [0, width] before their difference is taken: nothing wraps
    if not ((ns >= 1).all() and (n0 == seen[:b]).all() and (n0 > short).all() and (n0 >= T).all()
            and (n0 <= width).all() and (n >= 0).all() and (n <= width).all()):
        return None
    if not ((n - n0 == ns).all() and (n < cap).all()):
        return None
    rows = np.arange(b)
    old = tok[rows.reshape(-1, 1), n0.reshape(-1, 1) + np.arange(-T, 0)]
    if not (old.T == tail[:, :b]).all():
        return None
    deep = np.array(range(deep_first, b, deep_every), dtype=np.intp)  # (range: no int64 wrap)
    at = spos[:, deep]
    if ((at < 0) | (at >= width)).any() or not (tok[deep, at.clip(0, width - 1)] == spread[:, deep]).all():
        return None
    tails = np.ascontiguousarray(tok[rows.reshape(-1, 1), n.reshape(-1, 1) + np.arange(-T, 0)].T, dtype=np.int64)
    offsets = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(ns, out=offsets[1:])
    new = np.concatenate([tok[r, n0[r] : n[r]] for r in range(b)]).astype(np.int64)
    keys = n.astype(np.uint64) * mul[0] + tails[T - 2].astype(np.uint64) * mul[1] + tails[T - 1].astype(np.uint64) * mul[2]
    twins = bool(np.unique(keys).shape[0] < b or np.isin(keys, pool_f).any())
    # length >= 2 * anchor, exactly: anchor <= floor(length / 2) (length >= 0)
    renew = deep[anc[deep] <= n[deep] // 2].tolist()
    return n, new, offsets, tails, int(n.max()), twins, renew
