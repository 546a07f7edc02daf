"""Unbounded longest-match drafting: a suffix-automaton index, batches, a drafter.

``SuffixIndex`` keeps one request's verified tokens in a suffix automaton, so the
longest earlier occurrence of the current suffix (no cap on its length) is known after
every token, at amortised O(1) cost per token; ``propose`` copies the tokens that
followed it, and ``serve`` is one serving step (record the verified draft, extend,
propose within the adaptive limit). ``extend_batch``, ``propose_batch``,
``record_batch`` and ``serve_batch`` serve B indexes per call. ``SuffixDrafter`` plugs
the index into ``specfsm.serving.loop.SpeculativeLoop`` (its sessions call ``serve``).
``SuffixTrie`` counts every suffix of bounded length of several sequences and drafts the
most frequent continuation (the vLLM suffix proposer's counted drafts; ``extend_tries``
and ``speculate_tries`` serve B tries per call). Every
class and function runs on the compiled core, or on its pure-Python twin where that is
not built (``specfsm._impl``, chosen once at import).

The rule: after ``L`` tokens ``t``, the match length ``n`` is the largest
``n <= max_n`` (unbounded when ``max_n`` is None) such that ``t[L-n:L]`` also occurs as
``t[e-n:e]`` with ``e <= L - 1`` (an earlier occurrence, followed by at least one
token); nothing matches when ``n < min_n``. Of that n's occurrences the one with the
largest ``e`` (``prefer="latest"``) or the smallest (``"earliest"``) is chosen and the
draft is ``t[e:e+max_k]``. With a finite ``max_n`` this equals
``specfsm.drafting.ngram_index.longest_match(t, min_n, max_n, max_k, prefer)``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _impl
from .ngram_index import IndexSession
from .._checks import check_count, token_ids

__all__ = [
    "SuffixIndex",
    "SuffixDrafter",
    "SharedSuffixCache",
    "SuffixTrie",
    "extend_tries",
    "speculate_tries",
    "ArcticDrafter",
    "arctic_available",
    "extend_batch",
    "propose_batch",
    "propose_tree_batch",
    "record_batch",
    "serve_batch",
    "serve_batch_lists",
]

if TYPE_CHECKING:  # type checkers read the twin
    from ._suffix_index_py import (SuffixIndex, extend_batch, propose_batch, propose_tree_batch,
                                   record_batch, serve_batch, serve_batch_lists)
    from ._suffix_trie_py import SuffixTrie, extend_tries, speculate_tries
else:  # the active implementation's objects themselves (docstrings: the twin's)
    globals().update(_impl.exports("suffix_index"))
    globals().update(_impl.exports("suffix_trie"))

_SEPARATOR_LIMIT = -(2**63) + 2**48


class SharedSuffixCache:
    """A bounded index over finished requests' outputs, shared by the sessions of one
    or more ``SuffixDrafter``: a request whose own history has no good match drafts
    from what earlier requests produced.

    Outputs are kept in ``generations`` suffix indexes of up to
    ``max_tokens // generations`` tokens each; when the total would pass ``max_tokens``,
    or the outputs kept would pass ``max_requests`` (None: no bound), the least recently
    used generation (the one whose last hit, or creation, is oldest; never the one being
    filled) is dropped whole. An output longer than a generation keeps its last tokens. Every method takes one lock, so any number of threads may
    add and look up at once. ``lookup(context, max_k)`` returns ``(n, draft)``: the
    longest suffix of ``context`` (at least ``min_n`` tokens) found in any kept output
    and the tokens that followed its first occurrence there, within that output.

    Arguments are converted before the lock is taken (a conversion that calls back
    into the cache cannot deadlock it), and a dropped drafter session hands its output
    over without waiting for the lock (the garbage collector may drop it inside a call
    that holds it): the output is queued and indexed by the next call.
    """

    def __init__(self, max_tokens: int = 1 << 20, generations: int = 4, min_n: int = 1,
                 max_requests: int | None = None) -> None:
        self.max_tokens = check_count(max_tokens, "max_tokens")
        self.generations = check_count(generations, "generations")
        self.max_requests = None if max_requests is None else check_count(max_requests, "max_requests")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests must be at least 1 (or None: no bound), got {self.max_requests}")
        if self.generations < 1:
            raise ValueError(f"generations must be at least 1, got {self.generations}")
        if self.max_tokens < 2 * self.generations:
            raise ValueError(f"max_tokens must be at least 2 * generations, got {self.max_tokens}")
        self.min_n = min_n
        SuffixIndex(min_n)  # validate min_n now
        self._per = self.max_tokens // self.generations
        # outputs per generation (a generation is full at this many, or at _per tokens)
        self._per_req = -(-self.max_requests // self.generations) if self.max_requests else 1 << 62
        self._gens: list[list[Any]] = []   # [index, last use, outputs], oldest first
        self._outputs = 0  # outputs the kept generations hold
        self._clock = 0
        self._seq = 0
        self._lock = threading.Lock()
        self._queued: deque[list[int]] = deque()   # outputs handed over without the lock

    def add(self, tokens: Any) -> None:
        """Index one finished output (a sequence or 1-D array of integer ids). Refuses
        ids beyond int64 (OverflowError, as ``SuffixIndex.extend`` does) and ids in the
        separators' range, below ``-(2**63) + 2**48`` (ValueError)."""
        toks = self._convert(tokens)
        with self._lock:
            self._drain()
            self._add(toks)

    def _convert(self, tokens: Any) -> list[int]:
        """``tokens`` as a list of ints, checked (before any lock is taken)."""
        try:
            arr = token_ids(tokens, "tokens")
        except ValueError as exc:  # 2-D, ragged
            raise TypeError(f"tokens must be a 1-D sequence of integer ids ({exc})") from None
        if arr.shape[0] and int(arr.min()) < _SEPARATOR_LIMIT:
            raise ValueError(
                f"tokens holds an id in the separators' range (below -(2**63) + 2**48): "
                f"{int(arr.min())}"
            )
        return arr.tolist()  # type: ignore[no-any-return]

    def _add_queued(self, tokens: list[int]) -> None:
        """Hand an output over without ever waiting for the lock (a session's
        finaliser): queued, and indexed now if the lock is free, else by the next call."""
        self._queued.append(tokens)
        if self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()

    def _drain(self) -> None:
        """Index the queued outputs (the caller holds the lock)."""
        while self._queued:
            try:
                toks = self._queued.popleft()
            except IndexError:  # pragma: no cover - emptied meanwhile
                return
            try:
                self._add(self._convert(toks))
            except (TypeError, ValueError, OverflowError):
                pass  # an output a finaliser handed over that add() would refuse

    def _add(self, toks: list[int]) -> None:
        """Index one converted output (the caller holds the lock)."""
        if not toks:
            return
        toks = toks[-(self._per - 1) :]
        self._clock += 1
        self._seq += 1
        g = self._gens[-1] if self._gens else None
        if g is None or len(g[0]) + len(toks) + 1 > self._per or g[2] >= self._per_req:
            while self._gens and (len(self._gens) + 1) * self._per > self.max_tokens:
                self._drop(range(len(self._gens)))
            g = [SuffixIndex(self.min_n, None, "earliest"), self._clock, 0]
            self._gens.append(g)
        g[0].extend(toks + [-(2**63) + (self._seq % 2**47)])
        g[1] = self._clock
        g[2] += 1
        self._outputs += 1
        if self.max_requests is not None:
            while self._outputs > self.max_requests and len(self._gens) > 1:
                self._drop(range(len(self._gens) - 1))  # (never the one being filled)

    def _drop(self, among: range) -> None:
        """Drop the least recently used generation of ``among`` (the caller holds the lock)."""
        old = min(among, key=lambda i: self._gens[i][1])
        self._outputs -= self._gens[old][2]
        del self._gens[old]

    def lookup(self, context: Any, max_k: int) -> tuple[int, list[Any]]:
        """``(n, draft)`` for the longest suffix of ``context`` in any kept output;
        ``(0, [])`` when none of at least ``min_n`` tokens is found."""
        k = check_count(max_k, "max_k")
        # converted once, into memory of its own, before the lock is taken
        ctx = np.array(token_ids(context, "context"), dtype=np.int64, copy=True)
        best: tuple[int, list[Any]] = (0, [])
        with self._lock:
            self._drain()
            self._clock += 1
            hit = None
            for g in reversed(self._gens):
                n, d = g[0].lookup(ctx, k)
                if n > best[0]:
                    best, hit = (n, d), g
            if hit is not None:
                hit[1] = self._clock
        n, d = best
        for i, t in enumerate(d):
            if t < _SEPARATOR_LIMIT:
                return n, d[:i]
        return n, d

    def __len__(self) -> int:
        with self._lock:
            self._drain()
            return sum(len(g[0]) for g in self._gens)

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept generations' indexes."""
        with self._lock:
            self._drain()
            return sum(g[0].nbytes for g in self._gens)

    def __repr__(self) -> str:
        return (f"SharedSuffixCache(max_tokens={self.max_tokens}, generations={self.generations}, "
                f"min_n={self.min_n}, max_requests={self.max_requests})")


class _SuffixSession(IndexSession):
    """One request's ``SuffixIndex`` session: ``IndexSession``'s, drafting from a shared
    cache of earlier outputs where the request's own match is short; the request's
    output goes into that cache on ``close()`` (or when the session is dropped)."""

    __slots__ = ("shared", "output", "below", "window", "__weakref__")

    def __init__(self, index: Any, prompt: Sequence[Any], shared: Any = None, below: int = 8, window: int = 64) -> None:
        super().__init__(index, prompt)
        self.shared = shared
        self.output: list[Any] | None = [] if shared is not None else None
        self.below = below
        self.window = window

    def extend(self, tokens: Sequence[Any]) -> None:
        super().extend(tokens)
        if self.output is not None:
            self.output.extend(tokens)

    def propose(self, max_k: int) -> list[Any]:
        ix = self.index
        d = ix.serve((), 0, 0, max_k)
        if self.shared is None:
            self.draft = d
            return d
        # the shared cache drafts within the limit serve applied (the index's own draft
        # may be shorter than it)
        k = ix.draft_len if ix.adaptive and ix.draft_len < max_k else max_k
        if k > 0:
            n = ix.match_length()
            if n < self.below and (not d or n < ix.anchor_n or ix.match_end() < 0):
                sn, sd = self.shared.lookup(ix.last_tokens(self.window), k)
                if sn > n and sd:
                    d = sd
        self.draft = d
        return d

    def close(self) -> None:
        """Hand the request's output to the shared cache (once)."""
        out = self.output
        if out is not None and self.shared is not None:
            self.output = None
            if out:
                self.shared.add(out)

    def __del__(self) -> None:
        # never waits for the cache's lock: the garbage collector may run this inside a
        # call that holds it, in this very thread
        try:
            out = self.output
            shared = self.shared
            if out is not None and shared is not None:
                self.output = None
                if out:
                    queue = getattr(shared, "_add_queued", None)
                    if queue is not None:
                        queue(list(out))
                    else:
                        shared.add(out)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class SuffixDrafter:
    """Drafts with ``SuffixIndex(min_n, max_n, prefer)``: the tokens that followed the
    longest earlier occurrence of the history's suffix (prompt and output alike), no
    cap on its length by default. ``adaptive=True`` sizes each draft from the observed
    acceptance (``SuffixIndex`` ``adaptive``, within ``[min_draft, max_draft]``, never
    beyond the loop's ``k``). Sessions hold a ``SuffixIndex`` of the active
    implementation and serve it through ``SuffixIndex.serve``."""

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
        shared: SharedSuffixCache | None = None,
        shared_below: int = 8,
    ) -> None:
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
        SuffixIndex(min_n, max_n, prefer, **self._kw)  # validate the arguments now
        if shared is not None and not callable(getattr(shared, "lookup", None)):
            raise TypeError(f"shared must be a SharedSuffixCache, got {type(shared).__name__}")
        self.shared = shared
        self.shared_below = check_count(shared_below, "shared_below")

    def session(self, prompt: Sequence[Any]) -> _SuffixSession:
        return _SuffixSession(
            SuffixIndex(self.min_n, self.max_n, self.prefer, **self._kw), prompt,
            self.shared, self.shared_below,
        )

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
