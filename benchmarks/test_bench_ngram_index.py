"""N-gram drafting at any context length: the incremental ``NgramIndex``, the
stateless ``longest_match`` and their twins against plain rescans (numpy, and numba
when installed), on the same streams in the same process.

Run: pytest benchmarks/test_bench_ngram_index.py --benchmark-group-by=group --benchmark-columns=median,iqr,rounds
Targets: ``NgramIndex.propose`` under 1 µs per call at every length (at least 100x the
rescan at 128k); ``propose_batch`` over 512 requests of 128k tokens under 200 µs per
step; ``longest_match`` at least as fast per token as the numba rescan. Memory per
indexed token and extend cost per token are in each benchmark's ``extra_info``
(``--benchmark-json``) and in the ``extend`` group.

Streams: random ids from a 32k vocabulary whose last 24 tokens repeat a span from one
eighth of the way in, so every drafter finds a 4-gram match and a newest-first rescan
walks seven eighths of the history to reach it (the re-reading-the-prompt case).
Settings: min_n=2, max_n=4, max_k=8, prefer="latest" (the batch: min_n=max_n=3).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from specfsm import _impl

LENGTHS = [1_000, 8_000, 32_000, 128_000, 1_000_000]
MIN_N, MAX_N, MAX_K = 2, 4, 8
VOCAB = 32_000
BATCH, BATCH_LEN = 512, 128_000


def _kern(kind: str):
    if kind == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    return _impl.kernels(kind, "ngram_index")


def far_match_stream(length: int, seed: int = 0, dtype=np.int64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    s = rng.integers(0, VOCAB, size=length, dtype=dtype)
    src = length // 8
    s[length - 24 :] = s[src : src + 24]
    return s


@functools.lru_cache(maxsize=None)
def stream(length: int) -> np.ndarray:
    return far_match_stream(length)


@functools.lru_cache(maxsize=2)
def built_index(kind: str, length: int):
    ix = _impl.kernels(kind, "ngram_index").NgramIndex(MIN_N, MAX_N)
    ix.extend(stream(length))
    return ix


# -- rescan baselines ----------------------------------------------------------------------
def numpy_longest_match(h: np.ndarray, lo: int, hi: int, k: int) -> np.ndarray:
    """Vectorised rescan: for n from hi down to lo, every end e <= L - 2 whose n tokens
    equal the last n, newest kept."""
    L = h.shape[0]
    for n in range(min(hi, L - 1), lo - 1, -1):
        mask = h[n - 1 : L - 1] == h[L - 1]
        for j in range(1, n):
            mask &= h[n - 1 - j : L - 1 - j] == h[L - 1 - j]
        hits = np.flatnonzero(mask)
        if hits.size:
            end = int(hits[-1]) + n  # window i ends (inclusive) at i + n - 1
            return h[end : end + k].copy()
    return h[:0].copy()


@functools.lru_cache(maxsize=1)
def numba_longest_match():
    numba = pytest.importorskip("numba")

    @numba.njit(cache=False, nogil=True)
    def _end(h, lo, hi):
        L = h.shape[0]
        top = min(hi, L - 1)
        for n in range(top, lo - 1, -1):
            for s in range(L - n - 1, -1, -1):
                ok = True
                for j in range(n):
                    if h[s + j] != h[L - n + j]:
                        ok = False
                        break
                if ok:
                    return s + n
        return -1

    def run(h, lo, hi, k):
        end = _end(h, lo, hi)
        return h[:0].copy() if end < 0 else h[end : end + k].copy()

    return run


def _rounds(length: int) -> int:
    return 3 if length >= 128_000 else 20


# -- per request, per step -------------------------------------------------------------------
WHO = [
    "index-compiled",
    "index-twin",
    "longest_match-compiled",
    "longest_match-twin",
    "rescan-numpy",
    "rescan-numba",
]


@pytest.mark.parametrize("length", LENGTHS, ids=lambda n: f"L{n}")
@pytest.mark.parametrize("who", WHO)
def test_propose_per_request(benchmark, who, length):
    benchmark.group = f"propose L={length}"
    h = stream(length)
    want = numpy_longest_match(h, MIN_N, MAX_N, MAX_K).tolist()
    assert len(want) == MAX_K
    if who.startswith("index-"):
        kind = "compiled" if who.endswith("compiled") else "python"
        _kern(kind)
        ix = built_index(kind, length)
        benchmark.extra_info["bytes_per_token"] = round(ix.bytes_per_token, 2)
        out = benchmark(ix.propose, MAX_K)
    elif who.startswith("longest_match-"):
        kind = "compiled" if who.endswith("compiled") else "python"
        lm = _kern(kind).longest_match
        if kind == "python" and length >= 128_000:
            out = benchmark.pedantic(lm, (h, MIN_N, MAX_N, MAX_K), rounds=1, iterations=1)
        else:
            out = benchmark(lm, h, MIN_N, MAX_N, MAX_K)
        out = out.tolist()
    elif who == "rescan-numpy":
        if length >= 128_000:
            out = benchmark.pedantic(numpy_longest_match, (h, MIN_N, MAX_N, MAX_K), rounds=_rounds(length))
        else:
            out = benchmark(numpy_longest_match, h, MIN_N, MAX_N, MAX_K)
        out = out.tolist()
    else:
        run = numba_longest_match()
        run(h, MIN_N, MAX_N, MAX_K)  # compile outside the timing
        out = benchmark(run, h, MIN_N, MAX_N, MAX_K).tolist()
    assert out == want


# -- indexing cost and memory per token -------------------------------------------------------
@pytest.mark.parametrize("length", [128_000, 1_000_000], ids=lambda n: f"L{n}")
def test_extend_whole_stream(benchmark, length):
    """Building the compiled index (the extend cost); bytes per token in extra_info."""
    benchmark.group = "extend (whole stream, compiled)"
    ngi = _kern("compiled")
    h = stream(length)
    last = {}

    def build():
        ix = ngi.NgramIndex(MIN_N, MAX_N)
        ix.extend(h)
        last["ix"] = ix

    benchmark.pedantic(build, rounds=3, iterations=1)
    ix = last["ix"]
    benchmark.extra_info["bytes_per_token"] = round(ix.bytes_per_token, 2)
    benchmark.extra_info["ns_per_token"] = round(benchmark.stats.stats.median / length * 1e9, 1)
    assert len(ix) == length


def test_extend_one_token_per_step(benchmark):
    """The serving loop's case: one accepted token appended to a 128k-token index."""
    benchmark.group = "extend (one token per step, compiled)"
    ngi = _kern("compiled")
    ix = ngi.NgramIndex(MIN_N, MAX_N)
    ix.extend(stream(128_000))
    rng = np.random.default_rng(1)
    toks = rng.integers(0, VOCAB, size=2_000_000).tolist()
    it = iter(toks)
    benchmark.pedantic(lambda: ix.append(next(it)), rounds=20_000, iterations=1, warmup_rounds=100)


# -- a batch of 512 requests of 128k tokens per step ---------------------------------------
@pytest.fixture(scope="module")
def batch_streams():
    rng = np.random.default_rng(42)
    flat = rng.integers(0, VOCAB, size=BATCH * BATCH_LEN, dtype=np.int32)
    offsets = np.arange(0, (BATCH + 1) * BATCH_LEN, BATCH_LEN, dtype=np.int64)
    for i in range(BATCH):  # each request's tail repeats a span from an eighth of the way in
        a = offsets[i]
        src = a + BATCH_LEN // 8
        flat[a + BATCH_LEN - 24 : a + BATCH_LEN] = flat[src : src + 24]
    return flat, offsets


@pytest.fixture(scope="module")
def batch_indexes(batch_streams):
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    ngi = _impl.kernels("compiled", "ngram_index")
    flat, offsets = batch_streams
    ixs = []
    for i in range(BATCH):
        ix = ngi.NgramIndex(3)
        ix.extend(flat[offsets[i] : offsets[i + 1]])
        ixs.append(ix)
    yield ixs
    ixs.clear()


def test_batch_propose_indexes(benchmark, batch_indexes):
    benchmark.group = f"batch {BATCH} x {BATCH_LEN}"
    ngi = _kern("compiled")
    drafts, off, lengths = benchmark(ngi.propose_batch, batch_indexes, MAX_K)
    assert (lengths == MAX_K).all()
    benchmark.extra_info["bytes_per_token"] = round(
        sum(ix.nbytes for ix in batch_indexes) / (BATCH * BATCH_LEN), 2
    )


def test_batch_longest_match_flat(benchmark, batch_streams):
    benchmark.group = f"batch {BATCH} x {BATCH_LEN}"
    ngi = _kern("compiled")
    flat, offsets = batch_streams
    drafts, off, lengths = benchmark.pedantic(
        ngi.longest_match_batch, (flat, offsets, 3, 3, MAX_K), rounds=3, iterations=1
    )
    assert (lengths == MAX_K).all()


def test_batch_rescan_numpy(benchmark, batch_streams):
    benchmark.group = f"batch {BATCH} x {BATCH_LEN}"
    flat, offsets = batch_streams

    def run():
        return [numpy_longest_match(flat[offsets[i] : offsets[i + 1]], 3, 3, MAX_K) for i in range(BATCH)]

    out = benchmark.pedantic(run, rounds=1, iterations=1)
    assert all(len(d) == MAX_K for d in out)


def test_batch_rescan_numba(benchmark, batch_streams):
    benchmark.group = f"batch {BATCH} x {BATCH_LEN}"
    run1 = numba_longest_match()
    flat, offsets = batch_streams
    run1(flat[: BATCH_LEN], 3, 3, MAX_K)

    def run():
        return [run1(flat[offsets[i] : offsets[i + 1]], 3, 3, MAX_K) for i in range(BATCH)]

    out = benchmark.pedantic(run, rounds=3, iterations=1)
    assert all(len(d) == MAX_K for d in out)
