"""The state machine's tree verify: ``Decode.enter_verify_tree`` and ``VerifyTree`` (its
fields, ``path``, ``accept`` and what it refuses), a chain given as a tree settling
exactly as the chain verify does (``Verify.accept`` on a rejection, ``BatchState(bonus=True)``
when every token is accepted), on the active implementation."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specfsm
from specfsm import (
    Accept,
    BatchState,
    Decode,
    Done,
    IllegalTransition,
    Prefill,
    Rollback,
    ServingState,
    Verify,
    VerifyTree,
)

from test_tree import reference_path, tree_and_rows

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

T, P = (5, 6, 7, 8, 9), (-1, 0, 0, 1, -1)  # root -> 0:5 -> {1:6 -> 3:8, 2:7}; root -> 4:9
CACHES = ["r0", "r1", "r2", "r3", "r4", "r5"]


def tree_state(cache="c"):
    return Decode(3, cache).enter_verify_tree(list(T), list(P))


def test_enter_verify_tree_from_decode(fsm):
    v = tree_state()
    assert type(v) is VerifyTree
    assert v.tokens == T and v.parents == P
    assert v.snapshot == "c" and v.cache == "c"
    assert all(type(x) is int for x in v.tokens + v.parents)
    assert v == VerifyTree(T, P, "c", "c") and hash(v) == hash(VerifyTree(list(T), list(P), "c", "c"))
    assert pickle.loads(pickle.dumps(v)) == v
    assert "VerifyTree(tokens=(5, 6, 7, 8, 9)" in repr(v)
    match v:
        case VerifyTree(tokens, parents, snapshot, cache):
            assert (tokens, parents, snapshot, cache) == (T, P, "c", "c")


def test_enter_verify_tree_takes_arrays_and_copies_a_mutable_cache(fsm):
    cache = np.arange(4)
    v = Decode(3, cache).enter_verify_tree(np.array(T, dtype=np.int32), np.array(P))
    assert v.tokens == T and v.parents == P
    assert v.cache is cache and v.snapshot is not cache and np.array_equal(v.snapshot, cache)
    shared = Decode(3, cache).enter_verify_tree(T, P, clone=False)
    assert shared.snapshot is cache
    assert Decode(3, cache).enter_verify_tree(T, P, clone=lambda c: "mine").snapshot == "mine"
    with pytest.raises(TypeError, match="clone must be None, a bool or a callable"):
        Decode(3, cache).enter_verify_tree(T, P, clone=3)


@pytest.mark.parametrize("state", [
    Prefill([1, 2], "c"),
    Verify([1], "s", "c"),
    Accept(1, 2, "c"),
    Rollback("s", 2),
    Done("c"),
    VerifyTree([1], [-1], "s", "c"),
])
def test_enter_verify_tree_is_refused_from_every_other_state(fsm, state):
    with pytest.raises(IllegalTransition) as e:
        state.enter_verify_tree([1], [-1])
    assert e.value.attempted == "enter_verify_tree" and e.value.reason is None


def test_verify_tree_refuses_the_other_transitions(fsm):
    v = tree_state()
    for call in (lambda: v.advance_prefill(1, "c"), lambda: v.advance_decode(1, "c"),
                 lambda: v.enter_verify([1]), lambda: v.resume(), lambda: v.rollback(),
                 lambda: v.accept_rows(1, [1], ["c"])):
        with pytest.raises(IllegalTransition):
            call()
    assert v.finish() == Done("c")


@pytest.mark.parametrize("tokens,parents,exc,msg", [
    ([1, 2], [-1, 1], ValueError, "parents[1]=1 is not before node 1"),
    ([1, 2, 3], [-1, 2, 0], ValueError, "parents[1]=2 is not before node 1"),
    ([1, 1], [-1, -1], ValueError, "nodes 0 and 1 are siblings"),
    ([], [], ValueError, "the tree is empty"),
    ([1], [-1, 0], ValueError, "the same length"),
    ([1.5], [-1], TypeError, "tokens[0] must be an integer token id"),
])
def test_bad_trees_are_refused(fsm, tokens, parents, exc, msg):
    with pytest.raises(exc) as e:
        Decode(3, "c").enter_verify_tree(tokens, parents)
    assert msg in str(e.value)
    with pytest.raises(exc):
        VerifyTree(tokens, parents, "s", "c")


def test_accept_by_hand(fsm):
    v = tree_state()
    # 5, 6, 8 confirmed: node 3 is a leaf -> Accept, resuming after row 4 (node 3's)
    assert v.path([5, 6, 8, 0, 1, 2]) == [0, 1, 3]
    assert v.accept([5, 6, 8, 0, 1, 2], CACHES) == Accept(3, 1, "r4")
    # 5 then 7: node 2 is a leaf -> Accept from row 3
    assert v.accept([5, 7, 0, 4, 0, 0], CACHES) == Accept(2, 4, "r3")
    # 5 then 1: node 0 has children, none is 1 -> Rollback from row 1
    assert v.accept([5, 1, 0, 0, 0, 0], CACHES) == Rollback("r1", 1)
    # nothing confirmed -> Rollback to the target's first token from row 0
    assert v.accept([2, 0, 0, 0, 0, 0], CACHES) == Rollback("r0", 2)
    # the bonus token and the rollback token come back as Python ints
    got = v.accept(np.array([9, 0, 0, 0, 0, 7], dtype=np.int32), CACHES)
    assert got == Accept(1, 7, "r5") and type(got.next) is int


def test_accept_refusals_leave_the_state_intact(fsm):
    v = tree_state()
    before = VerifyTree(T, P, "c", "c")
    with pytest.raises(IllegalTransition) as e:
        v.accept([5, 6, 8], CACHES)
    assert e.value.attempted == "accept" and "row_tokens holds 3 rows for a tree of 5 nodes" in e.value.reason
    with pytest.raises(IllegalTransition) as e:
        v.accept([5, 6, 8, 0, 1, 2], CACHES[:3])
    assert "row_caches holds 3 entries for a tree of 5 nodes; it needs N + 1 = 6" in e.value.reason
    with pytest.raises(TypeError, match=r"row_tokens\[1\] must be an integer token id"):
        v.accept([5, "x", 8, 0, 1, 2], CACHES)
    with pytest.raises(TypeError, match="row_caches must be a sized sequence"):
        v.accept([5, 6, 8, 0, 1, 2], iter(CACHES))
    with pytest.raises(ValueError, match="row_tokens holds 2 rows"):
        v.path([5, 6])
    assert v == before and v.accept([5, 6, 8, 0, 1, 2], CACHES) == Accept(3, 1, "r4")


@SETTINGS
@given(case=tree_and_rows())
def test_accept_follows_the_reference(fsm, case):
    tokens, parents, rows = case
    v = Decode(0, "c").enter_verify_tree(tokens, parents)
    caches = [f"r{i}" for i in range(len(rows))]
    path = reference_path(tokens, parents, rows)
    assert v.path(rows) == path
    r = path[-1] + 1 if path else 0
    leaf = bool(path) and path[-1] not in parents
    want = Accept(len(path), rows[r], caches[r]) if leaf else Rollback(caches[r], rows[r])
    assert v.accept(rows, caches) == want


@SETTINGS
@given(data=st.data())
def test_a_chain_as_a_tree_is_the_chain_verify_with_the_bonus_row(fsm, data):
    K = data.draw(st.integers(1, 8))
    draft = data.draw(st.lists(st.integers(0, 3), min_size=K, max_size=K))
    rows = data.draw(st.lists(st.integers(0, 3), min_size=K + 1, max_size=K + 1))
    caches = [f"r{i}" for i in range(K + 1)]
    chain = Decode(1, "c").enter_verify_tree(draft, list(range(-1, K - 1)))
    got = chain.accept(rows, caches)
    verify = Decode(1, "c").enter_verify(draft)
    m = next((i for i in range(K) if draft[i] != rows[i]), K)
    if m < K:  # rejected at row m: exactly Verify.accept's Rollback
        assert got == verify.accept(rows[:K], caches[:K])
        assert got == Rollback(caches[m], rows[m])
    else:  # every token accepted: the bonus row's token, from the bonus row's cache
        assert got == Accept(K, rows[K], caches[K])
    # BatchState(bonus=True) settles the same verify the same way
    b = BatchState(1, 8, True)
    b.admit([0], [1], [0, 1], [0])
    b.step(np.array([1], dtype=np.int64))   # prefill -> Decode(1)
    b.enter_verify([0], draft, [0, K])
    res = b.step(np.array(rows, dtype=np.int64))
    emitted = [draft[i] for i in chain.path(rows)] + [got.next if isinstance(got, Accept) else got.to]
    assert res.emitted_by_slot()[0] == emitted
    assert int(res.accepted[0]) == m
    assert bool(res.rolled_back[0]) == isinstance(got, Rollback)


def test_verify_tree_is_exported(fsm):
    assert specfsm.VerifyTree is VerifyTree and issubclass(VerifyTree, ServingState)
    for name in ("check_tree", "accept_tree", "accept_tree_batch", "place_path", "place_path_batch"):
        assert name in specfsm.__all__ and callable(getattr(specfsm, name))
