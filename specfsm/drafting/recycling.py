"""Drafts where nothing can be copied: the recycling table and merged trees.

``RecyclingTable`` keeps, for every token id, the ids the target itself ranked highest
after it the last time it was evaluated (Token Recycling, Luo et al. 2025), and grows
tree drafts from that table; it runs on the compiled core, or on its pure-Python twin
where that is not built (``specfsm._impl``). One table serves every request of a model:
``vocab_size * k * 4`` bytes (SmolLM2's 49,152 ids at k = 8: 1.5 MiB).

``merge_trees`` joins two tree drafts of the same root (for example the suffix index's
``propose_tree`` and the table's) into one tree of a node budget, the shared paths
counted once, saying which draft each node came from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _impl
from .._checks import check_count

__all__ = ["RecyclingTable", "merge_trees"]

if TYPE_CHECKING:  # type checkers read the twin
    from ._recycling_py import RecyclingTable
else:  # the active implementation's class itself (docstrings: the twin's)
    RecyclingTable = _impl.load("recycling").RecyclingTable


def _tree(tree: Any, name: str) -> tuple[list[int], list[int]]:
    tok, par = (np.asarray(a) for a in tree)
    if tok.ndim != 1 or par.shape != tok.shape or (len(tok) and (tok.dtype.kind not in "iu" or par.dtype.kind not in "iu")):
        raise ValueError(f"{name} must be (tokens, parents): two 1-D integer arrays of one length")
    p = par.astype(np.int64).tolist()
    for i, q in enumerate(p):
        if not -1 <= q < i:
            raise ValueError(f"{name}: parents[{i}] = {q} must be in [-1, {i}) (parents before children)")
    return tok.astype(np.int64).tolist(), p


def merge_trees(first: Any, second: Any, budget: object, reserve: object = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One tree of at most ``budget`` nodes from two trees of the same root, each
    ``(tokens, parents)`` in ``propose_tree``'s form and in the order its drafter ranks
    its nodes (parents first). ``first``'s nodes come first, leaving ``reserve`` nodes
    (or fewer, if ``second`` has fewer) to ``second``'s; then ``second``'s, a node whose
    path is already in the tree taking no room; then what is left of ``first``'s. A node
    whose parent did not fit is left out. Returns ``(tokens, parents, origin)``, int64,
    int64 and uint8: ``origin`` bit 0 set for a node of ``first``, bit 1 for one of
    ``second`` (both where they share it)."""
    a = _tree(first, "first")
    b = _tree(second, "second")
    n = check_count(budget, "budget")
    keep = n - min(check_count(reserve, "reserve"), len(b[0]), n)
    toks: list[int] = []
    pars: list[int] = []
    origin: list[int] = []
    at: dict[tuple[int, int], int] = {}   # (parent node, token) -> node
    where = ([-2] * len(a[0]), [-2] * len(b[0]))   # each source node's node (-2: not placed)

    def add(src: int, i: int, cap: int) -> None:
        tk, pr = (a, b)[src]
        q = pr[i]
        parent = -1 if q < 0 else where[src][q]
        if parent == -2:
            return
        key = (parent, tk[i])
        node = at.get(key)
        if node is None:
            if len(toks) >= cap:
                return
            node = at[key] = len(toks)
            toks.append(tk[i])
            pars.append(parent)
            origin.append(0)
        origin[node] |= 1 << src
        where[src][i] = node

    for i in range(len(a[0])):
        add(0, i, keep)
    for i in range(len(b[0])):
        add(1, i, n)
    for i in range(len(a[0])):
        if where[0][i] == -2:
            add(0, i, n)
    return (np.asarray(toks, dtype=np.int64), np.asarray(pars, dtype=np.int64),
            np.asarray(origin, dtype=np.uint8))
