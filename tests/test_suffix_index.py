"""The suffix-automaton drafter, both implementations.

Every draft is checked against ``reference`` below: a plain brute-force transcription
of the rule in ``specfsm.drafting.suffix_index``'s docstring, and ``anchored`` for the anchor.
"""

from __future__ import annotations

import copy
import pickle
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PREFERS = ("latest", "earliest")
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(h, min_n, max_n, prefer):
    """(n, e): the largest n <= max_n (None: no cap) whose last-n tokens also occur as
    h[e-n:e] with e <= len - 1, and that n's largest (latest) or smallest (earliest) e;
    (0, -1) when no n >= min_n has such an occurrence."""
    h = list(h)
    L = len(h)
    top = L - 1 if max_n is None else min(max_n, L - 1)
    for n in range(top, min_n - 1, -1):
        needle = h[L - n :]
        ends = [e for e in range(n, L) if h[e - n : e] == needle]
        if ends:
            return n, (ends[-1] if prefer == "latest" else ends[0])
    return 0, -1


def reference_runs(h, min_n, prefer):
    """``reference`` with no cap, measured per candidate end (the common run of tokens
    ending at e and at len): same answer, less time on long streams."""
    L = len(h)
    best, pos = 0, -1
    order = range(L - 1, 0, -1) if prefer == "latest" else range(1, L)
    for e in order:
        m = 0
        while m < e and h[e - 1 - m] == h[L - 1 - m]:
            m += 1
        if m > best:
            best, pos = m, e
    return (best, pos) if best >= min_n else (0, -1)


class Anchored:
    """The reference with the anchor: fed one token at a time, it keeps the anchor as
    the docstring says, recomputing the match by brute force after every token."""

    def __init__(self, min_n, max_n, prefer, an, span, misses):
        self.h = []
        self.args = (min_n, max_n, prefer)
        self.an, self.span, self.miss = an, span, misses
        self.anchor, self.carry, self.misses = -1, 0, 0
        self.n, self.e = 0, -1

    def add(self, t):
        self.h.append(t)
        self.n, self.e = reference(self.h, *self.args)
        if not self.an:
            return
        if self.e >= 0 and self.n >= self.an:
            self.anchor, self.carry, self.misses = self.e, 0, 0
        elif self.anchor >= 0 and self.carry <= self.span and self.misses <= self.miss:
            if self.h[self.anchor] != t:
                self.misses += 1
            self.anchor += 1
            self.carry += 1

    def start(self):
        if self.an and self.anchor >= 0 and self.carry <= self.span and self.misses <= self.miss:
            return self.anchor
        return self.e

    def draft(self, k):
        s = self.start()
        return [] if s < 0 or k == 0 else self.h[s : s + k]


@pytest.fixture
def sfx(impl):
    return impl.module("suffix_index")


# ---------------------------------------------------------------------------------------
# hand-checked cases
# ---------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(h=st.lists(st.integers(0, 2), max_size=30), lo=st.integers(1, 3), prefer=st.sampled_from(PREFERS))
def test_the_two_references_agree(h, lo, prefer):
    assert reference_runs(h, lo, prefer) == reference(h, lo, None, prefer)


def test_reference_by_hand():
    h = [1, 2, 3, 9, 1, 2, 3, 7, 2, 3]
    # the suffix (2, 3) ends earlier at 3 and 7; (7, 2, 3) never occurred
    assert reference(h, 1, None, "latest") == (2, 7)
    assert reference(h, 1, None, "earliest") == (2, 3)
    assert reference(h, 3, None, "earliest") == (0, -1)
    # one token repeated: the longest earlier occurrence overlaps the suffix
    assert reference([5, 5, 5, 5], 1, None, "latest") == (3, 3)
    assert reference([5, 5, 5, 5], 1, 2, "latest") == (2, 3)
    assert reference([5, 5, 5, 5], 1, 2, "earliest") == (2, 2)
    assert reference([1, 2], 1, None, "latest") == (0, -1)


@pytest.mark.parametrize("prefer", PREFERS)
def test_index_by_hand(sfx, prefer):
    ix = sfx.SuffixIndex(1, None, prefer)
    assert ix.propose(4) == [] and ix.match_length() == 0 and ix.match_end() == -1
    h = [1, 2, 3, 9, 1, 2, 3, 7, 2, 3]
    ix.extend(h)
    n, e = reference(h, 1, None, prefer)
    assert ix.match_length() == n == 2
    assert ix.match_end() == e
    assert ix.propose(3) == h[e : e + 3]
    assert ix.propose(0) == []
    assert ix.propose() == h[e : e + ix.draft_len]
    assert len(ix) == 10 and ix.tokens.tolist() == h
    # a long repeat: the unbounded match follows it all the way
    ix = sfx.SuffixIndex(1, None, prefer)
    block = list(range(100))
    ix.extend(block + [7] + block[:90])
    assert ix.match_length() == 90 and ix.propose(5) == [90, 91, 92, 93, 94]


def test_anchor_by_hand(sfx):
    # a copy with one token substituted: the anchor keeps drafting the copy's continuation
    src = list(range(40))
    ix = sfx.SuffixIndex(1, None, "earliest", anchor_n=8, anchor_span=16, anchor_misses=1)
    plain = sfx.SuffixIndex(1, None, "earliest")
    hist = src + src[:20] + [99]
    ix.extend(hist)
    plain.extend(hist)
    assert plain.propose(3) == []            # 99 never occurred
    assert ix.propose(3) == [21, 22, 23]     # as if 99 replaced 20
    ix.extend([21, 22])
    assert ix.propose(2) == [23, 24]
    # a second mismatch beyond anchor_misses=1 drops the anchor
    ix.extend([77])
    assert ix.match_end() == -1 and ix.propose(2) == []
    assert (ix.anchor_n, ix.anchor_span, ix.anchor_misses) == (8, 16, 1)


def test_settings_reported(sfx):
    ix = sfx.SuffixIndex(2, 9, "latest", draft_len=3, adaptive=True, min_draft=2, max_draft=6)
    assert (ix.min_n, ix.max_n, ix.prefer, ix.draft_len, ix.adaptive) == (2, 9, "latest", 3, True)
    assert sfx.SuffixIndex().max_n is None and sfx.SuffixIndex().prefer == "earliest"
    assert "SuffixIndex(min_n=2, max_n=9" in repr(ix)


# ---------------------------------------------------------------------------------------
# property tests: compiled == twin == brute force after every extend
# ---------------------------------------------------------------------------------------

chunks_st = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=8)


@SETTINGS
@given(
    chunks=chunks_st,
    lo=st.integers(1, 4),
    cap=st.one_of(st.none(), st.integers(0, 6)),
    prefer=st.sampled_from(PREFERS),
    ks=st.lists(st.integers(0, 9), min_size=1, max_size=3),
    as_array=st.booleans(),
)
def test_index_equals_reference(impl, chunks, lo, cap, prefer, ks, as_array):
    from specfsm.drafting import _suffix_index_py as twin

    sfx = impl.module("suffix_index")
    hi = None if cap is None else lo + cap
    ix = sfx.SuffixIndex(lo, hi, prefer)
    tw = twin.SuffixIndex(lo, hi, prefer)
    h = []
    for chunk in chunks:
        ix.extend(np.array(chunk, dtype=np.int64) if as_array else chunk)
        tw.extend(chunk)
        h += chunk
        n, e = reference(h, lo, hi, prefer)
        assert ix.match_length() == tw.match_length() == n
        assert ix.match_end() == tw.match_end() == e
        for k in ks:
            want = [] if e < 0 or k == 0 else h[e : e + k]
            assert ix.propose(k) == tw.propose(k) == want


@SETTINGS
@given(
    stream=st.lists(st.integers(0, 2), min_size=1, max_size=60),
    lo=st.integers(1, 3),
    prefer=st.sampled_from(PREFERS),
    an=st.integers(0, 5),
    span=st.integers(0, 6),
    misses=st.integers(0, 3),
    k=st.integers(1, 6),
)
def test_anchor_equals_reference(impl, stream, lo, prefer, an, span, misses, k):
    sfx = impl.module("suffix_index")
    ix = sfx.SuffixIndex(lo, None, prefer, anchor_n=an, anchor_span=span, anchor_misses=misses)
    ref = Anchored(lo, None, prefer, an, span, misses)
    for t in stream:
        ix.append(t)
        ref.add(t)
        assert ix.match_end() == ref.start()
        assert ix.propose(k) == ref.draft(k)


@SETTINGS
@given(
    stream=st.lists(st.integers(0, 4), max_size=80),
    lo=st.integers(1, 3),
    span=st.integers(0, 5),
    prefer=st.sampled_from(PREFERS),
    k=st.integers(0, 7),
)
def test_finite_max_n_equals_ngram_longest_match(impl, stream, lo, span, prefer, k):
    """With a cap, the rule is exactly ``ngram_index.longest_match``'s."""
    sfx = impl.module("suffix_index")
    ngi = impl.module("ngram_index")
    ix = sfx.SuffixIndex(lo, lo + span, prefer)
    for i, t in enumerate(stream):
        ix.append(t)
        assert ix.propose(k) == ngi.longest_match(stream[: i + 1], lo, lo + span, k, prefer)


@pytest.mark.parametrize("prefer", PREFERS)
@pytest.mark.parametrize("vocab", [2, 5, 50_000])
def test_long_random_stream_every_step(impl, prefer, vocab):
    """A few thousand tokens extended in uneven pieces (small vocabularies force deep
    automata and many clones; a large one many root edges), checked against the twin
    after every piece and against brute force at sampled points."""
    from specfsm.drafting import _suffix_index_py as twin

    sfx = impl.module("suffix_index")
    rng = np.random.default_rng(vocab)
    base = rng.integers(0, vocab, size=400)
    stream = np.concatenate([base, base[50:300], rng.integers(0, vocab, size=300), base[:200]])
    ix, tw = sfx.SuffixIndex(1, None, prefer), twin.SuffixIndex(1, None, prefer)
    i = 0
    step = 1
    while i < len(stream):
        piece = stream[i : i + step]
        ix.extend(piece)
        tw.extend(piece.tolist())
        i += len(piece)
        assert ix.propose(9) == tw.propose(9)
        assert ix.match_length() == tw.match_length()
        if step % 5 == 0:
            n, e = reference_runs(stream[:i].tolist(), 1, prefer)
            assert ix.match_length() == n and ix.match_end() == e
        step = step % 23 + 1
    assert ix.n_states == tw.n_states <= 2 * len(stream)


def test_implementations_agree(impl):
    if impl.name == "python":
        pytest.skip("compares the compiled index with the twin; on the twin run it would compare the twin with itself")
    from specfsm.drafting import _suffix_index_py as twin

    sfx = impl.module("suffix_index")
    rng = np.random.default_rng(11)
    stream = rng.integers(0, 6, size=3000)
    for prefer in PREFERS:
        for hi in (None, 3, 40):
            a = sfx.SuffixIndex(1, hi, prefer, anchor_n=6)
            b = twin.SuffixIndex(1, hi, prefer, anchor_n=6)
            for i in range(0, 3000, 37):
                a.extend(stream[i : i + 37])
                b.extend(stream[i : i + 37].tolist())
                assert a.propose(6) == b.propose(6)
                assert a.match_end() == b.match_end()


def test_big_and_negative_ids(sfx):
    big = [2**63 - 1, -(2**63), 0, 2**40]
    ix = sfx.SuffixIndex(1)
    ix.extend(big + big[:3])
    assert ix.propose(4) == [2**40, 2**63 - 1, -(2**63), 0]
    ix.extend(np.array([5, 6], dtype=np.int32))
    ix.append(np.int64(7))
    assert ix.tokens.tolist()[-3:] == [5, 6, 7]


def test_tokens_view_survives_growth(sfx):
    ix = sfx.SuffixIndex(1)
    ix.extend([1, 2, 3])
    v = ix.tokens
    ix.extend(list(range(10_000)))
    assert v.tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        v[0] = 5


# ---------------------------------------------------------------------------------------
# batches, statistics, pickling
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(
    streams=st.lists(st.lists(st.integers(0, 3), max_size=30), max_size=6),
    k=st.integers(0, 6),
    per_request=st.booleans(),
)
def test_propose_batch_equals_per_index(impl, streams, k, per_request):
    sfx = impl.module("suffix_index")
    ixs = []
    for s in streams:
        ix = sfx.SuffixIndex(1, None, "earliest", draft_len=3)
        ix.extend(s)
        ixs.append(ix)
    ks = [k + i % 3 for i in range(len(ixs))] if per_request else k
    drafts, off, lengths = sfx.propose_batch(ixs, ks)
    assert drafts.dtype == np.int64 and off.shape == (len(ixs) + 1,)
    for i, ix in enumerate(ixs):
        want = ix.propose(ks[i] if per_request else k)
        assert drafts[off[i] : off[i + 1]].tolist() == want and lengths[i] == len(want)
    drafts, off, _ = sfx.propose_batch(ixs)  # each index's draft_len
    for i, ix in enumerate(ixs):
        assert drafts[off[i] : off[i + 1]].tolist() == ix.propose()


def test_adaptive_draft_length_and_record_batch(sfx):
    ix = sfx.SuffixIndex(1, draft_len=4, adaptive=True, min_draft=2, max_draft=9)
    assert ix.record(4, 4) == 6 and ix.record(6, 6) == 8 and ix.record(8, 8) == 9
    assert ix.record(9, 3) == 8
    for _ in range(10):
        ix.record(5, 0)
    assert ix.draft_len == 2
    st_ = ix.stats
    assert st_["steps"] == 14 and st_["full_accepts"] == 3 and st_["accepted"] == 21
    fixed = sfx.SuffixIndex(1, draft_len=4)
    assert fixed.record(4, 4) == 4 and fixed.stats["drafted"] == 4
    out = sfx.record_batch([ix, fixed], [3, 2], [3, 1])
    assert out.tolist() == [4, 4]
    with pytest.raises(ValueError, match="accepted"):
        sfx.record_batch([ix], [1], [2])
    with pytest.raises(ValueError, match="accepted"):
        ix.record(2, 3)


@pytest.mark.parametrize("prefer", PREFERS)
def test_pickle_and_copy(sfx, prefer):
    ix = sfx.SuffixIndex(2, 30, prefer, draft_len=5, adaptive=True, anchor_n=4, anchor_span=9, anchor_misses=2)
    rng = np.random.default_rng(5)
    ix.extend(rng.integers(0, 4, size=500))
    ix.record(5, 5)
    for other in (pickle.loads(pickle.dumps(ix)), copy.copy(ix), copy.deepcopy(ix)):
        assert type(other) is type(ix)
        assert other.tokens.tolist() == ix.tokens.tolist()
        assert other.propose(7) == ix.propose(7) and other.stats == ix.stats
        assert (other.anchor_n, other.anchor_span, other.anchor_misses) == (4, 9, 2)
        other.extend([1, 2, 3])
        assert len(other) == len(ix) + 3  # independent of the original


def test_unpickling_refuses_made_up_state(sfx):
    ix = sfx.SuffixIndex(1)
    ix.extend([1, 2, 1, 2])
    fn, args = ix.__reduce__()
    for bad in [(-1, 0, 0, 0), (1, 2, 3, 0), (1, 5, 5, 2), (1, 2), "x", (1.5, 2, 1, 0)]:
        with pytest.raises((ValueError, TypeError)):
            fn(*args[:9], bad, *args[10:])
    with pytest.raises(TypeError):
        fn(dict, *args[1:])
    with pytest.raises(ValueError, match="min_n"):
        fn(args[0], 0, *args[2:])


# ---------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------


def test_bad_arguments(sfx):
    S = sfx.SuffixIndex
    with pytest.raises(ValueError, match="min_n must be at least 1, got 0"):
        S(0)
    with pytest.raises(ValueError, match="min_n must not exceed max_n"):
        S(5, 3)
    with pytest.raises(TypeError, match="min_n"):
        S(1.5)
    with pytest.raises(TypeError, match="max_n"):
        S(1, "9")
    with pytest.raises(ValueError, match="prefer"):
        S(1, None, "newest")
    with pytest.raises(ValueError, match="anchor_n"):
        S(1, anchor_n=-1)
    with pytest.raises(TypeError, match="anchor_span"):
        S(1, anchor_span=2.0)
    with pytest.raises(ValueError, match="draft_len"):
        S(1, draft_len=50, max_draft=10)
    ix = S(1)
    ix.extend([1, 2, 1])
    with pytest.raises(ValueError, match="max_k"):
        ix.propose(-1)
    with pytest.raises(TypeError, match="max_k"):
        ix.propose(2.0)
    with pytest.raises(TypeError, match="max_k"):
        ix.propose(True)
    assert ix.propose(10**30) == [2, 1]


@pytest.mark.parametrize(
    "tokens, exc, msg",
    [
        ([1.5], TypeError, "tokens"),
        ([True], TypeError, "tokens"),
        (["a"], TypeError, "tokens"),
        ([[1, 2]], ValueError, "tokens"),
        (np.zeros((2, 2), dtype=np.int64), ValueError, "tokens"),
        (np.array([1.0]), TypeError, "tokens"),
        ([2**63], OverflowError, "tokens"),
        (5, TypeError, "tokens"),
        ("abc", TypeError, "tokens"),
    ],
)
def test_bad_tokens(sfx, tokens, exc, msg):
    ix = sfx.SuffixIndex(1)
    ix.extend([1, 2, 1])
    with pytest.raises(exc, match=msg):
        ix.extend(tokens)
    # a refused extend leaves the index as it was and usable
    assert len(ix) == 3 and ix.propose(2) == [2, 1]
    ix.append(2)
    assert ix.propose(2) == [1, 2]


def test_bad_batch_arguments(sfx):
    ix = sfx.SuffixIndex(1)
    with pytest.raises(TypeError, match="single SuffixIndex"):
        sfx.propose_batch(ix)
    with pytest.raises(TypeError, match=r"indexes\[1\]"):
        sfx.propose_batch([ix, object()])
    with pytest.raises(TypeError, match="sequence"):
        sfx.propose_batch(5)
    with pytest.raises(ValueError, match="max_k"):
        sfx.propose_batch([ix], [1, 2])
    with pytest.raises(ValueError, match="max_k"):
        sfx.propose_batch([ix], [-1])
    with pytest.raises(TypeError, match="max_k"):
        sfx.propose_batch([ix], 1.5)
    d, off, ln = sfx.propose_batch([])
    assert d.size == 0 and off.tolist() == [0] and ln.size == 0


def test_index_from_other_implementation_refused(impl):
    if impl.name == "python":
        pytest.skip("only the compiled module has a second class to mix up")
    from specfsm.drafting import _suffix_index_py as twin

    sfx = impl.module("suffix_index")
    with pytest.raises(TypeError, match="same implementation"):
        sfx.propose_batch([twin.SuffixIndex(1)])


def test_twin_has_the_same_names(impl):
    from specfsm.drafting import _suffix_index_py as twin

    sfx = impl.module("suffix_index")
    assert list(sfx.__all__) == list(twin.__all__)
    public = {n for n in dir(twin.SuffixIndex) if not n.startswith("_")}
    assert public <= set(dir(sfx.SuffixIndex))


# ---------------------------------------------------------------------------------------
# threads (compiled: refused or serialised, never torn; the twin holds the GIL per call)
# ---------------------------------------------------------------------------------------


def test_concurrent_extend_and_propose(sfx):
    rng = np.random.default_rng(9)
    ix = sfx.SuffixIndex(1, None, "latest")
    pieces = [rng.integers(0, 50, size=4000) for _ in range(6)]
    done, errors, refused = [], [], []

    def writer(p):
        try:
            ix.extend(p)
            done.append(p)
        except RuntimeError as exc:
            assert "thread" in str(exc)
            refused.append(p)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader():
        try:
            for _ in range(300):
                try:
                    d = ix.propose(8)
                    assert len(d) <= 8
                    sfx.propose_batch([ix, ix], 4)
                except RuntimeError as exc:
                    assert "thread" in str(exc)
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(p,)) for p in pieces]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(done) + len(refused) == len(pieces) and done
    # what went in went in whole: the index equals one built from its own tokens
    fresh = sfx.SuffixIndex(1, None, "latest")
    fresh.extend(ix.tokens)
    assert len(ix) == sum(len(p) for p in done)
    assert ix.propose(8) == fresh.propose(8) and ix.match_length() == fresh.match_length()



def reference_lookup(h, ctx, min_n, max_n, k):
    """The longest suffix of ctx (min_n..max_n tokens) occurring anywhere in h, and the
    k tokens after its first occurrence."""
    top = len(ctx) if max_n is None else min(max_n, len(ctx))
    for n in range(top, max(min_n, 1) - 1, -1):
        needle = ctx[len(ctx) - n :]
        ends = [e for e in range(n, len(h) + 1) if h[e - n : e] == needle]
        if ends:
            return n, h[ends[0] : ends[0] + k]
    return 0, []


@SETTINGS
@given(
    h=st.lists(st.integers(0, 3), max_size=40),
    ctxs=st.lists(st.lists(st.integers(0, 4), max_size=12), min_size=1, max_size=4),
    lo=st.integers(1, 3),
    cap=st.one_of(st.none(), st.integers(0, 4)),
    k=st.integers(0, 6),
)
def test_lookup_equals_reference(impl, h, ctxs, lo, cap, k):
    sfx = impl.module("suffix_index")
    hi = None if cap is None else lo + cap
    ix = sfx.SuffixIndex(lo, hi)
    ix.extend(h)
    for ctx in ctxs:
        n, d = ix.lookup(ctx, k)
        assert (n, d) == reference_lookup(h, ctx, lo, hi, k)
        assert ix.lookup(np.array(ctx, dtype=np.int32), k) == (n, d)


def test_lookup_refusals(sfx):
    ix = sfx.SuffixIndex(1)
    ix.extend([1, 2, 3])
    assert ix.lookup([1, 2], None) == (2, [3])
    with pytest.raises(TypeError, match="context"):
        ix.lookup([1.5])
    with pytest.raises(ValueError, match="max_k"):
        ix.lookup([1], -2)


def test_uninitialised_or_reinitialised_index(impl):
    """An index made with __new__ refuses every call (sizes and length included) on
    both implementations; a second __init__ is refused (tests/test_guard.py checks every
    public name)."""
    S = impl.module("suffix_index").SuffixIndex
    raw = S.__new__(S)
    for call in (lambda: raw.propose(2), lambda: raw.extend([1]), lambda: raw.append(1),
                 lambda: raw.lookup([1]), lambda: raw.match_end(), lambda: pickle.dumps(raw),
                 lambda: raw.nbytes, lambda: len(raw)):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()
    ix = S(1)
    with pytest.raises(RuntimeError, match="only once"):
        ix.__init__(2)


# ---------------------------------------------------------------------------------------
# the compact layout: int32 history until a token needs int64, implicit transitions
# ---------------------------------------------------------------------------------------

# ids that agree in their low 32 bits (the edge table hashes those), negative ones, and
# ids beyond int32 that switch the history to int64 when they arrive
WIDE_IDS = [0, 1, 2, 2**32, 2**32 + 1, -(2**32) + 2, 2**40 + 1, -(2**63), 2**63 - 1]


@SETTINGS
@given(
    narrow=st.lists(st.integers(0, 2), max_size=25),
    chunks=st.lists(st.lists(st.sampled_from(WIDE_IDS), max_size=10), min_size=1, max_size=5),
    lo=st.integers(1, 3),
    cap=st.one_of(st.none(), st.integers(0, 5)),
    prefer=st.sampled_from(PREFERS),
    as_array=st.booleans(),
)
def test_wide_ids_equal_reference(impl, narrow, chunks, lo, cap, prefer, as_array):
    """Small ids first, then ids beyond int32 (the history turns int64 mid-stream) and
    ids sharing their low 32 bits: compiled == twin == brute force after every extend."""
    from specfsm.drafting import _suffix_index_py as twin

    sfx = impl.module("suffix_index")
    hi = None if cap is None else lo + cap
    ix, tw = sfx.SuffixIndex(lo, hi, prefer), twin.SuffixIndex(lo, hi, prefer)
    h = list(narrow)
    ix.extend(narrow)
    tw.extend(narrow)
    for chunk in chunks:
        ix.extend(np.array(chunk, dtype=np.int64) if as_array else chunk)
        tw.extend(chunk)
        h += chunk
        n, e = reference(h, lo, hi, prefer)
        assert ix.match_length() == tw.match_length() == n
        assert ix.match_end() == tw.match_end() == e
        assert ix.propose(4) == tw.propose(4) == ([] if e < 0 else h[e : e + 4])
        assert ix.tokens.tolist() == h and ix.tokens.dtype == np.int64
        assert ix.n_states == tw.n_states and ix.n_edges == tw.n_edges
        for ctx in (h[-3:], [2**32 + 2, 2], [-(2**32) + 1]):
            assert ix.lookup(ctx, 3) == tw.lookup(ctx, 3)


def test_lookup_on_a_narrow_index_tells_ids_beyond_int32_apart(sfx):
    ix = sfx.SuffixIndex(1)
    ix.extend([1, 2, 3, 1, 2, 4])
    assert ix.lookup([9, 1, 2], 3) == (2, [3, 1, 2])
    assert ix.lookup([2**32 + 1, 2**32 + 2], 3) == (0, [])
    assert ix.lookup([1, 2**32 + 2], 3) == (0, [])
    assert ix.lookup([2**32 + 1, 2], 3) == (1, [3, 1, 2])
    ix.append(2**32 + 3)                        # widens: same answers
    assert ix.lookup([9, 1, 2], 3) == (2, [3, 1, 2])
    assert ix.lookup([4, 2**32 + 3], 1) == (2, []) and ix.propose(3) == []
    assert ix.tokens.tolist() == [1, 2, 3, 1, 2, 4, 2**32 + 3]


@pytest.mark.parametrize("prefer", PREFERS)
def test_counts_equal_the_twins(impl, prefer):
    """The compiled automaton keeps position states and most transitions implicit; it
    still has exactly the twin's states and transitions."""
    from specfsm.drafting import _suffix_index_py as twin

    sfx = impl.module("suffix_index")
    rng = np.random.default_rng(4)
    base = rng.integers(0, 40, size=300)
    stream = np.concatenate([base, base[20:250], rng.integers(0, 7, size=400), base])
    ix, tw = sfx.SuffixIndex(1, None, prefer), twin.SuffixIndex(1, None, prefer)
    for i in range(0, len(stream), 97):
        ix.extend(stream[i : i + 97])
        tw.extend(stream[i : i + 97].tolist())
        assert (ix.n_states, ix.n_edges) == (tw.n_states, tw.n_edges)
        assert ix.propose(8) == tw.propose(8)
    assert ix.nbytes > 0 and ix.bytes_per_token == ix.nbytes / len(ix)


def test_last_tokens(sfx):
    ix = sfx.SuffixIndex(1)
    assert ix.last_tokens(3).tolist() == []
    ix.extend([5, 6, 7])
    assert ix.last_tokens(2).tolist() == [6, 7] and ix.last_tokens(0).tolist() == []
    out = ix.last_tokens(10)
    assert out.tolist() == [5, 6, 7] and out.dtype == np.int64
    out[0] = 99                                 # a copy: the index is unchanged
    assert ix.tokens.tolist() == [5, 6, 7]
    with pytest.raises(ValueError, match="count"):
        ix.last_tokens(-1)
    with pytest.raises(TypeError, match="count"):
        ix.last_tokens(1.5)


# ---------------------------------------------------------------------------------------
# safety: lists changed under extend, guarded reads, counts, the shared cache
# ---------------------------------------------------------------------------------------
WIDEN_RACE = """
import gc
from specfsm import _impl
sfx = _impl.kernels(IMPL, "suffix_index")
for clear in (True, False):
    ix = sfx.SuffixIndex(1)
    ix.extend(list(range(10)))          # room for 56: the list below needs no growing
    first = [0] * 5 + [2**40] + [0] * 34   # the sixth token needs the int64 buffer
    lst = list(first)
    armed = [True]
    def cb(phase, info):
        # the first collection inside extend (a numpy or memoryview allocation, as when
        # another thread runs while numpy has released the GIL) rewrites the list
        if armed[0] and phase == "start":
            armed[0] = False
            if clear:
                lst.clear()
            else:
                lst.extend([1] * 1000)
    gc.callbacks.append(cb)
    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        ix.extend(lst)
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(cb)
    assert not armed[0], "no collection ran inside extend"
    t = ix.tokens.tolist()
    assert t[:10] == list(range(10)), t[:20]
    assert t[10:] in (first, list(lst)), (clear, len(t))
    fresh = sfx.SuffixIndex(1)
    fresh.extend(t)
    assert ix.propose(8) == fresh.propose(8)
print("ok")
"""


def test_extend_never_reads_a_list_after_numpy_ran(impl):
    """extend over a short list of exact ints reads it in C; a token that needs the
    int64 buffer meets numpy (which may run the garbage collector, or release the GIL
    to another thread), and the list cleared or grown meanwhile must never be read
    again (today's code read the cleared list's freed items and crashed)."""
    from isolated import run_isolated

    assert run_isolated(WIDEN_RACE, impl.name).strip().endswith("ok")


def _every_use(sfx, ix):
    """Every public method and property of a SuffixIndex, and the batch calls, on ix."""
    return {
        "__init__": lambda: ix.__init__(1),
        "__len__": lambda: len(ix),
        "extend": lambda: ix.extend([9]),
        "append": lambda: ix.append(9),
        "propose": lambda: ix.propose(2),
        "propose_tree": lambda: ix.propose_tree(4),
        "lookup": lambda: ix.lookup([1, 2]),
        "match_length": lambda: ix.match_length(),
        "match_end": lambda: ix.match_end(),
        "record": lambda: ix.record(1, 0),
        "last_tokens": lambda: ix.last_tokens(2),
        **{name: (lambda name=name: getattr(ix, name)) for name in (
            "min_n", "max_n", "prefer", "adaptive", "draft_len", "tokens", "n_edges",
            "n_states", "nbytes", "bytes_per_token", "anchor_n", "anchor_span",
            "anchor_misses", "stats")},
        "pickle": lambda: pickle.dumps(ix),
        "copy": lambda: copy.copy(ix),
        "propose_batch": lambda: sfx.propose_batch([ix], 2),
        "record_batch": lambda: sfx.record_batch([ix], [1], [0]),
        "extend_batch": lambda: sfx.extend_batch([ix], [1], [0, 1]),
    }


def test_every_use_is_refused_while_extend_converts(sfx):
    """Code that runs inside extend (its argument's conversion: a callback, or another
    thread) meets a guarded index: every method and property, the read-only ones
    included (``n_edges`` and its siblings read tables an extend may move), is refused
    with RuntimeError; the extend then completes."""
    from collections.abc import Sequence

    ix = sfx.SuffixIndex(1)
    ix.extend([1, 2, 3, 1, 2])
    seen = {}

    class Calling(Sequence):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            if i >= 3:
                raise IndexError(i)
            if not seen:
                for name, use in _every_use(sfx, ix).items():
                    try:
                        use()
                    except RuntimeError:
                        seen[name] = "refused"
                    else:
                        seen[name] = "allowed"
            return 3

    ix.extend(Calling())
    assert seen and {k for k, v in seen.items() if v != "refused"} == set(), seen
    assert ix.tokens.tolist() == [1, 2, 3, 1, 2, 3, 3, 3]
    assert ix.stats["steps"] == 0 and ix.min_n == 1


def test_record_refuses_to_overflow_the_counts(sfx):
    """record keeps int64 counts and refuses (OverflowError, changing nothing) the one
    that would take the drafted total past int64, as NgramIndex does (today's compiled
    index wrapped negative, the twin grew past int64); every state it reaches pickles
    and copies back."""
    ix = sfx.SuffixIndex(1, adaptive=True)
    ix.extend([1, 2, 1, 2])
    ix.record(2**62, 0)
    before = ix.stats
    for _ in range(2):
        with pytest.raises(OverflowError, match="proposed"):
            ix.record(2**62, 0)
    assert ix.stats == before
    ix.record(2**62 - 1, 2**62 - 1)          # int64's largest total, reachable
    assert ix.stats["drafted"] == 2**63 - 1 and ix.stats["accepted"] == 2**62 - 1
    with pytest.raises(OverflowError):
        ix.record(1, 1)
    ix.record(0, 0)
    for other in (pickle.loads(pickle.dumps(ix)), copy.copy(ix), copy.deepcopy(ix)):
        assert other.stats == ix.stats and other.propose(3) == ix.propose(3)
        assert other.draft_len == ix.draft_len


def test_record_batch_is_all_or_nothing(sfx):
    """record_batch checks every index's total (an index listed twice adds up) before
    it changes any."""
    a, b = sfx.SuffixIndex(1), sfx.SuffixIndex(1)
    b.record(2**63 - 2, 0)
    with pytest.raises(OverflowError):
        sfx.record_batch([a, b], [1, 2], [1, 0])
    with pytest.raises(OverflowError):
        sfx.record_batch([a, a], [2**62, 2**62], [0, 0])
    assert a.stats["steps"] == 0 and b.stats["steps"] == 1
    assert sfx.record_batch([a, a], [2**62, 2**62 - 1], [0, 0]).tolist() == [8, 8]
    assert a.stats["drafted"] == 2**63 - 1
