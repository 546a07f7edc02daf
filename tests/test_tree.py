"""Tree verification kernels (``specfsm._core.tree`` and its twin): greedy acceptance
against a brute-force reference, the batch against one tree at a time, every refusal
(with the same message on both implementations), and path placement against numpy
gathers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm import _impl

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def kern(impl):
    return impl.module("tree")


# -- the reference ----------------------------------------------------------------------
def reference_path(tokens, parents, row_tokens):
    """The deepest node every one of whose ancestors-and-self the target confirmed (its
    token is the target's choice at its parent's row), and the path to it: a different
    algorithm from the kernels' walk (every node judged on its own)."""
    n = len(tokens)
    best: list[int] = []
    for v in range(n):
        chain = []
        u = v
        while u != -1:
            chain.append(u)
            u = parents[u]
        chain.reverse()
        if all(tokens[u] == row_tokens[parents[u] + 1] for u in chain) and len(chain) > len(best):
            best = chain
    return best


@st.composite
def trees(draw, max_nodes=12, alphabet=4):
    """A valid tree (sibling tokens differ) over a small alphabet, so that the target's
    choices often match."""
    n = draw(st.integers(1, max_nodes))
    parents: list[int] = []
    tokens: list[int] = []
    for i in range(n):
        q = draw(st.integers(-1, i - 1))
        used = {tokens[j] for j in range(i) if parents[j] == q}
        free = [a for a in range(alphabet) if a not in used]
        tok = draw(st.sampled_from(free)) if free else 100 + i
        parents.append(q)
        tokens.append(tok)
    return tokens, parents


@st.composite
def tree_and_rows(draw, max_nodes=12):
    tokens, parents = draw(trees(max_nodes))
    n = len(tokens)
    rows = []
    for r in range(n + 1):  # row r is node r - 1's (the root's for r = 0)
        kids = [tokens[c] for c in range(n) if parents[c] == r - 1]
        if kids and draw(st.booleans()):
            rows.append(draw(st.sampled_from(kids)))
        else:
            rows.append(draw(st.integers(0, 5)))
    return tokens, parents, rows


def as_kind(x, kind):
    if kind == "list":
        return list(x)
    if kind == "int32":
        return np.array(x, dtype=np.int32)
    if kind == "int16":
        return np.array(x, dtype=np.int64).astype(np.int16)  # widened by the converter
    return np.array(x, dtype=np.int64)


# -- acceptance -------------------------------------------------------------------------
@SETTINGS
@given(case=tree_and_rows(), kind=st.sampled_from(["list", "int32", "int64", "int16"]))
def test_accept_tree_matches_the_reference(impl, case, kind):
    tokens, parents, rows = case
    k = kern(impl)
    got = k.accept_tree(as_kind(tokens, kind), as_kind(parents, kind), as_kind(rows, kind))
    assert got.dtype == np.int64 and got.ndim == 1
    assert got.tolist() == reference_path(tokens, parents, rows)
    t, p = k.check_tree(as_kind(tokens, kind), as_kind(parents, kind))
    assert t.dtype == p.dtype == np.int64
    assert t.tolist() == tokens and p.tolist() == parents


@SETTINGS
@given(cases=st.lists(tree_and_rows(8), min_size=0, max_size=6))
def test_accept_tree_batch_is_each_tree_alone(impl, cases):
    k = kern(impl)
    tokens = [t for c in cases for t in c[0]]
    parents = [p for c in cases for p in c[1]]
    rows = [r for c in cases for r in c[2]]
    offsets = np.cumsum([0] + [len(c[0]) for c in cases])
    counts, resume, path, poff = k.accept_tree_batch(tokens, parents, offsets, rows)
    for a in (counts, resume, path, poff):
        assert a.dtype == np.int64 and a.ndim == 1
    assert poff.tolist() == np.cumsum([0] + counts.tolist()).tolist()
    for b, (t, p, r) in enumerate(cases):
        want = reference_path(t, p, r)
        assert counts[b] == len(want)
        assert path[poff[b]:poff[b + 1]].tolist() == want
        assert resume[b] == (want[-1] + 1 if want else 0)


@SETTINGS
@given(case=tree_and_rows())
def test_compiled_and_twin_agree(compiled, case):
    tokens, parents, rows = case
    c, p = _impl.kernels("compiled", "tree"), _impl.kernels("python", "tree")
    assert c.accept_tree(tokens, parents, rows).tolist() == p.accept_tree(tokens, parents, rows).tolist()
    off = [0, len(tokens), 2 * len(tokens)]
    for a, b in zip(c.accept_tree_batch(tokens * 2, parents * 2, off, rows * 2),
                    p.accept_tree_batch(tokens * 2, parents * 2, off, rows * 2)):
        assert a.tolist() == b.tolist()


def test_a_small_tree_by_hand(impl):
    k = kern(impl)
    #      root
    #     /    \
    #   0:5    4:9
    #   /  \
    # 1:6  2:7
    #  |
    # 3:8
    t, p = [5, 6, 7, 8, 9], [-1, 0, 0, 1, -1]
    assert k.accept_tree(t, p, [5, 6, 8, 0, 0, 0]).tolist() == [0, 1, 3]
    assert k.accept_tree(t, p, [5, 7, 0, 0, 0, 0]).tolist() == [0, 2]
    assert k.accept_tree(t, p, [9, 0, 0, 0, 0, 0]).tolist() == [4]
    assert k.accept_tree(t, p, [1, 0, 0, 0, 0, 0]).tolist() == []
    counts, resume, path, poff = k.accept_tree_batch(t + t, p + p, [0, 5, 10], [5, 6, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0])
    assert counts.tolist() == [3, 0] and resume.tolist() == [4, 0]
    assert path.tolist() == [0, 1, 3] and poff.tolist() == [0, 3, 3]


def test_an_empty_batch(impl):
    counts, resume, path, poff = kern(impl).accept_tree_batch([], [], [0], [])
    assert counts.size == resume.size == path.size == 0 and poff.tolist() == [0]


def test_check_tree_returns_arrays_of_its_own(impl):
    t0 = np.array([1, 2], dtype=np.int64)
    p0 = np.array([-1, 0], dtype=np.int64)
    t, p = kern(impl).check_tree(t0, p0)
    assert not np.shares_memory(t, t0) and not np.shares_memory(p, p0)
    t0[0] = 7
    assert t.tolist() == [1, 2]


# -- refusals ---------------------------------------------------------------------------
TREE_REFUSALS = [
    # (tokens, parents, exception, message fragment)
    ([1, 2], [-1], ValueError, "tokens has 2 nodes and parents 1; they must have the same length"),
    ([], [], ValueError, "the tree is empty"),
    ([1, 2], [-1, 1], ValueError, "parents[1]=1 is not before node 1"),          # a cycle: its own parent
    ([1, 2, 3], [-1, 2, 0], ValueError, "parents[1]=2 is not before node 1"),    # a parent after its child
    ([1], [0], ValueError, "parents[0]=0 is not before node 0"),
    ([1, 2], [-1, -2], ValueError, "parents[1]=-2 is out of range"),
    ([1, -3], [-1, 0], ValueError, "tokens[1]=-3 is negative"),
    ([4, 5, 4], [-1, 0, -1], ValueError, "nodes 0 and 2 are siblings (parent -1) with the same token 4"),
    ([4, 5, 5, 5], [-1, 0, 0, 0], ValueError, "nodes 1 and 2 are siblings (parent 0) with the same token 5"),
    ([1.0], [-1], TypeError, "tokens[0] must be an integer token id"),
    (np.array([1.0]), [-1], TypeError, "tokens has unsupported dtype float64"),
    (np.array([[1]]), [-1], ValueError, "tokens must be 1-D"),
    ([1], [True], TypeError, "parents[0] must be an integer token id, got bool"),
    ("ab", [-1], TypeError, "tokens must be a list, tuple or 1-D integer numpy array"),
]


@pytest.mark.parametrize("tokens,parents,exc,msg", TREE_REFUSALS)
def test_tree_refusals(impl, tokens, parents, exc, msg):
    k = kern(impl)
    with pytest.raises(exc) as e1:
        k.check_tree(tokens, parents)
    assert msg in str(e1.value)
    rows = [0] * (max(len(tokens), 0) + 1)
    with pytest.raises(exc) as e2:
        k.accept_tree(tokens, parents, rows)
    assert str(e2.value) == str(e1.value)


def test_refusals_say_the_same_on_both_implementations(compiled):
    c, p = _impl.kernels("compiled", "tree"), _impl.kernels("python", "tree")
    cases = [(fn, args) for t, q, _, _ in TREE_REFUSALS
             for fn, args in (("check_tree", (t, q)), ("accept_tree", (t, q, [0] * (len(t) + 1))))]
    cases += [(fn, args) for fn, args in BATCH_REFUSALS_ARGS]
    for fn, args in cases:
        with pytest.raises(Exception) as ec:
            getattr(c, fn)(*args)
        with pytest.raises(Exception) as ep:
            getattr(p, fn)(*args)
        assert type(ec.value) is type(ep.value) and str(ec.value) == str(ep.value), (fn, args)


def test_row_tokens_of_the_wrong_length(impl):
    k = kern(impl)
    with pytest.raises(ValueError, match=r"row_tokens holds 2 rows for a tree of 2 nodes; it needs N \+ 1 = 3"):
        k.accept_tree([1, 2], [-1, 0], [1, 2])
    with pytest.raises(TypeError, match=r"row_tokens\[1\] must be an integer"):
        k.accept_tree([1, 2], [-1, 0], [1, 2.0, 3])


BATCH_REFUSALS_ARGS = [
    ("accept_tree_batch", ([1, 2], [-1], [0, 2], [0, 0, 0])),
    ("accept_tree_batch", ([1, 2, 3], [-1, 0, -1], [0, 2], [0] * 4)),             # offsets end short
    ("accept_tree_batch", ([1, 2, 3], [-1, 0, -1], [0, 2, 4], [0] * 5)),          # beyond the tokens
    ("accept_tree_batch", ([1, 2, 3], [-1, 0, -1], [1, 2, 3], [0] * 5)),          # not from 0
    ("accept_tree_batch", ([1, 2, 3], [-1, 0, -1], [0, 2, 1, 3], [0] * 6)),       # decreasing
    ("accept_tree_batch", ([1, 2, 3], [-1, 0, -1], [0, 2, 2, 3], [0] * 6)),       # an empty tree
    ("accept_tree_batch", ([1, 2, 3], [-1, 0, -1], [0, 2, 3], [0] * 4)),          # rows short
    ("accept_tree_batch", ([1, 2, 3, 4], [-1, 0, -1, 1], [0, 2, 4], [0] * 6)),    # tree 1: a cycle
    ("accept_tree_batch", ([1, 2, 3, 3], [-1, 0, -1, -1], [0, 2, 4], [0] * 6)),   # tree 1's siblings
    ("accept_tree_batch", ([1, 2], [-1, 0], [], [0] * 3)),
]
BATCH_MESSAGES = [
    "tokens has 2 nodes and parents 1",
    "offsets[-1]=2 must equal len(tokens)=3",
    "offsets[-1]=4 must equal len(tokens)=3",
    "offsets[0] must be 0, got 1",
    "offsets must be nondecreasing, got offsets[1]=2 > offsets[2]=1",
    "tree 1 is empty (offsets[1] == offsets[2] == 2)",
    "row_tokens holds 4 rows for 2 trees of 3 nodes in all; it needs one row per node plus one root row per tree = 5",
    "tree 1: parents[1]=1 is not before node 1",
    "tree 1: nodes 0 and 1 are siblings (parent -1) with the same token 3",
    "offsets must hold one entry per row plus one",
]


@pytest.mark.parametrize("case,msg", list(zip(BATCH_REFUSALS_ARGS, BATCH_MESSAGES)))
def test_batch_refusals(impl, case, msg):
    _, args = case
    with pytest.raises(ValueError) as e:
        kern(impl).accept_tree_batch(*args)
    assert msg in str(e.value)


# -- path placement ---------------------------------------------------------------------
def gathered(cache, base, path):
    """What placing ``path`` must leave: rows base+1.. base+m gathered from the path's
    rows, every other row unchanged."""
    out = cache.copy()
    path = np.asarray(path, dtype=np.int64)
    out[base + 1: base + 1 + path.size] = cache[base + 1 + path]
    return out


@st.composite
def cache_and_path(draw):
    L = draw(st.integers(1, 12))
    base = draw(st.integers(0, L - 1))
    room = L - 1 - base
    path = sorted(draw(st.sets(st.integers(0, max(room - 1, 0)), max_size=room))) if room else []
    dtype = draw(st.sampled_from([np.uint8, np.float32, np.int64, np.complex128]))
    width = draw(st.sampled_from([(), (3,), (2, 2)]))
    cache = np.arange(L * int(np.prod(width, dtype=np.int64)), dtype=np.int64).astype(dtype).reshape((L, *width))
    return cache, base, path


@SETTINGS
@given(case=cache_and_path())
def test_place_path_is_the_numpy_gather(impl, case):
    cache, base, path = case
    want = gathered(cache, base, path)
    got = kern(impl).place_path(cache, base, np.array(path, dtype=np.int64))
    assert got is cache
    assert np.array_equal(cache, want)


@SETTINGS
@given(cases=st.lists(cache_and_path(), min_size=1, max_size=5), L=st.integers(1, 12))
def test_place_path_batch_is_the_numpy_gather(impl, cases, L):
    # one L and one row shape for the batch: keep each case's base and path where they fit
    B = len(cases)
    cache = np.arange(B * L * 2, dtype=np.float64).reshape(B, L, 2)
    bases, paths = [], []
    for c, base, path in cases:
        base = min(base, L - 1)
        path = [v for v in path if base + 1 + v < L]
        bases.append(base)
        paths.append(path)
    want = np.stack([gathered(cache[b], bases[b], paths[b]) for b in range(B)])
    flat = [v for p in paths for v in p]
    off = np.cumsum([0] + [len(p) for p in paths])
    assert kern(impl).place_path_batch(cache, bases, flat, off) is cache
    assert np.array_equal(cache, want)


def test_accepted_paths_placed(impl):
    """accept_tree_batch's output drives place_path_batch directly."""
    k = kern(impl)
    t, p = [5, 6, 7, 8, 9], [-1, 0, 0, 1, -1]
    rows = [5, 6, 8, 0, 0, 0] + [9, 0, 0, 0, 0, 0]
    counts, resume, path, poff = k.accept_tree_batch(t + t, p + p, [0, 5, 10], rows)
    cache = np.arange(2 * 9, dtype=np.int32).reshape(2, 9) * 10
    before = cache.copy()
    k.place_path_batch(cache, [2, 3], path, poff)
    assert cache[0, 3:6].tolist() == before[0, [3, 4, 6]].tolist()   # nodes 0, 1, 3
    assert cache[1, 4].tolist() == before[1, 8].tolist()              # node 4
    assert cache[0, :3].tolist() == before[0, :3].tolist()


PLACE_REFUSALS = [
    # (cache, base, path, exception, message)
    (lambda: np.zeros((6, 2)), 1, [0, -1], ValueError, "path[1]=-1 is negative"),
    (lambda: np.zeros((6, 2)), 1, [-1], ValueError, "path[0]=-1 is negative"),
    (lambda: np.zeros((6, 2)), 1, [1, 1], ValueError, "path[1]=1 is not after path[0]=1"),
    (lambda: np.zeros((6, 2)), 1, [2, 0], ValueError, "path[1]=0 is not after path[0]=2"),
    (lambda: np.zeros((6, 2)), 1, [0, 4], IndexError, "path[1]=4 is row base + 1 + 4 = 6, beyond the cache's 6 rows"),
    (lambda: np.zeros((6, 2)), 6, [], IndexError, "base=6 is beyond the cache's 6 rows"),
    (lambda: np.zeros((6, 2)), -1, [], ValueError, "base must be a non-negative integer, got -1"),
    (lambda: np.zeros((6, 2)), 1.0, [], TypeError, "base must be a non-negative integer"),
    (lambda: np.zeros((6, 2)), 0, [0.5], TypeError, "path[0] must be an integer"),
    (lambda: np.zeros((6, 2))[:, :1], 0, [], ValueError, "cache must be C-contiguous"),
    (lambda: np.zeros(()), 0, [], ValueError, "cache must be [L, ...], got shape ()"),
    (lambda: np.array([None] * 4, dtype=object), 0, [], TypeError, "a raw byte copy cannot move references"),
    (lambda: [0, 1, 2], 0, [], TypeError, "cache must be a numpy array, got list"),
]


@pytest.mark.parametrize("make,base,path,exc,msg", PLACE_REFUSALS)
def test_place_path_refusals_change_nothing(impl, make, base, path, exc, msg):
    cache = make()
    if isinstance(cache, np.ndarray) and cache.dtype != object:
        cache[...] = np.arange(cache.size).reshape(cache.shape)
    before = cache.copy() if isinstance(cache, np.ndarray) else list(cache)
    with pytest.raises(exc) as e:
        kern(impl).place_path(cache, base, path)
    assert msg in str(e.value)
    if isinstance(cache, np.ndarray) and cache.dtype != object:
        assert np.array_equal(cache, before)


def test_place_path_refuses_a_read_only_cache(impl):
    cache = np.zeros((4, 2))
    cache.flags.writeable = False
    with pytest.raises(ValueError, match="cache is read-only"):
        kern(impl).place_path(cache, 0, [1])


BATCH_PLACE_REFUSALS = [
    ([0, 0], [0, 0], [0, 1, 2], ValueError, "base holds 2 entries; it needs one per request (B=3)"),
    ([0, 0, 0], [0, 0], [0, 1], ValueError, "path_offsets holds 2 entries for 3 requests"),
    ([0, 0, 0], [0, 0], [0, 1, 1, 3], ValueError, "path_offsets[-1]=3 must equal len(path)=2"),
    ([0, -1, 0], [0, 0], [0, 1, 1, 2], ValueError, "base[1] must be a non-negative integer, got -1"),
    ([0, 5, 0], [0, 0], [0, 1, 1, 2], IndexError, "slot 1: base=5 is beyond the cache's 5 rows"),
    ([0, 0, 0], [0, 0, 0], [0, 1, 3, 3], ValueError, "slot 1: path[1]=0 is not after path[0]=0"),
    ([0, 0, 3], [0, 0, 1], [0, 1, 2, 3], IndexError, "slot 2: path[0]=1 is row base + 1 + 1 = 5, beyond the cache's 5 rows"),
]


@pytest.mark.parametrize("base,path,off,exc,msg", BATCH_PLACE_REFUSALS)
def test_place_path_batch_refusals_change_nothing(impl, base, path, off, exc, msg):
    cache = np.arange(3 * 5 * 2, dtype=np.int16).reshape(3, 5, 2)
    before = cache.copy()
    with pytest.raises(exc) as e:
        kern(impl).place_path_batch(cache, base, path, off)
    assert msg in str(e.value)
    assert np.array_equal(cache, before)


def test_placement_refusals_say_the_same_on_both_implementations(compiled):
    c, p = _impl.kernels("compiled", "tree"), _impl.kernels("python", "tree")
    for make, base, path, _, _ in PLACE_REFUSALS:
        with pytest.raises(Exception) as ec:
            c.place_path(make(), base, path)
        with pytest.raises(Exception) as ep:
            p.place_path(make(), base, path)
        assert type(ec.value) is type(ep.value) and str(ec.value) == str(ep.value)
    for base, path, off, _, _ in BATCH_PLACE_REFUSALS:
        cache = np.zeros((3, 5, 2))
        with pytest.raises(Exception) as ec:
            c.place_path_batch(cache, base, path, off)
        with pytest.raises(Exception) as ep:
            p.place_path_batch(cache, base, path, off)
        assert type(ec.value) is type(ep.value) and str(ec.value) == str(ep.value)


def outcome(fn, *args):
    """A call's result (as lists) or its refusal (type and message)."""
    try:
        got = fn(*args)
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        return type(exc).__name__, str(exc)
    if isinstance(got, tuple):
        return tuple(a.tolist() for a in got)
    return got.tolist()


ints = st.one_of(st.integers(-3, 12), st.sampled_from([2**31, 2**63 - 1, -(2**63), 2**64]))


@SETTINGS
@given(t=st.lists(ints, max_size=8), p=st.lists(ints, max_size=8), r=st.lists(ints, max_size=10),
       off=st.lists(ints, max_size=4))
def test_any_input_gets_the_same_outcome_on_both(compiled, t, p, r, off):
    """Random (mostly broken) arguments: the same result or the same refusal, word for word."""
    c, q = _impl.kernels("compiled", "tree"), _impl.kernels("python", "tree")
    assert outcome(c.check_tree, t, p) == outcome(q.check_tree, t, p)
    assert outcome(c.accept_tree, t, p, r) == outcome(q.accept_tree, t, p, r)
    assert outcome(c.accept_tree_batch, t, p, off, r) == outcome(q.accept_tree_batch, t, p, off, r)
    L = 6
    for base in (0, 2, r[0] if r else 7):
        a, b = np.arange(L * 2.0).reshape(L, 2), np.arange(L * 2.0).reshape(L, 2)
        assert outcome(c.place_path, a, base, t) == outcome(q.place_path, b, base, t)
        assert np.array_equal(a, b)
    B = max(len(off) - 1, 0)
    a, b = np.zeros((B, L, 2)), np.zeros((B, L, 2))
    assert outcome(c.place_path_batch, a, p[:B], t, off) == outcome(q.place_path_batch, b, p[:B], t, off)
