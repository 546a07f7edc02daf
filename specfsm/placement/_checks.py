"""Argument checks of row placement and the settle index.

Shared by every ``place_rows`` path: the compiled host kernel (``specfsm._core.place``),
its twin (``specfsm.placement._place_py``) and the CuPy wrapper (``specfsm.placement._cupy``): placement
arrays, the host index, memory overlap and byte bounds, and ``settle_index``'s arrays.
Nothing here imports CuPy: the functions only read ``shape``, ``dtype``, ``ndim`` and
``flags``, which numpy and CuPy arrays share.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import INT32_MAX, INT64_MAX

__all__ = [
    "check_place_arrays",
    "index_reason",
    "host_index_array",
    "as_host_index",
    "overlap_message",
    "check_host_overlap",
    "byte_bounds",
    "ranges_overlap",
    "count_array",
    "as_settle_arrays",
    "settle_index_reason",
]

_NATIVE_IDS = (np.dtype(np.int32), np.dtype(np.int64))


def check_place_arrays(src, dst) -> tuple[int, int, int]:
    """``(B, K, row_bytes)`` for ``src`` [B, K, ...] and ``dst`` [B, ...], or raise.

    Refuses a ``src`` under 2-D, a ``dst`` whose shape is not ``src``'s without the K
    axis, differing dtypes, object dtypes (a raw byte copy cannot move references),
    arrays that are not C-contiguous and a read-only ``dst``.
    """
    if src.ndim < 2:
        raise ValueError(
            f"src must be [B, K, ...] (at least 2-D), got a {src.ndim}-D array of shape "
            f"{tuple(src.shape)}"
        )
    expected = (src.shape[0],) + tuple(src.shape[2:])
    if tuple(dst.shape) != expected:
        raise ValueError(
            f"dst must have shape {expected} (src's shape {tuple(src.shape)} without the "
            f"K axis), got {tuple(dst.shape)}"
        )
    if dst.dtype != src.dtype:
        raise TypeError(f"dst has dtype {dst.dtype}; it must match src's dtype {src.dtype}")
    if src.dtype.hasobject:
        raise TypeError(
            f"src has dtype {src.dtype}, which holds Python objects; place_rows copies raw "
            "bytes and cannot move object references"
        )
    if not src.flags.c_contiguous:
        raise ValueError(
            f"src must be C-contiguous (strides {tuple(src.strides)} for shape "
            f"{tuple(src.shape)}); make a contiguous copy first"
        )
    if not dst.flags.c_contiguous:
        raise ValueError(
            f"dst must be C-contiguous (strides {tuple(dst.strides)} for shape "
            f"{tuple(dst.shape)}); place_rows writes rows in place, so pass a contiguous array"
        )
    writeable = getattr(dst.flags, "writeable", True)
    if not writeable:
        raise ValueError("dst is read-only; place_rows writes into it")
    batch = int(src.shape[0])
    rows = int(src.shape[1])
    if batch > INT32_MAX:
        raise ValueError(f"src holds B={batch} requests; place_rows takes at most {INT32_MAX}")
    return batch, rows, int(src.dtype.itemsize) * _product(src.shape[2:])


def _product(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def index_reason(b: int, value: int, K: int) -> str:
    """The message for an ``index[b]`` that names a row past the K rows."""
    return (
        f"index[{b}]={value} is out of range for K={K} rows (entries must be < K; a "
        "negative entry leaves dst[b] untouched)"
    )


def host_index_array(index) -> np.ndarray:
    """``index`` as a numpy array that the call owns (always a copy), converted before
    anything is checked: whatever the conversion runs (a sequence's ``__getitem__``,
    ``__array__``) and whatever other threads later write into the caller's array, the
    checked entries are the ones copied. ``as_host_index`` then checks it."""
    if type(index) is np.ndarray:
        return index.copy()
    arr = np.array(index)
    if arr.size == 0 and arr.ndim == 1 and arr.dtype.kind == "f":
        arr = np.zeros(0, np.int64)  # np.array([]) is float64
    return arr


def as_host_index(index, B: int, K: int, check_range: bool = True) -> np.ndarray:
    """``index`` as a 1-D, C-contiguous, native int32 or int64 numpy array of B entries.

    Accepts any 1-D integer array-like (lists too); other integer widths are widened to
    int64. Refuses other shapes, non-integer dtypes, a length other than B and any entry
    >= K (IndexError naming the first such entry), so nothing is copied on bad input.
    ``check_range=False`` leaves the last check to a caller that scans the returned array
    itself (raising with ``index_reason`` for the first entry >= K); entries that the
    conversion to int64 would change are still checked here.
    """
    arr = index if type(index) is np.ndarray else np.asarray(index)
    if arr.ndim != 1:
        raise ValueError(
            f"index must be 1-D (one entry per request), got a {arr.ndim}-D array of shape "
            f"{arr.shape}"
        )
    dt = arr.dtype
    if dt.kind not in "iu":
        if arr.size == 0 and dt.kind == "f" and type(index) is not np.ndarray:
            arr, dt = np.zeros(0, np.int64), np.dtype(np.int64)  # np.asarray([]) is float64
        else:
            raise TypeError(f"index has dtype {dt}; it must be int32 or int64")
    if arr.shape[0] != B:
        raise ValueError(
            f"index has {arr.shape[0]} entries; it needs one per request (B={B})"
        )
    if B and (check_range or dt not in _NATIVE_IDS) and int(arr.max()) >= K:
        b = int(np.argmax(arr >= K))
        raise IndexError(index_reason(b, int(arr[b]), K))
    if dt not in _NATIVE_IDS:
        arr = arr.astype(np.int32 if (dt.kind == "i" and dt.itemsize == 4) else np.int64)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


def check_host_overlap(src: Any, index: Any, dst: Any) -> None:
    """Refuse host arrays that share memory with ``dst`` (``src``, or an ndarray
    ``index``): a row could be overwritten before it is read."""
    if np.may_share_memory(src, dst):
        raise ValueError(overlap_message("src", "dst"))
    if isinstance(index, np.ndarray) and np.may_share_memory(index, dst):
        raise ValueError(overlap_message("index", "dst"))


def overlap_message(a: str, b: str) -> str:
    """The message for two ``place_rows`` arguments that share memory."""
    return (
        f"{a} and {b} overlap in memory; place_rows needs separate arrays (a row could be "
        "overwritten before it is read)"
    )


def byte_bounds(ptr: int, shape, strides, itemsize: int) -> tuple[int, int]:
    """``[lo, hi)``: the bytes an array with these pointer, shape and strides can touch."""
    lo = hi = ptr
    for n, s in zip(shape, strides):
        if n == 0:
            return ptr, ptr
        extent = (int(n) - 1) * int(s)
        if extent < 0:
            lo += extent
        else:
            hi += extent
    return lo, hi + itemsize


def ranges_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two ``[lo, hi)`` byte ranges share a byte (empty ranges share none)."""
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]


def count_array(values, name: str) -> np.ndarray:
    """``values`` as a private (copied) 1-D int64 array of integers; refuses other
    shapes, non-integer dtypes and uint64 entries beyond int64."""
    arr = values.copy() if type(values) is np.ndarray else np.array(values)  # private
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D (one entry per request), got a {arr.ndim}-D array of shape "
            f"{arr.shape}"
        )
    if arr.dtype.kind not in "iu":
        if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64
            return np.zeros(0, np.int64)
        raise TypeError(f"{name} has dtype {arr.dtype}; it must hold integers")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size:
        big = arr > np.uint64(INT64_MAX)
        if big.any():
            b = int(np.argmax(big))
            raise OverflowError(f"{name}[{b}]={int(arr[b])} does not fit in int64")
    if arr.dtype != np.dtype(np.int64) or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=np.int64)
    return arr


def as_settle_arrays(accepted, draft_lens) -> tuple[np.ndarray, np.ndarray]:
    """``accepted`` and ``draft_lens`` as private (copied) 1-D int64 arrays of one
    length, or raise.

    Refuses shapes other than 1-D, non-integer dtypes and differing lengths; the values
    themselves are checked by the settle loop (see ``settle_index_reason``).
    """
    a = count_array(accepted, "accepted")
    d = count_array(draft_lens, "draft_lens")
    if a.shape[0] != d.shape[0]:
        raise ValueError(
            f"accepted has {a.shape[0]} entries and draft_lens {d.shape[0]}; they need one "
            "entry per request each"
        )
    return a, d


def settle_index_reason(b: int, accepted: int, draft_len: int) -> str:
    """Why request ``b`` cannot be settled (``settle_index`` raises ValueError with it)."""
    if draft_len < 0:
        return f"draft_lens[{b}]={draft_len} is negative"
    if accepted < 0:
        return f"accepted[{b}]={accepted} is negative"
    return (
        f"accepted[{b}]={accepted} is beyond the draft's {draft_len} rows "
        f"(draft_lens[{b}]={draft_len})"
    )
