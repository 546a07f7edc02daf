"""Longest-match n-gram drafting and an incremental n-gram index (pure-Python twin).

The compiled module ``specfsm._core.ngram_index`` has the same names and behaviour; both
take their argument checks from ``specfsm._checks`` and the concept's check module, so both raise the same errors.

Semantics (both implementations). For a history ``h`` of length ``L``, n runs from
``max_n`` down to ``min_n``; the first n for which the last n tokens occur earlier (an
occurrence starting before ``L - n``) is chosen. Among that n's occurrences the most
recent one (``prefer="latest"``) or the first one (``prefer="earliest"``) is taken, and
the draft is up to ``max_k`` tokens that followed it. The draft is empty when nothing
matches or ``max_k`` is 0.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _index_py as _common
from .._guard import READY, begin_init
from ._index_py import IndexBase, check_self, index_guard

from .._checks import check_count, token_ids
from ._checks import (
    MAX_INDEX_TOKENS,
    batch_offsets,
    check_batch_limits,
    check_draft_limits,
    check_prefer,
    index_offsets,
    index_range,
    ngram_range,
)

__all__ = [
    "extend_batch",
    "longest_match",
    "longest_match_batch",
    "NgramIndex",
    "propose_batch",
    "record_batch",
    "serve_batch",
    "serve_batch_lists",
]

NAME = "NgramIndex"  # the guard's refusals name the class


# --------------------------------------------------------------------------------------
# stateless longest match
# --------------------------------------------------------------------------------------


def _match_end(h: list, lo: int, hi: int, earliest: bool) -> int:
    """End (exclusive) of the chosen earlier occurrence, or -1 (plain twin scan)."""
    L = len(h)
    for n in range(min(hi, L - 1), lo - 1, -1):
        needle = h[L - n :]
        starts = range(0, L - n) if earliest else range(L - n - 1, -1, -1)
        for s in starts:
            if h[s : s + n] == needle:
                return s + n
    return -1


def longest_match(history: object, min_n: object, max_n: object, max_k: object, prefer: object = "latest"):
    """Draft up to ``max_k`` tokens that followed the longest (``max_n`` down to
    ``min_n``) earlier occurrence of ``history``'s last tokens.

    ``prefer`` picks that n's most recent occurrence (``"latest"``; with
    ``min_n == max_n`` this is ``prompt_lookup``) or its first (``"earliest"``). A numpy
    ``history`` gives a numpy draft of the same dtype, a list or tuple gives a list.
    """
    lo, hi = ngram_range(min_n, max_n)
    k = check_count(max_k, "max_k")
    earliest = check_prefer(prefer) == 1
    # the history last, read once; the draft is cut from what was read (in the
    # history's dtype for an array), never by indexing ``history`` again
    dt = history.dtype if isinstance(history, np.ndarray) else None
    arr = token_ids(history, "history")
    h = arr.tolist()
    end = -1 if k == 0 else _match_end(h, lo, hi, earliest)
    piece = [] if end < 0 else h[end : end + k]
    if dt is not None:
        return np.array(piece, dtype=arr.dtype).astype(dt)
    return piece


def longest_match_batch(tokens: object, offsets: object, min_n: object, max_n: object, max_k: object, prefer: object = "latest"):
    """``longest_match`` for B histories stored back to back in one flat array.

    History ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets`` holds B + 1
    nondecreasing boundaries); ``max_k`` is one count or one per request. Returns
    ``(drafts, draft_offsets, lengths)``: draft ``i`` is
    ``drafts[draft_offsets[i]:draft_offsets[i + 1]]`` and has ``lengths[i]`` tokens;
    ``drafts`` has the dtype of ``tokens`` (int32 or int64).
    """
    lo, hi = ngram_range(min_n, max_n)
    earliest = check_prefer(prefer) == 1
    # the control arrays first, the tokens last (as the compiled module, which reads
    # them in place): no conversion runs after the tokens are read, once
    off = batch_offsets(offsets)
    b = off.shape[0] - 1
    ks = check_batch_limits(max_k, b, False)
    arr = token_ids(tokens, "tokens")
    flat = arr.tolist()
    index_offsets(off, len(flat))
    pieces: list[int] = []
    lengths = np.zeros(b, dtype=np.int64)
    for i in range(b):
        h = flat[off[i] : off[i + 1]]
        end = -1 if ks[i] == 0 else _match_end(h, lo, hi, earliest)
        piece = [] if end < 0 else h[end : end + int(ks[i])]
        pieces.extend(piece)
        lengths[i] = len(piece)
    out_off = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_off[1:])
    return np.asarray(pieces, dtype=arr.dtype), out_off, lengths


# --------------------------------------------------------------------------------------
# the incremental index
# --------------------------------------------------------------------------------------


class NgramIndex(IndexBase):
    """An incremental n-gram index over one request's verified tokens.

    It drafts from the longest n-gram of the last tokens, ``min_n <= n <= max_n``
    (``max_n=None``: ``min_n``), that occurred before, copying what followed its
    ``"latest"`` or ``"earliest"`` earlier occurrence (``prefer``). ``extend`` appends
    tokens (amortised O(max_n - min_n + 1) table updates per token); ``propose(max_k)``
    returns, as a list, exactly what ``longest_match`` returns on everything extended so
    far, in O(max_n - min_n + max_k) whatever the length. Drafts are never extended into
    the index, so a rejected draft needs no undo.

    The draft length is ``max_k`` or, when that is None, ``draft_len``; with
    ``adaptive=True``, ``record(proposed, accepted)`` lengthens it by 2 after a fully
    accepted draft and shortens it by 1 after a rejection, within
    ``[min_draft, max_draft]``. Acceptance statistics are kept either way. ``serve``
    is one serving step (record, extend, propose). A call that meets another changing
    the index (another thread, a callback) raises RuntimeError; an instance made with
    ``__new__`` (or whose ``__init__`` failed) refuses every call, and a second
    ``__init__`` is refused.
    """

    _NAME = NAME
    _A_NAME = "an NgramIndex"
    _MAX_TOKENS = MAX_INDEX_TOKENS

    def __init__(
        self,
        min_n: object,
        max_n: object = None,
        prefer: object = "latest",
        *,
        draft_len: object = 4,
        adaptive: object = False,
        min_draft: object = 1,
        max_draft: object = 16,
    ) -> None:
        check_self(self, NgramIndex)
        g = begin_init(self, NAME)  # a second __init__ is refused, changing nothing
        self._lo, self._hi = index_range(min_n, max_n)
        self._earliest = check_prefer(prefer) == 1
        self._draft_len, self._min_draft, self._max_draft = check_draft_limits(
            draft_len, min_draft, max_draft, MAX_INDEX_TOKENS)
        self._adaptive = bool(adaptive)
        self._toks: list[int] = []
        # level j holds (min_n + j)-grams: tuple of tokens -> end of the latest/first one
        self._tables: list[dict[tuple, int]] = [{} for _ in range(self._hi - self._lo + 1)]
        # for the current suffix: per level, end of the chosen earlier occurrence or -1
        self._answers: list[int] = [-1] * (self._hi - self._lo + 1)
        self._steps = 0
        self._drafted = 0
        self._accepted = 0
        self._full = 0
        g.end_init()

    # -- configuration ------------------------------------------------------------
    @property
    def min_n(self) -> int:
        index_guard(self, NgramIndex).check()
        return self._lo

    @property
    def max_n(self) -> int:
        index_guard(self, NgramIndex).check()
        return self._hi

    @property
    def prefer(self) -> str:
        index_guard(self, NgramIndex).check()
        return "earliest" if self._earliest else "latest"

    # -- contents -------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes this index holds (Python objects, estimated with ``sys.getsizeof``)."""
        g = index_guard(self, NgramIndex)
        g.read()
        try:
            total = sys.getsizeof(self._toks) + sys.getsizeof(self._answers)
            for t in self._tables:
                total += sys.getsizeof(t)
                for key in t:
                    total += sys.getsizeof(key)
        finally:
            g.done_read()
        return total

    def _extend_list(self, new: list) -> None:
        toks = self._toks
        lo, hi, earliest = self._lo, self._hi, self._earliest
        answers, tables = self._answers, self._tables
        for t in new:
            toks.append(t)
            L = len(toks)
            for n in range(lo, hi + 1):
                j = n - lo
                if n > L:
                    answers[j] = -1
                    continue
                key = tuple(toks[L - n :])
                table = tables[j]
                prev = table.get(key, -1)
                answers[j] = prev
                if prev < 0 or not earliest:
                    table[key] = L

    def _draft_start(self) -> int:
        for j in range(self._hi - self._lo, -1, -1):
            if self._answers[j] >= 0:
                return self._answers[j]
        return -1

    def match_length(self) -> int:
        """The n of the current match (0 when nothing matches)."""
        g = index_guard(self, NgramIndex)
        g.read()
        try:
            for j in range(self._hi - self._lo, -1, -1):
                if self._answers[j] >= 0:
                    return self._lo + j
            return 0
        finally:
            g.done_read()

    def __repr__(self) -> str:
        if index_guard(self, NgramIndex).phase != READY:
            return "NgramIndex(<not initialised>)"
        prefer = "earliest" if self._earliest else "latest"
        return f"NgramIndex(min_n={self._lo}, max_n={self._hi}, prefer={prefer!r}, len={len(self._toks)})"

    def __reduce__(self):
        # pickled (and copied by copy.copy / copy.deepcopy) as its settings, tokens and
        # statistics; unpickling re-indexes the tokens into a new, independent index
        g = index_guard(self, NgramIndex)
        g.read()
        try:
            return (
                _rebuild,
                (type(self), self._lo, self._hi, "earliest" if self._earliest else "latest",
                 self._draft_len, self._adaptive, self._min_draft, self._max_draft,
                 np.asarray(self._toks, dtype=np.int64), self._stats_tuple()),
            )
        finally:
            g.done_read()


def _rebuild(cls, lo, hi, prefer, k, adaptive, kmin, kmax, tokens, stats):
    """The unpickler: a new index of class ``cls`` built from checked settings, tokens
    and statistics (made-up statistics are refused)."""
    if not (isinstance(cls, type) and issubclass(cls, NgramIndex)):
        raise TypeError(f"cannot rebuild an NgramIndex as {cls!r}")
    ix = cls(lo, hi, prefer, draft_len=k, adaptive=adaptive, min_draft=kmin, max_draft=kmax)
    ix.extend(tokens)
    ix._restore_stats(stats)
    return ix


propose_batch, record_batch, extend_batch, serve_batch, serve_batch_lists = _common.batch_calls(NgramIndex)
