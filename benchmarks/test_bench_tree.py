"""Tree benchmarks: building a 32-node tree from a suffix index, one request
(``propose_tree``) and B = 256 (``propose_tree_batch``); accepting one, one request
(``accept_tree``) and B = 256 (``accept_tree_batch``); and placing the accepted paths'
cache rows for the batch (``place_path_batch``); compiled core beside the twin.

Run: pytest benchmarks/test_bench_tree.py --benchmark-columns=median,iqr,rounds
Targets (compiled): under 2 µs for one 32-node tree, under 100 µs for B = 256 of them.

The tree is the shape a suffix-index drafter builds: a main branch 16 deep with shorter
side branches off it; the target confirms a random-length stretch of the main branch or
turns into a side branch, so paths of every length are accepted. Arrays are int32, as a
drafter's output arrives.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from specfsm import _impl
from specfsm.serving.workload import stdlib_workload

N = 32


def tree(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One 32-node tree (tokens, parents) and the target's N + 1 row tokens."""
    parents = list(range(-1, 15))  # the main branch: nodes 0..15
    while len(parents) < N:
        parents.append(int(rng.integers(-1, len(parents))))
    tokens = []
    for i, q in enumerate(parents):  # sibling tokens differ: a token per (parent, rank)
        rank = sum(1 for j in range(i) if parents[j] == q)
        tokens.append(1000 + 10 * rank + (i % 7))
    t = np.array(tokens, dtype=np.int32)
    p = np.array(parents, dtype=np.int32)
    rows = rng.integers(0, 50, size=N + 1).astype(np.int32)
    depth = int(rng.integers(0, 17))
    cur = -1
    for _ in range(depth):  # confirm a stretch, sometimes turning into a side branch
        kids = [c for c in range(N) if parents[c] == cur]
        if not kids:
            break
        nxt = kids[0] if rng.random() < 0.8 else kids[int(rng.integers(0, len(kids)))]
        rows[cur + 1] = tokens[nxt]
        cur = nxt
    return t, p, rows


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_bench_accept_tree(benchmark, kind):
    if kind == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    k = _impl.kernels(kind, "tree")
    benchmark.group = "accept_tree: one 32-node tree (B = 1)"
    t, p, rows = tree(np.random.default_rng(0))
    path = benchmark(k.accept_tree, t, p, rows)
    assert path.size > 0


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_bench_accept_tree_batch(benchmark, kind):
    if kind == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    k = _impl.kernels(kind, "tree")
    B = 256
    benchmark.group = f"accept_tree_batch: B = {B} trees of 32 nodes"
    rng = np.random.default_rng(1)
    parts = [tree(rng) for _ in range(B)]
    t = np.concatenate([x[0] for x in parts])
    p = np.concatenate([x[1] for x in parts])
    rows = np.concatenate([x[2] for x in parts])
    off = np.arange(B + 1, dtype=np.int64) * N
    counts, _, _, _ = benchmark(k.accept_tree_batch, t, p, off, rows)
    assert counts.sum() > 0


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_bench_place_path_batch(benchmark, kind):
    if kind == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    k = _impl.kernels(kind, "tree")
    B, L, row = 256, 64, 256  # 256 requests, 64 cache rows of 1 KiB (float32)
    benchmark.group = f"place_path_batch: B = {B}, {L} rows of {row * 4} bytes"
    rng = np.random.default_rng(2)
    parts = [tree(rng) for _ in range(B)]
    t = np.concatenate([x[0] for x in parts])
    p = np.concatenate([x[1] for x in parts])
    rows = np.concatenate([x[2] for x in parts])
    off = np.arange(B + 1, dtype=np.int64) * N
    _, _, path, poff = k.accept_tree_batch(t, p, off, rows)
    cache = np.zeros((B, L, row), dtype=np.float32)
    base = np.full(B, 8, dtype=np.int64)
    benchmark(k.place_path_batch, cache, base, path, poff)


@functools.lru_cache(maxsize=2)
def _indexes(kind: str) -> tuple:
    """256 suffix indexes (replay's default drafter settings) of the default workload's
    requests, index i (i + 1) / 257 of the way through its output: the histories a
    serving batch holds (``benchmarks/tree_replay.py``'s cost measurement)."""
    traces = stdlib_workload(None).traces
    mod = _impl.kernels(kind, "suffix_index")
    out = []
    for i in range(256):
        tr = traces[i % len(traces)]
        ix = mod.SuffixIndex(1, None, "earliest", anchor_n=16)
        ix.extend(tr.prompt + tr.output[: (len(tr.output) * (i + 1)) // 257])
        out.append(ix)
    return mod, tuple(out)


# max_depth 8 below the budget of 32: the chain cannot fill the tree, so every call
# scans the history for occurrences and expands best-first (a chain that fills the
# budget is returned without either)
@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_bench_propose_tree(benchmark, kind):
    if kind == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    _mod, ixs = _indexes(kind)
    benchmark.group = "propose_tree: one 32-node tree, max_depth 8 (B = 1)"
    state = {"i": 0}

    def one():
        i = state["i"] = (state["i"] + 1) % len(ixs)  # a different request each call
        return ixs[i].propose_tree(N, 8)

    toks, _ = benchmark(one)
    assert 0 < toks.size <= N


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_bench_propose_tree_batch(benchmark, kind):
    if kind == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    mod, ixs = _indexes(kind)
    benchmark.group = f"propose_tree_batch: B = {len(ixs)} trees of 32 nodes, max_depth 8"
    toks, _, off = benchmark(mod.propose_tree_batch, list(ixs), N, 8)
    assert off.size == len(ixs) + 1 and toks.size > len(ixs)
