"""The speculative serving loop: requests driven through the serving state machine
(``ServingState``'s transitions, on ``BatchState``) against a target.

A *target* is anything with ``evaluate(inputs, cache) -> (row_tokens, row_caches)``: one
call per prefill, decode or verify evaluation. ``inputs`` holds one token per row;
``row_tokens[i]`` is the target's greedy choice having consumed ``inputs[i]`` and
``row_caches[i]`` the cache it produced at that row. A prefill passes the prompt, a
decode ``[last]``, a verify ``[last, draft[0], ..., draft[K-2]]`` (row 0 follows
``last``, row ``i`` follows ``draft[i-1]``, ``specfsm.machine.state``'s convention). Prefill and
decode read the last row; a verify needs one row per draft token. A target with
``evaluate_batch(inputs_list, caches_list) -> [(row_tokens, row_caches), ...]`` is called
once per step for all the requests that use it (a single request too: a batch of one).

A *drafter* makes one session per request: ``drafter.session(prompt)`` returns an object
with ``extend(tokens)`` (tokens the target confirmed, never drafts) and
``propose(max_k)`` (a draft of at most ``max_k`` tokens, possibly empty).
``PromptLookupDrafter`` (``specfsm.drafting``) uses ``prompt_lookup``, ``NgramDrafter``
(``specfsm.drafting.ngram_index``) an ``NgramIndex`` and ``SuffixDrafter``
(``specfsm.drafting.suffix_index``) a ``SuffixIndex``; each lives beside its kernel.

A *rule* is ``None`` (greedy exact match, what ``Verify.accept`` does) or any object with
``accepted_rows(draft, choices) -> int`` (``specfsm.accept.rules``). The sampling rules
(``SpeculativeSampling``, ``TypicalAcceptance``) decide from probabilities: the loop then
calls the target's ``evaluate_probs(inputs, cache) -> (row_tokens, row_probs,
row_caches)`` (one probability row per input) and, for ``SpeculativeSampling``, draws
decode tokens from the row with the rule's generator. With a greedy target and a rule
that never accepts past the first disagreement, the output is exactly what plain greedy
decoding produces; ``SpeculativeLoop.run(..., check=True)`` proves it per request by
running plain greedy too.

Every request runs on ``specfsm.machine.batch.BatchState`` through one loop, ``serve``: a single
request (``SpeculativeLoop.run``) is a batch of one and ``run_batch`` steps requests
together; the indexes of an ``NgramDrafter`` or a ``SuffixDrafter`` without a shared
cache are served by the batch's ``step``, other drafters' sessions are extended and asked
for drafts by the loop. ``run_batched`` takes only the former and offers the bonus row.
Tokens that are not integer ids are mapped to ids for the batch and back. The
teacher-forced target for replay lives in ``specfsm.serving.workload`` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter_ns
from typing import Any, NamedTuple, Protocol

import numpy as np

from .._checks import check_count
from .._values import IMMUTABLE, default_clone
from ..accept._checks import R_OTHER, rule_kind
from ..machine import batch as _batch
from ..machine import state as _state

# the drafters live with their kernels and the teacher-forced target with the replay
# workload; the loop names them among its own (what a loop is driven with)
from ..drafting.lookup import PromptLookupDrafter
from ..drafting.ngram_index import NgramDrafter
from ..errors import NegativeToken
from .requests import (
    Request,
    RequestResult,
    RequestStats,
    SpeculationMismatch,
    at_least,
    compare_outputs,
    raise_on_mismatch,
)
from .workload import TeacherForcedBatch, TeacherForcedTarget, TraceError
from .answers import (TargetError, Chosen, gather, integer_ids, settle_selects, stack, TokenRule,
                      usual_rows, Vocab)

__all__ = [
    "TreeDraft",
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
class TreeDraft(NamedTuple):
    """A draft tree (``specfsm.tree``'s format: ``parents[i]`` in ``[-1, i)``, -1 the
    request's last token, siblings with distinct tokens): what a drafter returns in place
    of a chain to have ``serve`` verify a tree (``BatchState.enter_verify_tree``; greedy
    only; the target gets each slot's parents as ``evaluate_batch(..., trees=...)``)."""

    tokens: Any
    parents: Any


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


# --------------------------------------------------------------------------------------
# the one serving loop
# --------------------------------------------------------------------------------------
def _snapshot(cache: Any, clone: Any) -> Any:
    """The cache a verify evaluates from, as ``Decode.enter_verify`` takes its snapshot."""
    if clone is None or clone is True:
        return cache if type(cache) in IMMUTABLE else default_clone(cache)
    if clone is False:
        return cache
    return clone(cache)


def selects(rule: Any) -> bool:
    """Whether ``rule`` chooses its own row tokens from probability rows (it has
    ``select(draft, probs)`` and no ``accepted_rows``): the loop settles it before the
    step and hands the step the count it chose."""
    return (rule is not None and callable(getattr(rule, "select", None))
            and not callable(getattr(rule, "accepted_rows", None)))


def needs_probs(rule: Any) -> bool:
    """Whether ``rule`` decides from probability rows (``SpeculativeSampling``,
    ``TypicalAcceptance``, a rule that only ``select``s): the loop then asks the target's
    ``evaluate_batch_probs`` or ``evaluate_probs``."""
    return rule is not None and (callable(getattr(rule, "sample_rows", None)) or selects(rule))


def _eos_set(eos: Any) -> frozenset[Any] | None:
    """A request's end tokens when it names several (a set, a tuple, a list), else None."""
    if isinstance(eos, (set, frozenset, tuple, list)):
        return frozenset(eos)
    return None


def serve(
    requests: Sequence[Request],
    target: Any,
    drafter: Any,
    k: int,
    rule: Any = None,
    clone: Any = None,
    *,
    bonus: bool = False,
    on_done: Callable[[int, RequestResult], None] | None = None,
) -> list[RequestResult]:
    """Run ``requests`` to ``Done`` on one ``BatchState`` (slot ``i`` is request ``i``; a
    single request is a batch of one), one serving step at a time: ``pending()`` says
    what every live slot evaluates, the target answers (one ``evaluate_batch`` call, or
    ``evaluate_batch_probs`` when the rule needs probabilities, when every request of
    the step uses ``target`` and it has one; else one ``evaluate``/``evaluate_probs``
    per slot), and one ``step()`` settles, cuts at budgets and eos, updates the slots'
    indexes and drafts. A rule that only ``select``s is settled by the loop from the
    probability rows and the step takes its count (``settle_selects``).

    ``drafter``: an ``NgramDrafter`` or a ``SuffixDrafter`` without a shared cache has its
    sessions' indexes served by the step (``batchable_drafter``); any other drafter's
    sessions are told each verify's counts (``verified(drafted, accepted)``, where a
    session has it), extended with each step's emitted tokens, and their drafts (of at
    most ``k`` tokens and the request's remaining budget, less the bonus row) enter the
    batch with ``enter_verify``. A drafter with ``propose_step(sessions, limits)`` drafts
    for all of a step's sessions in one call (a width chosen for the whole step);
    otherwise each session's ``propose(limit)`` is called in turn, right after its
    ``extend``. ``Request.eos`` may name several end tokens (a set, tuple or list): the
    loop cuts the output after the first and finishes the slot. Cache handles in the
    batch are the slot numbers: the loop keeps the cache object each slot resumes from
    (the batch cannot hold objects), everything else (state, budget, draft, accepted
    counts, rollbacks) is read from the batch and the ``StepResult``."""
    if len(requests) == 0:
        return []
    run = _Serving(requests, target, drafter, k, rule, clone, bonus, on_done)
    run.run()
    out = [r for r in run.results if r is not None]
    if len(out) != len(requests):  # pragma: no cover - every slot ends in Done
        raise RuntimeError("a request did not finish")
    return out


class _Serving:
    """One ``serve`` call's state: the batch, what the loop keeps beside it (each slot's
    cache object, outputs and statistics) and the steps, split by concern: admission
    (``__init__``, ``_admit``), the steps (``run``), the target call and its answers
    (``_evaluate``), the batch's step on probability rows (``_settle``), the statistics
    (``_count``, ``_finish``) and what each slot does next (``_follow``,
    ``_enter_drafts``)."""

    def __init__(self, requests: Sequence[Request], target: Any, drafter: Any, k: int, rule: Any,
                 clone: Any, bonus: bool, on_done: Callable[[int, RequestResult], None] | None) -> None:
        n = len(requests)
        self.requests, self.target, self.k, self.rule, self.clone = requests, target, k, rule, clone
        self.on_done = on_done
        self.targets = targets = [r.target if r.target is not None else target for r in requests]
        if any(t is None for t in targets):
            raise TypeError("no target: pass one to SpeculativeLoop or set Request.target")
        self.vocab = vocab = None if integer_ids(requests) else Vocab()
        use = drafter is not None and k > 0
        self.by_index = use and batchable_drafter(drafter)
        self.sessions_drafting = use and not self.by_index
        self.sessions: list[Any] = [drafter.session(r.prompt) for r in requests] if use else [None] * n
        self.verified: list[Any] = (
            [getattr(s, "verified", None) for s in self.sessions] if self.sessions_drafting else [None] * n)
        self.propose_step = getattr(drafter, "propose_step", None) if self.sessions_drafting else None
        self.select_rule = selects(rule)
        self.needs = needs_probs(rule)
        self.step_rule = rule
        if vocab is not None and rule is not None and not self.needs and _judges_tokens(rule):
            self.step_rule = TokenRule(rule, vocab)
        self.bs = _batch.BatchState(n, max(k, 1), bonus=bonus)
        self.eos_sets = [_eos_set(r.eos) for r in requests]
        self._admit()
        self.caches: list[Any] = [r.cache for r in requests]  # the object behind each slot's handle
        self.outputs: list[list[Any]] = [[] for _ in requests]
        self.width = width = max(k, 1)
        self.spare = 1 if bonus else 0  # a fully accepted draft emits a token more than it holds
        # per slot: verifies, drafted, accepted, rollbacks, and the draft positions reached
        # and accepted (the rest of RequestStats follows from the steps a slot was in)
        self.ver = [0] * n
        self.drafted_n = [0] * n
        self.accepted_n = [0] * n
        self.rolled = [0] * n
        self.dpos = [[0] * width for _ in requests]
        self.apos = [[0] * width for _ in requests]
        self.target_ns = [0] * n
        self.target_total = 0  # the shared target's time, split evenly among a step's slots
        self.results: list[RequestResult | None] = [None] * n
        self._bind_target()
        self.trees_next = False  # tree slots wait in the batch (TreeDraft)
        # what _follow reads every step, in one tuple (the lists are the ones above)
        self.kept = (self.caches, self.outputs, self.eos_sets, clone, self.sessions, requests, k, self.spare,
                     self.sessions_drafting, self.propose_step)

    def _admit(self) -> None:
        """Every request into its slot: those with one end token (or none) in one
        ``admit``, those naming several (cut by the loop) in another."""
        requests, vocab, eos_sets, bs = self.requests, self.vocab, self.eos_sets, self.bs
        for with_eos in (False, True):
            group = [i for i, r in enumerate(requests) if (r.eos is not None and eos_sets[i] is None) == with_eos]
            if not group:
                continue
            prompts = [list(requests[i].prompt) if vocab is None else vocab.encode(requests[i].prompt) for i in group]
            offs = np.zeros(len(group) + 1, dtype=np.int64)
            np.cumsum([len(p) for p in prompts], out=offs[1:])
            eos = None
            if with_eos:
                eos = [requests[i].eos if vocab is None else vocab.id(requests[i].eos) for i in group]
            bs.admit(
                group, [t for p in prompts for t in p], offs, group,
                max_tokens=[requests[i].max_tokens for i in group], eos=eos,
                indexes=[self.sessions[i].index for i in group] if self.by_index else None,
            )

    def _bind_target(self) -> None:
        """The evaluation each step calls: the shared target's batched one when every
        request uses it, else each request's own (refused here when it has none)."""
        needs, target, targets = self.needs, self.target, self.targets
        self.batch_eval = getattr(target, "evaluate_batch_probs" if needs else "evaluate_batch", None)
        self.shared = self.batch_eval is not None and all(t is target for t in targets)
        self.own = own = [getattr(t, "evaluate_probs" if needs else "evaluate", None) for t in targets]
        if not self.shared and any(f is None for f in own):
            bad = type(next(t for t, f in zip(targets, own) if f is None)).__name__
            if needs:
                raise TypeError(
                    f"{type(self.rule).__name__} needs probabilities: the target must have "
                    f"evaluate_probs(inputs, cache) -> (row_tokens, row_probs, row_caches), got {bad}"
                )
            raise TypeError(f"the target must have evaluate(inputs, cache) -> (row_tokens, row_caches), got {bad}")

    def run(self) -> None:
        """Serving steps until no slot is live: each step evaluates every live slot's
        rows, settles them in one batch step, and follows each slot (its cache, output
        and next draft)."""
        clock = perf_counter_ns
        pending, step = self.bs.pending, self.bs.step
        vocab, needs, step_rule = self.vocab, self.needs, self.step_rule
        evaluate, follow = self._evaluate, self._follow
        steps = control_total = 0
        while True:
            t0 = clock()
            slots, inputs, offs = pending()
            sl = slots.tolist()
            if not sl:
                return
            steps += 1
            in_all, in_off = inputs.tolist(), offs.tolist()
            if vocab is not None:
                in_all = vocab.decode(in_all)
            feeds = [in_all[in_off[j] : in_off[j + 1]] for j in range(len(sl))]
            rows_arr, probs_all, row_caches, in_target = evaluate(slots, sl, feeds)
            if needs:
                res = self._settle(rows_arr, probs_all, sl, in_off)
            else:
                try:
                    res = step(rows_arr, rule=step_rule)
                except NegativeToken as exc:
                    raise self._off_trace(exc, sl) from None
            dr = res.drafted.tolist()
            if any(dr):
                self._count(res, sl, dr)
            finished = follow(res, sl, row_caches)
            # every live slot is in every step, so a slot's share of the steps' control
            # time is the running total at its finish (all slots start together)
            control_total += (clock() - t0 - in_target) // len(sl)
            if finished:
                self._finish(finished, steps, control_total)

    def _evaluate(self, slots: np.ndarray, sl: list[int], feeds: list[list[Any]]
                  ) -> tuple[np.ndarray, list[Any], list[Any], int]:
        """The target's answers to one step's feeds: ``(row tokens, probability rows,
        each slot's row caches, ns in the target)``. The usual answers (one row token
        and one row cache per fed row) need no check of the slots' states; anything
        else goes through ``gather``."""
        clock, needs, caches, batch_eval = perf_counter_ns, self.needs, self.caches, self.batch_eval
        rows_all: list[Any] = []
        row_caches: list[Any] = []
        probs_all: list[Any] = []
        usual = not needs
        if self.trees_next:  # a tree's rows: the target needs each slot's parents (_enter_trees checked it can)
            a = clock()
            answers = batch_eval(feeds, [caches[i] for i in sl], trees=_slot_trees(self.bs, sl))  # type: ignore[misc]
            in_target = clock() - a
            answers = [(rows, None, rc) for rows, rc in answers]
            usual = usual_rows(answers, feeds, rows_all, row_caches)
            self.target_total += in_target // len(sl)
        elif self.shared or (batch_eval is not None and all(self.targets[i] is self.target for i in sl)):
            a = clock()
            answers = batch_eval(feeds, [caches[i] for i in sl])  # type: ignore[misc]
            in_target = clock() - a
            if not needs:
                answers = [(rows, None, rc) for rows, rc in answers]
                usual = usual_rows(answers, feeds, rows_all, row_caches)
            share = in_target // len(sl)
            if self.shared:
                self.target_total += share
            else:
                for i in sl:
                    self.target_ns[i] += share
        else:  # each slot's own target, one call per slot (each slot's own time counted)
            own, target_ns = self.own, self.target_ns
            answers = []
            in_target = 0
            for f, i in zip(feeds, sl):
                a = clock()
                answer = own[i](f, caches[i])  # type: ignore[misc]
                a = clock() - a
                target_ns[i] += a
                in_target += a
                if needs:
                    answers.append(answer)
                    continue
                rows, rc = answer
                answers.append((rows, None, rc))
                if usual:
                    m = len(f)
                    if len(rows) == m and len(rc) == m:
                        rows_all += rows
                        row_caches.append(rc)
                    else:
                        usual = False
        if not usual:
            rows_all, probs_all, row_caches = gather(self.bs, slots, feeds, answers, self.rule)
        if self.vocab is not None:
            rows_all = self.vocab.encode(rows_all)
        return np.array(rows_all, dtype=np.int64), probs_all, row_caches, in_target

    def _settle(self, rows_arr: np.ndarray, probs_all: list[Any], sl: list[int], in_off: list[int]) -> Any:
        """The batch's step on the target's rows and probability rows (a ``select``
        rule settled first)."""
        step = self.bs.step
        try:
            allp = stack(probs_all)
            if self.select_rule:
                return step(rows_arr, rule=settle_selects(self.bs, sl, in_off, rows_arr, allp, self.rule))
            return step(rows_arr, rule=self.step_rule, probs=allp)
        except NegativeToken as exc:
            raise self._off_trace(exc, sl) from None

    def _off_trace(self, exc: NegativeToken, sl: list[int]) -> Exception:
        """What a negative token the step would emit means: a TraceError for a
        teacher-forced target (a row kept past a rejected draft token, which the
        recording answers off trace), else the refusal itself."""
        forced = (TeacherForcedTarget, TeacherForcedBatch)
        if isinstance(self.target, forced) or any(isinstance(self.targets[i], forced) for i in sl):
            return TraceError(
                f"the rule kept a row past a rejected draft token, which the recording "
                f"answers off trace ({exc})"
            )
        return exc

    def _count(self, res: Any, sl: list[int], dr: list[int]) -> None:
        """Each verify's drafted (``dr``) and accepted counts and how it settled, from
        the step (and told to a session that asks for them)."""
        acc = res.accepted.tolist()
        back = res.rolled_back.tolist()
        width, verified = self.width, self.verified
        for j, kk in enumerate(dr):
            if kk:
                i, nn = sl[j], acc[j]
                self.ver[i] += 1
                self.drafted_n[i] += kk
                self.accepted_n[i] += nn
                self.dpos[i][kk - 1] += 1
                if nn:
                    self.apos[i][min(nn, width) - 1] += 1
                if back[j]:
                    self.rolled[i] += 1
                tell = verified[i]
                if tell is not None:
                    tell(kk, nn)

    def _follow(self, res: Any, sl: list[int], row_caches: list[Any]) -> set[int]:
        """Each slot after the step: the cache it resumes from, its output (cut after
        one of several end tokens, which finishes it), and its next draft (the step's,
        or its session's); returns the slots that finished."""
        em, eo = res.emitted.tolist(), res.emitted_offsets.tolist()
        if self.vocab is not None:
            em = self.vocab.decode(em)
        rr = res.resume_rows.tolist()
        done = res.finished.tolist()
        finished = set(done) if done else set()
        dro = res.draft_offsets.tolist() if self.by_index else None
        caches, outputs, eos_sets, clone, sessions, requests, k, spare, drafting, propose_step = self.kept
        cut: list[int] = []
        asking: list[tuple[int, int]] = []
        drafts: list[tuple[int, int, Any]] = []
        for j, i in enumerate(sl):
            caches[i] = row_caches[j][rr[j]]
            out = em[eo[j] : eo[j + 1]]
            ends = eos_sets[i]
            if ends is not None:
                at = next((t for t, tok in enumerate(out) if tok in ends), -1)
                if at >= 0:
                    out = out[: at + 1]
                    if i not in finished:
                        cut.append(i)
                        finished.add(i)
            outputs[i] += out
            if i in finished:
                continue
            if dro is not None:
                if dro[j + 1] > dro[j] and clone is not False:  # the step drafted: it verifies next
                    caches[i] = _snapshot(caches[i], clone)
            elif drafting:
                sessions[i].extend(out)
                remaining = requests[i].max_tokens - len(outputs[i]) - spare
                limit = k if k < remaining else remaining
                if propose_step is not None:
                    asking.append((i, limit))
                else:
                    drafts.append((i, limit, sessions[i].propose(limit) if limit > 0 else ()))
        if cut:
            self.bs.finish(np.array(cut, dtype=np.int64))
        if asking:
            assert propose_step is not None  # asking is only filled for a propose_step drafter
            proposed = propose_step([sessions[i] for i, _ in asking], [limit for _, limit in asking])
            drafts += [(i, limit, d) for (i, limit), d in zip(asking, proposed)]
        if drafts:
            self._enter_drafts(drafts)
        else:
            self.trees_next = False
        return finished

    def _enter_drafts(self, drafts: list[tuple[int, int, Any]]) -> None:
        """The sessions' drafts into the batch (chains in one ``enter_verify``, trees in
        one ``enter_verify_tree``), each drafting slot's cache snapshotted."""
        new_slots: list[int] = []
        new_tokens: list[Any] = []
        new_offs = [0]
        new_trees: list[tuple[int, Any]] = []
        for i, limit, d in drafts:
            if type(d) is TreeDraft:
                new_trees.append((i, d))
            else:
                _enter(d, i, limit, self.vocab, new_slots, new_tokens, new_offs)
        caches, clone = self.caches, self.clone
        if new_slots:  # as int64 arrays: the batch converts lists more slowly
            self.bs.enter_verify(np.array(new_slots, dtype=np.int64), np.array(new_tokens, dtype=np.int64),
                                 np.array(new_offs, dtype=np.int64))
            if clone is not False:
                for i in new_slots:
                    caches[i] = _snapshot(caches[i], clone)
        self.trees_next = False
        if new_trees:
            self.trees_next = _enter_trees(self.bs, new_trees, self.vocab, self.needs, self.shared)
            if clone is not False:
                for i, _d in new_trees:
                    caches[i] = _snapshot(caches[i], clone)

    def _finish(self, finished: set[int], steps: int, control_total: int) -> None:
        """The finished slots' results and statistics after ``steps`` steps whose
        control time per slot adds up to ``control_total`` ns (``on_done`` told of each)."""
        k = self.k
        for i in sorted(finished):
            v = self.ver[i]
            st = RequestStats(
                prompt_tokens=len(self.requests[i].prompt), output_tokens=len(self.outputs[i]),
                prefills=1, decodes=steps - 1 - v, verifies=v, drafted=self.drafted_n[i],
                accepted=self.accepted_n[i], rollbacks=self.rolled[i],
                drafted_by_position=at_least(self.dpos[i]) if k else [],
                accepted_by_position=at_least(self.apos[i]) if k else [],
                control_ns=control_total, target_ns=self.target_ns[i] + self.target_total,
            )
            result = RequestResult(self.outputs[i], st, _state.Done(self.caches[i]))
            self.results[i] = result
            if self.on_done is not None:
                self.on_done(i, result)


def _judges_tokens(rule: Any) -> bool:
    """Whether the step hands ``rule`` the drafted and row tokens themselves (a rule with
    its own ``accepted_rows``, not one of the kinds the batch settles in its kernels),
    so that a loop serving non-integer tokens must show it the tokens, not their ids."""
    try:
        return rule_kind(rule)[0] == R_OTHER
    except (TypeError, ValueError):
        return True


def _enter_trees(bs: Any, trees: list[tuple[int, TreeDraft]], vocab: Vocab | None, needs: bool,
                 shared: bool) -> bool:
    """The step's tree drafts into the batch (``enter_verify_tree``); True when any
    entered. Refuses trees a rule other than greedy would settle, trees over a vocabulary
    of objects, and a target that is not one shared batch target (the parents travel with
    ``evaluate_batch``)."""
    if needs or vocab is not None or not shared:
        why = ("a rule that needs probabilities" if needs else "tokens that are not integer ids" if vocab is not None
               else "a target per request (trees need one shared target with evaluate_batch(feeds, caches, trees=))")
        raise TypeError(f"a drafter returned a TreeDraft: trees verify greedily on integer ids through one batch target, not with {why}")
    slots = [i for i, _d in trees]
    toks = [np.asarray(d.tokens, dtype=np.int64).reshape(-1) for _i, d in trees]
    pars = [np.asarray(d.parents, dtype=np.int64).reshape(-1) for _i, d in trees]
    keep = [j for j, t in enumerate(toks) if len(t)]  # an empty tree: the slot decodes
    if not keep:
        return False
    offs = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum([len(toks[j]) for j in keep], out=offs[1:])
    bs.enter_verify_tree(np.array([slots[j] for j in keep], dtype=np.int64), np.concatenate([toks[j] for j in keep]),
                         np.concatenate([pars[j] for j in keep]), offs)
    return True


def _slot_trees(bs: Any, sl: list[int]) -> list[Any]:
    """Each pending slot's tree parents (an int64 array; None for a chain, a decode)."""
    ts, par, off = bs.pending_trees()
    where = {s: j for j, s in enumerate(ts.tolist())}
    o = off.tolist()
    return [par[o[where[s]]:o[where[s] + 1]] if s in where else None for s in sl]


def _enter(draft: Any, i: int, limit: int, vocab: Vocab | None, new_slots: list[int],
           new_tokens: list[Any], new_offs: list[int]) -> None:
    """Slot ``i``'s draft (at most ``limit`` tokens kept; empty: it decodes) onto the
    step's ``enter_verify`` lists."""
    if not len(draft) or limit <= 0:
        return
    if type(draft) is not list:
        draft = draft.tolist() if isinstance(draft, np.ndarray) else list(draft)
    if len(draft) > limit:  # a drafter that ignores max_k
        draft = draft[:limit]
    new_slots.append(i)
    new_tokens += draft if vocab is None else vocab.encode(draft)
    new_offs.append(len(new_tokens))


# --------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------
class SpeculativeLoop:
    """Drives requests through the serving state machine (``serve``): prefill, then decode
    or verify/accept/resume|rollback until ``max_tokens`` or ``eos``, then ``Done``.

    ``drafter`` makes the drafts (None or ``k == 0``: plain greedy decoding); ``k`` caps
    the draft length; ``rule`` decides how many draft rows to keep (None: greedy exact; a
    rule that only ``select``s decides from probability rows, its row tokens emitted);
    ``clone`` is passed to ``enter_verify`` (None or True: the snapshot is a copy of a
    cache that can change in place and the handle itself when it is immutable; False:
    always the handle; a callable: what it returns). The loop runs on the active
    implementation (``specfsm._impl``'s choice at import).
    """

    def __init__(
        self,
        target: Any = None,
        drafter: Any = None,
        k: int = 5,
        rule: Any = None,
        clone: Callable[[Any], Any] | None = None,
    ) -> None:
        self.k = check_count(k, "k")
        if drafter is not None and not callable(getattr(drafter, "session", None)):
            raise TypeError(
                f"drafter must have a session(prompt) method, got {type(drafter).__name__}"
            )
        if rule is not None and not (callable(getattr(rule, "accepted_rows", None)) or selects(rule)):
            raise TypeError(
                "rule must be None or have an accepted_rows(draft, choices) method or a "
                f"select(draft, probs) method, got {type(rule).__name__}"
            )
        self.target = target
        self.drafter = drafter
        self.rule = rule
        self.clone = clone

    def greedy(self) -> SpeculativeLoop:
        """The same loop with speculation switched off: plain greedy decoding."""
        return SpeculativeLoop(self.target, None, 0, None, self.clone)

    def run(self, request: Request, check: bool = False) -> RequestResult:
        """Run one request to ``Done`` (a batch of one). ``check=True`` also runs plain
        greedy decoding and raises ``SpeculationMismatch`` if the outputs differ."""
        result = serve([request], self.target, self.drafter, self.k, self.rule, self.clone)[0]
        if check:
            raise_on_mismatch([result], [self.greedy().run(request)])
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
        out = serve(requests, self.target, self.drafter, self.k, self.rule, self.clone,
                    on_done=on_done)
        if check:
            raise_on_mismatch(out, self.greedy().run_batch(requests))
        return out

    def run_batched(
        self,
        requests: Sequence[Request],
        check: bool = False,
        on_done: Callable[[int, RequestResult], None] | None = None,
        bonus: bool = False,
    ) -> list[RequestResult]:
        """``run_batch`` with the drafting inside the batch's ``step`` (the index update
        and the next drafts for every request), optionally with the bonus row. Needs an
        ``NgramDrafter`` or a ``SuffixDrafter`` without a shared cache (or no drafter;
        see ``batchable_drafter``). ``bonus=True`` verifies a K-token draft with K + 1
        rows (a fully accepted draft emits K + 1 tokens); the default is K rows
        (``specfsm.machine.state``'s convention), whose results equal ``run_batch``'s.
        """
        if self.drafter is not None and self.k and not batchable_drafter(self.drafter):
            raise TypeError(
                "run_batched drafts with an NgramDrafter or a SuffixDrafter without a shared cache "
                f"(an index per request), got {self.drafter!r}"
            )
        out = serve(requests, self.target, self.drafter, self.k, self.rule, self.clone,
                    bonus=bonus, on_done=on_done)
        if check:
            raise_on_mismatch(out, self.greedy().run_batch(requests))
        return out


def batchable_drafter(drafter: Any) -> bool:
    """Whether ``SpeculativeLoop.run_batched`` can draft with ``drafter`` on the batch API:
    an ``NgramDrafter``, or a ``specfsm.drafting.suffix_index.SuffixDrafter`` without a shared
    cache (its sessions hold one ``SuffixIndex`` each, which ``BatchState`` serves)."""
    if isinstance(drafter, NgramDrafter):
        return True
    from ..drafting.suffix_index import SuffixDrafter

    return isinstance(drafter, SuffixDrafter) and drafter.shared is None


