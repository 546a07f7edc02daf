"""``steady_rows``, the vLLM proposers' steady-step kernel: compiled == twin == a plain
per-row reference, on steady batches and on batches with one thing wrong; the twin
flag and the anchors to renew; refusals of arrays that do not fit; a caller that
changes its arguments while the call allocates."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm.vllm.rows import RowTrackingProposer as R

T, S = 8, 3
MUL = R._FILTER_MUL


def plain_int(x):
    return (isinstance(x, np.ndarray) and x.ndim == 1 and x.flags.c_contiguous and x.flags.aligned
            and x.dtype.isnative and x.dtype.kind == "i" and x.itemsize in (4, 8))


def reference(sampled, L, tok, n_old, seen, tail, spos, spread, anc, first, every, short, cap, pool_f, mul):
    """The kernel's contract, one row at a time in Python ints."""
    if type(sampled) is not list or type(tok) is not np.ndarray or tok.ndim != 2 or not tok.flags.c_contiguous:
        return None
    if not plain_int(L) or tok.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        return None
    b = len(sampled)
    if b == 0 or tok.shape[0] < b or L.shape[0] < b:
        return None
    width = tok.shape[1]
    new, offsets, tails, keys = [], [0], [], []
    for r in range(b):
        if type(sampled[r]) is not list:
            return None
        ns, n0, n = len(sampled[r]), int(n_old[r]), int(L[r])
        if not (ns >= 1 and n0 == seen[r] and n0 > short and n0 >= T and n == n0 + ns and n <= width and n < cap):
            return None
        if tok[r, n0 - T : n0].tolist() != tail[:, r].tolist():
            return None
        new += tok[r, n0:n].tolist()
        offsets.append(offsets[-1] + ns)
        tails.append(tok[r, n - T : n].tolist())
        m = 2**64
        keys.append((n * int(mul[0]) + int(tails[-1][-2]) % m * int(mul[1]) + int(tails[-1][-1]) % m * int(mul[2])) % m)
    renew = []
    for r in range(first, b, every):
        for j in range(spos.shape[0]):
            p = int(spos[j, r])
            if not 0 <= p < width or tok[r, p] != spread[j, r]:
                return None
        if L[r] >= 2 * anc[r]:
            renew.append(r)
    twins = len(set(keys)) < b or bool(set(keys) & set(int(x) for x in pool_f))
    return ([int(x) for x in L[:b]], new, offsets, np.array(tails, dtype=np.int64).T.tolist(),
            max(int(x) for x in L[:b]), twins, renew)


def as_plain(got):
    if got is None:
        return None
    lengths, new, offsets, tails, lmax, twins, renew = got
    for a in (lengths, new, offsets, tails):
        assert type(a) is np.ndarray and a.dtype == np.int64
    assert tails.flags.c_contiguous and tails.shape[0] == T and type(renew) is list
    return lengths.tolist(), new.tolist(), offsets.tolist(), tails.tolist(), int(lmax), bool(twins), renew


def steady_batch(rng, b, width=400, dtype=np.int32, spare=2):
    """A batch every row of which is steady: its arguments as a list."""
    tok = rng.integers(0, 50, size=(b + spare, width)).astype(dtype)
    n_old = rng.integers(T + 20, width - 40, size=b + spare).astype(np.int64)
    grown = rng.integers(1, 6, size=b + spare)
    L = (n_old + grown).astype(np.int64)
    sampled = [tok[r, n_old[r] : L[r]].tolist() for r in range(b)]
    tail = np.ascontiguousarray(np.stack([tok[r, n_old[r] - T : n_old[r]] for r in range(b + spare)]).T.astype(np.int64))
    anc = rng.integers(1, width, size=b + spare).astype(np.int64)
    spos = np.ascontiguousarray(((anc.reshape(-1, 1) * np.arange(1, S + 1)) // (S + 1)).T)
    spread = np.ascontiguousarray(np.stack([tok[r, spos[:, r]] for r in range(b + spare)]).T.astype(np.int64))
    return [sampled, L, tok, n_old.copy(), n_old.copy(), tail, spos, spread, anc, 0, 3, 16, 10**9,
            np.zeros(0, dtype=np.uint64), MUL]


def run_all(impl, args):
    kern = impl.module("rows")
    got = as_plain(kern.steady_rows(*args))
    assert got == reference(*args)
    return got


BREAKS = ["none", "len32", "lenu32", "lenlist", "lenshort", "tail", "seen", "short", "grown", "width", "cap", "spread", "spos", "item", "tuple",
          "dtype", "strided", "twin", "pool", "empty"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), brk=st.sampled_from(BREAKS),
       int64=st.booleans(), first=st.integers(0, 4), every=st.integers(1, 5))
def test_steady_rows_equals_the_reference(impl, b, seed, brk, int64, first, every):
    rng = np.random.default_rng(seed)
    args = steady_batch(rng, b, dtype=np.int64 if int64 else np.int32)
    args[9], args[10] = first, every
    sampled, L, tok, n_old, seen, tail, spos, spread = args[:8]
    r = int(rng.integers(0, b))
    if brk == "len32":
        args[1] = L.astype(np.int32)
    elif brk == "lenu32":
        args[1] = L.astype(np.uint32)
    elif brk == "lenlist":
        args[1] = L.tolist()
    elif brk == "lenshort":
        args[1] = L[: b - 1].copy()
    elif brk == "tail":
        tok[r, n_old[r] - 1 - int(rng.integers(0, T))] += 1
    elif brk == "seen":
        seen[r] -= 1
    elif brk == "short":
        args[11] = int(n_old[r])
    elif brk == "grown":
        sampled[r] = sampled[r] + [1]
    elif brk == "width":
        args[2] = np.ascontiguousarray(tok[:, : int(L[r]) - 1])
    elif brk == "cap":
        args[12] = int(L[r])
    elif brk == "spread":
        spread[:, r] += 1
    elif brk == "spos":
        spos[0, r] = tok.shape[1] + int(rng.integers(0, 3)) if rng.random() < 0.5 else -1
    elif brk == "item":
        sampled[r] = tuple(sampled[r])
    elif brk == "tuple":
        args[0] = tuple(sampled)
    elif brk == "dtype":
        args[2] = tok.astype(np.int16 if rng.random() < 0.5 else np.uint32)
    elif brk == "strided":
        args[2] = np.asfortranarray(tok)
    elif brk == "twin" and b >= 2:
        # row 0 becomes row r's twin: the same length and last two tokens
        r = max(r, 1)
        L[0] = L[r]
        n_old[0] = seen[0] = L[0] - len(sampled[0])
        tok[0, : L[0]] = tok[r, : L[0]]
        tail[:, 0] = tok[0, n_old[0] - T : n_old[0]]
        spread[:, 0] = tok[0, spos[:, 0]]
    elif brk == "pool":
        n = int(L[r])
        key = (n * int(MUL[0]) + int(tok[r, n - 2]) * int(MUL[1]) + int(tok[r, n - 1]) * int(MUL[2])) % 2**64
        args[13] = np.sort(np.array([1, key, 2**64 - 1], dtype=np.uint64))
    elif brk == "empty":
        args[0] = []
    got = run_all(impl, args)
    if brk in ("none", "twin", "pool", "len32"):
        assert got is not None
    if brk == "pool" or (brk == "twin" and b >= 2):
        assert got[5]  # a made twin is always found
    if brk in ("lenu32", "lenlist", "lenshort", "tail", "seen", "short", "grown", "width", "cap", "item", "tuple", "dtype", "strided", "empty"):
        assert got is None
    if brk in ("spread", "spos"):
        assert (got is None) == ((r - first) % every == 0 and r >= first)


def test_steady_rows_answers_the_new_tokens_tails_and_renewals(impl):
    rng = np.random.default_rng(7)
    args = steady_batch(rng, 6)
    args[8][:] = 1  # every anchor tiny: every checked row renews
    args[9], args[10] = 1, 2
    lengths, new, offsets, tails, lmax, twins, renew = run_all(impl, args)
    sampled, L, tok = args[0], args[1], args[2]
    assert lengths == L[:6].tolist()
    assert new == [t for s in sampled for t in s]
    assert offsets == [0, *np.cumsum([len(s) for s in sampled]).tolist()]
    assert tails == [[int(tok[r, L[r] - T + j]) for r in range(6)] for j in range(T)]
    assert lmax == int(L[:6].max()) and renew == [1, 3, 5] and twins is False


def test_steady_rows_refuses_arrays_that_do_not_fit(impl):
    kern = impl.module("rows")
    rng = np.random.default_rng(3)
    base = steady_batch(rng, 4, spare=0)
    bad = {3: base[3][:3], 4: base[4][:3], 5: base[5][:, :3], 6: base[6][:, :3],
           7: base[7][:2], 8: base[8][:3]}
    for at, value in bad.items():
        args = list(base)
        args[at] = np.ascontiguousarray(value)
        with pytest.raises(ValueError):
            kern.steady_rows(*args)
    for at, value in ((9, -1), (10, 0), (14, MUL[:2].copy())):
        args = list(base)
        args[at] = value
        with pytest.raises(ValueError):
            kern.steady_rows(*args)
    args = list(base)
    args[5] = np.ascontiguousarray(base[5][:1])  # a tail of one token
    with pytest.raises(ValueError):
        kern.steady_rows(*args)
    args = list(base)
    args[3] = base[3].astype(np.int32)  # the row arrays are int64
    with pytest.raises(ValueError):
        kern.steady_rows(*args)


def test_steady_rows_survives_a_caller_that_empties_its_rows_while_it_allocates(impl):
    """A collection while the call allocates runs the caller's code, which here empties
    ``sampled``: the call answers None, or the rows it read, or refuses cleanly, and never
    reads past them. (The compiled call makes no object a collection counts before its
    checks, so there the callback may never fire; the twin's allocations fire it.)"""
    kern = impl.module("rows")
    rng = np.random.default_rng(5)
    args = steady_batch(rng, 30)
    sampled = args[0]
    fired = []

    def clear(phase, info):
        if phase == "start" and not fired:
            fired.append(1)
            sampled.clear()

    old = gc.get_threshold()
    gc.callbacks.append(clear)
    try:
        gc.set_threshold(1)
        try:
            got = kern.steady_rows(*args)
        except ValueError:
            got = None
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(clear)
    assert fired or impl.name == "compiled"
    assert got is None or len(got[2]) == 31
