"""``BatchState.step`` against the per-request loop (ServingState + NgramIndex per
request): the same tokens, the same drafts, the same accepted counts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm.errors import IllegalTransition
from specfsm.serving.loop import NgramDrafter, Request, SpeculativeLoop, TeacherForcedTarget


@pytest.fixture
def ni(impl):
    return impl.module("ngram_index")


def run_batch(bm, ni, recs, k, min_n=1, max_n=3, prefer="latest", bonus=False, rule=None,
              probs_of=None, eos=None):
    """Drive every (prompt, continuation, max_tokens) through one BatchState with
    teacher-forced rows; returns (outputs, stats) like the per-request loop's."""
    b = bm.BatchState(len(recs), k, bonus=bonus)
    targets = [TeacherForcedTarget(p, c) for p, c, _ in recs]
    ixs = []
    for p, _, _ in recs:
        ix = ni.NgramIndex(min_n, max_n, prefer)
        ix.extend(p)
        ixs.append(ix)
    flat = [t for p, _, _ in recs for t in p]
    off = np.cumsum([0] + [len(p) for p, _, _ in recs])
    b.admit(np.arange(len(recs)), flat, off, np.arange(len(recs)),
            max_tokens=[m for _, _, m in recs], eos=eos, indexes=ixs)
    outputs = [[] for _ in recs]
    stats = [dict(verifies=0, drafted=0, accepted=0, rollbacks=0, decodes=0, prefills=0) for _ in recs]
    for _ in range(10_000):
        slots, inputs, offs = b.pending()
        if len(slots) == 0:
            break
        rows = []
        for j, i in enumerate(slots.tolist()):
            inp = inputs[offs[j]:offs[j + 1]].tolist()
            code = int(b.states[i])
            cache = None if code == bm.PREFILL else len(recs[i][0]) + len(outputs[i]) - 1
            r, _ = targets[i].evaluate(inp, cache)
            rows += r
            s = stats[i]
            if code == bm.VERIFY:
                s["verifies"] += 1
            elif code == bm.DECODE:
                s["decodes"] += 1
            else:
                s["prefills"] += 1
        kw = {}
        if probs_of is not None:
            kw = dict(rule=rule, probs=probs_of(rows))
        elif rule is not None:
            kw = dict(rule=rule)
        res = b.step(np.array(rows, dtype=np.int64), **kw)
        for j, i in enumerate(res.slots.tolist()):
            outputs[i] += res.emitted[res.emitted_offsets[j]:res.emitted_offsets[j + 1]].tolist()
            if res.drafted[j]:
                stats[i]["drafted"] += int(res.drafted[j])
                stats[i]["accepted"] += int(res.accepted[j])
                stats[i]["rollbacks"] += int(res.accepted[j] < res.drafted[j])
    assert (b.states == bm.DONE).all()
    return outputs, stats


def run_loop(ni, recs, k, min_n=1, max_n=3, prefer="latest", eos=None):
    out, stats = [], []
    for p, c, m in recs:
        loop = SpeculativeLoop(TeacherForcedTarget(p, c), NgramDrafter(min_n, max_n, prefer), k)
        r = loop.run(Request(p, m, eos=eos))
        out.append(r.output)
        s = r.stats
        stats.append(dict(verifies=s.verifies, drafted=s.drafted, accepted=s.accepted,
                          rollbacks=s.rollbacks, decodes=s.decodes, prefills=s.prefills))
    return out, stats


def greedy_stream(n, vocab, seed):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, vocab, size=12).tolist()
    out = []
    while len(out) < n:  # repetitive with edits: drafts hit and miss
        out += base[: rng.integers(3, 12)]
        if rng.random() < 0.5:
            out.append(int(rng.integers(0, vocab)))
    return out[:n]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    # up to 8 requests: more than 4 drafting slots take the batched extend/propose path
    seeds=st.lists(st.integers(0, 10_000), min_size=1, max_size=8),
    k=st.integers(1, 6),
    vocab=st.integers(2, 9),
    prefer=st.sampled_from(["latest", "earliest"]),
    eos=st.sampled_from([None, 0]),
)
def test_step_makes_the_per_request_loops_decisions(bm, ni, seeds, k, vocab, prefer, eos):
    recs = []
    for s in seeds:
        seq = greedy_stream(60, vocab, s)
        cut = 4 + s % 10
        recs.append((seq[:cut], seq[cut:], 1 + s % (len(seq) - cut - 1)))
    got = run_batch(bm, ni, recs, k, prefer=prefer, eos=eos)
    want = run_loop(ni, recs, k, prefer=prefer, eos=eos)
    assert got[0] == want[0]
    assert got[1] == want[1]


def test_bonus_row_emits_k_plus_one_on_full_acceptance(bm, ni):
    seq = [1, 2, 3, 4] * 20
    recs = [(seq[:8], seq[8:], 40)]
    out, stats = run_batch(bm, ni, recs, 4, bonus=True)
    plain, pstats = run_loop(ni, recs, 4)
    assert out == plain  # same tokens (teacher forcing is greedy-exact)
    assert stats[0]["verifies"] < pstats[0]["verifies"]


def test_bonus_layout_and_resume_row(bm, ni):
    b = bm.BatchState(1, 3, bonus=True)
    ix = ni.NgramIndex(1, 2)
    ix.extend([5, 6, 5])
    b.admit([0], [5, 6, 5], [0, 3], [0], indexes=[ix])
    res = b.step([9, 9, 6])  # prefill reads the last row: 6 -> history 5 6 5 6
    assert res.emitted.tolist() == [6] and res.drafts.tolist() == [5, 6]
    slots, inputs, offs = b.pending()
    assert inputs.tolist() == [6, 5, 6] and offs.tolist() == [0, 3]  # K + 1 rows
    res = b.step([5, 6, 7])
    assert res.emitted.tolist() == [5, 6, 7]
    assert res.accepted.tolist() == [2] and res.resume_rows.tolist() == [2]
    assert b.tokens[0] == 7


def test_step_refuses_rows_of_the_wrong_length_and_changes_nothing(bm, ni):
    b = bm.BatchState(2, 3)
    b.admit([0, 1], [1, 2, 3], [0, 2, 3], [0, 1])
    before = [b.state_of(i) for i in range(2)]
    with pytest.raises(ValueError, match="row_tokens"):
        b.step([1, 2])
    with pytest.raises(TypeError, match="rule"):
        b.step([1, 2, 3], rule=object())
    assert [b.state_of(i) for i in range(2)] == before


def test_rule_beyond_the_draft_is_refused(bm, ni):
    class Greedy:
        def accepted_rows(self, draft, choices):
            return len(draft) + 1

    b = bm.BatchState(1, 3)
    ix = ni.NgramIndex(1)
    ix.extend([1, 1])
    b.admit([0], [1, 1], [0, 2], [0], indexes=[ix])
    b.step([0, 1])
    assert b.states[0] == bm.VERIFY
    before = b.state_of(0)
    with pytest.raises(IllegalTransition) as e:
        b.step([1], rule=Greedy())
    assert e.value.attempted == "accept_rows" and e.value.slots == [0]
    assert b.state_of(0) == before


def test_sampling_rules_with_one_hot_rows_match_greedy(bm, ni):
    from specfsm.accept.rules import SpeculativeSampling, TypicalAcceptance

    seq = greedy_stream(80, 4, 3)
    recs = [(seq[:6], seq[6:], 50), (seq[:9], seq[9:], 30)]

    def one_hot(rows):
        p = np.zeros((len(rows), 5))
        for r, t in enumerate(rows):
            p[r, t if t >= 0 else 4] = 1.0
        return p

    want = run_loop(ni, recs, 4)
    for rule in (SpeculativeSampling(seed=1), TypicalAcceptance()):
        got = run_batch(bm, ni, recs, 4, rule=rule, probs_of=one_hot)
        assert got == want


# --------------------------------------------------------------------------------------
# the serving loop on the batch API, every rule
# --------------------------------------------------------------------------------------
def _requests(n=4, eos_every=2):
    rng = np.random.default_rng(7)
    reqs = []
    for s in range(n):
        seq = greedy_stream(260, 6, 100 + s)
        p, c = seq[:15], seq[15:]
        eos = 3 if (eos_every and s % eos_every) else None
        reqs.append(Request(p, int(rng.integers(20, 200)), eos=eos, target=TeacherForcedTarget(p, c)))
    return reqs


def _rules():
    from specfsm.accept.rules import Exact, MinRun, SpeculativeSampling, TypicalAcceptance

    return [None, Exact(), MinRun(2), SpeculativeSampling(seed=3), TypicalAcceptance()]


@pytest.mark.parametrize("rule_i", range(5))
def test_run_batched_equals_run_batch_for_every_rule(rule_i):
    rule = _rules()[rule_i]
    reqs = _requests()
    loop = SpeculativeLoop(None, NgramDrafter(1, 3), 5, rule)
    want = loop.run_batch(reqs)
    got = loop.run_batched(reqs, check=True)
    assert [r.output for r in got] == [r.output for r in want]
    assert [r.stats.counts() for r in got] == [r.stats.counts() for r in want]
    assert sum(r.stats.accepted for r in got) > 0


@pytest.mark.parametrize("rule_i", range(5))
def test_run_batched_with_bonus_rows_keeps_the_output_and_verifies_less(rule_i):
    rule = _rules()[rule_i]
    reqs = _requests(eos_every=0)
    loop = SpeculativeLoop(None, NgramDrafter(1, 3), 5, rule)
    want = loop.run_batch(reqs)
    got = loop.run_batched(reqs, bonus=True)
    assert [r.output for r in got] == [r.output for r in want]
    assert sum(r.stats.evaluations for r in got) < sum(r.stats.evaluations for r in want)


def test_run_batched_refuses_a_drafter_without_an_index():
    from specfsm.serving.loop import PromptLookupDrafter

    with pytest.raises(TypeError, match="NgramDrafter"):
        SpeculativeLoop(None, PromptLookupDrafter(2), 4).run_batched(_requests(1))


def test_sampling_rule_needs_a_target_with_probabilities():
    from specfsm.accept.rules import SpeculativeSampling

    class Plain:
        def evaluate(self, inputs, cache):
            return [1] * len(inputs), [0] * len(inputs)

    with pytest.raises(TypeError, match="evaluate_probs"):
        SpeculativeLoop(Plain(), None, 0, SpeculativeSampling(seed=0)).run(Request([1, 2], 3))


def test_teacher_forced_target_moved_to_the_workload_module():
    import specfsm.serving.loop as loop_mod
    import specfsm.serving.workload as wl

    assert loop_mod.TeacherForcedTarget is wl.TeacherForcedTarget
    assert loop_mod.TraceError is wl.TraceError


def test_smoothed_target_sampling_follows_the_target_distribution():
    """A positional, temperature-smoothed target: at every position the recorded token
    has probability hi and every other id lo. Speculative sampling through the batch
    loop must emit the recorded token with frequency hi (a z-test over many positions);
    typical acceptance at this temperature is greedy at the rejected rows."""
    from specfsm.accept.rules import SpeculativeSampling

    vocab, temp = 6, 0.5
    seq = greedy_stream(4000, vocab - 1, 11)
    p, c = seq[:20], seq[20:]
    target = TeacherForcedTarget(p, c, vocab=vocab, temperature=temp)
    hi = np.exp(1 / temp) / (np.exp(1 / temp) + vocab - 1)
    loop = SpeculativeLoop(None, NgramDrafter(1, 3), 4, SpeculativeSampling(seed=5))
    (res,) = loop.run_batched([Request(p, 3000, target=target)])
    out = np.array(res.output)
    hits = float((out == np.array(c[: len(out)])).mean())
    sd = np.sqrt(hi * (1 - hi) / len(out))
    assert abs(hits - hi) < 4.5 * sd, (hits, hi)
    assert res.stats.verifies > 0 and res.stats.accepted > 0


def test_a_call_on_the_batch_during_its_step_is_refused(bm, ni):
    """A rule that calls back into the batch mid-step gets RuntimeError (the busy guard
    every method checks), the step changes nothing, and the batch is usable after."""
    b = bm.BatchState(1, 3)
    ix = ni.NgramIndex(1)
    ix.extend([1, 1])
    b.admit([0], [1, 1], [0, 2], [0], indexes=[ix])
    b.step([0, 1])
    seen = []

    class Reentrant:
        def accepted_rows(self, draft, choices):
            seen.append(b.busy)
            b.pending()
            return 0

    before = b.state_of(0)
    with pytest.raises(RuntimeError, match="BatchState is being changed"):
        b.step([1], rule=Reentrant())
    assert seen == [True] and not b.busy and b.state_of(0) == before
    b.step([1])


def test_the_readme_example_drives_a_batch(bm, ni):
    """The example the README shows (with this implementation's modules)."""
    prompts = [[5, 6, 7, 5, 6], [1, 2, 3, 1, 2]]
    truth = [[7, 5, 6, 7, 5, 6, 7, 9], [3, 1, 2, 3, 1, 2, 3, 4]]
    indexes = []
    for p in prompts:
        ix = ni.NgramIndex(1, 3)
        ix.extend(p)
        indexes.append(ix)
    batch = bm.BatchState(capacity=2, k_max=4)
    batch.admit([0, 1], [t for p in prompts for t in p], [0, 5, 10], caches=[0, 1],
                max_tokens=8, indexes=indexes)
    done = [[] for _ in prompts]
    verifies = 0
    while True:
        slots, inputs, offsets = batch.pending()
        if len(slots) == 0:
            break
        rows = []
        for j, s in enumerate(slots.tolist()):
            n = offsets[j + 1] - offsets[j]
            if batch.states[s] == bm.PREFILL:
                rows += [-1] * (n - 1) + truth[s][:1]
                continue
            verifies += batch.states[s] == bm.VERIFY
            got = truth[s][len(done[s]) : len(done[s]) + n]
            rows += got + [-1] * (n - len(got))
        res = batch.step(np.array(rows))
        for s, toks in res.emitted_by_slot().items():
            done[s] += toks
    assert done == truth
    assert verifies > 0 and sorted(res.finished.tolist()) == [0, 1]


def test_step_result_is_read_only(bm):
    b = bm.BatchState(1, 2)
    b.admit([0], [1], [0, 1], [0])
    res = b.step([4])
    assert res.emitted.tolist() == [4] and res.slots.tolist() == [0]
    with pytest.raises(AttributeError):
        res.emitted = None


@pytest.mark.parametrize("budget", [3, 40])
def test_many_slots_draft_as_their_own_loops_with_short_and_long_budgets(bm, ni, budget):
    """Eight requests (the batched index calls), all with budgets above k_max (one
    count for every slot) or some below it (a count per slot): same decisions as the
    per-request loop."""
    recs = []
    for s in range(8):
        seq = greedy_stream(70, 5, 31 + s)
        recs.append((seq[:6], seq[6:], budget + s % 3 if budget > 3 else 1 + s % 4))
    got = run_batch(bm, ni, recs, 4, prefer="earliest")
    want = run_loop(ni, recs, 4, prefer="earliest")
    assert got == want


def test_a_later_step_leaves_earlier_results_alone(bm, ni):
    """Results are the caller's: the next steps write nothing into them."""
    ixs = []
    for s in range(6):
        ix = ni.NgramIndex(1, 3)
        ix.extend([1, 2, 3, 1, 2, 3, s])
        ixs.append(ix)
    b = bm.BatchState(6, 3)
    b.admit(np.arange(6), [1, 2] * 6, np.arange(0, 13, 2), np.arange(6), indexes=ixs)
    results = []
    for step in range(5):
        _, _, offs = b.pending()
        res = b.step(np.full(int(offs[-1]), 7 + step, dtype=np.int64))
        fields = ("slots", "emitted", "emitted_offsets", "accepted", "drafted", "resume_rows",
                  "finished", "drafts", "draft_offsets")
        results.append((res, {f: getattr(res, f).copy() for f in fields}))
    for res, copies in results:
        for f, want in copies.items():
            assert np.array_equal(getattr(res, f), want), f


def _readme_batch_example() -> str:
    """The README's ``BatchState`` example (its python block that builds ``batch``), read
    from README.md beside the tests, so this test runs what the README shows."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return next(b for b in blocks if "batch = BatchState(" in b and "batch.step(" in b)


def test_the_readme_step_example_runs_as_written():
    scope: dict = {}
    exec(compile(_readme_batch_example(), "README.md", "exec"), scope)
    assert scope["batch"].states.tolist() == [0, 0]     # both released
    assert len(scope["out"][0]) == 30


def test_the_readme_step_example_speculates(bm, ni):
    """The README example's loop with this implementation's modules: the drafts are
    verified and mostly accepted (the stand-in target repeats every 11 tokens)."""
    prompts = [[3, 4, 5, 6], [7, 8]]
    ixs = []
    for p in prompts:
        ix = ni.NgramIndex(1, 3)
        ix.extend(p)
        ixs.append(ix)
    batch = bm.BatchState(2, 4)
    batch.admit([0, 1], np.concatenate(prompts), [0, 4, 6], caches=[0, 1], max_tokens=[30, 20],
                indexes=ixs)
    drafted = accepted = steps = 0
    out = {0: [], 1: []}
    while True:
        slots, inputs, _ = batch.pending()
        if len(slots) == 0:
            break
        res = batch.step((inputs + 1) % 11)
        steps += 1
        drafted += int(res.drafted.sum())
        accepted += int(res.accepted.sum())
        for slot, tokens in res.emitted_by_slot().items():
            out[slot] += tokens
        batch.release(res.finished)
    assert out == {0: [(6 + i) % 11 for i in range(1, 31)], 1: [(8 + i) % 11 for i in range(1, 21)]}
    assert steps < 30 and accepted > drafted // 2


# -- SuffixIndex slots ------------------------------------------------------------------
def _suffix_drafter(adaptive=False):
    from specfsm.drafting.suffix_index import SuffixDrafter

    return SuffixDrafter(1, None, "earliest", adaptive=adaptive, draft_len=3, max_draft=6)


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("rule_i", range(5))
def test_run_batched_with_a_suffix_drafter_equals_run_batch_for_every_rule(rule_i, adaptive):
    rule = _rules()[rule_i]
    reqs = _requests()
    loop = SpeculativeLoop(None, _suffix_drafter(adaptive), 5, rule)
    want = loop.run_batch(reqs)
    got = loop.run_batched(reqs, check=True)
    assert [r.output for r in got] == [r.output for r in want]
    # the same drafts (lengths included, adaptive or not) and the same acceptance
    assert [r.stats.counts() for r in got] == [r.stats.counts() for r in want]
    assert sum(r.stats.accepted for r in got) > 0


def _drive(bm, recs, k, ixs):
    """Every (prompt, continuation, max_tokens) through one BatchState whose slots draft
    with ``ixs``, teacher-forced; returns each slot's output and drafted-token count."""
    b = bm.BatchState(len(recs), k)
    flat = [t for p, _, _ in recs for t in p]
    off = np.cumsum([0] + [len(p) for p, _, _ in recs])
    b.admit(np.arange(len(recs)), flat, off, np.arange(len(recs)),
            max_tokens=[m for _, _, m in recs], indexes=ixs)
    targets = [TeacherForcedTarget(p, c) for p, c, _ in recs]
    outputs = [[] for _ in recs]
    drafted = [0] * len(recs)
    while True:
        slots, inputs, offs = b.pending()
        if len(slots) == 0:
            break
        rows = []
        for j, i in enumerate(slots.tolist()):
            code = int(b.states[i])
            cache = None if code == bm.PREFILL else len(recs[i][0]) + len(outputs[i]) - 1
            r, _ = targets[i].evaluate(inputs[offs[j]:offs[j + 1]].tolist(), cache)
            rows += r
        res = b.step(np.array(rows, dtype=np.int64))
        for j, i in enumerate(res.slots.tolist()):
            outputs[i] += res.emitted[res.emitted_offsets[j]:res.emitted_offsets[j + 1]].tolist()
            drafted[i] += int(res.drafted[j])
            d = res.drafts[res.draft_offsets[j]:res.draft_offsets[j + 1]].tolist()
            assert d == b.draft(i)
    assert (b.states == bm.DONE).all()
    return outputs, drafted


#: the ``SuffixIndex`` settings of ``_suffix_drafter``'s sessions (``SuffixDrafter``'s
#: ``anchor_n`` default is 16, the index's 0)
_SUFFIX_KW = {"draft_len": 3, "max_draft": 6, "anchor_n": 16}


def _holding(index, prompt):
    """``index`` (one implementation's kernel class) after taking ``prompt``, as a
    drafter's session starts it."""
    index.extend(prompt)
    return index


def _recording_drafter(make):
    """A drafter whose sessions' indexes are kept (``made``)."""
    d = make()
    made = []
    orig = d.session

    def session(prompt):
        s = orig(prompt)
        made.append(s.index)
        return s

    d.session = session
    return d, made


def test_suffix_slots_record_what_their_sessions_record(impl, bm):
    """Each SuffixIndex slot records every verified draft as the drafter's session does
    (the index's statistics and adaptive draft length end equal)."""
    si = impl.module("suffix_index")
    recs = []
    for s in range(5):
        seq = greedy_stream(120, 5, 300 + s)
        recs.append((seq[:10], seq[10:], 60 + s))
    loop_ixs, outs = [], []
    for p, c, m in recs:
        d, made = _recording_drafter(lambda: _suffix_drafter(adaptive=True))
        outs.append(SpeculativeLoop(TeacherForcedTarget(p, c), d, 4).run(Request(p, m)).output)
        loop_ixs.append(made[0])
    # the batch driven directly is ``impl``'s: its slots hold that implementation's
    # indexes, made with ``_suffix_drafter(adaptive=True)``'s settings
    ixs = [_holding(si.SuffixIndex(1, None, "earliest", **_SUFFIX_KW, adaptive=True), p) for p, _, _ in recs]
    got, drafted = _drive(bm, recs, 4, ixs)
    assert got == outs
    assert isinstance(ixs[0], si.SuffixIndex)
    for mine, want in zip(ixs, loop_ixs):
        assert mine.stats["drafted"] == want.stats["drafted"]
        assert mine.stats["accepted"] == want.stats["accepted"]
        assert mine.draft_len == want.draft_len
    assert sum(drafted) > 0 and sum(ix.stats["accepted"] for ix in ixs) > 0


def test_a_batch_mixes_ngram_and_suffix_slots(impl, bm, ni):
    """N-gram slots and suffix slots in one batch draft as their own loops do."""
    from specfsm.drafting.suffix_index import SuffixDrafter

    si = impl.module("suffix_index")
    recs = []
    for s in range(6):
        seq = greedy_stream(90, 4, 500 + s)
        recs.append((seq[:8], seq[8:], 50 + s))
    def drafter(q):
        return NgramDrafter(1, 3) if q % 2 else SuffixDrafter(1, None, "earliest")

    # each slot's index made (and given the prompt) as its drafter's session makes it, of
    # ``impl`` (the batch driven directly is ``impl``'s); the loop runs on the active one
    ixs = [_holding(ni.NgramIndex(1, 3, "latest") if q % 2 else si.SuffixIndex(1, None, "earliest", anchor_n=16), p)
           for q, (p, _, _) in enumerate(recs)]
    outputs, drafted = _drive(bm, recs, 4, ixs)
    for q, (p, c, m) in enumerate(recs):
        r = SpeculativeLoop(TeacherForcedTarget(p, c), drafter(q), 4).run(Request(p, m))
        assert outputs[q] == r.output
        assert drafted[q] == r.stats.drafted
    assert min(drafted) > 0


def test_suffix_slots_use_the_suffix_modules_serve_batch_in_the_twin(impl, bm, monkeypatch):
    """The twin's suffix update (the reference): the module's one serving-step policy,
    ``serve_batch``, called once with the slots' indexes, their emitted tokens and
    offsets, the drafted counts and each draft's agreement. The compiled step goes
    through the module's C entry instead."""
    if impl.name == "compiled":
        pytest.skip("the compiled step updates SuffixIndex slots through the C entry "
                    "(test_the_compiled_step_updates_suffix_slots_in_c)")
    si = impl.module("suffix_index")
    calls = []
    real = si.serve_batch

    def serve_batch(indexes, tokens, offsets, drafted, accepted, max_k=None):
        calls.append((len(indexes), np.asarray(tokens).tolist(), np.asarray(offsets).tolist(),
                      np.asarray(drafted).tolist(), np.asarray(accepted).tolist()))
        return real(indexes, tokens, offsets, drafted, accepted, max_k)

    monkeypatch.setattr(si, "serve_batch", serve_batch)
    b = bm.BatchState(2, 3)
    ixs = [si.SuffixIndex(1), si.SuffixIndex(1)]
    for ix in ixs:
        ix.extend([1, 2, 3, 1, 2])
    b.admit([0, 1], [1, 2, 3, 1, 2, 1, 2, 3, 1, 2], [0, 5, 10], [0, 1], indexes=ixs)
    res = b.step(np.array([3, 3, 3, 3, 3, 3, 3, 3, 3, 7], dtype=np.int64))
    assert calls == [(2, [3, 7], [0, 1, 2], [0, 0], [0, 0])]
    assert res.drafts.tolist() == [1, 2, 3] + []  # slot 0 matched "1 2 3", slot 1 nothing
    assert len(ixs[0]) == 6 and len(ixs[1]) == 6


def test_the_compiled_step_updates_suffix_slots_in_c(impl, bm, monkeypatch):
    """The compiled step serves its suffix slots through the suffix module's C policy
    (``suffix_serve``) and calls none of its Python batch functions; the drafts are those of the twin's path."""
    if impl.name != "compiled":
        pytest.skip("the twin's step is the Python reference path")
    si = impl.module("suffix_index")

    def refuse(*args, **kwargs):
        raise AssertionError("a Python batch function was called")

    for name in ("extend_batch", "record_batch", "propose_batch"):
        monkeypatch.setattr(si, name, refuse)
    b = bm.BatchState(2, 3)
    ixs = [si.SuffixIndex(1), si.SuffixIndex(1)]
    for ix in ixs:
        ix.extend([1, 2, 3, 1, 2])
    b.admit([0, 1], [1, 2, 3, 1, 2, 1, 2, 3, 1, 2], [0, 5, 10], [0, 1], indexes=ixs)
    res = b.step(np.array([3, 3, 3, 3, 3, 3, 3, 3, 3, 7], dtype=np.int64))
    assert res.drafts.tolist() == [1, 2, 3]
    assert res.draft_offsets.tolist() == [0, 3, 3]
    assert len(ixs[0]) == 6 and len(ixs[1]) == 6
    # a verified draft is recorded (3 drafted, 1 accepted: 1 then a replacement)
    res = b.step(np.array([1, 9, 9, 5], dtype=np.int64))
    assert res.accepted.tolist() == [1, 0]
    assert res.emitted.tolist() == [1, 9, 5]
    assert ixs[0].stats["drafted"] == 3 and ixs[0].stats["accepted"] == 1
    assert ixs[1].stats["drafted"] == 0


def test_admit_refuses_one_suffix_index_for_two_slots(bm, impl):
    """One SuffixIndex given for two slots is refused by ``admit``, where the mistake is
    made (a step would extend it twice): nothing recorded, nothing appended, the batch
    unchanged, the index's guard released."""
    si = impl.module("suffix_index")
    ix = si.SuffixIndex(1, adaptive=True)
    ix.extend([1, 2, 1])
    b = bm.BatchState(2, 3)
    with pytest.raises(ValueError, match=r"indexes\[1\] is indexes\[0\]"):
        b.admit([0, 1], [1, 2, 1, 1, 2, 1], [0, 3, 6], [0, 1], indexes=[ix, ix])
    assert b.states.tolist() == [bm.FREE, bm.FREE]
    assert len(ix) == 3 and ix.stats["steps"] == 0
    ix.extend([7])          # the write guard was released
    assert ix.propose(2) == []


def test_a_step_refuses_a_suffix_index_being_extended(bm, impl):
    """A SuffixIndex whose write guard another call holds (an extend converting its
    tokens, which runs the step meanwhile) refuses the step with RuntimeError, before
    any index of the step changes."""
    si = impl.module("suffix_index")
    ixs = [si.SuffixIndex(1), si.SuffixIndex(1)]
    for ix in ixs:
        ix.extend([1, 2, 3, 1, 2])
    b = bm.BatchState(2, 3)
    b.admit([0, 1], [1, 2, 3, 1, 2, 1, 2, 3, 1, 2], [0, 5, 10], [0, 1], indexes=ixs)
    got = []

    class Tokens(Sequence):
        def __len__(self):
            return 1

        def __getitem__(self, q):
            if isinstance(q, slice):
                return [self[x] for x in range(*q.indices(1))]
            if q != 0:
                raise IndexError(q)
            if not got:
                try:
                    b.step(np.array([3, 3, 3, 3, 3, 3, 3, 3, 3, 7], dtype=np.int64))
                except RuntimeError as e:
                    got.append(str(e))
            return 9

    ixs[1].extend(Tokens())
    assert len(got) == 1 and "indexes[1]" in got[0] and "being changed" in got[0]
    assert len(ixs[0]) == 5 and len(ixs[1]) == 6   # the step changed neither index
    assert ixs[0].stats["steps"] == 0


def test_suffix_slots_take_tokens_past_int32(bm, impl):
    """Emitted tokens that do not fit int32 widen the slot's index; drafts carry them."""
    si = impl.module("suffix_index")
    big = 2**40 + 5
    ix = si.SuffixIndex(1)
    ix.extend([big, 2, big])
    b = bm.BatchState(1, 3)
    b.admit([0], [big, 2, big], [0, 3], [0], indexes=[ix])
    res = b.step(np.array([1, 1, 2], dtype=np.int64))
    assert res.emitted.tolist() == [2]
    assert res.drafts.tolist() == [big, 2]     # after "big 2": "big 2"
    assert ix.tokens.tolist() == [big, 2, big, 2]


def test_admit_refuses_an_index_of_another_kind(bm):
    b = bm.BatchState(1, 3)
    with pytest.raises(TypeError, match=r"indexes\[0\] must be an NgramIndex or SuffixIndex"):
        b.admit([0], [1], [0, 1], [0], indexes=[object()])
    assert b.states.tolist() == [bm.FREE]


def test_admit_refuses_one_index_for_two_slots(bm, ni):
    """The index update takes each index once (as extend_batch does): one NgramIndex
    given for two slots, in one call or while the first slot is live, is refused by
    ``admit``, and the index is unchanged."""
    ix = ni.NgramIndex(1, 2)
    ix.extend([1, 2, 1])
    b = bm.BatchState(2, 3)
    with pytest.raises(ValueError, match=r"indexes\[1\] is indexes\[0\]"):
        b.admit([0, 1], [1, 2, 1, 1, 2, 1], [0, 3, 6], [0, 1], indexes=[ix, ix])
    b.admit([0], [1, 2, 1], [0, 3], [0], indexes=[ix])
    with pytest.raises(ValueError, match=r"indexes\[0\] is held by live slot 0"):
        b.admit([1], [1, 2, 1], [0, 3], [1], indexes=[ix])
    assert b.states.tolist() == [bm.PREFILL, bm.FREE]
    assert len(ix) == 3
