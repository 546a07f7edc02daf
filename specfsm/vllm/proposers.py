"""The two proposers vLLM loads by class path: ``SpecfsmNgramProposer`` (over
``specfsm.NgramIndex``) and ``SpecfsmSuffixProposer`` (over ``specfsm.SuffixIndex``):
their settings, and their index kind's one serving-step policy (``serve`` /
``serve_batch``: extend by the step's tokens, then propose), which every step calls.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..drafting import ngram_index, suffix_index
from .rows import RowTrackingProposer
from .settings import RANGE_SOURCES, prefer_setting, range_sources

__all__ = ["SpecfsmNgramProposer", "SpecfsmSuffixProposer"]


class _IndexProposer(RowTrackingProposer):
    """What the two proposers share once their range is read: the index class they
    build (``_index_module.<_INDEX>``), their settings, the serving-step policy each step
    calls, and their repr."""

    #: the index class's name in ``_index_module``, and the proposer's public name
    _INDEX = ""
    _NAME = ""
    _index_module: ModuleType
    #: zeros for the drafted and accepted counts (read-only; grown as batches grow)
    _nothing = np.zeros(0, dtype=np.int64)
    #: where the range came from (set by each subclass's ``__init__``; ``settings`` says it)
    range_source: str

    def _configure(self, lo: Any, hi: Any, prefer: Any, vllm_config: Any) -> None:
        prefer = prefer_setting(prefer, type(self), vllm_config)
        probe = self._new_index_of(lo, hi, prefer)  # validates min_n, max_n, prefer
        self.min_n, self.max_n, self.prefer = probe.min_n, probe.max_n, probe.prefer
        self._log()

    def _new_index_of(self, lo: Any, hi: Any, prefer: Any) -> Any:
        return getattr(self._index_module, self._INDEX)(lo, hi, prefer)

    def settings(self) -> dict:
        return {**super().settings(), "min_n": self.min_n, "max_n": self.max_n, "prefer": self.prefer,
                "range_from": self.range_source}

    def _new_index(self) -> Any:
        return self._new_index_of(self.min_n, self.max_n, self.prefer)

    def _serve_indexes(self, indexes: list, tokens: np.ndarray, offsets: np.ndarray,
                       ks: Any) -> list[list[int]]:
        # (vLLM does not say which of the last drafts it accepted: nothing to record)
        b = len(indexes)
        if self._nothing.shape[0] < b:
            self._nothing = np.zeros(max(b, 2 * self._nothing.shape[0]), dtype=np.int64)
            self._nothing.flags.writeable = False
        none = self._nothing[:b]
        return self._index_module.serve_batch_lists(indexes, tokens, offsets, none, none, ks)

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
    #: where the index class and its batch calls come from (the public module, so the
    #: active implementation's; a test subclass names one implementation's kernel module)
    _index_module: ModuleType = ngram_index
    _INDEX = "NgramIndex"
    _NAME = "SpecfsmNgramProposer"

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
        # the first source that sets either end sets the range (one end sets the other)
        lo, hi, self.range_source = next(
            ((a, b, name) for (a, b), name in zip(range_sources(vllm_config, min_n, max_n, type(self)), RANGE_SOURCES)
             if a is not None or b is not None),
            (self.DEFAULT_N, self.DEFAULT_N, "vLLM's ngram default"),
        )
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        self._configure(lo, hi, prefer, vllm_config)


class SpecfsmSuffixProposer(_IndexProposer):
    """vLLM proposer over ``specfsm.SuffixIndex``: unbounded longest-match drafts (the
    longest earlier occurrence of the row's current suffix, of any length) at amortised
    O(1) per token, with the same row tracking as ``SpecfsmNgramProposer``.

    Settings: ``min_n`` (shortest suffix worth drafting from, default 1), ``max_n``
    (longest suffix looked at; default None, unbounded) and ``prefer`` (``"earliest"``,
    the default, or ``"latest"`` occurrence of that suffix); draft length K is
    ``num_speculative_tokens``, capped at ``max_model_len - length``. Each comes from, in
    order: the keyword; ``prompt_lookup_min`` / ``prompt_lookup_max`` of the
    ``speculative_config`` when positive; ``additional_config["specfsm"]``; the
    environment (``SPECFSM_VLLM_MIN_N``, ``SPECFSM_VLLM_MAX_N``,
    ``SPECFSM_VLLM_PREFER``); the class attributes. The indexes are the active
    implementation's.
    """

    min_n: int = 1
    max_n: int | None = None
    prefer: str = "earliest"
    #: where the index class and its batch calls come from (the public module, so the
    #: active implementation's; a test subclass names one implementation's kernel module)
    _index_module: ModuleType = suffix_index
    _INDEX = "SuffixIndex"
    _NAME = "SpecfsmSuffixProposer"

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
        # each end from the first source that sets it (max_n None: unbounded)
        sources = list(zip(range_sources(vllm_config, min_n, max_n, type(self)), RANGE_SOURCES))
        lo, lo_from = next(((a, name) for (a, _), name in sources if a is not None), (None, "default"))
        hi, hi_from = next(((b, name) for (_, b), name in sources if b is not None), (None, "default"))
        self.range_source = lo_from if lo_from == hi_from else f"min_n: {lo_from}, max_n: {hi_from}"
        self._configure(lo, hi, prefer, vllm_config)
