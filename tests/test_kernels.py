"""The three foundation kernels: compiled == twin == a plain reference, on random and
edge-case inputs, and the same clear errors from both."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm import IllegalTransition

from reference import draft_prompt_lookup as ref_lookup
from reference import leading_equal as ref_prefix
from reference import settle_index as ref_settle
from isolated import run_isolated

I64 = (-(2**63), 2**63 - 1)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# -- strategies -------------------------------------------------------------------------
small_vocab = st.lists(st.integers(0, 3), max_size=60)
wide_vocab = st.lists(st.integers(*I64), max_size=40)
extremes = st.lists(st.sampled_from([I64[0], I64[1], 0, -1, 1]), max_size=40)
token_lists = st.one_of(small_vocab, wide_vocab, extremes)
int32_lists = st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 3), max_size=60)


def variants(tokens, dtype):
    """The same tokens as a list, a tuple, a contiguous array and a strided view."""
    arr = np.asarray(tokens, dtype=dtype)
    doubled = np.repeat(arr, 2)[::2]
    assert not doubled.flags.c_contiguous or len(arr) <= 1
    return [list(tokens), tuple(tokens), arr, doubled]


# -- common_prefix ----------------------------------------------------------------------
@SETTINGS
@given(a=token_lists, b=token_lists, shared=st.integers(0, 10))
def test_common_prefix_matches_reference(impl, a, b, shared):
    b = a[:shared] + b
    expected = ref_prefix(a, b)
    for x in variants(a, np.int64):
        for y in variants(b, np.int64):
            assert impl.common_prefix(x, y) == expected


@SETTINGS
@given(a=int32_lists, b=int32_lists)
def test_common_prefix_mixed_dtypes(impl, a, b):
    b = a[: len(a) // 2] + b
    expected = ref_prefix(a, b)
    assert impl.common_prefix(np.asarray(a, np.int32), np.asarray(b, np.int64)) == expected
    assert impl.common_prefix(np.asarray(a, np.int32), np.asarray(b, np.int32)) == expected
    assert impl.common_prefix(np.asarray(a, np.int16 if all(abs(v) < 2**15 for v in a) else np.int64), b) == expected


def test_common_prefix_edges(impl):
    assert impl.common_prefix([], []) == 0
    assert impl.common_prefix([1], []) == 0
    assert impl.common_prefix([1], [1]) == 1
    assert impl.common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert impl.common_prefix(["a", None, 2.5], ["a", None, 2.5]) == 3
    nan = float("nan")
    assert impl.common_prefix([nan], [float("nan")]) == 0  # distinct NaNs are unequal
    assert impl.common_prefix([nan], [nan]) == 1  # identity counts as equal, as in list ==
    big = np.arange(10_000, dtype=np.int64)  # long enough to release the GIL
    other = big.copy()
    other[7777] = -1
    assert impl.common_prefix(big, other) == 7777


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (np.zeros((2, 2), dtype=np.int64), ValueError, "draft must be 1-D"),
        (np.array([1.0, 2.0]), TypeError, "unsupported dtype float64"),
        (np.array([True]), TypeError, "unsupported dtype bool"),
        (np.array(["a"]), TypeError, "unsupported dtype"),
        (np.array([1], dtype=object), TypeError, "unsupported dtype object"),
        (5, TypeError, "draft must be"),
        ("abc", TypeError, "draft must be"),
    ],
)
def test_common_prefix_refuses_bad_input(impl, bad, exc, match):
    with pytest.raises(exc, match=match):
        impl.common_prefix(bad, [1, 2])


# -- prompt_lookup ------------------------------------------------------------------------
@SETTINGS
@given(history=token_lists, ngram=st.integers(0, 5), max_k=st.integers(0, 7))
def test_prompt_lookup_matches_reference(impl, history, ngram, max_k):
    expected = ref_lookup(history, ngram, max_k)
    for h in variants(history, np.int64):
        got = impl.prompt_lookup(h, ngram, max_k)
        if isinstance(h, np.ndarray):
            assert isinstance(got, np.ndarray) and got.dtype == h.dtype
            assert got.tolist() == expected
        else:
            assert got == expected


@SETTINGS
@given(history=int32_lists, ngram=st.integers(1, 4), max_k=st.integers(1, 6))
def test_prompt_lookup_int32(impl, history, ngram, max_k):
    expected = ref_lookup(history, ngram, max_k)
    for h in variants(history, np.int32):
        got = impl.prompt_lookup(h, ngram, max_k)
        assert (got.tolist() if isinstance(got, np.ndarray) else got) == expected


@SETTINGS
@given(
    period=st.lists(st.integers(0, 50), min_size=1, max_size=12),
    reps=st.integers(1, 300),
    tail=st.lists(st.integers(0, 50), max_size=5),
    ngram=st.integers(1, 4),
)
def test_prompt_lookup_long_repetitive_streams(impl, period, reps, tail, ngram):
    history = period * reps + tail  # long enough to cross the blocked scan and the GIL release
    expected = ref_lookup(history, ngram, 5)
    assert impl.prompt_lookup(np.asarray(history, np.int32), ngram, 5).tolist() == expected
    assert impl.prompt_lookup(np.asarray(history, np.int64), ngram, 5).tolist() == expected
    assert impl.prompt_lookup(history, ngram, 5) == expected


def test_prompt_lookup_edges(impl):
    assert impl.prompt_lookup([], 1, 1) == []
    assert impl.prompt_lookup([7], 1, 1) == []
    assert impl.prompt_lookup([7, 7], 1, 3) == [7]
    assert impl.prompt_lookup([1, 2, 1], 0, 3) == []
    assert impl.prompt_lookup([1, 2, 1], 1, 0) == []
    assert impl.prompt_lookup([1, 2, 1], 10**30, 3) == []
    assert impl.prompt_lookup([1, 2, 1], 1, 10**30) == [2, 1]
    assert impl.prompt_lookup(["x", "y", "x"], 1, 2) == ["y", "x"]
    out = impl.prompt_lookup(np.array([], dtype=np.int32), 1, 1)
    assert out.dtype == np.int32 and out.size == 0
    assert impl.prompt_lookup(np.array([3, 4, 3], dtype=np.uint8), 1, 2).tolist() == [4, 3]
    assert impl.prompt_lookup(np.array([3, 4, 3], dtype=np.uint64), 1, 2).tolist() == [4, 3]
    # the match must not be the trailing n-gram itself
    assert impl.prompt_lookup([1, 2, 3, 4], 2, 5) == []
    # the most recent earlier occurrence wins
    assert impl.prompt_lookup([1, 2, 8, 1, 2, 9, 1, 2], 2, 1) == [9]


@pytest.mark.parametrize(
    "args, exc, match",
    [
        (([1, 2], -1, 1), ValueError, "ngram must be a non-negative integer, got -1"),
        (([1, 2], 1, -2), ValueError, "max_k must be a non-negative integer, got -2"),
        (([1, 2], 1.0, 1), TypeError, "ngram must be a non-negative integer"),
        (([1, 2], 1, 2.5), TypeError, "max_k must be a non-negative integer"),
        (([1, 2], True, 1), TypeError, "ngram must be a non-negative integer, got bool"),
        ((np.zeros((2, 3), dtype=np.int64), 1, 1), ValueError, "history must be 1-D"),
        ((np.array([1.0, 2.0]), 1, 1), TypeError, "history has unsupported dtype float64"),
        ((np.array([2**63], dtype=np.uint64), 1, 1), OverflowError, "beyond int64"),
        ((12, 1, 1), TypeError, "history must be"),
        (({1: 2}, 1, 1), TypeError, "history must be"),
    ],
)
def test_prompt_lookup_refuses_bad_input(impl, args, exc, match):
    with pytest.raises(exc, match=match):
        impl.prompt_lookup(*args)


# -- settle ----------------------------------------------------------------------------
@SETTINGS
@given(
    draft_len=st.integers(0, 8),
    accepted=st.integers(0, 10),
    n_tokens=st.integers(0, 10),
    n_caches=st.integers(0, 10),
)
def test_settle_matches_reference(impl, draft_len, accepted, n_tokens, n_caches):
    expected = ref_settle(draft_len, accepted, n_tokens, n_caches)
    if expected is None:
        with pytest.raises(IllegalTransition) as err:
            impl.settle(draft_len, accepted, n_tokens, n_caches, "accept_rows")
        assert err.value.attempted == "accept_rows" and err.value.reason
    else:
        assert impl.settle(draft_len, accepted, n_tokens, n_caches, "accept") == expected


def test_settle_huge_and_bad_counts(impl):
    with pytest.raises(IllegalTransition, match="accept") as err:
        impl.settle(3, 2**80, 3, 3, "accept_rows")
    assert str(2**80) in err.value.reason
    with pytest.raises(ValueError, match="accepted must be a non-negative integer, got -1"):
        impl.settle(3, -1, 3, 3, "accept_rows")
    with pytest.raises(TypeError, match="accepted must be a non-negative integer"):
        impl.settle(3, 1.0, 3, 3, "accept_rows")
    assert impl.settle(3, np.int64(3), 0, 3, "accept_rows") == 2
    # draft_len at the top of Py_ssize_t: accepted one past it must not wrap into a row
    top = 2**63 - 1
    for accepted in (2**63, 2**64, 2**63 + 5):
        with pytest.raises(IllegalTransition):
            impl.settle(top, accepted, top, top, "accept_rows")
    assert impl.settle(top, top, 0, top, "accept_rows") == top - 1


def test_compiled_and_twin_agree_on_error_messages(impl):
    from specfsm import _impl

    if impl.name != "compiled":
        pytest.skip("compares the compiled core with the twin: nothing to compare on the twin run")
    twin = _impl.module("python", "ngram")
    for args in [([1], -1, 1), (np.zeros((1, 1), np.int64), 1, 1), ([1], 1, "2")]:
        with pytest.raises(Exception) as mine:
            impl.prompt_lookup(*args)
        with pytest.raises(Exception) as theirs:
            twin.prompt_lookup(*args)
        assert type(mine.value) is type(theirs.value) and str(mine.value) == str(theirs.value)


mixed_entries = st.one_of(
    st.integers(-2, 3),
    st.sampled_from([True, False, 1.0, 2.5, 2**64, -(2**70), "a", None]),
    st.integers(-2, 3).map(np.int64),
)


@SETTINGS
@given(history=st.lists(mixed_entries, max_size=40), ngram=st.integers(1, 3), max_k=st.integers(1, 4))
def test_prompt_lookup_mixed_python_entries_follow_python_equality(impl, history, ngram, max_k):
    # True == 1 == 1.0 == np.int64(1): the compiled int fast path must not change that
    expected = ref_lookup(history, ngram, max_k)
    got = impl.prompt_lookup(history, ngram, max_k)
    assert len(got) == len(expected) and all(x is y for x, y in zip(got, expected))
    assert impl.common_prefix(history, list(reversed(history))) == ref_prefix(history, list(reversed(history)))


def test_prompt_lookup_list_mutated_by_eq_is_refused(impl):
    class Shrinks:
        def __init__(self, victim):
            self.victim = victim

        def __eq__(self, other):
            if self.victim:
                self.victim.pop()
            return False

    history: list = [0] * 50
    history[10] = Shrinks(history)
    history.extend(["x", 1, "y"])  # needle last "y": every earlier entry compared by ==
    if impl.name != "compiled":
        pytest.skip("the twin scans slices (copies), so a shrinking list cannot reach it")
    with pytest.raises(RuntimeError, match="changed size"):
        impl.prompt_lookup(history, 1, 1)


# -- issue 9: a user-defined __eq__ that shrinks the list being scanned ---------------------
# The list's size is re-read after every comparison, whatever its result (CPython's
# list.index does the same): here the comparison that shrinks the list returns False, in
# the loop over the needle's other entries, and the next step reads the needle's last
# entry again. Run in a child process: reading past the end of a list may crash.
_SHRINK_BODY = """
from specfsm import _impl
lookup = _impl.module(IMPL, "ngram").prompt_lookup

class Shrinks:
    def __init__(self):
        self.victim = None
    def __eq__(self, other):
        if other == 0 and self.victim:
            del self.victim[len(self.victim) // 4:]  # frees most entries and the tail
        return False
    __hash__ = object.__hash__

for pops_on in range(3):
    x = Shrinks()
    filler = [10**6 + i for i in range(3000)]  # distinct int objects, freed when dropped
    history = filler + [0, 5] + [10**7 + i for i in range(3000)] + [x, 5]
    x.victim = history
    try:
        got = lookup(history, 2, 3)
    except RuntimeError as exc:
        assert "changed size" in str(exc), exc
        print("refused")
    else:
        assert isinstance(got, list)
        print("returned", len(got))
"""


def test_prompt_lookup_list_shrunk_by_eq_in_the_needle_loop(impl):
    out = run_isolated(_SHRINK_BODY, impl.name)
    if impl.name == "compiled":
        assert out.split() == ["refused"] * 3
    else:  # the twin compares slices (copies): it runs to the end on its own snapshot
        assert out.startswith("returned")


def test_common_prefix_list_shrunk_by_eq(impl):
    """The prefix loop stops at the shorter list's current end, never past it."""

    class Shrinks:
        def __init__(self, victim):
            self.victim = victim

        def __eq__(self, other):
            del self.victim[3:]
            return True

        __hash__ = object.__hash__

    for which in ("draft", "row_tokens"):
        a = list(range(100))
        b = list(range(100))
        victim = a if which == "draft" else b
        b[1] = Shrinks(victim)
        assert impl.common_prefix(a, b) == 3
