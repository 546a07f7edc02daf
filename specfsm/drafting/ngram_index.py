"""N-gram drafting at any context length: longest match, an incremental index, batches.

``longest_match`` rescans a history (O(L) per call, vectorised); ``NgramIndex`` keeps
one request's verified tokens indexed so that each proposal costs the same at 1k tokens
as at 1M, and ``NgramIndex.serve`` is one serving step (record, extend, propose);
``propose_batch``, ``extend_batch``, ``record_batch``, ``serve_batch`` and
``longest_match_batch`` serve B requests per call (the compiled core releases the GIL
for the whole batch); ``NgramDrafter`` is the index as a drafter of ``specfsm.serving.loop``
(one session per request, served through ``serve``). The stateless functions
are safe from any number of threads: they copy the control arrays they are given
(offsets, counts) before checking them and read caller token arrays only within the
checked bounds, so another thread changing those arrays mid-call can at worst change
the answer. Every function runs on the compiled core, or on
its pure-Python twin where that is not built (``specfsm._impl``).

The rule, shared by all of them: for n from ``max_n`` down to ``min_n``, the first n for
which the history's last n tokens occur earlier (an occurrence starting before
``len - n``) is chosen; among that n's occurrences the most recent
(``prefer="latest"``; with ``min_n == max_n`` exactly ``prompt_lookup``) or the first
(``prefer="earliest"``, vLLM's choice) is taken; the draft is up to ``max_k`` tokens that
followed it, and is empty when nothing matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _impl

if TYPE_CHECKING:  # type checkers read the twin
    from . import _ngram_index_py as _active
else:
    _active = _impl.load("ngram_index")

__all__ = [
    "NgramDrafter",
    "NgramIndex",
    "extend_batch",
    "longest_match",
    "longest_match_batch",
    "propose_batch",
    "record_batch",
    "serve_batch",
    "serve_batch_lists",
]

#: The incremental index of the active implementation (a class: use it directly).
#:
#: ``NgramIndex(min_n, max_n=None, prefer="latest", *, draft_len=4, adaptive=False,
#: min_draft=1, max_draft=16)`` indexes one request's verified tokens: ``extend(tokens)``
#: appends them (amortised O(max_n - min_n + 1) work per token), ``propose(max_k=None)``
#: returns as a list exactly what ``longest_match`` gives on everything extended so far,
#: in O(max_n - min_n + max_k) whatever the length. ``max_n=None`` means ``min_n``. Drafts
#: are never extended into the index, so a rejected draft needs no undo. ``len(index)``,
#: ``index.tokens`` (a read-only int64 view), ``index.nbytes`` and
#: ``index.bytes_per_token`` report its contents and memory (the compiled index holds
#: 8 bytes per token plus one 8-byte hash slot per distinct n-gram and n, at a load
#: factor between 1/3 and 2/3). ``record(proposed, accepted)`` keeps acceptance
#: statistics (``index.stats``) and, with ``adaptive=True``, lengthens ``draft_len`` by
#: 2 after a fully accepted draft and shortens it by 1 after a rejection, within
#: ``[min_draft, max_draft]`` (lengths beyond ``MAX_INDEX_TOKENS``, the longest possible
#: draft, are stored as it); ``record`` refuses (OverflowError, changing nothing) a
#: drafted total or a step count beyond int64. ``serve(tokens, drafted=0, accepted=0, max_k=None)`` is
#: one serving step: ``record(drafted, accepted)`` when ``drafted > 0``,
#: ``extend(tokens)``, then the next draft, ``propose(min(draft_len, max_k))`` when
#: adaptive (``max_k=None``: ``draft_len``), else ``propose(max_k)``; it checks every
#: argument first and a refusal changes nothing (it is a writer, as ``extend`` is).
#: Refuses ``min_n < 1``, ``min_n > max_n``, unknown
#: ``prefer`` values, non-integer or 2-D tokens and ids beyond int64.
#:
#: Under threads, and from callbacks inside a call (both implementations, one guard
#: protocol): an ``extend``/``append`` (or an ``extend_batch`` holding the index) is
#: refused with RuntimeError while another one runs on the same index or a
#: ``propose_batch`` or pickling reads it; every other method and property (``propose``,
#: ``match_length``, ``len``, ``tokens``, ``nbytes``, ``stats``, ``record``, pickling, the
#: settings) is refused with RuntimeError while an extend runs, and they run
#: concurrently with each other freely (``record``/``record_batch`` serialised, never
#: refused by each other; ``record_batch`` all or nothing). An index made with
#: ``__new__`` (or whose ``__init__`` failed) refuses every call; a second ``__init__``
#: is refused. A refused call changes nothing. ``copy.copy``,
#: ``copy.deepcopy`` and pickling give an independent index; unpickling refuses
#: statistics ``record`` could not have produced.
NgramIndex = _active.NgramIndex


def longest_match(history: Any, min_n: int, max_n: int, max_k: int, prefer: str = "latest") -> Any:
    """Draft up to ``max_k`` tokens that followed the longest (``max_n`` down to ``min_n``)
    earlier occurrence of ``history``'s last tokens, taking that n's latest occurrence
    (``prefer="latest"``) or its first (``"earliest"``).

    ``history`` is a list or tuple of integer ids or a 1-D integer numpy array; a numpy
    history gives a numpy draft of its dtype, anything else a list. O(len(history)) per
    call (use ``NgramIndex`` to draft repeatedly from a growing history). Refuses
    ``min_n < 1``, ``min_n > max_n``, negative ``max_k``, non-integer or 2-D input and ids
    beyond int64.
    """
    return _active.longest_match(history, min_n, max_n, max_k, prefer)


def longest_match_batch(
    tokens: Any, offsets: Any, min_n: int, max_n: int, max_k: Any, prefer: str = "latest"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``longest_match`` for B histories stored back to back in one flat array.

    History ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets``: B + 1
    nondecreasing boundaries); ``max_k`` is one count or one per request. Returns
    ``(drafts, draft_offsets, lengths)``: draft ``i`` is
    ``drafts[draft_offsets[i]:draft_offsets[i + 1]]`` and holds ``lengths[i]`` tokens,
    in the dtype of ``tokens``. The compiled core runs the whole batch without the GIL.
    """
    return _active.longest_match_batch(tokens, offsets, min_n, max_n, max_k, prefer)


def extend_batch(indexes: Any, tokens: Any, offsets: Any) -> None:
    """``NgramIndex.extend`` for B indexes in one call: ``indexes[i]`` gets
    ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets``: B + 1 nondecreasing boundaries,
    ``tokens`` one flat list or 1-D integer array). The compiled core indexes the whole
    batch without the GIL, overlapping the hash-table cache misses of different
    requests (software prefetch), so a step's few accepted tokens per request cost far
    less than a loop of ``extend`` calls. All or nothing: an index that appears twice
    (ValueError), is being extended or read by another call (RuntimeError), or would
    exceed its capacity (OverflowError) refuses the whole batch and changes no index.
    """
    _active.extend_batch(indexes, tokens, offsets)


def propose_batch(indexes: Any, max_k: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``NgramIndex.propose`` for B indexes in one call (the GIL released for the batch).

    ``max_k`` is one count, one count per index, or None for each index's own
    ``draft_len``. Returns ``(drafts, offsets, lengths)`` as ``longest_match_batch`` does,
    ``drafts`` being int64. Refuses anything but a sequence of this implementation's
    ``NgramIndex``.
    """
    return _active.propose_batch(indexes, max_k)


def record_batch(indexes: Any, proposed: Any, accepted: Any) -> np.ndarray:
    """``NgramIndex.record`` for B indexes: ``proposed[i]`` drafted tokens of which
    ``accepted[i]`` were accepted. Returns each index's next ``draft_len`` (int64).
    Refuses ``accepted[i] > proposed[i]`` and, changing nothing, counts or totals beyond
    int64 (OverflowError)."""
    return _active.record_batch(indexes, proposed, accepted)


def serve_batch(
    indexes: Any, tokens: Any, offsets: Any, drafted: Any, accepted: Any, max_k: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``NgramIndex.serve`` for B distinct indexes in one call (one serving step of B
    requests): index ``i`` records ``(drafted[i], accepted[i])`` when ``drafted[i] > 0``,
    is extended by ``tokens[offsets[i]:offsets[i + 1]]`` and proposes its next draft
    (``max_k``: one count, one per index, or None, limited as ``serve`` limits it).
    Returns ``propose_batch``'s ``(drafts, offsets, lengths)``. All or nothing: an index
    listed twice (ValueError), in use (RuntimeError), full or whose drafted total or
    step count would pass int64 (OverflowError) refuses the whole batch and changes no index."""
    return _active.serve_batch(indexes, tokens, offsets, drafted, accepted, max_k)


def serve_batch_lists(
    indexes: Any, tokens: Any, offsets: Any, drafted: Any, accepted: Any, max_k: Any = None
) -> list[list[int]]:
    """``serve_batch`` with each index's draft as a list of ints, one list per index
    (what vLLM's proposer interface returns), for a caller that would otherwise split
    ``(drafts, offsets, lengths)`` itself (the compiled core builds the lists straight
    from its drafts, with no flat array in between). Refuses what ``serve_batch``
    refuses."""
    return _active.serve_batch_lists(indexes, tokens, offsets, drafted, accepted, max_k)


class _NgramSession:
    """One request's index, served through ``NgramIndex.serve`` (the one step policy):
    ``extend`` records the last draft's agreement with the tokens (the accepted part
    comes first) and extends, ``propose`` drafts at most ``max_k`` tokens."""

    __slots__ = ("index", "draft")

    def __init__(self, index: Any, prompt: Sequence[Any]) -> None:
        self.index = index
        self.draft: list[Any] = []
        if len(prompt):
            index.extend(prompt)

    def extend(self, tokens: Sequence[Any]) -> None:
        d = self.draft
        n = 0
        if d:
            m = min(len(d), len(tokens))
            while n < m and d[n] == tokens[n]:
                n += 1
        self.index.serve(tokens, len(d), n, 0)
        self.draft = []

    def propose(self, max_k: int) -> Any:
        d = self.index.serve((), 0, 0, max_k)
        self.draft = d
        return d


class NgramDrafter:
    """Drafts with ``NgramIndex(min_n, max_n, prefer)`` from ``specfsm.drafting.ngram_index``: the
    longest suffix match from ``max_n`` down to ``min_n``, in time independent of the
    history length (``min_n == max_n`` with ``prefer="latest"`` drafts exactly what
    ``PromptLookupDrafter(min_n)`` does). Sessions hold an ``NgramIndex`` of the active
    implementation and serve it through ``NgramIndex.serve``."""

    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int | None = None, prefer: str = "latest") -> None:
        self.min_n = min_n
        self.max_n = min_n if max_n is None else max_n
        self.prefer = prefer
        NgramIndex(self.min_n, self.max_n, prefer)  # validate the arguments now

    def session(self, prompt: Sequence[Any]) -> _NgramSession:
        return _NgramSession(NgramIndex(self.min_n, self.max_n, self.prefer), prompt)

    def __repr__(self) -> str:
        return f"NgramDrafter(min_n={self.min_n}, max_n={self.max_n}, prefer={self.prefer!r})"
