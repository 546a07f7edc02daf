"""The batched state machine (``BatchState``) against B ``ServingState`` objects, and the
snapshot that costs nothing by default."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from impls import over
from specfsm.errors import IllegalTransition
from specfsm.machine.state import Decode, Prefill, ServingState, Verify


# --------------------------------------------------------------------------------------
# BatchState: walkthrough and refusals
# --------------------------------------------------------------------------------------
def ragged(seqs):
    off = np.zeros(len(seqs) + 1, dtype=np.int64)
    off[1:] = np.cumsum([len(s) for s in seqs]) if seqs else []
    flat = np.array([t for s in seqs for t in s], dtype=np.int64)
    return flat, off


def test_walkthrough_matches_serving_state(bm):
    b = bm.BatchState(3, 4)
    pos, off = ragged([[1, 2, 3], [4], [5, 6]])
    b.admit([0, 1, 2], pos, off, [10, 11, 12])
    assert b.state_of(0) == Prefill([1, 2, 3], 10)
    b.advance_prefill([0, 1, 2], [7, 8, 9], [20, 21, 22])
    assert [b.state_of(i) for i in range(3)] == [Decode(7, 20), Decode(8, 21), Decode(9, 22)]
    d, doff = ragged([[1, 2], [3, 4, 5]])
    b.enter_verify([2, 0], d, doff)
    assert b.state_of(2) == Verify([1, 2], 22, 22)
    assert b.state_of(0) == Verify([3, 4, 5], 20, 20)
    rows, roff = ragged([[1, 2], [3, 9, 5]])
    caches, coff = ragged([[30, 31], [40, 41, 42]])
    b.accept([2, 0], rows, roff, caches, coff)
    s = ServingState.start([5, 6], 12).advance_prefill(9, 22).enter_verify([1, 2])
    assert b.state_of(2) == s.accept([1, 2], [30, 31])
    s = ServingState.start([1, 2, 3], 10).advance_prefill(7, 20).enter_verify([3, 4, 5])
    assert b.state_of(0) == s.accept([3, 9, 5], [40, 41, 42])
    b.resume([2])
    b.rollback([0])
    assert b.state_of(2) == Decode(2, 31) and b.state_of(0) == Decode(9, 41)
    b.finish([0, 1, 2])
    b.release([1])
    assert b.state_of(1) is None
    assert b.states.tolist() == [bm.DONE, bm.FREE, bm.DONE]


def test_an_illegal_slot_refuses_the_whole_call_and_names_it(bm):
    b = bm.BatchState(4, 2)
    pos, off = ragged([[1], [2], [3]])
    b.admit([0, 1, 2], pos, off, [0, 0, 0])
    b.advance_prefill([0, 2], [5, 6], [1, 1])
    before = [b.state_of(i) for i in range(4)]
    with pytest.raises(IllegalTransition) as e:
        b.advance_decode([0, 1, 2, 3], [1, 1, 1, 1], [2, 2, 2, 2])
    assert e.value.attempted == "advance_decode"
    assert e.value.slots == [1, 3] and e.value.states == ["prefill", "free"]
    assert "slot 1 is in prefill" in e.value.reason and "slot 3 is in free" in e.value.reason
    assert str(e.value) == "serving fsm: advance_decode is not legal: slot 1 is in prefill; slot 3 is in free"
    assert [b.state_of(i) for i in range(4)] == before


def test_settle_refusals_name_the_slot_and_leave_the_batch(bm):
    b = bm.BatchState(2, 3)
    pos, off = ragged([[1], [2]])
    b.admit([0, 1], pos, off, [0, 0])
    b.advance_prefill([0, 1], [5, 6], [1, 1])
    d, doff = ragged([[1, 2], [3]])
    b.enter_verify([0, 1], d, doff)
    before = [b.state_of(i) for i in range(2)]
    rows, roff = ragged([[1, 2], [3]])
    caches, coff = ragged([[1, 2], [1, 2]])  # slot 1 has one draft row, two caches
    with pytest.raises(IllegalTransition) as e:
        b.accept([0, 1], rows, roff, caches, coff)
    assert e.value.slots == [1] and "row_caches" in e.value.reason
    assert [b.state_of(i) for i in range(2)] == before
    with pytest.raises(IllegalTransition) as e:
        b.accept_rows([0, 1], [3, 1], rows, roff, *ragged([[1, 2], [1]]))
    assert e.value.slots == [0] and e.value.attempted == "accept_rows"


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda b: b.advance_decode([0, 0], [1, 1], [1, 1]), ValueError, "distinct"),
        (lambda b: b.advance_decode([5], [1], [1]), IndexError, "slots"),
        (lambda b: b.advance_decode([-1], [1], [1]), IndexError, "slots"),
        (lambda b: b.advance_decode([0], [1, 2], [1]), ValueError, "next_tokens"),
        (lambda b: b.advance_decode([0], [1.5], [1]), TypeError, "next_tokens"),
        (lambda b: b.advance_decode([True], [1], [1]), TypeError, "slots"),
        (lambda b: b.advance_decode([0], [2**64], [1]), OverflowError, "next_tokens"),
        (lambda b: b.enter_verify([0], [], [0, 0]), ValueError, "empty"),
        (lambda b: b.enter_verify([0], [1, 2, 3], [0, 3]), ValueError, "k_max"),
        (lambda b: b.enter_verify([0], [1, 2], [0, 3]), ValueError, "offsets"),
        (lambda b: b.enter_verify([0, 1], [1, 2], [0, 2, 1]), ValueError, "offsets"),
        (lambda b: b.enter_verify([0], [[1, 2]], [0, 2]), ValueError, "tokens"),
        (lambda b: b.accept_rows([0], [-1], [1], [0, 1], [1], [0, 1]), ValueError, "accepted"),
        (lambda b: b.admit([0], "ab", [0, 2], [0]), TypeError, "positions"),
    ],
)
def test_bad_arguments_raise_clean_errors_and_change_nothing(bm, call, exc, match):
    b = bm.BatchState(2, 2)
    b.admit([0, 1], [1, 2], [0, 1, 2], [0, 0])
    b.advance_prefill([0, 1], [3, 4], [1, 1])
    before = [b.state_of(i) for i in range(2)]
    with pytest.raises(exc, match=match):
        call(b)
    assert [b.state_of(i) for i in range(2)] == before


def test_constructor_refusals(bm):
    for c, k in [(0, 4), (4, 0), (-1, 4)]:
        with pytest.raises(ValueError):
            bm.BatchState(c, k)
    with pytest.raises(TypeError):
        bm.BatchState(2.0, 4)


def test_views_are_copies(bm):
    """The arrays the batch exposes are fresh copies: writing to one (even after making
    it writeable) changes nothing in the batch."""
    b = bm.BatchState(2, 2)
    names = ("states", "tokens", "caches", "accepted", "draft_lens", "remaining")
    for name in names:
        v = getattr(b, name)
        v.flags.writeable = True
        v[0] = 1
        assert getattr(b, name)[0] == 0, name
        assert getattr(b, name) is not getattr(b, name)


def test_control_arrays_are_copied_before_use(bm):
    """The offsets and slot arrays given are not read again after validation: the call
    owns copies (mutating the caller's arrays afterwards changes nothing)."""
    b = bm.BatchState(2, 3)
    slots = np.array([0, 1])
    pos, off = ragged([[1, 2], [3]])
    b.admit(slots, pos, off, [0, 0])
    pos[:] = 99
    slots[:] = 0
    assert b.state_of(0) == Prefill([1, 2], 0) and b.state_of(1) == Prefill([3], 0)


# --------------------------------------------------------------------------------------
# property: random interleavings, legal and illegal, against B ServingState objects
# --------------------------------------------------------------------------------------
CAP, KMAX, VOCAB = 4, 3, 3
OPS = ("admit", "advance_prefill", "advance_decode", "enter_verify", "accept", "accept_rows",
       "resume", "rollback", "finish", "release")


def _name(s):
    return "free" if s is None else type(s).__name__.lower()


def _model_step(model, op, slots, args):
    """Apply ``op`` per slot to the ServingState list; returns (new states, failing slots)."""
    new, bad = [], []
    for j, i in enumerate(slots):
        s = model[i]
        try:
            if op == "admit":
                if s is not None:
                    raise IllegalTransition("admit")
                r = ServingState.start(args["seqs"][j], args["caches"][j])
            elif op == "release":
                if _name(s) != "done":
                    raise IllegalTransition("release")
                r = None
            elif s is None:
                raise IllegalTransition(op)
            elif op in ("advance_prefill", "advance_decode"):
                r = getattr(s, op)(args["toks"][j], args["caches"][j])
            elif op == "enter_verify":
                r = s.enter_verify(args["seqs"][j])
            elif op == "accept":
                r = s.accept(args["rows"][j], args["rcaches"][j])
            elif op == "accept_rows":
                r = s.accept_rows(args["acc"][j], args["rows"][j], args["rcaches"][j])
            elif op == "finish":
                r = s.finish()
            else:
                r = getattr(s, op)()
        except IllegalTransition:
            bad.append(i)
            continue
        new.append((i, r))
    return new, bad


def _batch_step(b, op, slots, args):
    if op == "admit":
        getattr(b, op)(slots, *ragged(args["seqs"]), args["caches"])
    elif op in ("advance_prefill", "advance_decode"):
        getattr(b, op)(slots, args["toks"], args["caches"])
    elif op == "enter_verify":
        b.enter_verify(slots, *ragged(args["seqs"]))
    elif op == "accept":
        b.accept(slots, *ragged(args["rows"]), *ragged(args["rcaches"]))
    elif op == "accept_rows":
        b.accept_rows(slots, args["acc"], *ragged(args["rows"]), *ragged(args["rcaches"]))
    else:
        getattr(b, op)(slots)


tok = st.integers(0, VOCAB - 1)

_LEGAL_FROM = {
    "admit": ("free",), "advance_prefill": ("prefill",), "advance_decode": ("decode",),
    "enter_verify": ("decode",), "accept": ("verify",), "accept_rows": ("verify",),
    "resume": ("accept",), "rollback": ("rollback",), "release": ("done",),
    "finish": ("prefill", "decode", "verify", "accept", "rollback", "done"),
}


def _legal(state, op):
    return _name(state) in _LEGAL_FROM[op]


@st.composite
def step_args(draw, model):
    legal_for = {op: [i for i in range(CAP) if _legal(model[i], op)] for op in OPS}
    possible = [op for op in OPS if legal_for[op]]
    # mostly a legal call (so every transition gets applied), sometimes any call
    if possible and draw(st.integers(0, 3)):
        op = draw(st.sampled_from(possible))
        slots = draw(st.lists(st.sampled_from(legal_for[op]), min_size=1, unique=True))
    else:
        op = draw(st.sampled_from(OPS))
        slots = draw(st.lists(st.integers(0, CAP - 1), min_size=1, max_size=CAP, unique=True))
    n = len(slots)
    args = {
        "toks": draw(st.lists(tok, min_size=n, max_size=n)),
        "caches": draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)),
        "seqs": draw(st.lists(st.lists(tok, min_size=1, max_size=KMAX), min_size=n, max_size=n)),
    }
    rows, rcaches, acc = [], [], []
    for i in slots:
        s = model[i]
        k = len(s.draft) if isinstance(s, Verify) else draw(st.integers(1, KMAX))
        # mostly well-formed rows, sometimes short or with the wrong number of caches
        rows.append(draw(st.lists(tok, min_size=max(0, k - draw(st.integers(0, 1))), max_size=k + 1)))
        kc = k if draw(st.integers(0, 9)) else draw(st.integers(0, KMAX + 1))
        rcaches.append(draw(st.lists(st.integers(0, 50), min_size=kc, max_size=kc)))
        acc.append(draw(st.integers(0, k + (draw(st.integers(0, 5)) == 0))))
    args.update(rows=rows, rcaches=rcaches, acc=acc)
    return op, slots, args


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_batch_matches_serving_states_on_random_interleavings(bm, data):
    b = bm.BatchState(CAP, KMAX)
    model = [None] * CAP
    for _ in range(data.draw(st.integers(5, 40))):
        op, slots, args = data.draw(step_args(model))
        new, bad = _model_step(model, op, slots, args)
        event(f"{op} {'refused' if bad else 'applied'}")
        if bad:
            with pytest.raises(IllegalTransition) as e:
                _batch_step(b, op, slots, args)
            assert e.value.attempted == op
            assert e.value.slots == bad
            assert e.value.states == [_name(model[i]) for i in bad]
        else:
            _batch_step(b, op, slots, args)
            for i, r in new:
                model[i] = r
        assert [b.state_of(i) for i in range(CAP)] == model


def test_compiled_batch_matches_the_twin(impl):
    if impl.name != "compiled":
        pytest.skip("compares the compiled module with the twin; nothing to compare on the twin run")
    from specfsm.machine import _batch_py as twin

    comp = impl.module("batch")
    assert [n for n in twin.__all__] == [n for n in comp.__all__]
    assert twin.STATE_NAMES == comp.STATE_NAMES
    for name in ("FREE", "PREFILL", "DECODE", "VERIFY", "ACCEPT", "ROLLBACK", "DONE"):
        assert getattr(twin, name) == getattr(comp, name)


def test_public_module_uses_the_active_implementation():
    import specfsm.machine.batch as pub
    from specfsm import _impl

    assert pub.BatchState.__bases__ == (_impl.load("batch").BatchState,)
    assert pub.BatchState.__module__ == "specfsm.machine.batch" and pub.BatchState.__name__ == "BatchState"
    assert over(_impl.load("batch")) is pub.BatchState
    b = pub.BatchState(2)
    b.admit([1], [7, 8], [0, 2], [3])
    assert b.slots_in(pub.PREFILL).tolist() == [1]


# --------------------------------------------------------------------------------------
# StepResult.rolled_back: the verifies that settled through Rollback
# --------------------------------------------------------------------------------------
def _rows_for(b, per_slot):
    """The flat ``row_tokens`` for ``pending()``'s layout from ``{slot: rows}``."""
    slots, _, off = b.pending()
    out = []
    for j, i in enumerate(slots.tolist()):
        rows = per_slot[i]
        assert len(rows) == int(off[j + 1] - off[j]), i
        out += rows
    return np.array(out, dtype=np.int64)


def _oracle_rolled_back(draft, rows, rule):
    """Whether the per-request machine settles this verify through Rollback."""
    v = ServingState.start([0], 0).advance_prefill(0, 0).enter_verify(draft)
    caches = list(range(len(draft)))
    if rule is None:
        settled = v.accept(rows[: len(draft)], caches)
    else:
        settled = v.accept_rows(rule.accepted_rows(draft, rows[: len(draft)]), rows, caches)
    return type(settled).__name__ == "Rollback"


@pytest.mark.parametrize("bonus", [False, True])
@pytest.mark.parametrize("minrun", [False, True])
def test_rolled_back_says_which_verifies_settled_through_rollback(bm, bonus, minrun):
    from specfsm.accept.rules import MinRun

    rule = MinRun(2) if minrun else None
    b = bm.BatchState(8, 4, bonus)
    # slot 4 may emit 3 tokens in all, slot 5 stops after token 4; the others never cut
    b.admit(list(range(7)), list(range(10, 17)), list(range(8)), list(range(7)),
            max_tokens=[50, 50, 50, 50, 3, 50, 50], eos=[99, 99, 99, 99, 99, 4, 99])
    b.step(np.array([50] * 7, dtype=np.int64))          # prefill -> Decode, one token each
    drafts = {0: [1, 2, 3], 1: [1, 2, 3], 2: [5], 4: [1, 2, 3], 5: [4, 4], 6: [8]}
    flat = [t for i in sorted(drafts) for t in drafts[i]]
    b.enter_verify(sorted(drafts), flat, np.cumsum([0] + [len(drafts[i]) for i in sorted(drafts)]))
    b.admit([7], [1, 2], [0, 2], [7])                    # slot 7 prefills in this step
    extra = [60] if bonus else []
    rows = {0: [1, 2, 3] + extra,      # all accepted (Accept; with bonus K + 1 tokens)
            1: [1, 9, 3] + extra,      # rejected at row 1
            2: [6] + extra,            # rejected at row 0
            3: [70],                   # a decode
            4: [1, 2, 9] + extra,      # rejected at row 2; the budget cuts the target's token
            5: [4, 7] + extra,         # rejected at row 1; eos cuts after the first token
            6: [8] + extra,            # all accepted, but shorter than MinRun(2)'s minimum
            7: [0, 80]}                # a prefill
    res = b.step(_rows_for(b, rows), rule=rule)
    assert res.slots.tolist() == list(range(8))
    assert res.rolled_back.dtype == np.bool_ and res.rolled_back.shape == (8,)
    want = [False, True, True, False, True, True, minrun, False]
    assert res.rolled_back.tolist() == want
    oracle = [i in drafts and _oracle_rolled_back(drafts[i], rows[i], rule) for i in range(8)]
    assert oracle == want
    # the cuts change what slots 4 and 5 emit and finish them, not how they settled
    em = res.emitted_by_slot()
    assert em[4] == [1, 2] and em[5] == [4]
    assert sorted(res.finished.tolist()) == [4, 5]
    assert em[0] == [1, 2, 3] + extra
    # a verify settles through Accept exactly when all its draft tokens are accepted
    assert res.rolled_back.tolist() == (res.accepted < res.drafted).tolist()
    # a step with no verify (no indexes: nothing drafted again): all False
    res2 = b.step(np.zeros(int(b.pending()[2][-1]), dtype=np.int64))
    assert res2.slots.size and not res2.drafted.any() and not res2.rolled_back.any()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), bonus=st.booleans(), minrun=st.integers(0, 3))
def test_rolled_back_is_the_per_request_rollback(bm, data, bonus, minrun):
    from specfsm.accept.rules import MinRun

    rule = MinRun(minrun) if minrun else None
    b = bm.BatchState(CAP, KMAX, bonus)
    b.admit(list(range(CAP)), [0] * CAP, list(range(CAP + 1)), list(range(CAP)),
            max_tokens=data.draw(st.lists(st.integers(2, 6), min_size=CAP, max_size=CAP)),
            eos=data.draw(st.lists(tok, min_size=CAP, max_size=CAP)) if data.draw(st.booleans()) else None)
    live = b.step(np.full(CAP, VOCAB, dtype=np.int64)).finished.size == 0   # VOCAB: never an eos
    assert live
    verifying = data.draw(st.lists(st.integers(0, CAP - 1), unique=True))
    drafts = {i: data.draw(st.lists(tok, min_size=1, max_size=KMAX)) for i in sorted(verifying)}
    if drafts:
        flat = [t for i in sorted(drafts) for t in drafts[i]]
        b.enter_verify(sorted(drafts), flat, np.cumsum([0] + [len(d) for d in drafts.values()]))
    rows = {i: data.draw(st.lists(tok, min_size=len(drafts[i]) + bonus, max_size=len(drafts[i]) + bonus))
            if i in drafts else [data.draw(tok)] for i in range(CAP)}
    res = b.step(_rows_for(b, rows), rule=rule)
    want = [i in drafts and _oracle_rolled_back(drafts[i], rows[i], rule) for i in res.slots.tolist()]
    assert res.rolled_back.tolist() == want
    assert res.rolled_back.tolist() == (res.accepted < res.drafted).tolist()
    event(f"rolled back {sum(want)} of {len(drafts)} verifies")


# --------------------------------------------------------------------------------------
# enter_verify: every form of its arguments, the same result or the same refusal
# --------------------------------------------------------------------------------------
def _forms(values):
    """``values`` as a list, a tuple, int64 and int32 arrays and a strided int64 array
    (the last takes the general path on the compiled core), where they can be."""
    out = [list(values), tuple(values)]
    if not all(type(v) is int for v in values):
        return out      # an array would read a bool as an int: a different argument
    try:
        out.append(np.array(values, dtype=np.int64))
        out.append(np.array(values, dtype=np.int32))
        out.append(np.repeat(np.array(values, dtype=np.int64), 2)[::2])
    except (OverflowError, TypeError, ValueError):
        pass
    return out


ENTER_VERIFY_CASES = [
    ([0, 2], [1, 2, 3], [0, 1, 3]),            # applied
    ([2], [1, 2, 3], [0, 3]),                  # applied, k_max tokens
    ([0, 0], [1, 2], [0, 1, 2]),               # slots twice
    ([4], [1], [0, 1]),                        # a slot outside the batch
    ([-1], [1], [0, 1]),
    ([1], [1], [0, 1]),                        # slot 1 is in Verify already
    ([3], [1], [0, 1]),                        # slot 3 is FREE
    ([0, 2], [1, 2], [0, 0, 2]),               # an empty draft
    ([0], [1, 2, 3, 4], [0, 4]),               # a draft over k_max
    ([0], [1, 2], [1, 2]),                     # offsets not from 0
    ([0, 2], [1, 2], [0, 2, 1]),               # offsets decreasing
    ([0], [1, 2], [0, 1]),                     # offsets not ending at len(tokens)
    ([0, 2], [1, 2], [0, 2]),                  # too few offsets
    ([0], [1, 2**63], [0, 2]),                 # a token beyond int64
    ([0], [1, -(2**63)], [0, 2]),
    ([0], [True], [0, 1]),                     # a bool among the tokens
    ([0], [1, 2], [0, 2**64]),
]


@pytest.mark.parametrize("case", range(len(ENTER_VERIFY_CASES)))
def test_enter_verify_takes_every_argument_form_alike(bm, case):
    slots, tokens, offsets = ENTER_VERIFY_CASES[case]

    def fresh():
        b = bm.BatchState(4, 3)
        b.admit([0, 1, 2], [5, 6, 7], [0, 1, 2, 3], [10, 11, 12])
        b.advance_prefill([0, 1, 2], [1, 1, 1], [20, 21, 22])
        b.enter_verify([1], [4], [0, 1])
        return b

    def outcome(s, t, o):
        b = fresh()
        before = [b.slot_fields(i) for i in range(4)]
        try:
            b.enter_verify(s, t, o)
        except Exception as exc:  # the same refusal for every form is the property
            assert [b.slot_fields(i) for i in range(4)] == before
            return ("err", type(exc).__name__, str(exc))
        return ("ok", [b.slot_fields(i) for i in range(4)])

    want = outcome(slots, tokens, offsets)
    for s in _forms(slots):
        for t in _forms(tokens):
            for o in _forms(offsets):
                assert outcome(s, t, o) == want, (type(s), type(t), type(o))
    entries = [np.int64(v) if type(v) is int and -(2**63) <= v < 2**63 else v for v in tokens]
    assert outcome(slots, entries, offsets) == want       # numpy integers: the general path


class _Huge:
    """A rule whose count is past int64 (or past the draft): both implementations refuse
    it as beyond the draft, before the count becomes a C integer."""

    def __init__(self, n):
        self.n = n

    def accepted_rows(self, draft, choices):
        return self.n


@pytest.mark.parametrize("n", [5, 2**63, 2**64 + 3])
def test_a_rules_count_past_the_draft_or_int64_is_refused_as_beyond_the_draft(bm, n):
    b = bm.BatchState(2, 4)
    b.admit([0], [1, 2, 3], [0, 3], [0])
    b.step([9, 9, 9])
    b.enter_verify([0], [4, 5], [0, 2])
    before = (b.states.tolist(), b.tokens.tolist(), b.draft_lens.tolist())
    with pytest.raises(IllegalTransition, match=f"accepted={n} is beyond the 2-token draft"):
        b.step([4, 7], rule=_Huge(n))
    assert (b.states.tolist(), b.tokens.tolist(), b.draft_lens.tolist()) == before
