"""Record SmolLM2-135M-Instruct's greedy outputs for benchmarks/prompts_kinds.jsonl (256
new tokens each) as replay traces named "kind: name", for ``benchmarks/tree_replay.py
--by-kind`` (the committed ``benchmarks/smollm2_kinds_traces.jsonl``).

It decodes with specfsm, whose output equals plain greedy's (the tests check that), on
one torch thread. Run: python benchmarks/record_kinds.py [OUT.jsonl]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import specfsm  # noqa: F401  (the installed package)
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> None:
    import torch

    from specfsm.hf.generate import SpeculativeGenerator
    from specfsm.hf.loading import load_model
    from specfsm.hf.prompts import load_prompts, token_ids

    argv = sys.argv[1:] if argv is None else argv
    out_path = argv[0] if argv else str(ROOT / "benchmarks" / "smollm2_kinds_traces.jsonl")
    torch.set_num_threads(1)
    model, tok, _ = load_model()
    specs = load_prompts(str(ROOT / "benchmarks" / "prompts_kinds.jsonl"))
    ids = token_ids(specs, tok, int(model.config.vocab_size), "prompts_kinds")
    gen = SpeculativeGenerator(model)
    with open(out_path, "w") as f:
        for spec, prompt in zip(specs, ids):
            output = [int(t) for t in gen.generate([prompt], max_new_tokens=256)[0].tokens]
            rec = {"name": f"{spec.kind}: {spec.name}", "prompt": prompt, "output": output}
            if output and output[-1] == tok.eos_token_id:
                rec["eos"] = tok.eos_token_id
            f.write(json.dumps(rec) + "\n")
            print(f"{rec['name']}: {len(prompt)} prompt tokens, {len(output)} output tokens", flush=True)


if __name__ == "__main__":
    main()
