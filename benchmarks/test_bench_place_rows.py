"""Host row placement: the compiled kernel, its twin and numpy fancy indexing in one table
per size; plus the batched settle.

    python3 -m pytest benchmarks/test_bench_place_rows.py --benchmark-columns=median,iqr,rounds

Sizes are small (at most 5 MiB of rows copied per call) so the suite stays quick on a
shared CPU; the GPU comparison is ``benchmarks/gpu_place_rows.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from specfsm import _impl

# (B, K, row bytes)
SIZES = [(8, 5, 64 * 1024), (64, 5, 16 * 1024), (256, 8, 1024), (64, 5, 80 * 1024 + 2)]
IMPLS = ["compiled", "python", "numpy-fancy"]


def _case(B, K, row):
    rng = np.random.default_rng(0)
    n = row // 2 if row % 2 == 0 else row
    dtype = np.float16 if row % 2 == 0 else np.int8
    src = rng.integers(0, 100, size=(B, K, n)).astype(dtype)
    dst = np.zeros((B, n), dtype)
    index = rng.integers(0, K, size=B).astype(np.int64)
    return src, index, dst


@pytest.mark.parametrize("kind", IMPLS)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"B{s[0]}-K{s[1]}-{s[2]}B")
def test_bench_place_rows(benchmark, size, kind):
    B, K, row = size
    benchmark.group = f"place_rows B={B} K={K} row={row} bytes"
    src, index, dst = _case(B, K, row)
    if kind == "numpy-fancy":
        ar = np.arange(B)

        def run():
            dst[:] = src[ar, index]

    else:
        if kind == "compiled" and _impl.NO_EXTENSIONS:
            pytest.skip("SPECFSM_NO_EXTENSIONS is set")
        place_rows = _impl.kernels(kind, "place").place_rows

        def run():
            place_rows(src, index, dst)

    benchmark(run)
    assert np.array_equal(dst, src[np.arange(B), index])


@pytest.mark.parametrize("kind", ["compiled", "python"])
def test_bench_settle_index(benchmark, kind):
    if kind == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    benchmark.group = "settle_index B=256"
    rng = np.random.default_rng(1)
    draft_lens = rng.integers(0, 8, size=256).astype(np.int64)
    accepted = (rng.random(256) * (draft_lens + 1)).astype(np.int64)
    settle_index = _impl.kernels(kind, "place").settle_index
    out = benchmark(settle_index, accepted, draft_lens)
    assert out.shape == (256,)
