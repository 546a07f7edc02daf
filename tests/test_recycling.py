"""The recycling table (``RecyclingTable``, ``tree_shape``) and ``merge_trees``.

Both implementations against ``Reference`` below, a plain transcription of the rule in
``specfsm.drafting._recycling_py``'s docstring (a dict of rows; the shape taken
best-first from an explicit frontier, each slot's score the product of its path's
weights, ties by creation order; the tree walked slot by slot): compiled == twin ==
reference on worked examples and on hypothesis' random updates, budgets, depths, widths,
ks and vocabularies. Then the refusals (the same exception and message on both, nothing
changed), pickling, the guard (an object made with ``__new__``, a second ``__init__``),
host tensors through DLPack (no torch needed), and ``merge_trees``'s contract.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm import _impl
from specfsm.drafting._tree_checks import DEFAULT_RECYCLE_K, MAX_RECYCLE_K, MAX_TREE_NODES, RANK_WEIGHTS
from specfsm.drafting.recycling import merge_trees

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def rec(impl):
    return impl.module("recycling")


def modules():
    """The twin, then the compiled module unless the compiled core is switched off."""
    out = [_impl.kernels("python", "recycling")]
    if not _impl.NO_EXTENSIONS:
        out.append(_impl.kernels("compiled", "recycling"))
    return out


# --------------------------------------------------------------------------------------
# the reference
# --------------------------------------------------------------------------------------
class Reference:
    """The rule, written plainly: a dict of rows, the shape from an explicit frontier."""

    def __init__(self, vocab: int, k: int) -> None:
        self.vocab, self.k = vocab, k
        self.rows: dict[int, list[int]] = {}
        self.updates = 0

    def update(self, tokens, topk) -> None:
        for t, ids in zip(tokens, topk):
            row: list[int] = []
            for i in ids:
                if i not in row and len(row) < self.k:
                    row.append(i)
            self.rows[t] = row          # a later row of the same token replaces it
            self.updates += 1

    def row(self, t: int) -> list[int]:
        return self.rows.get(t, [])

    def filled(self) -> int:
        return sum(1 for r in self.rows.values() if r)

    def tree(self, last, budget, max_depth=None, max_width=None):
        width = self.k if max_width is None else min(max_width, self.k)
        node = {(): (-1, last)}         # a kept slot's path -> (its node, its token)
        toks, pars = [], []
        for path in shape(budget, budget if max_depth is None else max_depth, width):
            parent = node.get(path[:-1])
            if parent is None:
                continue
            row = self.row(parent[1])
            if path[-1] < len(row):
                node[path] = (len(toks), row[path[-1]])
                toks.append(row[path[-1]])
                pars.append(parent[0])
        return toks, pars


def score(path: tuple[int, ...]) -> float:
    """A slot's score: the root's 1.0 times its path's weights, one multiply per level."""
    return 1.0 if not path else score(path[:-1]) * RANK_WEIGHTS[path[-1]]


def shape(budget: int, depth: int, width: int) -> list[tuple[int, ...]]:
    """The slots (paths of ranks) in the order they are taken: the highest score of the
    frontier first, the slot created first among equal scores."""
    frontier = [(r,) for r in range(width)]
    created = {p: i for i, p in enumerate(frontier)}
    scores = {p: score(p) for p in frontier}
    taken: list[tuple[int, ...]] = []
    while frontier and len(taken) < budget:
        best = max(frontier, key=lambda p: (scores[p], -created[p]))
        frontier.remove(best)
        taken.append(best)
        if len(best) < depth:
            for r in range(width):
                child = best + (r,)
                created[child] = len(created)
                scores[child] = score(child)
                frontier.append(child)
    return taken


def shape_lists(budget, depth, width):
    """``shape`` in ``tree_shape``'s form: each slot's parent slot and rank."""
    taken = shape(budget, depth, width)
    at = {p: i for i, p in enumerate(taken)}
    return [at[p[:-1]] if len(p) > 1 else -1 for p in taken], [p[-1] for p in taken]


def state(t) -> tuple:
    """Everything a caller can read off a table."""
    return (t.vocab_size, t.k, t.updates, t.filled(), t.nbytes, repr(t),
            [t.row(i).tolist() for i in range(t.vocab_size)])


def tree_lists(pair) -> tuple[list[int], ...]:
    for a in pair:
        assert a.dtype == np.int64 and a.ndim == 1
    return tuple(a.tolist() for a in pair)


# --------------------------------------------------------------------------------------
# the shape
# --------------------------------------------------------------------------------------
def test_the_shape_of_a_worked_example(rec):
    # the root's children score 0.45 and 0.12; taken: 0.45 (slot 0), 0.45 * 0.45 (slot 1,
    # under 0), 0.12 (slot 2), 0.45 * 0.45 * 0.45 (under 1), then 0.45 * 0.12 (under 0)
    # and 0.12 * 0.45 (under 2), equal scores, in the order they were created
    parents, ranks = rec.tree_shape(6, 6, 2)
    assert parents == [-1, 0, -1, 1, 0, 2] and ranks == [0, 0, 1, 0, 1, 0]
    assert RANK_WEIGHTS[0] * RANK_WEIGHTS[1] == RANK_WEIGHTS[1] * RANK_WEIGHTS[0]


def test_ties_go_to_the_slot_created_first(rec):
    # rank 1 under rank 0 and rank 0 under rank 1 score alike; rank 0's children were
    # created when it was taken, before rank 1 was
    parents, ranks = rec.tree_shape(64, 2, 3)
    slots = list(zip(parents, ranks))
    first, second = slots.index((-1, 0)), slots.index((-1, 1))
    assert slots.index((first, 1)) < slots.index((second, 0))


@pytest.mark.parametrize("budget, depth, width", [
    (1, 1, 1), (5, 1, 8), (64, 64, 8), (64, 3, 8), (40, 40, 1), (100, 4, 3), (120, 120, 12), (30, 2, 32),
])
def test_the_shape_is_the_references(rec, budget, depth, width):
    assert rec.tree_shape(budget, depth, width) == shape_lists(budget, depth, width)


def test_the_largest_shapes_agree():
    got = [m.tree_shape(MAX_TREE_NODES, MAX_TREE_NODES, w) for m in modules() for w in (1, 8, MAX_RECYCLE_K)]
    if len(got) == 6:
        assert got[:3] == got[3:]
    chain = got[0]  # width 1: a chain 1024 deep, scores underflowing to 0.0 on the way
    assert chain == (list(range(-1, MAX_TREE_NODES - 1)), [0] * MAX_TREE_NODES)


@SETTINGS
@given(budget=st.integers(1, 150), depth=st.integers(1, 12), width=st.integers(1, 10))
def test_tree_shape_compiled_twin_and_reference_agree(budget, depth, width):
    want = shape_lists(budget, depth, width)
    for m in modules():
        parents, ranks = m.tree_shape(budget, depth, width)
        assert (parents, ranks) == want
        # parents first, lower-ranked siblings first, at most the budget
        assert all(p < i for i, p in enumerate(parents)) and len(parents) <= budget
        for i, (p, r) in enumerate(zip(parents, ranks)):
            assert r == 0 or (p, r - 1) in list(zip(parents, ranks))[:i]


@pytest.mark.parametrize("args, exc, message", [
    ((0, 1, 1), ValueError, "budget must be between 1 and 1024, got 0"),
    ((1025, 1, 1), ValueError, "budget must be between 1 and 1024, got 1025"),
    ((4, 0, 1), ValueError, "max_depth must be between 1 and 1024, got 0"),
    ((4, 4, 0), ValueError, "width must be between 1 and 32, got 0"),
    ((4, 4, 33), ValueError, "width must be between 1 and 32, got 33"),
    ((4.0, 4, 2), TypeError, "budget must be a non-negative integer, got float 4.0"),
    ((4, True, 2), TypeError, "max_depth must be a non-negative integer, got bool True"),
    ((4, 4, None), TypeError, "width must be a non-negative integer, got NoneType None"),
    ((2**64, 4, 2), ValueError, "budget must be between 1 and 1024"),
])
def test_tree_shape_refuses_bad_limits(rec, args, exc, message):
    with pytest.raises(exc, match=message.replace("(", r"\(")):
        rec.tree_shape(*args)


# --------------------------------------------------------------------------------------
# the table: update, rows, trees
# --------------------------------------------------------------------------------------
def test_a_fresh_table_is_empty(rec):
    t = rec.RecyclingTable(10)
    assert (t.vocab_size, t.k, t.updates, t.filled(), t.nbytes) == (10, DEFAULT_RECYCLE_K, 0, 0, 10 * 8 * 4)
    assert t.row(3).tolist() == [] and t.row(3).dtype == np.int64
    assert tree_lists(t.propose_tree(3, 16)) == ([], [])
    toks, pars, off = t.propose_trees([1, 2], 16)
    assert toks.tolist() == [] and pars.tolist() == [] and off.tolist() == [0, 0, 0] and off.dtype == np.int64
    assert repr(t) == "RecyclingTable(vocab_size=10, k=8)"


@pytest.mark.parametrize("vocab, k", [(1, 1), (7, 3), (49152, 8), (1000, 32)])
def test_nbytes_is_four_bytes_an_id(rec, vocab, k):
    assert rec.RecyclingTable(vocab, k).nbytes == vocab * k * 4


def test_update_keeps_distinct_ids_in_rank_order_at_most_k(rec):
    t = rec.RecyclingTable(20, 3)
    t.update([5], [[7, 7, 2, 7, 9, 1]])
    assert t.row(5).tolist() == [7, 2, 9]
    t.update([6], [[4, 4, 4]])
    assert t.row(6).tolist() == [4]
    t.update([6], [[1, 2]])            # a row replaces the token's row, it does not merge
    assert t.row(6).tolist() == [1, 2]
    assert t.filled() == 2 and t.updates == 3


def test_the_last_row_of_a_token_wins_and_every_row_counts(rec):
    t = rec.RecyclingTable(10, 2)
    t.update(np.array([1, 2, 1, 3, 1]), np.array([[2, 3], [4, 5], [6, 7], [8, 9], [0, 1]]))
    assert [t.row(i).tolist() for i in (1, 2, 3)] == [[0, 1], [4, 5], [8, 9]]
    assert t.updates == 5 and t.filled() == 3


@pytest.mark.parametrize("topk", [
    [3, 4], (3, 4), np.array([3, 4], dtype=np.int32), [[3], [4]], np.array([[3], [4]], dtype=np.uint8),
    [np.int64(3), np.int32(4)],
])
def test_one_id_per_row_in_any_form(rec, topk):
    t = rec.RecyclingTable(10, 4)
    t.update([1, 2], topk)
    assert (t.row(1).tolist(), t.row(2).tolist()) == ([3], [4])


def test_update_takes_every_integer_layout(rec):
    want = None
    for how in ["list", "tuple", np.int64, np.int32, np.uint16, ">i8", "fortran", "strided", "readonly"]:
        x = [[3, 1, 3, 2], [0, 0, 5, 6]]
        if how == "list":
            topk = x
        elif how == "tuple":
            topk = tuple(tuple(r) for r in x)
        elif how == "fortran":
            topk = np.asfortranarray(np.array(x))
        elif how == "strided":
            topk = np.repeat(np.array(x), 2, axis=1)[:, ::2]
        elif how == "readonly":
            topk = np.array(x)
            topk.flags.writeable = False
        else:
            topk = np.array(x, dtype=how)
        t = rec.RecyclingTable(8, 3)
        t.update(np.array([4, 7], dtype=np.int32), topk)
        got = state(t)
        assert want is None or got == want, how
        want = got
    assert want[-1][4] == [3, 1, 2] and want[-1][7] == [0, 5, 6]


def test_an_empty_update_counts_nothing(rec):
    t = rec.RecyclingTable(4)
    t.update([], [])
    t.update(np.zeros(0, dtype=np.int64), np.zeros((0, 3), dtype=np.int64))
    assert t.updates == 0 and t.filled() == 0


def test_a_tree_of_a_worked_example(rec):
    t = rec.RecyclingTable(10, 2)
    t.update([1, 2, 4], [[2, 3], [4, 5], [7, 8]])
    t.update([3], [[6]])
    # shape (budget 6, width 2): r0, r0.r0, r1, r0.r0.r0, r0.r1, r1.r0
    # tokens: 2, 4, 3, 7, 5, 6 (3's row has only rank 0)
    assert tree_lists(t.propose_tree(1, 6)) == ([2, 4, 3, 7, 5, 6], [-1, 0, -1, 1, 0, 2])
    assert tree_lists(t.propose_tree(1, 6, max_depth=1)) == ([2, 3], [-1, -1])
    assert tree_lists(t.propose_tree(1, 6, max_width=1)) == ([2, 4, 7], [-1, 0, 1])
    assert tree_lists(t.propose_tree(3, 6)) == ([6], [-1])       # 6's row is empty
    assert tree_lists(t.propose_tree(1, 6, None, 100)) == tree_lists(t.propose_tree(1, 6))


def test_propose_trees_is_propose_tree_for_each_root(rec):
    t = rec.RecyclingTable(10, 2)
    t.update([1, 2, 4], [[2, 3], [4, 5], [7, 8]])
    t.update([3], [[6]])
    lasts = [1, 5, 3, 1, 4]
    toks, pars, off = t.propose_trees(lasts, 5, 3)
    assert off[0] == 0 and off[-1] == len(toks) == len(pars)
    for i, last in enumerate(lasts):
        a, p = t.propose_tree(last, 5, 3)
        assert toks[off[i]:off[i + 1]].tolist() == a.tolist() and pars[off[i]:off[i + 1]].tolist() == p.tolist()


# random tables: updates of every shape, ids from a small range so rows repeat ids
@st.composite
def tables(draw):
    vocab = draw(st.integers(1, 30))
    k = draw(st.one_of(st.integers(1, 9), st.just(MAX_RECYCLE_K)))
    steps = []
    for _ in range(draw(st.integers(0, 5))):
        n = draw(st.integers(0, 12))
        m = draw(st.integers(1, k + 3))
        ids = st.integers(0, vocab - 1)
        steps.append((draw(st.lists(ids, min_size=n, max_size=n)),
                      draw(st.lists(st.lists(ids, min_size=m, max_size=m), min_size=n, max_size=n)),
                      draw(st.sampled_from(["list", "int64", "int32"]))))
    return vocab, k, steps


def _apply(t, steps):
    for tokens, topk, how in steps:
        if how == "list" or not tokens:
            t.update(tokens, topk)
        else:
            t.update(np.array(tokens, dtype=how), np.array(topk, dtype=how))


@SETTINGS
@given(table=tables(), budget=st.integers(1, 90), depth=st.one_of(st.none(), st.integers(1, 10)),
       width=st.one_of(st.none(), st.integers(1, 40)), lasts=st.lists(st.integers(0, 10**6), max_size=10))
def test_compiled_twin_and_reference_agree(table, budget, depth, width, lasts):
    vocab, k, steps = table
    ref = Reference(vocab, k)
    for tokens, topk, _ in steps:
        ref.update(tokens, topk)
    lasts = [x % vocab for x in lasts]
    want_trees = [ref.tree(x, budget, depth, width) for x in range(vocab)]
    for m in modules():
        t = m.RecyclingTable(vocab, k)
        _apply(t, steps)
        assert t.updates == ref.updates and t.filled() == ref.filled()
        assert [t.row(i).tolist() for i in range(vocab)] == [ref.row(i) for i in range(vocab)]
        assert [tree_lists(t.propose_tree(x, budget, depth, width)) for x in range(vocab)] == want_trees
        toks, pars, off = t.propose_trees(lasts, budget, depth, width)
        assert off.tolist()[0] == 0 and len(off) == len(lasts) + 1
        for i, x in enumerate(lasts):
            assert (toks[off[i]:off[i + 1]].tolist(), pars[off[i]:off[i + 1]].tolist()) == want_trees[x]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), vocab=st.sampled_from([3, 50, 5000]), k=st.sampled_from([1, 8, 32]),
       budget=st.sampled_from([64, 512, MAX_TREE_NODES]), depth=st.sampled_from([None, 4, 40]))
def test_large_trees_compiled_and_twin_agree(seed, vocab, k, budget, depth):
    """Full tables, budgets up to the limit: the two implementations tree for tree."""
    rng = np.random.default_rng(seed)
    ms = modules()
    tabs = [m.RecyclingTable(vocab, k) for m in ms]
    tokens = rng.integers(0, vocab, 3 * vocab)
    topk = rng.integers(0, vocab, (3 * vocab, k + 2))
    lasts = rng.integers(0, vocab, 17)
    got = []
    for t in tabs:
        t.update(tokens, topk)
        got.append((state(t), [a.tolist() for a in t.propose_trees(lasts, budget, depth)],
                    tree_lists(t.propose_tree(int(lasts[0]), budget, depth))))
    assert all(g == got[0] for g in got[1:])
    assert len(got[0][1][0]) <= budget * len(lasts)


# --------------------------------------------------------------------------------------
# refusals: the same exception and message on both, nothing changed
# --------------------------------------------------------------------------------------
class DeviceTensor:
    """A stand-in for a tensor in device memory (DLPack device type 2, CUDA)."""

    def __dlpack__(self, stream=None):
        raise AssertionError("a host-side call must not export device memory")

    def __dlpack_device__(self):
        return (2, 0)


class HostTensor:
    """Another library's tensor in host memory: numpy's own DLPack export."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


REFUSED_INIT = [
    ((0,), ValueError, "vocab_size must be between 1 and 2147483647, got 0"),
    ((2**31,), ValueError, "vocab_size must be between 1 and 2147483647, got 2147483648"),
    ((-1,), ValueError, "vocab_size must be a non-negative integer, got -1"),
    ((10.0,), TypeError, "vocab_size must be a non-negative integer, got float 10.0"),
    ((True,), TypeError, "vocab_size must be a non-negative integer, got bool True"),
    (("10",), TypeError, "vocab_size must be a non-negative integer, got str '10'"),
    ((10, 0), ValueError, "k must be between 1 and 32, got 0"),
    ((10, 33), ValueError, "k must be between 1 and 32, got 33"),
    ((10, 2.0), TypeError, "k must be a non-negative integer, got float 2.0"),
    ((10, None), TypeError, "k must be a non-negative integer, got NoneType None"),
]


@pytest.mark.parametrize("args, exc, message", REFUSED_INIT)
def test_bad_settings_are_refused(rec, args, exc, message):
    with pytest.raises(exc) as info:
        rec.RecyclingTable(*args)
    assert str(info.value) == message


#: (label, call on a 10-id, k = 3 table) refused with (exception, message start)
REFUSED_CALLS = [
    ("token outside", lambda t: t.update([10], [[1]]), ValueError, "tokens[0] = 10 is outside the vocabulary 0..9"),
    ("negative token", lambda t: t.update([1, -1], [[1], [2]]), ValueError, "tokens[1] = -1 is outside"),
    ("id outside", lambda t: t.update([1, 2], [[1, 2], [3, 10]]), ValueError, "topk[1, 1] = 10 is outside"),
    ("negative id", lambda t: t.update([1], np.array([[-1, 2]])), ValueError, "topk[0, 0] = -1 is outside"),
    ("rows for tokens", lambda t: t.update([1, 2], [[1]]), ValueError, "topk has 1 rows for 2 tokens"),
    ("ragged rows", lambda t: t.update([1, 2], [[1], [1, 2]]), ValueError, "topk's rows must be equally long"),
    ("3-D", lambda t: t.update([1], np.zeros((1, 1, 1), dtype=np.int64)), ValueError, "topk must be 2-D"),
    ("0-D", lambda t: t.update([1], np.array(3)), ValueError, "topk must be 2-D"),
    ("empty rows", lambda t: t.update([1], np.zeros((1, 0), dtype=np.int64)), ValueError,
     "topk's rows must hold at least one id"),
    ("float ids", lambda t: t.update([1], np.array([[1.0]])), TypeError, "topk has unsupported dtype float64"),
    ("bool ids", lambda t: t.update([1], np.array([[True]])), TypeError, "topk has unsupported dtype bool"),
    ("object ids", lambda t: t.update([1], np.array([[1]], dtype=object)), TypeError, "topk has unsupported dtype"),
    ("float in a row", lambda t: t.update([1], [[1, 2.0]]), TypeError, "topk[0][1] must be an integer token id"),
    ("bool in a row", lambda t: t.update([1], [[True]]), TypeError, "topk[0][0] must be an integer token id"),
    ("float token", lambda t: t.update([1.0], [[1]]), TypeError, "tokens[0] must be an integer token id"),
    ("float tokens", lambda t: t.update(np.array([1.0]), [[1]]), TypeError, "tokens has unsupported dtype"),
    ("2-D tokens", lambda t: t.update(np.array([[1]]), [[1]]), ValueError, "tokens must be 1-D"),
    ("topk a string", lambda t: t.update([1], "1"), TypeError, "topk must be a 2-D integer array or a list of rows"),
    ("huge id", lambda t: t.update([1], np.array([[2**64 - 1]], dtype=np.uint64)), OverflowError,
     "topk holds ids beyond int64"),
    ("device topk", lambda t: t.update([1], DeviceTensor()), TypeError, "topk is a DeviceTensor in device memory"),
    ("last outside", lambda t: t.propose_tree(10, 4), ValueError, "last = 10 is outside the vocabulary 0..9"),
    ("last negative", lambda t: t.propose_tree(-1, 4), ValueError, "last = -1 is outside"),
    ("last float", lambda t: t.propose_tree(1.0, 4), TypeError, "last must be an integer token id"),
    ("last bool", lambda t: t.propose_tree(True, 4), TypeError, "last must be an integer token id"),
    ("budget 0", lambda t: t.propose_tree(1, 0), ValueError, "budget must be between 1 and 1024, got 0"),
    ("budget big", lambda t: t.propose_tree(1, 1025), ValueError, "budget must be between 1 and 1024, got 1025"),
    ("budget float", lambda t: t.propose_tree(1, 4.0), TypeError, "budget must be a non-negative integer"),
    ("budget bool", lambda t: t.propose_tree(1, True), TypeError, "budget must be a non-negative integer, got bool"),
    ("budget None", lambda t: t.propose_tree(1, None), TypeError, "budget must be a non-negative integer"),
    ("depth 0", lambda t: t.propose_tree(1, 4, 0), ValueError, "max_depth must be between 1 and 1024, got 0"),
    ("width 0", lambda t: t.propose_tree(1, 4, None, 0), ValueError, "max_width must be between 1 and 1024"),
    ("width float", lambda t: t.propose_tree(1, 4, None, 2.0), TypeError, "max_width must be a non-negative"),
    ("lasts outside", lambda t: t.propose_trees([1, 10], 4), ValueError, "lasts[1] = 10 is outside"),
    ("lasts 2-D", lambda t: t.propose_trees(np.array([[1]]), 4), ValueError, "lasts must be 1-D"),
    ("lasts floats", lambda t: t.propose_trees([1.0], 4), TypeError, "lasts[0] must be an integer token id"),
    ("lasts scalar", lambda t: t.propose_trees(1, 4), TypeError, "lasts must be a list, tuple or 1-D integer"),
    ("trees budget", lambda t: t.propose_trees([1], 0), ValueError, "budget must be between 1 and 1024"),
    ("trees depth", lambda t: t.propose_trees([1], 4, -1), ValueError, "max_depth must be a non-negative"),
    ("row outside", lambda t: t.row(10), ValueError, "token = 10 is outside the vocabulary 0..9"),
    ("row float", lambda t: t.row(1.5), TypeError, "token must be an integer token id"),
]


@pytest.mark.parametrize("label, call, exc, message", REFUSED_CALLS, ids=[c[0] for c in REFUSED_CALLS])
def test_bad_calls_are_refused_alike_and_change_nothing(label, call, exc, message):
    seen = []
    for m in modules():
        t = m.RecyclingTable(10, 3)
        t.update([1, 2, 3], [[2, 3, 4], [5, 5, 6], [1, 1, 1]])
        before = state(t)
        with pytest.raises(exc) as info:
            call(t)
        assert str(info.value).startswith(message), str(info.value)
        assert state(t) == before
        seen.append(str(info.value))
    assert len(set(seen)) == 1, seen


def test_host_tensors_are_read_through_dlpack(rec):
    t = rec.RecyclingTable(10, 3)
    t.update(HostTensor(np.array([1, 2])), HostTensor(np.array([[2, 2, 3], [4, 5, 6]], dtype=np.int32)))
    assert (t.row(1).tolist(), t.row(2).tolist()) == ([2, 3], [4, 5, 6])


# --------------------------------------------------------------------------------------
# pickling
# --------------------------------------------------------------------------------------
def _filled_table(m):
    t = m.RecyclingTable(12, 4)
    t.update([1, 2, 3, 1], [[2, 3, 3, 5], [7, 8, 9, 10], [0, 0, 0, 0], [4, 5, 6, 7]])
    return t


@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_pickling_round_trips(rec, how):
    t = _filled_table(rec)
    u = {"pickle": lambda: pickle.loads(pickle.dumps(t)), "copy": lambda: copy.copy(t),
         "deepcopy": lambda: copy.deepcopy(t)}[how]()
    assert type(u) is type(t) and u is not t and state(u) == state(t)
    assert tree_lists(u.propose_tree(1, 20)) == tree_lists(t.propose_tree(1, 20))
    u.update([1], [[9]])                          # the copy has rows of its own
    assert t.row(1).tolist() == [4, 5, 6, 7]


def test_a_subclass_pickles_as_itself(rec):
    class Sub(rec.RecyclingTable):
        pass

    globals()["Sub"] = Sub   # pickle finds classes by name
    Sub.__qualname__ = "Sub"
    try:
        t = Sub(6, 2)
        t.update([1], [[2, 3]])
        u = pickle.loads(pickle.dumps(t))
        assert type(u) is Sub and u.row(1).tolist() == [2, 3]
    finally:
        del globals()["Sub"]


TAMPERED = [
    ("an id twice", lambda rows: rows.__setitem__((1, 1), rows[1, 0])),
    ("an id outside", lambda rows: rows.__setitem__((0, 0), 12)),
    ("below -1", lambda rows: rows.__setitem__((5, 0), -2)),
    ("an id after -1", lambda rows: rows.__setitem__((3, 3), 11)),
]


@pytest.mark.parametrize("label, edit", TAMPERED, ids=[c[0] for c in TAMPERED])
def test_a_tampered_pickle_is_refused(rec, label, edit):
    t = _filled_table(rec)
    fn, args = t.__reduce__()
    rows = np.array(args[3])
    edit(rows)
    with pytest.raises(ValueError, match="a pickled RecyclingTable's rows must hold distinct ids in 0..11"):
        fn(args[0], args[1], args[2], rows, args[4])


def test_a_pickle_of_another_shape_or_class_is_refused(rec):
    fn, args = _filled_table(rec).__reduce__()
    with pytest.raises(ValueError, match=r"rows must be \(12, 4\) integers, got int32 \(12, 3\)"):
        fn(args[0], 12, 4, args[3][:, :3], 0)
    with pytest.raises(ValueError, match="integers, got float64"):
        fn(args[0], 12, 4, args[3].astype(np.float64), 0)
    with pytest.raises(ValueError, match="k must be between 1 and 32"):
        fn(args[0], 12, 40, args[3], 0)
    with pytest.raises(TypeError, match="cannot rebuild a RecyclingTable as <class 'int'>"):
        fn(int, 12, 4, args[3], 0)
    with pytest.raises(TypeError, match="cannot rebuild a RecyclingTable as 'x'"):
        fn("x", 12, 4, args[3], 0)


def test_pickles_load_into_either_implementation():
    ms = modules()
    t = _filled_table(ms[-1])
    fn, args = t.__reduce__()
    for m in ms:
        u = m._rebuild(m.RecyclingTable, *args[1:])
        assert state(u) == state(t)


# --------------------------------------------------------------------------------------
# the guard
# --------------------------------------------------------------------------------------
def _every_call(t):
    return {
        "vocab_size": lambda: t.vocab_size, "k": lambda: t.k, "nbytes": lambda: t.nbytes,
        "updates": lambda: t.updates, "filled": lambda: t.filled(), "row": lambda: t.row(1),
        "update": lambda: t.update([1], [[2]]), "propose_tree": lambda: t.propose_tree(1, 4),
        "propose_trees": lambda: t.propose_trees([1], 4), "pickle": lambda: pickle.dumps(t),
        "copy": lambda: copy.copy(t),
    }


def test_an_object_made_with_new_refuses_every_call(rec):
    raw = rec.RecyclingTable.__new__(rec.RecyclingTable)
    for name, call in _every_call(raw).items():
        with pytest.raises(RuntimeError, match="RecyclingTable was not initialised"):
            call()
    assert repr(raw) == "RecyclingTable(<not initialised or unusable>)"


def test_a_second_init_is_refused_and_changes_nothing(rec):
    t = _filled_table(rec)
    before = state(t)
    with pytest.raises(RuntimeError, match=r"RecyclingTable.__init__ may be called only once"):
        t.__init__(5, 2)
    with pytest.raises(RuntimeError, match="only once"):
        t.__init__(0)                    # refused before its arguments are checked
    assert state(t) == before


def test_a_failed_init_leaves_an_object_that_refuses_every_call(rec):
    raw = rec.RecyclingTable.__new__(rec.RecyclingTable)
    with pytest.raises(ValueError):
        raw.__init__(10, 0)
    for call in _every_call(raw).values():
        with pytest.raises(RuntimeError):
            call()
    with pytest.raises(RuntimeError, match="only once"):
        raw.__init__(10, 2)


def test_calls_from_inside_a_conversion_see_a_consistent_table(rec):
    """A token id whose ``__index__`` updates the table while ``propose_tree`` converts it:
    the update runs to its end before the tree is grown, which reads the new rows."""
    t = rec.RecyclingTable(10, 2)
    t.update([1], [[2, 3]])

    class Sneaky(np.int64):
        def __index__(self):
            t.update([1], [[4, 5]])
            return 1

    toks, pars = t.propose_tree(Sneaky(1), 4)
    assert toks.tolist()[:2] == [4, 5] and t.updates == 2


# --------------------------------------------------------------------------------------
# merge_trees (its docstring is its contract)
# --------------------------------------------------------------------------------------
def _paths(toks, pars):
    """Each node's path of tokens from the root."""
    out: list[tuple[int, ...]] = []
    for t, p in zip(list(toks), list(pars)):
        out.append((out[p] if p >= 0 else ()) + (int(t),))
    return out


def test_merge_two_disjoint_trees():
    a = ([5, 6, 7], [-1, 0, -1])
    b = ([8, 9], [-1, 0])
    toks, pars, origin = merge_trees(a, b, 10)
    assert toks.tolist() == [5, 6, 7, 8, 9] and pars.tolist() == [-1, 0, -1, -1, 3]
    assert origin.tolist() == [1, 1, 1, 2, 2]
    assert (toks.dtype, pars.dtype, origin.dtype) == (np.int64, np.int64, np.uint8)


def test_shared_paths_are_counted_once_and_marked_by_both():
    a = ([5, 6, 7], [-1, 0, 1])
    b = ([5, 6, 9], [-1, 0, 0])
    toks, pars, origin = merge_trees(a, b, 4)
    assert toks.tolist() == [5, 6, 7, 9] and pars.tolist() == [-1, 0, 1, 0]
    assert origin.tolist() == [3, 3, 1, 2]


def test_the_reserve_leaves_room_to_the_second_tree():
    a = ([1, 2, 3, 4], [-1, 0, 1, 2])
    b = ([7, 8], [-1, 0])
    toks, pars, origin = merge_trees(a, b, 4, reserve=2)
    assert _paths(toks, pars) == [(1,), (1, 2), (7,), (7, 8)] and origin.tolist() == [1, 1, 2, 2]
    # a reserve beyond what the second tree has gives the first the rest, after it
    toks, pars, origin = merge_trees(a, ([7], [-1]), 4, reserve=3)
    assert _paths(toks, pars) == [(1,), (1, 2), (1, 2, 3), (7,)]
    # no reserve: the first tree takes the budget
    assert _paths(*merge_trees(a, b, 4)[:2]) == [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]


def test_a_node_whose_parent_did_not_fit_is_left_out():
    a = ([1, 2], [-1, 0])
    b = ([7, 8, 9], [-1, 0, 1])
    toks, pars, origin = merge_trees(a, b, 3, reserve=1)
    # first: 2 nodes (1, 2); second: 7 fits, 8 and 9 do not (no room, then no parent)
    assert _paths(toks, pars) == [(1,), (1, 2), (7,)] and origin.tolist() == [1, 1, 2]
    toks, pars, _ = merge_trees(a, b, 2, reserve=1)
    # first takes 1, second takes 7, first's 2 has no room: its parent fits, it does not
    assert _paths(toks, pars) == [(1,), (7,)]


def test_merge_with_an_empty_tree_or_budget():
    a = ([1, 2], [-1, 0])
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert _paths(*merge_trees(a, empty, 5)[:2]) == [(1,), (1, 2)]
    assert _paths(*merge_trees(empty, a, 5)[:2]) == [(1,), (1, 2)]
    toks, pars, origin = merge_trees(a, a, 0)
    assert toks.tolist() == [] and origin.dtype == np.uint8


@SETTINGS
@given(data=st.data())
def test_merge_keeps_both_trees_paths_within_the_budget(data):
    def tree(n):
        parents = [data.draw(st.integers(-1, i - 1)) for i in range(n)]
        tokens = [data.draw(st.integers(0, 3)) for _ in range(n)]
        return tokens, parents

    a, b = tree(data.draw(st.integers(0, 12))), tree(data.draw(st.integers(0, 12)))
    budget = data.draw(st.integers(0, 30))
    reserve = data.draw(st.integers(0, 30))
    toks, pars, origin = merge_trees(a, b, budget, reserve)
    paths = _paths(toks, pars)
    pa, pb = set(_paths(*a)), set(_paths(*b))
    assert len(paths) == len(set(paths)) <= budget                  # each path once
    assert all(-1 <= p < i for i, p in enumerate(pars.tolist()))     # parents first
    for path, o in zip(paths, origin.tolist()):
        assert o in (1, 2, 3) and (path in pa) == bool(o & 1) and (path in pb) == bool(o & 2)
    if budget >= len(a[0]) + len(b[0]):
        assert set(paths) == pa | pb                                 # room for everything
    room = min(reserve, len(b[0]), budget)
    assert set(_paths(*a)[:budget - room]) <= set(paths)             # first's first nodes
    assert set(_paths(*b)[:room]) <= set(paths)                      # then the reserve


@pytest.mark.parametrize("first, second, budget, exc, message", [
    (([1], [0]), ([], []), 3, ValueError, r"first: parents\[0\] = 0 must be in \[-1, 0\)"),
    (([1, 2], [-1, 2]), ([], []), 3, ValueError, r"first: parents\[1\] = 2 must be in \[-1, 1\)"),
    (([1], [-1]), ([1, 2], [-1]), 3, ValueError, "second must be"),
    (([1.0], [-1]), ([], []), 3, ValueError, "first must be"),
    (([[1]], [[-1]]), ([], []), 3, ValueError, "first must be"),
    (([1], [-1]), ([], []), -1, ValueError, "budget must be a non-negative integer"),
    (([1], [-1]), ([], []), 2.0, TypeError, "budget must be a non-negative integer"),
])
def test_merge_refuses_malformed_trees(first, second, budget, exc, message):
    with pytest.raises(exc, match=message):
        merge_trees(first, second, budget)
