"""Longest-match n-gram drafting and an incremental n-gram index (pure-Python twin).

The compiled module ``specfsm._core.ngram_index`` has the same names and behaviour; both
take their argument checks from ``specfsm._validate``, so both raise the same errors.

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

from ._guard import READY, begin_init, guard_of

from .._validate import (  # noqa: F401  (shared with the compiled module; re-exported)
    GROW_STEP,
    INT64_MAX,
    MAX_INDEX_TOKENS,
    MAX_LEVELS,
    SHRINK_STEP,
    as_ids,
    check_batch_counts,
    check_draft_limits,
    _check_index_range,
    _check_ngram_range,
    _check_offsets,
    check_prefer,
    check_record,
    _check_stats,
    _check_total,
    own_batch_arrays,
    validate_offsets,
    check_count,
)

__all__ = [
    "extend_batch",
    "longest_match",
    "longest_match_batch",
    "NgramIndex",
    "propose_batch",
    "record_batch",
]

_PREFER = ("latest", "earliest")
NAME = "NgramIndex"  # the guard's refusals name the class
# --------------------------------------------------------------------------------------
# argument checks (those shared with the compiled module live in specfsm._validate)
# --------------------------------------------------------------------------------------


def _index_list(indexes: object, cls: type) -> list:
    """The batch's indexes as a list, each an instance of this implementation's class."""
    if isinstance(indexes, cls):
        raise TypeError("indexes must be a sequence of NgramIndex, got a single NgramIndex")
    try:
        out = list(indexes)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            f"indexes must be a sequence of NgramIndex, got {type(indexes).__name__}"
        ) from None
    for i, ix in enumerate(out):
        if not isinstance(ix, cls):
            raise TypeError(
                f"indexes[{i}] must be an NgramIndex of the same implementation, "
                f"got {type(ix).__module__}.{type(ix).__name__}"
            )
    return out


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
    lo, hi = _check_ngram_range(min_n, max_n)
    k = check_count(max_k, "max_k")
    earliest = check_prefer(prefer) == 1
    arr = as_ids(history, "history")
    h = arr.tolist()
    end = -1 if k == 0 else _match_end(h, lo, hi, earliest)
    if isinstance(history, np.ndarray):
        if end < 0:
            return history[:0].copy()
        return history[end : end + k].copy()
    return [] if end < 0 else h[end : end + k]


def longest_match_batch(tokens: object, offsets: object, min_n: object, max_n: object, max_k: object, prefer: object = "latest"):
    """``longest_match`` for B histories stored back to back in one flat array.

    History ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets`` holds B + 1
    nondecreasing boundaries); ``max_k`` is one count or one per request. Returns
    ``(drafts, draft_offsets, lengths)``: draft ``i`` is
    ``drafts[draft_offsets[i]:draft_offsets[i + 1]]`` and has ``lengths[i]`` tokens;
    ``drafts`` has the dtype of ``tokens`` (int32 or int64).
    """
    lo, hi = _check_ngram_range(min_n, max_n)
    earliest = check_prefer(prefer) == 1
    arr = as_ids(tokens, "tokens")
    off = _check_offsets(offsets, arr.shape[0])
    b = off.shape[0] - 1
    ks = check_batch_counts(max_k, b, None)
    flat = arr.tolist()
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


class NgramIndex:
    """An incremental n-gram index over one request's verified tokens.

    ``extend`` appends tokens (amortised O(max_n - min_n + 1) table updates per token);
    ``propose(max_k)`` returns, as a list, exactly what ``longest_match`` returns on
    everything extended so far, in O(max_n - min_n + max_k) whatever the length.
    Drafts are never extended into the index, so a rejected draft needs no undo.

    The draft length is ``max_k`` or, when that is None, ``draft_len``; with
    ``adaptive=True``, ``record(proposed, accepted)`` lengthens it by 2 after a fully
    accepted draft and shortens it by 1 after a rejection, within
    ``[min_draft, max_draft]``. Acceptance statistics are kept either way.
    """

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
        g = begin_init(self, NAME)  # a second __init__ is refused, changing nothing
        self._lo, self._hi = _check_index_range(min_n, max_n)
        self._earliest = check_prefer(prefer) == 1
        self._draft_len, self._min_draft, self._max_draft = check_draft_limits(draft_len, min_draft, max_draft)
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
        # the guard (specfsm._py._guard, the compiled index's protocol): an extend holds
        # the writer flag and refuses to start while readers or another writer are in,
        # a reader refuses to start during an extend, every other call checks it
        g.end_init()

    def _begin_write(self) -> None:
        guard_of(self, NAME).write()

    def _end_write(self) -> None:
        guard_of(self, NAME).done_write()

    def _begin_read(self) -> None:
        guard_of(self, NAME).read()

    def _end_read(self) -> None:
        guard_of(self, NAME).done_read()

    def _check_ready(self) -> None:
        guard_of(self, NAME).check()

    def _hold_guard(self, on: object) -> None:
        """Tests only: take the writer flag as a writer would (refusing like one), or,
        with ``on`` false, release it."""
        if on:
            self._begin_write()
        else:
            self._end_write()

    # -- configuration ------------------------------------------------------------
    @property
    def min_n(self) -> int:
        self._check_ready()
        return self._lo

    @property
    def max_n(self) -> int:
        self._check_ready()
        return self._hi

    @property
    def prefer(self) -> str:
        self._check_ready()
        return "earliest" if self._earliest else "latest"

    @property
    def adaptive(self) -> bool:
        self._check_ready()
        return self._adaptive

    @property
    def draft_len(self) -> int:
        """The draft length ``propose()`` uses when ``max_k`` is None."""
        self._check_ready()
        return self._draft_len

    # -- contents -------------------------------------------------------------------
    def __len__(self) -> int:
        self._check_ready()
        return len(self._toks)

    @property
    def tokens(self) -> np.ndarray:
        """The indexed tokens, as a read-only int64 array."""
        self._begin_read()
        try:
            arr = np.asarray(self._toks, dtype=np.int64)
        finally:
            self._end_read()
        arr.flags.writeable = False
        return arr

    @property
    def nbytes(self) -> int:
        """Bytes this index holds (Python objects, estimated with ``sys.getsizeof``)."""
        self._begin_read()
        try:
            total = sys.getsizeof(self._toks) + sys.getsizeof(self._answers)
            for t in self._tables:
                total += sys.getsizeof(t)
                for key in t:
                    total += sys.getsizeof(key)
        finally:
            self._end_read()
        return total

    @property
    def bytes_per_token(self) -> float:
        """``nbytes`` per indexed token (0.0 while empty)."""
        self._check_ready()
        n = len(self._toks)
        return self.nbytes / n if n else 0.0

    def extend(self, tokens: object) -> None:
        """Append verified tokens (a list, tuple or 1-D integer array) to the index.

        Refuses (RuntimeError) while another extend or a batch proposal uses the index."""
        self._begin_write()
        try:
            self._extend(as_ids(tokens, "tokens").tolist())
        finally:
            self._end_write()

    def _extend(self, new: list) -> None:
        if len(self._toks) + len(new) > MAX_INDEX_TOKENS:
            raise OverflowError(
                f"an NgramIndex holds at most {MAX_INDEX_TOKENS} tokens; "
                f"{len(self._toks)} + {len(new)} is too many"
            )
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

    def append(self, token: object) -> None:
        """Append one verified token."""
        self.extend([token])

    def propose(self, max_k: object = None) -> list:
        """The draft ``longest_match(tokens, min_n, max_n, max_k, prefer)`` gives, as a
        list; ``max_k=None`` uses ``draft_len``."""
        k = None if max_k is None else check_count(max_k, "max_k")
        self._begin_read()
        try:
            if k is None:
                k = self._draft_len
            end = self._end()
            if end < 0 or k == 0:
                return []
            return self._toks[end : end + k]
        finally:
            self._end_read()

    def _end(self) -> int:
        for j in range(self._hi - self._lo, -1, -1):
            if self._answers[j] >= 0:
                return self._answers[j]
        return -1

    def match_length(self) -> int:
        """The n of the current match (0 when nothing matches)."""
        self._begin_read()
        try:
            for j in range(self._hi - self._lo, -1, -1):
                if self._answers[j] >= 0:
                    return self._lo + j
            return 0
        finally:
            self._end_read()

    # -- acceptance statistics and the adaptive draft length ---------------------
    def record(self, proposed: object, accepted: object) -> int:
        """Record that ``accepted`` of ``proposed`` drafted tokens were accepted; returns
        the draft length to use next (changed only when ``adaptive``)."""
        p, a = check_record(proposed, accepted)
        g = guard_of(self, NAME)
        with g._lock:  # check and change at once: records from threads are serialised
            g._check()
            _check_total(self._drafted, p)
            self._record(p, a)
            return self._draft_len

    def _record(self, p: int, a: int) -> None:
        """The change ``record`` makes (its caller holds the guard's lock, checked)."""
        self._steps += 1
        self._drafted += p
        self._accepted += a
        if p > 0 and a == p:
            self._full += 1
        if self._adaptive and p > 0:
            if a == p:
                self._draft_len = min(self._draft_len + GROW_STEP, self._max_draft)
            else:
                self._draft_len = max(self._draft_len - SHRINK_STEP, self._min_draft)

    @property
    def stats(self) -> dict:
        """Acceptance statistics: steps recorded, tokens drafted and accepted, fully
        accepted drafts, the acceptance rate and the current draft length."""
        self._check_ready()
        return {
            "steps": self._steps,
            "drafted": self._drafted,
            "accepted": self._accepted,
            "full_accepts": self._full,
            "acceptance_rate": self._accepted / self._drafted if self._drafted else 0.0,
            "draft_len": self._draft_len,
        }

    def __repr__(self) -> str:
        if guard_of(self, NAME).phase != READY:
            return "NgramIndex(<not initialised>)"
        prefer = "earliest" if self._earliest else "latest"
        return f"NgramIndex(min_n={self._lo}, max_n={self._hi}, prefer={prefer!r}, len={len(self._toks)})"

    def __reduce__(self):
        # pickled (and copied by copy.copy / copy.deepcopy) as its settings, tokens and
        # statistics; unpickling re-indexes the tokens into a new, independent index
        self._begin_read()
        try:
            return (
                _rebuild,
                (type(self), self._lo, self._hi, "earliest" if self._earliest else "latest",
                 self._draft_len, self._adaptive, self._min_draft, self._max_draft,
                 np.asarray(self._toks, dtype=np.int64),
                 (self._steps, self._drafted, self._accepted, self._full)),
            )
        finally:
            self._end_read()

    def _restore_stats(self, stats: object) -> None:
        steps, drafted, accepted, full = _check_stats(stats)
        g = guard_of(self, NAME)
        with g._lock:
            g._check()
            self._steps, self._drafted, self._accepted, self._full = steps, drafted, accepted, full


def _rebuild(cls, lo, hi, prefer, k, adaptive, kmin, kmax, tokens, stats):
    """The unpickler: a new index of class ``cls`` built from checked settings, tokens
    and statistics (made-up statistics are refused)."""
    if not (isinstance(cls, type) and issubclass(cls, NgramIndex)):
        raise TypeError(f"cannot rebuild an NgramIndex as {cls!r}")
    ix = cls(lo, hi, prefer, draft_len=k, adaptive=adaptive, min_draft=kmin, max_draft=kmax)
    ix.extend(tokens)
    ix._restore_stats(stats)
    return ix


def propose_batch(indexes: object, max_k: object = None):
    """``propose`` for B indexes in one call.

    ``max_k`` is one count, one count per index, or None for each index's
    ``draft_len``. Returns ``(drafts, offsets, lengths)`` as ``longest_match_batch``
    does, ``drafts`` being int64.
    """
    index_list = _index_list(indexes, NgramIndex)
    b = len(index_list)
    ks = check_batch_counts(max_k, b, [getattr(ix, "_draft_len", 0) for ix in index_list])
    pieces: list[int] = []
    lengths = np.zeros(b, dtype=np.int64)
    marked = 0
    try:
        for ix in index_list:  # every index marked as read before any is read
            ix._begin_read()
            marked += 1
        for i, ix in enumerate(index_list):
            end = ix._end()
            if end >= 0 and ks[i] > 0:
                piece = ix._toks[end : end + int(ks[i])]
                pieces.extend(piece)
                lengths[i] = len(piece)
    finally:
        for ix in index_list[:marked]:
            ix._end_read()
    off = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return np.asarray(pieces, dtype=np.int64), off, lengths


def record_batch(indexes: object, proposed: object, accepted: object) -> np.ndarray:
    """``record`` for B indexes: ``proposed`` and ``accepted`` hold one count per index.
    Returns the next draft lengths (int64)."""
    index_list = _index_list(indexes, NgramIndex)
    b = len(index_list)
    p = check_batch_counts(proposed, b, None, "proposed")
    a = check_batch_counts(accepted, b, None, "accepted")
    for i in range(b):
        if a[i] > p[i]:
            raise ValueError(f"accepted[{i}]={int(a[i])} is beyond the {int(p[i])} drafted tokens")
    out = np.empty(b, dtype=np.int64)
    guards = [guard_of(ix, NAME) for ix in index_list]
    # all or nothing: each distinct guard's lock, taken in one order (id) so two batches
    # cannot deadlock (no other call holds one lock while waiting for another), then
    # every guard and every total (an index listed twice adds up) checked before any change
    locks = sorted({id(g): g for g in guards}.values(), key=id)
    taken: list = []
    try:
        for g in locks:
            g._lock.acquire()
            taken.append(g)
        for i, g in enumerate(guards):
            try:
                g._check()
            except RuntimeError as exc:
                raise RuntimeError(f"indexes[{i}]: {exc}") from None
        pending: dict = {}
        for i, ix in enumerate(index_list):
            _check_total(ix._drafted + pending.get(id(ix), 0), int(p[i]))
            pending[id(ix)] = pending.get(id(ix), 0) + int(p[i])
        for i, ix in enumerate(index_list):
            ix._record(int(p[i]), int(a[i]))
            out[i] = ix._draft_len
    finally:
        for g in taken:
            g._lock.release()
    return out


def extend_batch(indexes: object, tokens: object, offsets: object) -> None:
    """``extend`` for B indexes in one call: index ``i`` gets
    ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets``: B + 1 nondecreasing
    boundaries). All or nothing: refuses the whole batch, changing no index, when an
    index appears twice (ValueError) or is in use by another call (RuntimeError), or
    when one would exceed its capacity.
    """
    index_list = _index_list(indexes, NgramIndex)
    b = len(index_list)
    src, off = own_batch_arrays(tokens, offsets, b)
    validate_offsets(off, src.shape[0])
    marked: list = []
    seen: set = set()
    try:
        for i, ix in enumerate(index_list):
            if id(ix) in seen:
                raise ValueError(
                    f"indexes[{i}] appears twice in the batch; extend_batch takes each "
                    "index once"
                )
            try:
                ix._begin_write()
            except RuntimeError as exc:
                raise RuntimeError(f"indexes[{i}]: {exc}") from None
            marked.append(ix)
            seen.add(id(ix))
        for i, ix in enumerate(index_list):
            m = int(off[i + 1] - off[i])
            if len(ix._toks) + m > MAX_INDEX_TOKENS:
                raise OverflowError(
                    f"an NgramIndex holds at most {MAX_INDEX_TOKENS} tokens; "
                    f"indexes[{i}] has {len(ix._toks)} + {m}, too many"
                )
        for i, ix in enumerate(index_list):
            ix._extend(src[off[i] : off[i + 1]].tolist())
    finally:
        for ix in marked:
            ix._end_write()
