"""The n-gram index and the longest-match kernels never crash, both
implementations.

Calls that crashed the old compiled core run in a child process, so a segfault is
reported as a failing test instead of ending the suite. Thread tests are bounded in
time (each thread stops after a fixed number of rounds or a deadline) and check
consistency, never timing.
"""

from __future__ import annotations

import copy
import pickle
import textwrap
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isolated import run_isolated
from test_ngram_index import reference

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def ngi(impl):
    return impl.module("ngram_index")


def _isolated(impl, body: str, timeout: float = 240) -> str:
    """Runs ``body`` (which sees ``ngi``, ``np``, ``threading``, ``time``) in a child
    process (``isolated.run_isolated``): a crash fails the test with the child's output."""
    prelude = 'import threading, time, sys\nimport numpy as np\nfrom specfsm import _impl\nngi = _impl.kernels(IMPL, "ngram_index")\n'
    return run_isolated(prelude + textwrap.dedent(body), impl.name, timeout)


# ---------------------------------------------------------------------------------------
# offsets: compared neighbour to neighbour, never by int64 differences
# ---------------------------------------------------------------------------------------

WRAPPING_OFFSETS = [
    [0, 2**63 - 1, -2, 5],  # 2**63 - 1 -> -2 passes a wrapped difference check
    [0, 3, 2**63 - 1, -(2**63), 6],
    [-(2**63), 2**63 - 1, 0],
]


def test_wrapping_offsets_are_refused(impl):
    out = _isolated(
        impl,
        f"""
        flat = np.arange(10, dtype=np.int64)
        for off in {WRAPPING_OFFSETS!r}:
            for arr in (off, np.array(off, dtype=np.int64)):
                try:
                    ngi.longest_match_batch(flat, arr, 1, 2, 3)
                except ValueError as exc:
                    assert "offsets" in str(exc), exc
                else:
                    raise AssertionError(f"accepted offsets {{off}}")
        try:
            ngi.longest_match_batch(flat, [0, 2**63 - 1, -2, 5], 1, 1, 1)
        except ValueError as exc:
            assert "offsets[1]=9223372036854775807 > offsets[2]=-2" in str(exc), exc
        print("refused")
        """,
    )
    assert "refused" in out


def test_offsets_and_counts_are_copied(ngi):
    """The caller's arrays are not kept: results depend on their values at the call."""
    flat = np.array([1, 2, 1, 2, 3, 3, 3], dtype=np.int64)
    off = np.array([0, 4, 7], dtype=np.int64)
    ks = np.array([2, 2], dtype=np.int64)
    d, o, n = ngi.longest_match_batch(flat, off, 1, 2, ks)
    off[:] = [7, 0, 0]
    ks[:] = -1
    assert d.tolist() == [1, 2, 3] and o.tolist() == [0, 2, 3] and n.tolist() == [2, 1]


# ---------------------------------------------------------------------------------------
# caller-owned arrays changed by another thread during the call
# ---------------------------------------------------------------------------------------


def test_offsets_rewritten_by_another_thread(impl):
    _isolated(
        impl,
        """
        rng = np.random.default_rng(0)
        flat = rng.integers(0, 4, size=200_000).astype(np.int32)
        good = np.linspace(0, flat.size, 9).astype(np.int64)
        off = good.copy()
        ks = np.full(8, 6, dtype=np.int64)
        bad = [np.array([0, 2**63 - 1, -2] + [5] * 6, dtype=np.int64),
               np.array([0] + [2**62] * 8, dtype=np.int64),
               good[::-1].copy()]
        stop = time.time() + 1.5
        def flip():
            i = 0
            while time.time() < stop:
                off[:] = bad[i % 3]
                ks[:] = 2**62
                off[:] = good
                ks[:] = 6
                i += 1
        t = threading.Thread(target=flip)
        t.start()
        done = refused = 0
        while time.time() < stop:
            try:
                d, o, n = ngi.longest_match_batch(flat, off, 2, 3, ks)
                assert o[0] == 0 and (np.diff(o) == n).all() and o[-1] == d.size
                done += 1
            except ValueError:
                refused += 1
        t.join()
        assert done > 0, f"every one of {refused} calls was refused"
        print(done, refused)
        """,
    )


def test_record_batch_arrays_rewritten_by_another_thread(impl):
    _isolated(
        impl,
        """
        ixs = [ngi.NgramIndex(1, adaptive=True) for _ in range(64)]
        p = np.full(64, 4, dtype=np.int64)
        a = np.full(64, 2, dtype=np.int64)
        stop = time.time() + 1.0
        def flip():
            while time.time() < stop:
                a[:] = -5
                p[:] = -3
                a[:] = 2
                p[:] = 4
        t = threading.Thread(target=flip)
        t.start()
        while time.time() < stop:
            try:
                ngi.record_batch(ixs, p, a)
            except ValueError:
                pass
        t.join()
        for ix in ixs:
            s = ix.stats
            assert 0 <= s["accepted"] <= s["drafted"], s
            assert 1 <= ix.draft_len <= 16
        assert any(ix.stats["drafted"] for ix in ixs), "every record_batch call was refused"
        """,
    )


# ---------------------------------------------------------------------------------------
# NgramIndex under threads: the guard
# ---------------------------------------------------------------------------------------


def test_extend_against_readers(impl):
    """One thread extends in large chunks (numpy copies and the indexing release the
    GIL) while others propose, read the tokens, pickle and copy: every call succeeds or
    is refused with RuntimeError, and the index stays right."""
    out = _isolated(
        impl,
        """
        import copy, pickle
        rng = np.random.default_rng(1)
        big = impl_big = 40_000 if ngi.__name__.startswith("specfsm._core") else 3_000
        chunks = [rng.integers(0, 6, size=big) for _ in range(400)]
        ix = ngi.NgramIndex(2, 4)
        others = [ngi.NgramIndex(2, 3) for _ in range(3)]
        for o in others:
            o.extend(rng.integers(0, 6, size=500))
        stop = time.time() + 2.0
        appended = []
        errors = []
        refused = [0]
        def writer():
            for c in chunks:
                if time.time() > stop:
                    break
                try:
                    ix.extend(c)
                    appended.append(c)
                except RuntimeError:
                    refused[0] += 1
        def reader(kind):
            while time.time() < stop:
                try:
                    if kind == 0:
                        d, o, n = ngi.propose_batch(others + [ix] + others, 5)
                        assert (np.diff(o) == n).all()
                    elif kind == 1:
                        ix.propose(5); ix.match_length(); len(ix)
                    elif kind == 2:
                        t = ix.tokens; ix.nbytes
                        assert t.size <= len(ix)
                    else:
                        c = copy.copy(ix) if len(ix) < 200_000 else ix
                        pickle.dumps(others[0])
                except RuntimeError as exc:
                    assert "NgramIndex is being" in str(exc), exc
                    refused[0] += 1
                except Exception as exc:
                    errors.append(repr(exc))
                    return
        ts = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(k,)) for k in range(4)]
        for t in ts: t.start()
        for t in ts: t.join()
        assert not errors, errors[:3]
        want = np.concatenate(appended) if appended else np.zeros(0, dtype=np.int64)
        assert len(ix) == want.size
        assert np.array_equal(ix.tokens, want)
        assert ix.propose(6) == ngi.longest_match(want, 2, 4, 6).tolist()
        print("ok", len(appended), refused[0])
        """,
    )
    assert out.startswith("ok")


def test_two_writers_never_tear_the_index(impl):
    """Two threads extend one index: each extend is applied whole or refused; the
    index holds exactly the applied chunks, whole, and proposes what a rescan gives."""
    out = _isolated(
        impl,
        """
        size = 20_000 if ngi.__name__.startswith("specfsm._core") else 1_500
        ix = ngi.NgramIndex(1, 3)
        stop = time.time() + 2.0
        applied = []
        def writer(w):
            for j in range(1000):
                if time.time() > stop:
                    return
                chunk = np.full(size, w * 1_000_000 + j, dtype=np.int64)
                chunk[::7] = -1
                try:
                    ix.extend(chunk)
                    applied.append((w, j))
                except RuntimeError as exc:
                    assert "being changed" in str(exc) or "being read" in str(exc), exc
        ts = [threading.Thread(target=writer, args=(w,)) for w in (1, 2)]
        for t in ts: t.start()
        for t in ts: t.join()
        toks = ix.tokens
        assert toks.size == size * len(applied) == len(ix)
        seen = []
        for i in range(0, toks.size, size):
            piece = toks[i : i + size]
            v = int(piece[1])
            assert (piece[::7] == -1).all() and (np.delete(piece, np.s_[::7]) == v).all(), i
            seen.append(divmod(v, 1_000_000))
        assert sorted(seen) == sorted(applied)
        assert ix.propose(4) == ngi.longest_match(toks, 1, 3, 4).tolist()
        print("ok", len(applied))
        """,
    )
    assert out.startswith("ok")


class _Calling(Sequence):
    """A token sequence whose element reads call ``hook`` once (user code running while
    ``extend`` converts its argument)."""

    def __init__(self, items, hook):
        self.items = list(items)
        self.hook = hook

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return self.items[i]


def test_index_is_guarded_while_extend_converts(ngi):
    """Code run by extend's argument conversion meets a guarded index: every use of the
    index is refused with RuntimeError, and the extend then completes."""
    ix = ngi.NgramIndex(1, 2)
    ix.extend([1, 2, 3, 1, 2])
    seen = []

    def hook():
        for use in (
            lambda: ix.extend([9]),
            lambda: ix.append(9),
            lambda: ix.propose(2),
            lambda: ix.match_length(),
            lambda: ix.tokens,
            lambda: ix.nbytes,
            lambda: ngi.propose_batch([ix], 2),
            lambda: copy.copy(ix),
            lambda: pickle.dumps(ix),
            # the members that only read plain fields are guarded too (one protocol)
            lambda: len(ix),
            lambda: ix.stats,
            lambda: ix.min_n,
            lambda: ix.max_n,
            lambda: ix.prefer,
            lambda: ix.adaptive,
            lambda: ix.draft_len,
            lambda: ix.bytes_per_token,
            lambda: ix.record(1, 0),
            lambda: ngi.record_batch([ix], [1], [0]),
            lambda: ngi.extend_batch([ix], [1], [0, 1]),
            lambda: ix.__init__(1),
        ):
            try:
                use()
            except RuntimeError as exc:
                seen.append(str(exc))
            else:
                seen.append("allowed")

    ix.extend(_Calling([3, 1, 2], hook))
    assert seen and all("NgramIndex is being changed" in s or "only once" in s for s in seen), seen
    assert ix.stats["steps"] == 0
    assert ix.tokens.tolist() == [1, 2, 3, 1, 2, 3, 1, 2]
    assert ix.propose(3) == reference([1, 2, 3, 1, 2, 3, 1, 2], 1, 2, 3)
    ix.extend([3])  # the guard was released
    assert len(ix) == 9


def test_counts_converted_before_the_batch_reads(ngi):
    """max_k's conversion may extend an index: the batch reads it after, consistently."""
    ix = ngi.NgramIndex(1, 2)
    ix.extend([5, 6, 7])

    class K:
        def __index__(self):
            ix.extend([5, 6])
            return 3

    d, o, n = ngi.propose_batch([ix], K())
    assert d.tolist() == [7, 5, 6] == ix.propose(3)


def test_records_from_threads_are_serialised(ngi):
    import threading

    ix = ngi.NgramIndex(1)

    def work():
        for _ in range(2000):
            ix.record(3, 2)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert ix.stats["steps"] == 8000 and ix.stats["drafted"] == 24000


# ---------------------------------------------------------------------------------------
# hostile lists: element code that mutates the container
# ---------------------------------------------------------------------------------------


def test_lists_mutated_by_their_elements(ngi):
    victims = []

    class Evil(int):
        def __eq__(self, other):
            for v in victims:
                v.clear()
            return int(self) == other

        __hash__ = int.__hash__

        def __index__(self):
            for v in victims:
                v.clear()
            return int(self)

    base = [1, 2, 3, 1, 2, 3, 1, 2] * 40
    h = [Evil(x) for x in base]
    offs = [Evil(0), Evil(160), Evil(320)]
    victims[:] = [h, offs]
    want = reference(base, 1, 3, 4)
    got = ngi.longest_match(h, 1, 3, 4)
    assert got in (want, [])  # read as given, or after the elements emptied it
    h[:] = [Evil(x) for x in base]
    ix = ngi.NgramIndex(1, 3)
    try:
        ix.extend(h)
    except (TypeError, ValueError):
        pass
    assert ix.propose(4) == reference(ix.tokens.tolist(), 1, 3, 4)
    h[:] = [Evil(x) for x in base]
    try:
        d, o, n = ngi.longest_match_batch(h, offs, 1, 3, [Evil(4), Evil(4)])
    except (TypeError, ValueError):
        pass
    else:
        assert o[-1] == d.size


# ---------------------------------------------------------------------------------------
# copies and pickles
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_copies_are_independent(ngi, how):
    ix = ngi.NgramIndex(1, 3, adaptive=True)
    ix.extend([1, 2, 3, 1, 2])
    ix.record(4, 4)
    dup = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": lambda x: pickle.loads(pickle.dumps(x))}[how](ix)
    assert type(dup) is type(ix) and dup is not ix
    assert dup.tokens.tolist() == ix.tokens.tolist() and dup.stats == ix.stats
    assert dup.propose() == ix.propose()
    dup.extend([9, 9, 9])
    dup.record(6, 0)
    assert ix.tokens.tolist() == [1, 2, 3, 1, 2]
    assert ix.propose(3) == [3, 1, 2] and ix.match_length() == 2
    assert ix.stats["steps"] == 1 and ix.draft_len == 6
    assert dup.stats["steps"] == 2 and dup.draft_len == 5
    ix.append(3)
    assert dup.tokens.tolist() == [1, 2, 3, 1, 2, 9, 9, 9]


def _reduced(ix):
    fn, args = ix.__reduce__()
    return fn, list(args)


@pytest.mark.parametrize(
    "stats, exc, msg",
    [
        ((-1, 0, 0, 0), ValueError, "steps must be a non-negative integer"),
        ((1, 2, 3, 0), ValueError, "accepted=3 is beyond drafted=2"),
        ((1, 4, 4, 2), ValueError, "full_accepts=2 is beyond steps=1"),
        ((0, 4, 0, 0), ValueError, "drafted=4 with no recorded step"),
        ((1, 2, 3), ValueError, "must hold 4 counts"),
        ((1, 2, 2, 1, 0), ValueError, "must hold 4 counts"),
        ([1, 2, 2, 1], TypeError, "stats must be a tuple"),
        ((1, 2**63, 0, 0), OverflowError, "beyond int64"),
        ((1, 2.0, 0, 0), TypeError, "drafted must be a non-negative integer"),
    ],
)
def test_unpickler_refuses_made_up_stats(ngi, stats, exc, msg):
    ix = ngi.NgramIndex(1, 2)
    ix.extend([1, 2, 1])
    fn, args = _reduced(ix)
    args[-1] = stats
    with pytest.raises(exc, match=msg):
        fn(*args)
    with pytest.raises(exc, match=msg):
        ix._restore_stats(stats)
    assert ix.stats["steps"] == 0


def test_unpickler_refuses_other_settings(ngi):
    ix = ngi.NgramIndex(1, 2, draft_len=3)
    fn, args = _reduced(ix)
    bad = list(args)
    bad[0] = dict
    with pytest.raises(TypeError, match="cannot rebuild an NgramIndex"):
        fn(*bad)
    bad = list(args)
    bad[4] = 99  # draft_len beyond max_draft
    with pytest.raises(ValueError, match="draft_len must lie in"):
        fn(*bad)
    bad = list(args)
    bad[1] = 0
    with pytest.raises(ValueError, match="min_n must be at least 1"):
        fn(*bad)
    bad = list(args)
    bad[8] = np.array([[1, 2]])
    with pytest.raises(ValueError, match="must be 1-D"):
        fn(*bad)


def test_record_refuses_overflowing_totals(ngi):
    ix = ngi.NgramIndex(1)
    ix.record(2**62, 0)
    ix.record(2**62 - 1, 0)
    with pytest.raises(OverflowError, match="beyond int64"):
        ix.record(1, 0)
    with pytest.raises(OverflowError, match="beyond int64"):
        ngi.record_batch([ix], [1], [0])
    assert ix.stats["drafted"] == 2**63 - 1 and ix.stats["steps"] == 2


# ---------------------------------------------------------------------------------------
# very large n: linear work per token
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [10_000, 2**20, 2**31 - 2])
@pytest.mark.parametrize("kind", ["random", "constant", "repeats"])
def test_large_n_costs_constant_work_per_token(ngi, n, kind):
    """Hashing and comparison steps per appended token stay bounded by a constant (the
    old chained hash spent min(len, n) steps per token: about 10**10 here)."""
    if not ngi.__name__.startswith("specfsm._core"):
        pytest.skip("the twin builds each n-gram as a tuple (O(n) per token) by design; "
                    "only the compiled index counts its steps")
    rng = np.random.default_rng(n)
    size = 150_000
    if kind == "random":
        s = rng.integers(0, 1 << 40, size=size)
    elif kind == "constant":
        s = np.zeros(size, dtype=np.int64)
    else:
        s = np.tile(rng.integers(0, 50, size=12_000), size // 12_000 + 1)[:size]
    ix = ngi.NgramIndex(n)
    assert ix._work_done == 0
    for part in np.array_split(s, 7):
        ix.extend(part)
    assert ix._work_done <= 4 * size
    if n == 10_000:
        assert ix.propose(5) == ngi.longest_match(s, n, n, 5).tolist()


def test_wide_range_work_is_linear_in_levels(ngi):
    if not ngi.__name__.startswith("specfsm._core"):
        pytest.skip("only the compiled index counts its steps")
    ix = ngi.NgramIndex(5_000, 5_099)
    assert ix._work_done == 0
    s = np.zeros(30_000, dtype=np.int64)
    ix.extend(s)
    assert ix._work_done <= 4 * 100 * s.size
    assert ix.propose(3) == [0] == ngi.longest_match(s, 5_000, 5_099, 3).tolist()
    assert ix.match_length() == 5_099


@SETTINGS
@given(
    chunks=st.lists(st.lists(st.integers(0, 2), max_size=60), min_size=1, max_size=6),
    lo=st.integers(30, 40),
    span=st.integers(0, 4),
    prefer=st.sampled_from(["latest", "earliest"]),
)
def test_long_ngrams_equal_reference(impl, chunks, lo, span, prefer):
    """min_n past the rolling-hash threshold, over streams with long repeats."""
    ngi = impl.module("ngram_index")
    ix = ngi.NgramIndex(lo, lo + span, prefer)
    h: list[int] = []
    for c in chunks:
        c = (c * 30)[: 30 + len(c)]
        ix.extend(c)
        h += c
        assert ix.propose(5) == reference(h, lo, lo + span, 5, prefer)


def test_record_batch_is_all_or_nothing(ngi):
    """record_batch checks every index's guard and drafted total (an index listed twice
    adds up) before it changes any (today's code recorded the first indexes, then
    refused a later one)."""
    a, b = ngi.NgramIndex(1), ngi.NgramIndex(1)
    b.record(2**63 - 2, 0)
    with pytest.raises(OverflowError):
        ngi.record_batch([a, b], [1, 2], [1, 0])
    with pytest.raises(OverflowError):
        ngi.record_batch([a, a], [2**62, 2**62], [0, 0])
    assert a.stats["steps"] == 0 and b.stats["steps"] == 1
    ngi.record_batch([a, a], [2**62, 2**62 - 1], [0, 0])
    assert a.stats["drafted"] == 2**63 - 1
    assert pickle.loads(pickle.dumps(a)).stats == a.stats


def test_uninitialised_or_reinitialised_index(ngi):
    """An NgramIndex made with __new__ refuses every call (its length, sizes and
    pickling included) on both implementations; a second __init__ is refused and
    changes nothing (tests/test_guard.py checks every public name)."""
    raw = ngi.NgramIndex.__new__(ngi.NgramIndex)
    for use in (lambda: len(raw), lambda: raw.nbytes, lambda: raw.tokens, lambda: raw.propose(),
                lambda: raw.extend([1]), lambda: pickle.dumps(raw), lambda: raw.stats,
                lambda: ngi.propose_batch([raw]), lambda: ngi.record_batch([raw], [1], [0])):
        with pytest.raises(RuntimeError, match="not initialised"):
            use()
    ix = ngi.NgramIndex(1, 2)
    ix.extend([1, 2, 1])
    with pytest.raises(RuntimeError, match="only once"):
        ix.__init__(3, 4, "earliest")
    assert (ix.min_n, ix.max_n, ix.prefer, ix.propose(2)) == (1, 2, "latest", [2, 1])
