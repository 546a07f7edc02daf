"""Trees on recorded traces: ``TeacherForcedTarget.evaluate_tree``, the shared
``TeacherForcedBatch``, ``specfsm.serving.trees.SuffixTreeDrafter`` in ``serve``, and
``specfsm replay --drafter suffix-tree``. The target is checked against a brute-force
reading of the recording (a row answers when its whole root-to-node path is the
recording); decoding with trees must give the recorded outputs exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specfsm
from specfsm import cli
from specfsm.serving.loop import Request, TreeDraft, serve
from specfsm.serving.trees import SuffixTreeDrafter
from specfsm.serving.workload import TeacherForcedBatch, TeacherForcedTarget, TraceError

from test_replay import edit_traces, write_jsonl


def _paths(parents):
    out = []
    for i, p in enumerate(parents):
        out.append((out[p] if p >= 0 else []) + [i])
    return out


@st.composite
def trees(draw):
    n = draw(st.integers(1, 12))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    return tokens, parents


@settings(max_examples=300, deadline=None)
@given(seq=st.lists(st.integers(0, 2), min_size=3, max_size=30), tree=trees(), data=st.data())
def test_evaluate_tree_answers_by_the_recorded_path(seq, tree, data):
    prompt_len = data.draw(st.integers(1, len(seq) - 2))
    pos = data.draw(st.integers(max(prompt_len - 1, 1), len(seq) - 2))
    tokens, parents = tree
    t = TeacherForcedTarget(seq[:prompt_len], seq[prompt_len:])
    rows, caches = t.evaluate_tree([seq[pos]] + tokens, parents, pos)
    assert rows[0] == seq[pos + 1] and caches[0] == pos + 1
    for i, path in enumerate(_paths(parents)):
        d = len(path)
        on = pos + d + 1 < len(seq) and [tokens[j] for j in path] == seq[pos + 1 : pos + d + 1]
        assert (rows[i + 1], caches[i + 1]) == ((seq[pos + d + 1], pos + d + 1) if on else (-1, -1))


def test_a_chain_as_a_tree_is_evaluate():
    seq = list(range(20))
    t = TeacherForcedTarget(seq[:5], seq[5:])
    for draft in ([8, 9, 10], [8, 3, 10], [2, 9], list(range(8, 20))):
        assert t.evaluate_tree([7] + draft, list(range(-1, len(draft) - 1)), 7) == t.evaluate([7] + draft, 7)


def test_evaluate_tree_refusals():
    t = TeacherForcedTarget([1, 2, 3], [4, 5, 6])
    with pytest.raises(ValueError, match="needs 2 parents"):
        t.evaluate_tree([3, 4, 5], [-1], 2)
    with pytest.raises(ValueError, match=r"parents\[1\] = 1"):
        t.evaluate_tree([3, 4, 5], [-1, 1], 2)
    with pytest.raises(TraceError, match="departs"):
        t.evaluate_tree([9, 4], [-1], 2)
    with pytest.raises(TraceError, match="after prefill"):
        t.evaluate_tree([1, 4], [-1], None)
    with pytest.raises(TraceError, match="samples"):
        TeacherForcedTarget([1, 2, 3], [4, 5, 6], temperature=0.5).evaluate_tree([3, 4], [-1], 2)


def test_batch_target_routes_by_the_cache():
    a = TeacherForcedTarget([1, 2], [3, 4, 5])
    b = TeacherForcedTarget([7, 8], [9, 9, 9])
    shared = TeacherForcedBatch([a, b])
    assert shared.evaluate([1, 2], (0, None)) == ([2, 3], [(0, 1), (0, 2)])
    got = shared.evaluate_batch([[2, 3, 6], [8, 9, 9]], [(0, 1), (1, 1)], trees=[np.array([-1, -1]), None])
    assert got == [([3, 4, -1], [(0, 2), (0, 3), (0, -1)]), ([9, 9, 9], [(1, 2), (1, 3), (1, 4)])]
    for bad in (3, (2, 1), ("0", 1), None):
        with pytest.raises(TraceError, match="cache must be"):
            shared.evaluate([1], bad)


def _requests(traces):
    targets = [TeacherForcedTarget(t["prompt"], t["output"]) for t in traces]
    reqs = [Request(t["prompt"], len(t["output"]), cache=(i, None)) for i, t in enumerate(traces)]
    return TeacherForcedBatch(targets), reqs


def _branchy(n=4):
    """Records whose fields take a few values: the history holds several continuations
    of one context, where a tree branches."""
    rng = np.random.default_rng(5)
    out = []
    for r in range(n):
        toks = []
        for _ in range(40):
            toks += [1, 2, int(rng.integers(10, 13)), 3, int(rng.integers(20, 22)), 4]
        out.append({"prompt": toks[:60], "output": toks[60:], "name": f"records {r}"})
    return out


@pytest.mark.parametrize("k", [1, 4, 12])
def test_decoding_with_trees_gives_the_recording(k):
    traces = edit_traces(3) + _branchy()
    shared, reqs = _requests(traces)
    drafter = SuffixTreeDrafter()
    trees = []
    session = drafter.session([1, 2, 10, 3, 20, 4, 1, 2, 11, 3, 21, 4, 1, 2])
    d = session.propose(k)
    trees.append(type(d) is TreeDraft)
    out = serve(reqs, shared, drafter, k, bonus=True)
    assert [o.output for o in out] == [t["output"] for t in traces]
    evals = sum(o.stats.evaluations for o in out)
    assert evals < sum(len(t["output"]) for t in traces)
    # a 4-node budget goes to the chain (its bonus keeps it ahead of the other value);
    # 12 nodes reach past it to the other continuation
    assert trees == [k == 12]
    if k == 12:
        assert len(d.tokens) <= k and 11 in d.tokens.tolist()


def test_tree_drafter_refuses_bad_limits():
    with pytest.raises(ValueError, match="max_width"):
        SuffixTreeDrafter(max_width=0)
    with pytest.raises(ValueError):
        SuffixTreeDrafter(min_n=0, max_n=0, prefer="sideways")
    assert SuffixTreeDrafter().session([5]).propose(4) == []


def test_replay_with_trees(tmp_path, capsys):
    path = write_jsonl(tmp_path / "w.jsonl", _branchy(3))
    args = ["replay", "--workload", path, "--json", "--k", "8", "--repeat", "1"]
    assert cli.main(args + ["--drafter", "suffix-tree"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["identical"] is True and s["settings"]["bonus"] is True and s["settings"]["drafter"] == "suffix-tree"
    if specfsm.USE_EXTENSIONS:
        assert s["implementations_agree"] is True and s["runs"] == {"compiled": 1, "python": 1}
    assert s["evaluations_speculative"] < s["evaluations_greedy"]
    assert cli.main(args + ["--drafter", "suffix-tree", "--rule", "minrun:2"]) == 2
    assert "--drafter suffix-tree verifies trees greedily" in capsys.readouterr().err
