"""Tree slots of the batch machine: one serving step's control plane for B
requests each verifying a 32-node tree (``enter_verify_tree``, ``pending``, ``step``),
compiled core beside the twin, with 32-token chains (``enter_verify``) in the same run
as the reference.

Run: pytest benchmarks/test_bench_batch_tree.py --benchmark-columns=median,iqr,rounds
Targets (compiled): under 100 µs per step for B = 256, under 2 µs for B = 1.

The trees are the shape a suffix-index drafter builds (``test_bench_tree.tree``: a main
branch 16 deep with side branches; the target confirms a random stretch of it), int32
as a drafter's output arrives; the slots decode with no index, so each round starts
from Decode again.
"""

from __future__ import annotations

import numpy as np
import pytest

from specfsm import _impl

from test_bench_tree import N, tree


def _batch(kind: str, B: int):
    if kind == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    cls = _impl.kernels(kind, "batch").BatchState
    b = cls(B, N)
    b.admit(np.arange(B), np.ones(B, dtype=np.int64), np.arange(B + 1), caches=np.arange(B))
    b.step(np.ones(B, dtype=np.int64))              # every slot in Decode
    return b


def _trees(B: int):
    rng = np.random.default_rng(1)
    parts = [tree(rng) for _ in range(B)]
    return (np.concatenate([x[0] for x in parts]), np.concatenate([x[1] for x in parts]),
            np.arange(B + 1, dtype=np.int64) * N, np.concatenate([x[2] for x in parts]).astype(np.int64))


@pytest.mark.parametrize("kind", ["compiled", "python"])
@pytest.mark.parametrize("B", [1, 256])
def test_bench_batch_tree_step(benchmark, kind, B):
    b = _batch(kind, B)
    t, p, off, rows = _trees(B)
    slots = np.arange(B, dtype=np.int64)
    benchmark.group = f"batch tree step: B = {B}, 32-node trees (enter_verify_tree + pending + step)"

    def one():
        b.enter_verify_tree(slots, t, p, off)
        b.pending()
        return b.step(rows)

    res = benchmark(one)
    assert res.accepted.sum() > 0 and (b.states == 2).all()


@pytest.mark.parametrize("kind", ["compiled", "python"])
@pytest.mark.parametrize("B", [1, 256])
def test_bench_batch_chain_step(benchmark, kind, B):
    b = _batch(kind, B)
    rng = np.random.default_rng(2)
    d = rng.integers(0, 50, size=B * N).astype(np.int32)
    off = np.arange(B + 1, dtype=np.int64) * N
    rows = d.astype(np.int64).copy()
    rows[rng.integers(0, B * N, size=B)] = 99       # a rejection somewhere in most chains
    slots = np.arange(B, dtype=np.int64)
    benchmark.group = f"batch tree step: B = {B}, 32-node trees (enter_verify_tree + pending + step)"

    def one():
        b.enter_verify(slots, d, off)
        b.pending()
        return b.step(rows)

    res = benchmark(one)
    assert (b.states == 2).all() and res.drafted.sum() == B * N
