"""The batched suffix-index update: B = 256 ``SuffixIndex`` over 32k-token
code-edit-like histories each get a step's accepted tokens (1 to 7, about 4 on
average). A loop of ``SuffixIndex.extend`` calls against one
``suffix_index.extend_batch``; the figure of merit is ns per appended token
(``extra_info["ns_per_token"]``, from the median). A third case builds the 256 indexes
from their 32k-token histories in one ``extend_batch`` (the prefill).

The last case times ``extend`` of one token (and ``append``) on one index of a
128k-token history (the target: at most 150 ns per call).

Run: python -m pytest benchmarks/test_bench_suffix_extend.py -c benchmarks/pytest.ini

Every round appends the next tokens of each request's own stream, so the contenders do
the same work on indexes of the same size; a check after the rounds compares some
indexes with freshly built ones. Settings: the drafter's (no cap, earliest, anchor 16).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import repetitive_stream
from specfsm import _impl

B = 256
HISTORY = 32_000
ROUNDS = 150


def _sfx():
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    return _impl.kernels("compiled", "suffix_index")


def _new(sfx):
    return sfx.SuffixIndex(1, None, "earliest", anchor_n=16)


@pytest.fixture(scope="module")
def steps():
    """Per request a stream of HISTORY + enough tokens; per round the counts appended."""
    rng = np.random.default_rng(5)
    counts = rng.integers(1, 8, size=(ROUNDS + 20, B))
    need = HISTORY + int(counts.sum(axis=0).max()) + 8
    streams = [repetitive_stream(need, seed=1000 + i) for i in range(B)]
    return streams, counts


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


@pytest.mark.parametrize("how", ["extend-loop", "extend_batch"])
def test_suffix_extend_step(benchmark, steps, how):
    benchmark.group = f"suffix extend B={B} x {HISTORY} tokens, ~4 tokens each"
    sfx = _sfx()
    streams, counts = steps
    ixs = [_new(sfx) for _ in range(B)]
    flat = np.concatenate([s[:HISTORY] for s in streams])
    sfx.extend_batch(ixs, flat, np.arange(B + 1, dtype=np.int64) * HISTORY)
    plan = iter(_rounds(streams, counts))

    if how == "extend-loop":
        def step():
            flat, off, lists = next(plan)
            for ix, toks in zip(ixs, lists):
                ix.extend(toks)
    else:
        def step():
            flat, off, lists = next(plan)
            sfx.extend_batch(ixs, flat, off)

    benchmark.pedantic(step, rounds=ROUNDS, iterations=1, warmup_rounds=10)
    appended = counts[: ROUNDS + 10].sum(axis=0)
    per_step = counts[: ROUNDS + 10].sum() / (ROUNDS + 10)
    benchmark.extra_info["tokens_per_step"] = round(float(per_step), 1)
    benchmark.extra_info["ns_per_token"] = round(benchmark.stats.stats.median / per_step * 1e9, 1)
    benchmark.extra_info["bytes_per_token"] = round(
        sum(ix.nbytes for ix in ixs) / sum(len(ix) for ix in ixs), 1
    )
    for i in (0, 97, B - 1):  # the indexes equal ones built in one go
        want = _new(sfx)
        want.extend(streams[i][: HISTORY + appended[i]])
        assert len(ixs[i]) == len(want)
        assert ixs[i].propose(8) == want.propose(8)


def test_suffix_extend_batch_prefill(benchmark, steps):
    """The 256 histories indexed from nothing in one call."""
    benchmark.group = f"suffix extend_batch prefill B={B} x {HISTORY} tokens"
    sfx = _sfx()
    streams, _ = steps
    flat = np.concatenate([s[:HISTORY] for s in streams])
    off = np.arange(B + 1, dtype=np.int64) * HISTORY
    made = []

    def setup():
        made.clear()
        made.append([_new(sfx) for _ in range(B)])
        return (), {}

    def run():
        sfx.extend_batch(made[0], flat, off)

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    benchmark.extra_info["ns_per_token"] = round(benchmark.stats.stats.median / flat.size * 1e9, 1)
    benchmark.extra_info["bytes_per_token"] = round(sum(ix.nbytes for ix in made[0]) / flat.size, 1)


def test_suffix_extend_batch_fixed_cost(benchmark, steps):
    """``extend_batch`` of no tokens on the 256 indexes: what a call costs beyond its
    appends (a loop of ``extend`` pays none of it)."""
    benchmark.group = f"suffix extend_batch fixed cost B={B} x {HISTORY} tokens"
    sfx = _sfx()
    streams, _ = steps
    ixs = [_new(sfx) for _ in range(B)]
    sfx.extend_batch(ixs, np.concatenate([s[:HISTORY] for s in streams]),
                     np.arange(B + 1, dtype=np.int64) * HISTORY)
    empty = np.zeros(0, dtype=np.int64)
    off = np.zeros(B + 1, dtype=np.int64)
    benchmark.pedantic(sfx.extend_batch, args=(ixs, empty, off), rounds=200, iterations=1,
                       warmup_rounds=10)
    benchmark.extra_info["ns_per_index"] = round(benchmark.stats.stats.median / B * 1e9, 1)


def test_suffix_extend_batch_first_step(benchmark, steps):
    """The first step after the prefill: one token per index, each index's buffers
    growing from exactly the history's size."""
    benchmark.group = f"suffix extend_batch first step after prefill B={B} x {HISTORY} tokens"
    sfx = _sfx()
    streams, _ = steps
    flat = np.concatenate([s[:HISTORY] for s in streams])
    off = np.arange(B + 1, dtype=np.int64) * HISTORY
    nxt = np.array([s[HISTORY] for s in streams], dtype=np.int64)
    one = np.arange(B + 1, dtype=np.int64)
    made = []

    def setup():
        made.clear()
        made.append([_new(sfx) for _ in range(B)])
        sfx.extend_batch(made[0], flat, off)
        return (), {}

    def run():
        sfx.extend_batch(made[0], nxt, one)

    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)


LONG = 128_000
CALLS = 1000


@pytest.mark.parametrize("how", ["extend", "append"])
def test_suffix_extend_one_token_128k(benchmark, how):
    """One token per call on one index of a 128k-token history: ``extend([t])`` (or
    ``append(t)``), CALLS calls per round, each round on the stream's next tokens;
    ``extra_info["ns_per_call"]`` from the median, the Python call included."""
    benchmark.group = f"suffix extend of one token, {LONG} tokens of history"
    sfx = _sfx()
    rounds = 30
    stream = repetitive_stream(LONG + (rounds + 5) * CALLS, seed=7)
    ix = _new(sfx)
    ix.extend(stream[:LONG])
    singles = iter([[int(t)] for t in stream[LONG:]])
    plain = iter([int(t) for t in stream[LONG:]])

    if how == "extend":
        def run():
            for _ in range(CALLS):
                ix.extend(next(singles))
    else:
        def run():
            for _ in range(CALLS):
                ix.append(next(plain))

    benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=2)
    benchmark.extra_info["ns_per_call"] = round(benchmark.stats.stats.median / CALLS * 1e9, 1)
    benchmark.extra_info["bytes_per_token"] = round(ix.bytes_per_token, 1)
    want = _new(sfx)
    want.extend(stream[: len(ix)])
    assert ix.propose(8) == want.propose(8)
