"""Longest-match drafting and the incremental n-gram index, both implementations.

Every result is checked against ``reference`` below, a plain transcription of the
issue's definition.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PREFERS = ("latest", "earliest")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(h, min_n, max_n, max_k, prefer="latest"):
    """For n from max_n down to min_n, the first n whose last-n tokens occur starting
    before len - n; that n's latest (or first) occurrence; up to max_k tokens after it."""
    h = list(h)
    L = len(h)
    if max_k == 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        needle = h[L - n :] if n <= L else None
        if needle is None:
            continue
        starts = [s for s in range(0, L - n) if h[s : s + n] == needle]
        if starts:
            s = starts[-1] if prefer == "latest" else starts[0]
            return h[s + n : s + n + max_k]
    return []


@pytest.fixture
def ngi(impl):
    return impl.module("ngram_index")


# ---------------------------------------------------------------------------------------
# hand-checked cases
# ---------------------------------------------------------------------------------------


def test_reference_by_hand():
    h = [1, 2, 3, 9, 1, 2, 3, 7, 2, 3]
    # trailing 2-gram (2, 3) occurs at starts 1 and 5; latest -> 5 -> [7, 2], earliest -> 1
    assert reference(h, 2, 2, 2, "latest") == [7, 2]
    assert reference(h, 2, 2, 2, "earliest") == [9, 1]
    # the 3-gram (7, 2, 3) never occurred before: n=3 falls back to n=2
    assert reference(h, 2, 3, 3, "latest") == [7, 2, 3]
    # overlapping occurrences: aaaa, n=2 -> starts 0 and 1 (2 is the trailing one)
    assert reference([5, 5, 5, 5], 2, 2, 4, "latest") == [5]
    assert reference([5, 5, 5, 5], 2, 2, 4, "earliest") == [5, 5]
    assert reference([1, 2], 1, 1, 3) == []


@pytest.mark.parametrize("prefer", PREFERS)
def test_longest_match_by_hand(ngi, prefer):
    h = [1, 2, 3, 9, 1, 2, 3, 7, 2, 3]
    for lo, hi in [(1, 1), (2, 2), (2, 3), (1, 4), (3, 5)]:
        for k in (0, 1, 2, 5, 100):
            want = reference(h, lo, hi, k, prefer)
            assert ngi.longest_match(h, lo, hi, k, prefer) == want
            got = ngi.longest_match(np.array(h, dtype=np.int32), lo, hi, k, prefer)
            assert got.dtype == np.int32 and got.tolist() == want


def test_longest_match_types(ngi):
    h = np.array([4, 5, 6, 4, 5], dtype=np.int64)
    out = ngi.longest_match(h, 1, 2, 3)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.tolist() == [6, 4, 5]
    assert ngi.longest_match(tuple(h.tolist()), 1, 2, 3) == [6, 4, 5]
    assert ngi.longest_match(h.astype(np.uint16), 1, 2, 3).tolist() == [6, 4, 5]
    empty = ngi.longest_match(np.array([], dtype=np.int32), 1, 2, 3)
    assert empty.dtype == np.int32 and empty.size == 0
    assert ngi.longest_match([], 1, 1, 3) == []
    assert ngi.longest_match([7], 1, 1, 3) == []
    # a huge max_k is clipped, not refused
    assert ngi.longest_match([1, 2, 1], 1, 1, 2**70) == [2, 1]


def test_index_by_hand(ngi):
    ix = ngi.NgramIndex(2, 3)
    assert len(ix) == 0 and ix.propose(4) == [] and ix.tokens.tolist() == []
    ix.extend([1, 2, 3, 9, 1, 2, 3])
    assert ix.propose(2) == [9, 1]  # 3-gram (1, 2, 3) at start 0
    assert ix.match_length() == 3
    ix.extend(np.array([7, 2, 3], dtype=np.int32))
    assert ix.propose(3) == [7, 2, 3] and ix.match_length() == 2
    assert len(ix) == 10
    assert ix.tokens.tolist() == [1, 2, 3, 9, 1, 2, 3, 7, 2, 3]
    assert ix.tokens.dtype == np.int64 and not ix.tokens.flags.writeable
    ix.append(11)
    assert ix.propose(3) == [] and ix.match_length() == 0
    assert (ix.min_n, ix.max_n, ix.prefer) == (2, 3, "latest")
    assert "NgramIndex(min_n=2, max_n=3" in repr(ix)


def test_index_max_n_defaults_to_min_n(ngi):
    ix = ngi.NgramIndex(3)
    assert (ix.min_n, ix.max_n) == (3, 3)


def test_tokens_view_survives_growth(ngi):
    ix = ngi.NgramIndex(1)
    ix.extend(list(range(10)))
    view = ix.tokens
    ix.extend(list(range(10_000)))
    assert view.tolist() == list(range(10))
    assert ix.tokens[-3:].tolist() == [9997, 9998, 9999]


# ---------------------------------------------------------------------------------------
# equal to prompt_lookup for min_n == max_n, prefer="latest"
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(
    h=st.lists(st.integers(0, 3), max_size=60),
    n=st.integers(1, 5),
    k=st.integers(0, 8),
)
def test_longest_match_equals_prompt_lookup(impl, h, n, k):
    ngi = impl.module("ngram_index")
    want = impl.prompt_lookup(h, n, k)
    assert ngi.longest_match(h, n, n, k, "latest") == want
    arr = np.array(h, dtype=np.int64)
    assert ngi.longest_match(arr, n, n, k).tolist() == impl.prompt_lookup(arr, n, k).tolist()
    ix = ngi.NgramIndex(n)
    ix.extend(h)
    assert ix.propose(k) == want


# ---------------------------------------------------------------------------------------
# property tests: index == longest_match == reference after every extend
# ---------------------------------------------------------------------------------------

small_vocab = st.integers(0, 2)
large_vocab = st.integers(-(2**63), 2**63 - 1)


@st.composite
def streams(draw):
    vocab = draw(st.sampled_from(["small", "mid", "large"]))
    elem = {"small": small_vocab, "mid": st.integers(0, 9), "large": large_vocab}[vocab]
    if vocab == "large":  # a few distinct huge ids, so long matches still happen
        pool = draw(st.lists(large_vocab, min_size=1, max_size=6))
        elem = st.sampled_from(pool)
    chunks = draw(st.lists(st.lists(elem, max_size=12), min_size=1, max_size=8))
    return chunks


@SETTINGS
@given(
    chunks=streams(),
    lo=st.integers(1, 4),
    span=st.integers(0, 3),
    prefer=st.sampled_from(PREFERS),
    ks=st.lists(st.integers(0, 7), min_size=8, max_size=8),
    as_array=st.booleans(),
)
def test_index_equals_longest_match_equals_reference(impl, chunks, lo, span, prefer, ks, as_array):
    ngi = impl.module("ngram_index")
    hi = lo + span
    ix = ngi.NgramIndex(lo, hi, prefer)
    h: list[int] = []
    for step, chunk in enumerate(chunks):
        ix.extend(np.array(chunk, dtype=np.int64) if as_array else chunk)
        h += chunk
        k = ks[step]
        want = reference(h, lo, hi, k, prefer)
        assert ix.propose(k) == want
        assert ngi.longest_match(h, lo, hi, k, prefer) == want
        assert ngi.longest_match(np.array(h, dtype=np.int64), lo, hi, k, prefer).tolist() == want
        assert len(ix) == len(h)
        assert ix.tokens.tolist() == h


@SETTINGS
@given(
    h=st.lists(st.integers(0, 40), max_size=300),
    lo=st.integers(1, 3),
    span=st.integers(0, 4),
    prefer=st.sampled_from(PREFERS),
    k=st.integers(0, 10),
)
def test_longest_match_int32_longer_streams(impl, h, lo, span, prefer, k):
    """Streams past the compiled scan's 64-candidate blocks (SCAN_BLOCK), one token at a time."""
    ngi = impl.module("ngram_index")
    ix = ngi.NgramIndex(lo, lo + span, prefer)
    for t in h:
        ix.append(t)
    want = reference(h, lo, lo + span, k, prefer)
    assert ix.propose(k) == want
    arr = np.array(h, dtype=np.int32)
    assert ngi.longest_match(arr, lo, lo + span, k, prefer).tolist() == want


@pytest.mark.parametrize("prefer", PREFERS)
@pytest.mark.parametrize("vocab", [2, 16, 50_000])
def test_long_random_stream_every_step(ngi, prefer, vocab):
    """A 3000-token stream (tables grow several times), checked after every extend
    against the stateless scan, and against the reference at the end."""
    rng = np.random.default_rng(vocab)
    stream = rng.integers(0, vocab, size=3000)
    if vocab > 16:  # repeat stretches so long matches occur in a large vocabulary
        stream[1500:2000] = stream[100:600]
    ix = ngi.NgramIndex(2, 5, prefer)
    pos = 0
    while pos < stream.size:
        step = int(rng.integers(1, 40))
        ix.extend(stream[pos : pos + step])
        pos += step
        h = stream[: min(pos, stream.size)]
        assert ix.propose(6) == ngi.longest_match(h, 2, 5, 6, prefer).tolist()
    assert ix.propose(6) == reference(stream.tolist(), 2, 5, 6, prefer)


def test_implementations_agree(impl):
    """The compiled index and the twin give the same drafts on one shared stream."""
    from specfsm.drafting import _ngram_index_py as twin

    ngi = impl.module("ngram_index")
    rng = np.random.default_rng(7)
    stream = rng.integers(0, 6, size=800)
    a, b = ngi.NgramIndex(1, 4, "earliest"), twin.NgramIndex(1, 4, "earliest")
    for i in range(0, 800, 13):
        a.extend(stream[i : i + 13])
        b.extend(stream[i : i + 13].tolist())
        assert a.propose(5) == b.propose(5)


# ---------------------------------------------------------------------------------------
# batches
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(
    hs=st.lists(st.lists(st.integers(0, 3), max_size=40), max_size=8),
    lo=st.integers(1, 3),
    span=st.integers(0, 2),
    prefer=st.sampled_from(PREFERS),
    k=st.integers(0, 6),
    per_request=st.booleans(),
    wide=st.booleans(),
)
def test_longest_match_batch_equals_per_request(impl, hs, lo, span, prefer, k, per_request, wide):
    ngi = impl.module("ngram_index")
    hi = lo + span
    flat = np.array([t for h in hs for t in h], dtype=np.int64 if wide else np.int32)
    offsets = np.zeros(len(hs) + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hs], out=offsets[1:])
    ks = [(k + i) % 7 for i in range(len(hs))] if per_request else k
    drafts, doff, lengths = ngi.longest_match_batch(flat, offsets, lo, hi, ks, prefer)
    assert drafts.dtype == flat.dtype
    assert doff.shape == (len(hs) + 1,) and lengths.shape == (len(hs),)
    assert doff[0] == 0 and np.array_equal(np.diff(doff), lengths)
    for i, h in enumerate(hs):
        ki = ks[i] if per_request else k
        want = reference(h, lo, hi, ki, prefer)
        assert drafts[doff[i] : doff[i + 1]].tolist() == want
        assert ngi.longest_match(h, lo, hi, ki, prefer) == want


@SETTINGS
@given(
    streams_=st.lists(st.lists(st.integers(0, 4), max_size=50), max_size=8),
    prefer=st.sampled_from(PREFERS),
    k=st.one_of(st.none(), st.integers(0, 6)),
    per_request=st.booleans(),
)
def test_propose_batch_equals_per_request(impl, streams_, prefer, k, per_request):
    ngi = impl.module("ngram_index")
    ixs = []
    for i, s in enumerate(streams_):
        ix = ngi.NgramIndex(1, 3, prefer, draft_len=1 + i % 5)
        ix.extend(s)
        ixs.append(ix)
    ks = np.arange(len(ixs), dtype=np.int64) % 5 if per_request else k
    drafts, off, lengths = ngi.propose_batch(ixs, ks)
    assert drafts.dtype == np.int64 and off.shape == (len(ixs) + 1,)
    assert np.array_equal(np.diff(off), lengths)
    for i, ix in enumerate(ixs):
        ki = int(ks[i]) if per_request else k
        assert drafts[off[i] : off[i + 1]].tolist() == ix.propose(ki)
        assert ix.propose(ki) == reference(streams_[i], 1, 3, ix.draft_len if ki is None else ki, prefer)


def test_batch_offsets_with_gaps(ngi):
    flat = np.array([9, 1, 2, 1, 2, 9, 9, 3, 3, 3], dtype=np.int64)
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0, got 1"):
        ngi.longest_match_batch(flat, [1, 5, 5, 10], 1, 2, 4)
    with pytest.raises(ValueError, match=r"offsets\[-1\]=9 must equal len\(tokens\)=10"):
        ngi.longest_match_batch(flat, [0, 4, 4, 9], 1, 2, 4)
    drafts, off, lengths = ngi.longest_match_batch(flat[1:], [0, 4, 4, 9], 1, 2, 4)
    assert lengths.tolist() == [2, 0, 1]
    assert drafts.tolist() == [1, 2, 3]
    assert off.tolist() == [0, 2, 2, 3]
    empty = ngi.longest_match_batch(np.array([], dtype=np.int32), [0], 1, 1, 3)
    assert [x.tolist() for x in empty] == [[], [0], []]
    d, o, n = ngi.propose_batch([], 3)
    assert d.size == 0 and o.tolist() == [0] and n.size == 0


# ---------------------------------------------------------------------------------------
# adaptive draft length and acceptance statistics
# ---------------------------------------------------------------------------------------


def test_adaptive_draft_length(ngi):
    ix = ngi.NgramIndex(1, 2, adaptive=True, draft_len=4, min_draft=2, max_draft=9)
    assert ix.draft_len == 4 and ix.adaptive
    assert ix.record(4, 4) == 6  # full acceptance: +2
    assert ix.record(6, 6) == 8
    assert ix.record(8, 8) == 9  # capped
    assert ix.record(9, 3) == 8  # rejection: -1
    for _ in range(10):
        ix.record(5, 0)
    assert ix.draft_len == 2  # floored
    assert ix.record(0, 0) == 2  # nothing drafted: no change
    st_ = ix.stats
    assert st_["steps"] == 15
    assert st_["drafted"] == 4 + 6 + 8 + 9 + 50
    assert st_["accepted"] == 4 + 6 + 8 + 3
    assert st_["full_accepts"] == 3
    assert st_["acceptance_rate"] == pytest.approx(21 / 77)
    assert st_["draft_len"] == 2
    ix.extend([1, 2, 3, 4, 1, 2])
    assert ix.propose() == [3, 4]  # draft_len tokens when max_k is None


def test_fixed_draft_length_keeps_stats(ngi):
    ix = ngi.NgramIndex(1, draft_len=3)
    assert ix.record(3, 3) == 3 and ix.record(3, 1) == 3
    assert ix.stats["steps"] == 2 and ix.stats["accepted"] == 4


def test_record_batch(ngi):
    ixs = [ngi.NgramIndex(1, adaptive=True, draft_len=4) for _ in range(3)]
    nxt = ngi.record_batch(ixs, [4, 4, 0], [4, 1, 0])
    assert nxt.tolist() == [6, 3, 4]
    assert [ix.draft_len for ix in ixs] == [6, 3, 4]
    d, off, n = ngi.propose_batch(ixs)  # None: each index's own draft_len
    assert n.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"accepted\[0\]=5 is beyond the 4"):
        ngi.record_batch(ixs[:1], [4], [5])


# ---------------------------------------------------------------------------------------
# memory reporting
# ---------------------------------------------------------------------------------------


def test_memory_is_reported_and_bounded(ngi):
    ix = ngi.NgramIndex(2, 4)
    assert ix.bytes_per_token == 0.0 and ix.nbytes > 0
    rng = np.random.default_rng(0)
    ix.extend(rng.integers(0, 1 << 30, size=20_000))
    assert ix.nbytes > 0
    assert ix.bytes_per_token == pytest.approx(ix.nbytes / len(ix))
    if ngi.__name__.startswith("specfsm._core."):
        # 8 B per token, 3 tables of 8-byte slots at load >= 1/3: at most 8*1.5 + 3*24 + slack
        assert ix.bytes_per_token < 12 + 3 * 24 + 1


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------


def test_bad_ngram_range(ngi):
    with pytest.raises(ValueError, match="min_n must be at least 1, got 0"):
        ngi.longest_match([1, 2], 0, 2, 1)
    with pytest.raises(ValueError, match="min_n must be at least 1, got 0"):
        ngi.NgramIndex(0)
    with pytest.raises(ValueError, match=r"min_n must not exceed max_n, got min_n=3 > max_n=2"):
        ngi.longest_match([1, 2], 3, 2, 1)
    with pytest.raises(ValueError, match="min_n must not exceed max_n"):
        ngi.NgramIndex(3, 2)
    with pytest.raises(ValueError, match="min_n must be a non-negative integer, got -1"):
        ngi.NgramIndex(-1)
    with pytest.raises(TypeError, match="max_n must be a non-negative integer"):
        ngi.NgramIndex(1, 2.0)
    with pytest.raises(ValueError, match="at most 4096 n-gram lengths"):
        ngi.NgramIndex(1, 5000)
    with pytest.raises(ValueError, match="prefer must be 'latest' or 'earliest', got 'first'"):
        ngi.NgramIndex(1, 2, "first")
    with pytest.raises(ValueError, match="prefer must be"):
        ngi.longest_match([1], 1, 1, 1, prefer=None)


def test_bad_max_k(ngi):
    with pytest.raises(ValueError, match="max_k must be a non-negative integer, got -1"):
        ngi.longest_match([1, 2], 1, 1, -1)
    ix = ngi.NgramIndex(1)
    with pytest.raises(ValueError, match="max_k must be a non-negative integer, got -2"):
        ix.propose(-2)
    with pytest.raises(TypeError, match="max_k must be a non-negative integer, got float"):
        ix.propose(1.5)
    with pytest.raises(TypeError, match="max_k must be a non-negative integer, got bool"):
        ngi.longest_match([1, 2], 1, 1, True)
    with pytest.raises(ValueError, match="max_k must be a non-negative integer, got -1"):
        ngi.propose_batch([ix], -1)
    with pytest.raises(ValueError, match=r"max_k must be non-negative, got max_k\[1\]=-1"):
        ngi.propose_batch([ix, ix], [1, -1])
    with pytest.raises(ValueError, match="max_k holds 1 counts for 2 requests"):
        ngi.longest_match_batch([1, 2], [0, 1, 2], 1, 1, [3])


@pytest.mark.parametrize(
    "tokens, exc, msg",
    [
        (np.zeros((2, 3), dtype=np.int64), ValueError, "must be 1-D"),
        ([[1, 2], [3, 4]], ValueError, "must be 1-D"),
        (np.array([1.0, 2.0]), TypeError, "unsupported dtype float64"),
        ([1.0, 2.0], TypeError, "must be an integer token id"),
        ([1, "a"], TypeError, "must be an integer token id"),
        ([True, False], TypeError, "must be an integer token id"),
        (np.array([True]), TypeError, "unsupported dtype bool"),
        ([2**63], OverflowError, "beyond int64"),
        ([1, -(2**63) - 1], OverflowError, "beyond int64"),
        ([2**64 + 5], OverflowError, "beyond int64"),
        (np.array([2**63], dtype=np.uint64), OverflowError, "beyond int64"),
        ("abc", TypeError, "must be a list, tuple or 1-D integer numpy array"),
        (5, TypeError, "must be a list, tuple or 1-D integer numpy array"),
    ],
)
def test_bad_tokens(ngi, tokens, exc, msg):
    with pytest.raises(exc, match=msg) as info:
        ngi.longest_match(tokens, 1, 1, 1)
    assert "history" in str(info.value)
    ix = ngi.NgramIndex(1)
    with pytest.raises(exc, match=msg) as info:
        ix.extend(tokens)
    assert "tokens" in str(info.value)
    assert len(ix) == 0 and ix.propose(3) == []
    with pytest.raises(exc, match=msg):
        ngi.longest_match_batch(tokens, [0, 1], 1, 1, 1)


def test_bad_batch_arguments(ngi):
    flat = np.arange(6)
    with pytest.raises(ValueError, match="offsets must be nondecreasing"):
        ngi.longest_match_batch(flat, [0, 4, 2, 6], 1, 1, 1)
    with pytest.raises(ValueError, match=r"offsets\[-1\]=7 must equal len\(tokens\)=6"):
        ngi.longest_match_batch(flat, [0, 7], 1, 1, 1)
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0, got -1"):
        ngi.longest_match_batch(flat, [-1, 3], 1, 1, 1)
    with pytest.raises(ValueError, match="offsets must hold one entry per row plus one"):
        ngi.longest_match_batch(flat, [], 1, 1, 1)
    with pytest.raises(TypeError, match="max_k must be a non-negative integer or one count per request, got None"):
        ngi.longest_match_batch(flat, [0, 6], 1, 1, None)
    ix = ngi.NgramIndex(1)
    with pytest.raises(TypeError, match="got a single NgramIndex"):
        ngi.propose_batch(ix, 1)
    with pytest.raises(TypeError, match=r"indexes\[1\] must be an NgramIndex"):
        ngi.propose_batch([ix, "x"], 1)
    with pytest.raises(TypeError, match="indexes must be a sequence of NgramIndex, got int"):
        ngi.propose_batch(3, 1)


def test_index_from_other_implementation_refused(impl):
    from specfsm.drafting import _ngram_index_py as twin

    ngi = impl.module("ngram_index")
    if ngi is twin:
        pytest.skip("only the compiled module has a second class to mix up")
    with pytest.raises(TypeError, match=r"indexes\[0\] must be an NgramIndex of the same implementation"):
        ngi.propose_batch([twin.NgramIndex(1)], 1)


def test_bad_record(ngi):
    ix = ngi.NgramIndex(1)
    with pytest.raises(ValueError, match="accepted=3 is beyond the 2 drafted tokens"):
        ix.record(2, 3)
    with pytest.raises(ValueError, match="proposed must be a non-negative integer, got -1"):
        ix.record(-1, 0)
    with pytest.raises(ValueError, match=r"draft_len must lie in \[min_draft, max_draft\] = \[1, 16\], got 20"):
        ngi.NgramIndex(1, draft_len=20)
    with pytest.raises(ValueError, match="min_draft must not exceed max_draft"):
        ngi.NgramIndex(1, min_draft=5, max_draft=2)
    assert ix.stats["steps"] == 0


# ---------------------------------------------------------------------------------------
# threads: a batch proposal runs without the GIL
# ---------------------------------------------------------------------------------------


def test_batch_from_threads(ngi):
    rng = np.random.default_rng(3)
    ixs = []
    for _ in range(16):
        ix = ngi.NgramIndex(2, 4)
        ix.extend(rng.integers(0, 8, size=3000))
        ixs.append(ix)
    want = ngi.propose_batch(ixs, 5)
    errors = []

    def work():
        try:
            for _ in range(50):
                got = ngi.propose_batch(ixs, 5)
                assert all(np.array_equal(a, b) for a, b in zip(got, want))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ---------------------------------------------------------------------------------------
# array layouts and the public wrappers
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a.astype(">i8"),
        lambda a: a.astype(">i4"),
        lambda a: np.repeat(a, 2)[::2],
        lambda a: a.astype(np.uint64),
        lambda a: a.astype(np.uint32),
        lambda a: a.astype(np.int16),
        lambda a: a.astype(np.int32),
    ],
    ids=["be-int64", "be-int32", "strided", "uint64", "uint32", "int16", "int32"],
)
def test_array_layouts(ngi, make):
    base = np.array([1, 2, 3, 1, 2, 3, 4, 1, 2], dtype=np.int64)
    arr = make(base)
    want = reference(base.tolist(), 1, 3, 4)
    out = ngi.longest_match(arr, 1, 3, 4)
    assert out.dtype == arr.dtype and out.tolist() == want
    ix = ngi.NgramIndex(1, 3)
    ix.extend(arr)
    assert ix.propose(4) == want
    drafts, _, _ = ngi.longest_match_batch(arr, [0, arr.size], 1, 3, 4)
    assert drafts.tolist() == want


def test_public_wrappers():
    from specfsm import _impl
    from specfsm.drafting import ngram_index as pub

    assert pub.NgramIndex is _impl.load("ngram_index").NgramIndex
    h = [5, 6, 7, 5, 6, 7, 8, 5, 6]
    ix = pub.NgramIndex(1, 3, draft_len=2, adaptive=True)
    ix.extend(h)
    assert ix.propose() == [7, 8] == pub.longest_match(h, 1, 3, 2)
    d, off, n = pub.propose_batch([ix, ix], [1, 3])
    assert d.tolist() == [7, 7, 8, 5] and off.tolist() == [0, 1, 4] and n.tolist() == [1, 3]
    d, off, n = pub.longest_match_batch(np.array(h * 2), [0, 9, 18], 1, 3, 2)
    assert d.tolist() == [7, 8, 7, 8]
    assert pub.record_batch([ix], [2], [2]).tolist() == [4]


def test_list_of_numpy_ints_and_pickle(ngi):
    import pickle

    ix = ngi.NgramIndex(1, 3, "earliest", adaptive=True, draft_len=3, max_draft=7)
    ix.extend([np.int64(4), 5, np.int32(6)])
    ix.extend((4, 5))
    ix.append(np.int16(6))
    ix.append(4)
    assert ix.tokens.tolist() == [4, 5, 6, 4, 5, 6, 4]
    assert ix.propose(3) == reference([4, 5, 6, 4, 5, 6, 4], 1, 3, 3, "earliest")
    ix.record(3, 3)
    clone = pickle.loads(pickle.dumps(ix))
    assert type(clone) is type(ix)
    assert clone.tokens.tolist() == ix.tokens.tolist()
    assert clone.propose() == ix.propose() and clone.stats == ix.stats
    assert (clone.min_n, clone.max_n, clone.prefer, clone.adaptive) == (1, 3, "earliest", True)
    clone.append(5)
    ix.append(5)
    assert clone.propose(4) == ix.propose(4)
    with pytest.raises(OverflowError, match="beyond int64"):
        ix.append(2**64)
    with pytest.raises(TypeError, match="must be an integer token id"):
        ix.append(1.0)
    assert len(ix) == 8


@pytest.mark.parametrize("prefer", PREFERS)
def test_bulk_extend_across_chunks(ngi, prefer):
    """One extend of 10k tokens (several reservation chunks, the prefetching path), then
    single appends; every proposal equals the stateless scan's."""
    rng = np.random.default_rng(11)
    stream = rng.integers(0, 5, size=10_000)
    ix = ngi.NgramIndex(3, 9, prefer)
    ix.extend(stream)
    h = stream.tolist()
    for t in rng.integers(0, 5, size=30).tolist():
        assert ix.propose(7) == ngi.longest_match(h, 3, 9, 7, prefer)
        ix.append(t)
        h.append(t)
    assert ix.propose(7) == reference(h, 3, 9, 7, prefer)


def test_twin_has_the_same_names(impl):
    from specfsm.drafting import _ngram_index_py as twin

    ngi = impl.module("ngram_index")
    assert list(ngi.__all__) == list(twin.__all__)
    for name in twin.__all__:
        assert hasattr(ngi, name)
    public = {n for n in dir(twin.NgramIndex) if not n.startswith("_")}
    assert public <= set(dir(ngi.NgramIndex))


def test_drafter_session_serves_its_index():
    """The n-gram drafter's session goes through ``NgramIndex.serve``: the tokens after a
    proposal record that draft's agreement, then extend, and the next proposal is at
    most the loop's limit (the active implementation's index)."""
    from specfsm.drafting.ngram_index import NgramDrafter, NgramIndex

    sess = NgramDrafter(1, 3).session([1, 2, 3, 4, 1, 2])
    assert type(sess.index) is NgramIndex
    first = sess.propose(3)
    assert first == [3, 4, 1]
    sess.extend([3, 4, 9])
    assert sess.index.stats["steps"] == 1 and sess.index.stats["accepted"] == 2
    assert sess.index.tokens.tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 9]
    assert sess.propose(0) == [] and sess.propose(2) == []
    sess.extend([1])                      # nothing was drafted: nothing recorded
    assert sess.index.stats["steps"] == 1 and sess.index.stats["drafted"] == 3
    assert sess.propose(2) == [2, 3]
