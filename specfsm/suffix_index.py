"""Unbounded longest-match drafting: a suffix-automaton index, batches, a drafter.

``SuffixIndex`` keeps one request's verified tokens in a suffix automaton, so the
longest earlier occurrence of the current suffix (no cap on its length) is known after
every token, at amortised O(1) cost per token; ``propose`` copies the tokens that
followed it. ``propose_batch`` and ``record_batch`` serve B indexes per call.
``SuffixDrafter`` plugs the index into ``specfsm.loop.SpeculativeLoop``. Every class and
function runs on the compiled core, or on its pure-Python twin where that is not built
(``specfsm._impl``).

The rule: after ``L`` tokens ``t``, the match length ``n`` is the largest
``n <= max_n`` (unbounded when ``max_n`` is None) such that ``t[L-n:L]`` also occurs as
``t[e-n:e]`` with ``e <= L - 1`` (an earlier occurrence, followed by at least one
token); nothing matches when ``n < min_n``. Of that n's occurrences the one with the
largest ``e`` (``prefer="latest"``) or the smallest (``"earliest"``) is chosen and the
draft is ``t[e:e+max_k]``. With a finite ``max_n`` this equals
``specfsm.ngram_index.longest_match(t, min_n, max_n, max_k, prefer)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _impl
from ._validate import check_count

if TYPE_CHECKING:  # type checkers read the twin
    from ._py import suffix_index as _k
else:
    _k = _impl.load("suffix_index")

__all__ = ["SuffixIndex", "SuffixDrafter", "ArcticDrafter", "arctic_available", "propose_batch", "record_batch"]

#: The index of the active implementation (a class: use it directly).
#:
#: ``SuffixIndex(min_n=1, max_n=None, prefer="earliest", *, draft_len=8, adaptive=False,
#: min_draft=1, max_draft=32)``: ``extend(tokens)`` / ``append(token)`` add verified
#: tokens, ``propose(max_k=None)`` returns the draft as a list, ``match_length()`` the
#: current n, ``match_end()`` where the draft starts. ``len(index)``, ``index.tokens``
#: (read-only int64), ``index.nbytes``, ``index.bytes_per_token`` and
#: ``index.n_states`` report contents and memory. ``record(proposed, accepted)`` keeps
#: acceptance statistics (``index.stats``) and, with ``adaptive=True``, moves
#: ``draft_len`` as ``NgramIndex`` does. ``prefer="latest"`` also refreshes the last
#: position of the match's shorter suffixes on every token: O(1) typically, at most
#: O(min(max_n, L)) per token on one token repeated. Pickles and copies as its settings,
#: tokens and statistics. Under threads (compiled core): an ``extend`` running in one
#: thread makes every other call on the same index raise RuntimeError, and ``extend``
#: refuses to start while a ``propose_batch`` reads the index.
SuffixIndex = _k.SuffixIndex


def propose_batch(indexes: Any, max_k: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``SuffixIndex.propose`` for B indexes in one call (the copy runs without the GIL).

    ``max_k`` is one count, one per index, or None for each index's ``draft_len``.
    Returns ``(drafts, offsets, lengths)``: draft ``i`` is
    ``drafts[offsets[i]:offsets[i + 1]]`` (int64) and holds ``lengths[i]`` tokens.
    Refuses anything but a sequence of this implementation's ``SuffixIndex``.
    """
    return _k.propose_batch(indexes, max_k)


def record_batch(indexes: Any, proposed: Any, accepted: Any) -> np.ndarray:
    """``SuffixIndex.record`` for B indexes; returns each one's next ``draft_len``.
    Refuses ``accepted[i] > proposed[i]``."""
    return _k.record_batch(indexes, proposed, accepted)


class _SuffixSession:
    """One request's index. Acceptance is read off the loop's own calls: the tokens
    passed to ``extend`` after a ``propose`` start with the accepted part of that draft."""

    __slots__ = ("index", "draft", "adaptive")

    def __init__(self, index: Any, prompt: Sequence[Any], adaptive: bool) -> None:
        self.index = index
        self.adaptive = adaptive
        self.draft: list[Any] = []
        if len(prompt):
            index.extend(prompt)

    def extend(self, tokens: Sequence[Any]) -> None:
        d = self.draft
        if d:
            n = 0
            m = min(len(d), len(tokens))
            while n < m and d[n] == tokens[n]:
                n += 1
            self.index.record(len(d), n)
            self.draft = []
        self.index.extend(tokens)

    def propose(self, max_k: int) -> list[Any]:
        ix = self.index
        if self.adaptive:
            k = ix.draft_len
            if max_k < k:
                k = max_k
        else:
            k = max_k
        d = ix.propose(k)
        self.draft = d
        return d


class SuffixDrafter:
    """Drafts with ``SuffixIndex(min_n, max_n, prefer)``: the tokens that followed the
    longest earlier occurrence of the history's suffix (prompt and output alike), no
    cap on its length by default. ``adaptive=True`` sizes each draft from the observed
    acceptance (``SuffixIndex`` ``adaptive``, within ``[min_draft, max_draft]``, never
    beyond the loop's ``k``). ``index_cls`` substitutes another class with the same
    interface (one implementation's kernel)."""

    name = "suffix"

    def __init__(
        self,
        min_n: int = 1,
        max_n: int | None = None,
        prefer: str = "earliest",
        *,
        adaptive: bool = False,
        draft_len: int = 8,
        min_draft: int = 1,
        max_draft: int = 32,
        anchor_n: int = 16,
        anchor_span: int = 64,
        anchor_misses: int = 4,
        index_cls: Any = None,
    ) -> None:
        self._cls = SuffixIndex if index_cls is None else index_cls
        self.min_n = min_n
        self.max_n = max_n
        self.prefer = prefer
        self.adaptive = bool(adaptive)
        self._kw = {
            "draft_len": check_count(draft_len, "draft_len"),
            "adaptive": self.adaptive,
            "min_draft": min_draft,
            "max_draft": max_draft,
            "anchor_n": anchor_n,
            "anchor_span": anchor_span,
            "anchor_misses": anchor_misses,
        }
        self.anchor_n = anchor_n
        self.anchor_span = anchor_span
        self._cls(min_n, max_n, prefer, **self._kw)  # validate the arguments now

    def session(self, prompt: Sequence[Any]) -> _SuffixSession:
        return _SuffixSession(self._cls(self.min_n, self.max_n, self.prefer, **self._kw), prompt, self.adaptive)

    def __repr__(self) -> str:
        return (
            f"SuffixDrafter(min_n={self.min_n}, max_n={self.max_n}, prefer={self.prefer!r}, "
            f"adaptive={self.adaptive}, anchor_n={self.anchor_n}, anchor_span={self.anchor_span})"
        )


# --------------------------------------------------------------------------------------
# Arctic Inference's suffix decoding, as a drafter (optional, for comparisons)
# --------------------------------------------------------------------------------------
def arctic_available() -> bool:
    """Whether ``arctic_inference.suffix_decoding`` (the ``arctic-inference`` package)
    imports, so ``ArcticDrafter`` can be built."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError:
        return False
    return True


class _ArcticSession:
    __slots__ = ("cache", "rid", "hist", "depth", "opts", "__weakref__")

    def __init__(self, cache: Any, rid: int, prompt: Sequence[Any], depth: int, opts: dict) -> None:
        self.cache = cache
        self.rid = rid
        self.depth = depth
        self.opts = opts
        self.hist = [int(t) for t in prompt]
        cache.start_request(rid, self.hist)

    def extend(self, tokens: Sequence[Any]) -> None:
        toks = [int(t) for t in tokens]
        self.hist += toks
        self.cache.add_active_response(self.rid, toks)

    def propose(self, max_k: int) -> list[Any]:
        if max_k <= 0:
            return []
        d = self.cache.speculate(self.rid, self.hist[-self.depth :], max_spec_tokens=max_k, **self.opts)
        return list(d.token_ids[:max_k])

    def close(self) -> None:
        if self.rid in self.cache.active_requests:
            self.cache.stop_request(self.rid)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class ArcticDrafter:
    """Drafts with Snowflake Arctic Inference's ``SuffixDecodingCache`` (vLLM's
    ``suffix`` method): one suffix tree per request's prompt plus a global tree over all
    responses (``max_cached_requests=-1``: unbounded, 0: no global tree), greedy
    frequency-weighted continuation. For comparisons on the same traces; needs
    ``pip install --no-deps arctic-inference`` (ImportError otherwise)."""

    name = "arctic"

    def __init__(
        self,
        max_tree_depth: int = 24,
        max_cached_requests: int = -1,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
    ) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # ImportError when absent

        self.depth = check_count(max_tree_depth, "max_tree_depth")
        self.cache = SuffixDecodingCache(self.depth, max_cached_requests)
        self.opts = {
            "max_spec_factor": float(max_spec_factor),
            "max_spec_offset": float(max_spec_offset),
            "min_token_prob": float(min_token_prob),
        }
        self._next = 0

    def session(self, prompt: Sequence[Any]) -> _ArcticSession:
        self._next += 1
        return _ArcticSession(self.cache, self._next, prompt, self.depth, self.opts)

    def __repr__(self) -> str:
        return f"ArcticDrafter(max_tree_depth={self.depth})"
