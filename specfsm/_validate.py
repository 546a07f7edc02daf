"""Argument checks shared by the compiled core and its pure-Python twin.

Both implementations call these at their Python boundary, so a bad argument gets the
same exception and the same message whichever one is active.
"""

from __future__ import annotations

import operator

import numpy as np

__all__ = ["check_count", "as_token_array", "settle_reason", "INT64_MAX", "INT64_MIN"]

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

_NATIVE = (np.dtype(np.int32), np.dtype(np.int64))


def check_count(value: object, name: str) -> int:
    """Return ``value`` as a non-negative Python int, or raise naming ``name``.

    Refuses floats, bools, strings and negative numbers.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a non-negative integer, got bool {value!r}")
    try:
        count = operator.index(value)  # type: ignore[arg-type]  # refusal handled below
    except TypeError:
        raise TypeError(
            f"{name} must be a non-negative integer, got {type(value).__name__} {value!r}"
        ) from None
    if count < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {count}")
    return count


def as_token_array(arr: np.ndarray, name: str) -> np.ndarray:
    """Return a 1-D, C-contiguous, native-order int32 or int64 view (or copy) of ``arr``.

    Other integer dtypes are widened to int64; uint64 is accepted when every id fits in
    int64. Refuses arrays that are not 1-D and non-integer dtypes (floats, bools,
    objects, strings).
    """
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got a {arr.ndim}-D array of shape {arr.shape}")
    dt = arr.dtype
    if dt.kind not in "iu":
        raise TypeError(
            f"{name} has unsupported dtype {dt}; token arrays must be int32 or int64 "
            "(pass a list for non-integer entries)"
        )
    if dt not in _NATIVE:
        if dt.kind == "u" and dt.itemsize == 8 and arr.size and int(arr.max()) > INT64_MAX:
            raise OverflowError(f"{name} holds ids beyond int64 (max {int(arr.max())})")
        if dt.itemsize == 4 and dt.kind == "i":
            arr = arr.astype(np.int32)  # byte-swapped int32
        else:
            arr = arr.astype(np.int64)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


def settle_reason(draft_len: int, accepted: int, n_row_tokens: int, n_row_caches: int) -> str | None:
    """Why settling a verify (``Verify.accept``/``accept_rows`` and the batch's settle)
    refuses these rows, or None when it accepts them.

    The text completes ``serving fsm: <transition> is not legal: ...``.
    """
    if draft_len == 0:
        return "the draft is empty: there is no row to settle"
    if accepted > draft_len:
        return f"accepted={accepted} is beyond the {draft_len}-token draft"
    if n_row_caches != draft_len:
        return (
            f"row_caches holds {n_row_caches} {_entries(n_row_caches)} for a {draft_len}-token "
            "draft; it needs one per draft row"
        )
    if accepted < draft_len and n_row_tokens <= accepted:
        return (
            f"row_tokens holds {n_row_tokens} {_entries(n_row_tokens)}; rejecting at row "
            f"{accepted} needs row_tokens[{accepted}]"
        )
    return None


def _entries(n: int) -> str:
    return "entry" if n == 1 else "entries"
