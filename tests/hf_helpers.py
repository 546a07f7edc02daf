"""What the tests of ``specfsm.hf`` share: one torch thread while a module runs, a tiny
random Llama, plain greedy ``generate`` as the reference output, and ``specfsm generate`` / ``record`` run
in-process. Import after ``pytest.importorskip("torch")``; the ``one_thread`` fixture
applies to a module that imports it."""

from __future__ import annotations

import argparse

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: the tiny models gain nothing from more, and CI cores are shared."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def tiny_llama(vocab, impl="sdpa", seed=0, positions=256):
    """A random two-layer Llama (hidden 32) of ``vocab`` ids, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation=impl)
    return LlamaForCausalLM(cfg).eval()


def reference(model, prompt, n, eos=None):
    """Plain greedy ``model.generate``'s ``n`` new tokens after ``prompt`` (token ids)."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def generate_json(tmp_path, capsys, *options):
    """``specfsm generate --json`` with ``options`` on a saved tiny Llama and one repetitive
    prompt (greedy and specfsm); its exit status checked, its summary returned."""
    import json

    tiny_llama(59).save_pretrained(tmp_path / "m")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]}\n')
    rc = run_cli(["generate", "--model", str(tmp_path / "m"), "--prompts", str(prompts), "--max-new-tokens", "12",
                  "--methods", "greedy,specfsm", *options, "--json"])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def run_cli(argv):
    """``specfsm`` with ``argv`` (a ``generate`` or ``record`` command line); its exit status."""
    from specfsm.hf import cli

    p = argparse.ArgumentParser(prog="specfsm")
    sub = p.add_subparsers(dest="command")
    cli.add_parsers(sub)
    args = p.parse_args(argv)
    return args.hf_main(args)
