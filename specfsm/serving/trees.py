"""Tree drafts in the serving loop: ``SuffixTreeDrafter``, whose sessions propose
``SuffixIndex.propose_tree`` trees as ``TreeDraft``s for ``serve`` to verify in one
evaluation (``specfsm replay --drafter suffix-tree``).

A tree needs a target that evaluates one (each node attending to the context and its
ancestors): one shared target whose ``evaluate_batch(feeds, caches, trees=...)`` takes
each slot's parents, as ``specfsm.hf``'s ``ModelTarget`` and the teacher-forced
``TeacherForcedBatch`` do. Trees verify greedily and resume, as the batch's bonus row
does, with the target's token after the last accepted node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..drafting.suffix_index import SuffixIndex
from ..drafting._tree_checks import MAX_TREE_NODES, check_tree_args
from .loop import TreeDraft

__all__ = ["SuffixTreeDrafter"]


class _TreeSession:
    """One request's ``SuffixIndex``: ``extend`` appends the confirmed tokens, ``propose``
    a tree of at most ``max_k`` nodes (a chain when the tree is one, empty when nothing
    matches)."""

    __slots__ = ("index", "max_depth", "max_width")

    def __init__(self, index: Any, prompt: Sequence[Any], max_depth: int | None, max_width: int | None) -> None:
        self.index = index
        self.max_depth = max_depth
        self.max_width = max_width
        if len(prompt):
            index.extend(prompt)

    def extend(self, tokens: Sequence[Any]) -> None:
        if len(tokens):
            self.index.extend(tokens)

    def propose(self, max_k: int) -> Any:
        if max_k < 1:
            return []
        budget = max_k if max_k < MAX_TREE_NODES else MAX_TREE_NODES
        depth = None if self.max_depth is None else min(self.max_depth, budget)
        toks, pars = self.index.propose_tree(budget, depth, self.max_width)
        n = len(toks)
        if n == 0:
            return []
        if bool((pars == np.arange(-1, n - 1)).all()):
            return toks.tolist()      # a chain: verified as one
        return TreeDraft(toks, pars)


class SuffixTreeDrafter:
    """Drafts trees with ``SuffixIndex(min_n, max_n, prefer, anchor_n=...)``'s
    ``propose_tree`` (its rule: ``specfsm.drafting._suffix_tree_py``): at most the loop's
    ``k`` nodes, ``max_depth`` deep (None: the node budget) and ``max_width`` children per
    node (None: the index's default). Sessions hold a ``SuffixIndex`` of the active
    implementation; the loop extends them with each step's emitted tokens."""

    name = "suffix-tree"
    trees = True

    def __init__(self, min_n: int = 1, max_n: int | None = None, prefer: str = "earliest", *,
                 anchor_n: int = 16, max_depth: int | None = None, max_width: int | None = None) -> None:
        SuffixIndex(min_n, max_n, prefer, anchor_n=anchor_n)  # validate the arguments now
        check_tree_args(1, max_depth, max_width)
        self.min_n, self.max_n, self.prefer, self.anchor_n = min_n, max_n, prefer, anchor_n
        self.max_depth, self.max_width = max_depth, max_width

    def session(self, prompt: Sequence[Any]) -> _TreeSession:
        ix = SuffixIndex(self.min_n, self.max_n, self.prefer, anchor_n=self.anchor_n)
        return _TreeSession(ix, prompt, self.max_depth, self.max_width)

    def __repr__(self) -> str:
        return (f"SuffixTreeDrafter(min_n={self.min_n}, max_n={self.max_n}, prefer={self.prefer!r}, "
                f"anchor_n={self.anchor_n}, max_depth={self.max_depth}, max_width={self.max_width})")
