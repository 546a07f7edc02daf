"""specfsm.hf: speculative decoding of real transformers models (tiny config models built
with a fixed seed, no downloads). Greedy outputs are compared token for token with
``model.generate(do_sample=False)``; sampling is checked with a chi-square test against
the exact distribution, which a deliberately wrong rule fails."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specfsm.hf import cost as hfcost  # noqa: E402
from specfsm.hf.generate import (  # noqa: E402
    SpeculativeGenerator,
    UnsupportedModel,
    check_model,
    check_transformers,
    first_mismatch,
)

from hf_helpers import one_thread  # noqa: E402, F401 (a module-wide fixture)
from hf_helpers import reference as _reference  # noqa: E402
from hf_helpers import run_cli as _run_cli  # noqa: E402
from hf_helpers import tiny_llama  # noqa: E402

VOCAB = 64


def _gpt2(vocab=VOCAB):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=256, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(cfg).eval()


def _llama(vocab=VOCAB):
    return tiny_llama(vocab)


MODELS = {"gpt2": _gpt2, "llama": _llama}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return MODELS[request.param]()


def _prompts(seed=1):
    """Prompts of different lengths, repetitive enough for n-gram drafts to be accepted."""
    rnd = random.Random(seed)
    out = []
    for length in (5, 17, 30, 9):
        base = [rnd.randrange(VOCAB) for _ in range(rnd.randrange(3, 8))]
        out.append((base * 20)[:length])
    return out


NEW = 16
FLAT_COST = hfcost.CostModel({1: 1.0, 64: 1.5})


@pytest.fixture(scope="module")
def references(model):
    return [_reference(model, p, NEW) for p in _prompts()]


def _check_equal(model, prompt, got, want):
    gap = first_mismatch(model, prompt, got, want)
    assert gap is None, f"speculative output parts from model.generate: {gap}"


@pytest.mark.parametrize("k, drafter", [(0, "suffix"), (3, "suffix"), (3, "ngram"), ("adaptive", "suffix"),
                                         ("adaptive", "ngram"), (3, "prompt")])
def test_single_request_greedy_equals_generate(fsm, model, references, k, drafter):
    # on the active implementation's indexes (CI runs this file compiled and twin);
    # a fixed cost table keeps the adaptive choice independent of this machine's load
    gen = SpeculativeGenerator(model, k=k, drafter=drafter, eos_token_id=None, cost=FLAT_COST)
    accepted = 0
    for prompt, want in zip(_prompts(), references):
        out = gen.generate([prompt], NEW)[0]
        _check_equal(model, prompt, out.tokens, want)
        assert out.forwards == gen.last_run.forwards
        accepted += out.accepted
        assert out.accepted <= out.drafted
    if k != 0:
        assert accepted > 0  # speculation really ran (and was checked)
        assert gen.last_run.forwards < NEW


@pytest.mark.parametrize("drafter", ["suffix", "ngram"])
def test_batch_equals_each_request_alone(fsm, model, references, drafter):
    gen = SpeculativeGenerator(model, k=4, eos_token_id=None, drafter=drafter)
    outs = gen.generate(_prompts(), NEW)
    for prompt, out, want in zip(_prompts(), outs, references):
        _check_equal(model, prompt, out.tokens, want)
    steps = len(gen.last_run.widths)
    assert steps < NEW  # one forward per step for the whole batch
    assert gen.last_run.forwards == steps + len(_prompts())  # and one per prompt to prefill
    assert sum(o.rollbacks for o in outs) > 0  # ragged acceptance really happened


@pytest.mark.parametrize("drafter, cls", [("suffix", "SuffixIndex"), ("ngram", "NgramIndex")])
def test_requests_draft_from_the_active_implementations_index(fsm, model, drafter, cls):
    import specfsm
    from specfsm import _impl

    gen = SpeculativeGenerator(model, drafter=drafter, eos_token_id=None)
    index = gen._new_index()
    assert type(index) is getattr(specfsm, cls)
    assert type(index) is getattr(_impl.load(cls.lower().replace("index", "_index")), cls)
    assert type(index).__module__ == fsm.module(cls.lower().replace("index", "_index")).__name__


@pytest.mark.parametrize("prefill", ["each", "padded"])
def test_batch_prefill_each_prompt_alone_or_padded(model, references, prefill):
    # "each": one forward per prompt, the caches gathered left-padded; "padded": one
    # forward over the padded prompts; both decode every request as it decodes alone
    gen = SpeculativeGenerator(model, k=4, eos_token_id=None, prefill=prefill)
    outs = gen.generate(_prompts(), NEW)
    for prompt, out, want in zip(_prompts(), outs, references):
        _check_equal(model, prompt, out.tokens, want)
    steps = len(gen.last_run.widths)
    assert gen.last_run.forwards == steps + (len(_prompts()) if prefill == "each" else 1)
    with pytest.raises(ValueError, match="prefill"):
        SpeculativeGenerator(model, prefill="chunked")


def test_batch_adaptive_with_compaction_and_early_finishers(fsm, model):
    prompts = _prompts(seed=7)
    # an end-of-sequence token that ends some requests early: one that request 0 emits
    first = _reference(model, prompts[0], NEW)
    eos = first[len(first) // 2]
    gen = SpeculativeGenerator(model, eos_token_id=eos, compact_fraction=0.1, cost=FLAT_COST)
    outs = gen.generate(prompts, NEW)
    lengths = set()
    for prompt, out in zip(prompts, outs):
        want = _reference(model, prompt, NEW, eos=eos)
        if eos in want:
            want = want[: want.index(eos) + 1]
            assert out.finished_by_eos
        _check_equal(model, prompt, out.tokens, want)
        lengths.add(len(out.tokens))
    assert len(lengths) > 1  # requests left the batch at different steps
    assert gen.last_run.compactions > 0


def test_bonus_row_keeps_outputs_and_saves_forwards(fsm, model):
    # the forward over last token + K drafts yields K + 1 rows: with the bonus row a fully
    # accepted draft emits K + 1 tokens for the same forward
    n = 2 * NEW
    references = [_reference(model, p, n) for p in _prompts()]
    forwards = {}
    for bonus in (False, True):
        gen = SpeculativeGenerator(model, k=4, eos_token_id=None, bonus=bonus)
        outs = gen.generate(_prompts(), n)
        for prompt, out, want in zip(_prompts(), outs, references):
            _check_equal(model, prompt, out.tokens, want)
        forwards[bonus] = gen.last_run.forwards
        if bonus:  # some verify emitted more tokens than it drafted
            assert any(o.accepted == o.drafted and o.verifies for o in outs)
    assert forwards[True] < forwards[False], forwards


def test_several_eos_ids_end_requests_at_the_first(fsm, model):
    prompts = _prompts(seed=3)
    firsts = [_reference(model, p, NEW) for p in prompts]
    eos = sorted({firsts[0][NEW // 2], firsts[1][NEW // 3]})
    gen = SpeculativeGenerator(model, k=4, eos_token_id=eos)
    outs = gen.generate(prompts, NEW)
    ended = 0
    for prompt, out, full in zip(prompts, outs, firsts):
        cut = next((i for i, t in enumerate(full) if t in eos), None)
        want = full if cut is None else full[: cut + 1]
        assert out.tokens == want
        assert out.finished_by_eos == (cut is not None)
        ended += cut is not None
    assert ended >= 2


def test_max_new_tokens_one_and_budget_caps_the_draft(model):
    prompts = _prompts()
    gen = SpeculativeGenerator(model, k=8, eos_token_id=None)
    for n in (1, 2, 5):
        outs = gen.generate(prompts, n)
        for prompt, out in zip(prompts, outs):
            assert out.tokens == _reference(model, prompt, n)


def test_first_mismatch_reports_the_top_two_gap(model):
    prompt = _prompts()[1]
    want = _reference(model, prompt, 6)
    assert first_mismatch(model, prompt, want, want) is None
    bad = want[:3] + [(want[3] + 1) % VOCAB] + want[4:]
    gap = first_mismatch(model, prompt, bad, want)
    assert gap["index"] == 3 and gap["want"] == want[3] and gap["got"] == bad[3]
    assert gap["top2_gap"] >= 0 and gap["logit_gap_want_got"] >= gap["top2_gap"] - 1e-6
    assert first_mismatch(model, prompt, want[:4], want)["note"].startswith("lengths differ")


# -- refusals -----------------------------------------------------------------------------
def test_refuses_unsupported_transformers_versions():
    for bad in ("4.46.3", "4.57.0", "6.0.0", "3.5"):
        with pytest.raises(UnsupportedModel, match=f"transformers {bad} is not supported"):
            check_transformers(bad)
    assert check_transformers("5.24.0") == "5.24.0"
    assert check_transformers("5.0.0rc1") == "5.0.0rc1"


def test_refuses_stateful_models_and_uncroppable_caches(model):
    class Stateful(torch.nn.Module):
        _is_stateful = True
        config = model.config

        def forward(self, *a, **k):  # pragma: no cover - never called
            raise AssertionError

    with pytest.raises(UnsupportedModel, match="stateful"):
        SpeculativeGenerator(Stateful())

    class Uncroppable:
        is_croppable = False

    with pytest.raises(UnsupportedModel, match="cannot be cropped"):
        check_model(model, cache=Uncroppable())
    with pytest.raises(UnsupportedModel, match="causal LM"):
        check_model(object())


def test_refuses_bad_arguments(model):
    with pytest.raises(ValueError, match="drafter"):
        SpeculativeGenerator(model, drafter="magic")
    with pytest.raises(ValueError, match="k must be"):
        SpeculativeGenerator(model, k=-1)
    with pytest.raises(ValueError, match="min_n"):
        SpeculativeGenerator(model, min_n=3, max_n=2)
    with pytest.raises(ValueError, match="min_n"):
        SpeculativeGenerator(model, max_n=2.5)
    with pytest.raises(ValueError, match="prefer"):
        SpeculativeGenerator(model, prefer="middle")
    assert SpeculativeGenerator(model, drafter="ngram").max_n == 4  # the n-gram index needs a cap
    assert SpeculativeGenerator(model, drafter="suffix", max_n=6).max_n == 6
    gen = SpeculativeGenerator(model, k=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate([[1, 2]], 0)
    with pytest.raises(ValueError, match=r"prompts\[1\] must be a non-empty"):
        gen.generate([[1, 2], []], 3)
    with pytest.raises(ValueError, match=r"prompts\[0\] holds token id 64"):
        gen.generate([[1, 64]], 3)
    with pytest.raises(TypeError, match="integer token ids"):
        gen.generate([[1.5, 2.0]], 3)
    wild = SpeculativeGenerator(model, k=3, drafter=lambda history, k: [1, VOCAB + 5])
    with pytest.raises(ValueError, match="drafter proposed token id 69"):
        wild.generate([[1, 2]], 8)


def test_refuses_a_non_boolean_pad_head(model):
    with pytest.raises(TypeError, match="pad_head"):
        SpeculativeGenerator(model, pad_head="yes")


# -- the output projection's rows ------------------------------------------------------------
def test_head_rows_pads_the_rows_it_is_told_and_only_inside_the_block(model):
    from specfsm.hf.evaluate import HeadRows

    head = model.get_output_embeddings()
    rows = HeadRows(head, {2: 4, 3: 4})
    seen = []
    x = torch.randn(1, 3, head.in_features)
    with torch.inference_mode():
        plain = head(x)
        with rows:
            spy = head.register_forward_pre_hook(lambda _m, a: seen.append(tuple(a[0].shape)))
            padded = head(x)
            wide = head(torch.randn(2, 3, head.in_features))  # 6 rows: not in the table
            spy.remove()
        want = head(torch.cat([x[0], x.new_zeros((1, head.in_features))]))[:3]
    assert seen == [(4, head.in_features), (2, 3, head.in_features)]
    assert padded.shape == plain.shape == (1, 3, head.out_features) and wide.shape == (2, 3, head.out_features)
    assert torch.equal(padded[0], want)  # the padded product's rows, exactly
    assert torch.allclose(padded, plain, atol=1e-5)
    assert not head._forward_hooks and not head._forward_pre_hooks  # the user's model is left as it was


def test_head_rows_measures_cpu_linear_heads_only(model):
    from specfsm.hf.evaluate import HeadRows

    class Odd:
        def get_output_embeddings(self):
            return torch.nn.Identity()

    assert HeadRows.for_model(Odd()) is None
    assert HeadRows.for_model(object()) is None
    head = model.get_output_embeddings()
    pads = HeadRows.measure(head)
    assert pads == {}  # a tiny head saves less than the hooks cost: never padded
    big = torch.nn.Linear(256, 8192, bias=False)
    pads = HeadRows.measure(big, repeat=2)
    assert all(1 <= m < to <= HeadRows.TOP for m, to in pads.items())


def test_head_rows_pads_to_the_fewest_rows_among_those_that_cost_the_same():
    from specfsm.hf.evaluate import HeadRows

    # SmolLM2's head on one thread (ms): 2 and 3 rows dear, 4 to 8 one matrix product
    # each, 5 a hair cheaper than 4 by timing noise: both pad to 4, not to 5
    ms = {1: 9.7, 2: 15.5, 3: 30.2, 4: 12.7, 5: 12.5, 6: 14.0, 7: 13.5, 8: 13.0}
    assert HeadRows.choose({m: t / 1e3 for m, t in ms.items()}) == {2: 4, 3: 4}
    ms[5] = 11.0  # 5 rows clearly cheaper than 4: that is a choice, not noise
    assert HeadRows.choose({m: t / 1e3 for m, t in ms.items()}) == {2: 5, 3: 5, 4: 5}
    assert HeadRows.choose({m: 1e-5 * m for m in ms}) == {}  # cost grows with rows: nothing pads


def test_the_generator_measures_the_head_at_construction_once_per_model(monkeypatch):
    # one-time work happens outside a request: at construction, once per model in a
    # process, and no run measures (its time is its steps' own)
    from specfsm.hf.evaluate import HeadRows

    measured = []
    real = HeadRows.measure.__func__
    monkeypatch.setattr(HeadRows, "measure", classmethod(lambda cls, head, repeat=3: measured.append(head)
                                                         or real(cls, head, repeat)))
    fresh = _llama()  # a head no other test measured in this process
    head = fresh.get_output_embeddings()
    gen = SpeculativeGenerator(fresh, k=3, eos_token_id=None)
    assert measured == [head] and gen.calibration_s > 0
    gen.generate(_prompts()[:2], 4)
    assert measured == [head]  # no measurement inside the request
    assert not hasattr(gen.last_run, "head_s")
    run = gen.last_run
    assert run.outside_s == pytest.approx(max(run.wall_s - run.model_s - run.calibrate_s, 0.0))
    again = SpeculativeGenerator(fresh, k=3, eos_token_id=None)
    assert measured == [head] and again.calibration_s < gen.calibration_s  # known in this process
    plain = SpeculativeGenerator(fresh, k=3, eos_token_id=None, pad_head=False)
    assert measured == [head] and plain._head is None
    torch.set_num_threads(2)  # a measurement holds for the thread count it was made with
    try:
        SpeculativeGenerator(fresh, k=3, eos_token_id=None)
    finally:
        torch.set_num_threads(1)
    assert measured == [head, head]


def test_generator_with_a_padded_head_equals_generate(fsm, model, references, monkeypatch):
    from specfsm.hf.evaluate import HeadRows

    head = model.get_output_embeddings()
    rows = HeadRows(head, {m: 4 for m in (1, 2, 3)})
    calls = []
    monkeypatch.setattr(HeadRows, "for_model", classmethod(lambda cls, m, repeat=3: calls.append(m) or rows))
    gen = SpeculativeGenerator(model, k=3, eos_token_id=None)
    shapes = []
    # registered before the padding's hooks, so it runs first and sees the padded product
    spy = head.register_forward_hook(lambda _m, _a, out: shapes.append(tuple(out.shape)))
    try:
        outs = gen.generate(_prompts()[:3], NEW)
        gen.generate(_prompts()[:1], 4)
    finally:
        spy.remove()
    for prompt, out, want in zip(_prompts(), outs, references):
        _check_equal(model, prompt, out.tokens, want)
    assert calls == [model]  # looked up once per generator
    assert (4, head.out_features) in shapes  # forwards of 1 to 3 rows really ran padded
    # the online cost table starts from a prior whose padded row counts cost their padding's
    prior = gen.online.prior
    assert prior is not hfcost.PRIOR_COST and all(prior(r) == hfcost.PRIOR_COST(4) for r in (2, 3))
    assert prior(1) == hfcost.PRIOR_COST(1) and prior(5) == hfcost.PRIOR_COST(5)
    assert all(o.prior is prior for o in gen.online.by_batch.values())
    assert not head._forward_hooks and not head._forward_pre_hooks


# -- the draft-length chooser's arithmetic ------------------------------------------------
def test_expected_tokens():
    e = hfcost.expected_tokens
    assert e([0.5, 0.5, 0.5], 0) == 1.0 and e([0.5, 0.5], 1) == 1.0
    assert e([0.5, 0.5, 0.5], 2) == pytest.approx(1.5)
    assert e([0.5, 0.5, 0.5], 3) == pytest.approx(1.75)
    assert e([0.9, 0.8], 3) == pytest.approx(1 + 0.9 + 0.72)
    assert e([1.0] * 10, 8) == pytest.approx(8.0)


def test_cost_model_makes_noisy_measurements_monotone():
    # a slow sample at 4 rows (load on a shared machine) and 8 rows dearer than 8 decodes
    c = hfcost.CostModel({1: 1.0, 2: 1.6, 4: 3.5, 8: 9.0, 16: 3.0})
    assert c.measured == [1.0, 1.6, 3.5, 9.0, 3.0]
    assert c.costs == [1.0, 1.6, 3.0, 3.0, 3.0]
    assert all(c(r) <= c(r + 1) for r in range(1, 40))
    raw = hfcost.CostModel({1: 1.0, 2: 1.6, 4: 3.5, 8: 9.0, 16: 3.0}, monotone=False)
    assert raw(4) == 3.5 and raw(8) == 9.0
    # the noisy table makes long drafts look dear; the monotone one drafts all 8
    conds = [[0.9] * 16]
    assert hfcost.choose_width(conds, [8], raw, 8) == 2
    assert hfcost.choose_width(conds, [8], c, 8) == 8
    # a low cost at 1 row bounds the rest by r times it
    assert hfcost.CostModel({1: 1.0, 4: 10.0, 8: 12.0}).costs == [1.0, 4.0, 8.0]


def test_cost_model_interpolates_and_refuses_bad_tables():
    c = hfcost.CostModel({1: 1.0, 2: 2.0, 11: 2.8})
    assert c(1) == 1.0 and c(2) == 2.0 and c(11) == pytest.approx(2.8)
    assert c(6) == pytest.approx(2.0 + 0.8 * 4 / 9)
    assert c(20) == pytest.approx(2.8 + 0.8 * 9 / 9)  # last segment's slope
    assert hfcost.CostModel({4: 2.0})(8) == pytest.approx(4.0)
    for bad in ({}, {0: 1.0}, {1: 0.0}, {1: -1.0}):
        with pytest.raises(ValueError):
            hfcost.CostModel(bad)


def test_choose_width_maximises_tokens_per_cost():
    c = hfcost.CostModel({1: 1.0, 2: 2.0, 11: 2.8})
    # low acceptance: a plain decode (W = 0) pays best
    assert hfcost.choose_width([[0.3] * 16], [16], c, 16) == 0
    # perfect acceptance: the longest draft available
    assert hfcost.choose_width([[1.0] * 16], [11], c, 16) == 11
    # 0.9 per position: compare every W by hand
    cond = [0.9] * 16
    best = max(range(2, 17), key=lambda w: hfcost.expected_tokens(cond, w) / c(w))
    value = hfcost.expected_tokens(cond, best) / c(best)
    want = best if value > 1.0 else 0
    assert hfcost.choose_width([cond], [16], c, 16) == want and want >= 11
    # nothing to draft: decode
    assert hfcost.choose_width([[1.0] * 4], [0], c, 16) == 0
    assert hfcost.choose_width([], [], c, 16) == 0
    # a batch: the width is shared, rows cost B * W
    flat = hfcost.CostModel({1: 1.0, 64: 1.0, 128: 2.0})
    assert hfcost.choose_width([[1.0] * 8, [0.0] * 8], [8, 8], flat, 8) == 8
    assert hfcost.choose_width([[1.0] * 8, [0.0] * 8], [8, 8], hfcost.CostModel({1: 1.0, 2: 2.0}), 8) == 0


# a CPU's shape (SmolLM2-135M, one thread, ms): a batch decodes for little more than one request
CPU_MS = hfcost.CostModel({1: 70.0, 2: 100.0, 4: 134.0, 8: 177.0, 16: 218.0, 32: 290.0, 64: 520.0, 128: 1000.0})


def _makespan(conds, avail, left, cost, w):
    """The batch's end if every step ran at width ``w``, by a step-by-step simulation
    (fractional progress), independent of choose_batch_width's closed form."""
    left = [float(x) for x in left]
    total = 0.0
    while any(x > 1e-9 for x in left):
        alive = [j for j, x in enumerate(left) if x > 1e-9]
        drafting = w >= 2 and any(avail[j] >= 2 for j in alive)
        gains = {j: hfcost.expected_tokens(conds[j], min(w, avail[j])) if avail[j] >= 2 else 1.0 for j in alive}
        # advance to the next request's end (or one step), whichever comes first
        dt = min(min(left[j] / gains[j] for j in alive), 1.0)
        total += dt * cost(len(alive) * (w if drafting else 1))
        for j in alive:
            left[j] -= dt * gains[j]
    return total


def test_choose_batch_width_ends_the_batch_soonest():
    q, d = [0.95] * 32, [0.2] * 32
    one = lambda n: CPU_MS  # noqa: E731
    # one request copies, three copy nothing: widening every step for it delays the
    # three as much as it saves; the batch decodes plainly
    assert hfcost.choose_batch_width([q, d, d, d], [20, 0, 0, 0], [256] * 4, one, 32) == 0
    assert hfcost.choose_width([q, d, d, d], [20, 0, 0, 0], CPU_MS, 32) > 0  # tokens per cost would widen
    # every request copies: wide
    assert hfcost.choose_batch_width([q] * 4, [20] * 4, [256] * 4, one, 32) >= 8
    # the others almost done: the copier's long tail is the batch's end, it drafts wide
    assert hfcost.choose_batch_width([q, d], [20, 0], [256, 10], one, 32) >= 8
    # nothing to draft, or no request
    assert hfcost.choose_batch_width([q, q], [0, 1], [256, 256], one, 32) == 0
    assert hfcost.choose_batch_width([], [], [], one, 32) == 0
    # the chosen width's makespan is the least over every width, by simulation
    rng = random.Random(5)
    for _ in range(40):
        b = rng.randint(2, 5)
        conds = [[rng.choice((0.1, 0.5, 0.8, 0.95))] * 16 for _ in range(b)]
        avail = [rng.choice((0, 3, 8, 16)) for _ in range(b)]
        left = [rng.randint(1, 300) for _ in range(b)]
        w = hfcost.choose_batch_width(conds, avail, left, one, 16)
        spans = {v: _makespan(conds, avail, left, CPU_MS, v) for v in [0] + list(range(2, 17))}
        assert spans[w] <= min(spans.values()) * (1 + 1e-6), (conds, avail, left, w, spans)
    # each batch size's own table: a batch of 2 whose wide forwards are dear decodes
    dear = hfcost.CostModel({1: 70.0, 2: 100.0, 4: 1000.0})
    by = lambda n: dear if n == 2 else CPU_MS  # noqa: E731
    assert hfcost.choose_batch_width([q, q], [8, 8], [256, 256], by, 8) == 0
    assert hfcost.choose_batch_width([q, q], [8, 8], [256, 256], one, 8) == 8


def test_choose_batch_width_of_one_request_is_choose_width():
    rng = random.Random(7)
    for _ in range(200):
        cond = [rng.random() for _ in range(rng.randint(1, 20))]
        a = rng.randint(0, 24)
        left = rng.randint(1, 500)
        assert (hfcost.choose_batch_width([cond], [a], [left], lambda n: CPU_MS, 24)
                == hfcost.choose_width([cond], [a], CPU_MS, 24))


def test_cost_model_cap_keeps_the_kernels_cheap_widths():
    # 4 rows cheaper than 3 (a CPU's matrix kernels): "cap" keeps that, True flattens it
    table = {1: 1.0, 2: 1.65, 3: 2.02, 4: 1.52, 5: 1.75, 6: 1.73, 7: 1.96, 8: 1.83}
    cap = hfcost.CostModel(table, monotone="cap")
    assert cap.costs == list(table.values()) and cap.monotone == "cap"
    assert hfcost.CostModel(table).costs == [1.0, 1.52, 1.52, 1.52, 1.73, 1.73, 1.83, 1.83]
    assert hfcost.CostModel({1: 1.0, 4: 10.0}, monotone="cap").costs == [1.0, 4.0]  # the cap still holds
    with pytest.raises(ValueError, match="monotone"):
        hfcost.CostModel(table, monotone="sometimes")
    # a 2-token draft (3 rows, bonus row included) at 0.6 per position: not worth its
    # real cost, worth the flattened one; with 4 rows available both take 4
    cond = [[0.6] * 8]
    assert hfcost.choose_width(cond, [3], cap, 8) == 0
    assert hfcost.choose_width(cond, [3], hfcost.CostModel(table), 8) == 3
    assert hfcost.choose_width(cond, [8], cap, 8) == 4
    # the prior's shape is SmolLM2's on one thread: 4 rows cost less than 3, and 12 than 11
    assert hfcost.PRIOR_COST(4) < hfcost.PRIOR_COST(3) and hfcost.PRIOR_COST(12) < hfcost.PRIOR_COST(11)
    assert hfcost.PRIOR_COST.monotone == "cap" and hfcost.PRIOR_COST(1) == 1.0


def test_padded_prior_costs_a_padded_row_count_at_most_its_padding():
    base = hfcost.CostModel({1: 1.0, 2: 1.65, 3: 2.02, 4: 1.52, 8: 1.83}, monotone="cap")
    got = hfcost.padded_prior(base, {2: 4, 3: 4, 5: 8})
    assert [got(r) for r in (1, 2, 3, 4, 8)] == [1.0, 1.52, 1.52, 1.52, 1.83]
    assert got(5) == min(base(5), base(8)) and got.monotone == "cap"
    # a padding to a dearer count, or to fewer rows, changes nothing
    same = hfcost.padded_prior(base, {1: 4, 4: 2})
    assert [same(r) for r in range(1, 9)] == [base(r) for r in range(1, 9)]
    # a 3-row decode of a batch of 3 (padded to 4) now costs less than its 6-row verify
    assert got(3) < got(6) and not base(3) < base(6)


def test_acceptance_by_match_length():
    a = hfcost.AcceptanceByMatch(weight=2.0)
    edges = hfcost.AcceptanceByMatch.EDGES
    assert [a.bucket(m) for m in (-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 63, 64, 10**6)] == [0, 0, 1, 2, 3, 4, 4, 5, 5, 6, 10, 11, 11]
    priors = [a.prior(m) for m in edges]
    assert priors == sorted(priors) and priors[0] == 0.5 and max(priors) == 0.95
    assert a.conditional(5, 3) == [a.prior(5)] * 3  # no evidence: the prior
    for _ in range(8):
        a.record(40, 4, 4)  # long matches: every draft fully accepted
        a.record(1, 4, 0)  # 1-token matches: rejected at once
    long, short = a.conditional(40, 4), a.conditional(1, 4)
    assert long[0] == pytest.approx((8 + 2 * 0.95) / (8 + 2))
    assert short[0] == pytest.approx((0 + 2 * a.prior(1)) / (8 + 2))
    assert a.conditional(4, 4) == [a.prior(4)] * 4  # other classes untouched
    # the chooser drafts long after a long match and decodes after a short one
    cost = hfcost.CostModel({1: 1.0, 4: 1.5, 8: 1.8, 16: 2.4}, monotone="cap")
    assert hfcost.choose_width([long + [0.95] * 12], [16], cost, 16) == 16
    assert hfcost.choose_width([short + [0.5] * 12], [16], cost, 16) == 0
    with pytest.raises(ValueError, match="weight"):
        hfcost.AcceptanceByMatch(weight=-1)


def test_adaptive_suffix_drafts_learn_acceptance_by_match_length(fsm, model, references):
    gen = SpeculativeGenerator(model, eos_token_id=None, cost=FLAT_COST)
    assert gen.drafter == "suffix" and gen.max_n is None and gen.prefer == "latest"
    outs = gen.generate(_prompts(), NEW)
    for prompt, out, want in zip(_prompts(), outs, references):
        _check_equal(model, prompt, out.tokens, want)
    drafted = sum(c.drafted[0] for c in gen.by_match.classes if c.drafted)
    assert drafted == sum(o.verifies for o in outs) > 0  # every verify recorded in its class
    assert sum(o.accepted for o in outs) > 0


def test_acceptance_stats_by_position():
    s = hfcost.AcceptanceStats()
    s.record(4, 2)  # positions 1, 2 accepted, 3 rejected, 4 never reached
    s.record(2, 2)
    assert s.drafted == [2, 2, 1, 0] and s.accepted == [2, 2, 0, 0]
    assert s.conditional(3, prior=0.5, weight=0.0)[:3] == [1.0, 1.0, 0.0]
    assert s.conditional(5, prior=0.5, weight=2.0)[4] == 0.5
    with pytest.raises(ValueError):
        s.record(2, 3)


def test_online_cost_learns_from_the_run_s_own_forwards(model, references):
    gen = SpeculativeGenerator(model, eos_token_id=None, k_max=4)
    outs = gen.generate(_prompts(), NEW)
    for prompt, out, want in zip(_prompts(), outs, references):
        _check_equal(model, prompt, out.tokens, want)
    assert gen.cost is None and gen.last_run.calibrate_s == 0  # no separate calibration
    # filed by batch size: the batch's forwards, then the tail after requests finished
    by = gen.online.by_batch
    assert by and set(by) <= set(range(1, len(_prompts()) + 1))
    samples = {(b, r): v for b, o in by.items() for r, v in o.samples.items()}
    assert all(len(v) <= gen.online.window and r % b == 0 for (b, r), v in samples.items())
    assert sum(len(v) for v in samples.values()) == min(gen.last_run.forwards - len(_prompts()),
                                                        gen.online.window * len(samples))
    m = gen.online.model(len(_prompts()))
    assert m.monotone == "cap"  # as the prior: the kernels' cheap widths are kept
    r0 = m.rows[0]
    assert all(m(r) <= m(r0) * r / r0 * (1 + 1e-9) for r in range(r0, 200))


def test_online_cost_scales_the_prior_to_median_timings_within_bounds():
    o = hfcost.OnlineCost(hfcost.CostModel({1: 1.0, 2: 2.0, 8: 4.0}), window=4, min_samples=3)
    assert o.model() is o.prior  # no evidence yet: the prior's shape
    o.record(1, 0.5)
    o.record(1, 0.9)
    o.record(1, 0.0)  # a clock that did not move: ignored
    assert o.estimates() == {} and o.model() is o.prior  # too few timings of one row
    o.record(1, 0.6)
    assert o.estimates() == {1: 0.6}  # the median, not the fastest
    assert o.model().costs == [0.6, 1.2, 2.4]
    for t in (1.0, 1.1, 0.9):
        o.record(8, t)  # 8 rows far cheaper than the prior's shape says: bounded at half
    assert o.estimates() == {1: 0.6, 8: 1.0}
    assert o.model()(8) == pytest.approx(4 * 0.6 / 2) and o.model()(1) == pytest.approx(0.6)
    for t in (0.01, 0.01, 0.01, 0.01):
        o.record(1, t)  # the window forgets older timings; a lucky streak stays bounded
    assert o.samples[1] == [0.01] * 4
    est = o.estimates()
    scale = sorted([0.01 / 1.0, est[8] / 4.0])[1]
    assert o.model()(1) == pytest.approx(scale / 2) and o.model()(8) == pytest.approx(min(est[8], 4 * scale * 2))
    with pytest.raises(ValueError, match="window"):
        hfcost.OnlineCost(window=0)
    with pytest.raises(ValueError, match="window"):
        hfcost.OnlineCostByBatch(window=0)
    with pytest.raises(ValueError, match="min_samples"):
        hfcost.OnlineCost(window=4, min_samples=5)
    with pytest.raises(ValueError, match="spread"):
        hfcost.OnlineCost(spread=0.5)


def test_online_cost_by_batch_keeps_each_batch_size_apart():
    prior = hfcost.CostModel({1: 1.0, 4: 2.0, 32: 8.0})
    o = hfcost.OnlineCostByBatch(prior, window=4, min_samples=3)
    assert o.model(4) is prior and o.estimates(4) == {}
    for t in (0.10, 0.11, 0.09):
        o.record(1, 32, t)  # a single request's 32-row verifies
    o.record(4, 32, 0.0)  # a timing of exactly 0: ignored, no table for 4 requests yet
    assert set(o.by_batch) == {1}
    assert o.model(4)(32) == pytest.approx(0.10)  # no timing at 4 requests yet: the nearest batch size's
    for t in (0.20, 0.21, 0.19):
        o.record(4, 32, t)  # four requests of 8 rows: twice the single request's 32 rows
    assert o.estimates(4) == {32: 0.20} and o.estimates(1) == {32: 0.10}
    assert o.model(4)(32) == pytest.approx(0.20) and o.model(1)(32) == pytest.approx(0.10)
    assert o.model(4)(4) == pytest.approx(0.05)  # the prior's shape, scaled to that batch size
    assert o.model(3) is o.model(4) and o.model(2) is o.model(1)  # nearest; the larger on a tie
    for t in (0.3, 0.3, 0.3):
        o.record(2, 4, t)
    assert o.model(3) is o.model(4) and o.model(2)(4) == pytest.approx(0.3)
    assert "4: OnlineCost" in repr(o)


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("seconds, kind", [(INF, ValueError), (-INF, ValueError), (NAN, ValueError),
                                           (-1e-3, ValueError), ("0.1", TypeError), (None, TypeError)])
def test_cost_tables_refuse_a_timing_that_is_not_a_finite_number_of_seconds(seconds, kind):
    # an infinite timing priced every width at inf (and its median table at NaN); each
    # refusal names the argument and leaves the table as it was
    o = hfcost.OnlineCost(window=4, min_samples=1)
    o.record(4, 0.2)
    before = o.model()
    with pytest.raises(kind, match="seconds"):
        o.record(4, seconds)
    assert o.samples == {4: [0.2]} and o.model() is before
    by = hfcost.OnlineCostByBatch(window=4, min_samples=1)
    with pytest.raises(kind, match="seconds"):
        by.record(1, 4, seconds)
    assert by.by_batch == {} and by.model(1) is by.prior
    c = hfcost.CompactionCost(0.5)
    with pytest.raises(kind, match="seconds"):
        c.record_forward(4, 64, seconds)
    with pytest.raises(kind, match="seconds"):
        c.record_copy(256, seconds)
    assert c.forwards == [] and c.copy is None


@pytest.mark.parametrize("rows, kind", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError),
                                        ("4", TypeError)])
def test_cost_tables_refuse_rows_that_are_not_a_count_of_at_least_one(rows, kind):
    o = hfcost.OnlineCost()
    with pytest.raises(kind, match="rows"):
        o.record(rows, 0.1)
    by = hfcost.OnlineCostByBatch()
    with pytest.raises(kind, match="batch"):
        by.record(rows, 8, 0.1)
    c = hfcost.CompactionCost(0.5)
    with pytest.raises(kind, match="rows"):
        c.record_forward(rows, 64, 0.1)
    with pytest.raises(kind, match="width"):
        c.record_forward(4, rows, 0.1)
    with pytest.raises(kind, match="cells"):
        c.record_copy(rows, 0.1)
    assert o.samples == {} and by.by_batch == {} and c.forwards == [] and c.copy is None


def test_cost_tables_take_numpy_counts_and_refuse_fewer_rows_than_requests():
    by = hfcost.OnlineCostByBatch(window=4, min_samples=1)
    with pytest.raises(ValueError, match="rows must be at least batch=4"):
        by.record(4, 2, 0.1)  # fewer rows than requests: not a forward
    with pytest.raises(ValueError, match="rows"):
        by.record(1, -1, 0.1)
    assert by.by_batch == {}
    by.record(np.int64(2), np.int32(8), np.float32(0.25))
    assert by.estimates(2) == {8: 0.25} and type(next(iter(by.estimates(2)))) is int
    with pytest.raises(ValueError, match="positive and finite"):
        hfcost.CostModel({1: 1.0, 4: INF})


def test_adaptive_generator_measures_cost_once(model):
    gen = SpeculativeGenerator(model, eos_token_id=None, k_max=4, calibrate="upfront")
    gen.generate(_prompts()[:2], 4)
    first = gen.cost
    assert first is not None and gen.last_run.calibrate_s > 0
    assert first.rows == [2, 4, 8, 10]  # 2 requests x widths 1, 2, 4, 5 (k_max + the bonus row)
    gen.generate(_prompts()[:2], 4)
    assert gen.cost is first and gen.last_run.calibrate_s == 0


# -- sampling -------------------------------------------------------------------------------
Z_1E6 = 4.753424  # upper 1e-6 quantile of the standard normal


def chi2_threshold(df: int) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at 1 - 1e-6."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + Z_1E6 * math.sqrt(c)) ** 3


def chi2(counts, p) -> float:
    keep = p > 0
    assert counts[~keep].sum() == 0, "a token the target gives probability 0 was emitted"
    expected = counts.sum() * p[keep]
    return float(((counts[keep] - expected) ** 2 / expected).sum())


SMALL_V = 8
SAMPLES = 2000
SAMPLING = dict(temperature=1.3, top_k=6)


class ResampleFromTarget:
    """A deliberately wrong rule: accepts like speculative sampling but on rejection draws
    from the target p instead of the residual max(0, p - q)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def select(self, draft, probs):
        for i, x in enumerate(draft):
            if self.rng.random() > probs[i, x]:
                tok = int(np.searchsorted(np.cumsum(probs[i]), self.rng.random() * probs[i].sum(), side="right"))
                return i, list(draft[:i]) + [min(tok, probs.shape[1] - 1)]
        return len(draft), list(draft)


def _exact_marginals(gen, prompt):
    """Exact distributions of emitted tokens 2 and 3 under plain sampling."""
    with torch.inference_mode():
        p1 = gen.probabilities(gen.model(input_ids=torch.tensor([prompt])).logits[:, -1])[0]
        two = torch.tensor([prompt + [a] for a in range(SMALL_V)])
        p2 = gen.probabilities(gen.model(input_ids=two).logits[:, -1])  # [a, b]
        three = torch.tensor([prompt + [a, b] for a in range(SMALL_V) for b in range(SMALL_V)])
        p3 = gen.probabilities(gen.model(input_ids=three).logits[:, -1]).reshape(SMALL_V, SMALL_V, SMALL_V)
    joint = p1[:, None, None] * p2[:, :, None] * p3
    return joint.sum(axis=(0, 2)), joint.sum(axis=(0, 1))


@pytest.fixture(scope="module")
def small_model():
    return _llama(vocab=SMALL_V)


def _sampled_counts(small_model, rule=None, seed=5, bonus=True):
    prompt = [1, 2, 3, 1, 2]

    def drafter(history, k):  # a fixed three-token draft: accepted sometimes, rejected others
        return [3, 1, 2][:k]

    gen = SpeculativeGenerator(small_model, drafter=drafter, k=3, do_sample=True, seed=seed, rule=rule,
                               eos_token_id=None, bonus=bonus, **SAMPLING)
    outs = gen.generate([prompt] * SAMPLES, 3)
    toks = np.array([o.tokens for o in outs])
    assert sum(o.verifies for o in outs) >= SAMPLES and 0 < sum(o.rollbacks for o in outs) < SAMPLES
    c2 = np.bincount(toks[:, 1], minlength=SMALL_V)
    c3 = np.bincount(toks[:, 2], minlength=SMALL_V)
    return gen, prompt, c2, c3


@pytest.mark.parametrize("bonus", [True, False])
def test_speculative_sampling_keeps_the_target_distribution(small_model, bonus):
    # runs on BatchState (step with probs=), with and without the bonus row
    gen, prompt, c2, c3 = _sampled_counts(small_model, bonus=bonus)
    p2, p3 = _exact_marginals(gen, prompt)
    assert chi2(c2, p2) < chi2_threshold(int((p2 > 0).sum()) - 1)
    assert chi2(c3, p3) < chi2_threshold(int((p3 > 0).sum()) - 1)


def test_a_wrong_sampling_rule_fails_the_same_test(small_model):
    # a rule BatchState does not know (``select``) settles through ServingState
    gen, prompt, c2, c3 = _sampled_counts(small_model, rule=ResampleFromTarget(5))
    p2, p3 = _exact_marginals(gen, prompt)
    assert chi2(c2, p2) > chi2_threshold(int((p2 > 0).sum()) - 1)


def _tree_sampled(small_model, seed, trees=True, **sampling):
    # "1 2" was followed by 3 twice and by 4 once: the suffix index's tree branches there
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]
    # rows cost nothing extra at any width, and the width maximises tokens per unit of
    # cost (the batch's end is the same at any width): every request that can drafts,
    # and trees grow beside the chains
    gen = SpeculativeGenerator(small_model, drafter="suffix-tree", do_sample=True, seed=seed, eos_token_id=None,
                               cost=hfcost.CostModel({1: 1.0, 10**6: 1.0}), objective="throughput", **sampling)
    outs = gen.generate([prompt] * SAMPLES, 6)  # tokens 2 and 3 tested; room for drafts of 3 and more
    if trees:
        assert gen.last_run.trees >= SAMPLES // 10  # trees were verified, not chains alone
    toks = np.array([o.tokens for o in outs])
    return gen, prompt, toks, outs


def test_tree_sampling_keeps_the_target_distribution(small_model):
    # one draw per row, the tree walked with them (specfsm.tree.sampling), through BatchState's tree verify
    gen, prompt, toks, outs = _tree_sampled(small_model, 11, **SAMPLING)
    assert 0 < sum(o.accepted for o in outs) and sum(o.rollbacks for o in outs) > 0
    p2, p3 = _exact_marginals(gen, prompt)
    c2 = np.bincount(toks[:, 1], minlength=SMALL_V)
    c3 = np.bincount(toks[:, 2], minlength=SMALL_V)
    assert chi2(c2, p2) < chi2_threshold(int((p2 > 0).sum()) - 1)
    assert chi2(c3, p3) < chi2_threshold(int((p3 > 0).sum()) - 1)


def test_tree_sampling_at_top_k_1_is_greedy(small_model):
    # one token left at every row: the sampled walk is the greedy walk (every request
    # alike, so the drafts may or may not branch)
    _, prompt, toks, _ = _tree_sampled(small_model, 3, trees=False, top_k=1)
    want = SpeculativeGenerator(small_model, k=0, eos_token_id=None).generate([prompt], 6)[0].tokens
    assert (toks == np.array(want)).all()


def test_processed_probabilities_match_transformers_warpers(small_model):
    gen = SpeculativeGenerator(small_model, do_sample=True, temperature=0.7, top_k=5, top_p=0.9, seed=0)
    logits = torch.randn(4, SMALL_V, generator=torch.Generator().manual_seed(0))
    p = gen.probabilities(logits)
    assert p.shape == (4, SMALL_V) and np.allclose(p.sum(1), 1)
    assert ((p > 0).sum(1) <= 5).all()  # top-k applied
    scaled = torch.softmax(logits / 0.7, -1).numpy()
    top = np.argmax(scaled, 1)
    assert (p[np.arange(4), top] >= scaled[np.arange(4), top]).all()  # mass moved to the top


# -- the command line -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama saved as a local checkpoint (no tokenizer: prompts are token ids)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    model = _llama()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    return str(path)


def _prompts_file(tmp_path, lines):
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return str(f)


def test_cli_generate_side_by_side_and_identical(checkpoint, tmp_path, capsys):
    import json

    prompts = _prompts()[:3]
    path = _prompts_file(tmp_path, [json.dumps({"prompt": p, "name": f"p{i}"}) for i, p in enumerate(prompts)])
    rc = _run_cli(["generate", "--model", checkpoint, "--prompts", path, "--max-new-tokens", "8",
                   "--k", "3", "--pld-k", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["identical"]
    assert set(out["methods"]) == {"greedy", "pld", "specfsm"}
    model = MODELS["llama"]()
    for p, rec in zip(prompts, out["outputs"]["specfsm"]):
        assert rec["output"] == _reference(model, p, 8)
    assert out["methods"]["greedy"]["forwards"] == 3 * 8
    assert out["methods"]["specfsm"]["forwards"] < 3 * 8
    # the table, batched
    rc = _run_cli(["generate", "--model", checkpoint, "--prompts", path, "--max-new-tokens", "6",
                   "--batch", "3", "--methods", "greedy,specfsm"])
    text = capsys.readouterr().out
    assert rc == 0 and "tokens/s" in text and "identity: all 3" in text and "specfsm (suffix, k adaptive)" in text
    # another drafter, named in the settings
    rc = _run_cli(["generate", "--model", checkpoint, "--prompts", path, "--max-new-tokens", "6",
                   "--drafter", "ngram", "--methods", "greedy,specfsm", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["identical"] and out["settings"]["drafter"] == "ngram"


def test_cli_bad_prompts_are_reported_by_line(checkpoint, tmp_path, capsys):
    path = _prompts_file(tmp_path, ['{"prompt": [1, 2]}', "not json", '{"prompt": []}',
                                    '{"prompt": [1, "x"]}', '{"text": "hi", "prompt": [1]}', ""])
    rc = _run_cli(["generate", "--model", checkpoint, "--prompts", path])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    for line in (2, 3, 4, 5):
        assert f"{path}:{line}:" in err
    assert f"{path}:1:" not in err
    # text needs a tokenizer, and the tiny checkpoint has none
    path = _prompts_file(tmp_path, ['{"text": "def f(): pass"}'])
    assert _run_cli(["generate", "--model", checkpoint, "--prompts", path]) == 2
    assert f"{path}:1: a text prompt needs the model's tokenizer" in capsys.readouterr().err
    path = _prompts_file(tmp_path, ['{"prompt": [1, 999]}'])
    assert _run_cli(["generate", "--model", checkpoint, "--prompts", path]) == 2
    assert "outside the model's vocabulary" in capsys.readouterr().err
    assert _run_cli(["generate", "--model", str(tmp_path / "nowhere")]) == 2
    assert "neither a checkpoint directory" in capsys.readouterr().err
    assert _run_cli(["generate", "--model", checkpoint, "--prompts", str(tmp_path / "none.jsonl")]) == 2


def test_cli_record_writes_a_replay_workload(checkpoint, tmp_path, capsys):
    import json

    from specfsm.serving.workload import load_jsonl

    prompts = _prompts()[:2]
    path = _prompts_file(tmp_path, [json.dumps({"prompt": p}) for p in prompts])
    dest = tmp_path / "rec.jsonl"
    assert _run_cli(["record", "--model", checkpoint, "--prompts", path, "--max-new-tokens", "5", "-o", str(dest)]) == 0
    wl = load_jsonl(dest)
    model = MODELS["llama"]()
    assert [t.prompt for t in wl.traces] == prompts
    assert [t.output for t in wl.traces] == [_reference(model, p, 5) for p in prompts]


def test_shipped_smollm2_recording_is_a_replay_workload():
    """The recorded SmolLM2 outputs shipped with the package load as a replay workload."""
    import os

    import specfsm
    from specfsm.serving.workload import load_jsonl

    path = os.path.join(os.path.dirname(specfsm.__file__), "data", "smollm2_edits.jsonl")
    wl = load_jsonl(path)
    assert len(wl) == 4 and all(len(t.output) == 128 for t in wl.traces)
    assert [t.name for t in wl.traces] == ["abc.py", "genericpath.py", "operator.py", "sndhdr.py"]


def test_hf_package_and_cli_import_without_torch():
    """``specfsm.hf`` and its command-line wiring import lazily: no torch, no transformers."""
    import subprocess
    import sys

    code = ("import sys, specfsm, specfsm.hf, specfsm.hf.cli; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_padded_request_left_alone_after_prefill(model):
    """The longer request ends at its first token: the padded shorter one goes on alone
    (no mask), so its padding must be compacted away first."""
    short, long_ = _prompts()[0], _prompts()[2]
    eos = _reference(model, long_, 1)[0]
    want = _reference(model, short, 10, eos=eos)
    if eos in want:
        want = want[: want.index(eos) + 1]
    gen = SpeculativeGenerator(model, k=3, eos_token_id=eos)
    forward = gen._forward
    seen = []

    def checked(ids, pos, mask, cache, keep=None):
        if mask is None and pos is not None:  # no holes allowed: the cache holds exactly the request's tokens
            seen.append((cache.get_seq_length(), int(pos[0, 0])))
        return forward(ids, pos, mask, cache, keep)

    gen._forward = checked
    outs = gen.generate([short, long_], 10)
    assert seen and all(length == first for length, first in seen), seen
    assert outs[1].tokens == [eos] and outs[1].finished_by_eos
    _check_equal(model, short, outs[0].tokens, want)
    assert len(want) > 1 and gen.last_run.compactions >= 1


# -- constructor arguments of the wrong type ------------------------------------
class _NoCalls(torch.nn.Module):
    """A model that fails the test if anything calls it: refusals come first."""

    def __init__(self, real):
        super().__init__()
        self.config = real.config
        self.generation_config = real.generation_config

    def forward(self, *a, **k):  # pragma: no cover - the point is that it is never called
        raise AssertionError("the model was called before the argument was refused")


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        ({"compact_fraction": "0.5"}, TypeError, "compact_fraction must be a number"),
        ({"compact_fraction": None}, TypeError, "compact_fraction"),
        ({"compact_fraction": True}, TypeError, "compact_fraction"),
        ({"compact_fraction": 0.0}, ValueError, "compact_fraction"),
        ({"compact_fraction": float("nan")}, ValueError, "compact_fraction"),
        ({"eos_token_id": "2"}, ValueError, "eos_token_id must be 'model', None"),
        ({"eos_token_id": 2.0}, TypeError, "eos_token_id"),
        ({"eos_token_id": True}, TypeError, "eos_token_id must be an integer"),
        ({"eos_token_id": [1, "x"]}, TypeError, r"eos_token_id\[1\] must be an integer"),
        ({"eos_token_id": [1, 2.5]}, TypeError, r"eos_token_id\[1\]"),
        ({"eos_token_id": -1}, ValueError, "eos_token_id=-1 is outside the model's vocabulary"),
        ({"eos_token_id": VOCAB}, ValueError, f"eos_token_id={VOCAB} is outside"),
        ({"eos_token_id": b"\x01"}, TypeError, "eos_token_id"),
        ({"probe_every": "8"}, TypeError, "probe_every must be an integer"),
        ({"probe_every": 2.5}, TypeError, "probe_every"),
        ({"probe_every": 0}, ValueError, "probe_every must be at least 1"),
        ({"probe_every": None}, TypeError, "probe_every"),
        ({"cost": {1: 1.0}}, TypeError, "cost must be a CostModel or None, got dict"),
        ({"cost": lambda rows: 1.0}, TypeError, "cost must be a CostModel"),
        ({"periodic": "no"}, TypeError, "periodic must be True or False"),
        ({"objective": "latency"}, ValueError, "objective must be 'makespan' or 'throughput'"),
        ({"objective": None}, ValueError, "objective"),
        ({"bonus": 1}, TypeError, "bonus must be True or False"),
        ({"do_sample": "yes"}, TypeError, "do_sample must be True or False"),
        ({"k_max": 4.0}, TypeError, "k_max must be an integer"),
        ({"k_max": -1}, ValueError, "k_max"),
        ({"k": 2.0}, ValueError, "k must be"),
        ({"k": True}, ValueError, "k must be"),
        ({"temperature": "hot"}, TypeError, "temperature must be a number"),
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"do_sample": True, "temperature": 0.0}, ValueError, "temperature must be finite and positive"),
        ({"top_k": 2.5}, TypeError, "top_k must be an integer"),
        ({"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\]"),
        ({"top_p": "x"}, TypeError, "top_p"),
        ({"seed": 1.5}, TypeError, "seed must be an integer"),
        ({"seed": -3}, ValueError, "seed must be at least 0"),
        ({"rule": "exact"}, TypeError, "rule must be an acceptance rule"),
        ({"index_cls": dict}, TypeError, "unexpected keyword argument 'index_cls'"),
        ({"drafter": "ngram", "max_n": 5000}, ValueError, r"NgramIndex refuses \(min_n=1, max_n=5000.*at most 4096"),
        ({"calibrate": ["online"]}, ValueError, "calibrate"),
        ({"prefill": None}, ValueError, "prefill"),
        ({"drafter": np.array([1, 2])}, ValueError, "drafter must be"),
        ({"min_n": True}, ValueError, "min_n"),
    ],
)
def test_refuses_constructor_arguments_of_the_wrong_type_before_any_model_call(kw, exc, words):
    """Each was stored as given and failed later, inside a run (a TypeError from a
    comparison, ``int('2')`` iterating a string, a cost that is not callable the way
    the chooser calls it), or was taken silently (``periodic='no'`` is true)."""
    model = _NoCalls(_llama())
    with pytest.raises(exc, match=words):
        SpeculativeGenerator(model, **kw)


def test_accepted_argument_forms_stay_accepted(model):
    gen = SpeculativeGenerator(model, eos_token_id=np.int64(3), probe_every=np.int32(4), compact_fraction=1,
                               periodic=np.bool_(False), seed=np.uint8(7), top_k=None, top_p=None)
    assert gen.eos == frozenset({3}) and gen.probe_every == 4 and gen.compact_fraction == 1.0
    assert gen.periodic is False
    assert SpeculativeGenerator(model, eos_token_id=(1, np.int16(2))).eos == frozenset({1, 2})
    assert SpeculativeGenerator(model, eos_token_id=None).eos == frozenset()
    assert SpeculativeGenerator(model, temperature=0.0).do_sample is False  # ignored when greedy


@pytest.mark.parametrize(
    "draft, words",
    [
        ([1.7, 2.0], "non-integer token id at position 0: float 1.7"),
        (["3", "4"], "non-integer token id at position 0: str"),
        ([1, True], "non-integer token id at position 1: bool"),
        (None, "must return a sequence of token ids, got NoneType"),
        ("12", "must return a sequence of token ids, got str"),
        (np.array([[1, 2]]), "1-D sequence"),
        (np.array([1.5, 2.5]), "non-integer token id at position 0"),
    ],
)
def test_a_drafter_returning_non_integers_is_refused(model, draft, words):
    """``int(1.7)`` was taken as id 1, and ``int('3')`` as id 3."""
    gen = SpeculativeGenerator(model, k=3, drafter=lambda history, k: draft, eos_token_id=None)
    with pytest.raises(TypeError, match=words):
        gen.generate([[1, 2, 1, 2]], 6)
    ok = SpeculativeGenerator(model, k=3, drafter=lambda history, k: np.array([1, 2], dtype=np.int32), eos_token_id=None)
    assert len(ok.generate([[1, 2, 1, 2]], 6)[0].tokens) == 6


# -- the command line's time estimate, progress lines and counts -----------------
def test_cli_generate_says_how_long_and_shows_progress_lines_off_a_terminal(checkpoint, tmp_path, capsys):
    """stderr is not a terminal here: one line per method and per finished request (it
    printed nothing until the end), after an up-front estimate of the run's length."""
    import json

    prompts = _prompts()[:2]
    path = _prompts_file(tmp_path, [json.dumps({"prompt": p}) for p in prompts])
    rc = _run_cli(["generate", "--model", checkpoint, "--prompts", path, "--max-new-tokens", "4",
                   "--requests", "5", "--methods", "greedy,specfsm"])
    err = capsys.readouterr().err
    assert rc == 0
    lines = err.splitlines()
    assert f"specfsm generate: note: --requests 5: {path} holds 2 prompts; running all of them" in lines
    est = next(line for line in lines if "plain greedy takes " in line)
    assert est.startswith("specfsm generate: 2 methods x 2 requests x up to 4 new tokens: ")
    assert "ms a decode step" in est and "the whole run at most " in est
    for label in ("plain greedy", "specfsm"):
        assert f"specfsm generate: {label}: started" in lines
        assert any(line.startswith(f"specfsm generate: {label}: 1 of 2 done, ") for line in lines)
        assert any(line.startswith(f"specfsm generate: {label}: 2 of 2 done, ") for line in lines)
    assert lines.index(est) < lines.index("specfsm generate: plain greedy: started")
    assert "\r[" not in err  # no bar redraws into a file


def test_estimate_seconds_scales_with_the_run(model):
    from specfsm.hf import cli

    total, per_token, decode = cli.estimate_seconds(model, _prompts()[:2], 50)
    assert decode > 0 and per_token >= 0
    assert total == pytest.approx(sum(len(p) * per_token + 50 * decode for p in _prompts()[:2]))


# -- per-request back-off ---------------------------------------------------------
BACKOFF_COST = hfcost.CostModel({1: 1.0, 2: 1.65, 4: 1.52, 8: 1.83, 16: 2.35, 32: 3.2, 48: 4.3}, monotone="cap")


def _shared_high():
    """A shared estimate that says drafting pays at every match length (as after
    requests that copied well)."""
    a = hfcost.AcceptanceByMatch()
    for m in hfcost.AcceptanceByMatch.EDGES:
        for _ in range(50):
            a.record(m, 8, 8)
    return a


def test_backoff_a_run_of_rejections_drops_the_width_fast():
    shared = _shared_high()
    r = hfcost.RequestBackoff()
    kk = 17
    width = hfcost.choose_width([r.conditional(3, shared.conditional(3, kk))], [kk], BACKOFF_COST, kk)
    assert width >= 8  # no evidence of its own: the shared estimate decides
    widths = []
    for _ in range(4):
        c = shared.conditional(3, kk)
        w = hfcost.choose_width([r.conditional(3, c)], [kk], BACKOFF_COST, kk)
        widths.append(w)
        if w:  # the draft is rejected at once; the shared estimate predicted most of it
            r.record(3, w - 1, 0, hfcost.expected_tokens(c, w) - 1)
    assert widths[0] >= 8 and widths[-1] == 0, widths  # zero within a few rejections
    assert widths.index(0) <= 2, widths
    assert r.ratio() < 0.3
    # other short classes of the same request are scaled down too (the request's ratio)
    assert hfcost.choose_width([r.conditional(1, shared.conditional(1, kk))], [kk], BACKOFF_COST, kk) == 0
    # without the request's own evidence (the shared estimate alone) it would still draft wide
    assert hfcost.choose_width([shared.conditional(3, kk)], [kk], BACKOFF_COST, kk) >= 8


def test_backoff_recovers_on_a_long_match_and_after_accepted_drafts():
    shared = _shared_high()
    r = hfcost.RequestBackoff()
    kk = 33
    for _ in range(6):
        c = shared.conditional(2, kk)
        r.record(2, 8, 0, hfcost.expected_tokens(c, 9) - 1)
    assert hfcost.choose_width([r.conditional(2, shared.conditional(2, kk))], [kk], BACKOFF_COST, kk) == 0
    # a long match (a verbatim copy in progress) is judged by its own class: draft again, wide
    w = hfcost.choose_width([r.conditional(40, shared.conditional(40, kk))], [kk], BACKOFF_COST, kk)
    assert w > 16
    # accepted drafts (as predicted) bring the short classes back
    for _ in range(12):
        c = shared.conditional(40, kk)
        r.record(40, 16, 16, hfcost.expected_tokens(c, 17) - 1)
    assert r.ratio() > 0.9
    assert hfcost.choose_width([r.conditional(1, shared.conditional(1, kk))], [kk], BACKOFF_COST, kk) > 0


def test_k0_is_chosen_when_drafting_does_not_pay():
    r = hfcost.RequestBackoff()
    kk = 17
    # acceptance too low for the price of the rows: a plain decode
    assert hfcost.choose_width([r.conditional(1, [0.3] * kk)], [kk], BACKOFF_COST, kk) == 0
    # expensive rows (each row costs a decode): even 0.8 acceptance does not pay
    dear = hfcost.CostModel({1: 1.0, 64: 64.0})
    assert hfcost.choose_width([[0.8] * kk], [kk], dear, kk) == 0
    # cheap rows and the same acceptance: it pays
    assert hfcost.choose_width([[0.8] * kk], [kk], BACKOFF_COST, kk) > 0
    with pytest.raises(ValueError, match="decay"):
        hfcost.RequestBackoff(decay=0)
    with pytest.raises(ValueError, match="weight"):
        hfcost.RequestBackoff(weight=0)


def test_long_copies_draft_past_16_when_the_cost_model_says_so():
    kk = 33
    cond = [0.97] * kk
    assert hfcost.choose_width([cond], [kk], BACKOFF_COST, kk) > 16
    # the same acceptance on a machine where rows are dear stops short
    assert hfcost.choose_width([cond], [kk], hfcost.CostModel({1: 1.0, 64: 16.0}), kk) <= 16


class _TeacherIndex:
    """An index drafter for one known prompt: wrong drafts behind a short match for the
    first ``switch`` generated tokens, then the right continuation behind a long match."""

    def __init__(self, prompt, want, switch):
        self.p, self.want, self.switch, self.h = len(prompt), want, switch, 0
        self.log = []  # (generated so far, match length) per proposal

    def extend(self, tokens):
        self.h += len(tokens)

    def propose(self, k):
        g = self.h - self.p
        if g < self.switch:
            self._m = 2
            return [(t + 1) % VOCAB for t in self.want[g:g + k]]
        self._m = 40
        return list(self.want[g:g + k])

    def match_length(self):
        self.log.append((self.h - self.p, self._m))
        return self._m


def test_generator_backs_off_per_request_and_recovers(model):
    rnd = random.Random(7)
    prompt = [rnd.randrange(VOCAB) for _ in range(24)]
    n, switch = 64, 40
    want = _reference(model, prompt, n)
    got = {}
    for backoff in (True, False):
        gen = SpeculativeGenerator(model, eos_token_id=None, cost=BACKOFF_COST, backoff=backoff)
        # each request drafts from the scripted index in place of its suffix index
        gen._new_index = lambda: _TeacherIndex(prompt, want, switch)
        gen.by_match = _shared_high()
        out = gen.generate([prompt], n)[0]
        _check_equal(model, prompt, out.tokens, want)
        got[backoff] = (out, gen.last_run.widths)
    (on, widths_on), (off, widths_off) = got[True], got[False]
    # phase 1 (wrong drafts): with back-off a few rejected verifies, then plain decodes and
    # sparse probes; the shared estimate alone keeps verifying wide drafts
    assert on.rollbacks <= 6 < off.rollbacks, (on.rollbacks, off.rollbacks)
    assert sum(widths_on[:switch - 8]) * 3 < sum(widths_off[:switch - 8])
    # phase 2 (a long match, right drafts): drafting resumes and pays
    assert on.accepted >= (n - switch) // 2
    assert on.forwards <= off.forwards and sum(widths_on) * 2 < sum(widths_off)  # fewer rows for the same output


class _WrongIndex:
    """An index drafter that drafts each prompt's greedy continuation behind a long match
    for its first ``wants[prompt][1]`` generated tokens, then always-wrong drafts (each
    token the continuation's plus one) behind a short match."""

    def __init__(self, wants):
        self.wants, self.h, self._m = wants, [], 2

    def extend(self, tokens):
        self.h += [int(t) for t in tokens]

    def propose(self, k):
        prompt = next(p for p in self.wants if tuple(self.h[:len(p)]) == p)
        want, right = self.wants[prompt]
        g = len(self.h) - len(prompt)
        if g < right:
            self._m = 40
            return list(want[g:g + k])
        self._m = 2
        return [(t + 1) % VOCAB for t in want[g:g + k]]

    def match_length(self):
        return self._m


def test_a_batch_probes_its_idle_requests_together_and_rarely(model):
    # a probe widens every row of the batch's padded forward: four requests whose drafts
    # start failing at different times must not probe more often than one alone
    n = 128
    prompts = _prompts()[:4]
    wants = {tuple(p): (_reference(model, p, n), 9 * j) for j, p in enumerate(prompts)}
    probes = {}
    for group in (prompts[:1], prompts):
        gen = SpeculativeGenerator(model, eos_token_id=None, cost=BACKOFF_COST)
        gen._new_index = lambda: _WrongIndex(wants)
        gen.by_match = _shared_high()
        outs = gen.generate(group, n)
        for p, out in zip(group, outs):
            _check_equal(model, p, out.tokens, wants[tuple(p)][0])
        # once every request's drafts fail and the back-off has settled, a step of
        # width 3 is a probe
        probes[len(group)] = sum(1 for w in gen.last_run.widths[40:] if w == 3)
    assert 0 < probes[4] <= probes[1], probes


def test_backoff_flag_is_checked(model):
    with pytest.raises(TypeError, match="backoff must be True or False"):
        SpeculativeGenerator(model, backoff="yes")
    assert SpeculativeGenerator(model, backoff=False).backoff is False


# -- prompts as users write them, and --compare ---------------------------------
def test_load_prompts_takes_chat_messages_and_kinds(tmp_path):
    import json

    from specfsm.hf.prompts import load_prompts
    from specfsm.serving.workload import WorkloadError

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    path = _prompts_file(tmp_path, [json.dumps({"messages": msgs, "kind": "open", "name": "hi"}),
                                    json.dumps({"text": "raw"})])
    specs = load_prompts(path)
    assert specs[0].messages == msgs and specs[0].kind == "open" and specs[0].name == "hi"
    assert specs[1].text == "raw" and specs[1].kind is None
    bad = _prompts_file(tmp_path, [json.dumps({"messages": []}), json.dumps({"messages": [{"role": "user"}]}),
                                   json.dumps({"messages": msgs, "text": "x"}), json.dumps({"messages": ["hi"]}),
                                   json.dumps({"messages": msgs, "kind": 3}),
                                   json.dumps({"messages": [{"role": "user", "content": ""}]})])
    with pytest.raises(WorkloadError) as e:
        load_prompts(bad)
    text = str(e.value)
    for line in range(1, 7):
        assert f"{bad}:{line}:" in text
    assert "exactly one of 'prompt'" in text and "'content' must be a string" in text


def test_messages_get_the_chat_template():
    from specfsm.hf.prompts import PromptSpec, token_ids

    class Tok:
        chat_template = "yes"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            assert add_generation_prompt and tokenize
            return [7] + [len(m["content"]) for m in messages] + [8]

        def __call__(self, text):
            return {"input_ids": [len(text)]}

    msgs = [{"role": "user", "content": "abc"}]
    ids = token_ids([PromptSpec("m", messages=msgs), PromptSpec("t", text="abcd")], Tok(), 100, "f")
    assert ids == [[7, 3, 8], [4]]  # messages templated, text as it is


def test_cli_compare_rotates_methods_and_reports_per_prompt(checkpoint, tmp_path, capsys):
    import json

    prompts = _prompts()[:3]
    path = _prompts_file(tmp_path, [json.dumps({"prompt": p, "name": f"p{i}", "kind": "a" if i < 2 else "b"})
                                    for i, p in enumerate(prompts)])
    rc = _run_cli(["generate", "--model", checkpoint, "--prompts", path, "--max-new-tokens", "6",
                   "--compare", "--pld-ks", "3,5", "--batch", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["identical"]
    assert out["methods"] == ["greedy", "pld_k3", "pld_k5", "specfsm"]
    orders = [r["order"] for r in out["per_prompt"]]
    assert [o[0] for o in orders] == ["greedy", "pld_k3", "pld_k5"]  # rotated per prompt
    assert set(out["by_kind"]) == {"a", "b"} and out["total"]["greedy"]["forwards"] == 3 * 6
    assert [len(b["prompts"]) for b in out["batches"]] == [2, 1]
    assert all(m["identical_to_single_greedy"] for b in out["batches"] for m in b["methods"].values())
    assert len(out["load"]) == 2
    rc = _run_cli(["generate", "--model", checkpoint, "--prompts", path, "--max-new-tokens", "4", "--compare"])
    text = capsys.readouterr().out
    assert rc == 0 and "per kind and in total" in text and "pld_k24" in text and "every output equal" in text


def _compare_two_prompts(checkpoint, tmp_path, capsys, *options):
    """``specfsm generate --compare --json`` on two prompts, 6 new tokens, prompt lookup
    at K = 3, with ``options``; its summary, after checking it ran and kept identity."""
    import json

    prompts = _prompts()[:2]
    path = _prompts_file(tmp_path, [json.dumps({"prompt": p, "name": f"p{i}"}) for i, p in enumerate(prompts)])
    rc = _run_cli(["generate", "--model", checkpoint, "--prompts", path, "--max-new-tokens", "6", "--compare",
                   "--pld-ks", "3", *options, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["identical"]
    return out


def test_cli_compare_runs_each_batch_several_rounds(checkpoint, tmp_path, capsys):
    out = _compare_two_prompts(checkpoint, tmp_path, capsys, "--batch", "2", "--batch-rounds", "3")
    (b,) = out["batches"]
    assert b["orders"] == [["greedy_batched", "specfsm_batched"], ["specfsm_batched", "greedy_batched"],
                           ["greedy_batched", "specfsm_batched"]]
    for m in b["methods"].values():
        rounds = m["rounds_seconds"]
        assert len(rounds) == 3 and m["seconds"] == sorted(rounds)[1]  # the round of median time
        assert m["tokens_per_s"] == pytest.approx(m["tokens"] / m["seconds"])
    with pytest.raises(SystemExit):
        _run_cli(["generate", "--compare", "--batch-rounds", "0"])
    from specfsm.hf.cli import compare

    with pytest.raises(ValueError, match="batch_rounds"):
        compare(None, [], [], 4, [3], {}, batch_rounds=0)


def test_cli_compare_takes_several_drafters(checkpoint, tmp_path, capsys):
    out = _compare_two_prompts(checkpoint, tmp_path, capsys, "--compare-drafters", "suffix,suffix-tree", "--batch", "2")
    assert out["methods"] == ["greedy", "pld_k3", "specfsm", "specfsm_suffix-tree"]
    assert out["spec"]["specfsm_suffix-tree"]["drafter"] == "suffix-tree"
    assert set(out["batches"][0]["methods"]) == {"greedy_batched", "specfsm_batched", "specfsm_suffix-tree_batched"}


@pytest.mark.parametrize("bad", ["", "suffix,suffix", "suffix,chain"])
def test_cli_refuses_a_bad_drafter_list(bad, capsys):
    with pytest.raises(SystemExit):
        _run_cli(["generate", "--compare", "--compare-drafters", bad])
    assert "--compare-drafters" in capsys.readouterr().err
