"""``specfsm.hf.attention``: the grouped attention gives transformers' ``sdpa`` values for
every mask a forward can carry (boolean and additive, shared by rows or batch, trees),
hands every other call to ``sdpa`` unchanged, leaves greedy decoding and specfsm's outputs
equal to plain greedy's, verifies trees, and undoes cleanly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_helpers import one_thread  # noqa: E402, F401 (a module-wide fixture)
from hf_helpers import generate_json, reference, tiny_llama  # noqa: E402

from specfsm.hf.attention import (  # noqa: E402
    ATTENTION,
    GROUPED,
    _grouped_sdpa,
    attention_of,
    group_attention,
    ungroup_attention,
)

VOCAB = 61


class _Module:
    def __init__(self, groups):
        self.num_key_value_groups = groups
        self.is_causal = True


def _qkv(b, heads, groups, rows, width, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, rows, heads, dim, generator=g).transpose(1, 2)  # as a model lays it: not contiguous
    k = torch.randn(b, heads // groups, width, dim, generator=g)
    v = torch.randn(b, heads // groups, width, dim, generator=g)
    return q, k, v


def _masks(b, rows, width, seed=1):
    g = torch.Generator().manual_seed(seed)
    allowed = torch.rand(b, 1, rows, width, generator=g) < 0.7
    allowed[..., 0] = True  # every row sees something
    causal = torch.ones(rows, width, dtype=torch.bool).tril(width - rows)[None, None].expand(b, 1, rows, width)
    additive = torch.zeros(b, 1, rows, width).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return {
        "bool": allowed,
        "causal": causal,
        "additive": additive,
        "one row for all": allowed[:, :, :1],
        "one for the batch": allowed[:1],
    }


@pytest.mark.parametrize("groups", [1, 2, 3])
@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("mask", ["bool", "causal", "additive", "one row for all", "one for the batch", None])
def test_the_grouped_attention_gives_sdpa_values(groups, rows, mask):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, width = 2, 6, 11
    q, k, v = _qkv(b, heads, groups, rows, width)
    m = None if mask is None else _masks(b, rows, width)[mask]
    mod = _Module(groups)
    want, _ = sdpa_attention_forward(mod, q, k, v, m, scaling=0.3)
    got, weights = _grouped_sdpa(mod, q, k, v, m, scaling=0.3)
    assert weights is None and got.shape == want.shape == (b, rows, heads, 8) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_what_the_grouped_attention_does_not_take_goes_to_sdpa():
    q, k, v = _qkv(1, 4, 2, 3, 7)
    bias = torch.randn(1, 4, 3, 7)
    with pytest.raises(ValueError, match="softcap"):  # sdpa's own refusal, not a silent grouped result
        _grouped_sdpa(_Module(2), q, k, v, torch.ones(1, 1, 3, 7, dtype=torch.bool), softcap=1.0)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    m = torch.ones(1, 1, 3, 7, dtype=torch.bool).tril(4)
    want, _ = sdpa_attention_forward(_Module(2), q, k, v, m, position_bias=bias)
    got, _ = _grouped_sdpa(_Module(2), q, k, v, m, position_bias=bias)
    torch.testing.assert_close(got, want)


def test_group_and_ungroup_change_only_an_sdpa_model():
    model = tiny_llama(VOCAB)
    assert attention_of(model) == "stock"
    assert group_attention(model) and attention_of(model) == "grouped"
    assert model.config._attn_implementation == GROUPED
    assert group_attention(model)  # twice: still grouped
    assert ungroup_attention(model) and attention_of(model) == "stock"
    assert model.config._attn_implementation == "sdpa"
    assert not ungroup_attention(model)
    eager = tiny_llama(VOCAB, "eager")
    assert not group_attention(eager) and eager.config._attn_implementation == "eager"
    assert ATTENTION == ("grouped", "stock")


def test_a_grouped_model_gives_the_stock_logits_for_a_verify_over_its_cache():
    from specfsm.hf.evaluate import new_cache
    from specfsm.hf.generate import SpeculativeGenerator

    stock, grouped = tiny_llama(VOCAB, seed=2), tiny_llama(VOCAB, seed=2)
    group_attention(grouped)
    prompt = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(4))
    draft = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    out = []
    for model in (stock, grouped):
        forward, cache = SpeculativeGenerator(model)._forward, new_cache(model)
        forward(prompt, torch.arange(20)[None], None, cache)
        out.append(forward(draft, torch.arange(20, 26)[None], None, cache))
    torch.testing.assert_close(out[1], out[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("drafter", ["suffix", "suffix-tree", "suffix-recycle"])
def test_greedy_and_specfsm_on_a_grouped_model_equal_greedy_on_the_stock_model(drafter):
    from specfsm.hf.generate import SpeculativeGenerator

    stock, grouped = tiny_llama(VOCAB, seed=1), tiny_llama(VOCAB, seed=1)
    group_attention(grouped)
    prompts = [[5, 6, 7, 8, 9] * 6, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3] * 3, [2, 7, 1, 8, 2, 8]]
    want = [reference(stock, p, 40) for p in prompts]
    assert [reference(grouped, p, 40) for p in prompts] == want
    for k in ("adaptive", 6):
        gen = SpeculativeGenerator(grouped, k=k, drafter=drafter)
        assert [o.tokens for o in gen.generate(prompts, 40)] == want  # a batch: holes, masks
        assert [gen.generate([p], 40)[0].tokens for p in prompts] == want


def test_load_model_refuses_unknown_attention_before_loading():
    from specfsm.hf.loading import load_model

    with pytest.raises(ValueError, match="attention must be one of grouped, stock, not 'flash'"):
        load_model("/nonexistent", attention="flash")


@pytest.mark.parametrize("attention", ATTENTION)
def test_the_command_line_takes_attention(tmp_path, capsys, attention):
    assert generate_json(tmp_path, capsys, "--attention", attention)["model"]["attention"] == attention
