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
from ..accept.rules import select_rows
from ..machine import batch as _batch
from ..machine import state as _state
from ..machine.batch import PREFILL, VERIFY

# the drafters live with their kernels and the teacher-forced target with the replay
# workload; re-exported here for old imports
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


class TargetError(RuntimeError):
    """The target answered an evaluation with rows the loop cannot use."""


# --------------------------------------------------------------------------------------
# the one serving loop
# --------------------------------------------------------------------------------------
class _Vocab:
    """Token <-> int64 id for requests whose tokens are not all integer ids: the batch
    holds ids, the target, the drafter sessions and the outputs see the tokens."""

    __slots__ = ("ids", "tokens")

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.tokens: list[Any] = []

    def id(self, token: Any) -> int:
        i = self.ids.get(token)
        if i is None:
            i = self.ids[token] = len(self.tokens)
            self.tokens.append(token)
        return i

    def encode(self, tokens: Sequence[Any]) -> list[int]:
        return [self.id(t) for t in tokens]

    def decode(self, ids: Sequence[int]) -> list[Any]:
        toks = self.tokens
        return [toks[i] for i in ids]


class _TokenRule:
    """A caller's ``accepted_rows`` rule seen through a ``_Vocab``: it judges the tokens,
    not the batch's ids."""

    __slots__ = ("rule", "vocab")

    def __init__(self, rule: Any, vocab: _Vocab) -> None:
        self.rule, self.vocab = rule, vocab

    def accepted_rows(self, draft: Sequence[int], choices: Sequence[int]) -> Any:
        return self.rule.accepted_rows(self.vocab.decode(draft), self.vocab.decode(choices))


def _integer_ids(requests: Sequence[Request]) -> bool:
    """Whether every prompt and eos is a non-negative integer id (the batch's own tokens)."""
    for r in requests:
        if r.eos is not None and not (isinstance(r.eos, (int, np.integer)) and r.eos >= 0):
            return False
        p = r.prompt
        if isinstance(p, np.ndarray):
            if p.dtype.kind not in "iu" or (p.dtype.kind == "i" and p.size and p.min() < 0):
                return False
        elif not all(type(t) is int and t >= 0 for t in p):
            if not all(isinstance(t, (int, np.integer)) and t >= 0 for t in p):
                return False
    return True


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


def _decode_choice(rule: Any, p: Any, greedy: Any) -> Any:
    """The token a decode or prefill row emits under a sampling rule: a draw from the
    row's distribution for ``SpeculativeSampling`` (with the rule's generator, so
    the emitted tokens follow the target's distribution), the target's own choice
    otherwise (a sampling target's choice is its sample)."""
    rng = getattr(rule, "rng", None)
    if rng is None:
        return greedy
    p = np.asarray(p, dtype=np.float64)
    return int(rng.choice(p.shape[0], p=p / p.sum()))


def _eos_set(eos: Any) -> frozenset[Any] | None:
    """A request's end tokens when it names several (a set, a tuple, a list), else None."""
    if isinstance(eos, (set, frozenset, tuple, list)):
        return frozenset(eos)
    return None


class _Chosen:
    """The counts a ``select`` rule chose, slot by slot, as an ``accepted_rows`` rule for
    the step (which asks once per verifying slot, in ``slots`` order); refuses a draft
    other than the one the count was chosen for."""

    __slots__ = ("chosen", "at")

    def __init__(self, chosen: list[tuple[list[int], int]]) -> None:
        self.chosen, self.at = chosen, 0

    def accepted_rows(self, draft: Sequence[int], choices: Sequence[int]) -> int:
        want, n = self.chosen[self.at]
        if list(draft) != want:  # pragma: no cover - the step's order is slots order
            raise RuntimeError("the step asked for a verify the loop did not settle")
        self.at += 1
        return n


def _gather(bs: Any, slots: Any, feeds: list[list[Any]], answers: list[tuple[Any, Any, Any]],
            rule: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """The targets' answers as the step's flat row tokens, probability rows (when the
    rule needs them) and each slot's row caches; a prefill or a decode reads its last
    row only. Refuses an answer short of rows (TargetError)."""
    rows_all: list[Any] = []
    probs_all: list[Any] = []
    row_caches: list[Any] = []
    codes: list[int] | None = None  # the slots' states, read when an answer needs them
    for j, (rows, probs, rc) in enumerate(answers):
        m = len(feeds[j])
        if probs is None and len(rows) == m and len(rc) == m:  # the usual answer
            rows_all += rows
            row_caches.append(rc)
            continue
        if codes is None:
            codes = bs.states[slots].tolist()
        if codes[j] != VERIFY:
            if len(rows) == 0 or len(rc) == 0:
                kind = "prefill" if codes[j] == PREFILL else "decode"
                raise TargetError(
                    f"the target answered a {kind} evaluation with {len(rows)} row tokens and "
                    f"{len(rc)} row caches; it needs at least one"
                )
            last = rows[-1] if probs is None else _decode_choice(rule, probs[-1], rows[-1])
            rows_all += [last] * m
            row_caches.append([rc[-1]] * m)
            if probs is not None:
                p = np.asarray(probs, dtype=np.float64)
                probs_all.append(p if p.shape[0] == m else np.repeat(p[-1:], m, axis=0))
        else:
            if len(rows) < m or len(rc) < m:
                raise TargetError(
                    f"the target answered {m} input rows with {len(rows)} row tokens "
                    f"and {len(rc)} row caches; it needs one of each per row"
                )
            rows_all += rows[:m]
            row_caches.append(rc)
            if probs is not None:
                probs_all.append(np.asarray(probs, dtype=np.float64)[:m])
    return rows_all, probs_all, row_caches


def _stack(probs_all: list[Any]) -> np.ndarray:
    """One N x V array of the slots' probability rows, a narrower vocabulary padded with
    zeros (one copy)."""
    v = max(p.shape[1] for p in probs_all)
    allp = np.zeros((sum(p.shape[0] for p in probs_all), v), dtype=np.float64)
    r0 = 0
    for p in probs_all:
        allp[r0 : r0 + p.shape[0], : p.shape[1]] = p
        r0 += p.shape[0]
    return allp


def _settle_selects(bs: Any, slots: list[int], offs: list[int], rows: np.ndarray, probs: np.ndarray,
                    rule: Any) -> _Chosen:
    """A ``select`` rule's decision for every verifying slot, before the step: its row
    tokens replace the target's at that slot's rows (the last rows keep the target's,
    a bonus row among them), and the count it chose is what the step accepts."""
    codes = bs.states[np.asarray(slots, dtype=np.int64)].tolist()
    chosen = []
    for j, s in enumerate(slots):
        if codes[j] != VERIFY:
            continue
        draft = bs.slot_fields(s)[3]
        a, b = offs[j], offs[j + 1]
        n, toks = select_rows(rule, draft, probs[a:b])
        n = check_count(n, "accepted")
        if n > len(draft):
            raise ValueError(f"{type(rule).__name__}.select accepted {n} rows of a {len(draft)}-token draft")
        toks = list(toks)[: b - a]
        rows[a : a + len(toks)] = toks
        chosen.append((draft, n))
    return _Chosen(chosen)


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
    probability rows and the step takes its count (``_settle_selects``).

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
    n = len(requests)
    if n == 0:
        return []
    targets = [r.target if r.target is not None else target for r in requests]
    if any(t is None for t in targets):
        raise TypeError("no target: pass one to SpeculativeLoop or set Request.target")
    vocab = None if _integer_ids(requests) else _Vocab()
    use = drafter is not None and k > 0
    by_index = use and batchable_drafter(drafter)
    sessions_drafting = use and not by_index
    sessions: list[Any] = [drafter.session(r.prompt) for r in requests] if use else [None] * n
    verified = [getattr(s, "verified", None) for s in sessions] if sessions_drafting else [None] * n
    propose_step = getattr(drafter, "propose_step", None) if sessions_drafting else None
    select_rule = selects(rule)
    step_rule = rule
    if vocab is not None and rule is not None and not needs_probs(rule) and type(rule).__module__ != "specfsm.accept.rules":
        step_rule = _TokenRule(rule, vocab)
    bs = _batch.BatchState(n, max(k, 1), bonus=bonus)
    eos_sets = [_eos_set(r.eos) for r in requests]
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
            indexes=[sessions[i].index for i in group] if by_index else None,
        )
    caches: list[Any] = [r.cache for r in requests]  # the object behind each slot's handle
    outputs: list[list[Any]] = [[] for _ in requests]
    width = max(k, 1)
    spare = 1 if bonus else 0  # a fully accepted draft emits a token more than it holds
    # per slot: verifies, drafted, accepted, rollbacks, and the draft positions reached
    # and accepted (the rest of RequestStats follows from the steps a slot was in)
    ver = [0] * n
    drafted_n = [0] * n
    accepted_n = [0] * n
    rolled = [0] * n
    dpos = [[0] * width for _ in requests]
    apos = [[0] * width for _ in requests]
    target_ns = [0] * n
    # every live slot is in every step, so a slot's share of the steps' control time is
    # the running total at its finish (all slots start together)
    control_total = 0
    target_total = 0  # the shared target's time, split evenly among a step's slots
    steps = 0
    results: list[RequestResult | None] = [None] * n
    needs = needs_probs(rule)
    batch_eval = getattr(target, "evaluate_batch_probs" if needs else "evaluate_batch", None)
    shared = batch_eval is not None and all(t is target for t in targets)
    own = [getattr(t, "evaluate_probs" if needs else "evaluate", None) for t in targets]
    if not shared and any(f is None for f in own):
        bad = type(next(t for t, f in zip(targets, own) if f is None)).__name__
        if needs:
            raise TypeError(
                f"{type(rule).__name__} needs probabilities: the target must have "
                f"evaluate_probs(inputs, cache) -> (row_tokens, row_probs, row_caches), got {bad}"
            )
        raise TypeError(f"the target must have evaluate(inputs, cache) -> (row_tokens, row_caches), got {bad}")
    clock = perf_counter_ns
    step = bs.step
    trees_next = False  # tree slots wait in the batch (TreeDraft)
    while True:
        t0 = clock()
        slots, inputs, offs = bs.pending()
        sl = slots.tolist()
        if not sl:
            break
        steps += 1
        in_all, in_off = inputs.tolist(), offs.tolist()
        if vocab is not None:
            in_all = vocab.decode(in_all)
        feeds = [in_all[in_off[j] : in_off[j + 1]] for j in range(len(sl))]
        # the usual answers (one row token and one row cache per fed row) need no check
        # of the slots' states; anything else goes through _gather
        rows_all: list[Any] = []
        row_caches: list[Any] = []
        usual = not needs
        if trees_next:  # a tree's rows: the target needs each slot's parents (_enter_trees checked it can)
            a = clock()
            answers = batch_eval(feeds, [caches[i] for i in sl], trees=_slot_trees(bs, sl))  # type: ignore[misc]
            in_target = clock() - a
            answers = [(rows, None, rc) for rows, rc in answers]
            for (rows, _p, rc), f in zip(answers, feeds):
                if len(rows) != len(f) or len(rc) != len(f):
                    usual = False
                    break
                rows_all += rows
                row_caches.append(rc)
            target_total += in_target // len(sl)
        elif shared or (batch_eval is not None and all(targets[i] is target for i in sl)):
            a = clock()
            answers = batch_eval(feeds, [caches[i] for i in sl])  # type: ignore[misc]
            in_target = clock() - a
            if not needs:
                answers = [(rows, None, rc) for rows, rc in answers]
                for (rows, _p, rc), f in zip(answers, feeds):
                    m = len(f)
                    if len(rows) != m or len(rc) != m:
                        usual = False
                        break
                    rows_all += rows
                    row_caches.append(rc)
            share = in_target // len(sl)
            if shared:
                target_total += share
            else:
                for i in sl:
                    target_ns[i] += share
        else:
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
            rows_all, probs_all, row_caches = _gather(bs, slots, feeds, answers, rule)
        if vocab is not None:
            rows_all = vocab.encode(rows_all)
        rows_arr = np.array(rows_all, dtype=np.int64)
        try:
            if needs:
                allp = _stack(probs_all)
                if select_rule:
                    res = step(rows_arr, rule=_settle_selects(bs, sl, in_off, rows_arr, allp, rule))
                else:
                    res = step(rows_arr, rule=step_rule, probs=allp)
            else:
                res = step(rows_arr, rule=step_rule)
        except NegativeToken as exc:
            forced = (TeacherForcedTarget, TeacherForcedBatch)
            if isinstance(target, forced) or any(isinstance(targets[i], forced) for i in sl):
                raise TraceError(
                    f"the rule kept a row past a rejected draft token, which the recording "
                    f"answers off trace ({exc})"
                ) from None
            raise
        em, eo = res.emitted.tolist(), res.emitted_offsets.tolist()
        if vocab is not None:
            em = vocab.decode(em)
        rr = res.resume_rows.tolist()
        done = res.finished.tolist()
        finished = set(done) if done else set()
        dr = res.drafted.tolist()
        if any(dr):
            acc = res.accepted.tolist()
            back = res.rolled_back.tolist()
            for j, kk in enumerate(dr):
                if kk:  # a verify: drafted, accepted and how it settled, from the step
                    i, nn = sl[j], acc[j]
                    ver[i] += 1
                    drafted_n[i] += kk
                    accepted_n[i] += nn
                    dpos[i][kk - 1] += 1
                    if nn:
                        apos[i][min(nn, width) - 1] += 1
                    if back[j]:
                        rolled[i] += 1
                    if verified[i] is not None:
                        verified[i](kk, nn)
        dro = res.draft_offsets.tolist() if by_index else None
        cut: list[int] = []
        asking: list[int] = []
        limits: list[int] = []
        new_slots: list[int] = []
        new_tokens: list[Any] = []
        new_offs = [0]
        new_trees: list[tuple[int, Any]] = []
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
            elif sessions_drafting:
                sessions[i].extend(out)
                remaining = requests[i].max_tokens - len(outputs[i]) - spare
                limit = k if k < remaining else remaining
                if propose_step is not None:
                    asking.append(i)
                    limits.append(limit)
                else:
                    d = sessions[i].propose(limit) if limit > 0 else ()
                    if type(d) is TreeDraft:
                        new_trees.append((i, d))
                    else:
                        _enter(d, i, limit, vocab, new_slots, new_tokens, new_offs)
        if cut:
            bs.finish(np.array(cut, dtype=np.int64))
        if asking:
            assert propose_step is not None  # asking is only filled for a propose_step drafter
            drafts = propose_step([sessions[i] for i in asking], limits)
            for i, limit, draft in zip(asking, limits, drafts):
                if type(draft) is TreeDraft:
                    new_trees.append((i, draft))
                else:
                    _enter(draft, i, limit, vocab, new_slots, new_tokens, new_offs)
        if new_slots:  # as int64 arrays: the batch converts lists more slowly
            bs.enter_verify(np.array(new_slots, dtype=np.int64), np.array(new_tokens, dtype=np.int64),
                            np.array(new_offs, dtype=np.int64))
            if clone is not False:
                for i in new_slots:
                    caches[i] = _snapshot(caches[i], clone)
        trees_next = False
        if new_trees:
            trees_next = _enter_trees(bs, new_trees, vocab, needs, shared)
            if clone is not False:
                for i, _d in new_trees:
                    caches[i] = _snapshot(caches[i], clone)
        control_total += (clock() - t0 - in_target) // len(sl)
        if finished:
            for i in sorted(finished):
                v = ver[i]
                st = RequestStats(
                    prompt_tokens=len(requests[i].prompt), output_tokens=len(outputs[i]),
                    prefills=1, decodes=steps - 1 - v, verifies=v, drafted=drafted_n[i],
                    accepted=accepted_n[i], rollbacks=rolled[i],
                    drafted_by_position=at_least(dpos[i]) if k else [],
                    accepted_by_position=at_least(apos[i]) if k else [],
                    control_ns=control_total, target_ns=target_ns[i] + target_total,
                )
                result = RequestResult(outputs[i], st, _state.Done(caches[i]))
                results[i] = result
                if on_done is not None:
                    on_done(i, result)
    out = [r for r in results if r is not None]
    if len(out) != n:  # pragma: no cover - every slot ends in Done
        raise RuntimeError("a request did not finish")
    return out


def _enter_trees(bs: Any, trees: list[tuple[int, TreeDraft]], vocab: _Vocab | None, needs: bool,
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


def _enter(draft: Any, i: int, limit: int, vocab: _Vocab | None, new_slots: list[int],
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


