"""Row placement on the host: ``dst[b] = src[b, index[b]]`` as raw byte copies, and the
batched settle that chooses ``index`` (pure-Python twin of ``specfsm._core.place``)."""

from __future__ import annotations

import numpy as np

from ._checks import (
    as_host_index,
    as_settle_arrays,
    check_place_arrays,
    host_index_array,
    check_host_overlap,
    settle_index_reason,
)

__all__ = ["place_rows", "settle_index"]


def place_rows(src: np.ndarray, index: object, dst: np.ndarray) -> np.ndarray:
    """Copy row ``index[b]`` of ``src[b]`` into ``dst[b]`` for every request ``b``; returns ``dst``.

    ``src`` is a C-contiguous [B, K, ...] numpy array, ``dst`` a C-contiguous [B, ...]
    array of the same dtype and trailing shape, ``index`` B integers. ``index[b] < 0``
    leaves ``dst[b]`` untouched. Refuses (before copying anything) bad shapes, dtypes or
    contiguity, an ``index`` entry >= K (IndexError) and ``src``/``dst``/``index`` that
    overlap in memory.
    """
    if type(src) is not np.ndarray or type(dst) is not np.ndarray:
        raise TypeError(
            f"src and dst must be numpy arrays here, got {type(src).__name__} and "
            f"{type(dst).__name__}"
        )
    idx = host_index_array(index)  # converted (a private copy) before anything is checked
    B, K, row = check_place_arrays(src, dst)
    idx = as_host_index(idx, B, K)
    check_host_overlap(src, index, dst)
    if B == 0 or row == 0 or K == 0:  # nothing to copy (K == 0: every entry is negative)
        return dst
    s = src.reshape(-1).view(np.uint8).reshape(B, K, row)
    d = dst.reshape(-1).view(np.uint8).reshape(B, row)
    for b, k in enumerate(idx.tolist()):
        if k >= 0:
            d[b] = s[b, k]
    return dst


def settle_index(accepted: object, draft_lens: object) -> np.ndarray:
    """The ``index`` for ``place_rows`` after a batched verify, as an int64 array.

    For request ``b`` with ``draft_lens[b]`` rows of which ``accepted[b]`` were accepted:
    row ``accepted[b]`` when a row was rejected, row ``accepted[b] - 1`` when every row
    was accepted (``Verify.accept``'s placement rule), and -1 (leave the cache alone) when the
    request drafted nothing. Refuses (ValueError naming the first bad request) a negative
    count and ``accepted[b] > draft_lens[b]``; non-integer or non-1-D input raises
    TypeError/ValueError.
    """
    a, d = as_settle_arrays(accepted, draft_lens)
    out = np.empty(a.shape[0], dtype=np.int64)
    for b, (n, m) in enumerate(zip(a.tolist(), d.tolist())):
        if m < 0 or n < 0 or n > m:
            raise ValueError(settle_index_reason(b, n, m))
        out[b] = -1 if m == 0 else (n - 1 if n == m else n)
    return out
