"""Speculative sampling over a tree (``specfsm.tree.sampling``): the emitted tokens are
distributed as plain sampling (a chi-square test of the joint distribution of the first
three tokens against the exact one, which rejects a deliberately wrong sampler fed the
same draws), the walk is each implementation's ``accept_tree`` over rows drawn one per
row, the batch is its trees one by one, and a refused call draws nothing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specfsm.tree.sampling import sample_rows, sample_tree, sample_tree_batch

from test_accept_rule import chi2_threshold

V = 5
# a tree over tokens 0..4: the root's children 1 and 3, node 0's children 2 and 0,
# node 1's child 4, node 2's child 1 (three levels, siblings distinct)
TOKENS = np.array([1, 3, 2, 0, 4, 1], dtype=np.int64)
PARENTS = np.array([-1, -1, 0, 0, 1, 2], dtype=np.int64)
DRAWS = 30000
LENGTH = 3  # tokens per sampled sequence


def target(context: tuple[int, ...]) -> np.ndarray:
    """The target's distribution after ``context``: fixed, different per context, every
    token possible, some nearly ruled out."""
    g = np.random.default_rng(abs(hash((7,) + context)) % (2**32))
    p = g.dirichlet(np.full(V, 0.7)) + 1e-3
    return p / p.sum()


def node_context(i: int) -> tuple[int, ...]:
    path = []
    while i != -1:
        path.append(int(TOKENS[i]))
        i = int(PARENTS[i])
    return tuple(reversed(path))


ROWS = np.array([target(())] + [target(node_context(i)) for i in range(len(TOKENS))])


def exact_joint() -> dict[tuple[int, ...], float]:
    out = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        pr = 1.0
        for j in range(LENGTH):
            pr *= target(seq[:j])[seq[j]]
        out[seq] = pr
    return out


def sequences(sampler, seed: int) -> list[tuple[int, ...]]:
    """DRAWS sequences of LENGTH tokens: one tree step, then plain draws from the target
    where the tree emitted fewer (the next steps of a decode)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(DRAWS):
        seq = list(sampler(rng))[:LENGTH]
        while len(seq) < LENGTH:
            seq.append(int(rng.choice(V, p=target(tuple(seq)))))
        out.append(tuple(seq))
    return out


def chi2_seqs(seqs, joint) -> float:
    counts = dict.fromkeys(joint, 0)
    for s in seqs:
        counts[s] += 1
    n = len(seqs)
    return sum((counts[s] - n * p) ** 2 / (n * p) for s, p in joint.items())


def wrong_sampler(rng):
    """Follows a child whenever the row's greedy choice is one: not the target's law."""
    rows = sample_rows(ROWS, rng)
    greedy = ROWS.argmax(axis=1)
    cur, out = -1, []
    while True:
        kids = [c for c in range(len(TOKENS)) if PARENTS[c] == cur]
        pick = next((c for c in kids if TOKENS[c] == greedy[cur + 1]), None)
        if pick is None:
            return out + [int(rows[cur + 1])]
        out.append(int(TOKENS[pick]))
        cur = pick


def test_tree_sampling_keeps_the_target_distribution():
    joint = exact_joint()
    threshold = chi2_threshold(len(joint) - 1)
    for seed in (21, 22):
        good = chi2_seqs(sequences(lambda g: sample_tree(TOKENS, PARENTS, ROWS, g)[1], seed), joint)
        assert good < threshold, (seed, good, threshold)
        # the same test rejects a sampler that walks by the greedy choice
        bad = chi2_seqs(sequences(wrong_sampler, seed), joint)
        assert bad > 10 * threshold, (seed, bad, threshold)


def test_the_tree_is_walked_often():
    # the distribution test means something only if paths through the tree are taken
    rng = np.random.default_rng(5)
    lens = [len(sample_tree(TOKENS, PARENTS, ROWS, rng)[0]) for _ in range(4000)]
    assert np.mean([n >= 1 for n in lens]) > 0.2 and np.mean([n >= 2 for n in lens]) > 0.05


def test_walk_is_each_implementations_accept_tree(impl):
    kern = impl.module("tree")
    rng = np.random.default_rng(3)
    for seed in range(200):
        probs = rng.dirichlet(np.full(V, 0.5), size=len(TOKENS) + 1)
        path, emitted = sample_tree(TOKENS, PARENTS, probs, seed=seed)
        rows = sample_rows(probs, seed=seed)
        want = kern.accept_tree(TOKENS, PARENTS, rows)
        assert path.tolist() == want.tolist()
        last = int(want[-1]) + 1 if len(want) else 0
        assert emitted == TOKENS[want].tolist() + [int(rows[last])]


def test_batch_is_its_trees_one_by_one():
    rng = np.random.default_rng(9)
    trees = [(TOKENS, PARENTS), (np.array([4]), np.array([-1])), (np.array([0, 1, 2]), np.array([-1, 0, 0]))]
    probs = [rng.dirichlet(np.full(V, 0.6), size=len(t) + 1) for t, _ in trees]
    offs = np.cumsum([0] + [len(t) for t, _ in trees])
    counts, resume, path, poff, nxt = sample_tree_batch(
        np.concatenate([t for t, _ in trees]), np.concatenate([p for _, p in trees]), offs, np.concatenate(probs),
        seed=42)
    g = np.random.default_rng(42)
    for b, ((t, p), pr) in enumerate(zip(trees, probs)):
        one_path, one = sample_tree(t, p, pr, g)
        assert path[poff[b]:poff[b + 1]].tolist() == one_path.tolist()
        assert counts[b] == len(one_path)
        assert resume[b] == (one_path[-1] + 1 if len(one_path) else 0)
        assert int(nxt[b]) == one[-1]


def test_sample_rows_never_draws_a_ruled_out_token():
    p = np.zeros((500, 6))
    p[:, 2] = 0.25
    p[:, 5] = 0.75
    rows = sample_rows(p, seed=0)
    assert set(rows.tolist()) == {2, 5}
    assert 0.7 < float(np.mean(rows == 5)) < 0.8


@pytest.mark.parametrize("bad, match", [
    (np.full((7, V), 0.3), "sum"),
    (np.full((6, V), 0.2), "one row per node"),
    (np.full((7,), 0.2), "2-D|two-dimensional|dimension"),
])
def test_refusals_draw_nothing(bad, match):
    g = np.random.default_rng(1)
    before = g.bit_generator.state
    with pytest.raises(ValueError, match=match):
        sample_tree(TOKENS, PARENTS, bad, g)
    assert g.bit_generator.state == before


def test_refused_tree_and_batch_draw_nothing():
    g = np.random.default_rng(1)
    before = g.bit_generator.state
    with pytest.raises(ValueError):
        sample_tree(np.array([1, 1]), np.array([-1, -1]), np.full((3, V), 0.2), g)  # equal siblings
    with pytest.raises(ValueError):
        sample_tree_batch(TOKENS, PARENTS, np.array([0, 3, 5]), np.full((9, V), 0.2), g)  # offsets do not tile
    with pytest.raises(ValueError):
        sample_tree_batch(TOKENS, PARENTS, np.array([0, 6]), np.full((6, V), 0.2), g)  # one row short
    with pytest.raises(TypeError):
        sample_tree(TOKENS, PARENTS, ROWS, rng=np.random.RandomState(0))
    assert g.bit_generator.state == before
