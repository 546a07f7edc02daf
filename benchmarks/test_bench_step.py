"""One serving step for B requests: ``BatchState.step`` against the
per-request API (``ServingState`` + ``NgramIndex`` per request) and a vLLM-style baseline
(a numba longest-match rescan per request + numpy cumprod acceptance), same streams,
same run. Target rows are computed outside the timed call (teacher forcing on the
stream); every timed round is one step of the whole batch.

Run: pytest benchmarks/test_bench_step.py -c benchmarks/pytest.ini
Targets: B=256, K=8, 32k under 100 µs per step; B=512 under 200 µs; B=1 under 3 µs
(suffix-slot cases, ``test_step_drafter``: B=256 under 150 µs, B=1 under 3 µs).
Settings: 2..4-grams, earliest match, greedy exact acceptance, K-row verify.
Streams: ``repetitive_stream`` (copied spans and fresh Zipf tokens, 32k vocabulary),
the first L tokens indexed as history, the rest the target's greedy continuation.

Every case's three runs record what they emitted at every step; the second and third
assert they made exactly the first's decisions. The ``stage`` group splits the
compiled step at B=256, K=8, 32k: the index update alone (``extend`` per appended
token, or ``extend_batch`` where the index module has it; ``extend_fresh`` appends new
tokens every round, as the step does, while ``extend`` re-appends the same ones, so its
table lines stay cached), ``propose_batch`` alone, and acceptance, settle and the
transitions without indexes. The compiled step itself does its n-gram update through
the index module's C entry (extend and propose fused in one pass, no argument
conversion), so its update costs about ``extend_fresh`` at the step's token count,
without ``propose_batch`` and without the Python calls' fixed cost (about 10 µs at B=256).
"""

from __future__ import annotations

import functools
import gc

import numpy as np
import pytest

from specfsm import _impl
from specfsm.machine.state import Accept, ServingState, Verify

from conftest import repetitive_stream

MIN_N, MAX_N, PREFER = 2, 4, "earliest"
CONT = 2400
N_STREAMS = 16
BS = (1, 64, 256, 512)
KS = (4, 8)
LS = (4096, 32768)
CASES = [(b, k, l) for l in LS for k in KS for b in BS]
WHICH = ("batch", "per_request", "vllm_style")
RECORD: dict = {}


def _need_compiled():
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: the step benchmark times the compiled core")
    return _impl.kernels("compiled", "batch"), _impl.kernels("compiled", "ngram_index")


@functools.lru_cache(maxsize=2)
def streams(length: int) -> tuple[np.ndarray, ...]:
    return tuple(repetitive_stream(length + CONT, seed=100 + s) for s in range(N_STREAMS))


def rounds_for(b: int) -> int:
    return 150 if b == 1 else (60 if b <= 64 else 25)


def _suffix_module():
    return _impl.kernels("compiled", "suffix_index")


def build_indexes(ni, hist: list[np.ndarray], drafter: str = "ngram") -> list:
    """One index per history: ``NgramIndex`` (``drafter="ngram"``), ``SuffixIndex`` with
    the default drafter's settings (``"suffix"``), or alternating, n-gram first
    (``"mixed"``). The suffix indexes are built in one ``extend_batch``."""
    out = []
    sfx = _suffix_module() if drafter != "ngram" else None
    for j, h in enumerate(hist):
        if drafter == "suffix" or (drafter == "mixed" and j % 2):
            out.append(sfx.SuffixIndex(1, None, "earliest", anchor_n=16))
        else:
            ix = ni.NgramIndex(MIN_N, MAX_N, PREFER)
            ix.extend(h)
            out.append(ix)
    if sfx is not None:
        js = [j for j, ix in enumerate(out) if isinstance(ix, sfx.SuffixIndex)]
        sfx.extend_batch([out[j] for j in js], np.concatenate([hist[j] for j in js]),
                         np.cumsum([0] + [len(hist[j]) for j in js]).astype(np.int64))
    return out


class Harness:
    """Common bookkeeping: request j follows stream ``seq[j]``; ``length[j]`` tokens of
    it are confirmed; ``out[j]`` collects what it emitted (the decisions)."""

    def __init__(self, b: int, k: int, length: int, drafter: str = "ngram") -> None:
        ss = streams(length)
        self.drafter = drafter
        self.seq = [ss[j % N_STREAMS] for j in range(b)]
        self.b, self.k, self.L = b, k, length
        self.length = np.full(b, length, dtype=np.int64)
        self.out: list[list[int]] = [[] for _ in range(b)]


class BatchHarness(Harness):
    def __init__(self, b, k, length, drafter="ngram"):
        super().__init__(b, k, length, drafter)
        bm, ni = _need_compiled()
        self.ixs = build_indexes(ni, [s[:length] for s in self.seq], drafter)
        self.bs = bm.BatchState(b, k)
        # a one-token prompt (the history's last token): the indexes already hold the rest
        self.bs.admit(np.arange(b), [int(s[length - 1]) for s in self.seq], np.arange(b + 1),
                      np.arange(b), indexes=self.ixs)
        self._absorb(self.bs.step(self.rows()))
        self.last = None

    def rows(self) -> np.ndarray:
        slots, _, offs = self.bs.pending()
        rows = np.empty(int(offs[-1]), dtype=np.int64)
        for j, i in enumerate(slots.tolist()):
            a, z = int(offs[j]), int(offs[j + 1])
            p = int(self.length[i])
            rows[a:z] = self.seq[i][p : p + z - a]
        return rows

    def _absorb(self, res) -> None:
        e, o = res.emitted, res.emitted_offsets
        for j, i in enumerate(res.slots.tolist()):
            em = e[o[j] : o[j + 1]].tolist()
            self.out[i] += em
            self.length[i] += len(em)

    def setup(self):
        if self.last is not None:
            self._absorb(self.last)
        return (self.rows(),), {}

    def run(self, rows):
        self.last = self.bs.step(rows)

    def finish(self):
        if self.last is not None:
            self._absorb(self.last)
            self.last = None


class PerRequestHarness(Harness):
    """ServingState + NgramIndex (or SuffixIndex) per request, stepped in a Python loop;
    a SuffixIndex records each verified draft before it takes the emitted tokens' draft,
    as the suffix drafter's session does."""

    def __init__(self, b, k, length, drafter="ngram"):
        super().__init__(b, k, length, drafter)
        _, ni = _need_compiled()
        self.common_prefix = _impl.kernels("compiled", "prefix").common_prefix
        self.ixs = build_indexes(ni, [s[:length] for s in self.seq], drafter)
        sfx = _suffix_module()
        self.records = [isinstance(ix, sfx.SuffixIndex) for ix in self.ixs]
        self.row_caches = [list(range(n)) for n in range(k + 2)]
        self.states = []
        for j, s in enumerate(self.seq):
            tok = int(s[length])
            st = ServingState.start([int(s[length - 1])], 0).advance_prefill(tok, 0)
            self.out[j].append(tok)
            self.length[j] += 1
            self.ixs[j].extend([tok])
            d = self.ixs[j].propose(k)
            self.states.append(st.enter_verify(d) if d else st)
        self.last = None

    def rows(self) -> list[list[int]]:
        out = []
        for j, st in enumerate(self.states):
            n = len(st.draft) if type(st) is Verify else 1
            p = int(self.length[j])
            out.append(self.seq[j][p : p + n].tolist())
        return out

    def setup(self):
        if self.last is not None:
            for j, em in enumerate(self.last):
                self.out[j] += em
                self.length[j] += len(em)
        return (self.rows(),), {}

    def run(self, rows):
        k = self.k
        cp = self.common_prefix
        caches = self.row_caches
        states, ixs, records = self.states, self.ixs, self.records
        emitted = []
        for j in range(self.b):
            st = states[j]
            r = rows[j]
            if type(st) is Verify:
                d = st.draft
                n = cp(d, r)
                if records[j]:
                    ixs[j].record(len(d), n)
                nxt = st.accept_rows(n, r, caches[len(d)])
                if type(nxt) is Accept:
                    st = nxt.resume()
                    em = d
                else:
                    st = nxt.rollback()
                    em = d[:n]
                    em.append(nxt.to)
            else:
                tok = r[0]
                st = st.advance_decode(tok, 0)
                em = [tok]
            ix = ixs[j]
            ix.extend(em)
            d = ix.propose(k)
            states[j] = st.enter_verify(d) if d else st
            emitted.append(em)
        self.last = emitted

    def finish(self):
        self.setup()
        self.last = None


@functools.lru_cache(maxsize=1)
def numba_propose():
    numba = pytest.importorskip("numba")

    @numba.njit(cache=False, nogil=True)
    def propose(h, n_tokens, min_n, max_n, k, out):
        # vLLM-style: for n from max_n down to min_n, the earliest earlier occurrence of
        # the last n tokens (a full rescan of the history every call)
        for n in range(max_n, min_n - 1, -1):
            if n_tokens <= n:
                continue
            s = n_tokens - n
            for i in range(0, s):
                ok = True
                for t in range(n):
                    if h[i + t] != h[s + t]:
                        ok = False
                        break
                if ok:
                    m = min(k, n_tokens - (i + n))
                    for t in range(m):
                        out[t] = h[i + n + t]
                    return m
        return 0

    return propose


class VllmStyleHarness(Harness):
    """Histories in one [B, L + CONT] buffer; a numba rescan per request; acceptance by
    numpy cumprod over the padded [B, K] drafts."""

    def __init__(self, b, k, length):
        super().__init__(b, k, length)
        self.propose = numba_propose()
        self.hist = np.zeros((b, length + CONT + k + 2), dtype=np.int64)
        for j, s in enumerate(self.seq):
            self.hist[j, : length + 1] = s[: length + 1]
            self.out[j].append(int(s[length]))
        self.length += 1
        self.drafts = np.full((b, k), -1, dtype=np.int64)
        self.dlen = np.zeros(b, dtype=np.int64)
        self.cols = np.arange(k)
        self._draft_all()
        self.last = None

    def _draft_all(self):
        prop, h, L, d, dl, k = self.propose, self.hist, self.length, self.drafts, self.dlen, self.k
        for j in range(self.b):
            dl[j] = prop(h[j], L[j], MIN_N, MAX_N, k, d[j])

    def rows(self) -> np.ndarray:
        rows = np.full((self.b, self.k), -2, dtype=np.int64)
        for j in range(self.b):
            n = max(int(self.dlen[j]), 1)
            p = int(self.length[j])
            rows[j, :n] = self.seq[j][p : p + n]
        return rows

    def setup(self):
        if self.last is not None:
            cnt = self.last
            e = self.hist
            for j in range(self.b):
                a = int(self.length[j]) - int(cnt[j])
                self.out[j] += e[j, a : int(self.length[j])].tolist()
        return (self.rows(),), {}

    def run(self, rows):
        dl = self.dlen
        match = (self.drafts == rows) & (self.cols < dl[:, None])
        acc = np.cumprod(match, axis=1).sum(axis=1)
        cnt = np.where(acc < dl, acc + 1, dl)
        cnt[dl == 0] = 1
        # emitted tokens are the rows' first cnt entries (accepted rows equal the draft)
        mask = self.cols < cnt[:, None]
        r_idx, c_idx = np.nonzero(mask)
        self.hist[r_idx, self.length[r_idx] + c_idx] = rows[r_idx, c_idx]
        self.length += cnt
        self._draft_all()
        self.last = cnt

    def finish(self):
        self.setup()
        self.last = None


HARNESS = {"batch": BatchHarness, "per_request": PerRequestHarness, "vllm_style": VllmStyleHarness}

# suffix-index slots (the default drafter's settings) and mixed batches (n-gram and
# suffix slots alternating): the compiled step against the per-request API, the same
# identical-decisions check (the vLLM-style baseline drafts by the n-gram rule only).
# Targets: B=256, K=8, 32k under 150 µs per step; B=1 under 3 µs.
DRAFTER_CASES = [(1, 8, 32768, "suffix"), (256, 8, 32768, "suffix"), (256, 8, 32768, "mixed")]
DRAFTER_WHICH = ("batch", "per_request")


@pytest.mark.parametrize(
    "case, which",
    [pytest.param(c, w, id=f"B{c[0]}-K{c[1]}-L{c[2] // 1024}k-{w}") for c in CASES for w in WHICH],
)
def test_step(benchmark, case, which):
    b, k, length = case
    _need_compiled()
    benchmark.group = f"step B={b} K={k} L={length // 1024}k"
    h = HARNESS[which](b, k, length)
    gc.collect()
    benchmark.pedantic(h.run, setup=h.setup, rounds=rounds_for(b), warmup_rounds=2, iterations=1)
    h.finish()
    emitted = sum(len(o) for o in h.out)
    benchmark.extra_info["tokens_per_step"] = emitted / (rounds_for(b) + 3)
    seen = RECORD.setdefault(case, {})
    for other, out in seen.items():
        assert h.out == out, f"{which} made different decisions from {other}"
    seen[which] = h.out
    if len(seen) == len(WHICH):
        del RECORD[case]


@pytest.mark.parametrize(
    "case, which",
    [pytest.param(c, w, id=f"B{c[0]}-K{c[1]}-L{c[2] // 1024}k-{c[3]}-{w}")
     for c in DRAFTER_CASES for w in DRAFTER_WHICH],
)
def test_step_drafter(benchmark, case, which):
    b, k, length, drafter = case
    _need_compiled()
    benchmark.group = f"step {drafter} B={b} K={k} L={length // 1024}k"
    h = HARNESS[which](b, k, length, drafter)
    gc.collect()
    benchmark.pedantic(h.run, setup=h.setup, rounds=rounds_for(b), warmup_rounds=2, iterations=1)
    h.finish()
    emitted = sum(len(o) for o in h.out)
    benchmark.extra_info["tokens_per_step"] = emitted / (rounds_for(b) + 3)
    seen = RECORD.setdefault(case, {})
    for other, out in seen.items():
        assert h.out == out, f"{which} made different decisions from {other}"
    seen[which] = h.out
    if len(seen) == len(DRAFTER_WHICH):
        del RECORD[case]


# -- stages of the compiled step at B=256, K=8, 32k ------------------------------------
@pytest.fixture(scope="module")
def recorded_step():
    """Indexes for B=256 at 32k and one step's emitted tokens (flat + offsets)."""
    _need_compiled()
    h = BatchHarness(256, 8, 32768)
    for _ in range(3):
        (rows,), _ = h.setup()
        h.run(rows)
    res = h.last
    return h, res


def test_stage_extend(benchmark, recorded_step):
    h, res = recorded_step
    _, ni = _need_compiled()
    benchmark.group = "stage B=256 K=8 L=32k"
    ixs = h.ixs
    toks, off = res.emitted, res.emitted_offsets
    eb = getattr(ni, "extend_batch", None)

    def run():
        if eb is not None:
            eb(ixs, toks, off)
            return
        tl = toks.tolist()  # what the step does without extend_batch
        for q, ix in enumerate(ixs):
            ix.extend(tl[off[q] : off[q + 1]])

    benchmark.pedantic(run, rounds=20, warmup_rounds=1, iterations=1)
    n = int(off[-1])
    benchmark.extra_info["tokens_appended"] = n
    benchmark.extra_info["ns_per_token"] = benchmark.stats.stats.median * 1e9 / max(n, 1)


def test_stage_propose_batch(benchmark, recorded_step):
    h, _ = recorded_step
    _, ni = _need_compiled()
    benchmark.group = "stage B=256 K=8 L=32k"
    ixs = h.ixs
    limits = np.full(len(ixs), 8, dtype=np.int64)
    benchmark.pedantic(ni.propose_batch, args=(ixs, limits), rounds=50, warmup_rounds=2, iterations=1)


def test_stage_settle_and_transitions(benchmark, recorded_step):
    """The step without indexes on the recorded drafts and rows: acceptance, settle, the
    transitions, emission and placement rows only (the nogil part of the step)."""
    h, _ = recorded_step
    bm, _ = _need_compiled()
    benchmark.group = "stage B=256 K=8 L=32k"
    b = len(h.ixs)
    slots, inputs, offs = h.bs.pending()
    drafts, doff = [], [0]
    for j, i in enumerate(slots.tolist()):
        d = h.bs.draft(i)
        drafts += d
        doff.append(len(drafts))
    rows = h.rows()
    bs = bm.BatchState(b, 8)
    bs.admit(np.arange(b), np.zeros(b, dtype=np.int64), np.arange(b + 1), np.arange(b))
    bs.step(np.zeros(b, dtype=np.int64))
    # every slot verifies the draft it has in the recorded step (a slot without a draft
    # keeps decoding); the rows are the recorded step's rows
    has = [j for j in range(len(slots)) if doff[j + 1] > doff[j]]

    def setup():
        for i in np.flatnonzero(bs.states == bm.DONE).tolist():
            raise AssertionError(f"slot {i} finished")
        if has:
            flat = np.array([t for j in has for t in drafts[doff[j]:doff[j + 1]]], dtype=np.int64)
            o = np.cumsum([0] + [doff[j + 1] - doff[j] for j in has])
            bs.enter_verify(np.asarray(has), flat, o)
        # the last token of each slot is not an input here, so row layouts match the
        # recorded step (decode slots: 1 row; verify slots: K rows)
        return (rows,), {}

    benchmark.pedantic(bs.step, setup=setup, rounds=50, warmup_rounds=2, iterations=1)


def test_stage_extend_fresh(benchmark):
    """``extend_batch`` as the step meets it: every round appends new tokens (4 per
    index, the stream's continuation) to 256 indexes of 32k tokens, so the hash-table
    lines it touches are cold. (``test_stage_extend`` appends the same tokens every
    round: its lines stay cached, a lower bound.)"""
    _, ni = _need_compiled()
    eb = getattr(ni, "extend_batch", None)
    if eb is None:
        pytest.skip("the index module has no extend_batch")
    benchmark.group = "stage B=256 K=8 L=32k"
    b, length, per = 256, 32768, 4
    seq = [streams(length)[j % N_STREAMS] for j in range(b)]
    ixs = build_indexes(ni, [s[:length] for s in seq])
    off = np.arange(0, b * per + 1, per, dtype=np.int64)
    at = [length]

    def setup():
        p = at[0]
        at[0] += per
        return (ixs, np.concatenate([s[p : p + per] for s in seq]), off), {}

    benchmark.pedantic(eb, setup=setup, rounds=20, warmup_rounds=1, iterations=1)
    benchmark.extra_info["tokens_appended"] = b * per
    benchmark.extra_info["ns_per_token"] = benchmark.stats.stats.median * 1e9 / (b * per)
