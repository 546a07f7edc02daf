"""Unbounded longest-match drafting over a suffix automaton (pure-Python twin).

The compiled module ``specfsm._core.suffix_index`` has the same names and behaviour; both
take their argument checks from ``specfsm._checks`` and the concept's check module, so both raise the same errors.

The rule (both implementations). After ``L`` tokens ``t[0:L]``, the match length ``n``
is the largest ``n <= max_n`` (no cap when ``max_n`` is None) such that ``t[L-n:L]``
also occurs as ``t[e-n:e]`` with ``e <= L - 1``: an earlier occurrence, other than the
suffix itself, that is followed by at least one token. When ``n < min_n`` nothing
matches. Among that n's occurrences the one with the largest ``e`` (``"latest"``) or
the smallest ``e`` (``"earliest"``) is chosen, and the draft is ``t[e:e+max_k]``. With
a finite ``max_n`` this is exactly ``ngram_index.longest_match(t, min_n, max_n, ...)``.

The index is a suffix automaton: each state keeps the length of its longest string,
its suffix link and the first and (for ``"latest"``) last end position of its strings;
a cursor follows the state of the current capped match, so ``extend`` costs amortised
O(1) automaton work per token (``"latest"`` also refreshes the last end position of the
cursor's ancestors with length at least ``min_n``: O(1) typically, at most
O(min(max_n, L)) per token) and ``propose`` only copies the draft.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _index_py as _common
from .._guard import READY, begin_init, guard_of
from ._index_py import IndexBase, check_self, index_guard
from ._suffix_tree_py import build_tree
from ._tree_checks import check_tree_args

from .._checks import check_count, token_ids
from ._checks import (
    MAX_SUFFIX_TOKENS,
    UNBOUNDED,
    check_anchor,
    check_draft_limits,
    check_prefer,
    suffix_range,
)

__all__ = ["SuffixIndex", "extend_batch", "propose_batch", "propose_tree_batch", "record_batch", "serve_batch", "serve_batch_lists"]

NAME = "SuffixIndex"  # the guard's refusals name the class

class SuffixIndex(IndexBase):
    """An incremental longest-match index over one request's verified tokens.

    ``extend`` appends tokens (amortised O(1) per token); ``propose(max_k)`` returns, as
    a list, the tokens that followed the chosen (``prefer``: ``"earliest"`` or
    ``"latest"``) earlier occurrence of the longest matching suffix of at least
    ``min_n`` tokens, in O(max_k). ``max_n=None`` puts no cap on the match length. The
    draft length is ``max_k`` or, when that is None, ``draft_len``; with
    ``adaptive=True``, ``record(proposed, accepted)`` lengthens it by 2 after a fully
    accepted draft and shortens it by 1 after a rejection, within
    ``[min_draft, max_draft]``. ``serve`` is one serving step (record, extend, propose).
    A call that meets another changing the index (another thread, a callback) raises
    RuntimeError; an instance made with ``__new__`` (or whose ``__init__`` failed)
    refuses every call, and a second ``__init__`` is refused.

    The anchor (``anchor_n > 0``; off by default): a match of at least ``anchor_n``
    tokens sets the anchor to its continuation; while later matches are shorter, the
    anchor moves one position per appended token, as if the tokens that broke the match
    replaced as many earlier ones (an edit that renames or substitutes), and for up to
    ``anchor_span`` tokens, unless more than ``anchor_misses`` of them differed from the
    anchored text, the draft is taken from the anchor instead of from the short match.
    """

    _NAME = NAME
    _A_NAME = "a SuffixIndex"
    _MAX_TOKENS = MAX_SUFFIX_TOKENS

    def __init__(
        self,
        min_n: object = 1,
        max_n: object = None,
        prefer: object = "earliest",
        *,
        draft_len: object = 8,
        adaptive: object = False,
        min_draft: object = 1,
        max_draft: object = 32,
        anchor_n: object = 0,
        anchor_span: object = 64,
        anchor_misses: object = 4,
    ) -> None:
        check_self(self, SuffixIndex)
        g = begin_init(self, NAME)  # a second __init__ is refused, changing nothing
        self._min_n, self._max_n = suffix_range(min_n, max_n)
        self._anchor_n, self._anchor_span, self._anchor_misses = check_anchor(anchor_n, anchor_span, anchor_misses)
        self._earliest = check_prefer(prefer)
        self._draft_len, self._min_draft, self._max_draft = check_draft_limits(
            draft_len, min_draft, max_draft, MAX_SUFFIX_TOKENS)
        self._adaptive = bool(adaptive)
        self._toks: list[int] = []
        # the automaton: state 0 is the root (the empty string)
        self._slen: list[int] = [0]
        self._link: list[int] = [-1]
        self._first: list[int] = [-1]
        self._lastp: list[int] = [-1]
        self._next: list[dict[int, int]] = [{}]
        self._tail = 0          # the state of the whole history
        self._cursor = 0             # the state of the current (capped) match
        self._match_len = 0             # its length
        self._match_end = -1          # end (exclusive) of the chosen occurrence, -1: none
        self._anchor = -1       # where the last long match's continuation has got to
        self._carry = 0         # tokens appended since the anchor was last set
        self._misses = 0        # of which differed from the anchored text
        self._steps = 0
        self._drafted = 0
        self._accepted = 0
        self._full = 0
        g.end_init()

    # -- configuration ------------------------------------------------------------
    @property
    def min_n(self) -> int:
        index_guard(self, SuffixIndex).check()
        return self._min_n

    @property
    def max_n(self) -> int | None:
        index_guard(self, SuffixIndex).check()
        return None if self._max_n >= UNBOUNDED else self._max_n

    @property
    def prefer(self) -> str:
        index_guard(self, SuffixIndex).check()
        return "earliest" if self._earliest else "latest"

    def last_tokens(self, count: object) -> np.ndarray:
        """The last ``count`` indexed tokens (all when fewer), as a new int64 array."""
        check_self(self, SuffixIndex)
        k = check_count(count, "count")
        g = index_guard(self, SuffixIndex)
        g.read()
        try:
            toks = self._toks
            return np.asarray(toks[len(toks) - k :] if k < len(toks) else toks, dtype=np.int64)
        finally:
            g.done_read()

    @property
    def n_edges(self) -> int:
        """Transitions of the automaton."""
        g = index_guard(self, SuffixIndex)
        g.read()
        try:
            return sum(len(d) for d in self._next)
        finally:
            g.done_read()

    @property
    def n_states(self) -> int:
        """States of the automaton, the root included (at most ``2 * len - 1`` + 1)."""
        index_guard(self, SuffixIndex).check()
        return len(self._slen)

    @property
    def nbytes(self) -> int:
        """Bytes this index holds (Python objects, estimated with ``sys.getsizeof``)."""
        g = index_guard(self, SuffixIndex)
        g.read()
        try:
            total = sum(sys.getsizeof(x) for x in (self._toks, self._slen, self._link, self._first, self._lastp, self._next))
            for d in self._next:
                total += sys.getsizeof(d)
        finally:
            g.done_read()
        return total

    def _extend_list(self, new: list) -> None:
        for c in new:
            self._add(c)

    def _add(self, c: int) -> None:
        toks, slen, link, first, lastp, nxt = (
            self._toks, self._slen, self._link, self._first, self._lastp, self._next
        )
        i = len(toks)
        toks.append(c)
        cur = len(slen)
        slen.append(slen[self._tail] + 1)
        link.append(-1)
        first.append(i)
        lastp.append(i)
        nxt.append({})
        p = self._tail
        while p != -1 and c not in nxt[p]:
            nxt[p][c] = cur
            p = link[p]
        s, n = self._cursor, self._match_len
        if p == -1:
            link[cur] = 0
        else:
            q = nxt[p][c]
            if slen[p] + 1 == slen[q]:
                link[cur] = q
            else:
                clone = len(slen)
                slen.append(slen[p] + 1)
                link.append(link[q])
                first.append(first[q])
                lastp.append(lastp[q])
                nxt.append(dict(nxt[q]))
                while p != -1 and nxt[p].get(c) == q:
                    nxt[p][c] = clone
                    p = link[p]
                link[q] = link[cur] = clone
                if s == q and n <= slen[clone]:
                    s = clone  # the cursor's string moved to the clone
        self._tail = cur
        # the cursor: the longest suffix (at most max_n) with an earlier occurrence
        if self._max_n >= UNBOUNDED:
            s = link[cur]
            n = slen[s]
        else:
            while True:
                q = nxt[s].get(c, -1)
                if q >= 0 and q != cur:
                    s = q
                    n += 1
                    break
                if s == 0:
                    n = 0
                    break
                s = link[s]
                n = slen[s]
            if n > self._max_n:
                n = self._max_n
                if slen[link[s]] >= n:
                    s = link[s]
        self._cursor, self._match_len = s, n
        if n >= self._min_n:
            self._match_end = (first[s] if self._earliest else lastp[s]) + 1
        else:
            self._match_end = -1
        if self._anchor_n:
            if self._match_end >= 0 and n >= self._anchor_n:
                self._anchor = self._match_end
                self._carry = 0
                self._misses = 0
            elif self._anchor >= 0 and self._carry <= self._anchor_span and self._misses <= self._anchor_misses:
                if toks[self._anchor] != c:
                    self._misses += 1
                self._anchor += 1
                self._carry += 1
        if not self._earliest:
            v = s
            lo = self._min_n
            while v > 0 and slen[v] >= lo:
                lastp[v] = i
                v = link[v]

    def match_length(self) -> int:
        """The n of the current match (0 when nothing matches)."""
        index_guard(self, SuffixIndex).check()
        return self._match_len if self._match_end >= 0 else 0

    def lookup(self, context: object, max_k: object = None) -> tuple[int, list]:
        """Match another sequence against the index: the longest suffix of ``context``
        (at least ``min_n``, at most ``max_n`` tokens) that occurs anywhere in the
        indexed tokens, and up to ``max_k`` (``draft_len`` when None) tokens after its
        first occurrence. Returns ``(n, draft)``; ``(0, [])`` when no suffix of at least
        ``min_n`` tokens occurs. O(len(context)) amortised."""
        index_guard(self, SuffixIndex).check()
        kk = None if max_k is None else check_count(max_k, "max_k")
        ctx = token_ids(context, "context").tolist()
        g = index_guard(self, SuffixIndex)
        g.read()
        try:
            return self._lookup(ctx, self._draft_len if kk is None else kk)
        finally:
            g.done_read()

    def _lookup(self, ctx: list, k: int) -> tuple[int, list]:
        slen, link, nxt = self._slen, self._link, self._next
        s = n = 0
        for c in ctx:
            while s and c not in nxt[s]:
                s = link[s]
                n = slen[s]
            q = nxt[s].get(c)
            if q is None:
                s = n = 0
            else:
                s = q
                n += 1
        if n > self._max_n:
            n = self._max_n
            while slen[link[s]] >= n:
                s = link[s]
        if n < self._min_n or n == 0:
            return 0, []
        e = self._first[s] + 1
        return n, (self._toks[e : e + k] if k else [])

    def propose_tree(self, budget: object, max_depth: object = None, max_width: object = None):
        """A tree of drafts: ``(tokens, parents)``, two int64 arrays of at most ``budget``
        nodes, parents before children, ``parents[i]`` the index of node ``i``'s parent
        (``-1``: the current last token), siblings with distinct tokens; expanded
        best-first by estimated probability (the rule: ``specfsm.drafting._suffix_tree_py``),
        at most ``max_depth`` deep (None: ``budget``) and ``max_width`` children per node
        (None: 4). Empty arrays when nothing matches."""
        check_self(self, SuffixIndex)
        b, d, w = check_tree_args(budget, max_depth, max_width)
        g = index_guard(self, SuffixIndex)
        g.read()
        try:
            return build_tree(self._toks, self._tree_contexts(), self._draft_start(), b, d, w, self._earliest)
        finally:
            g.done_read()

    def _tree_contexts(self) -> list:
        """The tree's context lengths, longest first (module docstring of _suffix_tree_py)."""
        if self._match_end < 0:
            return []
        out = [self._match_len]
        lo = max(self._min_n, 1)
        s = self._cursor
        for _ in range(2):
            s = self._link[s]
            if s <= 0 or self._slen[s] < lo:
                break
            out.append(self._slen[s])
        return out

    def _draft_start(self) -> int:
        if self._anchor_n and self._anchor >= 0 and self._carry <= self._anchor_span and self._misses <= self._anchor_misses:
            return self._anchor  # equals _end when the match is at least anchor_n long
        return self._match_end

    def match_end(self) -> int:
        """Where the draft starts: the end (exclusive) of the chosen earlier occurrence,
        or the anchor when it applies; -1 when there is nothing to draft."""
        index_guard(self, SuffixIndex).check()
        return self._draft_start()

    @property
    def anchor_n(self) -> int:
        """Matches at least this long set the anchor (0: no anchor)."""
        index_guard(self, SuffixIndex).check()
        return self._anchor_n

    @property
    def anchor_span(self) -> int:
        """How many tokens past the last long match the anchor keeps drafting."""
        index_guard(self, SuffixIndex).check()
        return self._anchor_span

    @property
    def anchor_misses(self) -> int:
        """How many appended tokens may differ from the anchored text before the anchor
        is dropped."""
        index_guard(self, SuffixIndex).check()
        return self._anchor_misses

    def __repr__(self) -> str:
        if index_guard(self, SuffixIndex).phase != READY:
            return "SuffixIndex(<not initialised or unusable>)"
        hi = None if self._max_n >= UNBOUNDED else self._max_n
        prefer = "earliest" if self._earliest else "latest"
        return f"SuffixIndex(min_n={self._min_n}, max_n={hi}, prefer={prefer!r}, len={len(self._toks)})"

    def __reduce__(self):
        # pickled (and copied) as its settings, tokens and statistics; re-indexed on load
        g = index_guard(self, SuffixIndex)
        g.read()
        try:
            return (
                _rebuild,
                (type(self), self._min_n, None if self._max_n >= UNBOUNDED else self._max_n,
                 "earliest" if self._earliest else "latest", self._draft_len, self._adaptive,
                 self._min_draft, self._max_draft, np.array(self._toks, dtype=np.int64),
                 self._stats_tuple(), self._anchor_n,
                 self._anchor_span, self._anchor_misses),
            )
        finally:
            g.done_read()

def _rebuild(cls, lo, hi, prefer, k, adaptive, kmin, kmax, tokens, stats, an=0, aspan=64, amiss=4):
    if not (isinstance(cls, type) and issubclass(cls, SuffixIndex)):
        raise TypeError(f"cannot rebuild a SuffixIndex as {cls!r}")
    ix = cls(lo, hi, prefer, draft_len=k, adaptive=bool(adaptive), min_draft=kmin,
             max_draft=kmax, anchor_n=an, anchor_span=aspan, anchor_misses=amiss)
    ix.extend(tokens)
    ix._restore_stats(stats)
    return ix




def propose_tree_batch(indexes: object, budget: object, max_depth: object = None, max_width: object = None):
    """``propose_tree`` for B indexes in one call: ``(tokens, parents, offsets)``, int64;
    tree ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` with its parents (local to it,
    ``-1``: its root) in ``parents`` at the same places. Refuses what ``propose_tree``
    refuses and anything but a sequence of this implementation's ``SuffixIndex``; every
    index is counted as read before any tree is built."""
    ixs = _common.index_list(SuffixIndex, indexes)
    b, d, w = check_tree_args(budget, max_depth, max_width)
    marked: list = []
    toks: list = []
    pars: list = []
    off = np.zeros(len(ixs) + 1, dtype=np.int64)
    try:
        for ix in ixs:
            g = guard_of(ix, NAME)
            g.read()
            marked.append(g)
        for i, ix in enumerate(ixs):
            a, p = build_tree(ix._toks, ix._tree_contexts(), ix._draft_start(), b, d, w, ix._earliest)
            toks.extend(a.tolist())
            pars.extend(p.tolist())
            off[i + 1] = len(toks)
    finally:
        for g in marked:
            g.done_read()
    return np.asarray(toks, dtype=np.int64), np.asarray(pars, dtype=np.int64), off


propose_batch, record_batch, extend_batch, serve_batch, serve_batch_lists = _common.batch_calls(SuffixIndex)
