"""What the two index kinds of the twin share (``NgramIndex``, ``SuffixIndex``): the
guarded reads and writes, acceptance statistics, the adaptive draft length, the serving
step's policy (``serve``), the unpickler's statistics, and the batch calls' argument
readers and all-or-nothing loops.

Every public method checks its ``self`` first (``check_self``, ``index_guard``): called unbound
with an object of another type, it raises TypeError, as the compiled methods do.

Each index class mixes in ``IndexBase`` and supplies its own matching: ``_NAME`` (the
guard's refusals name it), ``_A_NAME`` ("an NgramIndex"), ``_MAX_TOKENS``,
``_extend_list(tokens)`` (index a checked list of ints, the writer flag held) and
``_draft_start()`` (where the next draft starts, -1: nothing to draft). The module
functions take the class as their first argument; each index module binds it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .._guard import Guard, guard_of

from .._checks import check_count, token_ids
from ._checks import (
    GROW_STEP,
    SHRINK_STEP,
    batch_tokens,
    check_batch_counts,
    check_batch_limits,
    check_record,
    check_stats,
    check_total,
    index_offsets,
)

__all__ = ["IndexBase", "index_guard", "check_self", "index_list", "BatchCalls", "batch_calls"]


def check_self(obj: object, cls: type) -> None:
    """A method's ``self``, refused (TypeError) unless its real type is ``cls`` or a
    subclass (an unbound call with another object, or one whose ``__class__`` claims
    ``cls``), as the compiled methods refuse it."""
    if not issubclass(type(obj), cls):
        raise TypeError(
            f"a method of {cls._NAME} needs {cls._A_NAME} of the same implementation, got "  # type: ignore[attr-defined]
            f"{type(obj).__module__}.{type(obj).__name__}"
        )


def index_guard(obj: object, cls: type | None = None) -> Guard:
    """The guard of ``obj``, an index of this implementation (of ``cls`` when given), its
    ``self`` checked first (``check_self``)."""
    check_self(obj, cls or IndexBase)
    return guard_of(obj, obj._NAME)  # type: ignore[attr-defined]


class IndexBase:
    """The guarded machinery of one index (see the module docstring)."""

    _NAME = "index"
    _A_NAME = "an index"
    _MAX_TOKENS = 0
    # set by the subclass's __init__
    _toks: list
    _adaptive: bool
    _draft_len: int
    _min_draft: int
    _max_draft: int
    _steps: int
    _drafted: int
    _accepted: int
    _full: int

    def _extend_list(self, new: list) -> None:  # pragma: no cover - every subclass has one
        raise NotImplementedError

    def _draft_start(self) -> int:  # pragma: no cover - every subclass has one
        raise NotImplementedError

    # -- the guard ------------------------------------------------------------------
    def _hold_guard(self, on: object) -> None:
        """Tests only: take the writer flag as a writer would (refusing like one), or,
        with ``on`` false, release it."""
        index_guard(self).hold(on)

    # -- settings and contents --------------------------------------------------------
    @property
    def adaptive(self) -> bool:
        index_guard(self).check()
        return self._adaptive

    @property
    def draft_len(self) -> int:
        """The draft length ``propose()`` uses when ``max_k`` is None."""
        index_guard(self).check()
        return self._draft_len

    def __len__(self) -> int:
        index_guard(self).check()
        return len(self._toks)

    @property
    def tokens(self) -> np.ndarray:
        """The indexed tokens, as a read-only int64 array."""
        g = index_guard(self)
        g.read()
        try:
            arr = np.asarray(self._toks, dtype=np.int64)
        finally:
            g.done_read()
        arr.flags.writeable = False
        return arr

    @property
    def bytes_per_token(self) -> float:
        """``nbytes`` per indexed token (0.0 while empty)."""
        index_guard(self).check()
        n = len(self._toks)
        return self.nbytes / n if n else 0.0  # type: ignore[attr-defined]

    def _room(self, m: int, i: int | None = None) -> None:
        """Refuses (OverflowError) ``m`` more tokens beyond the index's capacity; ``i``:
        its place in a batch call."""
        have = len(self._toks)
        if have + m > self._MAX_TOKENS:
            if i is None:
                raise OverflowError(
                    f"{self._A_NAME} holds at most {self._MAX_TOKENS} tokens; "
                    f"{have} + {m} is too many"
                )
            raise OverflowError(
                f"{self._A_NAME} holds at most {self._MAX_TOKENS} tokens; "
                f"indexes[{i}] has {have} + {m}, too many"
            )

    # -- writing and drafting ------------------------------------------------------------
    def extend(self, tokens: object) -> None:
        """Append verified tokens (a list, tuple or 1-D integer array) to the index.

        Refuses (RuntimeError) while another call changes the index or a reader that may
        let other threads run (``tokens``, pickling, a batch proposal) is in."""
        g = index_guard(self)
        g.write()
        try:
            new = token_ids(tokens, "tokens").tolist()
            self._room(len(new))
            self._extend_list(new)
        finally:
            g.done_write()

    def append(self, token: object) -> None:
        """Append one verified token."""
        check_self(self, IndexBase)
        self.extend([token])

    def _draft(self, k: int) -> list:
        end = self._draft_start()
        if end < 0 or k == 0:
            return []
        return self._toks[end : end + k]

    def _limit(self, k: int | None) -> int:
        """The serving step's draft limit: ``draft_len`` when ``k`` is None, else ``k``,
        and never beyond ``draft_len`` when adaptive."""
        dl = self._draft_len
        if k is None:
            return dl
        return dl if self._adaptive and dl < k else k

    def propose(self, max_k: object = None) -> list[int]:
        """The next draft, as a list: up to ``max_k`` tokens (``draft_len`` when None)
        that followed the chosen earlier occurrence; empty when nothing matches."""
        check_self(self, IndexBase)
        k = None if max_k is None else check_count(max_k, "max_k")
        g = guard_of(self, self._NAME)
        g.read()
        try:
            return self._draft(self._draft_len if k is None else k)
        finally:
            g.done_read()

    def serve(self, tokens: object, drafted: object = 0, accepted: object = 0, max_k: object = None) -> list:
        """One request's update for one serving step: record the verified draft
        (``record(drafted, accepted)`` when ``drafted > 0``), extend by ``tokens``, and
        return the next draft, ``propose(min(draft_len, max_k))`` when adaptive
        (``max_k=None``: ``draft_len``), else ``propose(max_k)``.

        Every argument is converted and checked first; a refusal (bad arguments, an
        index in use, a full index, a drafted total or step count beyond int64) changes
        nothing."""
        check_self(self, IndexBase)
        # plain ints and an empty list or tuple (a session's propose) skip the converters
        new = [] if (type(tokens) is tuple or type(tokens) is list) and not tokens else token_ids(tokens, "tokens").tolist()
        d = drafted if type(drafted) is int and drafted >= 0 else check_count(drafted, "drafted")
        a = accepted if type(accepted) is int and accepted >= 0 else check_count(accepted, "accepted")
        if a > d:
            raise ValueError(f"accepted={a} is beyond the {d} drafted tokens")
        if max_k is None or (type(max_k) is int and max_k >= 0):
            k = max_k
        else:
            k = check_count(max_k, "max_k")
        g = guard_of(self, self._NAME)
        g.write()
        try:
            self._room(len(new))
            check_total(self._drafted, d, self._steps if d > 0 else None)
            if d > 0:
                self._record(d, a)
            self._extend_list(new)
            return self._draft(self._limit(k))
        finally:
            g.done_write()

    # -- acceptance statistics and the adaptive draft length ---------------------------
    def record(self, proposed: object, accepted: object) -> int:
        """Record that ``accepted`` of ``proposed`` drafted tokens were accepted; returns
        the draft length to use next (changed only when ``adaptive``). Refuses
        (OverflowError, changing nothing) a record that would take the drafted-token
        count or the step count beyond int64."""
        check_self(self, IndexBase)
        p, a = check_record(proposed, accepted)
        g = guard_of(self, self._NAME)
        with g._lock:  # check and change at once: records from threads are serialised
            g._check()
            check_total(self._drafted, p, self._steps)
            self._record(p, a)
            return self._draft_len

    def _record(self, p: int, a: int) -> None:
        """The change ``record`` makes (its caller holds the guard, checked)."""
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
        index_guard(self).check()
        return {
            "steps": self._steps,
            "drafted": self._drafted,
            "accepted": self._accepted,
            "full_accepts": self._full,
            # the two counts as doubles, divided (what the compiled index computes)
            "acceptance_rate": float(self._accepted) / float(self._drafted) if self._drafted else 0.0,
            "draft_len": self._draft_len,
        }

    def _stats_tuple(self) -> tuple[int, int, int, int]:
        return (self._steps, self._drafted, self._accepted, self._full)

    def _restore_stats(self, stats: object) -> None:
        """The unpickler's last step: statistics ``record`` could have produced."""
        check_self(self, IndexBase)
        steps, drafted, accepted, full = check_stats(stats)
        g = guard_of(self, self._NAME)
        with g._lock:
            g._check()
            self._steps, self._drafted, self._accepted, self._full = steps, drafted, accepted, full


# --------------------------------------------------------------------------------------
# batches of indexes
# --------------------------------------------------------------------------------------


def index_list(cls: type, indexes: object) -> list:
    """The batch's indexes as a list, each an instance of this implementation's ``cls``."""
    name, a_name = cls._NAME, cls._A_NAME  # type: ignore[attr-defined]
    # real types, not isinstance: an object whose ``__class__`` claims ``cls`` is not one
    if issubclass(type(indexes), cls):
        raise TypeError(f"indexes must be a sequence of {name}, got a single {name}")
    try:
        out = list(indexes)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"indexes must be a sequence of {name}, got {type(indexes).__name__}") from None
    for i, ix in enumerate(out):
        if not issubclass(type(ix), cls):
            raise TypeError(
                f"indexes[{i}] must be {a_name} of the same implementation, "
                f"got {type(ix).__module__}.{type(ix).__name__}"
            )
    return out


def _pack(drafts: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B drafts as ``(flat int64 tokens, B + 1 offsets, B lengths)``."""
    lengths = np.fromiter(map(len, drafts), dtype=np.int64, count=len(drafts))
    off = np.zeros(len(drafts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return np.asarray([t for d in drafts for t in d], dtype=np.int64), off, lengths


def _propose_batch(cls: type, indexes: object, max_k: object = None):
    """``propose`` for B indexes: every index counted as read before any is looked at
    (its ``draft_len``, the limit for ``max_k=None``, read then)."""
    ixs = index_list(cls, indexes)
    b = len(ixs)
    ks = check_batch_limits(max_k, b)
    drafts: list[list[int]] = []
    marked: list = []
    try:
        for ix in ixs:
            g = guard_of(ix, cls._NAME)  # type: ignore[attr-defined]
            g.read()
            marked.append(g)
        drafts = [ix._draft(ix._draft_len if ks is None else int(ks[i])) for i, ix in enumerate(ixs)]
    finally:
        for g in marked:
            g.done_read()
    return _pack(drafts)


def _record_batch(cls: type, indexes: object, proposed: object, accepted: object) -> np.ndarray:
    """``record`` for B indexes, all or nothing: every index's guard and drafted-token
    total (an index listed twice adds up) checked before any changes."""
    ixs = index_list(cls, indexes)
    b = len(ixs)
    p = check_batch_counts(proposed, b, "proposed")
    a = check_batch_counts(accepted, b, "accepted")
    for i in range(b):
        if a[i] > p[i]:
            raise ValueError(f"accepted[{i}]={int(a[i])} is beyond the {int(p[i])} drafted tokens")
    out = np.empty(b, dtype=np.int64)
    guards = [guard_of(ix, cls._NAME) for ix in ixs]  # type: ignore[attr-defined]
    # each distinct guard's lock, taken in one order (id) so two batches cannot deadlock;
    # no other call holds one lock while waiting for another
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
        steps: dict = {}
        for i, ix in enumerate(ixs):
            check_total(ix._drafted + pending.get(id(ix), 0), int(p[i]), ix._steps + steps.get(id(ix), 0))
            pending[id(ix)] = pending.get(id(ix), 0) + int(p[i])
            steps[id(ix)] = steps.get(id(ix), 0) + 1
        for i, ix in enumerate(ixs):
            ix._record(int(p[i]), int(a[i]))
            out[i] = ix._draft_len
    finally:
        for g in taken:
            g._lock.release()
    return out


def _write_all(cls: type, ixs: list) -> list:
    """The writer flag of every index, all or nothing (an index listed twice is a
    ValueError, one in use a RuntimeError, each naming its place); returns the guards."""
    marked: list = []
    seen: set = set()
    try:
        for i, ix in enumerate(ixs):
            if id(ix) in seen:
                raise ValueError(f"indexes[{i}] appears twice in the batch; a batch call takes each index once")
            g = guard_of(ix, cls._NAME)  # type: ignore[attr-defined]
            try:
                g.write()
            except RuntimeError as exc:
                raise RuntimeError(f"indexes[{i}]: {exc}") from None
            marked.append(g)
            seen.add(id(ix))
    except BaseException:
        for g in marked:
            g.done_write()
        raise
    return marked


def _extend_batch(cls: type, indexes: object, tokens: object, offsets: object) -> None:
    """``extend`` for B indexes, all or nothing (see the index modules)."""
    ixs = index_list(cls, indexes)
    b = len(ixs)
    src, off = batch_tokens(tokens, offsets, b)
    index_offsets(off, src.shape[0])
    marked = _write_all(cls, ixs)
    try:
        for i, ix in enumerate(ixs):
            ix._room(int(off[i + 1] - off[i]), i)
        for i, ix in enumerate(ixs):
            ix._extend_list(src[off[i] : off[i + 1]].tolist())
    finally:
        for g in marked:
            g.done_write()


def _serve_batch(cls: type, indexes: object, tokens: object, offsets: object, drafted: object,
                accepted: object, max_k: object = None):
    """``serve`` for B distinct indexes in one call, all or nothing: index ``i`` records
    ``(drafted[i], accepted[i])`` when ``drafted[i] > 0``, is extended by
    ``tokens[offsets[i]:offsets[i + 1]]`` and proposes its next draft, limited by
    ``max_k`` (one count, one per index, or None) as ``serve`` limits it. Returns
    ``propose_batch``'s ``(drafts, offsets, lengths)``."""
    ixs = index_list(cls, indexes)
    b = len(ixs)
    src, off = batch_tokens(tokens, offsets, b)
    index_offsets(off, src.shape[0])
    d = check_batch_counts(drafted, b, "drafted")
    a = check_batch_counts(accepted, b, "accepted")
    for i in range(b):
        if a[i] > d[i]:
            raise ValueError(f"accepted[{i}]={int(a[i])} is beyond the {int(d[i])} drafted tokens")
    ks = check_batch_limits(max_k, b)
    marked = _write_all(cls, ixs)
    try:
        for i, ix in enumerate(ixs):
            ix._room(int(off[i + 1] - off[i]), i)
            try:
                check_total(ix._drafted, int(d[i]), ix._steps if d[i] > 0 else None)
            except OverflowError as exc:
                raise OverflowError(f"indexes[{i}]: {exc}") from None
        drafts: list[list[int]] = []
        for i, ix in enumerate(ixs):
            if d[i] > 0:
                ix._record(int(d[i]), int(a[i]))
            ix._extend_list(src[off[i] : off[i + 1]].tolist())
            drafts.append(ix._draft(ix._limit(None if ks is None else int(ks[i]))))
    finally:
        for g in marked:
            g.done_write()
    return _pack(drafts)


def _serve_batch_lists(cls: type, indexes: object, tokens: object, offsets: object, drafted: object,
                      accepted: object, max_k: object = None) -> list[list[int]]:
    """``serve_batch``, each index's draft as a list of ints (one list per index)."""
    drafts, off, _ = _serve_batch(cls, indexes, tokens, offsets, drafted, accepted, max_k)
    flat = drafts.tolist()
    o = off.tolist()
    return [flat[o[i] : o[i + 1]] for i in range(len(o) - 1)]


class BatchCalls(NamedTuple):
    """One index kind's five batch calls, as ``batch_calls`` binds them."""

    propose_batch: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]
    record_batch: Callable[..., np.ndarray]
    extend_batch: Callable[..., None]
    serve_batch: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]
    serve_batch_lists: Callable[..., list[list[int]]]


def batch_calls(cls: type) -> BatchCalls:
    """The batch calls of the index class ``cls``, each documented once, here, for both
    index kinds (and, through ``specfsm._impl``, for the compiled ones)."""

    def propose_batch(indexes: object, max_k: object = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``propose`` for B indexes in one call (the compiled core copies the drafts
        without the GIL). ``max_k`` is one count, one per index, or None for each
        index's own ``draft_len``. Returns ``(drafts, offsets, lengths)``: draft ``i`` is
        ``drafts[offsets[i]:offsets[i + 1]]`` (int64) and holds ``lengths[i]`` tokens.
        Every index is counted as read before any is looked at; refuses anything but a
        sequence of this implementation's indexes of this kind."""
        return _propose_batch(cls, indexes, max_k)

    def record_batch(indexes: object, proposed: object, accepted: object) -> np.ndarray:
        """``record`` for B indexes: ``proposed[i]`` drafted tokens of which
        ``accepted[i]`` were accepted. Returns each index's next ``draft_len`` (int64).
        All or nothing: every index's guard and drafted-token total (an index listed
        twice adds up) is checked before any changes; refuses ``accepted[i] >
        proposed[i]`` and counts or totals beyond int64 (OverflowError)."""
        return _record_batch(cls, indexes, proposed, accepted)

    def extend_batch(indexes: object, tokens: object, offsets: object) -> None:
        """``extend`` for B indexes in one call: index ``i`` gets
        ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets``: B + 1 nondecreasing
        boundaries, ``tokens`` one flat list or 1-D integer array). The compiled core
        indexes the whole batch without the GIL, overlapping the memory misses of
        different indexes. All or nothing: an index that appears twice (ValueError), is
        in use by another call (RuntimeError) or would exceed its capacity
        (OverflowError) refuses the whole batch and changes no index."""
        _extend_batch(cls, indexes, tokens, offsets)

    def serve_batch(indexes: object, tokens: object, offsets: object, drafted: object,
                    accepted: object, max_k: object = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``serve`` for B distinct indexes in one call (one serving step of B requests):
        index ``i`` records ``(drafted[i], accepted[i])`` when ``drafted[i] > 0``, is
        extended by ``tokens[offsets[i]:offsets[i + 1]]`` and proposes its next draft
        (``max_k``: one count, one per index, or None, limited as ``serve`` limits it).
        Returns ``propose_batch``'s ``(drafts, offsets, lengths)``. All or nothing: an
        index listed twice (ValueError), in use (RuntimeError), full, or whose drafted
        total or step count would pass int64 (OverflowError) refuses the whole batch."""
        return _serve_batch(cls, indexes, tokens, offsets, drafted, accepted, max_k)

    def serve_batch_lists(indexes: object, tokens: object, offsets: object, drafted: object,
                          accepted: object, max_k: object = None) -> list[list[int]]:
        """``serve_batch`` with each index's draft as a list of ints, one list per index
        (what vLLM's proposer interface returns; the compiled core builds the lists
        straight from its drafts). Refuses what ``serve_batch`` refuses."""
        return _serve_batch_lists(cls, indexes, tokens, offsets, drafted, accepted, max_k)

    calls = BatchCalls(propose_batch, record_batch, extend_batch, serve_batch, serve_batch_lists)
    for f in calls:  # named as the kind's module's own functions
        f.__module__, f.__qualname__ = cls.__module__, f.__name__
    return calls
