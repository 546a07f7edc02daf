"""A fresh process's first request: specfsm against plain greedy, each run its own process.

Two ways, each run a new process on the packaged SmolLM2-135M-Instruct (its converted
copy already cached), one torch thread, so everything a first request pays once per
process is in it. What the generator measures at construction is reported apart
(``calibration_s``); what the request itself costs is in its tokens per second.

``cli`` (the default): ``python -m specfsm generate --prompts FILE --compare --json``,
greedy first as ``--compare`` orders a single prompt. Wall time only, so on a shared
machine a burst of someone else's load moves a run a lot: read the medians.

``alone``: the model loaded, the generator built (its construction timed), then plain
greedy ``generate`` and specfsm's ``generate`` on the prompt, one after the other, the
order alternated between runs (the first of the two pays the process's first forwards),
each timed in wall time and in this process's CPU time. With one thread the CPU time is
the work done, which other people's load on the machine barely moves.

    python benchmarks/hf_first_request.py --runs 7
    python benchmarks/hf_first_request.py alone --runs 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_PROMPTS = str(HERE / "prompts_open_short.jsonl")


def _env(threads: int) -> dict[str, str]:
    """The children's environment: this checkout's specfsm first, ``threads`` threads."""
    path = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def cli_run(a: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "specfsm", "generate", "--prompts", a.prompts, "--compare", "--json",
           "--max-new-tokens", str(a.max_new_tokens), "--threads", str(a.threads), "--pld-ks", a.pld_ks]
    load = os.getloadavg()[0]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(a.threads), cwd=HERE.parent)
    if res.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    s = json.loads(res.stdout)
    row = s["per_prompt"][0]["methods"]
    g, f = row["greedy"], row["specfsm"]
    return {"greedy": g["tokens_per_s"], "specfsm": f["tokens_per_s"], "ratio": f["vs_greedy"],
            "tokens": f["tokens"], "forwards": f["forwards"],
            "outside_us": (f["seconds"] - f["model_s"]) / f["tokens"] * 1e6,
            "greedy_outside_us": (g["seconds"] - g["model_s"]) / g["tokens"] * 1e6,
            "calibration_s": sum((s.get("calibration_s") or {}).values()) if "calibration_s" in s else None,
            "identical": s["identical"], "load": load}


def child(a: argparse.Namespace) -> None:
    """One run in this process (``alone``): prints one JSON line."""
    import torch

    torch.set_num_threads(a.threads)
    from specfsm.hf.cli import ForwardMeter
    from specfsm.hf.generate import SpeculativeGenerator
    from specfsm.hf.loading import load_model
    from specfsm.hf.prompts import load_prompts, token_ids

    model, tok, _ = load_model()
    prompt = token_ids(load_prompts(a.prompts)[:1], tok, int(model.config.vocab_size), a.prompts)[0]
    t0 = time.perf_counter()
    gen = SpeculativeGenerator(model)
    built = time.perf_counter() - t0
    meter = ForwardMeter(model)
    pad = model.generation_config.pad_token_id
    ids = torch.tensor([prompt])
    out: dict = {"construct_s": built, "calibration_s": getattr(gen, "calibration_s", None), "first": a.first}
    order = ["greedy", "specfsm"] if a.first == "greedy" else ["specfsm", "greedy"]
    for m in order:
        meter.reset()
        w0, c0 = time.perf_counter(), time.process_time()
        if m == "greedy":
            with torch.inference_mode():
                res = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.max_new_tokens,
                                     do_sample=False, pad_token_id=pad)
            toks = res[0, len(prompt):].tolist()
        else:
            toks = gen.generate([prompt], a.max_new_tokens)[0].tokens
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        out[m] = {"wall_s": wall, "cpu_s": cpu, "tokens": len(toks), "model_s": meter.seconds,
                  "forwards": meter.forwards, "output": toks}
    meter.close()
    print(json.dumps(out))


def alone_run(a: argparse.Namespace, first: str) -> dict:
    cmd = [sys.executable, __file__, "child", "--first", first, "--prompts", a.prompts,
           "--max-new-tokens", str(a.max_new_tokens), "--threads", str(a.threads)]
    load = os.getloadavg()[0]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(a.threads), cwd=HERE.parent)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    s = json.loads(res.stdout.strip().splitlines()[-1])
    g, f = s["greedy"], s["specfsm"]
    return {"first": first, "ratio_wall": g["wall_s"] / f["wall_s"] * f["tokens"] / g["tokens"],
            "ratio_cpu": g["cpu_s"] / f["cpu_s"] * f["tokens"] / g["tokens"],
            "greedy_cpu": g["cpu_s"], "specfsm_cpu": f["cpu_s"], "tokens": f["tokens"], "forwards": f["forwards"],
            "outside_us": (f["wall_s"] - f["model_s"]) / f["tokens"] * 1e6,
            "greedy_outside_us": (g["wall_s"] - g["model_s"]) / g["tokens"] * 1e6,
            "calibration_s": s["calibration_s"], "construct_s": s["construct_s"],
            "identical": f["output"] == g["output"], "load": load}


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", nargs="?", default="cli", choices=("cli", "alone", "child"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pld-ks", default="10,16,24")
    ap.add_argument("--first", default="greedy", choices=("greedy", "specfsm"))
    a = ap.parse_args()
    if a.mode == "child":
        child(a)
        return
    rows = []
    if a.mode == "cli":
        print(f"{'run':>3} {'greedy t/s':>10} {'specfsm t/s':>11} {'x greedy':>8} {'tokens':>6} {'fwd':>4} "
              f"{'outside us/tok':>14} {'greedy outside':>14} {'calibration s':>13} {'load':>5}")
        for i in range(a.runs):
            r = cli_run(a)
            rows.append(r)
            cal = "-" if r["calibration_s"] is None else f"{r['calibration_s']:.3f}"
            print(f"{i + 1:>3} {r['greedy']:>10.2f} {r['specfsm']:>11.2f} {r['ratio']:>8.3f} {r['tokens']:>6} "
                  f"{r['forwards']:>4} {r['outside_us']:>14,.0f} {r['greedy_outside_us']:>14,.0f} {cal:>13} "
                  f"{r['load']:>5.2f}{'' if r['identical'] else '  MISMATCH'}", flush=True)
        print(f"median: greedy {_median(rows, 'greedy'):.2f} t/s, specfsm {_median(rows, 'specfsm'):.2f} t/s, "
              f"x greedy {_median(rows, 'ratio'):.3f}, outside {_median(rows, 'outside_us'):,.0f} us/token "
              f"(greedy {_median(rows, 'greedy_outside_us'):,.0f}), load {_median(rows, 'load'):.2f}")
        return
    print(f"{'run':>3} {'first':>8} {'x greedy wall':>13} {'x greedy cpu':>12} {'greedy cpu s':>12} "
          f"{'specfsm cpu s':>13} {'tokens':>6} {'fwd':>4} {'outside us/tok':>14} {'greedy outside':>14} "
          f"{'calibration s':>13} {'load':>5}")
    for i in range(a.runs):
        r = alone_run(a, "greedy" if i % 2 == 0 else "specfsm")
        rows.append(r)
        cal = "-" if r["calibration_s"] is None else f"{r['calibration_s']:.3f}"
        print(f"{i + 1:>3} {r['first']:>8} {r['ratio_wall']:>13.3f} {r['ratio_cpu']:>12.3f} {r['greedy_cpu']:>12.3f} "
              f"{r['specfsm_cpu']:>13.3f} {r['tokens']:>6} {r['forwards']:>4} {r['outside_us']:>14,.0f} "
              f"{r['greedy_outside_us']:>14,.0f} {cal:>13} {r['load']:>5.2f}{'' if r['identical'] else '  MISMATCH'}",
              flush=True)
    for first in ("greedy", "specfsm"):
        some = [r for r in rows if r["first"] == first]
        if some:
            print(f"median, {first} first ({len(some)} runs): x greedy {_median(some, 'ratio_wall'):.3f} wall, "
                  f"{_median(some, 'ratio_cpu'):.3f} CPU; outside {_median(some, 'outside_us'):,.0f} us/token "
                  f"(greedy {_median(some, 'greedy_outside_us'):,.0f})")
    print(f"median, all ({len(rows)} runs): x greedy {_median(rows, 'ratio_wall'):.3f} wall, "
          f"{_median(rows, 'ratio_cpu'):.3f} CPU; load {_median(rows, 'load'):.2f}")


if __name__ == "__main__":
    main()
