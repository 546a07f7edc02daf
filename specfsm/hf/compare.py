"""``specfsm generate --compare``: each method run on the same prompts, rotated, and the
summary and table of what each achieved against greedy.

``compare`` runs plain greedy ``generate``, transformers' prompt lookup at each K and one
``SpeculativeGenerator`` per drafter on every prompt (then, with a batch, on groups of
prompts), and ``format_compare`` prints its summary. The measuring it is built from is
here too, and ``specfsm.hf.cli`` imports it for ``specfsm generate`` and ``specfsm
record``: ``ForwardMeter`` (a model's forwards and the time inside them), ``_Progress``
(progress on stderr), ``_hf_generate`` (greedy or prompt-lookup ``generate`` on
token-id prompts) and ``converse`` (a multi-turn request's turns, each after the method's
own answers, as Spec-Bench runs them).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from .prompts import SPEC_BENCH_GROUPS, spec_bench_group

# --------------------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------------------
class ForwardMeter:
    """Counts a model's forwards and the time spent inside them (forward hooks), for
    ``generate`` and specfsm alike."""

    def __init__(self, model: Any) -> None:
        self.forwards = 0
        self.seconds = 0.0
        self._t0 = 0.0
        self._handles = [
            model.register_forward_pre_hook(self._pre),
            model.register_forward_hook(self._post),
        ]

    def _pre(self, *_: Any) -> None:
        self._t0 = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self._t0
        self.forwards += 1

    def reset(self) -> None:
        self.forwards, self.seconds = 0, 0.0

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class _Progress:
    """Progress on stderr: a bar redrawn in place on a terminal (or with ``--progress``),
    else one line per finished request or batch and per method (``lines=True``), so a
    run with stderr in a file or a pipe still shows where it is."""

    def __init__(self, total: int, stream: TextIO, enabled: bool, lines: bool = False, command: str = "generate") -> None:
        self.total, self.done, self.stream, self.enabled, self.label = max(total, 1), 0, stream, enabled, ""
        self.lines = lines and not enabled
        self.command = command
        self._phase_done = 0
        self._phase_total = 0
        self._t0 = time.perf_counter()

    def phase(self, label: str, requests: int = 0) -> None:
        self.label = label
        self._phase_done, self._phase_total = 0, requests
        self._t0 = time.perf_counter()
        if self.lines:
            self._line(f"{label}: started")
        self._draw()

    def step(self, n: int = 1) -> None:
        self.done += n
        self._phase_done += n
        if self.lines:
            of = f" of {self._phase_total}" if self._phase_total else ""
            self._line(f"{self.label}: {self._phase_done}{of} done, {time.perf_counter() - self._t0:.1f} s")
        self._draw()

    def _line(self, text: str) -> None:
        self.stream.write(f"specfsm {self.command}: {text}\n")
        self.stream.flush()

    def _draw(self) -> None:
        if self.enabled:
            fill = 30 * min(self.done, self.total) // self.total
            self.stream.write(f"\r[{'#' * fill}{'-' * (30 - fill)}] {self.done}/{self.total} {self.label:<28}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()


def _left_pad(batch: list[list[int]], pad: int) -> tuple[Any, Any]:
    import torch

    t = max(len(p) for p in batch)
    ids = torch.full((len(batch), t), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), t), dtype=torch.long)
    for i, p in enumerate(batch):
        ids[i, t - len(p):] = torch.tensor(p)
        mask[i, t - len(p):] = 1
    return ids, mask


def _cut(tokens: list[int], eos: set[int], pad: int | None) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def _eos_set(model: Any) -> set[int]:
    e = getattr(model.generation_config, "eos_token_id", None)
    if e is None:
        return set()
    return {e} if isinstance(e, int) else set(e)


def _hf_generate(model: Any, prompts: list[list[int]], n: int, batch: int, pld: int | None, bar: _Progress) -> list[list[int]]:
    import torch

    eos = _eos_set(model)
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else (min(eos) if eos else 0)
    outs = []
    step = 1 if pld else batch
    for i in range(0, len(prompts), step):
        group = prompts[i:i + step]
        ids, mask = _left_pad(group, pad)
        kw = {"prompt_lookup_num_tokens": pld} if pld else {}
        with torch.inference_mode():
            res = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=pad, **kw)
        for row in res[:, ids.shape[1]:].tolist():
            outs.append(_cut(row, eos, pad))
        bar.step(len(group))
    return outs


# --------------------------------------------------------------------------------------
# --compare: every method on every prompt, the order rotated per prompt
# --------------------------------------------------------------------------------------
def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _ratios(methods: dict[str, dict[str, Any]], names: Any, base: Any, key: str) -> None:
    """Set ``methods[m][key]`` for every ``m`` in ``names``: its tokens per second over
    ``base`` (None when ``base`` is 0 or None)."""
    for m in names:
        methods[m][key] = methods[m]["tokens_per_s"] / base if base else None


def compare(model: Any, prompts: list[list[int]], names: list[str], n: int, pld_ks: list[int],
            spec: dict[str, dict[str, Any]], *, kinds: list[str | None] | None = None, batch: int = 1,
            bar: _Progress | None = None, log: TextIO | None = None, batch_rounds: int = 1,
            follows: Sequence[Follow | None] | None = None) -> dict[str, Any]:
    """Every method on every prompt, one request at a time, the methods taking turns on
    each prompt in an order rotated from prompt to prompt (so a change in the machine's
    load falls on all alike): plain greedy ``generate``, transformers' prompt lookup at
    each K of ``pld_ks``, and one ``SpeculativeGenerator`` per entry of ``spec`` (name:
    constructor keywords; each generator serves every prompt in turn, as a server
    would). With ``batch`` > 1, then the prompts in consecutive groups of ``batch``:
    batched greedy ``generate`` against each ``spec`` generator's batched decoding, the
    order alternated per group; ``batch_rounds`` > 1 runs each group that many times, the
    order alternated each round, and the round of median time stands for the method
    (``rounds_seconds`` keeps every round's; a batch is one measurement where a prompt
    kind is three, so it is the one a burst of load moves most). Returns per-prompt, per-kind and total tokens per second,
    forwards and identity with plain greedy (batched outputs against single greedy's),
    and the load averages before and after. ``log``: a stream for one line per prompt
    and per batch as they finish. ``follows``: per prompt, None or the builder of its next
    turn's prompt from the answers so far (``specfsm.hf.prompts.NextTurn``): every method
    answers the turns one after another, each after its own answers (``converse``), and a
    request's figures are its turns' together. When every kind is a Spec-Bench category,
    the summary has ``by_category`` and ``by_group`` too."""
    from .generate import SpeculativeGenerator

    if type(batch_rounds) is not int or batch_rounds < 1:
        raise ValueError(f"batch_rounds must be a positive integer, got {batch_rounds!r}")
    kinds = list(kinds) if kinds is not None else [None] * len(prompts)
    follows = list(follows) if follows is not None else [None] * len(prompts)
    bar = bar if bar is not None else _Progress(1, sys.stderr, False)
    methods = ["greedy"] + [f"pld_k{k}" for k in pld_ks] + list(spec)
    gens = {m: SpeculativeGenerator(model, **kw) for m, kw in spec.items()}
    meter = ForwardMeter(model)
    loads = [_loadavg()]
    per: list[dict[str, Any]] = []
    outs: dict[str, list[list[list[int]]]] = {m: [] for m in methods}
    batches: list[dict[str, Any]] = []
    try:
        for i, p in enumerate(prompts):
            row = _compare_prompt(model, p, follows[i], i, names[i], kinds[i], n, methods, gens, meter, bar, outs)
            per.append(row)
            if log is not None:
                log.write(f"compare: prompt {i + 1}/{len(prompts)} {names[i]}: " + ", ".join(
                    f"{m} {row['methods'][m]['tokens_per_s']:.1f}" for m in methods) + f" tokens/s (load {row['load']})\n")
                log.flush()
        if batch > 1:
            bmethods = ["greedy_batched"] + [f"{m}_batched" for m in spec]
            for gi, i in enumerate(range(0, len(prompts), batch)):
                orders = [bmethods if (gi + r) % 2 == 0 else bmethods[::-1] for r in range(batch_rounds)]
                brow: dict[str, Any] = {"prompts": names[i:i + batch], "kinds": kinds[i:i + batch], "order": orders[0],
                                        "methods": {}}
                if batch_rounds > 1:
                    brow["orders"] = orders
                runs = _batch_runs(model, prompts[i:i + batch], follows[i:i + batch], n, orders, gens, meter, bar,
                                   outs["greedy"][i:i + batch])
                for m in bmethods:
                    brow["methods"][m] = _median_round(runs[m], batch_rounds)
                _ratios(brow["methods"], bmethods, brow["methods"]["greedy_batched"]["tokens_per_s"], "vs_greedy_batched")
                brow["load"] = _loadavg()
                batches.append(brow)
                if log is not None:
                    log.write(f"compare: batch {gi + 1}: " + ", ".join(
                        f"{m} {brow['methods'][m]['tokens_per_s']:.1f}" for m in bmethods) + " tokens/s\n")
                    log.flush()
    finally:
        meter.close()
    loads.append(_loadavg())
    return _compare_summary(n, pld_ks, spec, methods, gens, kinds, per, batches, loads)


#: a request's next turn: its prompt from the answers so far, or None after the last
Follow = Callable[[list[list[int]]], list[int] | None]


def converse(decode: Callable[[list[list[int]]], list[list[int]]], firsts: list[list[int]],
             follows: Sequence[Follow | None]) -> tuple[list[list[list[int]]], float]:
    """Every request's answers, turn by turn: ``decode`` (prompts to their outputs, token
    ids) on the first turns (``firsts``) together, then on the next turn of each request
    whose ``follows`` entry builds one from its answers so far, until none does. Returns
    the answers (per request, one list per turn) and the seconds spent in ``decode``
    (building the next prompts is not timed)."""
    answers: list[list[list[int]]] = [[] for _ in firsts]
    todo, prompts, seconds = list(range(len(firsts))), list(firsts), 0.0
    while todo:
        t0 = time.perf_counter()
        outs = decode(prompts)
        seconds += time.perf_counter() - t0
        for i, o in zip(todo, outs):
            answers[i].append(o)
        later = [(i, f(answers[i])) for i in todo if (f := follows[i]) is not None]
        todo = [i for i, q in later if q is not None]
        prompts = [q for _, q in later if q is not None]
    return answers, seconds


def _decoder(model: Any, m: str, gens: dict[str, Any], n: int, batch: int,
             bar: _Progress) -> Callable[[list[list[int]]], list[list[int]]]:
    """Method ``m``'s decoding of a list of prompts (token ids to output token ids):
    greedy ``generate`` (``batch`` at a time), prompt lookup at its K (one at a time, as
    transformers runs it) or a specfsm generator (all together)."""
    if m == "greedy":
        return lambda ps: _hf_generate(model, ps, n, batch, None, bar)
    if m.startswith("pld_k") and m not in gens:
        return lambda ps: _hf_generate(model, ps, n, 1, int(m[5:]), bar)

    def run(ps: list[list[int]]) -> list[list[int]]:
        out = [r.tokens for r in gens[m].generate(ps, n)]
        bar.step(len(ps))
        return out
    return run


def _compare_prompt(model: Any, p: list[int], follow: Follow | None, i: int, name: str, kind: str | None, n: int,
                    methods: list[str], gens: dict[str, Any], meter: ForwardMeter, bar: _Progress,
                    outs: dict[str, list[list[list[int]]]]) -> dict[str, Any]:
    """Prompt ``i`` (``p``, then its later turns by ``follow``) by every method in turn,
    the order rotated by ``i``; each method's answers appended to ``outs``. Returns the
    prompt's row of ``compare``: its name, kind, length, turns and order, per method the
    seconds, tokens, forwards, model seconds, tokens per second, identity with plain
    greedy and the ratio to it (``vs_greedy``), then the load averages."""
    order = methods[i % len(methods):] + methods[: i % len(methods)]
    row: dict[str, Any] = {"name": name, "kind": kind, "prompt_tokens": len(p), "order": order, "methods": {}}
    for m in order:
        meter.reset()
        (answers,), dt = converse(_decoder(model, m, gens, n, 1, bar), [p], [follow])
        outs[m].append(answers)
        row["methods"][m] = {"seconds": dt, "tokens": sum(map(len, answers)), "forwards": meter.forwards,
                             "model_s": meter.seconds}
    row["turns"] = len(outs["greedy"][i])
    for m in methods:
        rm = row["methods"][m]
        rm["tokens_per_s"] = rm["tokens"] / rm["seconds"] if rm["seconds"] else 0.0
        rm["identical"] = outs[m][i] == outs["greedy"][i]
    _ratios(row["methods"], methods, row["methods"]["greedy"]["tokens_per_s"], "vs_greedy")
    row["load"] = _loadavg()
    return row


def _batch_runs(model: Any, group: list[list[int]], follows: list[Follow | None], n: int, orders: list[list[str]],
                gens: dict[str, Any], meter: ForwardMeter, bar: _Progress,
                want: list[list[list[int]]]) -> dict[str, list[dict[str, Any]]]:
    """One batch group (``group``, their later turns by ``follows``) decoded by every
    batched method of each round's order (``orders``: one per round), turn by turn: per
    method, one entry per round with its seconds, tokens, forwards, model seconds and
    identity with ``want`` (single greedy's answers), and for a generator its compactions
    and widest step (of the last turn)."""
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in orders[0]}
    for order in orders:
        for m in order:
            meter.reset()
            base = m[: -len("_batched")]
            res, dt = converse(_decoder(model, base, gens, n, len(group), bar), group, follows)
            extra: dict[str, Any] = {}
            if base in gens:
                extra = {"compactions": gens[base].last_run.compactions,
                         "widths_max": max(gens[base].last_run.widths, default=0)}
            runs[m].append({"seconds": dt, "tokens": sum(len(o) for a in res for o in a), "forwards": meter.forwards,
                            "model_s": meter.seconds, "identical_to_single_greedy": res == want, **extra})
    return runs


def _median_round(runs: list[dict[str, Any]], batch_rounds: int) -> dict[str, Any]:
    """The round of median time stands for a batched method (every round's identity
    must hold), with its tokens per second and, over several rounds, every round's
    seconds (``rounds_seconds``)."""
    rs = sorted(runs, key=lambda x: x["seconds"])
    mid = dict(rs[(len(rs) - 1) // 2])
    mid["identical_to_single_greedy"] = all(x["identical_to_single_greedy"] for x in rs)
    mid["tokens_per_s"] = mid["tokens"] / mid["seconds"] if mid["seconds"] else 0.0
    if batch_rounds > 1:
        mid["rounds_seconds"] = [x["seconds"] for x in runs]
    return mid


def _totals(rows: list[dict[str, Any]], ms: list[str]) -> dict[str, Any]:
    """Per method ``ms`` over ``rows`` (prompt rows or batch rows): seconds, tokens,
    tokens per second, forwards, tokens per forward (prefill included: greedy's is 1),
    identity, and the ratio to greedy's (or batched greedy's) tokens per second."""
    out = {}
    for m in ms:
        sec = sum(r["methods"][m]["seconds"] for r in rows)
        toks = sum(r["methods"][m]["tokens"] for r in rows)
        ident = all(r["methods"][m].get("identical", r["methods"][m].get("identical_to_single_greedy")) for r in rows)
        fwd = sum(r["methods"][m]["forwards"] for r in rows)
        out[m] = {"seconds": sec, "tokens": toks, "tokens_per_s": toks / sec if sec else 0.0,
                  "forwards": fwd, "tokens_per_forward": toks / fwd if fwd else 0.0, "identical": ident}
    _ratios(out, ms, out.get("greedy", out.get("greedy_batched", {})).get("tokens_per_s"), "vs_greedy")
    return out


def _compare_summary(n: int, pld_ks: list[int], spec: dict[str, dict[str, Any]], methods: list[str],
                     gens: dict[str, Any], kinds: list[str | None], per: list[dict[str, Any]],
                     batches: list[dict[str, Any]], loads: list[list[float]]) -> dict[str, Any]:
    """``compare``'s summary of its prompt rows (``per``) and batch rows: totals per
    prompt kind and in all (and per Spec-Bench category and group when every kind is a
    Spec-Bench category), and identity with plain greedy over every run."""
    by_kind = {}
    for kd in dict.fromkeys(kinds):
        by_kind[str(kd)] = _totals([r for r in per if r["kind"] == kd], methods)
    spec_bench = bool(per) and all(spec_bench_group(kd) is not None for kd in kinds)
    summary: dict[str, Any] = {"max_new_tokens": n, "pld_ks": list(pld_ks), "spec": spec, "methods": methods,
                               "calibration_s": {m: g.calibration_s for m, g in gens.items()},
                               "per_prompt": per, "by_kind": by_kind, "total": _totals(per, methods), "load": loads,
                               "identical": all(all(r["methods"][m]["identical"] for m in methods) for r in per)}
    if spec_bench:
        summary["by_category"] = by_kind
        summary["by_group"] = {g: _totals([r for r in per if r["kind"] in cats], methods)
                               for g, cats in SPEC_BENCH_GROUPS.items() if any(k in cats for k in kinds)}
    if batches:
        bm = list(batches[0]["methods"])
        summary["batches"] = batches
        summary["batch_total"] = _totals(batches, bm)
        summary["identical"] = summary["identical"] and all(
            b["methods"][m]["identical_to_single_greedy"] for b in batches for m in bm)
    return summary


def _calibration_lines(s: dict[str, Any]) -> list[str]:
    """Each specfsm generator's one-time calibration (at construction), apart from the figures."""
    cal = s.get("calibration_s") or {}
    return [f"  one-time calibration as each generator was built, before any request and not in the figures above: "
            + ", ".join(f"{m} {t:.2f} s" for m, t in cal.items())] if cal else []


def format_compare(s: dict[str, Any]) -> str:
    """``compare``'s summary as tables: per prompt, per kind and in total (tokens/s, the
    ratio to plain greedy, forwards, identity), then the batches."""
    ms = s["methods"]
    w = max(12, *(len(m) for m in ms))
    lines = [f"compare: {len(s['per_prompt'])} prompts, up to {s['max_new_tokens']} new tokens, methods rotated per prompt; "
             f"load averages {s['load'][0]} -> {s['load'][-1]}", ""]
    head = f"  {'prompt':<24} " + " ".join(f"{m:>{w}}" for m in ms)
    lines += ["tokens/s (x greedy) [forwards] per prompt:", head]
    for r in s["per_prompt"]:
        cells = []
        for m in ms:
            x = r["methods"][m]
            mark = "" if x["identical"] else "!"
            cells.append(f"{x['tokens_per_s']:.1f} ({x['vs_greedy']:.2f}) [{x['forwards']}]{mark}".rjust(w))
        lines.append(f"  {r['name'][:24]:<24} " + " ".join(cells))
    lines += ["", "per kind and in total:", head]
    for label, t in [*s["by_kind"].items(), ("TOTAL", s["total"])]:
        cells = [f"{t[m]['tokens_per_s']:.1f} ({t[m]['vs_greedy']:.2f}) [{t[m]['forwards']}]{'' if t[m]['identical'] else '!'}".rjust(w)
                 for m in ms]
        lines.append(f"  {label[:24]:<24} " + " ".join(cells))
    if "batches" in s:
        bm = list(s["batches"][0]["methods"])
        lines += ["", "batches: tokens/s (x batched greedy) [forwards]:", f"  {'batch':<24} " + " ".join(f"{m:>{w}}" for m in bm)]
        for b in s["batches"]:
            label = ",".join(sorted({str(k) for k in b["kinds"]})) + f" x{len(b['prompts'])}"
            cells = [f"{b['methods'][m]['tokens_per_s']:.1f} ({b['methods'][m]['vs_greedy_batched']:.2f}) [{b['methods'][m]['forwards']}]"
                     f"{'' if b['methods'][m]['identical_to_single_greedy'] else '!'}".rjust(w) for m in bm]
            lines.append(f"  {label[:24]:<24} " + " ".join(cells))
        t = s["batch_total"]
        lines.append(f"  {'TOTAL':<24} " + " ".join(
            f"{t[m]['tokens_per_s']:.1f} ({t[m]['vs_greedy']:.2f}) [{t[m]['forwards']}]{'' if t[m]['identical'] else '!'}".rjust(w) for m in bm))
    if "by_group" in s:
        lines += ["", *_spec_bench_lines(s)]
    cal = _calibration_lines(s)
    lines += ["", *[c.strip() for c in cal], "identity with plain greedy: " + ("every output equal" if s["identical"] else "MISMATCH (marked !)")]
    return "\n".join(lines) + "\n"


def _spec_bench_lines(s: dict[str, Any]) -> list[str]:
    """Spec-Bench's table of ``compare``'s summary: per group and overall, each method's
    speedup over greedy and mean accepted tokens per forward, each specfsm method's
    ratio to prompt lookup at the group's best K, and each method's slowest question."""
    ms = [m for m in s["methods"] if m != "greedy"]
    plds = [m for m in ms if m.startswith("pld_k") and m not in s["spec"]]
    ours = [m for m in ms if m not in plds]
    w = max(14, *(len(m) + 2 for m in ms))
    head = f"  {'group':<16}" + "".join(f"{m:>{w}}" for m in ms) + "".join(f"{m + ' / best pld':>{w + 12}}" for m in ours)
    out = ["Spec-Bench: speedup over greedy (mean accepted tokens per forward); specfsm over prompt lookup at the "
           "group's best K", head]
    for label, t in [*s["by_group"].items(), ("overall", s["total"])]:
        cells = [f"{t[m]['vs_greedy']:.2f}x ({t[m]['tokens_per_forward']:.2f}){'' if t[m]['identical'] else '!'}".rjust(w)
                 for m in ms]
        best = max((t[m]["tokens_per_s"] for m in plds), default=0.0)
        cells += [(f"{t[m]['tokens_per_s'] / best:.2f}x" if best else "-").rjust(w + 12) for m in ours]
        out.append(f"  {label:<16}" + "".join(cells))
    slow = []
    for m in ms:
        r = min(s["per_prompt"], key=lambda r: r["methods"][m]["vs_greedy"] or 0.0)
        slow.append(f"{m} {r['methods'][m]['vs_greedy']:.2f}x ({r['name']})")
    out.append("  slowest question against greedy: " + ", ".join(slow))
    return out
