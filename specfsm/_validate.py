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


# --- n-gram index and batch checks ---
# Shared by specfsm._core.ngram_index / specfsm._core.batch and their twins
# specfsm._py.ngram_index / specfsm._py.batch (same messages in both).

from collections.abc import Sequence as _Sequence  # noqa: E402

from .errors import IllegalTransition as _IllegalTransition  # noqa: E402

#: the index stores positions as 32-bit ints: at most this many tokens per index
MAX_INDEX_TOKENS = 2**31 - 2
#: an index keeps one hash table per n-gram length: at most this many lengths
MAX_LEVELS = 4096
#: adaptive draft length: added after a fully accepted draft, taken after a rejection
GROW_STEP = 2
SHRINK_STEP = 1


def _check_ngram_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``(min_n, max_n)`` as ints; ``max_n=None`` means ``min_n``. Refuses ``min_n < 1``
    and ``min_n > max_n``."""
    lo = check_count(min_n, "min_n")
    if lo < 1:
        raise ValueError(f"min_n must be at least 1, got {lo}")
    if max_n is None:
        return lo, lo
    hi = check_count(max_n, "max_n")
    if hi < lo:
        raise ValueError(f"min_n must not exceed max_n, got min_n={lo} > max_n={hi}")
    return lo, hi


def _check_index_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``_check_ngram_range`` for an index, which keeps one table per n: also refuses
    ``max_n`` beyond ``MAX_INDEX_TOKENS`` and more than ``MAX_LEVELS`` values of n."""
    lo, hi = _check_ngram_range(min_n, max_n)
    if hi > MAX_INDEX_TOKENS:
        raise ValueError(f"max_n must be at most {MAX_INDEX_TOKENS} for an NgramIndex, got {hi}")
    if hi - lo + 1 > MAX_LEVELS:
        raise ValueError(
            f"an NgramIndex keeps at most {MAX_LEVELS} n-gram lengths, got "
            f"min_n={lo}, max_n={hi}"
        )
    return lo, hi


def _check_prefer(prefer: object) -> int:
    """0 for ``"latest"``, 1 for ``"earliest"``; refuses anything else."""
    if type(prefer) is str:
        if prefer == "latest":
            return 0
        if prefer == "earliest":
            return 1
    raise ValueError(f"prefer must be 'latest' or 'earliest', got {prefer!r}")


def _overflow(name: str, value: object) -> OverflowError:
    return OverflowError(f"{name} holds ids beyond int64 (got {value!r})")


def _as_ids(tokens: object, name: str) -> np.ndarray:
    """Token ids as a 1-D C-contiguous int32 or int64 ndarray.

    Accepts a 1-D integer ndarray or a list/tuple (or other sequence) of Python or numpy
    integers. Refuses 2-D input, non-integer entries (floats, bools, strings) and ids
    beyond int64.
    """
    if isinstance(tokens, np.ndarray):
        return as_token_array(tokens, name)
    if isinstance(tokens, (str, bytes, bytearray)) or not isinstance(tokens, _Sequence):
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
                raise TypeError(
                    f"{name} must hold integer ids, got {type(x).__name__} {x!r}"
                )
            if not INT64_MIN <= int(x) <= INT64_MAX:
                raise _overflow(name, int(x))
        raise TypeError(f"{name} must hold integer ids")  # pragma: no cover - unreachable
    if arr.dtype.kind == "b":
        raise TypeError(f"{name} must hold integer ids, got bools")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer ids, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got a {arr.ndim}-D array of shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > INT64_MAX:
        raise _overflow(name, int(arr.max()))
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_offsets(offsets: object, n_tokens: int) -> np.ndarray:
    """Request boundaries as a fresh int64 array (owned by the call) of B + 1
    nondecreasing entries within ``[0, n_tokens]``."""
    off = _own_offsets(offsets)
    _validate_offsets(off, n_tokens)
    return off


def _own_offsets(offsets: object) -> np.ndarray:
    """``offsets`` converted and copied into a fresh int64 array, before any check: a
    caller's array changed later (another thread) cannot change what was validated."""
    off = np.array(_as_ids(offsets, "offsets"), dtype=np.int64, copy=True)
    if off.shape[0] < 1:
        raise ValueError("offsets must hold at least one entry (B + 1 boundaries for B requests)")
    return off


def _validate_offsets(off: np.ndarray, n_tokens: int) -> None:
    """Checks an owned offsets copy: first entry >= 0, last <= n_tokens, and each entry
    <= the next (compared, never subtracted: int64 differences wrap around)."""
    if off[0] < 0:
        raise ValueError(f"offsets must be non-negative, got offsets[0]={int(off[0])}")
    if off[-1] > n_tokens:
        raise ValueError(
            f"offsets[-1]={int(off[-1])} is beyond the {n_tokens} tokens given"
        )
    if off.shape[0] > 1:
        down = off[:-1] > off[1:]
        if down.any():
            i = int(np.flatnonzero(down)[0])
            raise ValueError(
                f"offsets must be nondecreasing, got offsets[{i}]={int(off[i])} > "
                f"offsets[{i + 1}]={int(off[i + 1])}"
            )


def _check_batch_k(max_k: object, n: int, defaults: list[int] | None, name: str = "max_k") -> np.ndarray:
    """Per-request draft limits as an int64 array of ``n`` entries.

    ``max_k`` is one count for every request, a sequence or array of ``n`` counts, or
    (batches of indexes only) None for each index's own ``draft_len``.
    """
    if max_k is None:
        if defaults is None:
            raise TypeError(f"{name} must be a non-negative integer or one count per request, got None")
        return np.asarray(defaults, dtype=np.int64).reshape(n)
    if isinstance(max_k, (np.ndarray, list, tuple)):
        # copied first, validated after: the copy is what the kernel reads
        ks = np.array(_as_ids(max_k, name), dtype=np.int64, copy=True)
        if ks.shape[0] != n:
            raise ValueError(f"{name} holds {ks.shape[0]} counts for {n} requests")
        if ks.shape[0] and ks.min() < 0:
            i = int(np.flatnonzero(ks < 0)[0])
            raise ValueError(f"{name} must be non-negative, got {name}[{i}]={int(ks[i])}")
        return ks
    k = check_count(max_k, name)
    return np.full(n, min(k, INT64_MAX), dtype=np.int64)


def _check_draft_limits(draft_len: object, min_draft: object, max_draft: object) -> tuple[int, int, int]:
    k = check_count(draft_len, "draft_len")
    lo = check_count(min_draft, "min_draft")
    hi = check_count(max_draft, "max_draft")
    if lo > hi:
        raise ValueError(f"min_draft must not exceed max_draft, got {lo} > {hi}")
    if not lo <= k <= hi:
        raise ValueError(f"draft_len must lie in [min_draft, max_draft] = [{lo}, {hi}], got {k}")
    return k, lo, hi


def _check_record(proposed: object, accepted: object) -> tuple[int, int]:
    p = check_count(proposed, "proposed")
    a = check_count(accepted, "accepted")
    if a > p:
        raise ValueError(f"accepted={a} is beyond the {p} drafted tokens")
    return p, a


def _check_total(drafted: int, proposed: int) -> None:
    """Refuses a record that would take the drafted-token count beyond int64."""
    if proposed > INT64_MAX - drafted:
        raise OverflowError(
            f"proposed={proposed} would take the drafted-token count beyond int64 "
            f"(already {drafted})"
        )


_STAT_NAMES = ("steps", "drafted", "accepted", "full_accepts")


def _check_stats(stats: object) -> tuple[int, int, int, int]:
    """Unpickled statistics ``(steps, drafted, accepted, full_accepts)``, refused unless
    they are counts that ``record`` could have produced."""
    if not isinstance(stats, tuple):
        raise TypeError(f"stats must be a tuple of 4 counts, got {type(stats).__name__}")
    if len(stats) != 4:
        raise ValueError(f"stats must hold 4 counts {_STAT_NAMES}, got {len(stats)}")
    vals = []
    for name, v in zip(_STAT_NAMES, stats):
        c = check_count(v, f"stats {name}")
        if c > INT64_MAX:
            raise OverflowError(f"stats {name}={c} is beyond int64")
        vals.append(c)
    steps, drafted, accepted, full = vals
    if accepted > drafted:
        raise ValueError(f"stats accepted={accepted} is beyond drafted={drafted}")
    if full > steps or full > accepted:
        raise ValueError(
            f"stats full_accepts={full} is beyond steps={steps} or accepted={accepted}"
        )
    if steps == 0 and drafted:
        raise ValueError(f"stats drafted={drafted} with no recorded step")
    return steps, drafted, accepted, full


#: what a call meeting an index in use by another call says (both implementations)
BUSY_WRITING = "NgramIndex is being extended (by another thread, or by a callback inside extend)"
BUSY_READING = "NgramIndex is being read by a batch proposal in another thread"




# the batch (specfsm._core.batch, specfsm._py.batch): state codes and argument checks
FREE, PREFILL, DECODE, VERIFY, ACCEPT, ROLLBACK, DONE = range(7)
STATE_NAMES = ("free", "prefill", "decode", "verify", "accept", "rollback", "done")
#: at most this many slots per batch and tokens per draft (keeps every index in int32 range)
MAX_SLOTS = 2**24
MAX_DRAFT = 4096

def _ids(x: object, name: str) -> np.ndarray:
    """A 1-D int64 array the call owns (always a fresh copy). Refuses bools, floats,
    strings, 2-D input and ids beyond int64."""
    if isinstance(x, (bool, np.bool_, str, bytes)):
        raise TypeError(f"{name} must be a 1-D sequence of integers, got {type(x).__name__} {x!r}")
    if isinstance(x, np.ndarray):
        arr = as_token_array(x, name)
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a flat sequence of integers ({exc})") from None
        if arr.ndim == 0:
            raise TypeError(f"{name} must be a 1-D sequence of integers, got {type(x).__name__} {x!r}")
        if arr.size == 0:
            arr = np.zeros(0, dtype=np.int64)
        if arr.dtype == object:
            for v in arr.reshape(-1).tolist():
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                    raise TypeError(f"{name} must hold integers, got {type(v).__name__} {v!r}")
            raise OverflowError(f"{name} holds integers beyond int64")
        if arr.dtype.kind == "b" or arr.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
        arr = as_token_array(arr, name)
    return np.array(arr, dtype=np.int64, copy=True)


def _slots(slots: object, capacity: int) -> np.ndarray:
    """Distinct slot numbers in ``[0, capacity)`` as a fresh int64 array."""
    if isinstance(slots, (int, np.integer)) and not isinstance(slots, (bool, np.bool_)):
        slots = [slots]
    s = _ids(slots, "slots")
    if s.shape[0]:
        lo, hi = int(s.min()), int(s.max())
        if lo < 0 or hi >= capacity:
            bad = lo if lo < 0 else hi
            raise IndexError(f"slots holds {bad}, outside the batch's {capacity} slots")
        if np.unique(s).shape[0] != s.shape[0]:
            u, c = np.unique(s, return_counts=True)
            raise ValueError(f"slots must be distinct, got slot {int(u[c > 1][0])} twice")
    return s


def _per_slot(x: object, n: int, name: str) -> np.ndarray:
    """One integer per slot (a scalar applies to every slot) as a fresh int64 array."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        v = int(x)
        if not -(2**63) <= v <= INT64_MAX:
            raise OverflowError(f"{name}={v} is beyond int64")
        return np.full(n, v, dtype=np.int64)
    a = _ids(x, name)
    if a.shape[0] != n:
        raise ValueError(f"{name} holds {a.shape[0]} entries for {n} slots")
    return a


def _ragged(tokens: object, offsets: object, n: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, offsets)`` as fresh int64 arrays: ``n + 1`` nondecreasing offsets from 0
    to ``len(tokens)`` (checked neighbour by neighbour)."""
    t = _ids(tokens, name)
    off = _ids(offsets, f"{name}_offsets" if name != "tokens" else "offsets")
    oname = "offsets" if name == "tokens" else f"{name}_offsets"
    if off.shape[0] != n + 1:
        raise ValueError(f"{oname} holds {off.shape[0]} entries; {n} slots need {n + 1}")
    if off[0] != 0:
        raise ValueError(f"{oname}[0] must be 0, got {int(off[0])}")
    if off[-1] != t.shape[0]:
        raise ValueError(f"{oname}[-1]={int(off[-1])} must equal len({name})={t.shape[0]}")
    if n and not (off[:-1] <= off[1:]).all():
        i = int(np.flatnonzero(off[:-1] > off[1:])[0])
        raise ValueError(
            f"{oname} must be nondecreasing, got {oname}[{i}]={int(off[i])} > "
            f"{oname}[{i + 1}]={int(off[i + 1])}"
        )
    return t, off


def _capacity(capacity: object, k_max: object) -> tuple[int, int]:
    c = check_count(capacity, "capacity")
    k = check_count(k_max, "k_max")
    if not 1 <= c <= MAX_SLOTS:
        raise ValueError(f"capacity must lie in [1, {MAX_SLOTS}], got {c}")
    if not 1 <= k <= MAX_DRAFT:
        raise ValueError(f"k_max must lie in [1, {MAX_DRAFT}], got {k}")
    return c, k


def _indexes(indexes: object, n: int) -> list:
    """One NgramIndex (of this implementation) or None per admitted slot."""
    if indexes is None:
        return [None] * n
    try:
        out = list(indexes)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"indexes must be a sequence of NgramIndex or None, got {type(indexes).__name__}") from None
    if len(out) != n:
        raise ValueError(f"indexes holds {len(out)} entries for {n} slots")
    return out


def _check_index_types(ixs: list, cls: type | tuple[type, ...]) -> None:
    """Each entry None or an instance of ``cls`` (the batch's index classes)."""
    for j, ix in enumerate(ixs):
        if ix is not None and not isinstance(ix, cls):
            raise TypeError(
                f"indexes[{j}] must be an NgramIndex or SuffixIndex of the same implementation, "
                "or None, "
                f"got {type(ix).__module__}.{type(ix).__name__}"
            )


#: rule kinds the step knows: greedy exact, min-run, speculative sampling, typical, any other
R_EXACT, R_MINRUN, R_SPEC, R_TYPICAL, R_OTHER = range(5)


def _rule_kind(rule: object) -> tuple[int, int]:
    """``(kind, m)`` for a rule; refuses objects that are not rules."""
    if rule is None:
        return R_EXACT, 0
    name = type(rule).__name__
    mod = type(rule).__module__
    if mod == "specfsm.accept_rule":
        if name == "Exact":
            return R_EXACT, 0
        if name == "MinRun":
            return R_MINRUN, int(rule.m)  # type: ignore[attr-defined]
        if name == "SpeculativeSampling":
            return R_SPEC, 0
        if name == "TypicalAcceptance":
            return R_TYPICAL, 0
    if callable(getattr(rule, "accepted_rows", None)):
        return R_OTHER, 0
    raise TypeError(f"rule must be None or an acceptance rule (with accepted_rows), got {name}")


def _probs_rows(probs: object, n_rows: int) -> np.ndarray:
    if probs is None:
        raise TypeError("this rule needs probs: one probability row per evaluated row (N x V)")
    if not isinstance(probs, np.ndarray):
        probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] != n_rows:
        raise ValueError(f"probs must be {n_rows} x V (one row per evaluated row), got shape {probs.shape}")
    return probs


def _illegal(attempted: str, slots: list[int], states: list[int], reasons: list[str] | None = None):
    """``IllegalTransition(attempted)`` naming the slots and the state each was in."""
    names = [STATE_NAMES[s] for s in states]
    rs = list(reasons) if reasons else [None] * len(slots)
    shown = "; ".join(
        f"slot {s} ({n}): {r}" if r else f"slot {s} is in {n}" for s, n, r in zip(slots[:8], names[:8], rs[:8])
    )
    more = f"; and {len(slots) - 8} more slots" if len(slots) > 8 else ""
    reason = shown + more
    err = _IllegalTransition(attempted, reason)
    err.slots = list(slots)
    err.states = names
    return err
