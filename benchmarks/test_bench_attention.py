"""The grouped attention (``specfsm.hf.attention``) against transformers' ``sdpa``, by rows
and context, on one torch thread (needs torch and transformers).

The attention is SmolLM2-135M's (30 layers of 9 query heads sharing 3 cached key/value
heads of 64, random tensors, so no download): a forward's 30 attention calls over a cache
of 300 or 900 tokens, with the causal mask a forward over the cache carries, at 1 row (a
decode, which ``sdpa`` already reads without a copy), 4 and 8 (verifies, where ``sdpa``
copies the cache per query head). docs/numbers.md, "Grouped attention", has the whole
model's figures."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

from specfsm.hf.attention import _grouped_sdpa  # noqa: E402

HEADS, KV_HEADS, DIM, LAYERS = 9, 3, 64, 30


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _Layer:
    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


@pytest.mark.parametrize("context", [300, 900])
@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("attention", ["stock", "grouped"])
def test_attention_by_rows(benchmark, attention, rows, context):
    benchmark.group = f"SmolLM2's attention, {rows} row{'s' if rows > 1 else ''} over {context} tokens"
    fn = _grouped_sdpa if attention == "grouped" else sdpa_attention_forward
    g = torch.Generator().manual_seed(0)
    width = context + rows
    q = torch.randn(1, rows, HEADS, DIM, generator=g).transpose(1, 2)
    k = torch.randn(1, KV_HEADS, width, DIM, generator=g)
    v = torch.randn(1, KV_HEADS, width, DIM, generator=g)
    mask = None if rows == 1 else torch.ones(rows, width, dtype=torch.bool).tril(context)[None, None]
    layer = _Layer()

    def run():
        with torch.inference_mode():
            for _ in range(LAYERS):
                fn(layer, q, k, v, mask, scaling=DIM ** -0.5)

    benchmark.pedantic(run, rounds=15, iterations=1, warmup_rounds=2)
