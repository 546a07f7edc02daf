"""The speculative serving loop: requests driven through ``ServingState`` against a target.

A *target* is anything with ``evaluate(inputs, cache) -> (row_tokens, row_caches)``: one
call per prefill, decode or verify evaluation. ``inputs`` holds one token per row;
``row_tokens[i]`` is the target's greedy choice having consumed ``inputs[i]`` and
``row_caches[i]`` the cache it produced at that row. A prefill passes the prompt, a
decode ``[last]``, a verify ``[last, draft[0], ..., draft[K-2]]`` (row 0 follows
``last``, row ``i`` follows ``draft[i-1]``, ``specfsm.state``'s convention). Prefill and
decode read the last row; a verify needs one row per draft token. A target with
``evaluate_batch(inputs_list, caches_list) -> [(row_tokens, row_caches), ...]`` is called
once per step when requests run as a batch.

A *drafter* makes one session per request: ``drafter.session(prompt)`` returns an object
with ``extend(tokens)`` (tokens the target confirmed, never drafts) and
``propose(max_k)`` (a draft of at most ``max_k`` tokens, possibly empty).
``PromptLookupDrafter`` (``specfsm.drafting``) uses ``prompt_lookup``, ``NgramDrafter``
(``specfsm.ngram_index``) an ``NgramIndex`` and ``SuffixDrafter``
(``specfsm.suffix_index``) a ``SuffixIndex``; each lives beside its kernel.

A *rule* is ``None`` (greedy exact match, what ``Verify.accept`` does) or any object with
``accepted_rows(draft, choices) -> int`` (``specfsm.accept_rule``). The sampling rules
(``SpeculativeSampling``, ``TypicalAcceptance``) decide from probabilities: the loop then
calls the target's ``evaluate_probs(inputs, cache) -> (row_tokens, row_probs,
row_caches)`` (one probability row per input) and, for ``SpeculativeSampling``, draws
decode tokens from the row with the rule's generator. With a greedy target and a rule
that never accepts past the first disagreement, the output is exactly what plain greedy
decoding produces; ``SpeculativeLoop.run(..., check=True)`` proves it per request by
running plain greedy too.

``SpeculativeLoop.run_batched`` runs requests on the batch API (``specfsm.batch``: one
``BatchState.step`` per serving step for every request), optionally with the bonus row.
The teacher-forced target for replay lives in ``specfsm.workload`` (re-exported here).

Kernels come from ``specfsm._impl`` (the active implementation) unless the caller names
one: ``SpeculativeLoop(..., impl="python")`` and ``PromptLookupDrafter(n, impl=...)``
run on that implementation's kernels without touching any module's globals, so the
compiled core and the twin can run side by side in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any, Protocol

import numpy as np

from . import _impl
from ._validate import check_count
from . import state as _state
from .state import Accept, Decode, Prefill, ServingState, Verify

# the drafters live with their kernels and the teacher-forced target with the replay
# workload; re-exported here for old imports
from .drafting import PromptLookupDrafter
from .ngram_index import NgramDrafter
from .workload import TeacherForcedTarget, TraceError

__all__ = [
    "Target",
    "Drafter",
    "DraftSession",
    "PromptLookupDrafter",
    "NgramDrafter",
    "Request",
    "RequestStats",
    "RequestResult",
    "SpeculativeLoop",
    "TeacherForcedTarget",
    "TraceError",
    "TargetError",
    "SpeculationMismatch",
    "batchable_drafter",
    "compare_outputs",
]


# --------------------------------------------------------------------------------------
# protocols
# --------------------------------------------------------------------------------------
class Target(Protocol):
    def evaluate(self, inputs: Sequence[Any], cache: Any) -> tuple[Sequence[Any], Sequence[Any]]:
        """One evaluation: one chosen token and one cache per input row."""


class DraftSession(Protocol):
    def extend(self, tokens: Sequence[Any]) -> None:
        """Append tokens the target confirmed."""

    def propose(self, max_k: int) -> Sequence[Any]:
        """A draft of at most ``max_k`` tokens (empty: decode one token instead)."""


class Drafter(Protocol):
    def session(self, prompt: Sequence[Any]) -> DraftSession:
        """A fresh drafting session over one request's prompt."""


class TargetError(RuntimeError):
    """The target answered an evaluation with rows the loop cannot use."""


class SpeculationMismatch(RuntimeError):
    """A speculative output differs from the plain greedy output of the same request."""

    def __init__(self, mismatches: list[tuple[int, int]]) -> None:
        self.mismatches = mismatches  # (request index, first differing position)
        shown = ", ".join(f"request {i} at token {p}" for i, p in mismatches[:5])
        more = f" and {len(mismatches) - 5} more" if len(mismatches) > 5 else ""
        super().__init__(f"speculative output differs from plain greedy: {shown}{more}")


# --------------------------------------------------------------------------------------
# requests, stats, results
# --------------------------------------------------------------------------------------
@dataclass
class Request:
    """One generation request: ``prompt`` (non-empty), at most ``max_tokens`` generated
    tokens (the prefill's token included), stopping after ``eos`` when given. ``target``
    overrides the loop's target for this request (a teacher-forced recording is one
    target per request); ``cache`` is the cache prefill starts from."""

    prompt: Sequence[Any]
    max_tokens: int
    eos: Any = None
    target: Any = None
    cache: Any = None
    name: str = ""

    def __post_init__(self) -> None:
        self.max_tokens = check_count(self.max_tokens, "max_tokens")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        try:
            n = len(self.prompt)
        except TypeError:
            raise TypeError(
                f"prompt must be a sequence of tokens, got {type(self.prompt).__name__}"
            ) from None
        if n == 0:
            raise ValueError("prompt must hold at least one token (prefill needs a row)")


@dataclass
class RequestStats:
    """What one request cost and what speculation saved.

    ``drafted_by_position[i]`` counts verify rounds whose draft reached position ``i``,
    ``accepted_by_position[i]`` those where position ``i`` was accepted. ``control_ns``
    is the wall time spent outside the target (drafting, state transitions, bookkeeping);
    ``target_ns`` the time inside it."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    prefills: int = 0
    decodes: int = 0
    verifies: int = 0
    drafted: int = 0
    accepted: int = 0
    rollbacks: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    control_ns: int = 0
    target_ns: int = 0

    @property
    def evaluations(self) -> int:
        """Target evaluations: one per prefill, decode and verify."""
        return self.prefills + self.decodes + self.verifies

    @property
    def tokens_per_evaluation(self) -> float:
        return self.output_tokens / self.evaluations if self.evaluations else 0.0

    @property
    def mean_accepted(self) -> float:
        """Draft tokens accepted per verify round."""
        return self.accepted / self.verifies if self.verifies else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def control_us_per_token(self) -> float:
        return self.control_ns / 1e3 / self.output_tokens if self.output_tokens else 0.0

    def counts(self) -> dict[str, Any]:
        """Every count (no timings): equal for runs that took the same decisions."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "prefills": self.prefills,
            "decodes": self.decodes,
            "verifies": self.verifies,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rollbacks": self.rollbacks,
            "drafted_by_position": list(self.drafted_by_position),
            "accepted_by_position": list(self.accepted_by_position),
        }

    def as_dict(self) -> dict[str, Any]:
        d = self.counts()
        d.update(
            evaluations=self.evaluations,
            tokens_per_evaluation=self.tokens_per_evaluation,
            mean_accepted=self.mean_accepted,
            acceptance_by_position=self.acceptance_by_position,
            control_ns=self.control_ns,
            target_ns=self.target_ns,
            control_us_per_token=self.control_us_per_token,
        )
        return d


@dataclass
class RequestResult:
    """The generated tokens, the stats, and the terminal ``Done`` state."""

    output: list[Any]
    stats: RequestStats
    state: ServingState


# --------------------------------------------------------------------------------------
# one request's progress through the state machine
# --------------------------------------------------------------------------------------
class _RequestRun:
    """Steps one request: ``pending()`` says what to evaluate next (None when done),
    ``absorb()`` takes the target's rows and moves the state machine on."""

    __slots__ = (
        "state", "output", "target", "session", "k", "rule", "clone", "max_tokens", "eos",
        "stats", "done", "_dpos", "_apos", "kernels",
    )

    def __init__(
        self, request: Request, target: Any, drafter: Any, k: int, rule: Any, clone: Any, kernels: Any = None
    ):
        self.kernels = kernels  # (common_prefix, settle) of one implementation; None: _impl's
        self.state: ServingState = ServingState.start(request.prompt, request.cache)
        self.output: list[Any] = []
        self.target = request.target if request.target is not None else target
        if self.target is None:
            raise TypeError("no target: pass one to SpeculativeLoop or set Request.target")
        self.session = drafter.session(request.prompt) if (drafter is not None and k) else None
        self.k = k
        self.rule = rule
        self.clone = clone
        self.max_tokens = request.max_tokens
        self.eos = request.eos
        self.stats = RequestStats(prompt_tokens=len(request.prompt))
        self._dpos = [0] * k
        self._apos = [0] * k
        self.done = False

    def pending(self) -> tuple[Sequence[Any], Any] | None:
        st = self.state
        if type(st) is Decode:
            if self.session is not None:
                remaining = self.max_tokens - len(self.output)
                limit = self.k if self.k < remaining else remaining
                draft = self.session.propose(limit)
                if len(draft):
                    if type(draft) is not list:
                        draft = draft.tolist() if isinstance(draft, np.ndarray) else list(draft)
                    if len(draft) > limit:  # a drafter that ignores max_k
                        draft = draft[:limit]
                    v = st.enter_verify(draft, self.clone)
                    self.state = v
                    inputs = [st.last]
                    inputs += draft[:-1]
                    return inputs, v.cache
            return [st.last], st.cache
        if type(st) is Prefill:
            return st.positions, st.cache
        return None

    def absorb(self, row_tokens: Sequence[Any], row_caches: Sequence[Any], probs: Any = None) -> None:
        st = self.state
        stats = self.stats
        if probs is not None and type(st) is not Verify:
            row_tokens = list(row_tokens)
            row_tokens[-1] = _decode_choice(self.rule, probs[-1], row_tokens[-1])
        if type(st) is Verify:
            draft: Any = st.draft  # a list: pending() enters lists only
            rule = self.rule
            kernels = self.kernels
            if rule is None:  # greedy exact: what Verify.accept computes
                prefix = _impl.common_prefix if kernels is None else kernels[0]
                n = prefix(draft, row_tokens)
            elif probs is not None:  # a sampling rule: its own row tokens
                n, row_tokens = rule.select(draft, probs[: len(draft)])
            else:
                n = rule.accepted_rows(draft, row_tokens)
            nxt = st.accept_rows(n, row_tokens, row_caches)  # settle: the same on every implementation
            k = len(draft)
            stats.verifies += 1
            stats.drafted += k
            stats.accepted += n
            # histograms of draft lengths and accepted counts; per position at the end
            self._dpos[k - 1] += 1
            if n:
                self._apos[n - 1] += 1
            if isinstance(nxt, Accept):
                self.state = nxt.resume()
                self._emit(draft)
            else:
                stats.rollbacks += 1
                self.state = nxt.rollback()
                new = draft[:n]
                new.append(nxt.to)
                self._emit(new)
            return
        if len(row_tokens) == 0 or len(row_caches) == 0:
            raise TargetError(
                f"the target answered a {type(st).__name__.lower()} evaluation with "
                f"{len(row_tokens)} row tokens and {len(row_caches)} row caches; it needs at least one"
            )
        tok = row_tokens[-1]
        if type(st) is Decode:
            stats.decodes += 1
            self.state = st.advance_decode(tok, row_caches[-1])
        elif type(st) is Prefill:
            stats.prefills += 1
            self.state = st.advance_prefill(tok, row_caches[-1])
        else:  # pragma: no cover - pending() returned None for every other state
            raise RuntimeError(f"no evaluation is pending in state {type(st).__name__}")
        self._emit([tok])

    def _emit(self, tokens: list[Any]) -> None:
        out = self.output
        room = self.max_tokens - len(out)
        stop = False
        if len(tokens) >= room:
            tokens = tokens[:room]
            stop = True
        eos = self.eos
        if eos is not None and eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]
            stop = True
        out += tokens
        if stop:
            self.state = self.state.finish()
            self.done = True
        elif self.session is not None:
            self.session.extend(tokens)

    def result(self) -> RequestResult:
        stats = self.stats
        stats.output_tokens = len(self.output)
        stats.drafted_by_position = _at_least(self._dpos)
        stats.accepted_by_position = _at_least(self._apos)
        return RequestResult(self.output, stats, self.state)


def needs_probs(rule: Any) -> bool:
    """Whether ``rule`` decides from probability rows (``SpeculativeSampling``,
    ``TypicalAcceptance``): the loop then asks the target's ``evaluate_probs``."""
    return rule is not None and callable(getattr(rule, "sample_rows", None))


def _decode_choice(rule: Any, p: Any, greedy: Any) -> Any:
    """The token a decode or prefill row emits under a sampling rule: a draw from the
    row's distribution for ``SpeculativeSampling`` (with the rule's generator, so
    the emitted tokens follow the target's distribution), the greedy choice otherwise."""
    rng = getattr(rule, "rng", None)
    if rng is None:
        return greedy
    p = np.asarray(p, dtype=np.float64)
    return int(rng.choice(p.shape[0], p=p / p.sum()))


def _evaluate(target: Any, rule: Any, inputs: Sequence[Any], cache: Any) -> tuple[Any, Any, Any]:
    if needs_probs(rule):
        fn = getattr(target, "evaluate_probs", None)
        if fn is None:
            raise TypeError(
                f"{type(rule).__name__} needs probabilities: the target must have "
                "evaluate_probs(inputs, cache) -> (row_tokens, row_probs, row_caches)"
            )
        return fn(inputs, cache)
    rows, caches = target.evaluate(inputs, cache)
    return rows, None, caches


def _at_least(hist: list[int]) -> list[int]:
    """From ``hist[j]`` = rounds with exactly ``j + 1`` (drafted or accepted) tokens, the
    rounds with at least ``i + 1``: the count at each draft position."""
    out = hist[:]
    for i in range(len(out) - 2, -1, -1):
        out[i] += out[i + 1]
    return out


# --------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------
class SpeculativeLoop:
    """Drives requests through ``ServingState``: prefill, then decode or
    verify/accept/resume|rollback until ``max_tokens`` or ``eos``, then ``Done``.

    ``drafter`` makes the drafts (None or ``k == 0``: plain greedy decoding); ``k`` caps
    the draft length; ``rule`` decides how many draft rows to keep (None: greedy exact);
    ``clone`` is passed to ``enter_verify`` (None or True: the snapshot is a copy of a
    cache that can change in place and the handle itself when it is immutable; False:
    always the handle; a callable: what it returns);
    ``impl`` (``"compiled"`` or ``"python"``) runs the loop's kernels (acceptance, settle,
    the batch API) on that implementation without rebinding any module's globals; None
    (the default): the active implementation, ``specfsm._impl``'s.
    """

    def __init__(
        self,
        target: Any = None,
        drafter: Any = None,
        k: int = 5,
        rule: Any = None,
        clone: Callable[[Any], Any] | None = None,
        impl: str | None = None,
    ) -> None:
        self.k = check_count(k, "k")
        if impl is None:
            self._kernels = None
        else:
            self._kernels = (_impl.module(impl, "prefix").common_prefix, _impl.module(impl, "settle").settle)
        self.impl = impl
        if drafter is not None and not callable(getattr(drafter, "session", None)):
            raise TypeError(
                f"drafter must have a session(prompt) method, got {type(drafter).__name__}"
            )
        if rule is not None and not callable(getattr(rule, "accepted_rows", None)):
            raise TypeError(
                f"rule must be None or have an accepted_rows(draft, choices) method, got {type(rule).__name__}"
            )
        self.target = target
        self.drafter = drafter
        self.rule = rule
        self.clone = clone

    def greedy(self) -> SpeculativeLoop:
        """The same loop with speculation switched off: plain greedy decoding."""
        return SpeculativeLoop(self.target, None, 0, None, self.clone, self.impl)

    def run(self, request: Request, check: bool = False) -> RequestResult:
        """Run one request to ``Done``. ``check=True`` also runs plain greedy decoding and
        raises ``SpeculationMismatch`` if the outputs differ."""
        run = _RequestRun(request, self.target, self.drafter, self.k, self.rule, self.clone, self._kernels)
        t_target = 0
        t0 = perf_counter_ns()
        while not run.done:
            pending = run.pending()
            if pending is None:
                break
            a = perf_counter_ns()
            rows, probs, caches = _evaluate(run.target, self.rule, *pending)
            t_target += perf_counter_ns() - a
            run.absorb(rows, caches, probs)
        total = perf_counter_ns() - t0
        run.stats.target_ns = t_target
        run.stats.control_ns = total - t_target
        result = run.result()
        if check:
            _raise_on_mismatch([result], [self.greedy().run(request)])
        return result

    def run_batch(
        self,
        requests: Sequence[Request],
        check: bool = False,
        on_done: Callable[[int, RequestResult], None] | None = None,
    ) -> list[RequestResult]:
        """Run requests stepping together: each step makes one evaluation per unfinished
        request (one ``evaluate_batch`` call when they share a target that has it). The
        results equal running each request alone. ``on_done(index, result)`` is called as
        each request finishes."""
        runs = [_RequestRun(r, self.target, self.drafter, self.k, self.rule, self.clone, self._kernels) for r in requests]
        results: list[RequestResult | None] = [None] * len(runs)
        active = list(range(len(runs)))
        shared = self.target
        batch_eval = getattr(shared, "evaluate_batch", None)
        clock = perf_counter_ns
        while active:
            step: list[tuple[int, tuple[Sequence[Any], Any]]] = []
            still: list[int] = []
            for i in active:
                run = runs[i]
                t = clock()
                pending = None if run.done else run.pending()
                run.stats.control_ns += clock() - t
                if pending is None:
                    result = run.result()
                    results[i] = result
                    if on_done is not None:
                        on_done(i, result)
                else:
                    step.append((i, pending))
                    still.append(i)
            if not step:
                break
            if batch_eval is not None and not needs_probs(self.rule) and all(
                runs[i].target is shared for i, _ in step
            ):
                t = clock()
                answers = batch_eval([p[0] for _, p in step], [p[1] for _, p in step])
                share = (clock() - t) // len(step)
                for (i, _), (rows, caches) in zip(step, answers):
                    run = runs[i]
                    run.stats.target_ns += share
                    t = clock()
                    run.absorb(rows, caches)
                    run.stats.control_ns += clock() - t
            else:
                for i, (inputs, cache) in step:
                    run = runs[i]
                    t = clock()
                    rows, probs, caches = _evaluate(run.target, self.rule, inputs, cache)
                    t2 = clock()
                    run.absorb(rows, caches, probs)
                    run.stats.target_ns += t2 - t
                    run.stats.control_ns += clock() - t2
            active = still
        out = [r for r in results if r is not None]
        if len(out) != len(runs):  # pragma: no cover - every run ends in Done
            raise RuntimeError("a request did not finish")
        if check:
            _raise_on_mismatch(out, self.greedy().run_batch(requests))
        return out

    def run_batched(
        self,
        requests: Sequence[Request],
        check: bool = False,
        on_done: Callable[[int, RequestResult], None] | None = None,
        bonus: bool = False,
    ) -> list[RequestResult]:
        """``run_batch`` on the batch API: one ``BatchState`` holds every request and one
        ``step`` per serving step does acceptance, settle, the transitions, the index
        update and the next drafts for all of them. The target is still asked once per
        request per step (``evaluate``, or ``evaluate_probs`` for the sampling rules).
        Needs integer token ids and an ``NgramDrafter`` or a ``SuffixDrafter`` without a
        shared cache (or no drafter; see ``batchable_drafter``). ``bonus=True``
        verifies a K-token draft with K + 1 rows (a fully accepted draft emits K + 1
        tokens); the default is K rows (``specfsm.state``'s convention), whose results equal
        ``run_batch``'s.
        """
        drafter, k, rule = self.drafter, self.k, self.rule
        if drafter is not None and k and not batchable_drafter(drafter):
            raise TypeError(
                "run_batched drafts with an NgramDrafter or a SuffixDrafter without a shared cache "
                f"(an index per request), got {drafter!r}"
            )
        use_indexes = drafter is not None and k > 0
        kind = self.impl
        if kind is None:  # the drafter's index names its implementation
            mod = getattr(drafter, "_cls", None).__module__ if use_indexes else ""
            kind = "python" if mod.startswith("specfsm._py.") else ("compiled" if mod.startswith("specfsm._core.") else None)
        bm = _impl.module(kind, "batch") if kind else _impl.load("batch")
        n = len(requests)
        out: list[RequestResult | None] = [None] * n
        if n == 0:
            return []
        bs = bm.BatchState(n, max(k, 1), bonus=bonus)
        targets = [r.target if r.target is not None else self.target for r in requests]
        if any(t is None for t in targets):
            raise TypeError("no target: pass one to SpeculativeLoop or set Request.target")
        caches: list[Any] = [r.cache for r in requests]
        stats = [RequestStats(prompt_tokens=len(r.prompt)) for r in requests]
        outputs: list[list[Any]] = [[] for _ in requests]
        dpos = [[0] * max(k, 1) for _ in requests]
        apos = [[0] * max(k, 1) for _ in requests]
        for with_eos in (False, True):
            group = [i for i, r in enumerate(requests) if (r.eos is not None) == with_eos]
            if not group:
                continue
            prompts = [list(requests[i].prompt) for i in group]
            offs = np.zeros(len(group) + 1, dtype=np.int64)
            np.cumsum([len(p) for p in prompts], out=offs[1:])
            request_indexes = [drafter.session(requests[i].prompt).index for i in group] if use_indexes else None
            bs.admit(
                group, [t for p in prompts for t in p], offs, group,
                max_tokens=[requests[i].max_tokens for i in group],
                eos=[requests[i].eos for i in group] if with_eos else None, indexes=request_indexes,
            )
        clock = perf_counter_ns
        needs = needs_probs(rule)
        verify, prefill = bm.VERIFY, bm.PREFILL
        while True:
            t0 = clock()
            slots, inputs, offs = bs.pending()
            if len(slots) == 0:
                break
            codes = bs.states[slots].tolist()
            sl = slots.tolist()
            rows_all: list[Any] = []
            probs_all: list[Any] = []
            row_caches: list[Any] = []
            in_all, in_off = inputs.tolist(), offs.tolist()
            # everything but the target's calls is control time, as the inputs and rows
            # handled inside run_batch's pending/absorb are there
            in_target = 0
            for j, i in enumerate(sl):
                inp = in_all[in_off[j] : in_off[j + 1]]
                a = clock()
                rows, probs, rc = _evaluate(targets[i], rule, inp, caches[i])
                a = clock() - a
                stats[i].target_ns += a
                in_target += a
                if type(rows) is not list:
                    rows = list(rows)
                if len(rows) != len(inp) or len(rc) != len(inp):
                    raise TargetError(
                        f"the target answered {len(inp)} input rows with {len(rows)} row tokens "
                        f"and {len(rc)} row caches; it needs one of each per row"
                    )
                if probs is not None:
                    if codes[j] != verify:
                        rows = rows[:]      # the target's list is not changed
                        rows[-1] = _decode_choice(rule, probs[-1], rows[-1])
                    probs_all.append(np.asarray(probs, dtype=np.float64))
                rows_all += rows
                row_caches.append(rc)
            a = clock()
            control = a - t0 - in_target
            kw: dict[str, Any] = {"rule": rule}
            if needs:
                # one N x V array, rows of a narrower vocabulary padded with zeros (one copy)
                v = max(p.shape[1] for p in probs_all)
                allp = np.zeros((sum(p.shape[0] for p in probs_all), v), dtype=np.float64)
                r0 = 0
                for p in probs_all:
                    allp[r0 : r0 + p.shape[0], : p.shape[1]] = p
                    r0 += p.shape[0]
                kw["probs"] = allp
            res = bs.step(np.asarray(rows_all, dtype=np.int64), **kw)
            em, eo = res.emitted.tolist(), res.emitted_offsets.tolist()
            acc, dr, rr = res.accepted.tolist(), res.drafted.tolist(), res.resume_rows.tolist()
            finished = set(res.finished.tolist())
            for j, i in enumerate(sl):
                st = stats[i]
                code = codes[j]
                rc = row_caches[j]
                if code == verify:
                    kk, nn = dr[j], acc[j]
                    st.verifies += 1
                    st.drafted += kk
                    st.accepted += nn
                    dpos[i][kk - 1] += 1
                    if nn:
                        apos[i][min(nn, len(apos[i])) - 1] += 1
                    if nn < kk:
                        st.rollbacks += 1
                elif code == prefill:
                    st.prefills += 1
                else:
                    st.decodes += 1
                # the row of this slot's own evaluation its cache resumes from (a
                # prefill's or a decode's last row)
                caches[i] = rc[rr[j]]
                outputs[i] += em[eo[j] : eo[j + 1]]
            control += clock() - a
            share = control // len(sl)
            for i in sl:
                stats[i].control_ns += share
            for i in sorted(finished):
                st = stats[i]
                st.output_tokens = len(outputs[i])
                st.drafted_by_position = _at_least(dpos[i]) if k else []
                st.accepted_by_position = _at_least(apos[i]) if k else []
                out[i] = RequestResult(outputs[i], st, _state.Done(caches[i]))
                if on_done is not None:
                    on_done(i, out[i])  # type: ignore[arg-type]
        results = [r for r in out if r is not None]
        if len(results) != n:  # pragma: no cover - every slot ends in Done
            raise RuntimeError("a request did not finish")
        if check:
            _raise_on_mismatch(results, self.greedy().run_batch(requests))
        return results


def batchable_drafter(drafter: Any) -> bool:
    """Whether ``SpeculativeLoop.run_batched`` can draft with ``drafter`` on the batch API:
    an ``NgramDrafter``, or a ``specfsm.suffix_index.SuffixDrafter`` without a shared
    cache (its sessions hold one ``SuffixIndex`` each, which ``BatchState`` serves)."""
    if isinstance(drafter, NgramDrafter):
        return True
    from .suffix_index import SuffixDrafter

    return isinstance(drafter, SuffixDrafter) and drafter.shared is None


def compare_outputs(
    speculative: Sequence[RequestResult | Sequence[Any]], greedy: Sequence[RequestResult | Sequence[Any]]
) -> list[tuple[int, int]]:
    """``(request index, first differing token position)`` for every request whose
    speculative output differs from its plain greedy output (empty: all identical)."""
    if len(speculative) != len(greedy):
        raise ValueError(
            f"speculative has {len(speculative)} results and greedy {len(greedy)}; they must pair up"
        )
    bad = []
    for i, (s, g) in enumerate(zip(speculative, greedy)):
        a = s.output if isinstance(s, RequestResult) else list(s)
        b = g.output if isinstance(g, RequestResult) else list(g)
        if a != b:
            p = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            bad.append((i, p))
    return bad


def _raise_on_mismatch(spec: Sequence[RequestResult], greedy: Sequence[RequestResult]) -> None:
    bad = compare_outputs(spec, greedy)
    if bad:
        raise SpeculationMismatch(bad)
