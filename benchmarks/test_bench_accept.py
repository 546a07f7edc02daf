"""Acceptance-rule benchmarks: compiled kernels vs the pure-Python twin vs a
vectorised numpy implementation of the same contract, in one run.

Run: pytest benchmarks/test_bench_accept.py --benchmark-group-by=group --benchmark-columns=median,iqr,rounds
Targets: batched compiled speculative sampling at least 5x faster than numpy at B = 256,
K = 8, V = 32k; per-request ``Exact.accepted_rows`` under 1 µs.

Probabilities are float32 (one row per draft row, with draft probabilities); the
default ``check=True`` path is measured (every row checked for NaN, negatives and its
sum), and the numpy baseline performs the same checks; a ``check=False`` group at the
largest size shows the kernels alone. Every size runs all three implementations.
"""

from __future__ import annotations

import numpy as np
import pytest

from specfsm import _impl
from specfsm.accept._checks import PROB_ATOL
from specfsm.accept.rules import Exact, SpeculativeSampling

WHO = ["compiled", "twin", "numpy"]
BS = [1, 64, 256]
KS = [4, 8]
VS = [4096, 32768]


def _kind(who: str) -> str:
    """The implementation ``who`` names ("compiled" or "python"; skips the compiled one
    when it is switched off)."""
    if who == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    return "compiled" if who == "compiled" else "python"


def _kern(who: str):
    return _impl.kernels(_kind(who), "accept")


def _public(who: str) -> None:
    """Skip ``who`` unless the public layer runs on it in this process (the active
    implementation; ``SPECFSM_NO_EXTENSIONS=1`` makes it the twin)."""
    if _kind(who) != ("python" if _impl.NO_EXTENSIONS else "compiled"):
        pytest.skip(f"the public rules run on the active implementation, not the {who} one, in this process")


# -- the numpy baseline ------------------------------------------------------------------
def _np_check(p: np.ndarray, name: str) -> None:
    if not np.isfinite(p).all() or (p < 0).any():
        raise ValueError(f"{name} holds a non-finite or negative probability")
    if (np.abs(p.sum(axis=1, dtype=np.float64) - 1.0) > PROB_ATOL).any():
        raise ValueError(f"{name} has a row that does not sum to 1")


def numpy_speculative(d, off, p, q, u, check=True):
    """Vectorised speculative sampling over a ragged batch (same layout and result
    contract as ``speculative_batch``; numpy's float rounding, so ties may differ)."""
    n_rows, v = p.shape
    if check:
        _np_check(p, "target_probs")
        if q is not None:
            _np_check(q, "draft_probs")
    if d.size and (d.min() < 0 or d.max() >= v):
        raise ValueError("draft id outside the vocabulary")
    b = off.shape[0] - 1
    ks = np.diff(off)
    k_max = int(ks.max()) if b else 0
    req = np.repeat(np.arange(b), ks)
    rows = np.arange(n_rows)
    pos = rows - off[req]
    px = p[rows, d].astype(np.float64)
    qx = q[rows, d].astype(np.float64) if q is not None else 1.0
    ok = (px > 0) & (u[rows + req] * qx <= px)  # p(x) = 0 is never accepted
    acc = ks.copy()
    rej = ~ok
    np.minimum.at(acc, req[rej], pos[rej])
    out = np.full((b, k_max + 1), -1, dtype=np.int32)
    keep = pos < acc[req]
    out[req[keep], pos[keep]] = d[keep]
    rb = np.flatnonzero(acc < ks)
    if rb.size:
        r = off[rb] + acc[rb]
        pr = p[r].astype(np.float64)
        if q is not None:
            res = pr - q[r]
        else:
            res = pr.copy()
            res[np.arange(rb.size), d[r]] -= 1.0
        np.maximum(res, 0.0, out=res)
        cdf = np.cumsum(res, axis=1)
        t = u[off[rb + 1] + rb] * cdf[:, -1]
        j = (cdf <= t[:, None]).sum(axis=1)
        out[rb, acc[rb]] = np.minimum(j, v - 1)
    return out, acc.astype(np.int32)


def numpy_exact(d, c, off):
    b = off.shape[0] - 1
    ks = np.diff(off)
    k_max = int(ks.max()) if b else 0
    req = np.repeat(np.arange(b), ks)
    pos = np.arange(d.shape[0]) - off[req]
    acc = ks.copy()
    mis = d != c
    np.minimum.at(acc, req[mis], pos[mis])
    out = np.full((b, k_max + 1), -1, dtype=np.int32)
    keep = pos <= acc[req]
    out[req[keep], pos[keep]] = c[keep]
    return out, acc.astype(np.int32)


# -- data ------------------------------------------------------------------------------------
def make_batch(b: int, k: int, v: int, seed: int = 0):
    """B requests of K rows: target p (peaked, float32), a nearby draft q, drafts from q."""
    rng = np.random.default_rng(seed)
    n = b * k
    logits = rng.standard_normal((n, v), dtype=np.float32) * 2.0
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    q = p * np.exp(rng.standard_normal((n, v), dtype=np.float32) * 0.5)
    q /= q.sum(axis=1, keepdims=True)
    # drafts: the draft's argmax, so many rows are accepted and runs are realistic
    d = q.argmax(axis=1).astype(np.int32)
    off = np.arange(0, n + 1, k, dtype=np.int64)
    u = rng.random(n + b)
    return d, off, p, q, u


@pytest.fixture(scope="module", params=[(b, k, v) for v in VS for k in KS for b in BS],
                ids=lambda t: f"B{t[0]}-K{t[1]}-V{t[2] // 1024}k")
def batch(request):
    return request.param, make_batch(*request.param)


@pytest.mark.parametrize("who", WHO)
def test_speculative_batch(benchmark, batch, who):
    (b, k, v), (d, off, p, q, u) = batch
    benchmark.group = f"speculative batch B={b} K={k} V={v // 1024}k"
    if who == "numpy":
        fn = numpy_speculative
    else:
        fn = _kern(who).speculative_batch
    out, acc = benchmark.pedantic(fn, (d, off, p, q, u), rounds=5 if b * k * v > 2**22 else 20,
                                  warmup_rounds=1)
    ref = _impl.kernels("python", "accept").speculative_batch(d, off, p, q, u)
    np.testing.assert_array_equal(acc, ref[1])


@pytest.mark.parametrize("who", ["compiled", "numpy"])
def test_speculative_batch_unchecked_largest(benchmark, who):
    d, off, p, q, u = make_batch(256, 8, 32768, seed=1)
    benchmark.group = "speculative batch B=256 K=8 V=32k check=False"
    fn = numpy_speculative if who == "numpy" else _kern(who).speculative_batch
    benchmark.pedantic(fn, (d, off, p, q, u, False), rounds=10, warmup_rounds=1)


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("v", VS, ids=lambda v: f"V{v // 1024}k")
def test_speculative_per_request(benchmark, who, k, v):
    """One request through the public ``sample_rows`` (draws + checks + kernel)."""
    d, off, p, q, u = make_batch(1, k, v, seed=2)
    benchmark.group = f"speculative per request K={k} V={v // 1024}k"
    if who == "numpy":
        rng = np.random.default_rng(0)

        def one():
            out, acc = numpy_speculative(d, off, p, q, rng.random(k + 1))
            n = int(acc[0])
            return n, out[0, : n + 1 if n < k else k].tolist()

        benchmark(one)
        return
    _public(who)
    rule = SpeculativeSampling(seed=0)
    benchmark(rule.sample_rows, d, p, q)


# -- typical acceptance ---------------------------------------------------------------------
def numpy_typical(d, off, p, thr=0.09, alpha=0.3, check=True):
    """Vectorised typical acceptance (entropy of every row, then the same cut-off)."""
    if check:
        _np_check(p, "target_probs")
    b = off.shape[0] - 1
    ks = np.diff(off)
    k_max = int(ks.max()) if b else 0
    req = np.repeat(np.arange(b), ks)
    rows = np.arange(p.shape[0])
    pos = rows - off[req]
    p64 = p.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p64 > 0, p64 * np.log(p64), 0.0)
    cut = np.minimum(thr, alpha * np.exp(plogp.sum(axis=1)))
    ok = p64[rows, d] > cut
    acc = ks.copy()
    np.minimum.at(acc, req[~ok], pos[~ok])
    out = np.full((b, k_max + 1), -1, dtype=np.int32)
    keep = pos < acc[req]
    out[req[keep], pos[keep]] = d[keep]
    rb = np.flatnonzero(acc < ks)
    out[rb, acc[rb]] = p[off[rb] + acc[rb]].argmax(axis=1)
    return out, acc.astype(np.int32)


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("size", [(1, 8, 4096), (64, 8, 4096), (256, 8, 32768)],
                         ids=lambda t: f"B{t[0]}-K{t[1]}-V{t[2] // 1024}k")
def test_typical_batch(benchmark, who, size):
    b, k, v = size
    if who == "twin" and b * k * v > 2**22:
        pytest.skip("the twin's per-entry log loop takes seconds at this size")
    d, off, p, q, u = make_batch(b, k, v, seed=4)
    d = p.argmax(axis=1).astype(np.int32)  # the target's own greedy tokens: long runs
    d[::3] = q.argmax(axis=1)[::3]
    benchmark.group = f"typical batch B={b} K={k} V={v // 1024}k"
    fn = numpy_typical if who == "numpy" else _kern(who).typical_batch
    out, acc = benchmark.pedantic(fn, (d, off, p), rounds=3 if who == "twin" else 10,
                                  warmup_rounds=1)
    if who != "twin":
        ref = _kern("compiled").typical_batch(d, off, p) if who == "numpy" else numpy_typical(d, off, p)
        np.testing.assert_array_equal(acc, ref[1])


@pytest.mark.parametrize("who", ["compiled", "numpy"])
def test_typical_batch_peaked(benchmark, who):
    """A peaked target (half the mass on one token, as LLM rows usually are) with drafts
    that mostly pick it: rows above the threshold are accepted without their V logs."""
    b, k, v = 256, 8, 32768
    rng = np.random.default_rng(5)
    top = rng.integers(0, v, b * k)
    p = 0.5 * rng.dirichlet(np.full(v, 0.1), size=b * k)
    p[np.arange(b * k), top] += 0.5
    p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
    d = np.where(rng.random(b * k) < 0.9, top, rng.integers(0, v, b * k)).astype(np.int64)
    off = np.arange(0, b * k + 1, k, dtype=np.int64)
    benchmark.group = f"typical batch B={b} K={k} V={v // 1024}k peaked, check=False"
    fn = (lambda *a: numpy_typical(*a, check=False)) if who == "numpy" else (
        lambda *a: _kern(who).typical_batch(*a, check=False))
    out, acc = benchmark.pedantic(fn, (d, off, p), rounds=5, warmup_rounds=1)
    np.testing.assert_array_equal(acc, numpy_typical(d, off, p, check=False)[1])


# -- exact ------------------------------------------------------------------------------------
@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("b", BS)
def test_exact_batch(benchmark, who, b, k):
    rng = np.random.default_rng(3)
    d = rng.integers(0, 32000, size=b * k).astype(np.int32)
    c = np.where(rng.random(b * k) < 0.8, d, d + 1).astype(np.int32)
    off = np.arange(0, b * k + 1, k, dtype=np.int64)
    benchmark.group = f"exact batch B={b} K={k}"
    fn = numpy_exact if who == "numpy" else _kern(who).exact_batch
    out, acc = benchmark(fn, d, c, off)
    np.testing.assert_array_equal(acc, _impl.kernels("python", "accept").exact_batch(d, c, off)[1])


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("container", ["list", "numpy"])
def test_exact_per_request(benchmark, who, container):
    """``Exact().accepted_rows`` on one K = 8 draft rejected at row 5."""
    benchmark.group = f"exact per request K=8 ({container})"
    draft = [11, 12, 13, 14, 15, 16, 17, 18]
    choices = [11, 12, 13, 14, 15, 99, 17, 18]
    if container == "numpy":
        draft, choices = np.array(draft), np.array(choices)
    if who == "numpy":
        a, c = np.asarray(draft), np.asarray(choices)

        def one(a, c):
            ne = a != c
            return int(ne.argmax()) if ne.any() else len(a)

        assert benchmark(one, a, c) == 5
        return
    _public(who)
    rule = Exact()
    assert benchmark(rule.accepted_rows, draft, choices) == 5
