"""``extend_batch``: B indexes extended from one flat token array in one
call, equal to one ``extend`` per index on both implementations, all or nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_ngram_index import reference

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def ngi(impl):
    return impl.module("ngram_index")


# (9, 12): pipelined with n-grams long enough for the chained compare; the last two: not
# pipelined
RANGES = [(1, 1), (2, 4), (1, 3), (3, 5), (9, 12), (2, 12), (33, 35)]


@SETTINGS
@given(
    data=st.data(),
    b=st.integers(0, 7),
    rounds=st.integers(1, 5),
    rng_=st.sampled_from(RANGES),
    prefer=st.sampled_from(["latest", "earliest"]),
    vocab=st.sampled_from([2, 3, 50]),
    wide=st.booleans(),
    as_list=st.booleans(),
)
def test_extend_batch_equals_per_index_extend(impl, data, b, rounds, rng_, prefer, vocab, wide, as_list):
    ngi = impl.module("ngram_index")
    lo, hi = rng_
    batch = [ngi.NgramIndex(lo, hi, prefer) for _ in range(b)]
    one = [ngi.NgramIndex(lo, hi, prefer) for _ in range(b)]
    hist: list[list[int]] = [[] for _ in range(b)]
    for _ in range(rounds):
        pieces = [
            data.draw(st.lists(st.integers(0, vocab - 1), max_size=45 if lo > 8 else 9))
            for _ in range(b)
        ]
        if lo > 8:  # long repeats, so long n-grams match
            pieces = [(p * 40)[: 40 + len(p)] if p else p for p in pieces]
        gap = data.draw(st.integers(0, 2))
        flat = [t for p in pieces for t in p]
        off = np.zeros(b + 1, dtype=np.int64)
        np.cumsum([len(p) for p in pieces], out=off[1:])
        if gap:  # tokens before offsets[0] or after offsets[-1]: refused, nothing changes
            with pytest.raises(ValueError, match="offsets"):
                ngi.extend_batch(batch, [7] * gap + flat, (off + gap).tolist())
            with pytest.raises(ValueError, match="offsets"):
                ngi.extend_batch(batch, flat + [7] * gap, off.tolist())
        tokens = flat if as_list else np.array(flat, dtype=np.int64 if wide else np.int32)
        if data.draw(st.booleans()):
            ngi.extend_batch(batch, tokens, off.tolist() if as_list else off)
        else:  # the batch's indexes extended one by one between batched rounds
            for ix, p in zip(batch, pieces):
                ix.extend(p)
        for ix, p, h in zip(one, pieces, hist):
            ix.extend(p)
            h += p
        for x, y, h in zip(batch, one, hist):
            assert x.tokens.tolist() == y.tokens.tolist() == h
            assert x.propose(6) == y.propose(6) == reference(h, lo, hi, 6, prefer)
            assert x.match_length() == y.match_length()


def test_extend_batch_by_hand(ngi):
    a, b, c = ngi.NgramIndex(1, 2), ngi.NgramIndex(1, 2), ngi.NgramIndex(2)
    ngi.extend_batch([a, b, c], [1, 2, 1, 9, 9, 5, 6, 5, 6], [0, 3, 5, 9])
    assert a.tokens.tolist() == [1, 2, 1] and a.propose(3) == [2, 1]
    assert b.tokens.tolist() == [9, 9] and b.propose(3) == [9]
    assert c.tokens.tolist() == [5, 6, 5, 6] and c.propose(3) == [5, 6]
    ngi.extend_batch([a, c], np.array([2], dtype=np.int32), [0, 1, 1])
    assert a.propose(3) == [1, 2] and len(c) == 4
    ngi.extend_batch([], [], [0])


def test_extend_batch_all_or_nothing(ngi):
    a, b = ngi.NgramIndex(1, 2), ngi.NgramIndex(1, 2)
    a.extend([1, 2])
    with pytest.raises(ValueError, match=r"indexes\[2\] appears twice in the batch"):
        ngi.extend_batch([a, b, a], [1, 2, 3], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="offsets holds 3 entries for 3 indexes; it needs B \\+ 1 = 4"):
        ngi.extend_batch([a, b, b], [1, 2, 3], [0, 1, 3])
    with pytest.raises(ValueError, match="offsets must be nondecreasing"):
        ngi.extend_batch([a, b], [1, 2, 3], [0, 2, 1])
    with pytest.raises(ValueError, match="offsets must be nondecreasing"):
        ngi.extend_batch([a, b], [1, 2, 3], [0, 2**63 - 1, -2])
    with pytest.raises(ValueError, match=r"offsets\[-1\]=4 must equal len\(tokens\)=3"):
        ngi.extend_batch([a, b], [1, 2, 3], [0, 1, 4])
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0, got -1"):
        ngi.extend_batch([a, b], [1, 2, 3], [-1, 1, 3])
    with pytest.raises(ValueError, match=r"got offsets\[2\]=3 > offsets\[3\]=2"):
        ngi.extend_batch([a, b, ngi.NgramIndex(1)], [1, 2, 3], [0, 1, 3, 2])
    with pytest.raises(TypeError, match=r"tokens\[1\] must be an integer token id"):
        ngi.extend_batch([a, b], [1, 2.5, 3], [0, 1, 3])
    with pytest.raises(TypeError, match=r"indexes\[1\] must be an NgramIndex"):
        ngi.extend_batch([a, 3], [1, 2, 3], [0, 1, 3])
    assert a.tokens.tolist() == [1, 2] and len(b) == 0
    # the guards were released: a plain call works
    ngi.extend_batch([a, b], [1, 2, 3], [0, 1, 3])
    assert a.tokens.tolist() == [1, 2, 1] and b.tokens.tolist() == [2, 3]


def test_extend_batch_refuses_a_busy_index(ngi):
    """An index being extended (here: by a callback inside its own extend) refuses the
    whole batch with RuntimeError and no index changes."""
    from collections.abc import Sequence

    a, b = ngi.NgramIndex(1, 2), ngi.NgramIndex(1, 2)
    seen = []

    class Calling(Sequence):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            if not seen:
                try:
                    ngi.extend_batch([b, a], [5, 6], [0, 1, 2])
                except RuntimeError as exc:
                    seen.append(str(exc))
            if i >= 2:
                raise IndexError(i)
            return 4

    a.extend(Calling())
    assert seen and "indexes[1]: NgramIndex is being changed" in seen[0]
    assert a.tokens.tolist() == [4, 4] and len(b) == 0


def test_extend_batch_from_threads(impl):
    """Threads extending disjoint and overlapping batches: every call applies whole or
    is refused; each index ends equal to a rebuild of its own tokens."""
    import threading

    ngi = impl.module("ngram_index")
    ixs = [ngi.NgramIndex(2, 4) for _ in range(12)]
    rng = np.random.default_rng(0)
    errors = []

    def work(seed, which):
        r = np.random.default_rng(seed)
        for _ in range(150):
            sub = [ixs[i] for i in which]
            counts = r.integers(0, 6, size=len(sub))
            flat = r.integers(0, 5, size=int(counts.sum()))
            off = np.zeros(len(sub) + 1, dtype=np.int64)
            np.cumsum(counts, out=off[1:])
            try:
                ngi.extend_batch(sub, flat, off)
            except RuntimeError:
                pass
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(repr(exc))

    groups = [range(0, 6), range(6, 12), range(3, 9), range(0, 12, 2)]
    ts = [threading.Thread(target=work, args=(k, list(g))) for k, g in enumerate(groups)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:3]
    del rng
    for ix in ixs:
        fresh = ngi.NgramIndex(2, 4)
        fresh.extend(ix.tokens)
        assert ix.propose(5) == fresh.propose(5) == reference(ix.tokens.tolist(), 2, 4, 5)


def test_extend_batch_public_wrapper():
    from specfsm.drafting import ngram_index as pub

    a, b = pub.NgramIndex(1, 2), pub.NgramIndex(1, 2)
    assert pub.extend_batch([a, b], [3, 4, 3, 8], [0, 3, 4]) is None
    assert a.propose(2) == [4, 3] and b.tokens.tolist() == [8]
