"""A counted suffix trie of bounded depth: drafts from how often each continuation
recurred (pure-Python twin of ``_core/drafting/suffix_trie.pyx``).

The rule, which both implementations follow exactly (the same integer counts, the same
double-precision products and sums in the same order, the same ties):

* Sequences. ``extend(seq, tokens)`` appends ``tokens`` to sequence ``seq`` (any int64
  key; a new key starts a new sequence). Suffixes never cross from one sequence into
  another. ``close(seq)`` ends a sequence: its counts stay, and the key may start a new
  sequence later.
* Nodes. A node is a string of 1 to ``depth`` tokens that has ended some position of some
  sequence; its count is how many positions it ended (its occurrences), the root's count
  the positions fed in all. Appending token ``t`` to a sequence counts one occurrence of
  each of its suffixes ending at ``t`` of at most ``depth`` tokens, shortest first: the
  root's child ``t``, then ``t`` under each of the sequence's open suffixes (those ending
  at its previous token, of at most ``depth - 1`` tokens) by length. A node is created
  (the next node number) when first counted.
* Best child. Each node keeps one best child: when a child's count is incremented, it
  becomes its parent's best child if the parent has none, if its count now exceeds the
  best child's, or, with ``ties="last"``, if it equals it (``"first"``: the child that
  first reached the highest count keeps its place; ``"last"``: the one that reached it
  most recently takes it).
* ``speculate(context, max_k, factor, min_prob)``. For ``m = 1, 2, ...`` up to
  ``min(len(context), depth)``, the node of the context's last ``m`` tokens (stopping at
  the first ``m`` with none: no longer suffix has one either). Its draft follows best
  children from that node: at most ``k_m`` tokens, ``k_m = min(max_k, floor(m *
  factor))`` (``factor`` 0: ``max_k``; ``max_k`` is taken as at most ``depth``), each
  step's probability ``p = p * (count(child) / count(node))`` from ``p = 1.0``, stopping
  before a token whose ``p`` is below ``min_prob``; its score is the sum of its tokens'
  ``p``, added in order. The draft kept is the one of the highest score, a later (longer)
  ``m`` winning ties. Returns ``(draft, score, m)``: a list of ints, a float and the match
  length of the draft kept (``([], 0.0, 0)`` when no suffix of the context is a node).
* Batches. ``extend_tries(tries, seqs, tokens, offsets)`` is ``tries[i].extend(seqs[i],
  ...)`` for every row in order, all or nothing; ``speculate_tries(tries, seqs, max_k,
  others, ...)`` drafts after each row's sequence's last ``depth - 1`` tokens, from its
  trie or, scoring higher, one of ``others`` (their docstrings).
* Memory. ``nbytes`` is ``32 * capacity``: the node capacity starts at 64 and doubles
  whenever the nodes would not fit (each node: its token, count, parent and best child,
  and two hash slots for the (parent, token) lookup).
"""

from __future__ import annotations

import numpy as np

from .._checks import token_ids
from .._guard import READY, Guard, begin_init, guard_of
from ._checks import (MAX_TRIE_NODES, TRIE_NODE_BYTES, check_batch_limits, check_trie_args, check_trie_draft,
                      check_trie_list, check_trie_room, check_trie_rows, check_trie_seq, check_trie_speculate)
from .._checks import ragged

__all__ = ["SuffixTrie", "extend_tries", "speculate_tries"]

NAME = "SuffixTrie"
FIRST_CAPACITY = 64


def _check_self(obj: object) -> None:
    """A method's ``self``, refused (TypeError) unless it is a SuffixTrie of this
    implementation (an unbound call gets any object)."""
    if not isinstance(obj, SuffixTrie):
        raise TypeError(f"a method of {NAME} needs a {NAME} of the same implementation, got "
                        f"{type(obj).__module__}.{type(obj).__name__}")


def _guard(obj: object) -> Guard:
    """``obj``'s guard, ``obj`` checked first (``_check_self``)."""
    _check_self(obj)
    return guard_of(obj, NAME)


class SuffixTrie:
    """Every suffix of at most ``depth`` tokens of the sequences fed to it, with how often
    each occurred, and drafts that follow the most frequent continuation of the longest
    contexts that occurred (Arctic's suffix decoding, with a bounded depth). ``ties`` is
    ``"first"`` or ``"last"``: which of two equally frequent continuations a draft takes
    (the one that reached that count first, or most recently). The rule:
    ``specfsm.drafting._suffix_trie_py``. Refuses bad settings and bad arguments with
    TypeError, ValueError or OverflowError naming the argument, changing nothing; a call on
    an object being changed by another thread is refused with RuntimeError, and one made
    with ``__new__`` (or whose ``__init__`` failed) refuses every call. Not picklable."""

    def __init__(self, depth: object = 8, ties: object = "first") -> None:
        _check_self(self)
        g = begin_init(self, NAME)  # a second __init__ is refused, changing nothing
        self._depth, self._last = check_trie_args(depth, ties)
        self._tok: list[int] = [-1]      # per node: its last token (the root: -1)
        self._cnt: list[int] = [0]       # per node: its occurrences
        self._best: list[int] = [-1]     # per node: its best child (-1: none)
        self._par: list[int] = [-1]      # per node: its parent (the root: -1)
        self._kids: dict[tuple[int, int], int] = {}   # (parent, token) -> node
        self._open: dict[int, list[int]] = {}         # sequence -> its open suffixes, by length
        self._cap = FIRST_CAPACITY
        g.end_init()

    def _hold_guard(self, on: object) -> None:
        """Tests only: take the writer flag as a writer would (refusing like one), or,
        with ``on`` false, release it."""
        _guard(self).hold(on)

    @property
    def depth(self) -> int:
        """The longest string the trie counts."""
        _guard(self).check()
        return self._depth

    @property
    def ties(self) -> str:
        """``"first"`` or ``"last"``: which of two equally frequent continuations wins."""
        _guard(self).check()
        return "last" if self._last else "first"

    @property
    def n_nodes(self) -> int:
        """The distinct strings counted (the root not included)."""
        _guard(self).check()
        return len(self._tok) - 1

    @property
    def open_sequences(self) -> int:
        """The sequences fed and not closed."""
        _guard(self).check()
        return len(self._open)

    @property
    def nbytes(self) -> int:
        """The node storage: ``32`` bytes times the node capacity (the module docstring)."""
        _guard(self).check()
        return TRIE_NODE_BYTES * self._cap

    def __len__(self) -> int:
        """The tokens fed, all sequences together."""
        _guard(self).check()
        return self._cnt[0]

    def _count(self, parent: int, t: int) -> int:
        """Count one occurrence of ``t`` under ``parent`` (the node made if new), its
        parent's best child updated; returns the node."""
        c = self._kids.get((parent, t))
        if c is None:
            c = len(self._tok)
            self._kids[(parent, t)] = c
            self._tok.append(t)
            self._cnt.append(0)
            self._best.append(-1)
            self._par.append(parent)
        cnt = self._cnt
        cnt[c] += 1
        b = self._best[parent]
        if b < 0 or cnt[c] > cnt[b] or (self._last and cnt[c] == cnt[b]):
            self._best[parent] = c
        return c

    def extend(self, seq: object, tokens: object) -> None:
        """Append ``tokens`` to sequence ``seq`` (the module docstring's rule)."""
        key = check_trie_seq(seq)
        new = token_ids(tokens, "tokens", own=True).tolist()
        g = _guard(self)
        g.write()
        try:
            check_trie_room(len(self._tok) - 1, len(new), self._depth)
            self._extend(key, new)
        finally:
            g.done_write()

    def _extend(self, key: int, new: list[int]) -> None:
        grown = self._open.get(key, [])
        keep = self._depth - 1
        for t in new:
            out = [self._count(0, t)]
            for nd in grown:   # (by length: the last child may be ``depth`` long)
                c = self._count(nd, t)
                if len(out) < keep:
                    out.append(c)
            grown = out
            self._cnt[0] += 1
        self._open[key] = grown
        while self._cap < len(self._tok) - 1:
            self._cap *= 2

    def _tail(self, key: int) -> list[int]:
        """Sequence ``key``'s last ``depth - 1`` tokens (all when fewer; none when it is
        not open): the tokens of its longest open suffix."""
        nodes = self._open.get(key)
        out: list[int] = []
        nd = nodes[-1] if nodes else 0
        while nd > 0:
            out.append(self._tok[nd])
            nd = self._par[nd]
        out.reverse()
        return out

    def close(self, seq: object) -> None:
        """End sequence ``seq`` (its counts stay); nothing for a sequence not open."""
        key = check_trie_seq(seq)
        g = _guard(self)
        g.write()
        try:
            self._open.pop(key, None)
        finally:
            g.done_write()

    def speculate(self, context: object, max_k: object, factor: object = 1.0,
                  min_prob: object = 0.1) -> tuple[list[int], float, int]:
        """``(draft, score, m)``: the most frequent continuation of the context's longest
        suffixes, the best-scored one kept (the module docstring's rule)."""
        g = _guard(self)
        g.check()
        ctx = token_ids(context, "context", own=True).tolist()
        k, f, least = check_trie_speculate(max_k, factor, min_prob, self._depth)
        g.read()
        try:
            return self._speculate(ctx, k, f, least)
        finally:
            g.done_read()

    def _speculate(self, ctx: list[int], max_k: int, f: float, least: float) -> tuple[list[int], float, int]:
        kids, tok, cnt, best = self._kids, self._tok, self._cnt, self._best
        L = len(ctx)
        out: tuple[list[int], float, int] = ([], 0.0, 0)
        for m in range(1, min(L, self._depth) + 1):
            nd: int | None = 0
            for t in ctx[L - m:]:
                nd = kids.get((nd, t))  # type: ignore[arg-type]
                if nd is None:
                    break
            if nd is None:
                break
            x = m * f
            k = max_k if (f == 0.0 or x >= max_k) else int(x)
            p, s = 1.0, 0.0
            d: list[int] = []
            while len(d) < k:
                c = best[nd]
                if c < 0:
                    break
                p = p * (cnt[c] / cnt[nd])
                if p < least:
                    break
                d.append(tok[c])
                s += p
                nd = c
            if s >= out[1]:
                out = (d, s, m)
        return out

    def __repr__(self) -> str:
        if _guard(self).phase != READY:
            return f"{NAME}(<not initialised or unusable>)"
        return f"{NAME}(depth={self._depth}, ties={self.ties!r}, tokens={self._cnt[0]}, nodes={len(self._tok) - 1})"

    def __reduce__(self):
        _guard(self).check()
        raise TypeError(f"{NAME} cannot be pickled or copied (build one and feed it the sequences)")


def _held(tries: list, write: bool) -> list[Guard]:
    """The guards of the distinct ``tries``, each taken once (a writer's, or a reader's);
    on a refusal the ones taken are given back first."""
    taken: list[Guard] = []
    seen: set[int] = set()
    try:
        for t in tries:
            if id(t) not in seen:
                seen.add(id(t))
                g = guard_of(t, NAME)
                g.write() if write else g.read()
                taken.append(g)
    except BaseException:
        _give_back(taken, write)
        raise
    return taken


def _give_back(taken: list[Guard], write: bool) -> None:
    for g in taken:
        g.done_write() if write else g.done_read()


def extend_tries(tries: object, seqs: object, tokens: object, offsets: object) -> None:
    """For ``i = 0, 1, ...`` in order, ``tries[i].extend(seqs[i], tokens[offsets[i]:
    offsets[i + 1]])`` (a trie may come more than once); all or nothing: every argument
    is checked, and every trie's room for all its tokens, before any changes."""
    rows, keys = check_trie_rows(tries, seqs, SuffixTrie)
    tk, off = ragged(tokens, offsets, len(rows))
    toks, cuts, kk = tk.tolist(), off.tolist(), keys.tolist()
    taken = _held(rows, True)
    try:
        need: dict[int, int] = {}
        for i, t in enumerate(rows):
            need[id(t)] = need.get(id(t), 0) + cuts[i + 1] - cuts[i]
        for t in {id(t): t for t in rows}.values():
            check_trie_room(len(t._tok) - 1, need[id(t)], t._depth)
        for i, t in enumerate(rows):
            t._extend(kk[i], toks[cuts[i]:cuts[i + 1]])
    finally:
        _give_back(taken, True)


def speculate_tries(tries: object, seqs: object, max_k: object, others: object = (), factor: object = 1.0,
                    min_prob: object = 0.1) -> list[list[int]]:
    """One draft per row: ``tries[i].speculate(tail, k, factor, min_prob)``'s, where
    ``tail`` is sequence ``seqs[i]``'s last ``depth - 1`` tokens in ``tries[i]`` (all of
    them when fewer; none when it is not open) and ``k`` is ``max_k`` (one count, or one
    per row), replaced by the draft of a trie of ``others`` after the same tail when that
    one scores higher (the first of the highest, in order). A row whose ``k`` is 0 drafts
    nothing."""
    rows, keys = check_trie_rows(tries, seqs, SuffixTrie)
    more = check_trie_list(others, SuffixTrie, "others")
    ks = check_batch_limits(max_k, len(rows), False).tolist()
    f, least = check_trie_draft(factor, min_prob)
    taken = _held(rows + more, False)
    try:
        out: list[list[int]] = []
        for i, t in enumerate(rows):
            if not ks[i]:
                out.append([])
                continue
            ctx = t._tail(keys[i])
            best, score, _ = t._speculate(ctx, min(ks[i], t._depth), f, least)
            for o in more:
                d, sc, _ = o._speculate(ctx, min(ks[i], o._depth), f, least)
                if sc > score:
                    best, score = d, sc
            out.append(best)
        return out
    finally:
        _give_back(taken, False)


assert MAX_TRIE_NODES < 2**31  # node numbers are 32-bit in the compiled trie
