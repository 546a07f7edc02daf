"""``specfsm.extend_batch``, ``propose_batch``, ``record_batch``, ``serve_batch`` and
``serve_batch_lists`` take B indexes of either kind (all one kind) and answer exactly as
that kind's own batch call; a mixed batch or another object is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import specfsm
from specfsm.drafting import ngram_index, suffix_index

KINDS = [
    pytest.param(lambda: specfsm.NgramIndex(1, 3), ngram_index, id="ngram"),
    pytest.param(lambda: specfsm.SuffixIndex(1), suffix_index, id="suffix"),
]
HIST = [1, 2, 3, 1, 2, 3, 4, 1, 2]


def _pair(make):
    return [make(), make()], [make(), make()]


@pytest.mark.parametrize("make,mod", KINDS)
def test_the_generic_calls_answer_as_the_kinds_own(fsm, make, mod):
    a, b = _pair(make)
    toks, off = HIST + HIST[:5], [0, len(HIST), len(HIST) + 5]
    specfsm.extend_batch(a, toks, off)
    mod.extend_batch(b, toks, off)
    got, want = specfsm.propose_batch(a, 3), mod.propose_batch(b, 3)
    assert [x.tolist() for x in got] == [x.tolist() for x in want]
    assert specfsm.record_batch(a, [3, 2], [1, 2]).tolist() == mod.record_batch(b, [3, 2], [1, 2]).tolist()
    args = ([5, 1, 2], [0, 1, 3], [0, 0], [0, 0], 4)
    got = specfsm.serve_batch(a, *args)
    want = mod.serve_batch(b, *args)
    assert [x.tolist() for x in got] == [x.tolist() for x in want]
    assert specfsm.serve_batch_lists(a, [3], [0, 1, 1], [0, 0], [0, 0]) == mod.serve_batch_lists(b, [3], [0, 1, 1], [0, 0], [0, 0])
    assert [len(x) for x in a] == [len(x) for x in b]


def test_a_mixed_batch_and_other_objects_are_refused_by_name(fsm):
    with pytest.raises(TypeError, match=r"indexes\[1\] must be a SuffixIndex like indexes\[0\]"):
        specfsm.extend_batch([specfsm.SuffixIndex(), specfsm.NgramIndex(1, 2)], [1], [0, 1, 1])
    with pytest.raises(TypeError, match=r"indexes\[0\] must be an NgramIndex or a SuffixIndex"):
        specfsm.propose_batch([object()])
    with pytest.raises(TypeError, match="indexes must be a sequence"):
        specfsm.record_batch(3, [1], [1])
    empty = specfsm.propose_batch([], 2)
    assert [x.tolist() for x in empty] == [[], [0], []]


def test_indexes_are_read_once(fsm):
    """A sequence that answers differently each time it is read is read once."""
    reads = []
    ixs = [specfsm.SuffixIndex(), specfsm.SuffixIndex()]

    class Once:
        def __iter__(self):
            reads.append(1)
            return iter(ixs if len(reads) == 1 else [specfsm.NgramIndex(1, 2)])

    specfsm.extend_batch(Once(), [1, 2, 1, 2], [0, 2, 4])
    assert len(reads) == 1 and [len(x) for x in ixs] == [2, 2]


def test_place_rows_and_snapshot_are_top_level_and_run_on_the_host(fsm):
    src = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    dst = np.zeros((2, 2), dtype=np.float32)
    specfsm.place_rows(src, np.array([2, -1]), dst)
    assert dst.tolist() == [[4.0, 5.0], [0.0, 0.0]]
    from specfsm import gpu

    assert gpu.place_rows is specfsm.place_rows and gpu.snapshot is specfsm.snapshot
