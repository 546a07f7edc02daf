"""The speculative serving loop (``specfsm.serving.loop``): speculation never changes what plain
greedy decoding produces, batches equal single requests, and the teacher-forced target
answers exactly as documented. State-machine tests run against both implementations
through the ``fsm`` fixture."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specfsm import Done
from specfsm.serving.loop import (
    NgramDrafter,
    PromptLookupDrafter,
    Request,
    SpeculationMismatch,
    SpeculativeLoop,
    TargetError,
    TeacherForcedTarget,
    TraceError,
    compare_outputs,
)

from specfsm.accept import rules as accept_rule

from reference import OverAcceptingRule


# --------------------------------------------------------------------------------------
# targets
# --------------------------------------------------------------------------------------
class SuccessorTarget:
    """The seed's fake target: the greedy choice after ``x`` is ``(x + 1) % vocab``; the
    cache is the running token count."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.calls = 0

    def evaluate(self, inputs, cache):
        self.calls += 1
        c = 0 if cache is None else cache
        return [(x + 1) % self.vocab for x in inputs], [c + i + 1 for i in range(len(inputs))]


class HistoryTarget:
    """A target whose choice depends on the cache, so resuming from the wrong row's cache
    changes the output: the cache is the tuple of consumed tokens and the choice is a
    function of the last two of them and of how many there are (small vocabulary: the
    stream repeats, drafts get accepted)."""

    def __init__(self, vocab: int = 7) -> None:
        self.vocab = vocab

    def evaluate(self, inputs, cache):
        consumed = () if cache is None else cache
        rows, caches = [], []
        for x in inputs:
            consumed = consumed + (x,)
            b, c = ((0,) + consumed)[-2:]
            rows.append((3 * b + c + 1 + (len(consumed) // 40) % 2) % self.vocab)
            caches.append(consumed)
        return rows, caches


class BatchHistoryTarget(HistoryTarget):
    """The same target with ``evaluate_batch``: one call per step."""

    def __init__(self, vocab: int = 7) -> None:
        super().__init__(vocab)
        self.batch_calls = 0

    def evaluate_batch(self, inputs_list, caches_list):
        self.batch_calls += 1
        return [self.evaluate(i, c) for i, c in zip(inputs_list, caches_list)]


class ArrayCacheTarget:
    """A KV-cache-like numpy cache written in place: row ``i`` writes the token it
    consumed at its position, so a snapshot that is not an independent copy would be
    corrupted by a rejected draft. The choice depends on the cached contents."""

    def __init__(self, vocab: int = 5, capacity: int = 512) -> None:
        self.vocab = vocab
        self.capacity = capacity

    def evaluate(self, inputs, cache):
        if cache is None:
            cache = (np.zeros(self.capacity, dtype=np.int64), 0)
        buf, n = cache
        rows, caches = [], []
        for x in inputs:
            buf[n] = x  # in place, like a real KV cache
            n += 1
            window = buf[max(0, n - 4) : n]
            rows.append(int(window.sum() + n // 9) % self.vocab)
            caches.append((buf, n))
        return rows, caches


def array_clone(cache):
    buf, n = cache
    return (buf.copy(), n)


# --------------------------------------------------------------------------------------
# drafters and rules that must all be greedy-exact
# --------------------------------------------------------------------------------------
class FirstRunAtLeast:
    """A local min-run rule (the seed's anchor-macro policy), so the test does not depend
    on ``specfsm.accept.rules``."""

    def __init__(self, m: int) -> None:
        self.m = m

    def accepted_rows(self, draft, choices):
        n = 0
        for d, c in zip(draft, choices):
            if d != c:
                break
            n += 1
        return n if n >= self.m else 0


def drafters():
    return [
        PromptLookupDrafter(1), PromptLookupDrafter(2), PromptLookupDrafter(3),
        NgramDrafter(2, 2), NgramDrafter(1, 3), NgramDrafter(1, 4, "earliest"),
    ]


def rules():
    return [
        None, FirstRunAtLeast(1), FirstRunAtLeast(3),
        accept_rule.Exact(), accept_rule.MinRun(2), accept_rule.MinRun(3),
    ]


DRAFTERS = drafters()
RULES = rules()


def plain_greedy(target, prompt, max_tokens, eos=None):
    """Plain greedy decoding written out by hand, without the state machine."""
    rows, caches = target.evaluate(list(prompt), None)
    out, cache = [rows[-1]], caches[-1]
    while len(out) < max_tokens and (eos is None or out[-1] != eos):
        rows, caches = target.evaluate([out[-1]], cache)
        out.append(rows[-1])
        cache = caches[-1]
    return out


# --------------------------------------------------------------------------------------
# the seed's oracle
# --------------------------------------------------------------------------------------
def test_serving_state_speculation_matches_plain_greedy_for_thirty_two_tokens(fsm):
    """The seed's 32-token oracle through the loop: vocab 11, prompt [3, 5], prompt
    lookup with 2-grams, drafts of up to 5."""
    target = SuccessorTarget(11)
    request = Request([3, 5], 32)
    spec = SpeculativeLoop(target, PromptLookupDrafter(2), k=5).run(request, check=True)
    greedy = SpeculativeLoop(target).run(request)
    expected = [(5 + 1 + i) % 11 for i in range(32)]
    assert greedy.output == expected
    assert spec.output == expected
    assert spec.stats.verifies > 0 and spec.stats.accepted > 0, "the run never drafted"
    assert spec.stats.evaluations < greedy.stats.evaluations == 32
    assert isinstance(spec.state, Done) and isinstance(greedy.state, Done)


@pytest.mark.parametrize("drafter", DRAFTERS, ids=repr)
@pytest.mark.parametrize("rule", RULES, ids=repr)
def test_every_greedy_exact_combination_reproduces_plain_greedy(fsm, drafter, rule):
    rng = random.Random(7)
    for target in (SuccessorTarget(11), HistoryTarget(7)):
        for _ in range(6):
            prompt = [rng.randrange(7) for _ in range(rng.randrange(1, 12))]
            max_tokens = rng.randrange(1, 60)
            for k in (1, 2, 5, 8):
                loop = SpeculativeLoop(target, drafter, k=k, rule=rule)
                res = loop.run(Request(prompt, max_tokens), check=True)
                assert res.output == plain_greedy(target, prompt, max_tokens)


def test_speculation_actually_drafts_on_a_cache_dependent_target(fsm):
    target = HistoryTarget(7)
    res = SpeculativeLoop(target, PromptLookupDrafter(2), k=5).run(Request([1, 2, 3], 200), check=True)
    assert res.stats.accepted > 50 and res.stats.rollbacks > 0
    assert res.stats.evaluations < 200


def test_in_place_array_cache_with_snapshot_clone(fsm):
    target = ArrayCacheTarget()
    prompt = [1, 2, 3, 4]
    loop = SpeculativeLoop(target, PromptLookupDrafter(2), k=4, clone=array_clone)
    res = loop.run(Request(prompt, 120))
    assert res.output == plain_greedy(ArrayCacheTarget(), prompt, 120)
    assert res.stats.rollbacks > 0 and res.stats.accepted > 0


def test_eos_stops_like_greedy(fsm):
    target = SuccessorTarget(11)
    for eos in range(11):
        for max_tokens in (1, 3, 11, 30):
            req = Request([3, 5, 6, 7, 8, 9], max_tokens, eos=eos)
            res = SpeculativeLoop(target, PromptLookupDrafter(1), k=5).run(req, check=True)
            assert res.output == plain_greedy(target, req.prompt, max_tokens, eos)
            assert len(res.output) <= max_tokens
            if eos in res.output:
                assert res.output[-1] == eos and res.output.count(eos) == 1


def test_max_tokens_is_exact(fsm):
    target = SuccessorTarget(5)
    for max_tokens in range(1, 40):
        res = SpeculativeLoop(target, PromptLookupDrafter(1), k=5).run(Request([0, 1, 2, 3, 4, 0], max_tokens))
        assert len(res.output) == max_tokens
        assert res.stats.output_tokens == max_tokens


def test_over_accepting_rule_is_caught(fsm):
    """The built-in oracle can fail: a rule that keeps one row past the first disagreement
    changes the output, and ``check=True`` says so."""

    target = HistoryTarget(7)
    loop = SpeculativeLoop(target, PromptLookupDrafter(1), k=5, rule=OverAcceptingRule())
    with pytest.raises(SpeculationMismatch) as info:
        loop.run(Request([1, 2, 3], 200), check=True)
    assert info.value.mismatches and info.value.mismatches[0][0] == 0


def test_stats_add_up(fsm):
    target = HistoryTarget(7)
    res = SpeculativeLoop(target, PromptLookupDrafter(2), k=5).run(Request([4, 4, 1], 300))
    s = res.stats
    assert s.prefills == 1
    assert s.evaluations == s.prefills + s.decodes + s.verifies
    assert sum(s.drafted_by_position) == s.drafted
    assert sum(s.accepted_by_position) == s.accepted
    assert s.drafted_by_position == sorted(s.drafted_by_position, reverse=True)
    assert all(a <= d for a, d in zip(s.accepted_by_position, s.drafted_by_position))
    # every round yields its accepted tokens, plus one on a rollback; the last may be cut
    assert s.output_tokens <= 1 + s.decodes + s.accepted + s.rollbacks
    assert s.output_tokens > s.decodes + s.accepted + s.rollbacks - 5
    assert s.tokens_per_evaluation == pytest.approx(300 / s.evaluations)
    assert s.control_ns > 0 and s.target_ns > 0
    assert s.control_us_per_token == pytest.approx(s.control_ns / 1e3 / 300)
    d = s.as_dict()
    assert d["evaluations"] == s.evaluations and len(d["acceptance_by_position"]) == 5


def test_plain_greedy_loop_counts_one_evaluation_per_token(fsm):
    res = SpeculativeLoop(SuccessorTarget(11)).run(Request([3], 17))
    assert (res.stats.prefills, res.stats.decodes, res.stats.verifies) == (1, 16, 0)


# --------------------------------------------------------------------------------------
# batches
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("target_cls", [HistoryTarget, BatchHistoryTarget])
@pytest.mark.parametrize("rule", [None, FirstRunAtLeast(2)], ids=repr)
def test_batch_results_equal_per_request_results(fsm, target_cls, rule):
    rng = random.Random(3)
    requests = [
        Request([rng.randrange(7) for _ in range(rng.randrange(1, 20))], rng.randrange(1, 120),
                eos=rng.choice([None, 3]))
        for _ in range(17)
    ]
    target = target_cls()
    loop = SpeculativeLoop(target, PromptLookupDrafter(2), k=5, rule=rule)
    batch = loop.run_batch(requests)
    calls = getattr(target, "batch_calls", None)
    single = [loop.run(r) for r in requests]
    loop.run_batch(requests, check=True)
    assert [b.output for b in batch] == [s.output for s in single]
    assert [b.stats.counts() for b in batch] == [s.stats.counts() for s in single]
    assert [b.state for b in batch] == [s.state for s in single]
    if target_cls is BatchHistoryTarget:
        longest = max(s.stats.evaluations for s in single)
        assert calls == longest  # one call per step


def test_batch_with_per_request_teacher_forced_targets(fsm):
    rng = random.Random(11)
    requests = []
    for _ in range(9):
        prompt = [rng.randrange(5) for _ in range(rng.randrange(1, 30))]
        output = [rng.randrange(5) for _ in range(rng.randrange(1, 80))]
        requests.append(Request(prompt, len(output), target=TeacherForcedTarget(prompt, output)))
    loop = SpeculativeLoop(None, PromptLookupDrafter(1), k=6)
    done = []
    batch = loop.run_batch(requests, check=True, on_done=lambda i, r: done.append(i))
    assert sorted(done) == list(range(9))
    for req, res in zip(requests, batch):
        assert res.output == req.target.sequence[len(req.prompt):]
    assert [b.stats.counts() for b in batch] == [loop.run(r).stats.counts() for r in requests]


# --------------------------------------------------------------------------------------
# the teacher-forced target
# --------------------------------------------------------------------------------------
def test_teacher_forced_rows_follow_the_seed_convention():
    t = TeacherForcedTarget([10, 11, 12], [20, 21, 22, 23, 24])
    # prefill: row i follows prompt[i]
    assert t.evaluate([10, 11, 12], None) == ([11, 12, 20], [1, 2, 3])
    # decode: the row follows last (position 3 holds 20)
    assert t.evaluate([20], 3) == ([21], [4])
    # verify of draft [21, 22, 23]: inputs [last, 21, 22]; row 0 follows last, row i draft[i-1]
    assert t.evaluate([20, 21, 22], 3) == ([21, 22, 23], [4, 5, 6])


def test_teacher_forced_rows_after_a_divergence_are_off_trace():
    t = TeacherForcedTarget([10, 11, 12], [20, 21, 22, 23, 24])
    # draft [21, 99, 23, 24]: inputs [20, 21, 99, 23]; draft[1] = 99 is wrong, so row 1
    # answers the recorded 22 (rejecting 99) and rows 2, 3 follow 99: off trace
    rows, caches = t.evaluate([20, 21, 99, 23], 3)
    assert rows == [21, 22, -1, -1] and caches == [4, 5, -1, -1]
    # the answers are deterministic and a custom sentinel is used as given
    t2 = TeacherForcedTarget([10, 11, 12], [20, 21, 22, 23, 24], off_trace="x")
    assert t2.evaluate([20, 21, 99, 23], 3) == ([21, 22, "x", "x"], [4, 5, -1, -1])
    # rows past the recording's end are off trace too
    assert t.evaluate([22, 23, 24], 5) == ([23, 24, -1], [6, 7, -1])


def test_teacher_forced_refuses_what_the_loop_must_never_ask():
    t = TeacherForcedTarget([10, 11, 12], [20, 21])
    with pytest.raises(TraceError, match="prefill inputs are not the recorded prompt"):
        t.evaluate([10, 11], None)
    with pytest.raises(TraceError, match="departs from the recorded 20"):
        t.evaluate([99], 3)
    with pytest.raises(TraceError, match="resumed from a row past a rejected"):
        t.evaluate([20], -1)
    with pytest.raises(TraceError, match="past the recording"):
        t.evaluate([21], 4)
    with pytest.raises(TraceError, match="no continuation"):
        TeacherForcedTarget([1, 2], []).evaluate([1, 2], None)
    with pytest.raises(ValueError, match="prompt"):
        TeacherForcedTarget([], [1])


@pytest.mark.parametrize("rule", RULES, ids=repr)
def test_teacher_forced_replay_reproduces_the_recording(fsm, rule):
    rng = random.Random(5)
    for _ in range(25):
        vocab = rng.choice([2, 4, 50])
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        output = [rng.randrange(vocab) for _ in range(rng.randrange(1, 120))]
        # make part of the output copy the prompt, as edits do
        if len(prompt) > 4:
            output[: len(prompt)] = prompt[: len(output)]
        req = Request(prompt, len(output), target=TeacherForcedTarget(prompt, output))
        for drafter in DRAFTERS:
            res = SpeculativeLoop(None, drafter, k=5, rule=rule).run(req, check=True)
            assert res.output == output


# --------------------------------------------------------------------------------------
# pluggability and refusals
# --------------------------------------------------------------------------------------
class ReferenceDrafter:
    """A drafter written only against the protocol: a plain-Python prompt lookup."""

    def __init__(self, ngram):
        self.ngram = ngram

    def session(self, prompt):
        outer = self

        class Session:
            def __init__(self):
                self.h = list(prompt)

            def extend(self, tokens):
                self.h += list(tokens)

            def propose(self, max_k):
                h, n = self.h, outer.ngram
                if len(h) <= n or max_k == 0:
                    return []
                for s in range(len(h) - n - 1, -1, -1):
                    if h[s : s + n] == h[-n:]:
                        return h[s + n : s + n + max_k]
                return []

        return Session()


def test_a_protocol_drafter_matches_the_built_in_prompt_lookup(fsm):
    target = HistoryTarget(7)
    for n in (1, 2, 3):
        req = Request([1, 2, 3, 1, 2], 150)
        a = SpeculativeLoop(target, ReferenceDrafter(n), k=5).run(req)
        b = SpeculativeLoop(target, PromptLookupDrafter(n), k=5).run(req)
        assert a.output == b.output and a.stats.counts() == b.stats.counts()


def test_prompt_lookup_drafter_takes_non_integer_and_numpy_entries(fsm):
    class StrTarget:
        def evaluate(self, inputs, cache):
            c = 0 if cache is None else cache
            return ["ab"[(ord(x[0]) + c + i) % 2] for i, x in enumerate(inputs)], [c + i + 1 for i in range(len(inputs))]

    req = Request(["a", "b", "a"], 40)
    # prompt_lookup takes token ids only (docs/state-machine.md, "Token ids"): string entries are refused
    with pytest.raises(TypeError, match="must be an integer token id"):
        SpeculativeLoop(StrTarget(), PromptLookupDrafter(2), k=4).run(req, check=True)
    arr = np.array([3, 5], dtype=np.int32)
    res = SpeculativeLoop(SuccessorTarget(11), PromptLookupDrafter(2), k=5).run(Request(arr, 32), check=True)
    assert res.output == [(6 + i) % 11 for i in range(32)]


def test_ngram_drafter_with_one_length_equals_prompt_lookup(fsm):
    target = HistoryTarget(7)
    for n in (1, 2, 3):
        req = Request([1, 2, 3, 1, 2], 150)
        a = SpeculativeLoop(target, NgramDrafter(n, n), k=5).run(req)
        b = SpeculativeLoop(target, PromptLookupDrafter(n), k=5).run(req)
        assert a.output == b.output and a.stats.counts() == b.stats.counts()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="prompt must hold at least one token"):
        Request([], 5)
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        Request([1], 0)
    with pytest.raises(TypeError, match="max_tokens"):
        Request([1], 2.5)
    with pytest.raises(TypeError, match="rule must be None or have an accepted_rows"):
        SpeculativeLoop(SuccessorTarget(3), rule=lambda d, c: 0)
    with pytest.raises(TypeError, match="drafter must have a session"):
        SpeculativeLoop(SuccessorTarget(3), drafter=object())
    with pytest.raises(ValueError, match="k must be a non-negative integer"):
        SpeculativeLoop(SuccessorTarget(3), k=-1)
    with pytest.raises(ValueError, match="ngram must be at least 1"):
        PromptLookupDrafter(0)
    with pytest.raises(TypeError, match="no target"):
        SpeculativeLoop().run(Request([1], 3))


def test_a_target_that_answers_no_rows_gets_a_clear_error(fsm):
    class Mute:
        def evaluate(self, inputs, cache):
            return [], []

    with pytest.raises(TargetError, match="prefill evaluation with 0 row tokens"):
        SpeculativeLoop(Mute()).run(Request([1], 3))


def test_compare_outputs_reports_the_first_difference():
    assert compare_outputs([[1, 2, 3], [4]], [[1, 2, 3], [4]]) == []
    assert compare_outputs([[1, 2, 3], [4, 5]], [[1, 9, 3], [4]]) == [(0, 1), (1, 1)]
    with pytest.raises(ValueError, match="pair up"):
        compare_outputs([[1]], [])


def test_a_drafter_that_ignores_max_k_is_cut_to_it(fsm):
    class Greedy:
        def session(self, prompt):
            class S:
                def extend(self, tokens):
                    pass

                def propose(self, max_k):
                    return list(range(20))

            return S()

    res = SpeculativeLoop(SuccessorTarget(20), Greedy(), k=3).run(Request([19], 30), check=True)
    assert res.output == [(i % 20) for i in range(30)]
    assert len(res.stats.drafted_by_position) == 3 and res.stats.accepted > 0


# --------------------------------------------------------------------------------------
# one loop on the batch API
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", [None, FirstRunAtLeast(2)], ids=["exact", "minrun"])
def test_every_entry_point_runs_on_one_batch_state(monkeypatch, rule):
    """``run`` is a batch of one, ``run_batch`` and ``run_batched`` one ``BatchState`` for
    all their requests (the active implementation's class), and they reproduce plain
    greedy decoding with rollbacks taken."""
    import specfsm.machine.batch as batch_mod

    real = batch_mod.BatchState
    made = []

    class Spy(real):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __init__(self, capacity, *a, **kw):
            made.append(capacity)
            super().__init__(capacity, *a, **kw)

    monkeypatch.setattr(batch_mod, "BatchState", Spy)
    target = HistoryTarget()
    loop = SpeculativeLoop(target, PromptLookupDrafter(2), 4, rule)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    result = loop.run(Request(prompt, 60))
    assert made == [1]
    assert result.output == plain_greedy(target, prompt, 60)
    assert result.stats.verifies and result.stats.rollbacks
    batch = loop.run_batch([Request(prompt, 40), Request(prompt[::-1], 30)])
    assert made == [1, 2]
    assert [r.output for r in batch] == [plain_greedy(target, prompt, 40), plain_greedy(target, prompt[::-1], 30)]
    out = SpeculativeLoop(target, NgramDrafter(1, 3), 4, rule).run_batched([Request(prompt, 10)] * 3)
    assert made == [1, 2, 3]
    assert [r.output for r in out] == [plain_greedy(target, prompt, 10)] * 3


def test_the_loop_takes_no_implementation_parameter():
    with pytest.raises(TypeError, match="impl"):
        SpeculativeLoop(None, impl="python")  # type: ignore[call-arg]


def test_tokens_that_are_not_ids_run_through_the_batch():
    """Non-integer tokens are mapped to ids for the batch and back: the target, the rule
    and the output see the tokens."""

    class Letters:
        def evaluate(self, inputs, cache):
            c = 0 if cache is None else cache
            return ["abc"[(ord(x) + c + i) % 3] for i, x in enumerate(inputs)], [c + i + 1 for i in range(len(inputs))]

    class Echo:
        def session(self, prompt):
            seen = list(prompt)

            class S:
                def extend(self, tokens):
                    seen.extend(tokens)

                def propose(self, max_k):
                    return seen[-max_k:]

            return S()

    class LettersOnly(FirstRunAtLeast):
        def accepted_rows(self, draft, choices):
            assert all(isinstance(x, str) for x in draft) and all(isinstance(x, str) for x in choices)
            return super().accepted_rows(draft, choices)

    req = Request(["a", "b", "c"], 25, eos="z")
    res = SpeculativeLoop(Letters(), Echo(), 3, LettersOnly(1)).run(req, check=True)
    assert len(res.output) == 25 and set(res.output) <= set("abc")
    assert res.stats.verifies > 0
