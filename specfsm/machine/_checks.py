"""Argument checks of the state machine and the batch machine.

Settling a verify (``Verify.accept``/``accept_rows``, the settle kernels and the batch's
settle), the batch's slots, per-slot values, capacity and ragged per-slot arrays, its
state codes and names, the ``IllegalTransition`` it raises, and a step's resume index.
Shared by ``specfsm.machine.state``, the compiled ``specfsm._core.batch``/``settle`` and their
twins ``specfsm.machine._batch_py``/``settle``, so both raise the same errors.
"""

from __future__ import annotations

import numpy as np

from .._checks import INT64_MAX, INT64_MIN, check_count, int64_ids, ragged
from ..errors import IllegalTransition, NegativeToken

__all__ = [
    "FREE", "PREFILL", "DECODE", "VERIFY", "ACCEPT", "ROLLBACK", "DONE", "STATE_NAMES",
    "MAX_SLOTS",
    "negative_row",
    "MAX_DRAFT",
    "settle_reason",
    "check_slots",
    "per_slot",
    "slot_ragged",
    "check_capacity",
    "slot_indexes",
    "check_index_types",
    "check_index_owners",
    "resume_index",
    "illegal",
]

#: the batch's state codes (``specfsm._core.batch``, ``specfsm.machine._batch_py``)
FREE, PREFILL, DECODE, VERIFY, ACCEPT, ROLLBACK, DONE = range(7)
STATE_NAMES = ("free", "prefill", "decode", "verify", "accept", "rollback", "done")
#: at most this many slots per batch and tokens per draft (keeps every index in int32 range)
MAX_SLOTS = 2**24
MAX_DRAFT = 4096


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


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


#: up to this many slots, ``check_slots`` checks in Python (cheaper than numpy calls)
_SMALL = 64


def check_slots(slots: object, capacity: int) -> np.ndarray:
    """Distinct slot numbers in ``[0, capacity)`` (one int or a token-id-rule sequence)
    as a fresh int64 array."""
    if _is_int(slots):
        slots = [slots]
    if type(slots) is list and len(slots) <= _SMALL and all(type(v) is int for v in slots):
        # the usual call (a few plain ints): checked in Python, several times cheaper than
        # numpy's reductions and unique on a tiny array; anything it does not pass takes
        # the general path below, which raises the messages
        if len(set(slots)) == len(slots) and (not slots or (min(slots) >= 0 and max(slots) < capacity)):
            return np.array(slots, dtype=np.int64)
    s = int64_ids(slots, "slots")
    if 0 < s.shape[0] <= _SMALL:
        small = s.tolist()
        if len(set(small)) == len(small) and min(small) >= 0 and max(small) < capacity:
            return s
    if s.shape[0]:
        lo, hi = int(s.min()), int(s.max())
        if lo < 0 or hi >= capacity:
            bad = lo if lo < 0 else hi
            raise IndexError(f"slots holds {bad}, outside the batch's {capacity} slots")
        if np.unique(s).shape[0] != s.shape[0]:
            u, c = np.unique(s, return_counts=True)
            raise ValueError(f"slots must be distinct, got slot {int(u[c > 1][0])} twice")
    return s


def per_slot(x: object, n: int, name: str) -> np.ndarray:
    """One integer per slot (a scalar applies to every slot) as a fresh int64 array."""
    if _is_int(x):
        v = int(x)  # type: ignore[call-overload]
        if not INT64_MIN <= v <= INT64_MAX:
            raise OverflowError(f"{name}={v} is beyond int64")
        return np.full(n, v, dtype=np.int64)
    a = int64_ids(x, name)
    if a.shape[0] != n:
        raise ValueError(f"{name} holds {a.shape[0]} entries for {n} slots")
    return a


#: the batch's ragged arguments and the parameter holding each one's offsets
_OFFSETS_OF = {"tokens": "offsets", "positions": "offsets", "row_tokens": "row_offsets",
               "row_caches": "cache_offsets"}


def slot_ragged(tokens: object, offsets: object, n: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, offsets)`` for ``n`` slots as fresh int64 arrays, under the one
    contract (``specfsm._checks.ragged``); ``name`` is the batch method's parameter
    (``tokens``, ``positions``, ``row_tokens`` or ``row_caches``), and its offsets are
    named as the method's parameter for them is."""
    return ragged(tokens, offsets, n, name, _OFFSETS_OF.get(name), rows="slots")


def check_capacity(capacity: object, k_max: object) -> tuple[int, int]:
    """``(capacity, k_max)`` of a batch, within ``[1, MAX_SLOTS]`` and ``[1, MAX_DRAFT]``."""
    c = check_count(capacity, "capacity")
    k = check_count(k_max, "k_max")
    if not 1 <= c <= MAX_SLOTS:
        raise ValueError(f"capacity must lie in [1, {MAX_SLOTS}], got {c}")
    if not 1 <= k <= MAX_DRAFT:
        raise ValueError(f"k_max must lie in [1, {MAX_DRAFT}], got {k}")
    return c, k


def slot_indexes(indexes: object, n: int) -> list:
    """One index (NgramIndex or SuffixIndex) or None per admitted slot, as a list."""
    if indexes is None:
        return [None] * n
    try:
        out = list(indexes)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"indexes must be a sequence of NgramIndex or None, got {type(indexes).__name__}") from None
    if len(out) != n:
        raise ValueError(f"indexes holds {len(out)} entries for {n} slots")
    return out


def check_index_types(ixs: list, cls: type | tuple[type, ...]) -> None:
    """Each entry None or an instance of ``cls`` (the batch's index classes)."""
    for j, ix in enumerate(ixs):
        if ix is not None and not isinstance(ix, cls):
            raise TypeError(
                f"indexes[{j}] must be an NgramIndex or SuffixIndex of the same implementation, "
                "or None, "
                f"got {type(ix).__module__}.{type(ix).__name__}"
            )


def check_index_owners(ixs: list, held: dict[int, int]) -> None:
    """``admit``'s rule that one index drafts for one slot: ValueError for an index
    listed twice in ``ixs`` or held by a live slot (``held``: ``id(index)`` -> slot, for
    every slot in Prefill, Decode or Verify), naming both places."""
    first: dict[int, int] = {}
    for j, ix in enumerate(ixs):
        if ix is None:
            continue
        if id(ix) in first:
            raise ValueError(f"indexes[{j}] is indexes[{first[id(ix)]}]: one index drafts for one slot")
        first[id(ix)] = j
        if id(ix) in held:
            raise ValueError(
                f"indexes[{j}] is held by live slot {held[id(ix)]}: one index drafts for one "
                "slot (release or finish that slot first, or give this one its own index)"
            )


def resume_index(slots: np.ndarray, rows: np.ndarray, capacity: object) -> np.ndarray:
    """``StepResult.resume_index``: ``rows`` (one per entry of ``slots``) scattered into
    ``capacity`` entries, -1 for a slot the step did not evaluate. Refuses a capacity
    that does not cover every slot of the step, and one beyond a batch's largest
    (``MAX_SLOTS``), before allocating."""
    c = check_count(capacity, "capacity")
    if c > MAX_SLOTS:
        raise ValueError(f"capacity must lie in [1, {MAX_SLOTS}] (a batch's largest), got {c}")
    if slots.shape[0] and int(slots.min()) < 0:
        raise ValueError(f"slots holds {int(slots.min())}: a step's slots are non-negative")
    if slots.shape[0] and int(slots.max()) >= c:
        raise ValueError(
            f"capacity={c} does not cover slot {int(slots.max())} of this step: "
            "resume_index needs the batch's capacity"
        )
    out = np.full(c, -1, dtype=np.int64)
    out[slots] = rows
    return out


def negative_row(rows: np.ndarray, flat: int, slots: np.ndarray, offsets: np.ndarray) -> NegativeToken:
    """``step``'s refusal of ``rows[flat]``, a negative token in a row whose token it
    would emit (token ids are >= 0), naming the row and its slot. Rows whose token the
    step does not emit (past a mismatch, off a tree's path, cut by a budget or eos) may
    hold anything: -1 as filler, say."""
    j = int(np.searchsorted(offsets, flat, side="right")) - 1
    return NegativeToken(
        f"row_tokens[{flat}] is {int(rows[flat])}: step would emit it (row "
        f"{flat - int(offsets[j])} of slot {int(slots[j])}), and token ids are >= 0",
        flat,
    )


def illegal(attempted: str, slots: list[int], states: list[int],
            reasons: list[str] | None = None) -> IllegalTransition:
    """``IllegalTransition(attempted)`` naming the slots and the state each was in."""
    names = [STATE_NAMES[s] for s in states]
    rs = list(reasons) if reasons else [None] * len(slots)
    shown = "; ".join(
        f"slot {s} ({n}): {r}" if r else f"slot {s} is in {n}" for s, n, r in zip(slots[:8], names[:8], rs[:8])
    )
    more = f"; and {len(slots) - 8} more slots" if len(slots) > 8 else ""
    err = IllegalTransition(attempted, shown + more)
    err.slots = list(slots)
    err.states = names
    return err
