"""The recycling table: tree drafts from the target's own earlier predictions
(pure-Python twin of ``_core/drafting/recycling.pyx``).

The rule, which both implementations follow exactly:

* The table. For every token id ``t`` in ``0..vocab_size - 1`` a row of at most ``k``
  distinct ids: the ids the target ranked highest after ``t`` the last time a row whose
  input was ``t`` was evaluated (Token Recycling's adjacency table). A fresh table's rows
  are empty.
* ``update(tokens, topk)``. Row ``i`` of a forward (input ``tokens[i]``, the target's
  ids by rank ``topk[i]``) replaces ``tokens[i]``'s row with the distinct ids of
  ``topk[i]`` in rank order (a repeated id kept at its first place), at most ``k`` of
  them; when a token is the input of several rows the last row wins. Rows of several
  requests go in one call (their rows concatenated: the batched update).
* The tree's shape. Slots are grown best-first, independent of the table: the root's
  children are slots of ranks ``0..min(k, max_width) - 1``; a slot of rank ``r`` under a
  slot of score ``s`` has score ``s * RANK_WEIGHTS[r]`` (the root's score is 1.0, one
  multiply per level in doubles); the slot with the highest score is taken next (ties:
  the slot created first), and a taken slot at depth below ``max_depth`` creates its
  children. It stops at ``budget`` slots. The weights fall with the rank, so a slot's
  lower-ranked siblings are always taken before it.
* The tree. Walking the slots in the order they were taken, a slot's token is entry
  ``r`` of its parent's token's row (the root's token: ``last``); a slot whose row has
  no entry ``r``, or whose parent was not kept, is not kept. Kept slots are the nodes, in
  that order: ``(tokens, parents)`` with ``parents[i]`` the index of node ``i``'s parent
  (``-1``: the root), parents before children, siblings distinct (a row's ids are).
"""

from __future__ import annotations

import heapq

import numpy as np

from .._guard import READY, Guard, begin_init, guard_of
from ._tree_checks import (DEFAULT_RECYCLE_K, RANK_WEIGHTS, check_last, check_lasts, check_rows, check_shape_args,
                           check_table_args, check_tree_args, check_update, check_updates)

__all__ = ["RecyclingTable", "tree_shape"]

NAME = "RecyclingTable"


def tree_shape(budget: int, max_depth: int, width: int) -> tuple[list[int], list[int]]:
    """The shape's slots in the order they are taken: each one's parent slot (``-1``: the
    root) and rank (the module docstring's rule; ``width``: ranks per slot). Refuses a
    ``budget`` or ``max_depth`` outside 1..MAX_TREE_NODES and a ``width`` outside
    1..MAX_RECYCLE_K (TypeError or ValueError naming the argument)."""
    budget, max_depth, width = check_shape_args(budget, max_depth, width)
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, created, parent, rank, depth)
    seq = 0
    for r in range(width):
        heap.append((-RANK_WEIGHTS[r], seq, -1, r, 1))
        seq += 1
    heapq.heapify(heap)
    parents: list[int] = []
    ranks: list[int] = []
    while heap and len(parents) < budget:
        neg, _, p, r, d = heapq.heappop(heap)
        i = len(parents)
        parents.append(p)
        ranks.append(r)
        if d < max_depth:
            for c in range(width):
                heapq.heappush(heap, (-((-neg) * RANK_WEIGHTS[c]), seq, i, c, d + 1))
                seq += 1
    return parents, ranks


def _grow(table: np.ndarray, last: int, slots: list[int], ranks: list[int]) -> tuple[list[int], list[int]]:
    toks: list[int] = []
    pars: list[int] = []
    node = [-1] * len(slots)
    for i, (ps, r) in enumerate(zip(slots, ranks)):
        if ps < 0:
            pn, pt = -1, last
        else:
            pn = node[ps]
            if pn < 0:
                continue
            pt = toks[pn]
        t = int(table[pt, r])
        if t < 0:
            continue
        node[i] = len(toks)
        toks.append(t)
        pars.append(pn)
    return toks, pars


def _rows(x: np.ndarray, k: int) -> np.ndarray:
    """Each row of ``x`` as its distinct ids in order, at most ``k``, padded with -1."""
    n, m = x.shape
    eq = x[:, :, None] == x[:, None, :]
    dup = (eq & np.tri(m, m, -1, dtype=bool)).any(2)
    order = np.argsort(dup, axis=1, kind="stable")
    vals = np.take_along_axis(x, order, 1)
    vals[np.arange(m) >= (~dup).sum(1, keepdims=True)] = -1
    out = np.full((n, k), -1, dtype=np.int32)
    w = min(m, k)
    out[:, :w] = vals[:, :w]
    return out


def _check_self(obj: object) -> None:
    """A method's ``self``, refused (TypeError) unless it is a RecyclingTable of this
    implementation (an unbound call gets any object)."""
    if not isinstance(obj, RecyclingTable):
        raise TypeError(f"a method of {NAME} needs a {NAME} of the same implementation, got "
                        f"{type(obj).__module__}.{type(obj).__name__}")


def _guard(obj: object) -> Guard:
    """``obj``'s guard, ``obj`` checked first (``_check_self``)."""
    _check_self(obj)
    return guard_of(obj, NAME)


class RecyclingTable:
    """For every token id, the ids the target ranked highest after it when it was last
    evaluated (Token Recycling's adjacency table, ``vocab_size x k`` int32 ids: 4 bytes
    each), fed from every forward's top-k (``update``) and shared by all the requests of
    one model; ``propose_tree`` / ``propose_trees`` grow tree drafts from it (the rule:
    ``specfsm.drafting._recycling_py``). Refuses bad settings and bad rows with
    TypeError or ValueError naming the argument, changing nothing; a call on an object
    being changed by another thread is refused with RuntimeError, and one made with
    ``__new__`` (or whose ``__init__`` failed) refuses every call."""

    def __init__(self, vocab_size: object, k: object = DEFAULT_RECYCLE_K) -> None:
        _check_self(self)
        g = begin_init(self, NAME)  # a second __init__ is refused, changing nothing
        self._vocab, self._k = check_table_args(vocab_size, k)
        self._table = np.full((self._vocab, self._k), -1, dtype=np.int32)
        self._updates = 0
        g.end_init()

    def _hold_guard(self, on: object) -> None:
        """Tests only: take the writer flag as a writer would (refusing like one), or,
        with ``on`` false, release it."""
        _guard(self).hold(on)

    @property
    def vocab_size(self) -> int:
        """The token ids the table has a row for: ``0..vocab_size - 1``."""
        _guard(self).check()
        return self._vocab

    @property
    def k(self) -> int:
        """The most ids a row keeps."""
        _guard(self).check()
        return self._k

    @property
    def nbytes(self) -> int:
        """The table's memory: ``vocab_size * k * 4`` bytes."""
        _guard(self).check()
        return self._vocab * self._k * 4

    @property
    def updates(self) -> int:
        """The rows ``update`` has taken so far (every row counted, a repeated token too)."""
        _guard(self).check()
        return self._updates

    def filled(self) -> int:
        """How many token ids have a row that is not empty."""
        g = _guard(self)
        g.read()
        try:
            return int((self._table[:, 0] >= 0).sum())
        finally:
            g.done_read()

    def row(self, token: object) -> np.ndarray:
        """Token ``token``'s row: its ids by rank (int64, at most ``k``; empty when the
        token was never evaluated)."""
        t = check_last(token, self._vocab_checked(), "token")
        g = _guard(self)
        g.read()
        try:
            r = self._table[t]
            return r[r >= 0].astype(np.int64)
        finally:
            g.done_read()

    def _vocab_checked(self) -> int:
        _guard(self).check()
        return self._vocab

    def update(self, tokens: object, topk: object) -> None:
        """Take one forward's rows: ``tokens[i]``, the input of row ``i``, and ``topk[i]``,
        the target's ids ranked highest after it (``(n, m)``, ``m >= 1``; a 1-D array is one
        id per row; numpy, a list of rows or a host tensor). Each row replaces its token's
        row (the module docstring's rule); the rows of B requests go in one call. Refuses
        ids outside the vocabulary and mismatched shapes before changing anything."""
        t, x = check_update(tokens, topk, self._vocab_checked())
        rows = _rows(x, self._k)
        g = _guard(self)
        g.write()
        try:
            _, first = np.unique(t[::-1], return_index=True)
            keep = len(t) - 1 - first  # the last row of each token
            self._table[t[keep]] = rows[keep]
            self._updates += len(t)
        finally:
            g.done_write()

    def propose_tree(self, last: object, budget: object, max_depth: object = None,
                     max_width: object = None) -> tuple[np.ndarray, np.ndarray]:
        """A tree of drafts after token ``last``: ``(tokens, parents)``, two int64 arrays of
        at most ``budget`` nodes in the form of ``SuffixIndex.propose_tree`` (parents before
        children, ``-1``: ``last``), grown from the table along the fixed shape of the
        module docstring, at most ``max_depth`` deep (None: ``budget``) with at most
        ``max_width`` children per node (None: ``k``). Empty when ``last``'s row is."""
        v = self._vocab_checked()
        root = check_last(last, v)
        b, d, w = check_tree_args(budget, max_depth, max_width)
        slots, ranks = tree_shape(b, d, self._k if max_width is None else min(w, self._k))
        g = _guard(self)
        g.read()
        try:
            toks, pars = _grow(self._table, root, slots, ranks)
        finally:
            g.done_read()
        return np.asarray(toks, dtype=np.int64), np.asarray(pars, dtype=np.int64)

    def propose_trees(self, lasts: object, budget: object, max_depth: object = None,
                      max_width: object = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``propose_tree`` for B roots in one call: ``(tokens, parents, offsets)``, int64;
        tree ``i`` (after ``lasts[i]``) is ``tokens[offsets[i]:offsets[i + 1]]`` with its
        parents (local to it, ``-1``: its root) at the same places."""
        v = self._vocab_checked()
        roots = check_lasts(lasts, v)
        b, d, w = check_tree_args(budget, max_depth, max_width)
        slots, ranks = tree_shape(b, d, self._k if max_width is None else min(w, self._k))
        off = np.zeros(len(roots) + 1, dtype=np.int64)
        toks: list[int] = []
        pars: list[int] = []
        g = _guard(self)
        g.read()
        try:
            for i, root in enumerate(roots.tolist()):
                a, p = _grow(self._table, root, slots, ranks)
                toks += a
                pars += p
                off[i + 1] = len(toks)
        finally:
            g.done_read()
        return np.asarray(toks, dtype=np.int64), np.asarray(pars, dtype=np.int64), off

    def __repr__(self) -> str:
        if _guard(self).phase != READY:
            return f"{NAME}(<not initialised or unusable>)"
        return f"{NAME}(vocab_size={self._vocab}, k={self._k})"

    def __reduce__(self):
        # pickled (and copied) as its settings, its rows and its update count
        g = _guard(self)
        g.read()
        try:
            return _rebuild, (type(self), self._vocab, self._k, self._table.copy(), self._updates)
        finally:
            g.done_read()


def _rebuild(cls: type, vocab: int, k: int, table: object, updates: int) -> RecyclingTable:
    if not (isinstance(cls, type) and issubclass(cls, RecyclingTable)):
        raise TypeError(f"cannot rebuild a {NAME} as {cls!r}")
    t = cls(vocab, k)
    t._table[...] = check_rows(table, t._vocab, t._k)
    t._updates = check_updates(updates)
    return t
