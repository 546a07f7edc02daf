"""Argument checks of drafting: the n-gram and suffix indexes and their batch calls, and
the suffix trie (its settings, sequence keys, room, speculation and batches).

Match-length ranges, the suffix index's anchor, draft-length limits, ``record``'s counts,
pickled statistics (one checker, one rule, for both index kinds), ``prefer``, per-index
counts of a batch call, and the tokens and offsets of ``extend_batch`` and
``longest_match_batch`` (through the one (tokens, offsets) contract in
``specfsm._checks``). Shared by the compiled ``specfsm._core.ngram_index``/
``suffix_index``/``suffix_trie`` and their twins, so both raise the same errors.
"""

from __future__ import annotations

import operator
from typing import Literal, overload

import numpy as np

from .._checks import INT64_MAX, as_real, check_count, check_offsets, int64_ids, nonnegative_real, ragged

__all__ = [
    "MAX_INDEX_TOKENS",
    "MAX_LEVELS",
    "MAX_SUFFIX_TOKENS",
    "UNBOUNDED",
    "GROW_STEP",
    "SHRINK_STEP",
    "STAT_NAMES",
    "ngram_range",
    "index_range",
    "suffix_range",
    "check_anchor",
    "check_prefer",
    "check_batch_counts",
    "check_batch_limits",
    "check_draft_limits",
    "check_record",
    "check_total",
    "check_stats",
    "batch_offsets",
    "index_offsets",
    "batch_tokens",
    "checked_offsets",
    "MAX_TRIE_DEPTH",
    "MAX_TRIE_NODES",
    "TRIE_NODE_BYTES",
    "check_trie_args",
    "check_trie_depth",
    "check_min_prob",
    "check_trie_seq",
    "check_trie_room",
    "check_trie_speculate",
    "check_trie_draft",
    "check_trie_list",
    "check_trie_rows",
]

#: the n-gram index stores positions as 32-bit ints: at most this many tokens per index
MAX_INDEX_TOKENS = 2**31 - 2
#: an n-gram index keeps one hash table per n-gram length: at most this many lengths
MAX_LEVELS = 4096
#: positions and states are 32-bit: a suffix index holds at most this many tokens
MAX_SUFFIX_TOKENS = 2**30 - 1
#: ``max_n=None`` (no cap on the match length) is stored as this
UNBOUNDED = MAX_SUFFIX_TOKENS + 1
#: adaptive draft length: added after a fully accepted draft, taken after a rejection
GROW_STEP = 2
SHRINK_STEP = 1
#: the pickled statistics, in order
STAT_NAMES = ("steps", "drafted", "accepted", "full_accepts")
#: the suffix trie: its deepest setting, its most nodes (32-bit node numbers), and the
#: bytes of one node's storage (``nbytes``: token 8, count 8, parent 4, best child 4, and
#: two 4-byte hash slots)
MAX_TRIE_DEPTH = 64
MAX_TRIE_NODES = 2**31 - 2
TRIE_NODE_BYTES = 32


# --- ranges and limits ----------------------------------------------------------------
def ngram_range(min_n: object, max_n: object) -> tuple[int, int]:
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


def index_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``ngram_range`` for an n-gram index, which keeps one table per n: also refuses
    ``max_n`` beyond ``MAX_INDEX_TOKENS`` and more than ``MAX_LEVELS`` values of n."""
    lo, hi = ngram_range(min_n, max_n)
    if hi > MAX_INDEX_TOKENS:
        raise ValueError(f"max_n must be at most {MAX_INDEX_TOKENS} for an NgramIndex, got {hi}")
    if hi - lo + 1 > MAX_LEVELS:
        raise ValueError(
            f"an NgramIndex keeps at most {MAX_LEVELS} n-gram lengths, got "
            f"min_n={lo}, max_n={hi}"
        )
    return lo, hi


def suffix_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``(min_n, max_n)`` of a suffix index as ints, ``max_n=None`` meaning no cap
    (``UNBOUNDED``). Refuses ``min_n < 1`` and ``min_n > max_n``."""
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


def check_prefer(prefer: object) -> bool:
    """True for ``"earliest"``, False for ``"latest"``; refuses anything else."""
    if type(prefer) is str:
        if prefer == "latest":
            return False
        if prefer == "earliest":
            return True
    raise ValueError(f"prefer must be 'latest' or 'earliest', got {prefer!r}")


def check_draft_limits(draft_len: object, min_draft: object, max_draft: object,
                       cap: int) -> tuple[int, int, int]:
    """``(draft_len, min_draft, max_draft)`` as counts with
    ``min_draft <= draft_len <= max_draft``, each then capped at ``cap`` (the index's
    capacity: no draft is longer, and the capped lengths fit the compiled index's int64
    fields)."""
    k = check_count(draft_len, "draft_len")
    lo = check_count(min_draft, "min_draft")
    hi = check_count(max_draft, "max_draft")
    if lo > hi:
        raise ValueError(f"min_draft must not exceed max_draft, got {lo} > {hi}")
    if not lo <= k <= hi:
        raise ValueError(f"draft_len must lie in [min_draft, max_draft] = [{lo}, {hi}], got {k}")
    return min(k, cap), min(lo, cap), min(hi, cap)


# --- record and statistics ------------------------------------------------------------
def check_record(proposed: object, accepted: object) -> tuple[int, int]:
    """``(proposed, accepted)`` as counts with ``accepted <= proposed``."""
    p = check_count(proposed, "proposed")
    a = check_count(accepted, "accepted")
    if a > p:
        raise ValueError(f"accepted={a} is beyond the {p} drafted tokens")
    return p, a


def check_total(drafted: int, proposed: int, steps: int | None = None) -> None:
    """Refuses a record that would take the drafted-token count beyond int64, or (with
    ``steps``, the step count the record adds one to) the step count."""
    if proposed > INT64_MAX - drafted:
        raise OverflowError(
            f"proposed={proposed} would take the drafted-token count beyond int64 "
            f"(already {drafted})"
        )
    if steps is not None and steps >= INT64_MAX:
        raise OverflowError(f"another record would take the step count beyond int64 (already {steps})")


def check_stats(stats: object) -> tuple[int, int, int, int]:
    """Unpickled statistics ``(steps, drafted, accepted, full_accepts)`` of either index
    kind, refused unless they are counts that some sequence of ``record`` calls could
    have produced (each count within int64, as ``record`` keeps them), so every state
    ``record`` reaches pickles and loads back."""
    if not isinstance(stats, tuple):
        raise TypeError(f"stats must be a tuple of 4 counts, got {type(stats).__name__}")
    if len(stats) != 4:
        raise ValueError(f"stats must hold 4 counts {STAT_NAMES}, got {len(stats)}")
    vals = []
    for name, v in zip(STAT_NAMES, stats):
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


# --- batch calls ----------------------------------------------------------------------
def check_batch_counts(counts: object, n: int, name: str) -> np.ndarray:
    """Per-index counts (``proposed``, ``accepted``, ``drafted``) as a fresh int64 array
    of ``n`` entries: one count for every index, or a list, tuple or array of ``n``
    counts. A count beyond int64 is refused (OverflowError) in either form, as ``record``
    refuses it."""
    return _batch_ints(counts, n, name, False)


@overload
def check_batch_limits(max_k: object, n: int, optional: Literal[False]) -> np.ndarray: ...
@overload
def check_batch_limits(max_k: object, n: int, optional: bool = True) -> np.ndarray | None: ...
def check_batch_limits(max_k: object, n: int, optional: bool = True) -> np.ndarray | None:
    """Per-index draft limits as a fresh int64 array of ``n`` entries: one count for
    every index (beyond int64: no limit, held as int64's maximum), or a list, tuple or
    array of ``n`` int64 counts; None for None (each index's own default) when
    ``optional``, else a TypeError."""
    if max_k is None and optional:
        return None
    return _batch_ints(max_k, n, "max_k", True)


def _batch_ints(counts: object, n: int, name: str, clip: bool) -> np.ndarray:
    if counts is None:
        raise TypeError(f"{name} must be a non-negative integer or one count per request, got None")
    if isinstance(counts, (np.ndarray, list, tuple)):
        # copied first, validated after: the copy is what the kernel reads
        ks = int64_ids(counts, name)
        if ks.shape[0] != n:
            raise ValueError(f"{name} holds {ks.shape[0]} counts for {n} requests")
        if ks.shape[0] and ks.min() < 0:
            i = int(np.flatnonzero(ks < 0)[0])
            raise ValueError(f"{name} must be non-negative, got {name}[{i}]={int(ks[i])}")
        return ks
    k = check_count(counts, name)
    if k > INT64_MAX:
        if not clip:
            raise OverflowError(f"{name}={k} is beyond int64")
        k = INT64_MAX
    return np.full(n, k, dtype=np.int64)


def batch_offsets(offsets: object) -> np.ndarray:
    """``offsets`` of a batch call converted and copied into a fresh int64 array, before
    any check (a caller's array changed later cannot change what is validated); at
    least one entry. ``index_offsets`` checks the copy."""
    off = int64_ids(offsets, "offsets")
    if off.shape[0] < 1:
        raise ValueError("offsets must hold one entry per row plus one, starting at 0; got none")
    return off


def index_offsets(off: np.ndarray, n_tokens: int, b: int | None = None) -> None:
    """An owned offsets copy held to the (tokens, offsets) contract for ``n_tokens``
    tokens (and ``b`` indexes when given)."""
    check_offsets(off, n_tokens, b, "offsets", "tokens", "indexes")


def batch_tokens(tokens: object, offsets: object, b: int) -> tuple[np.ndarray, np.ndarray]:
    """A B-index batch call's ``tokens`` and ``offsets`` as fresh int64 arrays the call
    owns, held to the (tokens, offsets) contract: B + 1 offsets from 0 to
    ``len(tokens)``, never decreasing."""
    return ragged(tokens, offsets, b, "tokens", rows="indexes")




def checked_offsets(offsets: object, n_tokens: int) -> np.ndarray:
    """``batch_offsets`` then ``index_offsets``: the offsets of B requests over
    ``n_tokens`` tokens, owned and checked."""
    off = batch_offsets(offsets)
    index_offsets(off, n_tokens)
    return off


# --- the suffix trie ------------------------------------------------------------------
def check_trie_args(depth: object, ties: object) -> tuple[int, bool]:
    """``(depth, ties == "last")``, or raise: ``depth`` an integer in
    ``2..MAX_TRIE_DEPTH``, ``ties`` ``"first"`` or ``"last"``."""
    d = check_trie_depth(depth)
    if type(ties) is not str or ties not in ("first", "last"):
        raise ValueError(f"ties must be 'first' or 'last', got {ties!r}")
    return d, ties == "last"


def check_trie_depth(depth: object, name: str = "depth") -> int:
    """``depth`` (named ``name``) as an integer in ``2..MAX_TRIE_DEPTH``, or raise."""
    d = check_count(depth, name)
    if not 2 <= d <= MAX_TRIE_DEPTH:
        raise ValueError(f"{name} must be in 2..{MAX_TRIE_DEPTH}, got {d}")
    return d


def check_min_prob(min_prob: object) -> float:
    """``min_prob`` as a real in [0, 1], or raise (TypeError, ValueError)."""
    p = as_real(min_prob, "min_prob")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"min_prob must be in [0, 1], got {p!r}")
    return p


def check_trie_seq(seq: object) -> int:
    """A sequence key: an integer within int64 (TypeError for anything else, bools
    included; OverflowError beyond int64)."""
    if isinstance(seq, (bool, np.bool_)):
        raise TypeError(f"seq must be an integer, got bool {seq!r}")
    try:
        v = operator.index(seq)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"seq must be an integer, got {type(seq).__name__} {seq!r}") from None
    if not -INT64_MAX - 1 <= v <= INT64_MAX:
        raise OverflowError(f"seq={v} is beyond int64")
    return v


def check_trie_room(nodes: int, tokens: int, depth: int) -> None:
    """Refuse (ValueError) an ``extend`` of ``tokens`` tokens that could take the trie of
    ``nodes`` nodes past ``MAX_TRIE_NODES`` (each token makes at most ``depth``)."""
    if tokens and nodes + tokens * depth > MAX_TRIE_NODES:
        raise ValueError(f"tokens: {tokens} more tokens could take the trie past its {MAX_TRIE_NODES} nodes "
                         f"(it has {nodes}); start another trie")


def check_trie_speculate(max_k: object, factor: object, min_prob: object, depth: int) -> tuple[int, float, float]:
    """``(max_k capped at depth, factor, min_prob)``, or raise: ``max_k`` a non-negative
    integer, and ``check_trie_draft``'s."""
    k = min(check_count(max_k, "max_k"), depth)
    return (k, *check_trie_draft(factor, min_prob))


def check_trie_draft(factor: object, min_prob: object) -> tuple[float, float]:
    """``(factor, min_prob)``, or raise: ``factor`` a finite real >= 0, ``min_prob`` a
    real in [0, 1]."""
    return nonnegative_real(factor, "factor"), check_min_prob(min_prob)


def check_trie_list(tries: object, kind: type, name: str) -> list:
    """``tries`` as a new list, or TypeError: a list or tuple of ``kind`` (the first
    entry that is not one named; an entry's real type is what counts, not the
    ``__class__`` it claims, which ``isinstance`` would believe)."""
    if type(tries) not in (list, tuple):
        raise TypeError(f"{name} must be a list or tuple of {kind.__name__}, got {type(tries).__name__}")
    rows = list(tries)  # type: ignore[call-overload]
    for i, t in enumerate(rows):
        if not issubclass(type(t), kind):
            raise TypeError(f"{name}[{i}] must be a {kind.__name__} of the same implementation, got "
                            f"{type(t).__module__}.{type(t).__name__}")
    return rows


def check_trie_rows(tries: object, seqs: object, kind: type) -> tuple[list, np.ndarray]:
    """``(tries as a list, seqs as a fresh int64 array of as many keys)``, or raise:
    ``check_trie_list``'s refusals, and one int64 key per trie (``int64_ids``'s
    refusals; ValueError for a count that differs)."""
    rows = check_trie_list(tries, kind, "tries")
    keys = int64_ids(seqs, "seqs")
    if keys.shape[0] != len(rows):
        raise ValueError(f"seqs holds {keys.shape[0]} keys for {len(rows)} tries")
    return rows, keys
