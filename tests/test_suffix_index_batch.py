"""``extend_batch`` of the suffix index: B indexes from one flat token array, equal to
per-index ``extend`` (checked against the brute-force rule of ``test_suffix_index``),
all or nothing, refusing busy indexes and the other implementation's, from threads.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from test_suffix_index import PREFERS, SETTINGS, WIDE_IDS, reference


@pytest.fixture
def sfx(impl):
    return impl.module("suffix_index")


# ---------------------------------------------------------------------------------------
# extend_batch: B indexes from one flat token array
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(
    data=st.data(),
    # a few indexes, or enough that the compiled call's prefetch stages (2 to 8 indexes
    # ahead) all run
    b=st.one_of(st.integers(0, 6), st.integers(32, 48)),
    rounds=st.integers(1, 4),
    prefer=st.sampled_from(PREFERS),
    cap=st.one_of(st.none(), st.integers(0, 4)),
    ids=st.sampled_from([[0, 1], [0, 1, 2, 3], WIDE_IDS]),
    as_list=st.booleans(),
)
def test_extend_batch_equals_per_index_extend(impl, data, b, rounds, prefer, cap, ids, as_list):
    sfx = impl.module("suffix_index")
    hi = None if cap is None else 1 + cap
    batch = [sfx.SuffixIndex(1, hi, prefer, anchor_n=3) for _ in range(b)]
    one = [sfx.SuffixIndex(1, hi, prefer, anchor_n=3) for _ in range(b)]
    hist: list[list[int]] = [[] for _ in range(b)]
    for _ in range(rounds):
        pieces = [data.draw(st.lists(st.sampled_from(ids), max_size=12)) for _ in range(b)]
        gap = data.draw(st.integers(0, 2))
        flat = [t for p in pieces for t in p]
        off = np.zeros(b + 1, dtype=np.int64)
        np.cumsum([len(p) for p in pieces], out=off[1:])
        if gap:  # tokens before offsets[0] or after offsets[-1]: refused, nothing changes
            with pytest.raises(ValueError, match="offsets"):
                sfx.extend_batch(batch, [7] * gap + flat, (off + gap).tolist())
            with pytest.raises(ValueError, match="offsets"):
                sfx.extend_batch(batch, flat + [7] * gap, off.tolist())
        assert sfx.extend_batch(batch, flat if as_list else np.array(flat, dtype=np.int64),
                                off.tolist() if as_list else off) is None
        for ix, p, h in zip(one, pieces, hist):
            ix.extend(p)
            h += p
        for x, y, h in zip(batch, one, hist):
            n, e = reference(h, 1, hi, prefer)
            assert x.tokens.tolist() == y.tokens.tolist() == h
            assert x.match_length() == y.match_length() == n
            assert x.propose(5) == y.propose(5)
            assert x.match_end() == y.match_end()


@pytest.mark.parametrize("prefer", PREFERS)
def test_extend_batch_of_long_histories_equals_per_index_extend(sfx, prefer):
    """64 indexes of recurring motifs (clones, table edges, table growth), fed ragged
    steps of 0 to 40 tokens (some of them wide) over histories up to about 2,000
    tokens: the state after every step equals per-index ``extend``'s, drafts and trees
    included."""
    rng = np.random.default_rng(11)
    b = 64
    motifs = [rng.integers(0, 50, size=rng.integers(3, 12)) for _ in range(6)]
    streams = []
    for i in range(b):
        parts = [motifs[j] for j in rng.integers(0, 6, size=200)]
        s = np.concatenate(parts + [rng.integers(0, 50, size=40)])
        if i % 16 == 5:
            s[rng.integers(0, s.size, size=4)] = 2**40 + 7
        streams.append(s.tolist())
    batch = [sfx.SuffixIndex(1, None, prefer, anchor_n=8) for _ in range(b)]
    one = [sfx.SuffixIndex(1, None, prefer, anchor_n=8) for _ in range(b)]
    pos = [0] * b
    for step in range(40):
        counts = rng.integers(0, 41, size=b)
        counts[rng.integers(0, b, size=8)] = 0
        pieces = []
        for i in range(b):
            pieces.append(streams[i][pos[i] : pos[i] + int(counts[i])])
            pos[i] += len(pieces[-1])
        off = np.zeros(b + 1, dtype=np.int64)
        np.cumsum([len(p) for p in pieces], out=off[1:])
        sfx.extend_batch(batch, np.array([t for p in pieces for t in p], dtype=np.int64), off)
        for ix, p in zip(one, pieces):
            ix.extend(p)
        for i in range(0, b, 7 if step % 10 else 1):
            x, y = batch[i], one[i]
            assert len(x) == len(y) == pos[i]
            assert (x.match_length(), x.match_end()) == (y.match_length(), y.match_end())
            assert x.propose(8) == y.propose(8)
    for x, y in zip(batch, one):
        assert x.tokens.tolist() == y.tokens.tolist()
        assert x.nbytes == y.nbytes
        tx, ty = x.propose_tree(16), y.propose_tree(16)
        assert [a.tolist() for a in tx] == [a.tolist() for a in ty]


def test_extend_batch_by_hand(sfx):
    a, b, c = sfx.SuffixIndex(1), sfx.SuffixIndex(1, 2), sfx.SuffixIndex(2)
    sfx.extend_batch([a, b, c], [1, 2, 1, 9, 9, 5, 6, 5, 6], [0, 3, 5, 9])
    assert a.tokens.tolist() == [1, 2, 1] and a.propose(3) == [2, 1]
    assert b.tokens.tolist() == [9, 9] and b.propose(3) == [9]
    assert c.tokens.tolist() == [5, 6, 5, 6] and c.propose(3) == [5, 6]
    sfx.extend_batch([a, c], np.array([2], dtype=np.int32), [0, 1, 1])
    assert a.propose(3) == [1, 2] and len(c) == 4
    sfx.extend_batch([a], [2**40, 2], [0, 2])  # one index turns int64, the others do not
    assert a.tokens.tolist() == [1, 2, 1, 2, 2**40, 2] and a.propose(2) == [1, 2]
    sfx.extend_batch([], [], [0])
    big = np.random.default_rng(1).integers(0, 3, size=3000)   # past the nogil threshold
    x, y = sfx.SuffixIndex(1), sfx.SuffixIndex(1)
    sfx.extend_batch([x, y], big, [0, 1000, 3000])
    assert x.tokens.tolist() == big[:1000].tolist()
    z = sfx.SuffixIndex(1)
    z.extend(big[1000:])
    assert y.propose(9) == z.propose(9) and y.match_end() == z.match_end()


def test_extend_batch_all_or_nothing(sfx):
    a, b = sfx.SuffixIndex(1), sfx.SuffixIndex(1)
    a.extend([1, 2])
    with pytest.raises(ValueError, match=r"indexes\[2\] appears twice in the batch"):
        sfx.extend_batch([a, b, a], [1, 2, 3], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="offsets holds 3 entries for 3 indexes; it needs B \\+ 1 = 4"):
        sfx.extend_batch([a, b, b], [1, 2, 3], [0, 1, 3])
    with pytest.raises(ValueError, match="offsets must be nondecreasing"):
        sfx.extend_batch([a, b], [1, 2, 3], [0, 2, 1])
    with pytest.raises(ValueError, match="offsets must be nondecreasing"):
        sfx.extend_batch([a, b], [1, 2, 3], [0, 2**63 - 1, -2])
    with pytest.raises(ValueError, match=r"offsets\[-1\]=4 must equal len\(tokens\)=3"):
        sfx.extend_batch([a, b], [1, 2, 3], [0, 1, 4])
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0, got -1"):
        sfx.extend_batch([a, b], [1, 2, 3], [-1, 1, 3])
    with pytest.raises(ValueError, match=r"got offsets\[2\]=3 > offsets\[3\]=2"):
        sfx.extend_batch([a, b, sfx.SuffixIndex(1)], [1, 2, 3], [0, 1, 3, 2])
    with pytest.raises(TypeError, match=r"tokens\[1\] must be an integer token id"):
        sfx.extend_batch([a, b], [1, 2.5, 3], [0, 1, 3])
    with pytest.raises(OverflowError, match="tokens"):
        sfx.extend_batch([a, b], [1, 2**64, 3], [0, 1, 3])
    with pytest.raises(TypeError, match=r"indexes\[1\] must be a SuffixIndex"):
        sfx.extend_batch([a, 3], [1, 2, 3], [0, 1, 3])
    with pytest.raises(TypeError, match="single SuffixIndex"):
        sfx.extend_batch(a, [1], [0, 1])
    with pytest.raises(TypeError, match="offsets"):
        sfx.extend_batch([a], [1], [0, 1.5])
    assert a.tokens.tolist() == [1, 2] and len(b) == 0
    # the guards were released: a plain call works
    sfx.extend_batch([a, b], [1, 2, 3], [0, 1, 3])
    assert a.tokens.tolist() == [1, 2, 1] and b.tokens.tolist() == [2, 3]
    assert a.propose(3) == [2, 1]


def test_extend_batch_refuses_a_busy_index(sfx):
    """An index being extended (here: by a callback inside its own extend) refuses the
    whole batch with RuntimeError and no index changes."""
    from collections.abc import Sequence

    a, b = sfx.SuffixIndex(1), sfx.SuffixIndex(1)
    seen = []

    class Calling(Sequence):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            if not seen:
                try:
                    sfx.extend_batch([b, a], [5, 6], [0, 1, 2])
                except RuntimeError as exc:
                    seen.append(str(exc))
            if i >= 2:
                raise IndexError(i)
            return 4

    a.extend(Calling())
    assert seen and "indexes[1]: SuffixIndex is being changed" in seen[0]
    assert a.tokens.tolist() == [4, 4] and len(b) == 0


def test_extend_batch_from_threads(impl):
    """Threads extending disjoint and overlapping batches while others propose: every
    call applies whole or is refused; each index ends equal to a rebuild of its tokens."""
    sfx = impl.module("suffix_index")
    ixs = [sfx.SuffixIndex(1, None, "earliest", anchor_n=4) for _ in range(12)]
    errors = []

    def work(seed, which):
        r = np.random.default_rng(seed)
        for _ in range(120):
            sub = [ixs[i] for i in which]
            counts = r.integers(0, 40, size=len(sub))
            flat = r.integers(0, 4, size=int(counts.sum()))
            off = np.zeros(len(sub) + 1, dtype=np.int64)
            np.cumsum(counts, out=off[1:])
            try:
                sfx.extend_batch(sub, flat, off)
                sfx.propose_batch(sub, 4)
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
    for ix in ixs:
        fresh = sfx.SuffixIndex(1, None, "earliest", anchor_n=4)
        fresh.extend(ix.tokens)
        assert ix.propose(5) == fresh.propose(5) and ix.match_end() == fresh.match_end()


def test_extend_batch_refuses_the_other_implementation(impl):
    if impl.name == "python":
        pytest.skip("only the compiled module has a second class to mix up")
    from specfsm.drafting import _suffix_index_py as twin

    sfx = impl.module("suffix_index")
    with pytest.raises(TypeError, match="same implementation"):
        sfx.extend_batch([twin.SuffixIndex(1)], [1], [0, 1])


def test_extend_batch_public_wrapper():
    from specfsm.drafting import suffix_index as pub

    a, b = pub.SuffixIndex(1), pub.SuffixIndex(1)
    assert pub.extend_batch([a, b], [3, 4, 3, 8], [0, 3, 4]) is None
    assert a.propose(2) == [4, 3] and b.tokens.tolist() == [8]
