"""The recycling drafters of the transformers generator (``drafter="recycle"`` and
``"suffix-recycle"``, ``specfsm.hf.recycle``) on tiny random models: identity with plain
greedy decoding (alone and batched, fixed and adaptive budgets, two attention
implementations), the table fed from every evaluated row, trees verified, the budget
statistics, and the command line."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_helpers import one_thread  # noqa: E402, F401 (a module-wide fixture)
from hf_helpers import reference, run_cli, tiny_llama  # noqa: E402

VOCAB = 53


def _llama(impl="sdpa", seed=0):
    return tiny_llama(VOCAB, impl, seed, positions=512)


def _prompts(seed, lengths):
    rnd = random.Random(seed)
    out = []
    for n in lengths:
        base = [rnd.randrange(VOCAB) for _ in range(rnd.randrange(4, 9))]
        out.append(((base + [rnd.randrange(VOCAB)]) * 30)[:n] if n % 2 else [rnd.randrange(VOCAB) for _ in range(n)])
    return out


@pytest.mark.parametrize("drafter", ["recycle", "suffix-recycle"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("k,prefill", [(16, "each"), ("adaptive", "each"), (16, "padded")])
def test_recycling_drafters_decode_exactly_what_greedy_does(drafter, impl, k, prefill):
    from specfsm.hf import SpeculativeGenerator
    from specfsm.hf.cost import CostModel

    model = _llama(impl)
    prompts = _prompts(3, (31, 20, 45))
    gen = SpeculativeGenerator(model, drafter=drafter, k=k, cost=CostModel({1: 1.0, 64: 1.3}), eos_token_id=None,
                               prefill=prefill)
    for batch in (prompts[:1], prompts):
        outs = gen.generate(batch, 30)
        for p, o in zip(batch, outs):
            assert o.tokens == reference(model, p, 30)
    # the table learnt from the runs' rows, and trees were verified
    assert gen.recycling.filled() > 0 and gen.recycling.updates > 0
    assert gen.last_run.trees > 0


def test_the_table_holds_the_targets_top_k_after_each_evaluated_token():
    """After a run every filled row is the model's top-k after that token in some context;
    for a model whose next token depends on the last token alone (no attention: a bigram
    model), the row is exactly the top-k of that token's logits."""
    from specfsm.hf import SpeculativeGenerator

    model = _llama()
    with torch.no_grad():  # attention writes nothing: the logits depend on the token alone
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    prompt = _prompts(5, (40,))[0]
    gen = SpeculativeGenerator(model, drafter="recycle", k=8, eos_token_id=None)
    out = gen.generate([prompt], 20)[0]
    assert out.tokens == reference(model, prompt, 20)
    table = gen.recycling
    for t in set(prompt + out.tokens[:-1]):  # the prompt's rows too (the prefill's last rows)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([[t]])).logits[0, -1]
        want = logits.topk(table.k).indices.tolist()
        assert table.row(t).tolist() == want
    # the table is the generator's: a second run starts from it
    before = table.updates
    gen.generate([prompt], 5)
    assert gen.recycling is table and table.updates > before


def test_a_bigram_model_is_drafted_whole_by_its_table():
    """Where the next token is a function of the last (a model without attention), the
    table's rank-0 chain is exactly greedy's continuation once every token was seen, so a
    fixed budget accepts whole chains."""
    from specfsm.hf import SpeculativeGenerator

    model = _llama(seed=1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    prompt = _prompts(6, (12,))[0]
    gen = SpeculativeGenerator(model, drafter="recycle", k=8, eos_token_id=None)
    gen.generate([prompt], 40)  # warm: the table sees greedy's cycle
    out = gen.generate([prompt], 40)[0]
    assert out.tokens == reference(model, prompt, 40)
    assert out.tokens_per_forward > 4


def test_budget_stats_say_what_each_cut_would_have_accepted():
    from specfsm.hf.recycle import BudgetStats

    st = BudgetStats(cap=6, decay=1.0)
    assert st.expected().tolist() == [0.0] * 7
    st.record([0, 2, 5], 6)   # the path uses nodes 0, 2 and 5: cuts 1..6 accept 1, 1, 2, 2, 2, 3
    st.record([1], 3)         # cuts 1..3 accept 0, 1, 1
    e = st.expected()
    assert e.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 3.0]


def test_the_command_line_takes_the_recycling_drafters(tmp_path, capsys):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = _llama()
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w0").save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join('{"prompt": %s}' % p for p in _prompts(9, (25, 33))) + "\n")
    rc = run_cli(["generate", "--model", str(tmp_path), "--prompts", str(prompts), "--max-new-tokens", "12",
                  "--threads", "1", "--compare", "--compare-drafters", "recycle,suffix-recycle", "--k", "24",
                  "--pld-ks", "4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["identical"]
    assert {"specfsm_recycle", "specfsm_suffix-recycle"} <= set(out["methods"])
    # a fixed budget past the largest tree is refused before the model loads
    assert run_cli(["generate", "--model", str(tmp_path), "--drafter", "recycle", "--k", "2000"]) == 2
    assert "largest tree" in capsys.readouterr().err
