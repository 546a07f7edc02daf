"""specfsm inside vLLM: one ``propose`` step of ``specfsm.vllm.SpecfsmNgramProposer``
(and of ``SpecfsmSuffixProposer``, the unbounded longest-match drafter) through vLLM's
exact call, against a re-implementation of vLLM's own n-gram proposer (its numba KMP
rescan of every row, every step) on the same arrays.

Run: pytest benchmarks/test_bench_vllm.py -c benchmarks/pytest.ini
Target: B=256 rows of 32k tokens under 100 µs per step, bookkeeping included.

Layout as vLLM's runner passes it: ``token_ids_cpu`` int32 ``[B, max_model_len]``,
``num_tokens_no_spec`` int32 ``[B]``, ``sampled_token_ids`` one list per row. Each timed
step appends one sampled token to every row (written by the untimed setup, as vLLM's
bookkeeping does before it calls the drafter), so the adapter's per-row checks and index
extension are inside the timing. Settings: vLLM's documented n-gram example
(``num_speculative_tokens=5``, ``prompt_lookup_max=4``, so ``prompt_lookup_min=4``); the
suffix proposer runs with its defaults (``min_n=1``, unbounded, latest, drafts cut to
the match length; no request ids, so its cache of earlier requests stays empty), so its
drafts are checked against a rescan (``rescan``: a fresh index per row, the same policy)
instead of vLLM's rule.
Streams: random ids (32k vocabulary) whose tail keeps copying a span from one eighth of
the way in, so every row drafts K tokens. The drafts of both are compared before and
after timing.

The proposers run on the active implementation (the compiled core; with
``SPECFSM_NO_EXTENSIONS`` set their cases are skipped).

The baseline runs single-threaded: vLLM's current ``NgramProposer`` caps its numba
threads at ``min(1, cpu_count // 2)``; it is given a set for its ``i in
valid_ngram_requests`` membership test (vLLM scans a list).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from specfsm import _impl
from specfsm import vllm as sv

K, MIN_N, MAX_N = 5, 4, 4
VOCAB = 32_000
EXTRA = 512  # room for the timed steps
CASES = [(b, h) for h in (4096, 32768) for b in (1, 64, 256, 512)]


@functools.lru_cache(maxsize=1)
def arrays(b: int, h: int) -> np.ndarray:
    """``token_ids_cpu`` for B rows: history h, then the tokens the timed steps append."""
    rng = np.random.default_rng(b * 7 + h)
    width = h + EXTRA
    tok = rng.integers(0, VOCAB, size=(b, width), dtype=np.int32)
    src = h // 8
    tail = h - 24
    tok[:, tail:] = tok[:, src : src + width - tail]  # the tail repeats a span from h/8 on
    return tok


@functools.lru_cache(maxsize=1)
def vllm_numba():
    numba = pytest.importorskip("numba")

    @numba.njit(nogil=True, cache=False)
    def draft_into(tok, row, total, min_n, max_n, max_model_len, k, out):
        # vLLM's rule: KMP over the reversed history against its own first max_n tokens
        if total < min_n:
            return 0
        k = min(k, max_model_len - total)
        if k <= 0:
            return 0
        border = np.zeros(max_n, dtype=np.int32)
        m = 0
        best = 0
        at = 0
        i = 1
        last = total - 1
        while i < total:
            if tok[row, last - m] == tok[row, last - i]:
                m += 1
                if m >= best:
                    best = m
                    at = i
                if i < max_n:
                    border[i] = m
                if m == max_n:
                    m = border[max_n - 1]
                i += 1
            elif m != 0:
                m = border[m - 1]
            else:
                i += 1
        if best < min_n:
            return 0
        start = total - 1 - at + best
        k = min(k, total - start)
        for j in range(k):
            out[j] = tok[row, start + j]
        return k

    @numba.njit(nogil=True, cache=False)
    def batch(valid, lens, tok, min_n, max_n, max_model_len, k, drafts, counts):
        for j in range(valid.shape[0]):
            r = valid[j]
            counts[r] = draft_into(tok, r, lens[r], min_n, max_n, max_model_len, k, drafts[r])

    class VllmStyleNgram:
        """vLLM's ``NgramProposer.propose`` (rows with no sampled tokens or at
        ``max_model_len`` get ``[]``; every other row is rescanned in full)."""

        def __init__(self, k, min_n, max_n, max_model_len, max_num_seqs):
            self.k, self.min_n, self.max_n, self.max_model_len = k, min_n, max_n, max_model_len
            self.drafts = np.zeros((max_num_seqs, k), dtype=np.int32)
            self.counts = np.zeros(max_num_seqs, dtype=np.int32)

        def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
            valid = [i for i, s in enumerate(sampled_token_ids)
                     if len(s) and num_tokens_no_spec[i] < self.max_model_len]
            if valid:
                batch(np.asarray(valid, dtype=np.int64), num_tokens_no_spec, token_ids_cpu, self.min_n,
                      self.max_n, self.max_model_len, self.k, self.drafts, self.counts)
            chosen = set(valid)
            return [self.drafts[i, : self.counts[i]].tolist() if i in chosen and self.counts[i] > 0 else []
                    for i in range(len(sampled_token_ids))]

    return VllmStyleNgram


def _stepper(tok: np.ndarray, h: int):
    """Untimed setup for each step: one more verified token per row."""
    lens = np.full(tok.shape[0], h, dtype=np.int32)
    state = {"n": h}

    def setup():
        n = state["n"] + 1
        assert n <= tok.shape[1]
        state["n"] = n
        lens[:] = n
        sampled = [[int(t)] for t in tok[:, n - 1]]
        return (sampled, lens, tok), {}

    first = ([[int(t)] for t in tok[:, h - 1]], lens, tok)
    return first, setup, lens


def _adapter(b: int, h: int, suffix: bool = False):
    """The proposer as vLLM loads it, over the active implementation's indexes (the
    ``compiled`` cases: skipped when ``SPECFSM_NO_EXTENSIONS`` switches the core off)."""
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    if suffix:
        return sv.SpecfsmSuffixProposer(num_speculative_tokens=K, max_model_len=h + EXTRA)
    return sv.SpecfsmNgramProposer(num_speculative_tokens=K, min_n=MIN_N, max_n=MAX_N, prefer="earliest",
                                   max_model_len=h + EXTRA)


PARAMS = [pytest.param(_b, _h, _who, id=f"B{_b}-L{_h // 1024}k-{_who}")
          for _b, _h in CASES for _who in ("specfsm-compiled", "suffix-compiled", "vllm-numba")]


@pytest.mark.parametrize("b, h, who", PARAMS)
def test_propose_step(benchmark, b, h, who):
    benchmark.group = f"vLLM propose step B={b} L={h // 1024}k"
    tok = arrays(b, h)
    first, setup, lens = _stepper(tok, h)
    baseline_cls = None
    try:
        baseline_cls = vllm_numba()
    except pytest.skip.Exception:
        if who == "vllm-numba":
            raise
    if who == "vllm-numba":
        p = baseline_cls(K, MIN_N, MAX_N, h + EXTRA, b)
        rounds, warm = (5, 1) if b * h >= 4_000_000 else (20, 2)
    else:
        p = _adapter(b, h, who.startswith("suffix"))
        rounds, warm = 200, 10
    suffix = who.startswith("suffix")

    def check(args, out):
        if suffix:  # a fresh index per row (a few rows: building one costs the whole history)
            for r in sorted({0, b // 2, b - 1}):
                assert out[r] == p.rescan(args[2][r, : int(args[1][r])], K), f"row {r} differs from a rescan"
        elif baseline_cls is not None:
            assert out == baseline_cls(K, MIN_N, MAX_N, h + EXTRA, b).propose(*args), "the drafts differ from vLLM's rule"

    out = p.propose(*first)  # the adapter indexes every row here (untimed)
    assert all(len(d) == K for d in out)
    check(first, out)
    benchmark.pedantic(p.propose, setup=setup, rounds=rounds, warmup_rounds=warm, iterations=1)
    args, _ = setup()
    out = p.propose(*args)
    check(args, out)
    if who != "vllm-numba":
        assert p.stats["rebuilt"] == b  # once per row, at the first call
        benchmark.extra_info["rows"] = b
