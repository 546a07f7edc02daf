"""Settling a tree verify for the state machine: a tree's fields checked, and what the
target's rows make of it (the accepted path, the row it resumes from, whether the path
reached a leaf). ``specfsm.machine.state.VerifyTree`` builds its states from these; the
kernels are the active implementation's (``specfsm.tree.tree``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import IllegalTransition
from ..tree._checks import ids64, rows_reason
from ..tree.tree import accept_tree, check_tree

__all__ = ["tree_fields", "tree_path", "settle_tree"]


def tree_fields(tokens: object, parents: object) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], tuple[int, ...]]:
    """The tree checked (``check_tree``'s refusals): its int64 arrays and the same as
    tuples of Python ints."""
    t, p = check_tree(tokens, parents)
    return t, p, tuple(t.tolist()), tuple(p.tolist())


def tree_path(t: np.ndarray, p: np.ndarray, row_tokens: object) -> list[int]:
    """The accepted path's node indices for the checked tree ``(t, p)`` (``accept_tree``;
    ValueError for ``row_tokens`` that are not N + 1 integer ids)."""
    return accept_tree(t, p, row_tokens).tolist()


def _rows_length(x: object, name: str) -> int:
    try:
        return len(x)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be a sized sequence, got {type(x).__name__}") from None


def settle_tree(
    t: np.ndarray, p: np.ndarray, row_tokens: object, row_caches: Any, attempted: str
) -> tuple[bool, int, int, Any]:
    """``(leaf, m, token, cache)`` for the checked tree ``(t, p)``: whether the accepted
    path of ``m`` nodes ends at a leaf,
    the target's token after its last node's row and that row's cache. Refuses (before
    anything is read from ``row_caches``) row tokens that are not integer ids
    (TypeError/ValueError) and rows of the wrong length (``IllegalTransition(attempted)``
    with the reason)."""
    n = t.shape[0]
    r = ids64(row_tokens, "row_tokens")
    if r.shape[0] != n + 1:
        raise IllegalTransition(attempted, rows_reason(r.shape[0], n))
    k = _rows_length(row_caches, "row_caches")
    if k != n + 1:
        raise IllegalTransition(
            attempted,
            f"row_caches holds {k} entries for a tree of {n} nodes; it needs N + 1 = {n + 1}",
        )
    path = accept_tree(t, p, r)
    m = path.shape[0]
    last = int(path[-1]) if m else -1
    row = last + 1
    leaf = bool(m) and not bool((p == last).any())
    return leaf, m, int(r[row]), row_caches[row]
