"""specfsm.hf against transformers' prompt lookup outside the model (needs the hf extra).

Both decoders run 64 tokens on a teacher-forced stub of a small Llama config (see
``hf_generate.py``: the model costs next to nothing, so the figures are the decoders'
own work: drafting, acceptance, cache cropping, bookkeeping), at 4k, 32k and 128k
tokens of history, grouped per history length. The stand-alone script's ``outside``
part reports the same per step with one-time costs cancelled; its ``smollm2`` part
runs the real model."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, os.path.dirname(__file__))
import hf_generate as H  # noqa: E402

from specfsm.hf.cost import CostModel  # noqa: E402
from specfsm.hf.generate import SpeculativeGenerator  # noqa: E402

NEW = 64
VOCAB = 256


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=[4096, 32768, 131072], ids=lambda n: f"{n // 1024}k")
def stub(request):
    n = request.param
    seq = H.repetitive(n + NEW + 1, VOCAB)
    model = H.stub_model(seq, VOCAB)
    model.generation_config.eos_token_id = None
    return n, seq, model


def test_transformers_prompt_lookup(benchmark, stub):
    n, seq, model = stub
    benchmark.group = f"decode {NEW} tokens outside the model, {n // 1024}k history"
    ids = torch.tensor([seq[:n].tolist()])
    mask = torch.ones_like(ids)

    def run():
        return model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                              prompt_lookup_num_tokens=10, pad_token_id=0)

    out = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    assert out[0, n:].tolist() == seq[n:n + NEW].tolist()


@pytest.mark.parametrize("k", [10, "adaptive"])
def test_specfsm(benchmark, stub, k):
    n, seq, model = stub
    benchmark.group = f"decode {NEW} tokens outside the model, {n // 1024}k history"
    prompt = seq[:n]
    gen = SpeculativeGenerator(model, k=k, eos_token_id=None, cost=CostModel({1: 1.0, 2: 2.0, 11: 2.8}))

    def run():
        return gen.generate([prompt], NEW)[0].tokens

    out = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    assert out == seq[n:n + NEW].tolist()
