"""The batched index update: B = 256 indexes over 32k-token code-edit-like
histories each get a step's accepted tokens (1 to 7, about 4 on average), with
(2, 4)-grams. A loop of ``NgramIndex.extend`` calls against one ``extend_batch``; the
figure of merit is ns per appended token (``extra_info["ns_per_token"]``, from the
median).

Run: python -m pytest benchmarks/test_bench_extend.py -c benchmarks/pytest.ini
Target: extend_batch under 90 ns per appended token (a loop of extend calls: about 270).
Both ``prefer`` settings are timed: the step benchmark uses ``earliest``, whose batched
update probes the longest n first and stops at the first n found; ``latest`` moves every
level's entry to the new occurrence, so it probes every level.

Every round appends the next tokens of each request's own stream, so the two
contenders do the same work on indexes of the same size; a check after the rounds
compares each index with a freshly built one.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import repetitive_stream
from specfsm import _impl

B = 256
HISTORY = 32_000
ROUNDS = 150
MIN_N, MAX_N = 2, 4


def _ngi():
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    return _impl.kernels("compiled", "ngram_index")


@pytest.fixture(scope="module")
def steps():
    """Per request a stream of HISTORY + enough tokens; per round the counts appended."""
    rng = np.random.default_rng(5)
    counts = rng.integers(1, 8, size=(ROUNDS + 20, B))
    need = HISTORY + int(counts.sum(axis=0).max()) + 8
    streams = [repetitive_stream(need, seed=1000 + i) for i in range(B)]
    return streams, counts


def _build(ngi, streams, prefer):
    ixs = []
    for s in streams:
        ix = ngi.NgramIndex(MIN_N, MAX_N, prefer)
        ix.extend(s[:HISTORY])
        ixs.append(ix)
    return ixs


def _rounds(streams, counts):
    """Per round: the flat tokens, their offsets, and the per-request lists."""
    pos = np.full(B, HISTORY)
    out = []
    for r in range(counts.shape[0]):
        pieces = [streams[i][pos[i] : pos[i] + counts[r, i]] for i in range(B)]
        pos += counts[r]
        flat = np.concatenate(pieces)
        off = np.zeros(B + 1, dtype=np.int64)
        np.cumsum(counts[r], out=off[1:])
        out.append((flat, off, [p.tolist() for p in pieces]))
    return out


@pytest.mark.parametrize("prefer", ["latest", "earliest"])
@pytest.mark.parametrize("how", ["extend-loop", "extend_batch"])
def test_extend_step(benchmark, steps, how, prefer):
    benchmark.group = f"extend B={B} x {HISTORY} tokens, (2,4)-grams, {prefer}, ~4 tokens each"
    ngi = _ngi()
    streams, counts = steps
    ixs = _build(ngi, streams, prefer)
    plan = iter(_rounds(streams, counts))

    if how == "extend-loop":
        def step():
            flat, off, lists = next(plan)
            for ix, toks in zip(ixs, lists):
                ix.extend(toks)
    else:
        def step():
            flat, off, lists = next(plan)
            ngi.extend_batch(ixs, flat, off)

    benchmark.pedantic(step, rounds=ROUNDS, iterations=1, warmup_rounds=10)
    appended = counts[: ROUNDS + 10].sum(axis=0)
    per_step = counts[: ROUNDS + 10].sum() / (ROUNDS + 10)
    benchmark.extra_info["tokens_per_step"] = round(float(per_step), 1)
    benchmark.extra_info["ns_per_token"] = round(benchmark.stats.stats.median / per_step * 1e9, 1)
    for i in (0, 97, B - 1):  # the indexes equal ones built in one go
        want = ngi.NgramIndex(MIN_N, MAX_N, prefer)
        want.extend(streams[i][: HISTORY + appended[i]])
        assert len(ixs[i]) == len(want)
        assert ixs[i].propose(8) == want.propose(8)
