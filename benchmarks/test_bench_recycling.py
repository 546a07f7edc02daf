"""Recycling-table benchmarks: one serving step's ``update`` (B = 256 requests, 1 row
each as in decoding, and 5 rows each as in verifying a 4-token draft; the target's top 8
ids per row) and its tree drafts (``propose_trees`` for B = 256 roots at a budget of 64
nodes, ``propose_tree`` for one), on a table of SmolLM2's 49,152 ids at k = 8; compiled
core beside the twin.

Run: pytest benchmarks/test_bench_recycling.py --benchmark-columns=median,iqr,rounds
Targets (compiled): under 100 µs for the B = 256 update and for the B = 256 trees.

The table is full, every row 8 distinct ids (a model's table after a while: every tree
fills its budget). The rows' input tokens are Zipf-like (common tokens repeat within a
step, and the last row of each wins); each row's ids are distinct, as a top-k is.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from specfsm import _impl

VOCAB, K, B, BUDGET = 49_152, 8, 256, 64


def _ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` token ids of a Zipf-like spread over the vocabulary (common ids repeat)."""
    return (np.minimum(rng.zipf(1.2, size=n), VOCAB) - 1).astype(np.int64)


def _topk(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` rows of K distinct ids, as the target's top-k rows are."""
    return (rng.integers(0, VOCAB, (n, 1)) + np.arange(K) * 997) % VOCAB


def _table(kind: str, shared: bool = True):
    """The full table (every row K ids); ``shared``: one per kind, for the read-only
    benchmarks."""
    if kind == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    return _shared(kind) if shared else _full(kind)


def _full(kind: str):
    t = _impl.kernels(kind, "recycling").RecyclingTable(VOCAB, K)
    t.update(np.arange(VOCAB), _topk(np.random.default_rng(0), VOCAB))
    return t


_shared = functools.lru_cache(maxsize=2)(_full)


@pytest.mark.parametrize("kind", ["compiled", "python"])
@pytest.mark.parametrize("rows", [1, 5])
def test_bench_update(benchmark, kind, rows):
    t = _table(kind, shared=False)
    rng = np.random.default_rng(1)
    tokens = _ids(rng, B * rows)
    topk = _topk(rng, B * rows)
    benchmark.group = f"RecyclingTable.update: B = {B} requests x {rows} row(s), top-{K}, V = {VOCAB}"
    benchmark(t.update, tokens, topk)
    assert t.updates > 0


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_bench_propose_trees(benchmark, kind):
    t = _table(kind)
    lasts = _ids(np.random.default_rng(2), B)
    benchmark.group = f"RecyclingTable.propose_trees: B = {B} roots, budget {BUDGET}, k = {K}, V = {VOCAB}"
    toks, _, off = benchmark(t.propose_trees, lasts, BUDGET)
    assert off.size == B + 1 and toks.size == B * BUDGET


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_bench_propose_tree(benchmark, kind):
    t = _table(kind)
    lasts = _ids(np.random.default_rng(3), 64).tolist()
    benchmark.group = f"RecyclingTable.propose_tree: one root (B = 1), budget {BUDGET}, k = {K}"
    state = {"i": 0}

    def one():
        i = state["i"] = (state["i"] + 1) % len(lasts)   # a different root each call
        return t.propose_tree(lasts[i], BUDGET)

    toks, _ = benchmark(one)
    assert toks.size == BUDGET
