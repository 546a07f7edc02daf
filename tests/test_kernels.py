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
    # list entries are token ids: numpy integers count by value and come back as ints
    got = impl.prompt_lookup([np.int64(3), 4, np.int32(3)], 1, 2)
    assert got == [4, 3] and all(type(x) is int for x in got)
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


def test_compiled_and_twin_agree_on_error_messages(compiled):
    from specfsm import _impl

    impl = compiled
    twin = _impl.kernels("python", "ngram")
    for args in [([1], -1, 1), (np.zeros((1, 1), np.int64), 1, 1), ([1], 1, "2")]:
        with pytest.raises(Exception) as mine:
            impl.prompt_lookup(*args)
        with pytest.raises(Exception) as theirs:
            twin.prompt_lookup(*args)
        assert type(mine.value) is type(theirs.value) and str(mine.value) == str(theirs.value)


class IntSubclass(int):
    """An int subclass whose own == must not be consulted: ids compare by value."""

    def __eq__(self, other):  # pragma: no cover - must never run
        raise AssertionError("a token id's own __eq__ ran")

    __hash__ = int.__hash__


BAD_IDS = [True, False, 1.0, 2.5, 2**64, -(2**70), "a", None, np.bool_(True), np.float64(1.0)]
mixed_entries = st.one_of(
    st.integers(-2, 3),
    st.integers(-2, 3).map(np.int64),
    st.integers(-2, 3).map(IntSubclass),
    st.sampled_from(BAD_IDS),
)


def _is_id(x) -> bool:
    return type(x) not in (bool, np.bool_) and isinstance(x, (int, np.integer)) and -(2**63) <= int(x) < 2**63


@SETTINGS
@given(history=st.lists(mixed_entries, max_size=40), ngram=st.integers(1, 3), max_k=st.integers(1, 4))
def test_prompt_lookup_list_entries_follow_the_token_id_rule(impl, history, ngram, max_k):
    """List entries are token ids (ints, numpy integers; not bools, floats, strings...).

    An entry the search reads that is not an id is refused (TypeError naming it;
    OverflowError beyond int64). When the call returns, the entries it did not read
    cannot have mattered: the draft is the reference's on the history with every non-id
    replaced by a value no other entry has, and it is made of Python ints."""
    try:
        got = impl.prompt_lookup(history, ngram, max_k)
    except OverflowError as exc:
        assert "beyond int64" in str(exc) and any(type(x) is int and not _is_id(x) for x in history)
        return
    except TypeError as exc:
        assert "must be an integer token id" in str(exc) and "history[" in str(exc)
        assert not all(_is_id(x) for x in history)
        return
    cleaned = [int(x) if _is_id(x) else 10**6 + i for i, x in enumerate(history)]
    assert got == ref_lookup(cleaned, ngram, max_k)
    assert all(type(x) is int for x in got)
    if all(_is_id(x) for x in history):
        assert got == ref_lookup([int(x) for x in history], ngram, max_k)


@SETTINGS
@given(history=st.lists(mixed_entries, max_size=40), ngram=st.integers(1, 3), max_k=st.integers(0, 4))
def test_prompt_lookup_compiled_and_twin_read_the_same_entries(compiled, history, ngram, max_k):
    """Both read a list in the same order, so they refuse the same first bad entry."""
    from specfsm import _impl

    impl = compiled

    twin = _impl.kernels("python", "ngram").prompt_lookup
    outcomes = []
    for lookup in (impl.prompt_lookup, twin):
        try:
            outcomes.append(("ok", lookup(history, ngram, max_k)))
        except (TypeError, OverflowError) as exc:
            outcomes.append((type(exc).__name__, str(exc)))
    assert outcomes[0] == outcomes[1]


def test_prompt_lookup_refuses_non_ids_it_reads(impl):
    with pytest.raises(TypeError, match=r"history\[2\] must be an integer token id, got float 1.0"):
        impl.prompt_lookup([1.0, 2.0, 1.0], 1, 2)
    with pytest.raises(TypeError, match=r"history\[1\] must be an integer token id, got bool True"):
        impl.prompt_lookup([1, True], 1, 2)
    with pytest.raises(TypeError, match=r"history\[1\] must be an integer token id, got str 'y'"):
        impl.prompt_lookup((1, "y", 1), 1, 2)
    # entries older than the match are not read (a pass over them all would cost more than
    # the search): the rule is checked where the search reads
    assert impl.prompt_lookup(("y", 1, 2, 1), 1, 2) == [2, 1]
    with pytest.raises(OverflowError, match=r"history\[1\]=18446744073709551616 is beyond int64"):
        impl.prompt_lookup([5, 2**64, 5], 1, 2)
    assert impl.prompt_lookup([IntSubclass(7), 8, 7], 1, 2) == [8, 7]


# -- a numpy-integer subclass whose __index__ shrinks the list being scanned -------------
# Converting an entry is the one place the scan can run user code (an np.integer
# subclass's __index__): both implementations check the list's size after it and refuse.
# Run in a child process: reading past the end of a list may crash.
_SHRINK_BODY = """
import numpy as np
from specfsm import _impl
lookup = _impl.kernels(IMPL, "ngram").prompt_lookup

class Shrinks(np.int64):
    victim = None
    def __index__(self):
        if Shrinks.victim:
            del Shrinks.victim[len(Shrinks.victim) // 4:]  # frees most entries and the tail
        return 0

for where in (10, 3000, 6001):
    filler = [10**6 + i for i in range(3000)]  # distinct int objects, freed when dropped
    history = filler + [0, 5] + [10**7 + i for i in range(3000)] + [7, 5]
    history[where] = Shrinks(0)
    Shrinks.victim = history
    try:
        got = lookup(history, 2, 3)
    except RuntimeError as exc:
        assert "changed size" in str(exc), exc
        print("refused")
    else:
        print("returned", got)
"""


def test_prompt_lookup_list_shrunk_by_index_is_refused(impl):
    out = run_isolated(_SHRINK_BODY, impl.name)
    assert out.split() == ["refused"] * 3


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


# -- one token-id rule for every function over token ids ------------------------------------
# docs/state-machine.md, "Token ids": drafting, the indexes and the acceptance rules take integer ids
# (ints, numpy integers, integer arrays) and refuse floats, bools and strings with
# TypeError naming the argument; the state machine and common_prefix compare any entries.
def _id_functions():
    import specfsm
    from specfsm.accept.rules import Exact, SpeculativeSampling

    probs = np.full((3, 4), 0.25)
    return {
        "prompt_lookup": ("history", lambda h: specfsm.prompt_lookup(h, 1, 2)),
        "longest_match": ("history", lambda h: specfsm.longest_match(h, 1, 1, 2)),
        "NgramIndex.extend": ("tokens", lambda h: specfsm.NgramIndex(1, 2).extend(h)),
        "Exact.accept_batch": ("draft", lambda h: Exact().accept_batch(h, [1, 2, 1], [0, 3])),
        "SpeculativeSampling.sample_rows": (
            "draft", lambda h: SpeculativeSampling(seed=0).sample_rows(h, probs)),
    }


@pytest.mark.parametrize("name", list(_id_functions()))
@pytest.mark.parametrize(
    "bad", [[1.0, 2.0, 1.0], [1, 2.5, 1], [True, 2, 1], ["a", "b", "a"], np.array([1.0, 2.0, 1.0])],
    ids=["floats", "a float", "a bool", "strings", "float array"],
)
def test_functions_over_token_ids_refuse_non_integer_ids(fsm, name, bad):
    arg, call = _id_functions()[name]
    with pytest.raises(TypeError, match=arg):
        call(bad)


def test_functions_over_token_ids_agree_on_integer_ids(fsm):
    import specfsm

    for history in ([1, 2, 1], [np.int64(1), 2, np.int32(1)], np.array([1, 2, 1], np.uint8)):
        got = specfsm.prompt_lookup(history, 1, 2)
        got = got.tolist() if isinstance(got, np.ndarray) else got
        want = specfsm.longest_match(history, 1, 1, 2)
        assert got == (want.tolist() if isinstance(want, np.ndarray) else want) == [2, 1]


def test_the_state_machine_and_common_prefix_stay_generic(fsm):
    import specfsm

    assert specfsm.common_prefix([1.0, "a", None], [1, "a", 3]) == 2
    v = specfsm.ServingState.start(["a"], 0).advance_prefill("b", 1).enter_verify(["c", "d"])
    assert v.accept(["c", "e"], [2, 3]) == specfsm.Rollback(3, "e")
