"""The two proposers vLLM loads by class path: ``SpecfsmNgramProposer`` (over
``specfsm.NgramIndex``) and ``SpecfsmSuffixProposer`` (over ``specfsm.SuffixIndex``):
their settings, and their index kind's one serving-step policy (``serve`` /
``serve_batch``: extend by the step's tokens, then propose), which every step calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..drafting import ngram_index, suffix_index
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
    """vLLM proposer over ``specfsm.SuffixIndex``: longest-match drafts (the latest
    earlier occurrence of the row's current suffix, of any length) at amortised O(1) per
    token, from the request's own history and from the histories of the requests that
    went before it on this worker, with the same row tracking as
    ``SpecfsmNgramProposer``.

    Each draft comes from the longer of two matches: the row's own (its ``SuffixIndex``;
    an occurrence that ends where the history does, a repeating suffix, goes on
    repeating) and the longest suffix of the row's last ``WINDOW`` tokens found in the
    worker's cache of earlier requests' histories (a ``SharedSuffixCache`` of prompt and
    output, filled as requests leave the batch; taken when longer than the row's own and
    at least ``SHARED_MIN`` tokens). Its length is what the match supports: at most
    ``spec_factor`` times the match length (a one-token match drafts one token; 0: no
    cap), and at most K.

    Settings: ``min_n`` (shortest suffix worth drafting from, default 1), ``max_n``
    (longest suffix looked at; default None, unbounded) and ``prefer`` (``"latest"``,
    the default, or ``"earliest"`` occurrence of that suffix), by the range rule of
    ``SpecfsmNgramProposer``'s sources (keyword, ``speculative_config``,
    ``additional_config["specfsm"]``, ``SPECFSM_VLLM_MIN_N`` / ``MAX_N`` / ``PREFER``, class
    attributes); ``spec_factor`` (default 1.0), ``shared_tokens`` (tokens the cache keeps
    per worker, default 2**20; 0: no cache) and ``shared_requests`` (requests it keeps,
    default 10000), each from the keyword, ``additional_config["specfsm"]``,
    ``SPECFSM_VLLM_SPEC_FACTOR`` / ``SHARED_TOKENS`` / ``SHARED_REQUESTS`` or the class
    attribute. The cache drops its least recently used quarter when it passes either
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
    _NAME = "SpecfsmSuffixProposer"
    _SETTINGS = SETTINGS

    def __init__(self, vllm_config: Any = None, *, spec_factor: Any = None, shared_tokens: Any = None,
                 shared_requests: Any = None, **kw: Any) -> None:
        cls = type(self)
        self.spec_factor = nonnegative_real(
            setting("spec_factor", spec_factor, vllm_config, cls.spec_factor, float), "spec_factor")
        self.shared_tokens = check_count(
            setting("shared_tokens", shared_tokens, vllm_config, cls.shared_tokens, int), "shared_tokens")
        self.shared_requests = check_count(
            setting("shared_requests", shared_requests, vllm_config, cls.shared_requests, int), "shared_requests")
        if self.shared_requests < 1:
            raise ValueError(f"shared_requests must be at least 1, got {self.shared_requests}")
        self._shared = None
        if self.shared_tokens:
            self._shared = suffix_index.SharedSuffixCache(
                max(self.shared_tokens, 8), generations=4, min_n=1, max_requests=self.shared_requests)
        self._shared_used = False  # (the cache holds something)
        super().__init__(vllm_config, **kw)

    def settings(self) -> dict:
        return {**super().settings(), "spec_factor": self.spec_factor, "shared_tokens": self.shared_tokens,
                "shared_requests": self.shared_requests}

    def _range_of(self, sources: list) -> tuple[Any, Any, str]:
        """Each end from the first source that sets it (``max_n`` None: unbounded)."""
        lo, lo_from = next(((a, name) for (a, _), name in sources if a is not None), (None, "default"))
        hi, hi_from = next(((b, name) for (_, b), name in sources if b is not None), (None, "default"))
        return lo, hi, lo_from if lo_from == hi_from else f"min_n: {lo_from}, max_n: {hi_from}"

    def _new_index_of(self, lo: Any, hi: Any, prefer: Any) -> Any:
        """An empty ``SuffixIndex`` (the active implementation's)."""
        return suffix_index.SuffixIndex(lo, hi, prefer)

    def _retire(self, index: Any) -> None:
        """Keep the history of a request that left the batch, for the requests after it."""
        if self._shared is not None and len(index):
            self._shared.add(index.tokens)
            self._shared_used = True

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
        recorded), then each draft taken from the longer of the row's own match and the
        shared cache's, and cut to what that match supports."""
        b = len(indexes)
        none = self._no_counts(b)
        drafts = suffix_index.serve_batch_lists(indexes, tokens, offsets, none, none, ks)
        ns = list(map(suffix_index.SuffixIndex.match_length, indexes))
        kk = [ks] * b if not isinstance(ks, np.ndarray) else ks.tolist()
        if self._shared_used and self._shared is not None:
            self._shared_drafts(self._shared, indexes, drafts, ns, kk)
        f, repeat = self.spec_factor, self.REPEAT
        for j, d in enumerate(drafts):
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
