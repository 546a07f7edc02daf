"""``BatchState`` on the shared guard protocol, all-or-nothing steps, placement rows and
the documentation of both implementations.

The structural tests enumerate each class's public methods and properties from its
twin (``test_signatures.public_surface``), so a method added without a call
here fails them: every one is refused while a writer holds the guard
(``_hold_guard(True)``), refused on an instance made with ``__new__``, and a second
``__init__`` is refused.
"""

from __future__ import annotations

import re
import inspect
import subprocess
import sys
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from impls import over
from isolated import TESTS, child_env
from test_signatures import public_surface

def _classes() -> dict[str, tuple[dict[str, list[str]], set[str]]]:
    """``{class: ({method: parameter names without self}, {property})}`` from the twin."""
    out = {}
    for name in ("StepResult", "BatchState"):
        methods, props = public_surface("batch", name)
        out[name] = ({m: [p.name for p in ps] for m, ps in methods.items()}, props)
    return out


CLASSES = _classes()

# one legal-looking call per public method of BatchState (on a fresh 4-slot batch)
CALLS = {
    "__len__": lambda b: len(b),
    "slots_in": lambda b: b.slots_in(0),
    "draft": lambda b: b.draft(0),
    "slot_fields": lambda b: b.slot_fields(0),
    "slot_tree": lambda b: b.slot_tree(0),
    "admit": lambda b: b.admit([0], [1, 2], [0, 2], [0]),
    "advance_prefill": lambda b: b.advance_prefill([0], [1], [0]),
    "advance_decode": lambda b: b.advance_decode([0], [1], [0]),
    "enter_verify": lambda b: b.enter_verify([0], [1], [0, 1]),
    "enter_verify_tree": lambda b: b.enter_verify_tree([0], [1], [-1], [0, 1]),
    "accept": lambda b: b.accept([0], [1], [0, 1], [0], [0, 1]),
    "accept_rows": lambda b: b.accept_rows([0], [1], [1], [0, 1], [0], [0, 1]),
    "resume": lambda b: b.resume([0]),
    "rollback": lambda b: b.rollback([0]),
    "finish": lambda b: b.finish([0]),
    "release": lambda b: b.release([0]),
    "pending": lambda b: b.pending(),
    "pending_trees": lambda b: b.pending_trees(),
    "step": lambda b: b.step(np.zeros(0, dtype=np.int64)),
}


def _public(cls_name):
    methods, props = CLASSES[cls_name]
    return sorted(m for m in methods if m != "__init__"), sorted(props)


def snapshot(b):
    """Everything a caller can see of a batch (a refused call must leave it equal)."""
    c = b.capacity
    return (b.states.tolist(), b.tokens.tolist(), b.caches.tolist(), b.accepted.tolist(),
            b.draft_lens.tolist(), b.remaining.tolist(), [b.state_of(i) for i in range(c)],
            [b.draft(i) for i in range(c)], [a.tolist() for a in b.pending()])


# --------------------------------------------------------------------------------------
# the guard protocol
# --------------------------------------------------------------------------------------
def test_every_public_method_of_the_stub_has_a_call_here():
    methods, props = _public("BatchState")
    assert sorted(CALLS) == methods
    assert "busy" in props and "states" in props


def test_every_public_method_and_property_is_refused_while_a_writer_holds_the_guard(bm):
    b = bm.BatchState(4, 2)
    b.admit([1], [1, 2], [0, 2], [5])
    before = snapshot(b)
    methods, props = _public("BatchState")
    b._hold_guard(True)
    try:
        for name in methods:
            with pytest.raises(RuntimeError, match="BatchState is being changed"):
                CALLS[name](b)
        for name in props:
            if name == "busy":          # what it reports (refused only when uninitialised)
                assert b.busy is True
                continue
            with pytest.raises(RuntimeError, match="BatchState is being changed"):
                getattr(b, name)
        with pytest.raises(RuntimeError, match="BatchState is being changed"):
            b._hold_guard(True)         # a second writer is refused like a transition
    finally:
        b._hold_guard(False)
    assert not b.busy and snapshot(b) == before


def test_an_instance_made_with_new_refuses_every_call(bm):
    b = bm.BatchState.__new__(bm.BatchState)
    methods, props = _public("BatchState")
    for name in methods:
        with pytest.raises(RuntimeError, match="BatchState was not initialised"):
            CALLS[name](b)
    for name in props:
        with pytest.raises(RuntimeError, match="BatchState was not initialised"):
            getattr(b, name)
    assert "not initialised" in repr(b)
    b.__init__(2)                       # __init__ on it completes the object
    assert b.capacity == 2 and b.pending()[0].tolist() == []


def test_a_second_init_is_refused_and_changes_nothing(bm):
    b = bm.BatchState(3, 2, bonus=True)
    b.admit([0], [1, 2], [0, 2], [7])
    before = snapshot(b)
    for args in ((3, 2), (8, 4), (1,)):
        with pytest.raises(RuntimeError, match=r"BatchState.__init__ may be called only once"):
            b.__init__(*args)
    assert snapshot(b) == before and b.capacity == 3 and b.k_max == 2 and b.bonus


class Boom(Exception):
    pass


class BadBool:
    def __bool__(self):
        raise Boom("bonus")


class BadIndex:
    def __index__(self):
        raise Boom("capacity")


@pytest.mark.parametrize("args, kw", [((4, 2, BadBool()), {}), ((BadIndex(),), {}),
                                      ((4,), {"k_max": BadIndex()})])
def test_an_init_that_fails_part_way_leaves_an_object_that_refuses_every_call(bm, args, kw):
    b = bm.BatchState.__new__(bm.BatchState)
    with pytest.raises(Boom):
        b.__init__(*args, **kw)
    for name in _public("BatchState")[0]:
        with pytest.raises(RuntimeError, match="not initialised"):
            CALLS[name](b)
    with pytest.raises(RuntimeError, match="may be called only once"):
        b.__init__(4)


def _verify_batch(bm, ni=None):
    """A 3-slot batch with slot 0 in Verify (draft [5, 6]) and slot 2 in Decode."""
    b = bm.BatchState(3, 3)
    b.admit([0, 2], [1, 2, 3, 4], [0, 2, 4], [10, 12])
    b.advance_prefill([0, 2], [4, 9], [10, 12])
    b.enter_verify([0], [5, 6], [0, 2])
    return b


def test_init_from_a_rule_callback_or_another_thread_during_a_step_is_refused(bm):
    b = _verify_batch(bm)
    got = []

    class Rule:
        def accepted_rows(self, draft, rows):
            for call in (lambda: b.__init__(50, 8), lambda: b.pending(),
                         lambda: b.step([1, 2, 3]), lambda: b.finish([2]),
                         lambda: b.admit([1], [1], [0, 1], [0]), lambda: b.states):
                try:
                    call()
                    got.append("ran")
                except RuntimeError as e:
                    got.append(str(e))

            def other():
                try:
                    b.__init__(50, 8)
                    got.append("ran")
                except RuntimeError as e:
                    got.append(str(e))

            t = threading.Thread(target=other)
            t.start()
            t.join()
            return 1

    before_rows = b.pending()
    res = b.step(np.array([5, 7, 9], dtype=np.int64), rule=Rule())
    assert len(got) == 7 and "ran" not in got, got
    assert "may be called only once" in got[0] and "may be called only once" in got[-1]
    assert all("BatchState is being changed" in g for g in got[1:-1])
    assert before_rows[0].tolist() == [0, 2]
    assert res.emitted_by_slot() == {0: [5, 7], 2: [9]} and b.capacity == 3


def test_another_thread_is_refused_every_call_while_a_step_runs(bm):
    """A thread calling every public method while a step is held inside its rule
    callback: each call is refused (RuntimeError), nothing crashes, the step completes."""
    b = _verify_batch(bm)
    got = {}

    class Rule:
        def accepted_rows(self, draft, rows):
            def other():
                for name in _public("BatchState")[0]:
                    try:
                        CALLS[name](b)
                        got[name] = "ran"
                    except RuntimeError as e:
                        got[name] = str(e)
                    except Exception as e:  # noqa: BLE001
                        got[name] = f"other {type(e).__name__}"

            t = threading.Thread(target=other)
            t.start()
            t.join()
            return 2

    res = b.step(np.array([5, 6, 9], dtype=np.int64), rule=Rule())
    assert all("BatchState is being changed" in v for v in got.values()), got
    assert res.emitted_by_slot() == {0: [5, 6], 2: [9]}


def test_pending_is_refused_while_a_writer_holds_the_guard_and_reads_its_own_copy(bm):
    """``pending`` takes the guard (a reader): refused while a writer holds it; its layout
    is computed into buffers of the call (no scratch shared with another reader)."""
    b = bm.BatchState(2)
    b.admit([0], [1], [0, 1], [0])
    slots, inputs, off = b.pending()
    assert slots.tolist() == [0] and inputs.tolist() == [1] and off.tolist() == [0, 1]
    b._hold_guard(True)
    with pytest.raises(RuntimeError, match="BatchState is being changed"):
        b.pending()
    b._hold_guard(False)
    a, bb = b.pending(), b.pending()
    assert a[1].tolist() == [1] and a[0] is not bb[0] and a[2] is not bb[2]


def test_the_twins_multi_field_reads_hold_transitions_off():
    """The twin reads ``slot_fields``' fields one by one, and another thread may run
    between two of them (found by the hostile batch scenario: a prefill advanced between
    the state read and the prompt read, and ``slot_fields`` raised AttributeError). The
    reads form a reader's section: a transition that comes in between is refused and the
    fields read stay those of one state. The interleaving is forced here by running the
    transition inside the read of the prompts. (The compiled ``slot_fields`` takes the
    same section: its reads make Python objects, and a collector's finaliser may run
    between two; its attributes cannot be replaced from Python to force it.)"""
    from specfsm.machine import _batch_py as twin

    b = twin.BatchState(2)
    b.admit([0], [5, 6], [0, 2], [0])
    refused = []

    class Interleaved(list):
        def __getitem__(self, i):
            try:
                b.advance_prefill([0], [7], [1])
            except RuntimeError as exc:
                refused.append(str(exc))
            return list.__getitem__(self, i)

    b._positions = Interleaved(b._positions)
    fields = b.slot_fields(0)
    assert fields[0] == twin.PREFILL and fields[-1] == [5, 6]
    assert refused and "being read" in refused[0]
    assert b.states.tolist()[0] == twin.PREFILL  # the refused transition changed nothing


# --------------------------------------------------------------------------------------
# views
# --------------------------------------------------------------------------------------
def test_a_view_made_writeable_and_written_changes_nothing(bm):
    b = _verify_batch(bm)
    before = snapshot(b)
    for name in ("states", "tokens", "caches", "accepted", "draft_lens", "remaining"):
        v = getattr(b, name)
        v.flags.writeable = True
        v[:] = 100 if name != "states" else 3
    assert snapshot(b) == before
    res = b.step(np.array([5, 6, 9], dtype=np.int64))
    assert res.emitted_by_slot() == {0: [5, 6], 2: [9]}


# --------------------------------------------------------------------------------------
# all or nothing
# --------------------------------------------------------------------------------------
def _build(impl, bm, seed):
    """A deterministic batch of 2-5 slots mixing prefill, decode and verify slots with
    n-gram, suffix or no index; returns ``(batch, indexes, rows)`` with rows a
    plausible greedy answer to its ``pending()``."""
    rng = np.random.default_rng(seed)
    ni, si = impl.module("ngram_index"), impl.module("suffix_index")
    c = int(rng.integers(2, 6))
    b = bm.BatchState(c, int(rng.integers(1, 4)), bool(rng.integers(0, 2)))
    ixs, prompts = [], []
    for _ in range(c):
        p = rng.integers(0, 3, int(rng.integers(1, 6))).tolist()
        kind = int(rng.integers(0, 3))
        ix = None if kind == 0 else ni.NgramIndex(1, 2) if kind == 1 else si.SuffixIndex(1)
        if ix is not None:
            ix.extend(p)
        ixs.append(ix)
        prompts.append(p)
    live = sorted(rng.choice(c, int(rng.integers(1, c + 1)), replace=False).tolist())
    flat = [t for i in live for t in prompts[i]]
    off = np.cumsum([0] + [len(prompts[i]) for i in live])
    b.admit(live, flat, off, live, indexes=[ixs[i] for i in live])
    ixs = [ixs[i] for i in live]
    for _ in range(int(rng.integers(0, 4))):
        n = int(b.pending()[2][-1])
        if n == 0:
            break
        b.step(rng.integers(0, 3, n))
    n = int(b.pending()[2][-1])
    return b, ixs, rng.integers(0, 3, n).astype(np.int64)


def _index_state(ixs):
    return [None if ix is None else (ix.tokens.tolist(), ix.stats) for ix in ixs]


def _result(res):
    return tuple(getattr(res, f).tolist() for f in (
        "slots", "emitted", "emitted_offsets", "accepted", "drafted", "resume_rows",
        "finished", "drafts", "draft_offsets"))


class RaisingRule:
    def accepted_rows(self, draft, rows):
        raise Boom("rule")


class RuleWithoutAcceptedRows:
    @property
    def accepted_rows(self):
        raise Boom("rule attribute")


def _busy_index_step(ix, step):
    """Run ``step()`` while ``ix`` is held by an extend converting its tokens (the
    extend then refuses its tokens, so the index is unchanged); returns what the step
    returned or raised."""
    hold = getattr(ix, "_hold_guard", None)
    if hold is not None:
        hold(True)
        try:
            return step()
        finally:
            hold(False)
    out = []

    class Tokens(Sequence):
        def __len__(self):
            return 1

        def __getitem__(self, q):
            if isinstance(q, slice):
                return [self[x] for x in range(*q.indices(1))]
            if q != 0:
                raise IndexError(q)
            if not out:
                try:
                    out.append(step())
                except Exception as e:  # noqa: BLE001
                    out.append(e)
            return "not a token"        # the extend refuses: the index stays as it was

    with pytest.raises(TypeError):
        ix.extend(Tokens())
    if isinstance(out[0], Exception):
        raise out[0]
    return out[0]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), how=st.sampled_from(["rows", "rule", "rule_attr", "busy"]),
       pick=st.integers(0, 100))
def test_a_refused_step_changes_nothing_and_the_same_step_then_succeeds(impl, bm, seed, how, pick):
    """Refusals injected into a step (rows of the wrong length, a rule that raises, an
    index held by another call): the batch and every index are exactly as before, and
    the same step retried gives what the step gives on an untouched copy."""
    b, ixs, rows = _build(impl, bm, seed)
    ref, ref_ixs, _ = _build(impl, bm, seed)
    before, ix_before = snapshot(b), _index_state(ixs)
    live_ix = [ix for ix in ixs if ix is not None]
    refused = got = None
    try:
        if how == "rows":
            got = b.step(np.concatenate([rows, [1]]))
        elif how == "rule":
            got = b.step(rows, rule=RaisingRule())
        elif how == "rule_attr":
            got = b.step(rows, rule=RuleWithoutAcceptedRows())
        elif live_ix:
            got = _busy_index_step(live_ix[pick % len(live_ix)], lambda: b.step(rows))
        else:
            got = b.step(np.concatenate([rows, [1]]))
    except (Boom, ValueError, RuntimeError) as e:
        refused = e
    if refused is None:
        # the injection did not bite (a rule with no verify slot to settle): the step
        # must then be the untouched copy's
        event(f"{how}: not refused")
        assert how == "rule"
        assert _result(got) == _result(ref.step(rows))
        assert snapshot(b) == snapshot(ref) and _index_state(ixs) == _index_state(ref_ixs)
        return
    event(f"{how}: refused")
    assert snapshot(b) == before, refused
    assert _index_state(ixs) == ix_before, refused
    assert not b.busy
    got = b.step(rows)
    want = ref.step(rows)
    assert _result(got) == _result(want)
    assert snapshot(b) == snapshot(ref)
    assert _index_state(ixs) == _index_state(ref_ixs)


def test_one_index_for_two_slots_is_refused_where_it_is_given(impl, bm):
    """n-gram and suffix slots, the same suffix index listed for two of them: ``admit``
    refuses it (the mistake is made there), changing neither the batch nor an index,
    and the steps that follow run."""
    ni, si = impl.module("ngram_index"), impl.module("suffix_index")
    g, s = ni.NgramIndex(1, 2), si.SuffixIndex(1)
    g.extend([1, 2, 1])
    s.extend([1, 2, 1])
    b = bm.BatchState(3, 2)
    before, ix_before = snapshot(b), _index_state([g, s])
    with pytest.raises(ValueError, match=r"indexes\[2\] is indexes\[1\]"):
        b.admit([0, 1, 2], [1, 2, 1] * 3, [0, 3, 6, 9], [0, 1, 2], indexes=[g, s, s])
    assert snapshot(b) == before and _index_state([g, s]) == ix_before
    b.admit([0, 1, 2], [1, 2, 1] * 3, [0, 3, 6, 9], [0, 1, 2], indexes=[g, s, None])
    assert b.step(np.array([0, 0, 2] * 3, dtype=np.int64)).emitted.tolist() == [2, 2, 2]


def test_a_step_with_a_suffix_index_in_use_changes_no_ngram_index(impl, bm):
    """n-gram and suffix slots in one step, the suffix index held by another call: the
    step refuses before the n-gram index is extended."""
    ni, si = impl.module("ngram_index"), impl.module("suffix_index")
    g, s = ni.NgramIndex(1, 2), si.SuffixIndex(1)
    g.extend([1, 2, 1])
    s.extend([1, 2, 1])
    b = bm.BatchState(2, 2)
    b.admit([0, 1], [1, 2, 1] * 2, [0, 3, 6], [0, 1], indexes=[g, s])
    before, ix_before = snapshot(b), _index_state([g, s])
    rows = np.array([0, 0, 2] * 2, dtype=np.int64)
    with pytest.raises(RuntimeError, match="SuffixIndex"):
        _busy_index_step(s, lambda: b.step(rows))
    assert snapshot(b) == before and _index_state([g, s]) == ix_before
    res = b.step(rows)
    assert res.emitted.tolist() == [2, 2] and len(g) == 4 and len(s) == 4


def test_rule_callbacks_that_reenter_are_refused_and_the_step_completes(bm):
    b = _verify_batch(bm)
    calls = []

    class Rule:
        def accepted_rows(self, draft, rows):
            for f in (b.pending, lambda: b.step(rows), lambda: b.resume([0]),
                      lambda: b.release([1]), lambda: b.state_of(0), lambda: b.draft(0)):
                with pytest.raises(RuntimeError, match="BatchState is being changed"):
                    f()
                calls.append(1)
            return 0

    res = b.step(np.array([7, 6, 9], dtype=np.int64), rule=Rule())
    assert len(calls) == 6
    assert res.emitted_by_slot() == {0: [7], 2: [9]} and res.accepted.tolist() == [0, 0]


def test_an_index_argument_that_reenters_a_transition_is_refused(bm):
    b = bm.BatchState(2)
    seen = []

    class Slots(Sequence):  # token-id-rule input whose conversion runs user code
        def __len__(self):
            return 1

        def __getitem__(self, i):
            if i >= 1:
                raise IndexError(i)
            try:
                b.admit([1], [3], [0, 1], [0])
            except RuntimeError as e:
                seen.append(str(e))
            return 0

    b.admit(Slots(), [1, 2], [0, 2], [5])
    assert seen and "being changed" in seen[0]
    assert b.states.tolist() == [bm.PREFILL, bm.FREE]


# --------------------------------------------------------------------------------------
# placement rows
# --------------------------------------------------------------------------------------
def test_resume_rows_count_within_each_slots_own_rows(bm):
    """A prefill resumes from its last prompt row, a decode from row 0, a verify from its
    settle row; ``offsets[j] + resume_rows[j]`` is the flat row, finished slots too."""
    b = bm.BatchState(5, 3)
    b.admit([0, 1, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [0, 3, 5, 6, 8], [0, 1, 3, 4],
            max_tokens=[100, 100, 100, 1])
    b.advance_prefill([1, 3], [9, 9], [1, 3])
    b.enter_verify([1], [5, 6], [0, 2])
    slots, inputs, off = b.pending()
    assert slots.tolist() == [0, 1, 3, 4]
    # slot 0 prefill (3 rows), slot 1 verify [5, 6] (2 rows), slot 3 decode, slot 4 prefill
    rows = np.array([0, 0, 4, 5, 8, 9, 0, 2], dtype=np.int64)
    res = b.step(rows)
    assert res.resume_rows.tolist() == [2, 1, 0, 1]
    assert (off[:-1] + res.resume_rows).tolist() == [2, 4, 5, 7]
    assert res.finished.tolist() == [4]        # finished: carries its row all the same
    idx = res.resume_index(5)
    assert idx.tolist() == [2, 1, -1, 0, 1]
    with pytest.raises(ValueError, match="capacity"):
        res.resume_index(4)
    assert res.resume_index(8).tolist() == [2, 1, -1, 0, 1, -1, -1, -1]


def test_resume_index_places_every_live_slot_and_resume_rows_in_slot_order_is_refused(impl, bm):
    place_rows = impl.module("place").place_rows
    b = bm.BatchState(4, 2)
    b.admit([0, 2, 3], [1, 2, 3, 4, 5, 6], [0, 2, 3, 6], [0, 2, 3])
    slots, inputs, off = b.pending()
    res = b.step(np.arange(int(off[-1]), dtype=np.int64))
    # per-row states in capacity order: row r of slot s holds 100 * s + r
    src = np.full((4, 3), -1, dtype=np.int64)
    for j, s in enumerate(slots.tolist()):
        n = int(off[j + 1] - off[j])
        src[s, :n] = 100 * s + np.arange(n)
    dst = np.full(4, -7, dtype=np.int64)
    place_rows(src, res.resume_index(4), dst)
    assert dst.tolist() == [1, -7, 200, 302]       # each live slot: its last prompt row
    with pytest.raises(ValueError, match="index"):
        place_rows(src, res.resume_rows, dst)        # slots order over capacity order


def test_when_every_slot_is_evaluated_the_two_orders_coincide(bm):
    b = bm.BatchState(2, 2)
    b.admit([0, 1], [1, 2, 3], [0, 2, 3], [0, 1])
    res = b.step(np.array([0, 4, 5], dtype=np.int64))
    assert res.resume_index(2).tolist() == res.resume_rows.tolist() == [1, 0]


# --------------------------------------------------------------------------------------
# documentation and signatures
# --------------------------------------------------------------------------------------
def _twin_and_compiled():
    from specfsm import _impl

    twin = _impl.kernels("python", "batch")
    if _impl.NO_EXTENSIONS:
        pytest.skip("the compiled core is switched off")
    return twin, _impl.kernels("compiled", "batch")


@pytest.mark.parametrize("cls_name", sorted(CLASSES))
def test_compiled_and_twin_docstrings_match_and_name_every_parameter(cls_name):
    twin, comp = _twin_and_compiled()
    methods, props = CLASSES[cls_name]
    ct, cc = getattr(twin, cls_name), getattr(comp, cls_name)
    doc = inspect.cleandoc(cc.__doc__)
    if doc.startswith(f"{cls_name}("):     # Cython's embedded constructor signature
        doc = doc.split("\n\n", 1)[1]
    assert doc == inspect.cleandoc(ct.__doc__)
    for name, params in methods.items():
        if name in ("__init__", "__len__"):
            continue
        dt, dc = (inspect.getdoc(getattr(x, name)) or "" for x in (ct, cc))
        if dc.startswith(f"{cls_name}.{name}("):     # Cython's embedded signature
            first, dc = dc.split("\n\n", 1)
            assert "REQUIRED" not in first, first
        assert dc == dt, name
        assert len(dt) > 40 and "see the twin" not in dt, name
        for p in params:
            assert re.search(rf"\b{p}\b", dt), (name, p)
    if cls_name == "BatchState":     # StepResult's fields are plain attributes
        for name in props:
            assert inspect.getdoc(getattr(cc, name)) == inspect.getdoc(getattr(ct, name)), name
    init = inspect.cleandoc(ct.__doc__)
    if cls_name == "BatchState":
        for p in ("capacity", "k_max", "bonus"):
            assert f"``{p}``" in init


def test_compiled_signatures_are_the_twins():
    twin, comp = _twin_and_compiled()
    for cls_name, (methods, _) in CLASSES.items():
        for name in methods:
            if name in ("__init__", "__len__"):
                continue
            t = inspect.signature(getattr(getattr(twin, cls_name), name))
            c = inspect.signature(getattr(getattr(comp, cls_name), name))
            assert [(p.name, p.kind, p.default) for p in c.parameters.values()] == \
                [(p.name, p.kind, p.default) for p in t.parameters.values()], name
    assert "slots, positions, offsets, caches" in str(inspect.signature(comp.BatchState.admit))


def test_bonus_is_positional_or_keyword(bm):
    assert bm.BatchState(2, 3, True).bonus is True
    assert bm.BatchState(2, 3, bonus=True).bonus is True
    assert bm.BatchState(2).bonus is False


@pytest.mark.parametrize("name", ["admit", "advance_prefill", "advance_decode", "enter_verify",
                                  "accept", "accept_rows", "resume", "rollback", "finish",
                                  "release", "step"])
def test_a_missing_required_argument_is_named(bm, name):
    methods, _ = CLASSES["BatchState"]
    required = [p for p in methods[name]
                if p not in ("max_tokens", "eos", "indexes", "probs", "rule", "draft_probs")]
    b = bm.BatchState(2)
    before = snapshot(b)
    fn = getattr(b, name)
    args = [[0]] * (len(required) - 1)
    with pytest.raises(TypeError, match=repr(required[-1])):
        fn(*args)
    if len(required) > 1:
        with pytest.raises(TypeError, match=repr(required[0])):
            fn(**{p: [0] for p in required[1:]})
    assert snapshot(b) == before


def test_empty_prompts_and_drafts_are_a_batching_rule_said_in_the_docstrings(bm):
    for name in ("admit", "enter_verify"):
        doc = " ".join(inspect.getdoc(getattr(bm.BatchState, name)).split())
        assert "as a batching rule" in doc and "ServingState`` accepts" in doc, name
    b = bm.BatchState(2)
    with pytest.raises(ValueError, match="empty"):
        b.admit([0], [], [0, 0], [0])
    b.admit([0], [1], [0, 1], [0])
    b.advance_prefill([0], [1], [0])
    with pytest.raises(ValueError, match="empty"):
        b.enter_verify([0], [], [0, 0])


# --------------------------------------------------------------------------------------
# what the step reads after Python code ran, rows it refuses, admit's index owners
# --------------------------------------------------------------------------------------
def _both_batches():
    """The twin's and (unless switched off) the compiled core's public ``BatchState``
    classes, as objects with a ``BatchState`` attribute, for differential tests."""
    from types import SimpleNamespace

    from specfsm import _impl
    from specfsm.machine import batch

    kinds = ["python"] if _impl.NO_EXTENSIONS else ["python", "compiled"]
    return [SimpleNamespace(BatchState=over(_impl.kernels(k, "batch"))) for k in kinds]


@pytest.mark.parametrize("accepted", [0, 1, 2])
def test_a_rule_that_rewrites_the_callers_rows_does_not_change_what_the_step_emits(accepted):
    """The step emits from the rows as they were when it was called: a rule's
    ``accepted_rows`` that writes into the caller's array changes nothing (both
    implementations read their own copy)."""
    got = []
    for bm in _both_batches():
        b = _verify_batch(bm)
        rows = np.array([5, 7, 9], dtype=np.int64)

        class Rule:
            def accepted_rows(self, draft, r):
                rows[:] = [50, 60, 90]
                return accepted

        res = b.step(rows, rule=Rule())
        got.append((res.emitted_by_slot(), res.accepted.tolist(), b.tokens.tolist()))
    assert got[0][0] == {0: [5, 6][:accepted] + ([[5, 7, 9][accepted]] if accepted < 2 else []), 2: [9]}
    assert all(g == got[0] for g in got)


def _negative_cases():
    """(description, setup, rows, refused flat row or None): a 3-slot batch."""
    def chain(bm, bonus=False):
        b = bm.BatchState(3, 3, bonus)
        b.admit([0, 2], [1, 2, 3, 4], [0, 2, 4], [10, 12])
        b.advance_prefill([0, 2], [4, 9], [10, 12])
        b.enter_verify([0], [5, 6], [0, 2])
        return b

    def budget(bm):                       # slot 0 may emit 2 more tokens: the bonus is cut
        b = bm.BatchState(3, 3, True)
        b.admit([0, 2], [1, 2, 3, 4], [0, 2, 4], [10, 12], max_tokens=[2, 9])
        b.advance_prefill([0, 2], [4, 9], [10, 12])
        b.enter_verify([0], [5, 6], [0, 2])
        return b

    def tree(bm):
        b = bm.BatchState(3, 4)
        b.admit([0], [1, 2], [0, 2], [10])
        b.advance_prefill([0], [4], [10])
        b.enter_verify_tree([0], [5, 6, 7], [-1, -1, 0], [0, 3])   # 5 -> 7, and 6
        return b

    def prefill(bm):
        b = bm.BatchState(2, 3)
        b.admit([0, 1], [1, 2, 3], [0, 2, 3], [0, 1])
        return b

    return [
        ("mismatch row", chain, [5, -3, 9], 1),
        ("first row", chain, [-1, 6, 9], 0),
        ("filler after the mismatch", chain, [7, -1, 9], None),
        ("decode row", chain, [5, 6, -2], 2),
        ("all accepted, no bonus", chain, [5, 6, 8], None),
        ("bonus row", lambda bm: chain(bm, True), [5, 6, -4, 9], 2),
        ("bonus row cut by the budget", lambda bm: budget(bm), [5, 6, -4, 9], None),
        ("tree root row", tree, [-1, 0, 0, 0], 0),
        ("tree path row", tree, [5, -6, 0, 0], 1),
        ("tree rows off the path", tree, [5, 7, -1, 0], None),
        ("tree settle row", tree, [5, 7, 0, -1], 3),
        ("prefill: only the last row read", prefill, [-9, 4, 5], None),
        ("prefill last row", prefill, [1, -4, 5], 1),
    ]


@pytest.mark.parametrize("case", _negative_cases(), ids=lambda c: c[0])
def test_step_refuses_to_emit_a_negative_token_and_changes_nothing(case):
    """A token the step would emit must be >= 0 (refused naming its row, nothing
    changed); rows it does not emit from (past a mismatch, off a tree's path, cut by the
    budget) may hold anything: -1 as filler, a replay's off-trace answer."""
    name, setup, rows, bad = case
    outcomes = []
    for bm in _both_batches():
        b = setup(bm)
        before = snapshot(b)
        r = np.array(rows, dtype=np.int64)
        if bad is None:
            res = b.step(r)
            assert (res.emitted >= 0).all()
            outcomes.append(res.emitted.tolist())
        else:
            with pytest.raises(ValueError, match=rf"row_tokens\[{bad}\] is {rows[bad]}: step would emit it") as e:
                b.step(r)
            assert snapshot(b) == before
            outcomes.append(str(e.value))
    assert all(o == outcomes[0] for o in outcomes)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), bonus=st.booleans())
def test_negative_rows_compiled_and_twin_refuse_or_emit_alike(seed, bonus):
    outcomes = []
    for bm in _both_batches():
        r2 = np.random.default_rng(seed)
        b = bm.BatchState(6, 4, bonus)
        b.admit(list(range(6)), r2.integers(0, 3, size=12).tolist(), list(range(0, 13, 2)), list(range(6)))
        b.advance_prefill([0, 1, 2, 3], r2.integers(0, 3, size=4).tolist(), [0, 1, 2, 3])
        b.enter_verify([0, 1], [1, 2, 0, 1, 2], [0, 2, 5])
        slots, inputs, off = b.pending()
        rows = r2.integers(-2, 3, size=int(off[-1])).astype(np.int64)
        try:
            res = b.step(rows)
            outcomes.append(("ok", res.emitted.tolist(), res.resume_rows.tolist()))
        except ValueError as e:
            outcomes.append(("err", str(e)))
    assert all(o == outcomes[0] for o in outcomes)


def test_resume_index_refuses_a_capacity_beyond_a_batchs_largest_before_allocating(bm):
    b = bm.BatchState(2, 2)
    b.admit([0, 1], [1, 2, 3], [0, 2, 3], [0, 1])
    res = b.step(np.array([0, 4, 5], dtype=np.int64))
    for c in (2**24 + 1, 2**40, 2**70):
        with pytest.raises(ValueError, match="capacity must lie in"):
            res.resume_index(c)
    assert res.resume_index(2**4).shape == (16,)


def test_admit_refuses_an_index_held_by_a_live_slot_or_listed_twice_and_changes_nothing(impl, bm):
    ni = impl.module("ngram_index")
    g, h = ni.NgramIndex(1, 2), ni.NgramIndex(1, 2)
    b = bm.BatchState(4, 2)
    b.admit([0], [1, 2], [0, 2], [0], indexes=[g])
    before = snapshot(b)
    with pytest.raises(ValueError, match=r"indexes\[0\] is held by live slot 0"):
        b.admit([1], [1, 2], [0, 2], [1], indexes=[g])
    with pytest.raises(ValueError, match=r"indexes\[1\] is indexes\[0\]"):
        b.admit([1, 2], [1, 2, 3], [0, 2, 3], [1, 2], indexes=[h, h])
    assert snapshot(b) == before
    b.finish([0])                         # a finished slot no longer drafts: its index is free
    b.admit([1], [1, 2], [0, 2], [1], indexes=[g])
    b.admit([2], [1, 2], [0, 2], [2], indexes=[h])


_UNBOUND = [("BatchState", "step", ([1],)), ("BatchState", "pending", ()), ("BatchState", "admit", ([0], [1], [0, 1], [0])),
            ("BatchState", "draft", (0,)), ("BatchState", "release", ([0],)), ("BatchState", "_hold_guard", (True,)),
            ("StepResult", "resume_index", (3,)), ("StepResult", "emitted_by_slot", ())]


@pytest.mark.parametrize("cls,name,args", _UNBOUND, ids=lambda v: v if isinstance(v, str) else "")
def test_a_method_called_unbound_on_another_object_is_refused(cls, name, args):
    """``BatchState.step(obj, ...)`` hands the method any object as ``self``; each
    implementation refuses it with TypeError (the compiled one read the object as a
    batch before: a crash), in a child process so that a crash fails this test only."""
    code = (
        "from specfsm import _impl\n"
        "for kind in ('python',) + (() if _impl.NO_EXTENSIONS else ('compiled',)):\n"
        f"    cls = getattr(_impl.kernels(kind, 'batch'), {cls!r})\n"
        "    for obj in (object(), 7, [1, 2]):\n"
        "        try:\n"
        f"            getattr(cls, {name!r})(obj, *{args!r})\n"
        "        except TypeError as e:\n"
        f"            assert 'needs a {cls}' in str(e), e\n"
        "        else:\n"
        "            raise AssertionError('accepted')\n"
        "print('refused')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(), cwd=TESTS, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stdout + proc.stderr
