"""The compiled ``BatchState`` and its twin side by side: every public method, random
legal and illegal calls, edge values and busy-guard refusals, the same result or the
same exception (type and message) and the same state afterwards."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from specfsm import _impl
from specfsm.accept.rules import Exact, MinRun
from impls import over

CAP, KMAX = 4, 3
SIDES = ("compiled", "python")

# ints a caller may pass where a count, a token or a cache handle goes
EDGE_INTS = [0, 1, 2, 3, -1, -(2**63), 2**63 - 1, 2**63, 2**64, 2**100, True, False,
             np.int64(2), np.int32(1), np.uint64(2**63), np.int8(-3), 1.5, "1", None]


def _kernels():
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: the compiled core is switched off")
    try:
        comp = _impl.kernels("compiled", "batch")
    except ImportError:
        pytest.skip("the compiled core is not built")
    return {
        "compiled": (over(comp), _impl.kernels("compiled", "ngram_index"), _impl.kernels("compiled", "suffix_index")),
        "python": (over(_impl.kernels("python", "batch")), _impl.kernels("python", "ngram_index"),
                   _impl.kernels("python", "suffix_index")),
    }


def _norm(value):
    """A comparable form of a result: arrays with their dtype, StepResults by field."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tolist())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_norm(v) for v in value])
    if type(value).__name__ == "StepResult":
        return ("StepResult", [_norm(getattr(value, f)) for f in (
            "slots", "emitted", "emitted_offsets", "accepted", "drafted", "resume_rows",
            "finished", "drafts", "draft_offsets", "rolled_back")], value.emitted_by_slot(), repr(value))
    if isinstance(value, (bool, np.bool_)):
        return ("bool", bool(value))
    if isinstance(value, (int, np.integer)):
        return ("int", type(value).__name__, int(value))
    return value


def _call(fn):
    try:
        return ("ok", _norm(fn()))
    except Exception as exc:  # the same refusal on both sides is the property
        return ("err", type(exc).__name__, str(exc))


def snapshot(b):
    c = b.capacity
    return (_norm(b.states), _norm(b.tokens), _norm(b.caches), _norm(b.accepted),
            _norm(b.draft_lens), _norm(b.remaining), b.capacity, b.k_max, b.bonus, b.busy, len(b),
            repr(b), [b.slot_fields(i) for i in range(c)], [b.state_of(i) for i in range(c)],
            [b.draft(i) for i in range(c)], _norm(b.pending()),
            [_norm(b.slots_in(code)) for code in range(7)])


# -- argument strategies: mostly well formed, sometimes anything -----------------------------
small = st.integers(0, 5)
edge = st.sampled_from(EDGE_INTS)
anyint = st.one_of(small, small, small, edge)


@st.composite
def slot_list(draw):
    pick = draw(st.integers(0, 9))
    if pick == 0:
        return draw(st.sampled_from([[], None, "0", 3.0, [[0]], np.array([0, 1], dtype=np.int8),
                                     np.array([1.0]), [0, 0], [CAP], [-1], [True], [2**64]]))
    slots = draw(st.lists(st.integers(0, CAP - 1), min_size=1, max_size=CAP, unique=True))
    return _form(draw, slots) if pick == 1 else slots


def _form(draw, values):
    """Plain ints as an argument of another form: the compiled transitions' fast path
    takes int64 and int32 arrays, lists and tuples; a strided array takes the general
    path."""
    if not all(type(v) is int for v in values):
        return values
    pick = draw(st.integers(0, 4))
    if pick == 0:
        return tuple(values)
    try:
        if pick == 1:
            return np.array(values, dtype=np.int32)
        if pick == 2:
            return np.repeat(np.array(values, dtype=np.int64), 2)[::2]
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return values


@st.composite
def per_slot(draw, n):
    pick = draw(st.integers(0, 19))
    if pick == 0:
        return draw(st.sampled_from([[], None, "x", [1.5] * max(n, 1), 7, np.int64(4)]))
    if pick == 1:
        return draw(st.lists(anyint, min_size=n, max_size=n))
    return draw(st.lists(small, min_size=n, max_size=n))


@st.composite
def ragged(draw, n, min_len=1, max_len=KMAX):
    seqs = draw(st.lists(st.lists(small, min_size=min_len, max_size=max_len), min_size=n, max_size=n))
    flat = [t for s in seqs for t in s]
    off = [0]
    for s in seqs:
        off.append(off[-1] + len(s))
    pick = draw(st.integers(0, 23))
    if pick == 0:
        flat = draw(st.lists(anyint, min_size=len(flat), max_size=len(flat)))
    elif pick == 1:
        off = draw(st.lists(st.integers(-1, len(flat) + 1), min_size=0, max_size=n + 2))
    elif pick == 2:
        off = off[:-1]
    elif pick == 3:
        flat, off = draw(st.sampled_from([(None, off), (flat, None), ("ab", off), (flat, [0.5])]))
    if isinstance(flat, list) and draw(st.booleans()):
        flat = _form(draw, flat)
    if isinstance(off, list) and draw(st.booleans()):
        off = _form(draw, off)
    return flat, off


def _n(slots):
    try:
        return max(0, min(len(slots), CAP + 1))
    except TypeError:
        return 1


class Reenter:
    """A rule whose ``accepted_rows`` calls back into its batch (refused while the step
    holds the guard) and returns ``count``."""

    def __init__(self, batch, call, count):
        self.batch, self.call, self.count = batch, call, count
        self.seen = []

    def accepted_rows(self, draft, rows):
        self.seen.append(_call(lambda: self.call(self.batch)))
        return self.count


REENTRY = [lambda b: b.states, lambda b: b.pending(), lambda b: b.slot_fields(0),
           lambda b: b.admit([0], [1], [0, 1], [0]), lambda b: b.step([0]), lambda b: len(b),
           lambda b: b.finish([0]), lambda b: b.draft(0)]


# the states each transition applies to (FREE 0, PREFILL 1 .. DONE 6)
LEGAL = {"admit": {0}, "advance_prefill": {1}, "advance_decode": {2}, "enter_verify": {2},
         "accept": {3}, "accept_rows": {3}, "resume": {4}, "rollback": {5}, "release": {6},
         "finish": {1, 2, 3, 4, 5, 6}}


@st.composite
def operation(draw, pending_rows, states):
    """``(name, build)``: ``build(side_batch, side_index)`` gives the call for one side;
    a transition mostly on slots it is legal for, sometimes on any slots or values."""
    name = draw(st.sampled_from([
        "admit", "admit", "advance_prefill", "advance_decode", "enter_verify", "accept",
        "accept_rows", "resume", "rollback", "finish", "release", "step", "step", "step",
        "state_of", "slot_fields", "draft", "slots_in"]))
    legal = [i for i, code in enumerate(states) if code in LEGAL.get(name, ())]
    if legal and draw(st.integers(0, 2)):
        slots = draw(st.lists(st.sampled_from(legal), min_size=1, unique=True))
    else:
        slots = draw(slot_list())
    n = _n(slots)
    if name == "admit":
        pos, off = draw(ragged(n, 0 if draw(st.integers(0, 7)) == 0 else 1, 4))
        caches = draw(per_slot(n))
        kw = {}
        if draw(st.booleans()):
            kw["max_tokens"] = draw(st.one_of(st.integers(1, 6), st.sampled_from([0, -1, 2**63]),
                                              st.lists(st.integers(0, 6), min_size=n, max_size=n)))
        if draw(st.booleans()):
            kw["eos"] = draw(st.one_of(small, st.lists(small, min_size=n, max_size=n)))
        kinds = draw(st.sampled_from([None, "ngram", "suffix", "mixed", "same", "bad"]))
        return name, lambda b, ix: b.admit(slots, pos, off, caches, indexes=ix(kinds, n, pos, off), **kw)
    if name in ("advance_prefill", "advance_decode"):
        toks, caches = draw(per_slot(n)), draw(per_slot(n))
        return name, lambda b, ix: getattr(b, name)(slots, toks, caches)
    if name == "enter_verify":
        d, off = draw(ragged(n, 0 if draw(st.integers(0, 7)) == 0 else 1, KMAX + (draw(st.integers(0, 7)) == 0)))
        return name, lambda b, ix: b.enter_verify(slots, d, off)
    if name in ("accept", "accept_rows"):
        rt, roff = draw(ragged(n, 0, KMAX + 1))
        rc, coff = draw(ragged(n, 0, KMAX + 1))
        if name == "accept":
            return name, lambda b, ix: b.accept(slots, rt, roff, rc, coff)
        acc = draw(per_slot(n))
        return name, lambda b, ix: b.accept_rows(slots, acc, rt, roff, rc, coff)
    if name in ("resume", "rollback", "finish", "release"):
        return name, lambda b, ix: getattr(b, name)(slots)
    if name in ("state_of", "slot_fields", "draft"):
        slot = draw(st.one_of(st.integers(-1, CAP), edge))
        return name, lambda b, ix: getattr(b, name)(slot)
    if name == "slots_in":
        code = draw(st.one_of(st.integers(-1, 8), edge))
        return name, lambda b, ix: b.slots_in(code)
    # step
    m = pending_rows
    if draw(st.integers(0, 9)) == 0:
        m = draw(st.integers(0, pending_rows + 2))
    rows = draw(st.lists(st.integers(0, 5), min_size=m, max_size=m))
    form = draw(st.integers(0, 9))
    if form == 0:
        rows = draw(st.sampled_from([None, "ab", [1.5] * m, [[0]] * m, [2**63] * m]))
    elif form == 1:
        rows = np.array(rows, dtype=np.int32)
    elif form == 2:
        rows = np.array(rows, dtype=np.int64)
    rule_kind = draw(st.sampled_from(["none", "none", "exact", "minrun", "count", "reenter", "bad"]))
    mrun = draw(st.integers(0, 3))
    count = draw(st.one_of(st.integers(0, KMAX), st.sampled_from([-1, KMAX + 1, 2**63, 1.5, None])))
    reentry = draw(st.sampled_from(range(len(REENTRY))))

    def build(b, ix):
        rule = {"none": None, "exact": Exact(), "minrun": MinRun(mrun), "bad": object(),
                "count": Reenter(b, lambda _b: None, count),
                "reenter": Reenter(b, REENTRY[reentry], min(count, 1) if isinstance(count, int) else 0),
                }[rule_kind]
        out = b.step(rows, rule=rule)
        if isinstance(rule, Reenter):
            return out, rule.seen
        return out

    return name, build


def _index_factory(mods, pool):
    _, ni, si = mods

    def make(kinds, n, pos, off):
        if kinds is None:
            return None
        if kinds == "bad":
            return ["not an index"] * n
        out = []
        for q in range(n):
            kind = kinds if kinds in ("ngram", "suffix") else ("ngram" if q % 2 else "suffix")
            if kinds == "same" and out:
                out.append(out[0])
                continue
            ix = ni.NgramIndex(1, 3) if kind == "ngram" else si.SuffixIndex(1, 3, adaptive=q % 2 == 0, draft_len=2)
            try:
                ix.extend(list(pos[off[q]: off[q + 1]]))
            except Exception:  # a malformed prompt: the admit itself refuses it
                pass
            pool.append(ix)
            out.append(ix)
        return out

    return make


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), bonus=st.booleans())
def test_compiled_and_twin_batches_agree_on_every_call(data, bonus):
    mods = _kernels()
    batches = {s: mods[s][0](CAP, KMAX, bonus) for s in SIDES}
    pools = {s: [] for s in SIDES}
    make = {s: _index_factory(mods[s], pools[s]) for s in SIDES}
    for _ in range(data.draw(st.integers(1, 30))):
        rows = int(batches["python"].pending()[2][-1])
        name, build = data.draw(operation(rows, batches["python"].states.tolist()))
        got = {s: _call(lambda s=s: build(batches[s], make[s])) for s in SIDES}
        assert got["compiled"] == got["python"], name
        event(f"{name}: {got['python'][0]}")
        assert snapshot(batches["compiled"]) == snapshot(batches["python"]), name
        for a, b in zip(pools["compiled"], pools["python"]):
            assert (a.propose(KMAX), a.stats) == (b.propose(KMAX), b.stats)


@pytest.mark.parametrize("side", SIDES)
def test_a_held_guard_refuses_every_method_alike(side):
    mods = _kernels()
    b = mods[side][0](2, 2)
    b.admit([0], [1, 2], [0, 2], [5])
    b._hold_guard(True)
    try:
        calls = [lambda: b.states, lambda: b.pending(), lambda: b.slot_fields(0), lambda: b.state_of(0),
                 lambda: b.step([1, 2]), lambda: b.finish([0]), lambda: b.draft(0), lambda: len(b)]
        results = [_call(c) for c in calls]
    finally:
        b._hold_guard(False)
    assert all(r[:2] == ("err", "RuntimeError") for r in results), results
    other = mods["python" if side == "compiled" else "compiled"][0](2, 2)
    other.admit([0], [1, 2], [0, 2], [5])
    other._hold_guard(True)
    try:
        again = [_call(c) for c in [lambda: other.states, lambda: other.pending(), lambda: other.slot_fields(0),
                                    lambda: other.state_of(0), lambda: other.step([1, 2]),
                                    lambda: other.finish([0]), lambda: other.draft(0), lambda: len(other)]]
    finally:
        other._hold_guard(False)
    assert again == results


def test_long_prompts_and_mixed_indexes_step_alike():
    """Steps whose rows outgrow the compiled step's scratch (long prompts, then drafts
    through both index kinds and a slot without one): the same results and states."""
    mods = _kernels()
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 4, n).tolist() for n in (300, 700, 50, 1200)]
    flat = [t for p in prompts for t in p]
    off = np.cumsum([0] + [len(p) for p in prompts])
    rows_seen = []
    batches = {}
    for s in SIDES:
        bcls, ni, si = mods[s]
        ixs = [ni.NgramIndex(1, 3), si.SuffixIndex(1, 3), None, ni.NgramIndex(2, 4)]
        for ix, p in zip(ixs, prompts):
            if ix is not None:
                ix.extend(p)
        b = bcls(4, 3)
        b.admit([3, 0, 1, 2], flat, off, [0, 1, 2, 3], max_tokens=[400, 400, 400, 30], indexes=ixs)
        batches[s] = (b, ixs)
    for _ in range(60):
        total = int(batches["python"][0].pending()[2][-1])
        if not total:
            break
        rows = rng.integers(0, 4, total)
        rows_seen.append(total)
        got = {s: _call(lambda s=s: batches[s][0].step(rows)) for s in SIDES}
        assert got["compiled"] == got["python"]
        assert snapshot(batches["compiled"][0]) == snapshot(batches["python"][0])
        for a, b in zip(*(batches[s][1] for s in SIDES)):
            if a is not None:
                assert (a.propose(3), a.stats) == (b.propose(3), b.stats)
    assert rows_seen[0] == 2250 and len(rows_seen) > 20
