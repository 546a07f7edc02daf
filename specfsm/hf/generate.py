"""Speculative decoding of a Hugging Face causal LM, driven by specfsm's state machine.

``SpeculativeGenerator(model).generate(prompts, max_new_tokens)`` decodes a batch of
requests (lists of token ids; one request is a batch of one) through the serving loop
every other target uses, ``specfsm.serving.loop.serve`` on ``specfsm.BatchState``: each
serving step is one ``pending()`` (what every request feeds: its last token and its
draft), one model forward for the whole batch (``specfsm.hf.target.ModelTarget``: the
ragged batch cache, which keeps each request's fed columns up to the row it resumes
from and rolls the rest back with the cache's own ``crop``), and one ``step()``
(acceptance for every request: ``Exact`` for greedy decoding; for sampling the rule,
``SpeculativeSampling`` by default, ``TypicalAcceptance``, a rule comparing tokens
against sampled rows, or one that ``select``s from the processed distribution; settle,
budgets, eos). Drafts come from specfsm's suffix index (the longest earlier match, no
cap on its length), its n-gram index, prompt lookup or a callable, and enter the batch
at the step's adaptive width (``specfsm.hf.drafting.StepDrafter``: the width that
maximises expected tokens per unit of forward cost, the acceptance estimated per match
length and per request, the cost learnt by rows from the run's own forwards). With the
bonus row (the default) a K-token draft is verified by the K + 1 rows the forward yields
anyway.

The model side (the prefill, the ragged batch cache, cost measurement, the model and
version checks) is ``specfsm.hf.evaluate``.

Greedy output is token-for-token what ``model.generate(do_sample=False)`` gives each
request alone, up to floating-point ties between the top two logits (batched and
multi-row forwards round differently); ``first_mismatch`` reports the gap when they
part. Supported: transformers ``>=5.0,<6`` (``Cache.crop`` takes the count of tokens
to remove). Refused: stateful models (recurrent state cannot be cropped),
encoder-decoder models, and caches that cannot be cropped (quantised, sliding window).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..accept.rules import Exact, SpeculativeSampling
from ..serving.loop import Request, needs_probs, serve
from . import DRAFTERS, TREE_DRAFTERS
from .cost import (
    PRIOR_COSTS,
    AcceptanceByMatch,
    AcceptanceStats,
    CompactionCost,
    CostModel,
    OnlineCostByBatch,
    padded_prior,
)
from .drafting import StepDrafter
from .evaluate import (
    SUPPORTED_TRANSFORMERS,
    HeadRows,
    UnsupportedModel,
    check_model,
    check_transformers,
    eos_ids,
    first_mismatch,
    measure_costs,
)
from .attention import attention_of
from .linears import linears_of
from .recycle import TREE_CAP, BudgetStats
from .target import ModelTarget
from .tree import check_tree_attention


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
    calibrate_s: float = 0.0  # calibrate="upfront": measuring forward cost by rows before the first step
    compactions: int = 0
    widths: list[int] = field(default_factory=list)
    trees: int = 0  # tree drafts verified (the tree drafters: suffix-tree, recycle, suffix-recycle)

    @property
    def outside_s(self) -> float:
        """The run's wall time outside model forwards and ``calibrate_s``: its steps'
        own work (drafting, choosing the width, acceptance, building each forward's
        inputs and reading its logits, cache upkeep). The generator's one-time
        measurements happen at its construction (``SpeculativeGenerator.calibration_s``),
        not in a run."""
        return max(self.wall_s - self.model_s - self.calibrate_s, 0.0)


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
    ``"suffix-tree"`` (the same index's ``propose_tree``, as deep as the chain the width
    chooser picks, with as many nodes as that chain plus those the forward's measured
    cost by rows says are nearly free (at most 5% more); the chain is its main branch
    while the copy agrees with the recent history, else the nodes go to the
    continuations that recur most; verified as one tree per request, ``specfsm.hf.tree``,
    with an attention that takes a 4-D mask (``tree.TREE_ATTENTION``); with ``do_sample``
    one token is drawn at every row and the tree walked with them, which keeps the target's
    distribution exactly for these deterministic drafts, ``specfsm.tree.sampling``),
    ``"recycle"`` (trees from the target's own earlier predictions: one
    ``specfsm.RecyclingTable`` per generator, ``self.recycling``, kept across runs and fed
    the top-k ids of every row the target evaluates, the prompt's last ``PROMPT_ROWS``
    included; ``"suffix-recycle"``: the suffix index's tree and the table's merged into one,
    the one that leads chosen by the match's length and by what each accepted for the
    request; ``specfsm.hf.recycle``; the node budget is ``k`` when fixed, else the one that
    maximises expected tokens per unit of forward cost from what cuts of such trees
    accepted in the run; the same attention),
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
    ``probe_every`` idle steps, the gap doubling after each failed probe (at most 64);
    in a batch of B live requests the gaps are B times as long (a probe widens every
    row of the padded forward), and a due probe takes along every request at least
    half-way to its own, so they share one wide forward.
    ``backoff=False`` keeps the shared estimate alone (no per-request back-off).
    ``objective``: what a batch's width serves. ``"makespan"`` (the default): the
    ``generate`` call returns when its last request ends, so the width is the one that
    ends the batch soonest (``cost.choose_batch_width``); ``"throughput"``: the most
    expected tokens per unit of forward cost this step (``cost.choose_width``; what a
    server that refills its batch as requests end wants). A batch of one is the same
    under both.
    ``periodic``: a draft cut short by the end of the history (the latest match runs
    into it) is continued periodically, as the history repeats from the match on.
    Each request of an index drafter gets its own ``specfsm.SuffixIndex`` or
    ``specfsm.NgramIndex`` (as ``drafter`` says), the active implementation's.
    ``eos_token_id``: an id (or ids, or None) that ends a request (default ``"model"``:
    the model's generation config). ``bonus`` (default True): a K-token draft is verified
    with K + 1 rows (the forward over the last token and the draft yields them anyway), so
    a fully accepted draft emits K + 1 tokens. ``cost``: a fixed ``CostModel`` for the
    adaptive width; without one, ``calibrate="online"`` (the default) learns it from the
    run's own forwards for each batch size (``OnlineCostByBatch``, starting from the
    shape of the model's linear layers and attention, ``PRIOR_COSTS``), and
    ``"upfront"`` measures it once before the first step (``calibrate()``).
    ``prefill``: ``"each"`` (the default) runs each prompt of a batch through its own
    forward and gathers the caches into the left-padded batch cache, so no forward
    computes padding (a batch of prompts of 600 to 1,200 tokens pads a third of its
    rows) and each request's prompt is computed exactly as it is alone; ``"padded"``
    runs one left-padded forward over all prompts. The batch cache is compacted (each
    row's real columns gathered, the holes dropped) when the attention it saves over
    the forwards left outweighs the copy, both measured on the generator's own forwards
    and gathers (``CompactionCost``, kept across runs as ``compaction``); until they are
    measured, when compacting would remove at least ``compact_fraction`` of the cache.
    ``pad_head`` (default True): a forward whose output projection evaluates fewer rows
    than a cheaper count (on a CPU, 2 or 3 rows cost more than 4) pads them with zero
    rows (``evaluate.HeadRows``; what it pads is the rows a batch of that size computes,
    so the logits are a batch's). That head is measured here, at construction, once per
    model in a process (and, for a model loaded from a converted copy in specfsm's
    cache, once per machine: kept beside the copy), never inside a request;
    ``calibration_s`` is the seconds construction spent on it (0.3 s for SmolLM2 on one
    thread, about 0 when it was known).
    Every rule runs through ``specfsm.serving.loop.serve`` on ``specfsm.BatchState``.
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
        objective: str = "makespan",
        pad_head: bool = True,
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
        self._init_drafter(drafter, min_n, max_n, prefer)
        self._vocab = int(model.config.vocab_size)
        self._init_steps(periodic, probe_every, backoff, objective, bonus, k, k_max)
        self._init_sampling(do_sample, temperature, top_k, top_p, rule, seed)
        self.eos: frozenset[int] = eos_ids(eos_token_id, model, self._vocab)
        self._init_costs(cost, calibrate, compact_fraction, prefill)
        self.global_stats = AcceptanceStats()
        #: acceptance by position for each class of match length (the index drafters)
        self.by_match = AcceptanceByMatch()
        self.last_run = RunStats()
        #: pad the output projection's rows to the cheapest count (``HeadRows``); the
        #: one-time measurement runs now, after every argument is checked
        self.pad_head = _flag(pad_head, "pad_head")
        t0 = time.perf_counter()
        self._head: HeadRows | None = HeadRows.for_model(model) if self.pad_head else None
        if self._head is not None:
            # the padded row counts cost what their padding does (before any table is learnt)
            self.online.prior = padded_prior(self.online.prior, self._head.pad)
        #: seconds construction spent on one-time measurement (``HeadRows``), apart from
        #: every run's time
        self.calibration_s = time.perf_counter() - t0

    def _init_drafter(self, drafter: str | Callable[[list[int], int], Sequence[int]], min_n: int,
                      max_n: int | None, prefer: str | None) -> None:
        """Check and set the drafter (``tree`` for ``"suffix-tree"``, whose attention is
        checked), its n-gram range and ``prefer``, and the index class of an index
        drafter, probed with those settings so that the index refuses them here."""
        if not (callable(drafter) or (isinstance(drafter, str) and drafter in DRAFTERS)):
            raise ValueError(f"drafter must be one of {', '.join(map(repr, DRAFTERS))} or a callable, got {drafter!r}")
        #: ``"suffix-tree"`` and the recycling drafters: tree drafts, verified as trees (greedy)
        self.tree = drafter in TREE_DRAFTERS
        if self.tree:
            check_tree_attention(self.model)
        #: the recycling drafters' table (one per generator, kept across runs; None: none)
        self.recycling: Any = None
        #: what the recycling table's trees accepted by cut (``specfsm.hf.recycle``)
        self.tree_stats = BudgetStats()
        if drafter in ("recycle", "suffix-recycle"):
            from ..drafting.recycling import RecyclingTable

            self.recycling = RecyclingTable(int(self.model.config.vocab_size))
        if drafter in ("suffix-tree", "suffix-recycle"):
            drafter = "suffix"
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

    def _init_steps(self, periodic: bool, probe_every: int, backoff: bool, objective: str, bonus: bool,
                    k: int | str, k_max: int) -> None:
        """Check and set how each step drafts: periodic continuation, probing and
        backoff, the width's objective, the bonus row, and the draft width (fixed ``k``
        or adaptive up to ``k_max``)."""
        self.periodic = _flag(periodic, "periodic")
        self.probe_every = _count(probe_every, "probe_every", least=1)
        self.backoff = _flag(backoff, "backoff")
        if objective not in ("makespan", "throughput"):
            raise ValueError(f"objective must be 'makespan' or 'throughput', got {objective!r}")
        self.objective = objective
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

    def _init_sampling(self, do_sample: bool, temperature: float, top_k: int | None, top_p: float | None,
                       rule: Any, seed: int | None) -> None:
        """Check and set greedy decoding or sampling (temperature, top-k, top-p, the
        seeded generator and the logits warpers) and the acceptance rule (``Exact``
        for greedy and trees, ``SpeculativeSampling`` by default when sampling)."""
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
        if self.tree and rule is not None and not isinstance(rule, Exact):
            raise ValueError(
                "drafter='suffix-tree' accepts by the target's token at each node (greedy, or with do_sample a token "
                f"drawn at every row: exact sampling over a tree, specfsm.tree.sampling); rule={rule!r} does not apply")
        if rule is None:
            # a tree samples by one draw per row, walked as the greedy walk (Exact over sampled rows)
            rule = SpeculativeSampling(seed=seed) if self.do_sample and not self.tree else Exact()
        elif not any(callable(getattr(rule, m, None)) for m in ("select", "accepted_rows")):
            raise TypeError(
                f"rule must be an acceptance rule (with select or accepted_rows), got {type(rule).__name__}"
            )
        self.rule = rule
        self.rng = np.random.default_rng(seed)
        self._warpers = self._make_warpers(temperature, top_k, top_p) if self.do_sample else []

    def _init_costs(self, cost: CostModel | None, calibrate: str, compact_fraction: float, prefill: str) -> None:
        """Check and set the forward's cost model (fixed, or learnt online or up front),
        when the ragged batch cache is compacted, and how prompts are prefilled."""
        if cost is not None and not isinstance(cost, CostModel):
            raise TypeError(f"cost must be a CostModel or None, got {type(cost).__name__}")
        self.cost = cost
        if calibrate not in ("online", "upfront"):
            raise ValueError(f"calibrate must be 'online' or 'upfront', got {calibrate!r}")
        self.calibration = calibrate
        #: the greedy path's cost model learnt from its own forwards by batch size
        #: (``calibrate='online'``), kept across runs
        self.online = OnlineCostByBatch(PRIOR_COSTS[linears_of(self.model), attention_of(self.model)])
        self._cost_batch: int | None = None
        compact_fraction = _real(compact_fraction, "compact_fraction")
        if not 0 < compact_fraction <= 1:
            raise ValueError(f"compact_fraction must be in (0, 1], got {compact_fraction!r}")
        self.compact_fraction = compact_fraction
        #: when gathering the ragged batch cache pays, learnt from the run's forwards
        #: and gathers (``compact_fraction`` until measured)
        self.compaction = CompactionCost(compact_fraction)
        if prefill not in ("each", "padded"):
            raise ValueError(f"prefill must be 'each' or 'padded', got {prefill!r}")
        self.prefill = prefill

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


    # -- the model ----------------------------------------------------------------------
    def _forward(self, ids: Any, pos: Any, mask: Any, cache: Any, keep: int | None = None) -> Any:
        import torch

        kw: dict[str, Any] = {}
        if keep is not None:
            kw["logits_to_keep"] = keep
        t0 = time.perf_counter()
        kw[self._cache_kw] = cache
        with torch.inference_mode(), (self._head if self._head is not None else contextlib.nullcontext()):
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
        if type(max_new_tokens) is not int or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if isinstance(prompts, (str, bytes)) or not len(prompts):
            raise ValueError("prompts must be a non-empty sequence of token-id sequences")
        vocab = int(self.model.config.vocab_size)
        arrays = []
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
            arrays.append(arr)
        self.last_run = run = RunStats()
        t_start = time.perf_counter()
        if self.adaptive and self.cost is None and self.calibration == "upfront":
            ctx = min(max(len(p) for p in arrays), 512)
            self.calibrate(batch=min(len(arrays), 8), context=ctx)
        run = self.last_run
        # greedy decoding accepts by exact match; sampling by the rule, against the
        # processed distribution (the rule's kind says which rows the target draws at)
        rule = self.rule if self.do_sample else None
        sample_rows = rule is not None and not needs_probs(rule)
        if self.tree:  # a tree walks greedily over the rows the target drew (sample_rows)
            rule = None
        target = ModelTarget(self, sample_rows=sample_rows, budget=max_new_tokens)
        eos: Any = None
        if len(self.eos) == 1:
            eos = next(iter(self.eos))
        elif self.eos:
            eos = self.eos
        requests = [Request(a.tolist(), max_new_tokens, eos=eos, cache=(i, 0)) for i, a in enumerate(arrays)]
        kcap = self.k_max if self.adaptive else self.k
        if self.recycling is not None and self.adaptive:
            kcap = max(kcap, TREE_CAP)  # a recycling tree's nodes live in the slot's draft buffer
        drafter = StepDrafter(self, max_new_tokens)
        results = serve(requests, target, drafter, kcap, rule, clone=False, bonus=bool(self.bonus))
        run.wall_s = time.perf_counter() - t_start
        outs = []
        # no sessions when nothing drafts (k = 0)
        sessions: list[Any] = list(drafter.sessions) or [None] * len(requests)
        for r, res, st in zip(requests, results, sessions):
            s = res.stats
            toks = [int(t) for t in res.output]
            outs.append(RequestOutput(
                toks, len(r.prompt), forwards=s.evaluations, verifies=s.verifies, rollbacks=s.rollbacks,
                drafted=s.drafted, accepted=s.accepted,
                stats=st.stats if st is not None else AcceptanceStats(decay=0.8),
                finished_by_eos=bool(toks) and toks[-1] in self.eos,
            ))
        return outs

