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

from .. import _impl

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

if TYPE_CHECKING:  # type checkers read the twin
    from ._ngram_index_py import (NgramIndex, extend_batch, longest_match, longest_match_batch,
                                  propose_batch, record_batch, serve_batch, serve_batch_lists)
else:  # the active implementation's objects themselves (docstrings: the twin's)
    globals().update(_impl.exports("ngram_index"))
_common_prefix = _impl.load("prefix").common_prefix


class IndexSession:
    """One request's index (an ``NgramIndex``, or a ``SuffixIndex`` through its own
    session class), served through the index's ``serve`` (the one step policy):
    ``extend`` records the last draft's agreement with the tokens (``common_prefix``:
    the accepted part comes first) and extends, ``propose`` drafts at most ``max_k`` tokens."""

    __slots__ = ("index", "draft")

    def __init__(self, index: Any, prompt: Sequence[Any]) -> None:
        self.index = index
        self.draft: list[Any] = []
        if len(prompt):
            index.extend(prompt)

    def extend(self, tokens: Sequence[Any]) -> None:
        d = self.draft
        self.index.serve(tokens, len(d), _common_prefix(d, tokens) if d else 0, 0)
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

    def session(self, prompt: Sequence[Any]) -> IndexSession:
        return IndexSession(NgramIndex(self.min_n, self.max_n, self.prefer), prompt)

    def __repr__(self) -> str:
        return f"NgramDrafter(min_n={self.min_n}, max_n={self.max_n}, prefer={self.prefer!r})"
