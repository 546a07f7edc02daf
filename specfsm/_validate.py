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


# --- suffix index checks ---
# The suffix index (compiled ``_core/suffix_index.pyx`` and its twin
# ``specfsm/_py/suffix_index.py``) takes every argument check from here. The batch and
# draft-length checks repeat, with the same messages, those of ``specfsm/_py/ngram_index.py``
# (``_as_ids``, ``_check_batch_k``, ``_check_draft_limits``, ``_check_prefer``,
# ``_check_record``, ``_own_offsets``, ``_validate_offsets``), so that the compiled core
# imports nothing from ``specfsm._py``.

#: positions and states are 32-bit: a suffix index holds at most this many tokens
MAX_SUFFIX_TOKENS = 2**30 - 1
#: ``max_n=None`` (no cap on the match length) is stored as this
UNBOUNDED = MAX_SUFFIX_TOKENS + 1
#: adaptive draft length: added after a fully accepted draft, taken after a rejection
GROW_STEP = 2
SHRINK_STEP = 1


def as_ids(tokens: object, name: str) -> np.ndarray:
    """Token ids as a 1-D C-contiguous int32 or int64 ndarray (the caller's own array
    when it already is one: copy before relying on it).

    Accepts a 1-D integer ndarray or a list/tuple (or other sequence) of Python or numpy
    integers. Refuses 2-D input, non-integer entries (floats, bools, strings) and ids
    beyond int64.
    """
    from collections.abc import Sequence

    if isinstance(tokens, np.ndarray):
        return as_token_array(tokens, name)
    if isinstance(tokens, (str, bytes, bytearray)) or not isinstance(tokens, Sequence):
        raise TypeError(
            f"{name} must be a list, tuple or 1-D integer numpy array, "
            f"got {type(tokens).__name__}"
        )
    if len(tokens) == 0:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.asarray(tokens)
    except (ValueError, TypeError) as exc:  # ragged nesting and the like
        raise ValueError(f"{name} must be a flat sequence of integer ids ({exc})") from None
    if arr.dtype == object:
        for x in arr.reshape(-1).tolist():
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"{name} must hold integer ids, got {type(x).__name__} {x!r}")
            if not INT64_MIN <= int(x) <= INT64_MAX:
                raise OverflowError(f"{name} holds ids beyond int64 (got {int(x)!r})")
        raise TypeError(f"{name} must hold integer ids")  # pragma: no cover - unreachable
    if arr.dtype.kind == "b":
        raise TypeError(f"{name} must hold integer ids, got bools")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer ids, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got a {arr.ndim}-D array of shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > INT64_MAX:
        raise OverflowError(f"{name} holds ids beyond int64 (got {int(arr.max())!r})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_prefer(prefer: object) -> bool:
    """True for ``"earliest"``, False for ``"latest"``; refuses anything else."""
    if type(prefer) is str:
        if prefer == "latest":
            return False
        if prefer == "earliest":
            return True
    raise ValueError(f"prefer must be 'latest' or 'earliest', got {prefer!r}")


def check_batch_counts(counts: object, n: int, defaults: list[int] | None, name: str = "max_k") -> np.ndarray:
    """Per-index counts as a fresh int64 array of ``n`` entries: one count for every
    index, a sequence or array of ``n`` counts, or (when ``defaults`` is given) None for
    ``defaults``."""
    if counts is None:
        if defaults is None:
            raise TypeError(f"{name} must be a non-negative integer or one count per request, got None")
        return np.asarray(defaults, dtype=np.int64).reshape(n)
    if isinstance(counts, (np.ndarray, list, tuple)):
        # copied first, validated after: the copy is what the kernel reads
        ks = np.array(as_ids(counts, name), dtype=np.int64, copy=True)
        if ks.shape[0] != n:
            raise ValueError(f"{name} holds {ks.shape[0]} counts for {n} requests")
        if ks.shape[0] and ks.min() < 0:
            i = int(np.flatnonzero(ks < 0)[0])
            raise ValueError(f"{name} must be non-negative, got {name}[{i}]={int(ks[i])}")
        return ks
    k = check_count(counts, name)
    return np.full(n, min(k, INT64_MAX), dtype=np.int64)


def check_draft_limits(draft_len: object, min_draft: object, max_draft: object) -> tuple[int, int, int]:
    """``(draft_len, min_draft, max_draft)`` as counts with
    ``min_draft <= draft_len <= max_draft``."""
    k = check_count(draft_len, "draft_len")
    lo = check_count(min_draft, "min_draft")
    hi = check_count(max_draft, "max_draft")
    if lo > hi:
        raise ValueError(f"min_draft must not exceed max_draft, got {lo} > {hi}")
    if not lo <= k <= hi:
        raise ValueError(f"draft_len must lie in [min_draft, max_draft] = [{lo}, {hi}], got {k}")
    return k, lo, hi


def check_record(proposed: object, accepted: object) -> tuple[int, int]:
    """``(proposed, accepted)`` as counts with ``accepted <= proposed``."""
    p = check_count(proposed, "proposed")
    a = check_count(accepted, "accepted")
    if a > p:
        raise ValueError(f"accepted={a} is beyond the {p} drafted tokens")
    return p, a


def own_offsets(offsets: object) -> np.ndarray:
    """``offsets`` converted and copied into a fresh int64 array, before any check: a
    caller's array changed later (another thread) cannot change what was validated."""
    off = np.array(as_ids(offsets, "offsets"), dtype=np.int64, copy=True)
    if off.shape[0] < 1:
        raise ValueError("offsets must hold at least one entry (B + 1 boundaries for B requests)")
    return off


def validate_offsets(off: np.ndarray, n_tokens: int) -> None:
    """Checks an owned offsets copy: first entry >= 0, last <= n_tokens, and each entry
    <= the next (compared, never subtracted: int64 differences wrap around)."""
    if off[0] < 0:
        raise ValueError(f"offsets must be non-negative, got offsets[0]={int(off[0])}")
    if off[-1] > n_tokens:
        raise ValueError(f"offsets[-1]={int(off[-1])} is beyond the {n_tokens} tokens given")
    if off.shape[0] > 1:
        down = off[:-1] > off[1:]
        if down.any():
            i = int(np.flatnonzero(down)[0])
            raise ValueError(
                f"offsets must be nondecreasing, got offsets[{i}]={int(off[i])} > "
                f"offsets[{i + 1}]={int(off[i + 1])}"
            )


def check_suffix_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``(min_n, max_n)`` as ints, ``max_n=None`` meaning no cap (``UNBOUNDED``).
    Refuses ``min_n < 1`` and ``min_n > max_n``."""
    lo = check_count(min_n, "min_n")
    if lo < 1:
        raise ValueError(f"min_n must be at least 1, got {lo}")
    if max_n is None:
        return min(lo, UNBOUNDED), UNBOUNDED
    hi = check_count(max_n, "max_n")
    if hi < lo:
        raise ValueError(f"min_n must not exceed max_n, got min_n={lo} > max_n={hi}")
    return min(lo, UNBOUNDED), min(hi, UNBOUNDED)


def check_anchor(anchor_n: object, anchor_span: object, anchor_misses: object) -> tuple[int, int, int]:
    """``(anchor_n, anchor_span, anchor_misses)`` as counts (``anchor_n=0`` switches the
    anchor off), capped at ``MAX_SUFFIX_TOKENS``."""
    an = check_count(anchor_n, "anchor_n")
    span = check_count(anchor_span, "anchor_span")
    miss = check_count(anchor_misses, "anchor_misses")
    return min(an, MAX_SUFFIX_TOKENS), min(span, MAX_SUFFIX_TOKENS), min(miss, MAX_SUFFIX_TOKENS)


def check_suffix_stats(stats: object) -> tuple[int, int, int, int]:
    """Pickled statistics ``(steps, drafted, accepted, full_accepts)``, checked to be
    counts that some sequence of ``record`` calls could have produced."""
    if not isinstance(stats, tuple) or len(stats) != 4:
        raise ValueError(f"stats must be a tuple of 4 counts, got {stats!r}")
    steps, drafted, accepted, full = (
        check_count(v, name) for v, name in zip(stats, ("steps", "drafted", "accepted", "full_accepts"))
    )
    if accepted > drafted:
        raise ValueError(f"stats: accepted={accepted} is beyond drafted={drafted}")
    if full > steps:
        raise ValueError(f"stats: full_accepts={full} is beyond steps={steps}")
    limit = 2**62
    if steps > limit or drafted > limit:
        raise ValueError("stats: counts beyond 2**62")
    return steps, drafted, accepted, full
