"""When the transformers path gathers its ragged batch cache (``specfsm.hf.cost.
CompactionCost``): the measured rule against the copy, the fallback before it is
measured, never a gather that removes nothing; and on a tiny model, a batch whose long
prompt keeps the cache wide decodes as each request alone without a gather per step."""

from __future__ import annotations

import random

import pytest

from specfsm.hf.cost import CompactionCost, CostModel


def test_the_fallback_is_the_fraction_removed():
    c = CompactionCost(0.5)
    assert c.beta() is None
    assert c.pays(4, 100, 40, rows=4, horizon=100)  # removes 60% of the cache
    assert not c.pays(4, 100, 60, rows=4, horizon=100)  # 40%
    assert not c.pays(4, 100, 100, rows=4, horizon=10**9)  # removes nothing: never


def _fed(c, beta, a=1e-3, per_row=1e-4, widths=range(40, 120, 4), rows=(4, 8, 12)):
    for w in widths:
        for r in rows:
            c.record_forward(r, w, a + per_row * r + beta * r * w)


def test_beta_is_fitted_from_the_forwards():
    c = CompactionCost(0.5)
    _fed(c, 2e-6)
    assert c.beta() == pytest.approx(2e-6, rel=1e-6)
    flat = CompactionCost(0.5)
    _fed(flat, 0.0)
    assert flat.beta() is None  # no attention cost to save: the fallback decides
    narrow = CompactionCost(0.5)
    _fed(narrow, 2e-6, widths=[50, 52, 54, 56])
    assert narrow.beta() is None  # widths spread over fewer than 8 columns


def test_the_measured_rule_weighs_the_saving_against_the_copy():
    c = CompactionCost(0.5)
    _fed(c, 1e-6)
    c.record_copy(4 * 100, 4e-3)  # 1e-5 s per cell
    # saving 1e-6 * 8 rows * 10 columns * horizon against 1e-5 * 4 * 100 = 4e-3
    assert not c.pays(4, 100, 90, rows=8, horizon=40)  # 3.2e-3 < 4e-3
    assert c.pays(4, 100, 90, rows=8, horizon=60)  # 4.8e-3 > 4e-3
    # a small removal that pays over a long horizon, where the fallback would refuse it
    assert c.pays(4, 100, 90, rows=8, horizon=1000)
    # and a large one that does not pay over a short horizon, where the fallback would take it
    assert not c.pays(4, 100, 30, rows=8, horizon=5)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="fraction"):
        CompactionCost(0.0)
    with pytest.raises(ValueError, match="min_samples"):
        CompactionCost(0.5, window=4, min_samples=8)


def test_a_long_prompt_that_keeps_the_cache_wide_is_not_gathered_every_step():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from specfsm.hf.generate import SpeculativeGenerator

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    rnd = random.Random(5)
    long_ = [rnd.randrange(48) for _ in range(300)]
    shorts = [[rnd.randrange(48) for _ in range(20)] for _ in range(3)]
    prompts = [long_] + shorts
    n = 24
    flat = CostModel({1: 1.0, 64: 1.5})
    gen = SpeculativeGenerator(model, eos_token_id=None, cost=flat)
    outs = gen.generate(prompts, n)
    for p, o in zip(prompts, outs):
        alone = SpeculativeGenerator(model, eos_token_id=None, cost=flat).generate([p], n)[0]
        assert o.tokens == alone.tokens
    # the long row keeps the width, so a gather removes next to nothing while it is
    # live (the rule before this one, holes over half the cache, gathered 11 times in
    # these 17 steps); at most the lone last row is gathered, to decode without a mask
    assert gen.last_run.compactions <= 1
