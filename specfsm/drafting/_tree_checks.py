"""Argument checks and limits of tree drafts: the suffix index's (``propose_tree``) and
the recycling table's (``RecyclingTable``: its settings, ``update``'s rows, the rank
weights of its tree shape).

Shared by the compiled ``specfsm._core.suffix_index`` and ``specfsm._core.recycling``
and their twins, so both refuse the same arguments with the same messages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import check_count, host_array, token_id, token_ids

__all__ = ["MAX_TREE_NODES", "TREE_OCCURRENCES", "TREE_WINDOW", "TREE_CONTEXTS", "DEFAULT_TREE_WIDTH",
           "TREE_AGREE_SPAN", "TREE_AGREE_MIN", "check_tree_args", "MAX_RECYCLE_K", "DEFAULT_RECYCLE_K",
           "MAX_VOCAB", "RANK_WEIGHTS", "check_table_args", "check_shape_args", "check_update", "check_last", "check_lasts",
           "check_rows", "check_updates"]

MAX_TREE_NODES = 1024     # the largest budget (and depth, and width) a tree may ask for
TREE_OCCURRENCES = 32     # per context: the latest earlier occurrences a tree counts
TREE_WINDOW = 2048        # occurrences counted end at most this many positions back
TREE_CONTEXTS = 3         # the matched suffix and at most two shorter ones
DEFAULT_TREE_WIDTH = 4    # children per node when ``max_width`` is None
TREE_AGREE_SPAN = 32      # the last tokens the chain's agreement compares
TREE_AGREE_MIN = 24       # the agreement at which the tree copies (keeps the chain whole)


def _limit(value: object, name: str) -> int:
    v = check_count(value, name)
    if v < 1 or v > MAX_TREE_NODES:
        raise ValueError(f"{name} must be between 1 and {MAX_TREE_NODES}, got {v}")
    return v


def check_tree_args(budget: object, max_depth: object, max_width: object) -> tuple[int, int, int]:
    """``propose_tree``'s limits as ints: ``budget`` nodes (1..MAX_TREE_NODES),
    ``max_depth`` (None: the budget) and ``max_width`` (None: DEFAULT_TREE_WIDTH), each
    1..MAX_TREE_NODES. Raises TypeError or ValueError naming the argument."""
    b = _limit(budget, "budget")
    d = b if max_depth is None else _limit(max_depth, "max_depth")
    w = DEFAULT_TREE_WIDTH if max_width is None else _limit(max_width, "max_width")
    return b, d, w


# --- the recycling table ----------------------------------------------------------------

MAX_RECYCLE_K = 32        # the most ids a table keeps per token
DEFAULT_RECYCLE_K = 8     # the table's k when none is given
MAX_VOCAB = 2**31 - 1     # token ids are stored as int32

#: The tree shape's weight of a child by its rank in its parent's row, a profile of how
#: often the target's next token is the row's rank-r id. A node's score is the product of
#: its path's weights; the shape takes the highest scores (``specfsm.drafting._recycling_py``).
#: Strictly decreasing, so a node's lower ranks are always in the shape before it. On
#: SmolLM2's greedy outputs for 13 Spec-Bench questions, the next token was the row's
#: rank 0..7 id 25%, 7.6%, 5.1%, 3.6%, 1.7%, 1.7%, 1.0% and 1.3% of the time; trees shaped
#: by those rates and by these weights accepted the same (1.69 tokens per evaluation,
#: teacher-forced, 64 nodes), so the weights were left as they are.
RANK_WEIGHTS = (0.45, 0.12, 0.06, 0.04, 0.03, 0.022, 0.017, 0.014) + tuple(
    0.012 * 0.875 ** i for i in range(MAX_RECYCLE_K - 8))


def check_table_args(vocab_size: object, k: object) -> tuple[int, int]:
    """``RecyclingTable``'s settings as ints: ``vocab_size`` 1..MAX_VOCAB, ``k``
    1..MAX_RECYCLE_K. Raises TypeError or ValueError naming the argument."""
    v = check_count(vocab_size, "vocab_size")
    if v < 1 or v > MAX_VOCAB:
        raise ValueError(f"vocab_size must be between 1 and {MAX_VOCAB}, got {v}")
    kk = check_count(k, "k")
    if kk < 1 or kk > MAX_RECYCLE_K:
        raise ValueError(f"k must be between 1 and {MAX_RECYCLE_K}, got {kk}")
    return v, kk


def check_shape_args(budget: object, max_depth: object, width: object) -> tuple[int, int, int]:
    """``tree_shape``'s arguments as ints: ``budget`` and ``max_depth`` 1..MAX_TREE_NODES,
    ``width`` 1..MAX_RECYCLE_K (the ranks RANK_WEIGHTS weighs). Raises TypeError or
    ValueError naming the argument."""
    b = _limit(budget, "budget")
    d = _limit(max_depth, "max_depth")
    w = check_count(width, "width")
    if w < 1 or w > MAX_RECYCLE_K:
        raise ValueError(f"width must be between 1 and {MAX_RECYCLE_K}, got {w}")
    return b, d, w


def _in_vocab(arr: np.ndarray, name: str, vocab: int) -> None:
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            at = tuple(int(i) for i in np.argwhere(arr == bad)[0])
            raise ValueError(f"{name}[{', '.join(map(str, at))}] = {bad} is outside the vocabulary 0..{vocab - 1}")


def check_update(tokens: object, topk: object, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``update``'s rows as fresh arrays the call owns: ``tokens`` (n,) int64 and ``topk``
    (n, m) int64, ``m >= 1`` (a list of rows, a 2-D integer array or host tensor; a 1-D
    one is read as one id per row), every id in ``0..vocab - 1``. Raises TypeError or
    ValueError naming the argument."""
    t = token_ids(tokens, "tokens", own=True)
    x: Any = host_array(topk, "topk")
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu" and x.size:
            raise TypeError(f"topk has unsupported dtype {x.dtype}; it must hold integer token ids")
        if x.dtype.kind == "u" and x.dtype.itemsize == 8 and x.size and int(x.max()) > 2**63 - 1:
            raise OverflowError(f"topk holds ids beyond int64 (max {int(x.max())})")
        arr = np.array(x, dtype=np.int64)
    elif isinstance(x, (list, tuple)):
        rows = [token_ids(r, f"topk[{i}]") if isinstance(r, (list, tuple, np.ndarray)) else
                np.array([token_id(r, "topk", i)], dtype=np.int64) for i, r in enumerate(x)]
        widths = {len(r) for r in rows}
        if len(widths) > 1:
            raise ValueError(f"topk's rows must be equally long, got lengths {sorted(widths)}")
        arr = np.array(rows, dtype=np.int64).reshape(len(rows), widths.pop() if widths else 1)
    else:
        raise TypeError(f"topk must be a 2-D integer array or a list of rows, got {type(x).__name__}")
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise ValueError(f"topk must be 2-D (one row of ids per token), got shape {arr.shape}")
    if arr.shape[0] != len(t):
        raise ValueError(f"topk has {arr.shape[0]} rows for {len(t)} tokens")
    if arr.shape[1] < 1 and len(t):
        raise ValueError("topk's rows must hold at least one id")
    t = t.astype(np.int64, copy=False)
    _in_vocab(t, "tokens", vocab)
    _in_vocab(arr, "topk", vocab)
    return t, np.ascontiguousarray(arr)


def check_last(last: object, vocab: int, name: str = "last") -> int:
    """A token id (a tree's root: ``name``) as an int in ``0..vocab - 1``."""
    try:
        v = token_id(last, name, 0)
    except (TypeError, OverflowError) as exc:  # one id: named without an index
        raise type(exc)(str(exc).replace(f"{name}[0]", name, 1)) from None
    if not 0 <= v < vocab:
        raise ValueError(f"{name} = {v} is outside the vocabulary 0..{vocab - 1}")
    return v


def check_lasts(lasts: object, vocab: int) -> np.ndarray:
    """The roots of a batch of trees as a fresh int64 array, each in ``0..vocab - 1``."""
    arr = token_ids(lasts, "lasts", own=True).astype(np.int64, copy=False)
    _in_vocab(arr, "lasts", vocab)
    return arr


def check_updates(updates: object) -> int:
    """A pickled table's update count: a non-negative int."""
    return check_count(updates, "updates")


def check_rows(table: object, vocab: int, k: int) -> np.ndarray:
    """A pickled table's rows as a fresh ``(vocab, k)`` int32 array, refused (ValueError)
    unless every row holds distinct ids in ``0..vocab - 1`` followed by -1s."""
    arr = np.asarray(table)
    if arr.shape != (vocab, k) or arr.dtype.kind not in "iu":
        raise ValueError(f"a pickled RecyclingTable's rows must be ({vocab}, {k}) integers, got {arr.dtype} {arr.shape}")
    arr = arr.astype(np.int64)
    pad = arr < 0
    srt = np.sort(np.where(pad, -1 - np.arange(k), arr), axis=1)
    if (arr < -1).any() or (arr >= vocab).any() or (pad[:, :-1] & ~pad[:, 1:]).any() \
            or (srt[:, 1:] == srt[:, :-1]).any():
        raise ValueError(f"a pickled RecyclingTable's rows must hold distinct ids in 0..{vocab - 1} followed by -1s")
    return arr.astype(np.int32)
