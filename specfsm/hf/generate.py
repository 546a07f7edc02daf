"""Speculative decoding of a Hugging Face causal LM, driven by specfsm's state machine.

``SpeculativeGenerator(model).generate(prompts, max_new_tokens)`` decodes a batch of
requests (lists of token ids) together on ``specfsm.BatchState``: each serving step is
one ``pending()`` (what every request feeds: its last token and its draft), one model
forward for the whole batch, and one ``step()`` (acceptance for every request by the
rule, ``Exact`` for greedy decoding, ``SpeculativeSampling`` or ``TypicalAcceptance``
against the processed distribution for sampling; settle, budgets); the KV cache keeps
each request's fed columns up to its ``resume_rows`` and rolls the rest back with the
cache's own ``crop``. Drafts come from specfsm's suffix index (the longest earlier
match, no cap on its length), its n-gram index or prompt lookup, and enter the batch with
``enter_verify`` at the step's adaptive width: the width that maximises expected tokens
per unit of forward cost, the acceptance estimated per match length and the cost learnt
by rows from the run's own forwards. With the bonus row
(the default) a K-token draft is verified by the K + 1 rows the forward yields anyway.
A rule the batch does not know settles each request through its own ``ServingState``.

The model side (the prefill, the ragged batch cache every step feeds and crops, the
model and version checks) is ``specfsm.hf.evaluate``.

Greedy output is token-for-token what ``model.generate(do_sample=False)`` gives each
request alone, up to floating-point ties between the top two logits (batched and
multi-row forwards round differently); ``first_mismatch`` reports the gap when they
part. Supported: transformers ``>=5.0,<6`` (``Cache.crop`` takes the count of tokens
to remove). Refused: stateful models (recurrent state cannot be cropped),
encoder-decoder models, and caches that cannot be cropped (quantised, sliding window).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _impl
from ..accept.rules import Exact, SpeculativeSampling, TypicalAcceptance
from ..machine.state import Accept, Decode, Rollback, ServingState, Verify
from .evaluate import (
    SUPPORTED_TRANSFORMERS,
    RaggedBatch,
    UnsupportedModel,
    check_model,
    check_transformers,
    first_mismatch,
    eos_ids,
    max_positions,
    measure_costs,
    new_cache,
    prefill,
)
from .cost import AcceptanceByMatch, AcceptanceStats, CostModel, OnlineCost, RequestBackoff, choose_width, expected_tokens

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "UnsupportedModel",
    "check_transformers",
    "check_model",
    "SpeculativeGenerator",
    "RequestOutput",
    "RunStats",
    "first_mismatch",
]

@dataclass
class RequestOutput:
    """One request's generated tokens and what speculation did for it."""

    tokens: list[int]
    prompt_tokens: int
    forwards: int = 0
    verifies: int = 0
    rollbacks: int = 0
    drafted: int = 0
    accepted: int = 0
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    finished_by_eos: bool = False

    @property
    def tokens_per_forward(self) -> float:
        return len(self.tokens) / self.forwards if self.forwards else 0.0


@dataclass
class RunStats:
    """A ``generate`` call: batch forwards, rows evaluated, and where the time went."""

    forwards: int = 0
    rows: int = 0
    model_s: float = 0.0
    wall_s: float = 0.0
    calibrate_s: float = 0.0
    compactions: int = 0
    widths: list[int] = field(default_factory=list)

    @property
    def outside_s(self) -> float:
        """Wall time not spent in model forwards (drafting, acceptance, cache upkeep)."""
        return max(self.wall_s - self.model_s - self.calibrate_s, 0.0)


class _Request:
    __slots__ = ("prompt", "array", "state", "index", "out", "budget", "done", "valid", "idle", "match",
                 "recent", "predicted", "probing")

    def __init__(self, prompt: list[int], budget: int, index: Any, array: np.ndarray) -> None:
        self.prompt = prompt
        self.array = array
        self.state: ServingState = ServingState.start(prompt, cache=0)
        self.index = index
        self.out = RequestOutput([], len(prompt), stats=AcceptanceStats(decay=0.8))
        self.budget = budget
        self.done = False
        self.valid = 0  # columns of the cache this request consumed (== its position)
        self.idle = 0  # steps since this request last verified a draft
        self.match: int | None = None  # the match length behind the current draft (None: unknown)
        self.recent = RequestBackoff()  # what this request's own drafts achieved recently
        self.predicted = 0.0  # accepted draft tokens the shared estimate expects of the current draft
        self.probing = False  # the current draft is a probe (the request had stopped drafting)


def _identity(cache: Any) -> Any:
    return cache


def _drafted(draft: Any, k: int) -> list[int]:
    """A callable drafter's proposal as a list of at most ``k`` ints; TypeError for
    anything that is not a sequence of integers (a float is not truncated to an id)."""
    if isinstance(draft, (str, bytes, bytearray)) or not hasattr(draft, "__iter__"):
        raise TypeError(f"the drafter must return a sequence of token ids, got {type(draft).__name__}")
    if isinstance(draft, np.ndarray):
        if draft.ndim != 1:
            raise TypeError(f"the drafter must return a 1-D sequence of token ids, got an array of shape {draft.shape}")
        if draft.dtype.kind in "iu":
            return [int(t) for t in draft[:k].tolist()]
    out = []
    for i, t in enumerate(draft):
        if i >= k:
            break
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"the drafter returned a non-integer token id at position {i}: {type(t).__name__} {t!r}")
        out.append(int(t))
    return out


def _flag(value: Any, name: str) -> bool:
    """``value`` as a bool when it is one (Python's or numpy's); TypeError naming ``name``."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def _count(value: Any, name: str, least: int = 0) -> int:
    """``value`` as an int of at least ``least`` (Python's or numpy's, not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < least:
        raise ValueError(f"{name} must be at least {least}, got {value!r}")
    return int(value)


def _real(value: Any, name: str) -> float:
    """``value`` as a float (an int, a float or a numpy number, not a bool or a string)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(value)


class SpeculativeGenerator:
    """Drives ``model`` (a transformers causal LM) with speculative decoding.

    ``drafter``: ``"suffix"`` (the default: ``specfsm.SuffixIndex(min_n, max_n,
    prefer)``, the continuation of the longest earlier occurrence of the history's
    suffix, no cap on its length unless ``max_n``; ``prefer`` default ``"latest"``),
    ``"ngram"`` (``specfsm.NgramIndex(min_n, max_n, prefer)``, ``max_n`` default 4),
    ``"prompt"`` (``specfsm.prompt_lookup`` with ``max_n``-grams, default 4, over the
    history) or a callable ``(history list, k) -> draft``; proposals from either index
    cost the same at any context length. ``k``: the most tokens per draft, or
    ``"adaptive"`` (the default): each step's draft width maximises expected tokens per
    unit of forward cost (``k_max`` at most; 0, a plain decode, included), the
    acceptance by position estimated for each class of match length
    (``AcceptanceByMatch``, shared by the generator's requests; the index drafters) or
    per request (prompt lookup, a callable), the cost by rows as the CPU's kernels have
    it (4 rows can cost less than 3: the draft then grows to the cheaper width). ``do_sample`` with ``temperature``/``top_k``/
    ``top_p``: sample, accepting with ``rule`` (default ``SpeculativeSampling(seed=seed)``)
    against the processed distribution at each row; otherwise greedy with ``Exact``.
    ``backoff`` (default True; the batched path with an index drafter): each request's
    own recent drafts correct the shared estimate (``RequestBackoff``): a request whose
    drafts keep failing drops to plain decodes within a few verifies, however well other
    requests' drafts did, and drafts again when its drafter finds a long match (a
    verbatim copy); a request that stopped drafting is probed with 3 tokens after
    ``probe_every`` idle steps, the gap doubling after each failed probe (at most 64).
    ``backoff=False`` keeps the shared estimate alone (the chooser before issue 25).
    ``periodic``: a draft cut short by the end of the history (the latest match runs
    into it) is continued periodically, as the history repeats from the match on.
    Each request of an index drafter gets its own ``specfsm.SuffixIndex`` or
    ``specfsm.NgramIndex`` (as ``drafter`` says), the active implementation's.
    ``eos_token_id``: an id (or ids, or None) that ends a request (default ``"model"``:
    the model's generation config). ``bonus`` (default True): a K-token draft is verified
    with K + 1 rows (the forward over the last token and the draft yields them anyway), so
    a fully accepted draft emits K + 1 tokens. ``cost``: a fixed ``CostModel`` for the
    adaptive width; without one, ``calibrate="online"`` (the default) learns it from the
    run's own forwards (``OnlineCost``, starting from ``PRIOR_COST``'s shape), and
    ``"upfront"`` measures it once before the first step (``calibrate()``).
    ``prefill``: ``"each"`` (the default) runs each prompt of a batch through its own
    forward and gathers the caches into the left-padded batch cache, so no forward
    computes padding (a batch of prompts of 600 to 1,200 tokens pads a third of its
    rows) and each request's prompt is computed exactly as it is alone; ``"padded"``
    runs one left-padded forward over all prompts.
    Greedy decoding and the ``SpeculativeSampling``/``TypicalAcceptance`` rules run on
    ``specfsm.BatchState``; other rules settle per request through ``ServingState``.
    Refuses what ``check_model`` refuses, and every argument of the wrong type or
    value (TypeError / ValueError naming it) before anything calls the model; a callable
    drafter that returns anything but a sequence of integer ids is refused (TypeError)
    at the step that calls it.
    """

    def __init__(
        self,
        model: Any,
        *,
        drafter: str | Callable[[list[int], int], Sequence[int]] = "suffix",
        min_n: int = 1,
        max_n: int | None = None,
        prefer: str | None = None,
        k: int | str = "adaptive",
        k_max: int = 31,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        rule: Any = None,
        seed: int | None = None,
        eos_token_id: Any = "model",
        cost: CostModel | None = None,
        compact_fraction: float = 0.5,
        periodic: bool = True,
        probe_every: int = 8,
        bonus: bool = True,
        calibrate: str = "online",
        prefill: str = "each",
        backoff: bool = True,
    ) -> None:
        check_model(model)
        self.model = model
        # transformers 5.2x renamed forward's past_key_values to cache; take what it has
        params: Any
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            params = {}
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        if not (callable(drafter) or (isinstance(drafter, str) and drafter in ("suffix", "ngram", "prompt"))):
            raise ValueError(f"drafter must be 'suffix', 'ngram', 'prompt' or a callable, got {drafter!r}")
        self.drafter = drafter
        if max_n is None and drafter != "suffix":
            max_n = 4
        if type(min_n) is not int or not (max_n is None or type(max_n) is int) or not 1 <= min_n <= (max_n or min_n):
            raise ValueError(f"need integers 1 <= min_n <= max_n, got min_n={min_n!r}, max_n={max_n!r}")
        self.min_n, self.max_n = min_n, max_n
        if prefer is None:
            prefer = "latest"
        if prefer not in ("latest", "earliest"):
            raise ValueError(f"prefer must be 'latest' or 'earliest', got {prefer!r}")
        self.prefer = prefer
        self._index_cls: Any = None
        if drafter == "suffix":
            from ..drafting.suffix_index import SuffixIndex

            self._index_cls = SuffixIndex
        elif drafter == "ngram":
            from ..drafting.ngram_index import NgramIndex

            self._index_cls = NgramIndex
        if self._index_cls is not None:  # a probe: the index refuses its settings here, before any model call
            try:
                self._index_cls(min_n, max_n, prefer)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{self._index_cls.__name__} refuses (min_n={min_n}, max_n={max_n}, "
                                f"prefer={prefer!r}): {exc}") from None
        self._vocab = int(model.config.vocab_size)
        self.periodic = _flag(periodic, "periodic")
        self.probe_every = _count(probe_every, "probe_every", least=1)
        self.backoff = _flag(backoff, "backoff")
        self.bonus = 1 if _flag(bonus, "bonus") else 0
        if isinstance(k, str) and k == "adaptive":
            self.adaptive = True
            self.k = _count(k_max, "k_max")
        elif type(k) is int and k >= 0:
            self.adaptive = False
            self.k = k
        else:
            raise ValueError(f"k must be a non-negative integer or 'adaptive', got {k!r}")
        self.k_max = _count(k_max, "k_max")
        self.do_sample = _flag(do_sample, "do_sample")
        temperature = _real(temperature, "temperature")
        if not (temperature >= 0 and temperature < float("inf")) or (self.do_sample and temperature == 0):
            raise ValueError(
                f"temperature must be finite and {'positive' if self.do_sample else 'non-negative'}, got {temperature!r}"
            )
        if top_k is not None:
            top_k = _count(top_k, "top_k")
        if top_p is not None:
            top_p = _real(top_p, "top_p")
            if not 0 < top_p <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if seed is not None:
            seed = _count(seed, "seed")
        if rule is None:
            rule = SpeculativeSampling(seed=seed) if self.do_sample else Exact()
        elif not any(callable(getattr(rule, m, None)) for m in ("select", "accepted_rows")):
            raise TypeError(
                f"rule must be an acceptance rule (with select or accepted_rows), got {type(rule).__name__}"
            )
        self.rule = rule
        self.rng = np.random.default_rng(seed)
        self._warpers = self._make_warpers(temperature, top_k, top_p) if self.do_sample else []
        self.eos: frozenset[int] = eos_ids(eos_token_id, model, self._vocab)
        if cost is not None and not isinstance(cost, CostModel):
            raise TypeError(f"cost must be a CostModel or None, got {type(cost).__name__}")
        self.cost = cost
        if calibrate not in ("online", "upfront"):
            raise ValueError(f"calibrate must be 'online' or 'upfront', got {calibrate!r}")
        self.calibration = calibrate
        #: the greedy path's cost model learnt from its own forwards (``calibrate='online'``)
        self.online = OnlineCost()
        self._cost_batch: int | None = None
        compact_fraction = _real(compact_fraction, "compact_fraction")
        if not 0 < compact_fraction <= 1:
            raise ValueError(f"compact_fraction must be in (0, 1], got {compact_fraction!r}")
        self.compact_fraction = compact_fraction
        if prefill not in ("each", "padded"):
            raise ValueError(f"prefill must be 'each' or 'padded', got {prefill!r}")
        self.prefill = prefill
        self.global_stats = AcceptanceStats()
        #: acceptance by position for each class of match length (the index drafters)
        self.by_match = AcceptanceByMatch()
        self.last_run = RunStats()

    # -- sampling ---------------------------------------------------------------------
    @staticmethod
    def _make_warpers(temperature: float, top_k: int | None, top_p: float | None) -> list[Any]:
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        w: list[Any] = []
        if temperature != 1.0:
            w.append(TemperatureLogitsWarper(temperature))
        if top_k is not None and top_k > 0:
            w.append(TopKLogitsWarper(top_k))
        if top_p is not None and top_p < 1.0:
            w.append(TopPLogitsWarper(top_p))
        return w

    def probabilities(self, logits: Any) -> np.ndarray:
        """The processed target distribution (temperature, top-k, top-p in the order
        ``generate`` applies them) of each row of ``logits`` [N, V], float64."""
        import torch

        scores = logits.float()
        for w in self._warpers:
            scores = w(None, scores)
        p = torch.softmax(scores, dim=-1).double().numpy()
        return p / p.sum(axis=1, keepdims=True)

    def _sample(self, probs: np.ndarray) -> int:
        c = np.cumsum(probs)
        return int(min(np.searchsorted(c, self.rng.random() * c[-1], side="right"), len(c) - 1))

    # -- drafting ---------------------------------------------------------------------
    def _new_index(self) -> Any:
        if self.drafter in ("suffix", "ngram"):
            return self._index_cls(self.min_n, self.max_n, self.prefer)
        return None

    def _propose(self, r: _Request, k: int, least: int = 2) -> list[int]:
        # ``least``: the shortest draft worth a verify (without the bonus row a one-token
        # draft is worth exactly one decode)
        if k < least:
            return []
        if r.index is not None:
            d = r.index.propose(k)
            r.match = r.index.match_length()
        else:
            history = r.prompt + r.out.tokens
            if self.drafter == "prompt":
                arr = np.asarray(history, dtype=np.int64)
                d = []
                top = self.max_n if self.max_n is not None else 4  # set in __init__ for "prompt"
                for n in range(top, self.min_n - 1, -1):
                    found = _impl.prompt_lookup(arr, n, k)
                    if len(found):
                        d = found.tolist()
                        break
            else:
                d = _drafted(self.drafter(history, k), k)  # type: ignore[operator]
                bad = [t for t in d if not 0 <= t < self._vocab]
                if bad:
                    raise ValueError(f"the drafter proposed token id {bad[0]}, outside the vocabulary 0..{self._vocab - 1}")
        if self.periodic and 0 < len(d) < k:
            # the match's continuation ran into the end of the history: the history is
            # periodic with period len(d) from the match on, so continue the period
            d = [d[i % len(d)] for i in range(k)]
        return d if len(d) >= least else []

    # -- the model ----------------------------------------------------------------------
    def _forward(self, ids: Any, pos: Any, mask: Any, cache: Any, keep: int | None = None) -> Any:
        import torch

        kw: dict[str, Any] = {}
        if keep is not None:
            kw["logits_to_keep"] = keep
        t0 = time.perf_counter()
        kw[self._cache_kw] = cache
        with torch.inference_mode():
            out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True, **kw)
        self.last_run.model_s += time.perf_counter() - t0
        self.last_run.forwards += 1
        self.last_run.rows += int(ids.shape[0] * ids.shape[1])
        return out.logits

    def calibrate(self, batch: int = 1, context: int = 512, widths: Sequence[int] | None = None, repeat: int = 3) -> CostModel:
        """Measure one forward's cost by rows (``batch`` requests times each width, by
        default 1, 2, 4, 8, 12, 16 .. up to ``k_max`` + 1; ``evaluate.measure_costs``),
        made monotone by ``CostModel``; later ``generate`` calls use it."""
        if widths is None:
            top = max(self.k_max + self.bonus, 1)
            widths = sorted({w for w in (1, 2, 4, 8, 12, 16, 24, 32) if w <= top} | {top})
        saved = self.last_run
        self.last_run = RunStats()
        t0 = time.perf_counter()
        costs = measure_costs(self.model, self._forward, batch, context, widths, repeat)
        saved.calibrate_s += time.perf_counter() - t0
        self.last_run = saved
        self.cost = CostModel(costs)
        self._cost_batch = batch
        return self.cost

    # -- decoding ---------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64) -> list[RequestOutput]:
        """Decode every prompt (a sequence of token ids) for up to ``max_new_tokens``
        tokens or an end-of-sequence token, all together; returns one ``RequestOutput``
        per prompt, in order. ``self.last_run`` holds the run's ``RunStats``. Refuses
        empty prompts and a non-positive ``max_new_tokens``."""
        import torch

        if type(max_new_tokens) is not int or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if isinstance(prompts, (str, bytes)) or not len(prompts):
            raise ValueError("prompts must be a non-empty sequence of token-id sequences")
        vocab = int(self.model.config.vocab_size)
        reqs = []
        for i, p in enumerate(prompts):
            arr = np.asarray(p)
            if arr.ndim != 1 or not arr.size:
                raise ValueError(f"prompts[{i}] must be a non-empty 1-D sequence of token ids (prefill needs at least one token)")
            if arr.dtype.kind not in "iu":
                raise TypeError(f"prompts[{i}] must hold integer token ids, got dtype {arr.dtype}")
            bad = np.flatnonzero((arr < 0) | (arr >= vocab))
            if bad.size:
                raise ValueError(f"prompts[{i}] holds token id {arr[bad[0]]} outside the vocabulary 0..{vocab - 1}")
            arr = arr.astype(np.int64, copy=False)
            reqs.append(_Request(arr.tolist(), max_new_tokens, self._new_index(), arr))
        self.last_run = run = RunStats()
        t_start = time.perf_counter()
        batched = not self.do_sample or type(self.rule) in (SpeculativeSampling, TypicalAcceptance)
        if self.adaptive and self.cost is None and (not batched or self.calibration == "upfront"):
            ctx = min(max(len(r.prompt) for r in reqs), 512)
            self.calibrate(batch=min(len(reqs), 8), context=ctx)
        run = self.last_run
        if batched:
            return self._generate_batched(reqs, max_new_tokens, run, t_start)
        # any other rule (``select``/``accept_with``) settles through ServingState

        # prefill: left-padded, holes masked, positions from 0 at each request's first token
        cache, mask, logits = prefill(self.model, self._forward, [r.array for r in reqs], self.prefill == "each")
        probs = self.probabilities(logits) if self.do_sample else None
        choice = logits.argmax(-1).tolist()
        for i, r in enumerate(reqs):
            r.valid = len(r.prompt)
            tok = self._sample(probs[i]) if probs is not None else choice[i]
            r.state = r.state.advance_prefill(tok, cache=r.valid)
            if r.index is not None:
                r.index.extend(r.array)
            r.out.forwards += 1
            self._emit(r, [tok])

        active = [r for r in reqs if not r.done]
        rb = RaggedBatch(cache, mask, [i for i, r in enumerate(reqs) if not r.done], self._forward)
        if len(active) == 1 and rb.compact([active[0].valid], self.compact_fraction):
            run.compactions += 1  # a lone request decodes without a mask

        while active:
            b = len(active)
            # 1. drafts and the step's width
            budget = [r.budget - len(r.out.tokens) for r in active]
            kcap = self.k_max if self.adaptive else self.k
            drafts = [self._propose(r, min(kcap, budget[i])) for i, r in enumerate(active)]
            if self.adaptive and any(len(d) >= 2 for d in drafts):
                if self.cost is None:
                    self.calibrate(batch=min(b, 8))
                prior = self.global_stats.conditional(self.k_max, prior=0.8, weight=2.0)
                conds = [r.out.stats.conditional(self.k_max, prior=prior, weight=4.0) for r in active]
                w = choose_width(conds, [len(d) for d in drafts], self.cost, self.k_max)  # type: ignore[arg-type]
                if w == 0 and any(r.idle >= self.probe_every and len(d) >= 2 for r, d in zip(active, drafts)):
                    # a request that stopped drafting is probed now and then: acceptance
                    # changes along a request (copying a block, then writing new text)
                    drafts = [d[:4] if r.idle >= self.probe_every else [] for r, d in zip(active, drafts)]
                else:
                    drafts = [d[:w] if w >= 2 else [] for d in drafts]
            run.widths.append(max((len(d) for d in drafts), default=0))
            # 2. one forward of W columns for the whole batch
            feeds = []
            for i, r in enumerate(active):
                st = r.state
                d = drafts[i]
                last = st.last  # type: ignore[attr-defined]
                if d:
                    r.idle = 0
                    r.state = st.enter_verify(d, clone=_identity)
                    feed = [last] + d[:-1]
                else:
                    r.idle += 1
                    feed = [last]
                feeds.append(feed)
            rows = [len(f) for f in feeds]
            logits = rb.feed(feeds, [r.valid for r in active])
            # 3. settle each request through its state machine
            if self.do_sample:
                flat = torch.cat([logits[i, : rows[i]] for i in range(b)])
                probs_all = self.probabilities(flat)
                starts = np.concatenate([[0], np.cumsum(rows)])
            else:
                choice_all = logits.argmax(-1).tolist()
            consumed = []
            for i, r in enumerate(active):
                st = r.state
                r.out.forwards += 1
                if isinstance(st, Verify):
                    k = len(st.draft)
                    row_caches = list(range(r.valid + 1, r.valid + k + 1))
                    if self.do_sample:
                        probs = probs_all[starts[i] : starts[i + 1]]
                        settled = st.accept_with(self.rule, probs, row_caches)
                    else:
                        settled = st.accept_with(self.rule, choice_all[i][:k], row_caches)
                    d = list(st.draft)
                    if isinstance(settled, Accept):
                        n = settled.n
                        emitted = d
                        r.state = settled.resume()
                    else:
                        assert isinstance(settled, Rollback)
                        n = settled.snapshot - r.valid - 1
                        emitted = d[:n] + [int(settled.to)]
                        r.state = settled.rollback()
                        r.out.rollbacks += 1
                    r.out.verifies += 1
                    r.out.drafted += k
                    r.out.accepted += n
                    r.out.stats.record(k, n)
                    self.global_stats.record(k, n)
                else:
                    assert isinstance(st, Decode)
                    tok = self._sample(probs_all[starts[i]]) if self.do_sample else choice_all[i][0]
                    r.state = st.advance_decode(tok, cache=r.valid + 1)
                    emitted = [tok]
                used = r.state.cache - r.valid  # type: ignore[attr-defined]
                # the columns this request consumed are its fed tokens that were accepted
                consumed.append(used)
                r.valid += used
                self._emit(r, emitted)
            # 4. crop trailing columns nobody kept; drop finished requests; compact holes
            rb.keep(consumed)
            alive = [i for i, r in enumerate(active) if not r.done]
            if not alive:
                break
            rb.select(alive)
            active = [active[i] for i in alive]
            if rb.compact([r.valid for r in active], self.compact_fraction):
                run.compactions += 1
        run.wall_s = time.perf_counter() - t_start
        return [r.out for r in reqs]

    def _generate_batched(self, reqs: list[_Request], max_new_tokens: int, run: RunStats, t_start: float) -> list[RequestOutput]:
        """Greedy decoding of the whole batch on ``specfsm.BatchState``: one ``pending()``
        and one ``step()`` per serving step, the model forward in between (its argmax at
        every evaluated row, flattened in ``pending()``'s order); the KV cache keeps
        ``resume_rows + 1`` of each slot's fed columns, finished slots leave it. Drafts
        (n-gram index, prompt lookup or a callable; the adaptive width) enter the batch
        with ``enter_verify``."""
        import torch

        from ..machine.batch import BatchState

        b = len(reqs)
        kcap = self.k_max if self.adaptive else self.k
        bonus = self.bonus
        batch = BatchState(b, k_max=max(kcap, 1), bonus=bool(bonus))
        lens = [len(r.prompt) for r in reqs]
        poff = np.zeros(b + 1, dtype=np.int64)
        np.cumsum(lens, out=poff[1:])
        batch.admit(np.arange(b), np.concatenate([r.array for r in reqs]), poff, np.arange(b),
                    max_tokens=max_new_tokens)
        cache, mask, logits = prefill(self.model, self._forward, [r.array for r in reqs], self.prefill == "each")
        slots, _inputs, off = batch.pending()
        rows = np.full(int(off[-1]), -1, dtype=np.int64)
        if self.do_sample:
            probs = self.probabilities(logits)
            rows[off[1:] - 1] = [self._sample(p) for p in probs]
        else:
            rows[off[1:] - 1] = logits.argmax(-1).numpy()
        for r in reqs:
            r.valid = len(r.prompt)
            if r.index is not None:
                r.index.extend(r.array)
            r.out.forwards += 1
        res = batch.step(rows)
        self._settle_batch(batch, res, reqs)

        active = [i for i in range(b) if not reqs[i].done]  # slot numbers, ascending == cache rows
        rb = RaggedBatch(cache, mask, active, self._forward)
        if len(active) == 1 and rb.compact([reqs[active[0]].valid], self.compact_fraction):
            run.compactions += 1  # a lone request decodes without a mask

        while active:
            b = len(active)
            act = [reqs[i] for i in active]
            # 1. drafts and the step's width, entered into the batch
            remaining = batch.remaining
            limit = [min(kcap, int(remaining[i]) - bonus) for i in active]
            drafts = [self._propose(r, limit[j], 2 - bonus) for j, r in enumerate(act)]
            if self.adaptive and any(drafts):
                if self.cost is not None:
                    cost = self.cost
                elif self.calibration == "online":
                    cost = self.online.model()
                else:
                    cost = self.calibrate(batch=min(b, 8))
                kk = self.k_max + bonus
                prior = self.global_stats.conditional(kk, prior=0.8, weight=2.0)
                shared = [self.by_match.conditional(r.match, kk) if r.match is not None else None for r in act]
                if self.backoff:
                    # each request's own recent drafts over the shared estimate (RequestBackoff)
                    conds = [r.out.stats.conditional(kk, prior=prior, weight=4.0) if c is None
                             else r.recent.conditional(r.match or 0, c) for r, c in zip(act, shared)]
                else:
                    conds = [r.out.stats.conditional(kk, prior=prior, weight=4.0) if c is None else c
                             for r, c in zip(act, shared)]
                # with the bonus row a K-token draft is worth a (K + 1)-token draft without
                # it: K + 1 rows, the same expected tokens
                avail = [len(d) + bonus if d else 0 for d in drafts]
                w = choose_width(conds, avail, cost, self.k_max + bonus) - bonus
                least = 2 - bonus
                gaps = [max(r.recent.probe_gap, self.probe_every) if self.backoff else self.probe_every for r in act]
                if w < least and any(r.idle >= g and d for r, d, g in zip(act, drafts, gaps)):
                    # a request that stopped drafting is probed now and then (3 tokens:
                    # 4 rows, a cheap width): acceptance changes along a request; with
                    # backoff a failed probe doubles that request's gap (up to 64 steps)
                    drafts = [d[:3] if r.idle >= g else [] for r, d, g in zip(act, drafts, gaps)]
                    for r, d in zip(act, drafts):
                        r.probing = bool(d)
                else:
                    drafts = [d[:w] if w >= least else [] for d in drafts]
                    for r in act:
                        r.probing = False
                for r, d, c in zip(act, drafts, shared):
                    # what the shared estimate expects this draft to have accepted
                    r.predicted = expected_tokens(c, len(d) + 1) - 1 if d and c is not None else 0.0
            run.widths.append(max((len(d) for d in drafts), default=0))
            vslots = [s for s, d in zip(active, drafts) if d]
            if vslots:
                dl = [d for d in drafts if d]
                doff = np.zeros(len(dl) + 1, dtype=np.int64)
                np.cumsum([len(d) for d in dl], out=doff[1:])
                batch.enter_verify(vslots, np.fromiter((t for d in dl for t in d), dtype=np.int64, count=int(doff[-1])), doff)
            for r, d in zip(act, drafts):
                r.idle = 0 if d else r.idle + 1
            # 2. one forward of W columns for the whole batch, as pending() lays it out
            slots, inputs, off = batch.pending()
            n_in = np.diff(off)
            w = int(n_in.max())
            t0 = self.last_run.model_s
            logits = rb.feed([inputs[int(off[j]) : int(off[j + 1])] for j in range(b)], [r.valid for r in act])
            self.online.record(b * w, self.last_run.model_s - t0)
            # 3. the fused step: acceptance, settle, budgets
            if self.do_sample:
                # the processed distribution at every row; the rule accepts against it and
                # a decode (or a fully accepted draft's bonus row) takes a sample of its last row
                flat = torch.cat([logits[j, : int(n_in[j])] for j in range(b)])
                probs = self.probabilities(flat)
                rows = np.full(int(off[-1]), -1, dtype=np.int64)
                rows[off[1:] - 1] = [self._sample(probs[i]) for i in (off[1:] - 1).tolist()]
                res = batch.step(rows, rule=self.rule, probs=probs)
            else:
                choice = logits.argmax(-1).numpy()
                rows = np.concatenate([choice[j, : int(n_in[j])] for j in range(b)])
                res = batch.step(rows)
            # each slot keeps its fed columns up to its resume row (a decode: row 0, its
            # one column)
            consumed = (res.resume_rows + 1).tolist()
            for j, r in enumerate(act):
                r.valid += consumed[j]
                r.out.forwards += 1
            self._settle_batch(batch, res, reqs)
            # 4. crop trailing columns nobody kept; drop finished requests; compact holes
            rb.keep(consumed)
            alive = [j for j, i in enumerate(active) if not reqs[i].done]
            if not alive:
                break
            rb.select(alive)
            active = [active[j] for j in alive]
            if rb.compact([reqs[i].valid for i in active], self.compact_fraction):
                run.compactions += 1
        run.wall_s = time.perf_counter() - t_start
        return [r.out for r in reqs]

    def _settle_batch(self, batch: Any, res: Any, reqs: list[_Request]) -> None:
        """A ``StepResult``'s emitted tokens into each request (cut after an eos of the
        model's set; the slot then finishes) and its verify counts into the statistics."""
        em = res.emitted.tolist()
        eo = res.emitted_offsets.tolist()
        drafted = res.drafted.tolist()
        accepted = res.accepted.tolist()
        done = set(res.finished.tolist())
        cut = []
        for j, s in enumerate(res.slots.tolist()):
            r = reqs[s]
            k = drafted[j]
            if k:
                n = accepted[j]
                r.out.verifies += 1
                r.out.drafted += k
                r.out.accepted += n
                r.out.rollbacks += n < k
                r.out.stats.record(k, n)
                self.global_stats.record(k, n)
                if r.match is not None:
                    self.by_match.record(r.match, k, n)
                    if self.backoff:
                        r.recent.record(r.match, k, n, r.predicted)
                if r.probing:
                    r.probing = False
                    g = max(r.recent.probe_gap, self.probe_every)
                    r.recent.probe_gap = self.probe_every if n >= 2 else min(2 * g, 64)
            out = r.out.tokens
            start = len(out)
            for tok in em[eo[j] : eo[j + 1]]:
                out.append(tok)
                if tok in self.eos:
                    r.done = r.out.finished_by_eos = True
                    break
            if r.index is not None:
                r.index.extend(out[start:])
            if s in done:
                r.done = True
            elif r.done:
                cut.append(s)
        if cut:
            batch.finish(cut)

    def _emit(self, r: _Request, tokens: list[int]) -> None:
        out = r.out.tokens
        start = len(out)
        for tok in tokens:
            out.append(int(tok))
            if tok in self.eos:
                r.done = True
                r.out.finished_by_eos = True
                break
            if len(out) >= r.budget:
                r.done = True
                break
        if r.index is not None:
            r.index.extend(out[start:])
        if r.done:
            r.state = r.state.finish()
