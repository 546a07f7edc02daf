"""The Python API's contract: construction, pattern matching, structural equality,
immutability, every illegal transition, snapshots, and bad input."""

from __future__ import annotations

import copy
import pickle
from dataclasses import FrozenInstanceError

import numpy as np
import pytest

import specfsm
from specfsm._values import value_eq

from specfsm import (
    Accept,
    Decode,
    Done,
    IllegalTransition,
    Prefill,
    Rollback,
    ServingState,
    Verify,
)

pytestmark = pytest.mark.usefixtures("fsm")

SAMPLES = {
    "Prefill": Prefill([1, 2, 3], "c0"),
    "Decode": Decode(4, "c1"),
    "Verify": Verify([5, 6], "snap", "c2"),
    "Accept": Accept(2, 6, "c3"),
    "Rollback": Rollback("snap", 9),
    "Done": Done("c4"),
}

# transition name -> (args, the state it is legal from)
TRANSITIONS = {
    "advance_prefill": ((7, "new"), "Prefill"),
    "advance_decode": ((7, "new"), "Decode"),
    "enter_verify": (([7, 8],), "Decode"),
    "accept": (([5, 6], ["r0", "r1"]), "Verify"),
    "accept_rows": ((1, [5, 6], ["r0", "r1"]), "Verify"),
    "resume": ((), "Accept"),
    "rollback": ((), "Rollback"),
}


@pytest.mark.parametrize("state_name", SAMPLES)
@pytest.mark.parametrize("transition", TRANSITIONS)
def test_every_transition_is_legal_only_from_its_source(state_name, transition):
    state = SAMPLES[state_name]
    before = copy.deepcopy(state)
    args, legal_from = TRANSITIONS[transition]
    if state_name == legal_from:
        result = getattr(state, transition)(*args)
        assert isinstance(result, ServingState) and result is not state
    else:
        with pytest.raises(IllegalTransition) as err:
            getattr(state, transition)(*args)
        assert err.value.attempted == transition
        assert str(err.value) == f"serving fsm: {transition} is not legal from the current state"
    assert state == before  # never changed, legal or not


def test_accept_with_is_refused_outside_verify():
    with pytest.raises(IllegalTransition) as err:
        Decode(1, 0).accept_with(object(), [1], [0])
    assert err.value.attempted == "accept_with"


@pytest.mark.parametrize("state_name", SAMPLES)
def test_finish_from_any_state_keeps_the_cache(state_name):
    state = SAMPLES[state_name]
    expected = "snap" if state_name == "Rollback" else state.cache
    assert state.finish() == Done(expected)


def test_transition_results():
    assert Prefill([1], "a").advance_prefill(2, "b") == Decode(2, "b")
    assert Decode(1, "a").advance_decode(2, "b") == Decode(2, "b")
    assert Accept(2, 6, "c").resume() == Decode(6, "c")
    assert Rollback("s", 9).rollback() == Decode(9, "s")
    assert ServingState.start([1, 2], None) == Prefill([1, 2], None)


def test_construct_by_keyword_and_position_and_match():
    assert Verify(draft=[1], snapshot=2, cache=3) == Verify([1], 2, 3)
    assert Accept(n=1, next=2, cache=3) == Accept(1, 2, 3)
    match Verify([1, 2], "s", "c"):
        case Verify(draft, snapshot, cache):
            assert (draft, snapshot, cache) == ([1, 2], "s", "c")
        case _:
            pytest.fail("Verify did not destructure")
    match Rollback("s", 9):
        case Accept():
            pytest.fail("Rollback matched Accept")
        case Rollback(snapshot=s, to=t):
            assert (s, t) == ("s", 9)
    for cls, fields in [
        (Prefill, ("positions", "cache")),
        (Decode, ("last", "cache")),
        (Verify, ("draft", "snapshot", "cache")),
        (Accept, ("n", "next", "cache")),
        (Rollback, ("snapshot", "to")),
        (Done, ("cache",)),
    ]:
        assert cls.__match_args__ == fields


def test_structural_equality_over_sequences_and_arrays():
    assert Verify([1, 2], 0, 0) == Verify((1, 2), 0, 0)
    assert Verify([1, 2], 0, 0) == Verify(np.array([1, 2], dtype=np.int32), 0, 0)
    assert Prefill(np.array([1, 2]), 0) == Prefill([1, 2], 0)
    assert Verify([1, 2], 0, 0) != Verify([1, 2, 3], 0, 0)
    assert Verify([1, 2], 0, 0) != Verify([1, 3], 0, 0)
    a = np.arange(6.0).reshape(2, 3)
    assert Decode(1, a) == Decode(1, a.copy())
    assert Decode(1, a) != Decode(1, a + 1)
    assert Decode(1, a) != Decode(1, a.reshape(3, 2))
    assert Decode(1, [a, a]) == Decode(1, [a.copy(), a.copy()])
    assert Decode(1, 0) != Done(0)
    assert Decode(1, 0) != (1, 0)


def test_hash_agrees_with_equality():
    assert hash(Verify([1, 2], 0, 0)) == hash(Verify(np.array([1, 2]), 0, 0))
    assert len({Decode(1, 2), Decode(1, 2), Decode(2, 2)}) == 2


def test_repr_is_readable():
    assert repr(Decode(4, 2)) == "Decode(last=4, cache=2)"
    assert repr(Accept(2, 7, None)) == "Accept(n=2, next=7, cache=None)"
    assert repr(Rollback("s", 9)) == "Rollback(snapshot='s', to=9)"


@pytest.mark.parametrize("state_name", SAMPLES)
def test_fields_cannot_be_assigned(state_name):
    state = SAMPLES[state_name]
    field = type(state).__match_args__[0]
    with pytest.raises(FrozenInstanceError):
        setattr(state, field, 1)
    with pytest.raises(AttributeError):
        state.extra = 1
    with pytest.raises(FrozenInstanceError):
        delattr(state, field)


def test_states_pickle_and_copy():
    for state in SAMPLES.values():
        assert pickle.loads(pickle.dumps(state)) == state
        assert copy.copy(state) == state
    err = pickle.loads(pickle.dumps(IllegalTransition("accept")))
    assert err == IllegalTransition("accept") and err.attempted == "accept"


class InPlaceCache:
    """A cache a backend writes in place, with a copy method (as many cache objects have)."""

    def __init__(self, rows):
        self.rows = list(rows)

    def append(self, row):
        self.rows.append(row)

    def copy(self):
        return InPlaceCache(self.rows)

    def __eq__(self, other):
        return isinstance(other, InPlaceCache) and self.rows == other.rows


@pytest.mark.parametrize("make", [lambda: np.arange(6.0), lambda: [np.zeros(2), np.ones(2)],
                                  lambda: {"k": np.zeros(3)}, lambda: InPlaceCache([1, 2]),
                                  lambda: bytearray(b"kv")])
def test_snapshot_is_the_pre_draft_cache_by_default(make):
    # the design clones the cache into Verify.snapshot: restorable verbatim after the
    # verify wrote the cache in place
    cache, before = make(), make()
    verifying = ServingState.start([1], cache).advance_prefill(2, cache).enter_verify([3, 4])
    assert verifying.cache is cache and verifying.snapshot is not cache
    if isinstance(cache, np.ndarray):
        cache[:] = -1.0
    elif isinstance(cache, list):
        cache[0][:] = 9.0
    elif isinstance(cache, dict):
        cache["k"][0] = 5.0
    elif isinstance(cache, InPlaceCache):
        cache.append(3)
    else:
        cache[0] = 0
    assert value_eq(verifying.snapshot, before)
    assert not value_eq(verifying.cache, before)
    # rejected at row 0: the rollback row is the caller's; the snapshot is still the
    # pre-draft cache, restorable verbatim
    settled = verifying.accept([7, 7], [cache, cache])
    assert isinstance(settled, Rollback)


def test_snapshot_shares_immutable_handles_and_clone_false_shares_anything():
    for handle in (17, "block-3", (4, 5), None, frozenset({1})):
        assert Decode(1, handle).enter_verify([2]).snapshot is handle
    big = np.zeros(1 << 20)
    v = Decode(1, big).enter_verify([2], clone=False)
    assert v.snapshot is big and v.cache is big
    assert Decode(1, big).enter_verify([2]).snapshot is not big


@pytest.mark.parametrize("bad", [1, "yes", 2.0, object()])
def test_enter_verify_refuses_a_clone_that_is_neither_bool_nor_callable(bad):
    with pytest.raises(TypeError, match="clone"):
        Decode(1, 0).enter_verify([2], clone=bad)


def test_enter_verify_snapshots_arrays_and_keeps_immutable_values():
    # clone=True is the default: an independent copy of what can change in place
    cache = np.zeros(4)
    verifying = Decode(1, cache).enter_verify([2], clone=True)
    assert verifying.cache is cache
    assert verifying.snapshot is not cache
    cache[0] = 5.0  # a later in-place update must not reach the snapshot
    assert verifying.snapshot[0] == 0.0

    layers = [np.zeros(2), (np.ones(2), 3)]
    snap = Decode(1, layers).enter_verify([2], clone=True).snapshot
    layers[0][0] = 9.0
    layers[1][0][0] = 9.0
    assert snap[0][0] == 0.0 and snap[1][0][0] == 1.0 and snap[1][1] == 3

    frozen = ("a", 1, (2, 3))
    assert Decode(1, frozen).enter_verify([2], clone=True).snapshot is frozen
    assert Decode(1, 17).enter_verify([2], clone=True).snapshot == 17

    calls = []
    v = Decode(1, "c").enter_verify([2], clone=lambda c: calls.append(c) or "copied")
    assert v.snapshot == "copied" and calls == ["c"]


def test_accept_with_numpy_rows_and_batched_row_caches():
    row_caches = np.arange(12).reshape(3, 4)
    v = Decode(0, np.zeros(4)).enter_verify(np.array([5, 6, 7], dtype=np.int32))
    out = v.accept(np.array([5, 6, 9]), row_caches)
    assert isinstance(out, Rollback) and out.to == 9
    np.testing.assert_array_equal(out.snapshot, row_caches[2])
    out = v.accept(np.array([5, 6, 7], dtype=np.int64), row_caches)
    assert out == Accept(3, 7, row_caches[2])
    out = v.accept([5, 6, 7], list(row_caches))
    assert out == Accept(3, 7, row_caches[2])


def test_generic_entries():
    v = Decode("a", 0).enter_verify(["b", "c", "d"])
    assert v.accept(["b", "c", "x"], [1, 2, 3]) == Rollback(3, "x")
    assert v.accept(("b", "c", "d"), [1, 2, 3]) == Accept(3, "d", 3)


@pytest.mark.parametrize(
    "accepted, exc",
    [(1.0, TypeError), (True, TypeError), ("1", TypeError), (None, TypeError), (-1, ValueError)],
)
def test_accept_rows_refuses_counts_that_are_not_non_negative_integers(accepted, exc):
    v = Decode(0, 0).enter_verify([1, 2])
    with pytest.raises(exc, match="accepted"):
        v.accept_rows(accepted, [1, 2], [0, 0])


def test_accept_rows_accepts_numpy_integer_counts():
    v = Decode(0, 0).enter_verify([1, 2])
    assert v.accept_rows(np.int64(2), [1, 2], ["a", "b"]) == Accept(2, 2, "b")
    assert v.accept_rows(np.int32(0), [7], ["a", "b"]) == Rollback("a", 7)


SETTLE_REFUSALS = [
    (3, [1, 2], [0, 0], "accepted=3 is beyond the 2-token draft"),
    (1, [1, 2], [0], "row_caches holds 1 entry for a 2-token draft; it needs one per draft row"),
    (1, [1, 2], [0, 0, 0], "row_caches holds 3 entries for a 2-token draft; it needs one per draft row"),
    (1, [1], [0, 0], "row_tokens holds 1 entry; rejecting at row 1 needs row_tokens[1]"),
    (0, [], [0, 0], "row_tokens holds 0 entries; rejecting at row 0 needs row_tokens[0]"),
]


@pytest.mark.parametrize("accepted, row_tokens, row_caches, reason", SETTLE_REFUSALS)
def test_settle_refusals_are_illegal_transitions_that_say_why(accepted, row_tokens, row_caches, reason):
    v = Decode(0, 0).enter_verify([1, 2])
    with pytest.raises(IllegalTransition) as err:
        v.accept_rows(accepted, row_tokens, row_caches)
    assert err.value.attempted == "accept_rows"
    assert err.value.reason == reason
    assert str(err.value) == f"serving fsm: accept_rows is not legal: {reason}"


def test_accept_row_count_mismatch_says_why_in_the_message():
    v = Decode(0, 0).enter_verify([1, 2, 3, 4])
    with pytest.raises(IllegalTransition) as err:
        v.accept([1, 2, 3, 4], ["a", "b", "c"])
    assert str(err.value) == (
        "serving fsm: accept is not legal: row_caches holds 3 entries for a 4-token draft; "
        "it needs one per draft row"
    )
    assert err.value == IllegalTransition("accept")  # identity is the transition, not the reason


@pytest.mark.parametrize("accepted, row_tokens, row_caches, reason", SETTLE_REFUSALS)
def test_compiled_and_twin_settle_refuse_with_identical_messages(compiled, accepted, row_tokens, row_caches, reason):
    from specfsm import _impl

    errors = []
    for settle in (compiled.settle, _impl.kernels("python", "settle").settle):
        with pytest.raises(IllegalTransition) as err:
            settle(2, accepted, len(row_tokens), len(row_caches), "accept")
        errors.append((type(err.value), str(err.value), err.value.reason, err.value.attempted))
    assert errors[0] == errors[1]
    assert errors[0][1] == f"serving fsm: accept is not legal: {reason}"


def test_settle_refuses_an_empty_draft_with_a_reason(impl):
    with pytest.raises(IllegalTransition) as err:
        impl.settle(0, 0, 0, 0, "accept")
    assert str(err.value) == "serving fsm: accept is not legal: the draft is empty: there is no row to settle"


def test_illegal_transition_keeps_its_reason_through_pickle_and_repr():
    err = IllegalTransition("accept", "row_caches holds 1 entry for a 2-token draft")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.reason == err.reason
    assert repr(err) == "IllegalTransition('accept', 'row_caches holds 1 entry for a 2-token draft')"
    assert repr(IllegalTransition("resume")) == "IllegalTransition('resume')"
    with pytest.raises(TypeError, match="reason must be a str"):
        IllegalTransition("accept", 3)


@pytest.mark.parametrize("draft", [[], (), np.array([], dtype=np.int64), np.array([], dtype=np.int32)])
def test_enter_verify_takes_an_empty_draft_and_accept_refuses_it(draft):
    # the design: enter_verify accepts any Vec, accept and accept_rows refuse an empty
    # draft and leave the state intact
    verifying = Decode(0, "c").enter_verify(draft)
    assert isinstance(verifying, Verify) and len(verifying.draft) == 0
    assert Verify(draft, "s", "c").snapshot == "s"
    for call, attempted in (
        (lambda: verifying.accept([], []), "accept"),
        (lambda: verifying.accept([7], ["r"]), "accept"),
        (lambda: verifying.accept_rows(0, [], []), "accept_rows"),
        (lambda: verifying.accept_rows(0, [7], ["r"]), "accept_rows"),
        (lambda: verifying.accept_with(specfsm.Exact(), [7], ["r"]), "accept_rows"),
    ):
        with pytest.raises(IllegalTransition) as err:
            call()
        assert err.value.attempted == attempted
        assert "the draft is empty" in str(err.value)
    assert verifying == Verify(draft, "c", "c")
    assert verifying.finish() == Done("c")


@pytest.mark.parametrize("positions", [[], (), np.array([], dtype=np.int64)])
def test_start_takes_an_empty_prompt_as_the_design_does(positions):
    # the design's start takes any Vec; its action fixture starts from none and lets the
    # first advance_prefill produce the first entry
    state = ServingState.start(positions, None)
    assert isinstance(state, Prefill) and len(state.positions) == 0
    assert Prefill(positions, None) == state
    assert state.advance_prefill(4, 1) == Decode(4, 1)


def test_empty_prompts_are_a_batching_rule_only():
    from specfsm.machine.batch import BatchState

    batch = BatchState(2, 4)
    with pytest.raises(ValueError, match="empty"):
        batch.admit([0], [], [0, 0], [0])
    assert isinstance(ServingState.start([], 0), Prefill)


@pytest.mark.parametrize("bad", ["abc", b"ab", 3, None, np.zeros((2, 2), dtype=np.int64)])
def test_start_and_enter_verify_refuse_what_is_not_a_sequence(bad):
    with pytest.raises((TypeError, ValueError)):
        ServingState.start(bad, 0)
    with pytest.raises((TypeError, ValueError)):
        Decode(0, 0).enter_verify(bad)


def test_accept_next_and_rollback_to_are_python_ints_for_numpy_tokens():
    for draft in (np.array([5, 6, 7], dtype=np.int32), [np.int64(5), np.int64(6), np.int64(7)]):
        v = Decode(0, "c").enter_verify(draft)
        out = v.accept(np.array([5, 6, 7], dtype=np.int64), ["a", "b", "c"])
        assert out == Accept(3, 7, "c") and type(out.next) is int
        out = v.accept(np.array([5, 9, 7], dtype=np.int32), ["a", "b", "c"])
        assert out == Rollback("b", 9) and type(out.to) is int
        out = v.accept_rows(3, [np.uint64(5)], ["a", "b", "c"])
        assert type(out.next) is int
        out = v.accept_rows(0, np.array([8], dtype=np.uint16), ["a", "b", "c"])
        assert out == Rollback("a", 8) and type(out.to) is int
    v = Decode("a", 0).enter_verify(["b", "c"])  # tokens that are not integers stay as they are
    assert v.accept(["b", "c"], [1, 2]).next == "c"


def test_serving_state_is_generic_without_changing_instances():
    assert ServingState[int, str] is not None
    d = Decode[int, str](1, "a")
    assert type(d) is Decode and d == Decode(1, "a")
    assert not hasattr(d, "__dict__")
    with pytest.raises(FrozenInstanceError):
        d.last = 2


def test_bad_arrays_are_refused_with_clear_errors():
    with pytest.raises(ValueError, match="draft must be 1-D"):
        Decode(0, 0).enter_verify(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="unsupported dtype float64"):
        Decode(0, 0).enter_verify(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="draft must be"):
        Decode(0, 0).enter_verify(5)
    v = Decode(0, 0).enter_verify([1, 2])
    with pytest.raises(ValueError, match="row_tokens must be 1-D"):
        v.accept(np.zeros((2, 2), dtype=np.int64), [0, 0])
    with pytest.raises(ValueError, match="row_tokens must be 1-D"):
        v.accept_rows(1, np.zeros((2, 2), dtype=np.int64), [0, 0])
    with pytest.raises(TypeError, match="row_caches"):
        v.accept([1, 2], 5)
    with pytest.raises(ValueError, match="n must be"):
        Accept(-1, 0, 0)


class Elementwise:
    """An array-like whose == is elementwise and whose truth value is ambiguous (like a
    CuPy array or a torch tensor), and which refuses to compare unlike shapes."""

    def __init__(self, values):
        self.values = np.asarray(values)
        self.shape = self.values.shape

    def __eq__(self, other):
        if self.shape != other.shape:
            raise RuntimeError("shapes differ")
        return self.values == other.values


def test_equality_of_array_like_caches_that_are_not_numpy():
    assert Decode(1, Elementwise([1, 2])) == Decode(1, Elementwise([1, 2]))
    assert Decode(1, Elementwise([1, 2])) != Decode(1, Elementwise([1, 3]))
    assert Decode(1, Elementwise([1, 2])) != Decode(1, Elementwise([1, 2, 3]))
