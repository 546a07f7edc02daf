"""The one serving loop's extension points (``specfsm.serving.loop.serve``), which the
transformers generator drives its runs through: a target's ``evaluate_batch_probs``, a
rule that only ``select``s (settled by the loop, counted by the step), several end
tokens per request, a drafter's ``propose_step`` (one call per step for every live
session) and a session's ``verified(drafted, accepted)``. Each is checked against a
reference written out per request on ``ServingState``."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specfsm import Done, ServingState
from specfsm.accept.rules import SpeculativeSampling
from specfsm.machine.state import Accept, Decode, Rollback, Verify
from specfsm.serving import loop as loop_mod
from specfsm.serving.loop import PromptLookupDrafter, Request, SpeculativeLoop, needs_probs, selects, serve

V = 7


class ProbTarget:
    """A deterministic target with a distribution at every row: the choice after a
    history is a function of its last two tokens and length, the distribution puts 0.6
    on it and spreads the rest. Counts its calls of each kind."""

    def __init__(self) -> None:
        self.calls = {"evaluate_probs": 0, "evaluate_batch_probs": 0}

    def _rows(self, inputs, cache):
        consumed = () if cache is None else cache
        toks, probs, caches = [], [], []
        for x in inputs:
            consumed = consumed + (x,)
            b, c = ((0,) + consumed)[-2:]
            t = (3 * b + c + 1 + (len(consumed) // 9) % 2) % V
            p = np.full(V, 0.4 / (V - 1))
            p[t] = 0.6
            toks.append(t)
            probs.append(p)
            caches.append(consumed)
        return toks, np.array(probs), caches

    def evaluate(self, inputs, cache):
        t, _p, c = self._rows(inputs, cache)
        return t, c

    def evaluate_probs(self, inputs, cache):
        self.calls["evaluate_probs"] += 1
        return self._rows(inputs, cache)


class BatchProbTarget(ProbTarget):
    def evaluate_batch_probs(self, inputs_list, caches_list):
        self.calls["evaluate_batch_probs"] += 1
        return [self._rows(i, c) for i, c in zip(inputs_list, caches_list)]


class TakeTwo:
    """A rule that only selects: it keeps at most two draft tokens where the row's most
    likely token agrees, and on a rejection puts the row's least likely token (a token
    the target's own choice never is), so the output shows whose token was emitted."""

    def select(self, draft, probs):
        for i, x in enumerate(draft):
            if i == 2 or int(np.argmax(probs[i])) != x:
                return i, list(draft[:i]) + [int(np.argmin(probs[i]))]
        return len(draft), list(draft)


def reference(target, rule, drafter, prompt, k, max_tokens):
    """One request on ``ServingState`` with the rule's ``select`` (``accept_with``),
    written out by hand: the output and the (drafted, accepted) of every verify."""
    session = drafter.session(prompt)
    rows, probs, caches = target._rows(list(prompt), None)
    state = ServingState.start(list(prompt), cache=None).advance_prefill(rows[-1], cache=caches[-1])
    out, verifies = [rows[-1]], []
    session.extend([rows[-1]])
    while len(out) < max_tokens:
        limit = min(k, max_tokens - len(out))
        draft = list(session.propose(limit))
        assert isinstance(state, Decode)
        if not draft:
            rows, probs, caches = target._rows([state.last], state.cache)
            state = state.advance_decode(rows[-1], cache=caches[-1])
            emitted = [rows[-1]]
        else:
            v = state.enter_verify(draft, clone=False)
            assert isinstance(v, Verify)
            rows, probs, caches = target._rows([state.last] + draft[:-1], state.cache)
            settled = v.accept_with(rule, probs, caches)
            if isinstance(settled, Accept):
                n, emitted = len(draft), draft
                state = settled.resume()
            else:
                assert isinstance(settled, Rollback)
                n = caches.index(settled.snapshot)
                emitted = draft[:n] + [settled.to]
                state = settled.rollback()
            verifies.append((len(draft), n))
        emitted = emitted[: max_tokens - len(out)]
        out += emitted
        session.extend(emitted)
    return out, verifies


def prompts(seed, n):
    rnd = random.Random(seed)
    base = [rnd.randrange(V) for _ in range(6)]
    return [base * 2 + [rnd.randrange(V) for _ in range(rnd.randrange(1, 5))] for _ in range(n)]


def test_rule_kinds():
    assert selects(TakeTwo()) and needs_probs(TakeTwo())
    assert not selects(SpeculativeSampling(seed=0)) and needs_probs(SpeculativeSampling(seed=0))
    assert not selects(None) and not needs_probs(None)


@pytest.mark.parametrize("target_cls", [ProbTarget, BatchProbTarget])
def test_a_select_rule_is_settled_by_the_loop_as_serving_state_settles_it(fsm, target_cls):
    drafter = PromptLookupDrafter(2)
    ps = prompts(1, 4)
    target = target_cls()
    got = SpeculativeLoop(target, drafter, k=4, rule=TakeTwo()).run_batch([Request(p, 30) for p in ps])
    for p, res in zip(ps, got):
        want, verifies = reference(ProbTarget(), TakeTwo(), drafter, p, 4, 30)
        assert res.output == want
        assert res.stats.verifies == len(verifies) > 0
        assert res.stats.accepted == sum(n for _k, n in verifies)
        assert res.stats.rollbacks == sum(n < k for k, n in verifies) > 0
    # the rule's own rejection tokens were emitted (the target never chooses them)
    assert any(r.stats.rollbacks for r in got)
    # one batched call per step where the target has it, else one call per slot
    if target_cls is BatchProbTarget:
        assert target.calls["evaluate_probs"] == 0 and target.calls["evaluate_batch_probs"] > 0
    else:
        assert target.calls["evaluate_probs"] > 0


def test_several_end_tokens_cut_after_the_first(fsm):
    target = ProbTarget()
    p = prompts(2, 1)[0]
    full = SpeculativeLoop(target, None, k=0).run(Request(p, 40)).output
    ends = {full[7], full[12]}
    first = min(i for i, t in enumerate(full) if t in ends)
    for drafter, k in ((None, 0), (PromptLookupDrafter(2), 4)):
        got = SpeculativeLoop(target, drafter, k=k).run(Request(p, 40, eos=ends))
        assert got.output == full[: first + 1]
        assert isinstance(got.state, Done)
    # one end token given as a set behaves as the single token
    one = SpeculativeLoop(target, PromptLookupDrafter(2), k=4).run(Request(p, 40, eos={full[7]}))
    assert one.output == SpeculativeLoop(target, PromptLookupDrafter(2), k=4).run(Request(p, 40, eos=full[7])).output


class StepDrafter:
    """Prompt lookup per session, drafted for all live sessions in one call per step,
    every draft cut to the step's shortest (a width for the whole step); records the
    calls and each session's verified counts."""

    def __init__(self) -> None:
        self.inner = PromptLookupDrafter(2)
        self.calls: list[tuple[int, list[int]]] = []
        self.sessions: list[Session] = []

    def session(self, prompt):
        s = Session(self.inner.session(prompt))
        self.sessions.append(s)
        return s

    def propose_step(self, sessions, limits):
        drafts = [list(s.inner.propose(lim)) for s, lim in zip(sessions, limits)]
        self.calls.append((len(sessions), list(limits)))
        w = min((len(d) for d in drafts if d), default=0)
        return [d[:w] for d in drafts]


class Session:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.verifies: list[tuple[int, int]] = []
        self.extended = 0

    def extend(self, tokens):
        self.extended += len(tokens)
        self.inner.extend(tokens)

    def verified(self, drafted, accepted):
        self.verifies.append((drafted, accepted))

    def propose(self, max_k):  # pragma: no cover - propose_step is used instead
        raise AssertionError("the loop must call propose_step")


@pytest.mark.parametrize("bonus", [False, True])
def test_propose_step_drafts_every_live_session_in_one_call(fsm, bonus):
    target = ProbTarget()
    ps = prompts(3, 3)
    budgets = [20, 31, 9]
    drafter = StepDrafter()
    got = serve([Request(p, b) for p, b in zip(ps, budgets)], target, drafter, 5, bonus=bonus)
    plain = [SpeculativeLoop(target, None, k=0).run(Request(p, b)).output for p, b in zip(ps, budgets)]
    assert [r.output for r in got] == plain  # greedy exact: speculation changes nothing
    # one call per step, for every live request, limits capped by k and the budget less
    # the bonus row
    steps = max(r.stats.evaluations for r in got) - 1
    assert len(drafter.calls) == steps
    assert [n for n, _ in drafter.calls] == sorted((n for n, _ in drafter.calls), reverse=True)
    assert all(0 <= lim <= 5 for _, lims in drafter.calls for lim in lims)
    assert drafter.calls[0][1] == [min(5, b - 1 - int(bonus)) for b in budgets]
    for s, r in zip(drafter.sessions, got):
        assert s.verifies and len(s.verifies) == r.stats.verifies
        assert sum(n for _k, n in s.verifies) == r.stats.accepted
        assert sum(k for k, _n in s.verifies) == r.stats.drafted
        assert 0 < s.extended <= len(r.output)  # every step but the one that finished it


def test_the_loop_names_select_rules_in_its_refusal():
    with pytest.raises(TypeError, match="accepted_rows.*select"):
        SpeculativeLoop(ProbTarget(), rule=object())
    SpeculativeLoop(ProbTarget(), rule=TakeTwo())  # a select rule is taken


def test_the_transformers_generator_runs_through_the_one_loop(monkeypatch):
    """``SpeculativeGenerator.generate`` calls ``serve`` once per run, whatever its rule."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from specfsm.hf import generate as hf_generate

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    calls = []
    real = loop_mod.serve

    def counting(*a, **kw):
        calls.append(kw.get("bonus"))
        return real(*a, **kw)

    monkeypatch.setattr(hf_generate, "serve", counting)
    for kw in ({}, {"do_sample": True, "seed": 0}, {"do_sample": True, "seed": 0, "rule": TakeTwo()}):
        gen = hf_generate.SpeculativeGenerator(model, eos_token_id=None, **kw)
        outs = gen.generate([[1, 2, 3, 1, 2, 3], [4, 5]], 12)
        assert [len(o.tokens) for o in outs] == [12, 12]
    assert calls == [True, True, True]
