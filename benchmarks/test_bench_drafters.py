"""Every drafter on the same traces: tokens per target evaluation on the
default replay workload at K = 4, 8, 16; draft time per step, extend time per token and
bytes per token at 1k, 32k and 128k tokens of history. Compiled core only (the twins
draft the same tokens, measured by the tests).

Run: pytest benchmarks/test_bench_drafters.py -c benchmarks/pytest.ini -s
(``-s`` prints the summary table; every figure is also in each benchmark's
``extra_info`` with ``--benchmark-json``). Arctic Inference's ``SuffixDecodingCache``
joins when ``arctic-inference`` is installed (``pip install --no-deps arctic-inference``).

The cross-request group replays a workload whose 48 requests repeat six templates
(``template_traces``) with and without ``SharedSuffixCache``, against Arctic's
per-request and global trees.

Targets: at K = 8 at least 7.5 tokens per evaluation (Arctic: 6.54); at 128k tokens a
proposal under 0.5 µs, extending under 100 ns per token, under 32 bytes per token.
History: the default workload's prompts and outputs back to back (196k tokens), its
first 1k / 32k / 128k tokens.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

from specfsm import _impl

KS = (4, 8, 16)
LENGTHS = (1_000, 32_000, 128_000)
SUMMARY: dict[str, dict[str, object]] = {}

DRAFTERS = {
    # name: (kind, settings)
    "ngram 2..4 latest": ("ngram", (2, 4, "latest")),
    "ngram 2..16 earliest": ("ngram", (2, 16, "earliest")),
    "ngram 1..32 earliest": ("ngram", (1, 32, "earliest")),
    "suffix (default)": ("suffix", {}),
    "suffix, no anchor": ("suffix", {"anchor_n": 0}),
    "suffix latest": ("suffix", {"prefer": "latest"}),
    "suffix adaptive": ("suffix", {"adaptive": True}),
    "arctic depth 24": ("arctic", {}),
}


def _compiled(name: str):
    """The compiled ``name`` module; skips unless the public drafters run on it (the
    active implementation: these benchmarks measure the compiled core)."""
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: these benchmarks measure the compiled core")
    if not _impl.extensions()[name].compiled:
        pytest.fail(f"specfsm._core.{name} does not import: {_impl.extensions()[name].error}")
    return _impl.kernels("compiled", name)


@functools.lru_cache(maxsize=1)
def workload():
    from specfsm.serving.workload import stdlib_workload

    return stdlib_workload()


@functools.lru_cache(maxsize=1)
def history() -> np.ndarray:
    parts = []
    for t in workload().traces:
        parts += [t.prompt, t.output]
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])


def make_drafter(name: str):
    kind, cfg = DRAFTERS[name]
    if kind == "ngram":
        from specfsm.serving.loop import NgramDrafter

        _compiled("ngram_index")
        return NgramDrafter(*cfg)
    if kind == "suffix":
        from specfsm.drafting.suffix_index import SuffixDrafter

        _compiled("suffix_index")
        return SuffixDrafter(**cfg)
    pytest.importorskip("arctic_inference.suffix_decoding", reason="arctic-inference is not installed")
    from specfsm.drafting.suffix_index import ArcticDrafter

    return ArcticDrafter(max_tree_depth=24, max_cached_requests=0)


def tokens_per_evaluation(name: str, k: int) -> float:
    from specfsm.serving.loop import Request, SpeculativeLoop, TeacherForcedTarget

    reqs = [
        Request(t.prompt, len(t.output), eos=t.eos, target=TeacherForcedTarget(t.prompt, t.output))
        for t in workload().traces
    ]
    res = SpeculativeLoop(None, make_drafter(name), k).run_batch(reqs)
    return sum(r.stats.output_tokens for r in res) / sum(r.stats.evaluations for r in res)


def _row(name: str) -> dict[str, object]:
    return SUMMARY.setdefault(name, {})


# -- acceptance: tokens per evaluation ---------------------------------------------------
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_tokens_per_evaluation(benchmark, name):
    """One teacher-forced replay of the default workload at K = 8 is timed; the tokens
    per evaluation at every K are in extra_info."""
    _compiled("suffix_index")
    benchmark.group = "replay K=8 (whole workload)"
    tpe = {}
    for k in KS:
        if k == 8:
            tpe[k] = benchmark.pedantic(tokens_per_evaluation, args=(name, k), rounds=1, iterations=1)
        else:
            tpe[k] = tokens_per_evaluation(name, k)
    for k in KS:
        benchmark.extra_info[f"tokens_per_evaluation_k{k}"] = round(tpe[k], 3)
        _row(name)[f"K={k}"] = tpe[k]


# -- draft time per step, extend time and memory per token --------------------------------
def _index(name: str, length: int):
    """(propose, extend, nbytes) for one drafter over the first ``length`` tokens."""
    kind, cfg = DRAFTERS[name]
    toks = history()[:length]
    if kind == "ngram":
        ix = _compiled("ngram_index").NgramIndex(*cfg)
        return ix, (lambda: ix.propose(8)), ix.extend, lambda: ix.nbytes
    if kind == "suffix":
        s = _compiled("suffix_index").SuffixIndex
        kw = {k: v for k, v in {"anchor_n": 16, **cfg}.items() if k != "adaptive"}
        ix = s(**kw)
        return ix, (lambda: ix.propose(8)), ix.extend, lambda: ix.nbytes
    sd = pytest.importorskip("arctic_inference.suffix_decoding", reason="arctic-inference is not installed")
    cache = sd.SuffixDecodingCache(24, 0)
    state = {"n": 0}

    def extend(tokens):
        state["n"] += 1
        cache.start_request(state["n"], np.ascontiguousarray(tokens, dtype=np.int32))

    def propose():
        ctx = np.ascontiguousarray(toks[-24:], dtype=np.int32)
        return cache.speculate(state["n"], ctx, max_spec_tokens=8).token_ids

    return cache, propose, extend, lambda: None


@pytest.mark.parametrize("length", LENGTHS, ids=lambda n: f"{n // 1000}k")
@pytest.mark.parametrize("name", [n for n in DRAFTERS if n != "suffix adaptive"])
def test_propose(benchmark, name, length):
    _, propose, extend, nbytes = _index(name, length)
    extend(history()[:length])
    benchmark.group = f"propose 8, history {length // 1000}k"
    benchmark(propose)
    _row(name)[f"propose µs {length // 1000}k"] = benchmark.stats.stats.median * 1e6


@pytest.mark.parametrize("length", LENGTHS, ids=lambda n: f"{n // 1000}k")
@pytest.mark.parametrize("name", [n for n in DRAFTERS if n != "suffix adaptive"])
def test_extend(benchmark, name, length):
    """Building the index over ``length`` tokens in one call (per-token figures in
    extra_info)."""
    toks = history()[:length]
    made = []

    def setup():
        made.clear()
        made.append(_index(name, length))
        return (), {}

    def run():
        made[0][2](toks)

    benchmark.group = f"extend {length // 1000}k tokens"
    benchmark.pedantic(run, setup=setup, rounds=3 if length > 1000 else 20, iterations=1)
    per = benchmark.stats.stats.median / length * 1e9
    nb = made[0][3]()
    benchmark.extra_info["ns_per_token"] = round(per, 1)
    benchmark.extra_info["bytes_per_token"] = None if nb is None else round(nb / length, 1)
    _row(name)[f"extend ns/tok {length // 1000}k"] = per
    _row(name)[f"B/tok {length // 1000}k"] = None if nb is None else nb / length


# -- cross-request drafting: requests that repeat templates --------------------------------
@functools.lru_cache(maxsize=1)
def template_traces() -> list[tuple[list[int], list[int]]]:
    """48 requests, each a fresh 40-token prompt and an output that is one of six
    400-token templates (slices of the default workload's outputs) with every 25th
    token replaced by a per-request value: the structure is shared across requests,
    never in a request's own prompt."""
    rng = np.random.default_rng(0)
    src = [t.output for t in workload().traces]
    templates = [src[i][100:500] for i in range(6)]
    out = []
    for r in range(48):
        t = list(templates[r % 6])
        for j in range(10, len(t), 25):
            t[j] = int(rng.integers(50_000, 50_100))
        out.append((rng.integers(60_000, 61_000, size=40).tolist(), t))
    return out


CROSS = ["suffix, own history", "suffix + shared cache", "arctic local", "arctic global"]


def cross_drafter(name: str):
    if name.startswith("suffix"):
        from specfsm.drafting.suffix_index import SharedSuffixCache, SuffixDrafter

        _compiled("suffix_index")
        shared = SharedSuffixCache(1 << 20) if "shared" in name else None
        return SuffixDrafter(shared=shared)
    pytest.importorskip("arctic_inference.suffix_decoding", reason="arctic-inference is not installed")
    from specfsm.drafting.suffix_index import ArcticDrafter

    return ArcticDrafter(max_tree_depth=24, max_cached_requests=-1 if "global" in name else 0)


def cross_tpe(name: str, k: int, batch: int = 8) -> float:
    """Requests run in batches of 8 (replay's default), so later batches can draft
    from earlier batches' outputs."""
    import gc

    from specfsm.serving.loop import Request, SpeculativeLoop, TeacherForcedTarget

    drafter = cross_drafter(name)
    traces = template_traces()
    res = []
    for i in range(0, len(traces), batch):
        reqs = [Request(p, len(o), target=TeacherForcedTarget(p, o)) for p, o in traces[i : i + batch]]
        res += SpeculativeLoop(None, drafter, k).run_batch(reqs)
        gc.collect()  # finished sessions hand their outputs to the shared cache
    return sum(r.stats.output_tokens for r in res) / sum(r.stats.evaluations for r in res)


@pytest.mark.parametrize("name", CROSS)
def test_cross_request_tokens_per_evaluation(benchmark, name):
    _compiled("suffix_index")
    benchmark.group = "template workload, K=8 (48 requests)"
    tpe = {}
    for k in KS:
        if k == 8:
            tpe[k] = benchmark.pedantic(cross_tpe, args=(name, k), rounds=1, iterations=1)
        else:
            tpe[k] = cross_tpe(name, k)
    for k in KS:
        benchmark.extra_info[f"tokens_per_evaluation_k{k}"] = round(tpe[k], 3)
        SUMMARY.setdefault(f"[templates] {name}", {})[f"K={k}"] = tpe[k]


def test_print_summary():
    """The table, with ``-s``: one row per drafter (runs last in the file)."""
    if not SUMMARY:
        pytest.skip("no drafter was measured")
    cols = [f"K={k}" for k in KS]
    for n in LENGTHS:
        cols += [f"propose µs {n // 1000}k", f"extend ns/tok {n // 1000}k", f"B/tok {n // 1000}k"]
    print("\n\ndrafter | " + " | ".join(cols))
    for name, row in SUMMARY.items():
        cells = []
        for c in cols:
            v = row.get(c)
            cells.append("-" if v is None else (f"{v:.3f}" if c.startswith("K=") else f"{v:.3g}"))
        print(f"{name} | " + " | ".join(cells))
    print(time.strftime("(%Y-%m-%d %H:%M UTC)", time.gmtime()))
