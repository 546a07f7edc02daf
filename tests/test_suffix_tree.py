"""Tree drafts from the suffix index: ``SuffixIndex.propose_tree``.

Both implementations against ``reference`` below, a brute-force transcription over the
token history of the rule in ``specfsm.drafting._suffix_tree_py``'s docstring (its own
match lengths, occurrences and trie, no automaton), compiled == twin == reference; the
tree's shape (parents first, distinct siblings, the chain as its first branch); the
refusals and the guard.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm.drafting._tree_checks import (
    DEFAULT_TREE_WIDTH, MAX_TREE_NODES, TREE_AGREE_MIN, TREE_AGREE_SPAN, TREE_OCCURRENCES, TREE_WINDOW)

from specfsm.drafting._suffix_tree_py import agreement

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WEIGHTS = (1.0, 0.25, 0.0625)
DECAY = [1.0]                      # 0.9 ** k as the rule defines it: repeated products in doubles
while len(DECAY) < MAX_TREE_NODES:
    DECAY.append(DECAY[-1] * 0.9)


@pytest.fixture
def sfx(impl):
    return impl.module("suffix_index")


def _count(h, m):
    """Earlier occurrences (ends e <= len - 1) of the last m tokens."""
    L = len(h)
    return sum(1 for e in range(m, L) if h[e - m : e] == h[L - m :])


def contexts(h, min_n, max_n):
    """The context lengths, longest first, by counting: the match, then the largest
    shorter lengths that occur strictly more often (the suffix links' lengths)."""
    L = len(h)
    top = L - 1 if max_n is None else min(max_n, L - 1)
    n0 = next((n for n in range(top, 0, -1) if _count(h, n)), 0)
    if n0 < min_n or n0 == 0:
        return []
    out = [n0]
    while len(out) < 3:
        c = _count(h, out[-1])
        m = next((m for m in range(out[-1] - 1, 0, -1) if _count(h, m) > c), 0)
        if m < max(min_n, 1):
            break
        out.append(m)
    return out


def reference(h, min_n, max_n, prefer, chain, budget, depth, width, window=TREE_WINDOW):
    """The tree by brute force: every trie node of the counted occurrences' continuations
    with its estimate, then best-first among the children of the chosen nodes."""
    L = len(h)
    ctx = contexts(h, min_n, max_n)
    occ = {}  # end -> set of contexts (3: the chain)
    for i, n in enumerate(ctx):
        ends = [e for e in range(L - 1, max(n - 1, L - window), -1)
                if h[e - n : e] == h[L - n :]][:TREE_OCCURRENCES]
        for e in ends:
            occ.setdefault(e, set()).add(i)
    if chain >= 0:
        occ.setdefault(chain, set()).add(3)
    N = [sum(1 for s in occ.values() if i in s) for i in range(len(ctx))]
    copying = chain >= 0 and sum(
        1 for j in range(1, min(TREE_AGREE_SPAN, chain) + 1) if h[L - j] == h[chain - j]) >= TREE_AGREE_MIN
    nodes = {}  # path -> ends through it
    for e, _ in occ.items():
        for d in range(1, depth + 1):
            if e + d > L:
                break
            nodes.setdefault(tuple(h[e : e + d]), []).append(e)

    def key(path):
        ends = nodes[path]
        p = 0.0
        on_chain = any(3 in occ[e] for e in ends)
        if copying:
            # the chain outweighs the rest; per context, the share of its occurrences
            p += 4.0 * on_chain
            for i in range(len(ctx)):
                p += sum(1 for e in ends if i in occ[e]) / N[i] * WEIGHTS[i]
        else:
            # every counted (context, occurrence) through the node and the chain's, by
            # 0.9 per level below the first
            p = DECAY[len(path) - 1] * (on_chain + sum(len(occ[e] - {3}) for e in ends))
        rep = min(ends) if prefer == "earliest" else -max(ends)
        return (-p, rep)

    chosen = {(): -1}
    kids = {(): 0}
    toks, pars = [], []
    while len(toks) < budget:
        frontier = [q for q in nodes if q[:-1] in chosen and q not in chosen and kids[q[:-1]] < width]
        if not frontier:
            break
        best = min(frontier, key=key)
        toks.append(best[-1])
        pars.append(chosen[best[:-1]])
        kids[best[:-1]] += 1
        chosen[best] = len(toks) - 1
        kids[best] = 0
    return toks, pars


def _shape_ok(toks, pars, budget):
    assert toks.dtype == np.int64 and pars.dtype == np.int64 and toks.shape == pars.shape
    assert len(toks) <= budget
    seen = set()
    for i, p in enumerate(pars.tolist()):
        assert -1 <= p < i
        assert (p, int(toks[i])) not in seen      # distinct siblings
        seen.add((p, int(toks[i])))


def _copied(draw_args):
    """A text, something else, then the text again up to a cut, with a few tokens
    changed (a renamed word): the chain agrees with the history past the exact match."""
    base, mid, cut, edits = draw_args
    out = base + mid + base[:cut]
    for at, tok in edits:
        if at < min(cut, len(base)):
            out[len(base) + len(mid) + at] = tok
    return out


copies = st.tuples(st.lists(st.integers(0, 4), min_size=30, max_size=70), st.lists(st.integers(0, 4), max_size=8),
                   st.integers(20, 70), st.lists(st.tuples(st.integers(0, 69), st.integers(0, 4)), max_size=3)).map(_copied)
histories = st.lists(st.integers(0, 4), max_size=120) | st.lists(st.integers(0, 1), max_size=120) | copies


@SETTINGS
@given(h=histories, min_n=st.integers(1, 3), max_n=st.sampled_from([None, 3, 6]),
       prefer=st.sampled_from(["earliest", "latest"]), anchor=st.sampled_from([0, 0, 4]),
       budget=st.integers(1, 24), depth=st.sampled_from([None, 1, 2, 5]),
       width=st.sampled_from([None, 1, 2, 3]))
def test_tree_is_the_reference_on_both_implementations(impl, h, min_n, max_n, prefer, anchor,
                                                        budget, depth, width):
    from specfsm import _impl

    if max_n is not None and max_n < min_n:
        max_n = min_n
    trees = []
    for kind in ("compiled", "python") if not _impl.NO_EXTENSIONS else ("python",):
        mod = _impl.kernels(kind, "suffix_index")
        ix = mod.SuffixIndex(min_n, max_n, prefer, anchor_n=anchor)
        ix.extend(h)
        toks, pars = ix.propose_tree(budget, depth, width)
        _shape_ok(toks, pars, budget)
        trees.append((toks.tolist(), pars.tolist()))
        chain_start = ix.match_end()
        chain = ix.propose(min(budget, budget if depth is None else depth))
        if chain_start >= 0 and agreement(h, chain_start) >= TREE_AGREE_MIN:
            # copying: the chain is the first branch
            assert toks.tolist()[: len(chain)] == chain
            assert pars.tolist()[: len(chain)] == list(range(-1, len(chain) - 1))
    d = budget if depth is None else depth
    w = DEFAULT_TREE_WIDTH if width is None else width
    assert trees[0] == reference(h, min_n, max_n, prefer, chain_start, budget, d, w)
    assert all(t == trees[0] for t in trees)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(64, TREE_WINDOW + 600), alphabet=st.sampled_from([2, 3, 9, 60]),
       wide=st.booleans(), min_n=st.integers(1, 3), depth=st.sampled_from([1, 3, 8]))
def test_long_histories_give_the_twins_tree(seed, n, alphabet, wide, min_n, depth):
    """Histories across the scan's window and its search blocks (scan.h's vectorised
    search for the last one or two tokens), in narrow and wide tokens: the compiled tree
    is the twin's. A motif recurs so the longest context has many occurrences."""
    from specfsm import _impl

    if _impl.NO_EXTENSIONS:
        pytest.skip("compares the compiled core with its twin")
    rng = np.random.default_rng(seed)
    h = rng.integers(0, alphabet, n)
    motif = rng.integers(0, alphabet, 5)
    for at in rng.integers(0, n - 5, size=int(rng.integers(0, 80))):
        h[at : at + 5] = motif
    h[-5:] = motif
    shift = 2**40 if wide else 0
    trees = []
    for kind in ("compiled", "python"):
        ix = _impl.kernels(kind, "suffix_index").SuffixIndex(min_n)
        ix.extend((h + shift).tolist())
        toks, pars = ix.propose_tree(32, depth)
        trees.append(((toks - shift).tolist(), pars.tolist()))
    assert trees[0] == trees[1]


def test_both_regimes_are_drawn():
    """The reference test's histories reach the copying regime and the free one."""
    from specfsm.drafting._suffix_index_py import SuffixIndex

    seen = set()

    @settings(max_examples=200, deadline=None, database=None)
    @given(h=histories)
    def draw(h):
        ix = SuffixIndex(1)
        ix.extend(h)
        a = ix.match_end()
        if a >= 0:
            seen.add(agreement(h, a) >= TREE_AGREE_MIN)

    draw()
    assert seen == {True, False}


def test_a_long_copy_keeps_the_chain_whole(sfx):
    """A copy that agrees with the history past a changed token (the copying regime):
    the chain is the tree's first branch, ahead of a continuation counted more often."""
    text = [10 + i for i in range(40)]
    h = text + [5, 6] + [7, 8, 7, 9, 7, 9, 7, 9] + text[:30]
    h[-10] = 99                      # a renamed word: the exact match is 9 tokens
    ix = sfx.SuffixIndex(1)
    ix.extend(h)
    a = ix.match_end()
    assert agreement(h, a) >= TREE_AGREE_MIN
    chain = ix.propose(6)
    toks, pars = ix.propose_tree(10, max_depth=6)
    assert toks.tolist()[:6] == chain == text[30:36]
    assert pars.tolist()[:6] == [-1, 0, 1, 2, 3, 4]


def test_a_copy_that_stopped_agreeing_branches_by_counts(sfx):
    """The free regime: the chain's occurrence agrees with little of the recent
    history, and the continuation that followed the context most often comes first."""
    h = [3, 1, 4] + [2, 1, 5] * 6 + [2, 1]
    ix = sfx.SuffixIndex(1, 1)
    ix.extend(h)
    assert agreement(h, ix.match_end()) < TREE_AGREE_MIN
    assert ix.propose(1) == [4]      # the chain: the earliest "1"
    toks, pars = ix.propose_tree(2, max_depth=1)
    assert toks.tolist() == [5, 4] and pars.tolist() == [-1, -1]


def test_a_shared_context_branches(sfx):
    """After "1 2", the history continued with 3 twice and 5 once: the chain (the
    earliest occurrence, 3 4 ...) first, then the other continuations."""
    ix = sfx.SuffixIndex(1)
    ix.extend([1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 7, 1, 2])
    toks, pars = ix.propose_tree(8, max_depth=3)
    # (the free regime: 3 then 4 are counted most; 7 after 3 at depth 2 goes before
    # the depth-3 continuations it ties with in counts)
    assert toks.tolist() == [3, 4, 1, 5, 6, 7, 1, 1]
    assert pars.tolist() == [-1, 0, 1, -1, 3, 0, 4, 5]
    assert ix.propose(3) == [3, 4, 1]
    one, _ = ix.propose_tree(1)
    assert one.tolist() == [3]


def test_nothing_matches_gives_an_empty_tree(sfx):
    for toks in ([], [7], [1, 2, 3]):
        ix = sfx.SuffixIndex(1)
        ix.extend(toks)
        a, b = ix.propose_tree(8)
        assert a.tolist() == [] and b.tolist() == [] and a.dtype == np.int64


def test_wide_tokens(sfx):
    """Tokens beyond int32 (the compiled index's int64 history) give the tree of the
    same history in small tokens."""
    big = 2**40
    small = [0, 1, 2, 0, 1, 3, 0, 1, 2, 0, 1]
    trees = []
    for shift in (10, big):
        ix = sfx.SuffixIndex(1)
        ix.extend([t + shift for t in small])
        toks, pars = ix.propose_tree(6, max_depth=2)
        trees.append(((toks - shift).tolist(), pars.tolist()))
        start = ix.match_end()
    assert trees[0] == trees[1]
    assert trees[0] == reference(small, 1, None, "earliest", start, 6, 2, DEFAULT_TREE_WIDTH)
    assert len(trees[0][0]) > 2


@pytest.mark.parametrize(
    "args, exc, msg",
    [
        ((0,), ValueError, "budget must be between 1 and 1024, got 0"),
        ((MAX_TREE_NODES + 1,), ValueError, "budget must be between 1 and 1024, got 1025"),
        ((-1,), ValueError, "budget must be a non-negative integer, got -1"),
        ((2.0,), TypeError, "budget must be a non-negative integer, got float 2.0"),
        ((True,), TypeError, "budget must be a non-negative integer, got bool True"),
        ((8, 0), ValueError, "max_depth must be between 1 and 1024, got 0"),
        ((8, None, 0), ValueError, "max_width must be between 1 and 1024, got 0"),
        ((8, None, "2"), TypeError, "max_width must be a non-negative integer, got str '2'"),
    ],
)
def test_refusals_name_the_argument_and_change_nothing(sfx, args, exc, msg):
    ix = sfx.SuffixIndex(1)
    ix.extend([1, 2, 1, 2])
    before = (ix.tokens.tolist(), ix.propose(4), ix.stats)
    with pytest.raises(exc) as err:
        ix.propose_tree(*args)
    assert str(err.value) == msg
    assert (ix.tokens.tolist(), ix.propose(4), ix.stats) == before


def test_guard(sfx):
    """Refused while a writer holds the index, and on an index never initialised."""
    ix = sfx.SuffixIndex(1)
    ix.extend([1, 2, 1, 2])
    ix._hold_guard(True)
    try:
        with pytest.raises(RuntimeError):
            ix.propose_tree(4)
    finally:
        ix._hold_guard(False)
    assert ix.propose_tree(4)[0].tolist() == [1, 2]
    with pytest.raises(RuntimeError, match="not initialised"):
        sfx.SuffixIndex.__new__(sfx.SuffixIndex).propose_tree(4)


def test_occurrences_are_capped(sfx):
    """A context with more than TREE_OCCURRENCES earlier occurrences counts the latest:
    a continuation seen only before them does not enter the tree."""
    h = [1, 9] + [1, 2] * (TREE_OCCURRENCES + 4) + [1]
    ix = sfx.SuffixIndex(1, 1)
    ix.extend(h)
    toks, pars = ix.propose_tree(8, max_depth=1, max_width=8)
    # nothing but 2 and the chain (the earliest "1", followed by 9, which agrees with
    # the history for one token: the free regime, so the counted 2 comes first)
    assert toks.tolist() == [2, 9] and pars.tolist() == [-1, -1]


def test_occurrences_are_within_the_window(sfx):
    """Occurrences ending TREE_WINDOW or more positions back are not counted; the chain,
    from the automaton, may still start there."""
    filler = list(range(100, 100 + TREE_WINDOW))
    h = [1, 2, 3] + filler + [1, 2, 4, 7, 1, 2]
    ix = sfx.SuffixIndex(1)
    ix.extend(h)
    toks, pars = ix.propose_tree(3, max_depth=1, max_width=8)
    assert ix.propose(1) == [3]
    assert toks.tolist() == [3, 4] and pars.tolist() == [-1, -1]
    assert (toks.tolist(), pars.tolist()) == reference(h, 1, None, "earliest", ix.match_end(), 3, 1, 8)


def test_batch_is_the_trees_of_each_index(sfx):
    """propose_tree_batch packs each index's propose_tree (an index may appear twice);
    refusals as propose_tree's, and a non-index named."""
    import random

    rng = random.Random(3)
    ixs = []
    for n in (0, 5, 40, 200, 1):
        ix = sfx.SuffixIndex(1, anchor_n=rng.choice([0, 4]))
        ix.extend([rng.randrange(4) for _ in range(n)])
        ixs.append(ix)
    ixs.append(ixs[2])
    toks, pars, off = sfx.propose_tree_batch(ixs, 12, None, 3)
    assert off.dtype == np.int64 and off.tolist()[0] == 0 and len(off) == len(ixs) + 1
    for i, ix in enumerate(ixs):
        a, b = ix.propose_tree(12, None, 3)
        assert toks[off[i] : off[i + 1]].tolist() == a.tolist()
        assert pars[off[i] : off[i + 1]].tolist() == b.tolist()
    t0, p0, o0 = sfx.propose_tree_batch([], 4)
    assert t0.tolist() == [] and p0.tolist() == [] and o0.tolist() == [0]
    with pytest.raises(ValueError, match="budget must be between 1 and 1024, got 0"):
        sfx.propose_tree_batch(ixs, 0)
    with pytest.raises(TypeError, match=r"indexes\[1\] must be a SuffixIndex"):
        sfx.propose_tree_batch([ixs[0], 3], 4)
    ixs[1]._hold_guard(True)
    try:
        with pytest.raises(RuntimeError):
            sfx.propose_tree_batch(ixs, 4)
    finally:
        ixs[1]._hold_guard(False)
