"""Suffix-trie benchmarks: one serving step's ``extend`` (B = 8 and B = 256 sequences,
2 tokens each, as after verifying a short draft) and the next drafts (``speculate`` from
each sequence's last 8 tokens, max_k 4, B = 8 and B = 256 calls), in a trie of depth 8
already holding about 100k tokens; compiled core beside the twin.

The batches beside the per-call loops, in the same groups: ``extend_tries`` over the
shared trie repeated B times, and over B tries of their own (one per request, each
holding about 1k tokens as sequence 0, the steps extending their sequence 1: a per-call
loop beside it); ``speculate_tries`` after sequence 0 of B own tries with the shared
trie in ``others`` (beside the loop that calls ``speculate`` on both and keeps the
higher score, the context, the sequence's last 7 tokens, kept by the caller).

Run: pytest benchmarks/test_bench_suffix_trie.py --benchmark-columns=median,iqr,rounds

The tokens are Zipf-like over a vocabulary of 2,000 ids (common tokens repeat, so long
contexts recur and drafts are several tokens long). The trie is fed 256 sequences of
about 400 tokens each, all left open; a step extends B of them. A benchmark's rounds
all extend the same trie, which grows by a few thousand tokens over the run (a few
percent of its 100k), so later rounds time the same work.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from specfsm import _impl

DEPTH, VOCAB, SEQS, LENGTH, CONTEXT, MAX_K = 8, 2_000, 256, 400, 8, 4
OWN = 1_000   # the tokens of each request's own trie


def _ids(rng: np.random.Generator, shape) -> np.ndarray:
    """Token ids of a Zipf-like spread over the vocabulary (common ids repeat)."""
    return (np.minimum(rng.zipf(1.3, size=shape), VOCAB) - 1).astype(np.int64)


@functools.lru_cache(maxsize=2)
def _trie(kind: str):
    """The trie of ``kind`` fed SEQS sequences of LENGTH tokens (about 100k), with each
    sequence's tokens (one shared trie per kind)."""
    rng = np.random.default_rng(0)
    t = _impl.kernels(kind, "suffix_trie").SuffixTrie(DEPTH)
    seqs = _ids(rng, (SEQS, LENGTH))
    for i in range(SEQS):
        t.extend(i, seqs[i])
    return t, seqs.tolist()


@functools.lru_cache(maxsize=2)
def _own(kind: str):
    """SEQS tries of ``kind``, each fed one sequence (key 0) of OWN tokens, with each
    sequence's tokens."""
    rng = np.random.default_rng(1)
    mod = _impl.kernels(kind, "suffix_trie")
    seqs = _ids(rng, (SEQS, OWN))
    tries = [mod.SuffixTrie(DEPTH) for _ in range(SEQS)]
    mod.extend_tries(tries, np.zeros(SEQS, dtype=np.int64), seqs.reshape(-1), np.arange(SEQS + 1) * OWN)
    return tries, seqs.tolist()


def _steps(B: int):
    """64 steps' new tokens, 2 per row, as per-row lists and as flat arrays with offsets."""
    rng = np.random.default_rng(B)
    new = _ids(rng, (64, B, 2))
    return new.tolist(), [row.reshape(-1) for row in new], np.arange(B + 1, dtype=np.int64) * 2


def _cycle(items):
    state = {"i": 0}

    def nxt():
        state["i"] += 1
        return items[state["i"] % len(items)]

    return nxt


@pytest.mark.parametrize("B", [8, 256])
def test_bench_extend_step(benchmark, kernel_kind, B):
    t, _ = _trie(kernel_kind)
    rng = np.random.default_rng(B)
    steps = _ids(rng, (64, B, 2)).tolist()   # each round the next step's tokens
    state = {"i": 0}

    def step():
        new = steps[state["i"] % len(steps)]
        state["i"] += 1
        for b in range(B):
            t.extend(b, new[b])

    benchmark.group = f"SuffixTrie.extend: one step, B = {B} sequences x 2 tokens, depth {DEPTH}, ~100k tokens"
    benchmark(step)
    assert len(t) >= SEQS * LENGTH + 2 * B


@pytest.mark.parametrize("B", [8, 256])
def test_bench_speculate_step(benchmark, kernel_kind, B):
    t, seqs = _trie(kernel_kind)
    contexts = [s[-CONTEXT:] for s in seqs[:B]]

    def step():
        return [t.speculate(c, MAX_K) for c in contexts]

    benchmark.group = f"SuffixTrie.speculate: one step, B = {B} contexts of {CONTEXT}, max_k {MAX_K}, depth {DEPTH}"
    out = benchmark(step)
    assert len(out) == B and sum(len(d) for d, _, _ in out) > 0


@pytest.mark.parametrize("B", [8, 256])
def test_bench_extend_tries_shared(benchmark, kernel_kind, B):
    t, _ = _trie(kernel_kind)
    mod = _impl.kernels(kernel_kind, "suffix_trie")
    _, flat, off = _steps(B)
    nxt, tries, keys = _cycle(flat), [t] * B, np.arange(B, dtype=np.int64)

    benchmark.group = f"SuffixTrie.extend: one step, B = {B} sequences x 2 tokens, depth {DEPTH}, ~100k tokens"
    benchmark(lambda: mod.extend_tries(tries, keys, nxt(), off))


@pytest.mark.parametrize("B", [8, 256])
def test_bench_extend_own_loop(benchmark, kernel_kind, B):
    tries, _ = _own(kernel_kind)
    rows, _, _ = _steps(B)
    nxt = _cycle(rows)

    def step():
        new = nxt()
        for b in range(B):
            tries[b].extend(1, new[b])

    benchmark.group = f"SuffixTrie.extend: one step, B = {B} own tries (~1k tokens each) x 2 tokens, depth {DEPTH}"
    benchmark(step)


@pytest.mark.parametrize("B", [8, 256])
def test_bench_extend_tries_own(benchmark, kernel_kind, B):
    tries, _ = _own(kernel_kind)
    mod = _impl.kernels(kernel_kind, "suffix_trie")
    _, flat, off = _steps(B)
    nxt, rows, keys = _cycle(flat), tries[:B], np.ones(B, dtype=np.int64)

    benchmark.group = f"SuffixTrie.extend: one step, B = {B} own tries (~1k tokens each) x 2 tokens, depth {DEPTH}"
    benchmark(lambda: mod.extend_tries(rows, keys, nxt(), off))


def _speculate_group(B: int) -> str:
    return (f"SuffixTrie.speculate: one step, B = {B} own tries (~1k tokens) + the shared one (~100k) in "
            f"others, max_k {MAX_K}, depth {DEPTH}")


@pytest.mark.parametrize("B", [8, 256])
def test_bench_speculate_own_loop(benchmark, kernel_kind, B):
    shared, _ = _trie(kernel_kind)
    tries, seqs = _own(kernel_kind)
    contexts = [s[-(DEPTH - 1):] for s in seqs[:B]]   # what the caller keeps per request

    def step():
        out = []
        for b in range(B):
            d, score, _ = tries[b].speculate(contexts[b], MAX_K)
            d2, score2, _ = shared.speculate(contexts[b], MAX_K)
            out.append(d2 if score2 > score else d)
        return out

    benchmark.group = _speculate_group(B)
    out = benchmark(step)
    assert len(out) == B


@pytest.mark.parametrize("B", [8, 256])
def test_bench_speculate_tries(benchmark, kernel_kind, B):
    shared, _ = _trie(kernel_kind)
    tries, _ = _own(kernel_kind)
    mod = _impl.kernels(kernel_kind, "suffix_trie")
    rows, keys, others = tries[:B], np.zeros(B, dtype=np.int64), [shared]

    benchmark.group = _speculate_group(B)
    out = benchmark(lambda: mod.speculate_tries(rows, keys, MAX_K, others))
    assert len(out) == B and sum(len(d) for d in out) > 0
