"""The two proposers vLLM loads by class path: ``SpecfsmNgramProposer`` (over
``specfsm.NgramIndex``) and ``SpecfsmSuffixProposer`` (over ``specfsm.SuffixIndex``):
their settings, and their index kind's one serving-step policy (``serve`` /
``serve_batch``: extend by the step's tokens, then propose), which every step calls.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..drafting import ngram_index, suffix_index
from ..drafting._checks import check_min_prob, check_trie_depth
from .rows import RowTrackingProposer
from .._checks import check_count, nonnegative_real
from .settings import INDEX_SETTINGS, RANGE_SOURCES, SETTINGS, additional_settings, range_sources, setting

__all__ = ["SpecfsmNgramProposer", "SpecfsmSuffixProposer"]


class _IndexProposer(RowTrackingProposer):
    """What the two proposers share: their constructor (the row tracking's settings,
    then the index range from the settings sources, each proposer by its own rule
    (``_range_of``), and ``prefer``, all checked by a probe index), their settings, the
    zero counts their serving steps record, and their repr. Each proposer supplies its
    index kind: ``_new_index_of`` (an empty index of the active implementation) and
    ``_serve_indexes`` (that kind's ``serve_batch_lists``)."""

    #: the proposer's public name (its repr)
    _NAME = ""
    #: the settings it takes from ``additional_config["specfsm"]``
    _SETTINGS: tuple = INDEX_SETTINGS
    #: zeros for the drafted and accepted counts (read-only; grown as batches grow)
    _nothing = np.zeros(0, dtype=np.int64)
    #: where the range came from (``settings`` says it)
    range_source: str
    #: the occurrence a draft follows (each proposer's class attribute is its default)
    prefer: str

    def __init__(
        self,
        vllm_config: Any = None,
        *,
        min_n: Any = None,
        max_n: Any = None,
        prefer: Any = None,
        num_speculative_tokens: Any = None,
        max_model_len: Any = None,
        verify: Any = None,
    ) -> None:
        super().__init__(
            vllm_config,
            num_speculative_tokens=num_speculative_tokens,
            max_model_len=max_model_len,
            verify=verify,
        )
        unused = sorted(set(additional_settings(vllm_config)) - set(self._SETTINGS))
        if unused:
            raise ValueError(f'additional_config["specfsm"] has settings {self._NAME} does not take: {unused}; '
                             f"it takes {', '.join(self._SETTINGS)}")
        sources = list(zip(range_sources(vllm_config, min_n, max_n, type(self)), RANGE_SOURCES))
        lo, hi, self.range_source = self._range_of(sources)
        prefer = setting("prefer", prefer, vllm_config, type(self).prefer)
        probe = self._new_index_of(lo, hi, prefer)  # validates min_n, max_n, prefer
        self.min_n, self.max_n, self.prefer = probe.min_n, probe.max_n, probe.prefer
        self._log()

    def _range_of(self, sources: list) -> tuple[Any, Any, str]:
        """``(min_n, max_n, where they came from)`` out of ``sources``, the
        ``((min_n, max_n), source name)`` pairs in priority order."""
        raise NotImplementedError

    def _new_index_of(self, lo: Any, hi: Any, prefer: Any) -> Any:
        """An empty index of the proposer's kind over ``lo..hi`` preferring ``prefer``
        (refusing settings the index refuses)."""
        raise NotImplementedError

    def settings(self) -> dict:
        return {**super().settings(), "min_n": self.min_n, "max_n": self.max_n, "prefer": self.prefer,
                "range_from": self.range_source}

    def _new_index(self) -> Any:
        return self._new_index_of(self.min_n, self.max_n, self.prefer)

    def _no_counts(self, b: int) -> np.ndarray:
        """``b`` read-only zeros: the drafted and accepted counts of a serving step that
        records nothing (vLLM does not say which of the last drafts it accepted)."""
        if self._nothing.shape[0] < b:
            self._nothing = np.zeros(max(b, 2 * self._nothing.shape[0]), dtype=np.int64)
            self._nothing.flags.writeable = False
        return self._nothing[:b]

    def __repr__(self) -> str:
        return (
            f"{self._NAME}(min_n={self.min_n}, max_n={self.max_n}, prefer={self.prefer!r}, "
            f"num_speculative_tokens={self.num_speculative_tokens}, max_model_len={self.max_model_len}, "
            f"verify={self.verify!r})"
        )


class SpecfsmNgramProposer(_IndexProposer):
    """vLLM proposer over ``specfsm.NgramIndex``: the drafts of vLLM's V1 n-gram drafter
    (``NgramProposer``, vLLM's ``ngram`` method on the V1 model runner) at O(1) per step.

    Not those of vLLM's ``ngram`` on Model Runner V2 (what a GPU build runs by default:
    its speculator takes the longest n at its rightmost position and pads drafts to K);
    ``prefer="latest"`` is the nearer setting there. The n-gram range is ``min_n..max_n``
    and ``prefer`` picks that n's first occurrence (``"earliest"``, the V1 rule and the
    default) or its latest; draft length K is
    ``num_speculative_tokens``, capped at ``max_model_len - length`` like vLLM's. Each
    setting comes from, in order: the keyword; ``prompt_lookup_min`` /
    ``prompt_lookup_max`` of the ``speculative_config`` when positive;
    ``additional_config["specfsm"]``; the environment (``SPECFSM_VLLM_MIN_N``,
    ``SPECFSM_VLLM_MAX_N``, ``SPECFSM_VLLM_PREFER``); the class attributes ``min_n`` /
    ``max_n`` / ``prefer`` (subclass to change them). As in vLLM, one given end of the
    range sets the other. vLLM zeroes ``prompt_lookup_min`` / ``max`` for
    ``custom_class``, so a range given there is lost: the settings line each worker
    logs (logger ``specfsm.vllm``) says where the range came from. The indexes are the
    active implementation's.
    """

    min_n: int | None = None
    max_n: int | None = None
    prefer: str = "earliest"
    #: vLLM's own default range when none is configured
    DEFAULT_N = 5
    _NAME = "SpecfsmNgramProposer"

    def _range_of(self, sources: list) -> tuple[Any, Any, str]:
        """The first source that sets either end sets the range (one end sets the
        other); none: vLLM's default ``DEFAULT_N..DEFAULT_N``."""
        lo, hi, source = next(
            ((a, b, name) for (a, b), name in sources if a is not None or b is not None),
            (self.DEFAULT_N, self.DEFAULT_N, "vLLM's ngram default"),
        )
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        return lo, hi, source

    def _new_index_of(self, lo: Any, hi: Any, prefer: Any) -> Any:
        """An empty ``NgramIndex`` (the active implementation's)."""
        return ngram_index.NgramIndex(lo, hi, prefer)

    def _serve_indexes(self, indexes: list, tokens: np.ndarray, offsets: np.ndarray,
                       ks: Any) -> list[list[int]]:
        """One serving step of ``indexes`` (``ngram_index.serve_batch_lists``), nothing recorded."""
        none = self._no_counts(len(indexes))
        return ngram_index.serve_batch_lists(indexes, tokens, offsets, none, none, ks)


class SpecfsmSuffixProposer(_IndexProposer):
    """vLLM proposer over ``specfsm.SuffixIndex`` and ``SuffixTrie``: long matches copy
    (the latest earlier occurrence of the row's current suffix, of any length, at
    amortised O(1) per token, from the request's own history and from the histories of
    the requests that went before it on this worker), short ones draft the most frequent
    continuation; with the same row tracking as ``SpecfsmNgramProposer``.

    The match is the longer of two: the row's own (its ``SuffixIndex``; an occurrence
    that ends where the history does, a repeating suffix, goes on repeating) and the
    longest suffix of the row's last ``WINDOW`` tokens found in the worker's cache of
    earlier requests' histories (a ``SharedSuffixCache`` of prompt and output, filled as
    requests leave the batch; taken when longer than the row's own and at least
    ``SHARED_MIN`` tokens). At least ``LONG`` tokens: the draft copies what followed it.
    Shorter: the counted draft of highest score (Arctic's rule, ``SuffixTrie.speculate``
    with ``min_prob``) from the row's own trie (prompt and output, rebuilt from the last
    ``trie_window`` tokens when it holds twice that; 0: never; it wins ties) or the
    worker's tries of every request's output, running ones included (``trie_tokens`` in
    ``GENERATIONS`` generations, the oldest dropped whole; 0: none), each of depth
    ``trie_depth`` (0: no tries, no counted drafts). Either way the draft is at most
    ``spec_factor`` times the match length (a one-token match drafts one token; 0: no
    cap), and at most K.

    Settings: ``min_n`` (shortest suffix worth drafting from, default 1), ``max_n``
    (longest suffix looked at; default None, unbounded) and ``prefer`` (``"latest"``,
    the default, or ``"earliest"`` occurrence of that suffix), by the range rule of
    ``SpecfsmNgramProposer``'s sources (keyword, ``speculative_config``,
    ``additional_config["specfsm"]``, ``SPECFSM_VLLM_MIN_N`` / ``MAX_N`` / ``PREFER``, class
    attributes); ``spec_factor`` (default 1.0), ``shared_tokens`` (tokens the cache keeps
    per worker, default 2**20; 0: no cache), ``shared_requests`` (requests it keeps,
    default 10000), ``trie_depth`` (8), ``trie_tokens`` (2**18), ``trie_window`` (2048)
    and ``min_prob`` (0.16),
    each from the keyword, ``additional_config["specfsm"]``, ``SPECFSM_VLLM_<NAME>`` or the
    class attribute. The cache drops its least recently used quarter when it passes either
    bound; it learns a request's history when the request leaves the batch, which the
    proposer knows by request id (inside vLLM always; outside, with ``req_ids=``). Draft
    length K is ``num_speculative_tokens``, capped at ``max_model_len - length``. The
    indexes are the active implementation's.
    """

    min_n: int = 1
    max_n: int | None = None
    prefer: str = "latest"
    spec_factor: float = 1.0
    shared_tokens: int = 1 << 20
    shared_requests: int = 10000
    #: a draft cut short by the end of the history goes on repeating (False: as the index gives it)
    REPEAT = True
    #: the shortest shared match a draft is taken from
    SHARED_MIN = 2
    #: tokens of the row's history matched against the shared cache
    WINDOW = 256
    trie_depth: int = 8
    trie_tokens: int = 1 << 18
    trie_window: int = 2048
    min_prob: float = 0.16
    #: a match (own or shared) at least this long drafts from it; a shorter one, from the counts
    LONG = 24
    #: the worker's counted tries: trie_tokens split over this many, the oldest dropped whole
    GENERATIONS = 4
    _NAME = "SpecfsmSuffixProposer"
    _SETTINGS = SETTINGS

    def __init__(self, vllm_config: Any = None, *, spec_factor: Any = None, shared_tokens: Any = None,
                 shared_requests: Any = None, trie_depth: Any = None, trie_tokens: Any = None,
                 trie_window: Any = None, min_prob: Any = None, **kw: Any) -> None:
        cls = type(self)
        self.spec_factor = nonnegative_real(
            setting("spec_factor", spec_factor, vllm_config, cls.spec_factor, float), "spec_factor")
        counts = {"shared_tokens": shared_tokens, "shared_requests": shared_requests, "trie_depth": trie_depth,
                  "trie_tokens": trie_tokens, "trie_window": trie_window}
        for name, value in counts.items():  # each a count, from the keyword or the sources
            setattr(self, name, check_count(setting(name, value, vllm_config, getattr(cls, name), int), name))
        if self.shared_requests < 1:
            raise ValueError(f"shared_requests must be at least 1, got {self.shared_requests}")
        if self.trie_depth:  # (0: no counted drafts)
            check_trie_depth(self.trie_depth, "trie_depth")
        self.min_prob = check_min_prob(setting("min_prob", min_prob, vllm_config, cls.min_prob, float))
        self._shared = None
        if self.shared_tokens:
            self._shared = suffix_index.SharedSuffixCache(
                max(self.shared_tokens, 8), generations=4, min_n=1, max_requests=self.shared_requests)
        self._shared_used = False  # (the cache holds something)
        self._gens: list[Any] = []  # the worker's counted tries of outputs, oldest first
        self._gen_base = 0          # the generation number of _gens[0]
        self._seqs = 0              # sequence keys handed out
        self._feeding = True        # the step's tokens go into the tries (False: a rescan)
        super().__init__(vllm_config, **kw)

    def settings(self) -> dict:
        return {**super().settings(), "spec_factor": self.spec_factor, "shared_tokens": self.shared_tokens,
                "shared_requests": self.shared_requests, "trie_depth": self.trie_depth,
                "trie_tokens": self.trie_tokens, "trie_window": self.trie_window, "min_prob": self.min_prob}

    def _clear(self) -> None:
        super()._clear()
        for e in getattr(self, "_tries", {}).values():
            self._close(e)
        # per index (by identity): [the index, its counted trie, its sequence key in the
        # worker's tries, that sequence's generation]
        self._tries: dict[int, list] = {}
        self._plan: Any = None  # the last step's rows and tries, while nothing changed them

    def _range_of(self, sources: list) -> tuple[Any, Any, str]:
        """Each end from the first source that sets it (``max_n`` None: unbounded)."""
        lo, lo_from = next(((a, name) for (a, _), name in sources if a is not None), (None, "default"))
        hi, hi_from = next(((b, name) for (_, b), name in sources if b is not None), (None, "default"))
        return lo, hi, lo_from if lo_from == hi_from else f"min_n: {lo_from}, max_n: {hi_from}"

    def _new_index_of(self, lo: Any, hi: Any, prefer: Any) -> Any:
        """An empty ``SuffixIndex`` (the active implementation's)."""
        return suffix_index.SuffixIndex(lo, hi, prefer)

    def _retire(self, index: Any) -> None:
        """Keep the history of a request that left the batch, for the requests after it
        (its output stays counted in the worker's tries; its own trie goes)."""
        if self._shared is not None and len(index):
            self._shared.add(index.tokens)
            self._shared_used = True
        e = self._tries.pop(id(index), None)
        if e is not None:
            self._close(e)
            self._plan = None

    def _gen_of(self, e: list) -> Any:
        """The worker's trie that ``e``'s output goes into (None: dropped, or none kept)."""
        i = e[3] - self._gen_base
        return self._gens[i] if 0 <= i < len(self._gens) else None

    def _close(self, e: list) -> None:
        g = self._gen_of(e)
        if g is not None:
            g.close(e[2])

    def _count(self, indexes: list, tokens: np.ndarray, offsets: np.ndarray) -> list:
        """Each index's own trie, after counting the step's tokens: all of them in the
        index's own trie, its output's in the worker's (a fresh index's first tokens are
        its prompt and one sampled token: only that token is output), two batched calls
        (``extend_tries``). The worker's tries roll over: a new one when the newest holds
        ``trie_tokens / GENERATIONS`` tokens, the oldest dropped when together they hold
        more than ``trie_tokens``. A step over the same indexes as the last, when no
        entry, row trie or generation changed since, reuses its plan (``_plan``)."""
        plan = self._plan
        if plan is not None and self._feeding and len(plan[0]) == len(indexes) and all(
                map(operator.is_, plan[0], indexes)):
            ents, own, gt, gk = plan[1:]
            gcut: list = []
            whole = True
        else:
            ents, own, gt, gk, gcut, whole = self._count_plan(indexes, offsets.tolist())
            self._plan = (list(indexes), ents, own, gt, gk) if whole and self._feeding else None
        b = len(indexes)
        suffix_index.extend_tries(own, self._no_counts(b), tokens, offsets)  # (zeros: their one key)
        w = self.trie_window
        if w:  # a row's trie past twice its window: rebuilt from the last trie_window tokens
            for j in [j for j, t in enumerate(own) if len(t) > 2 * w]:
                own[j] = ents[j][1] = suffix_index.SuffixTrie(self.trie_depth, "first")
                own[j].extend(0, indexes[j].last_tokens(w))
                self._plan = None
        if gt:
            if whole:
                suffix_index.extend_tries(gt, gk, tokens, offsets)
            else:
                part = [tokens[a:z] for a, z in gcut]
                suffix_index.extend_tries(gt, gk, np.concatenate(part),
                                          np.cumsum([0] + [len(x) for x in part]))
        if self._gens and len(self._gens[-1]) * self.GENERATIONS >= max(self.trie_tokens, 1):
            self._gens.append(suffix_index.SuffixTrie(self.trie_depth, "last"))
            self._plan = None
            while len(self._gens) > 1 and sum(map(len, self._gens)) > self.trie_tokens:
                del self._gens[0]
                self._gen_base += 1
        if len(self._tries) > 2 * (b + self.POOL) + 64:
            self._sweep()
        return own

    def _count_plan(self, indexes: list, cuts: list) -> tuple:
        """The step's entries and tries: each row's entry (made for a new index) and own
        trie; the worker's tries, sequence keys and token ranges of the rows whose output
        they count; whether those are every row with all its tokens."""
        tries = self._tries
        ents, own, gt, gk, gcut = [], [], [], [], []
        whole = True
        for j, ix in enumerate(indexes):
            e = tries.get(id(ix))
            start = cuts[j]
            if e is None:
                e = self._entry(ix, cuts[j + 1] - start)
                if len(ix) == cuts[j + 1] - start:  # fresh: the last token is the output's first
                    start, whole = cuts[j + 1] - 1, False
            ents.append(e)
            own.append(e[1])
            g = self._gen_of(e) if self._feeding else None
            if g is not None:
                gt.append(g)
                gk.append(e[2])
                gcut.append((start, cuts[j + 1]))
            else:
                whole = False
        return ents, own, gt, gk, gcut, whole

    def _entry(self, ix: Any, new: int) -> list:
        """A new entry of ``_tries`` for ``ix``, to which this step appended ``new``
        tokens: its own trie (holding the tokens before those) and a sequence key in the
        newest of the worker's tries."""
        if not self._gens and self.trie_tokens and self._feeding:
            self._gens.append(suffix_index.SuffixTrie(self.trie_depth, "last"))
        own = suffix_index.SuffixTrie(self.trie_depth, "first")
        held = len(ix) - new
        if held > 0:  # an index no entry followed (a kept one): its history so far (its window's)
            own.extend(0, ix.tokens[max(0, held - self.trie_window) if self.trie_window else 0: held])
        e = [ix, own, self._seqs, self._gen_base + len(self._gens) - 1]
        if self._feeding:
            self._tries[id(ix)] = e
            self._seqs += 1
        return e

    def rescan(self, history: Any, max_k: int) -> list:
        """The draft a fresh index over ``history`` would give here (for tests and
        checks): with a fresh trie of its own, the worker's tries and cache read but not
        fed."""
        self._feeding = False
        try:
            return super().rescan(history, max_k)
        finally:
            self._feeding = True

    def _sweep(self) -> None:
        """Drop the tries of indexes that neither a row nor the pool holds any more."""
        live = {id(ix) for ix in self._ix if ix is not None}
        live.update(id(v[0]) for v in self._pool.values())
        for key in [k for k in self._tries if k not in live]:
            self._close(self._tries.pop(key))
            self._plan = None

    def _shared_drafts(self, shared: Any, indexes: list, drafts: list, ns: list, kk: list) -> None:
        """Each row's draft from ``shared`` (the cache) where its match there is longer
        than the row's own (``ns``) and at least ``SHARED_MIN``: ``drafts`` and ``ns``
        rewritten in place."""
        lookup, window, least = shared.lookup, self.WINDOW, self.SHARED_MIN
        for j, ix in enumerate(indexes):
            if kk[j]:
                sn, sd = lookup(ix.last_tokens(window), kk[j])
                if sn > ns[j] and sn >= least and sd:
                    drafts[j], ns[j] = sd, sn

    def _serve_indexes(self, indexes: list, tokens: np.ndarray, offsets: np.ndarray,
                       ks: Any) -> list[list[int]]:
        """One serving step of ``indexes`` (``suffix_index.serve_batch_lists``, nothing
        recorded; the tries counted), then each draft taken from the longer of the row's
        own match and the shared cache's, and cut to what that match supports; below
        ``LONG``, the counted draft instead."""
        b = len(indexes)
        none = self._no_counts(b)
        drafts = suffix_index.serve_batch_lists(indexes, tokens, offsets, none, none, ks)
        own = self._count(indexes, tokens, offsets) if self.trie_depth else []
        ns = list(map(suffix_index.SuffixIndex.match_length, indexes))
        kk = [ks] * b if not isinstance(ks, np.ndarray) else ks.tolist()
        if self._shared_used and self._shared is not None:
            self._shared_drafts(self._shared, indexes, drafts, ns, kk)
        f, repeat, long = self.spec_factor, self.REPEAT, self.LONG if self.trie_depth else 0
        # a short match drafts its counted draft: the row's own trie's, or the worker's
        # that scores higher (after the row's last trie_depth - 1 tokens)
        short = [k if n < long else 0 for n, k in zip(ns, kk)]
        counted = suffix_index.speculate_tries(own, none, short, self._gens, f, self.min_prob) if any(short) else []
        for j, d in enumerate(drafts):
            if ns[j] < long:
                drafts[j] = counted[j] if short[j] else []
                continue
            n = len(d)
            if not n:
                continue
            if repeat and n < kk[j] and n == len(indexes[j]) - indexes[j].match_end():
                # the occurrence ends where the history does (a repeating suffix whose
                # period is n): the draft goes on repeating it
                d = drafts[j] = (d * (kk[j] // n + 1))[: kk[j]]
                n = len(d)
            if f and n > ns[j] * f:
                drafts[j] = d[: int(ns[j] * f)]
        return drafts
