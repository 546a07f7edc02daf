"""The argument checks' contracts: the one token-id converter, the one (tokens, offsets)
contract, the one stats checker and the rule kinds, tested directly (both
implementations share these modules) and through the public entry points of both
implementations (the n-gram and suffix indexes' batch calls, ``BatchState``, the
acceptance kernels and ``specfsm.accept.rules``)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfsm import _checks
from specfsm.accept import _checks as _checks_accept
from specfsm.drafting import _checks as _checks_drafting
from specfsm.machine import _checks as _checks_machine
from specfsm.accept import rules as accept_rule

# -------------------------------------------------------------------------------------
# the token-id converter
# -------------------------------------------------------------------------------------


def test_token_ids_keeps_native_arrays_and_widens_the_rest():
    for dt in (np.int32, np.int64):
        a = np.arange(5, dtype=dt)
        assert _checks.token_ids(a, "t") is a
        owned = _checks.token_ids(a, "t", own=True)
        assert owned is not a and owned.dtype == dt and not np.shares_memory(owned, a)
    for dt in (np.int8, np.uint16, np.uint32, np.int16, np.uint64):
        out = _checks.token_ids(np.arange(4, dtype=dt), "t")
        assert out.dtype == np.int64 and out.tolist() == [0, 1, 2, 3]
    swapped = np.arange(3, dtype=">i4")
    assert _checks.token_ids(swapped, "t").dtype == np.int32
    strided = np.arange(10)[::2]
    out = _checks.token_ids(strided, "t")
    assert out.flags.c_contiguous and out.tolist() == [0, 2, 4, 6, 8]
    assert _checks.token_ids([], "t").dtype == np.int64
    assert _checks.token_ids((), "t").shape == (0,)
    assert _checks.token_ids([1, np.int32(2), np.uint8(3)], "t").tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "value, exc, message",
    [
        ([1, True], TypeError, r"t\[1\] must be an integer token id, got bool True"),
        ([1.0], TypeError, r"t\[0\] must be an integer token id, got float 1.0"),
        ([1, "a"], TypeError, r"t\[1\] must be an integer token id, got str"),
        ([1, None], TypeError, r"t\[1\] must be an integer token id, got NoneType"),
        ([2**63], OverflowError, r"t\[0\]=9223372036854775808 is beyond int64"),
        ([0, -(2**63) - 1], OverflowError, r"t\[1\]=-9223372036854775809 is beyond int64"),
        ([[1, 2]], ValueError, r"t must be 1-D, got a list at t\[0\]"),
        (np.zeros((2, 2), dtype=np.int64), ValueError, "t must be 1-D"),
        (np.array([True, False]), TypeError, "t has unsupported dtype bool"),
        (np.array([1.0]), TypeError, "t has unsupported dtype float64"),
        (np.array([2**63], dtype=np.uint64), OverflowError, "t holds ids beyond int64"),
        ("abc", TypeError, "t must be a list, tuple or 1-D integer numpy array, got str"),
        (b"ab", TypeError, "got bytes"),
        (5, TypeError, "got int"),
        ({1: 2}, TypeError, "got dict"),
    ],
)
def test_token_ids_refuses(value, exc, message):
    with pytest.raises(exc, match=message):
        _checks.token_ids(value, "t")


def test_token_id_single_values():
    assert _checks.token_id(np.int16(-4), "x", 0) == -4
    assert type(_checks.token_id(np.int64(7), "x", 0)) is int

    class Sub(int):
        def __index__(self):  # pragma: no cover - must not be called
            raise AssertionError("a subclass's own __index__ ran")

    assert _checks.token_id(Sub(9), "x", 3) == 9
    with pytest.raises(TypeError, match=r"x\[2\] must be an integer token id, got bool"):
        _checks.token_id(np.bool_(True), "x", 2)


def test_int64_ids_is_a_fresh_int64_copy():
    a = np.arange(3, dtype=np.int32)
    out = _checks.int64_ids(a, "slots")
    assert out.dtype == np.int64 and not np.shares_memory(out, a)
    b = np.arange(3, dtype=np.int64)
    assert not np.shares_memory(_checks.int64_ids(b, "slots"), b)
    with pytest.raises(TypeError, match=r"offsets\[1\] must be an integer, got float 1.5"):
        _checks.int64_ids([0, 1.5], "offsets")


def test_entries_rule():
    arr = np.array([1, 2], dtype=np.int32)
    assert _checks.entries(arr, "d") is arr
    assert _checks.entries(arr, "d", listed=True) == [1, 2]
    assert _checks.entries(range(3), "d", listed=True) == [0, 1, 2]
    t = ("a", "b")
    assert _checks.entries(t, "d") is t and _checks.entries(t, "d", listed=True) is t
    for bad in ("ab", 3, {1: 2}, None):
        with pytest.raises(TypeError, match="d must be a list, tuple or 1-D integer numpy array"):
            _checks.entries(bad, "d")
    with pytest.raises(ValueError, match="d must be 1-D"):
        _checks.entries(np.zeros((1, 2), dtype=np.int64), "d")


# -------------------------------------------------------------------------------------
# the (tokens, offsets) contract
# -------------------------------------------------------------------------------------

BAD_OFFSETS = [
    ([1, 2, 3, 4], [1, 2, 3], r"offsets\[0\] must be 0, got 1"),
    ([1, 2, 3, 4], [0, 2, 3], r"offsets\[-1\]=3 must equal len\(tokens\)=4"),
    ([1, 2, 3], [0, 1, 4], r"offsets\[-1\]=4 must equal len\(tokens\)=3"),
    ([1, 2, 3], [0, 2, 1], r"offsets must be nondecreasing, got offsets\[1\]=2 > offsets\[2\]=1"),
    ([1, 2, 3], [0, 2**63 - 1, -(2**63)], "offsets must be nondecreasing"),
    ([1, 2, 3], [-1, 1, 3], r"offsets\[0\] must be 0, got -1"),
]


@pytest.mark.parametrize("tokens, offsets, message", BAD_OFFSETS)
def test_ragged_refuses_every_break_of_the_contract(tokens, offsets, message):
    with pytest.raises(ValueError, match=message):
        _checks.ragged(tokens, offsets, 2)
    with pytest.raises(ValueError, match=message):
        _checks.ragged(np.array(tokens), np.array(offsets, dtype=np.int64), None)


def test_ragged_counts_and_copies():
    toks = np.array([5, 6, 7], dtype=np.int64)
    off = np.array([0, 1, 3], dtype=np.int64)
    t, o = _checks.ragged(toks, off, 2)
    assert t.tolist() == [5, 6, 7] and o.tolist() == [0, 1, 3]
    assert not np.shares_memory(t, toks) and not np.shares_memory(o, off)
    t32, _ = _checks.ragged(toks.astype(np.int32), off, 2, own=False)
    assert t32.dtype == np.int32
    with pytest.raises(ValueError, match=r"offsets holds 3 entries for 3 rows; it needs B \+ 1 = 4"):
        _checks.ragged(toks, off, 3)
    with pytest.raises(ValueError, match="offsets must hold one entry per row plus one"):
        _checks.ragged([], [], None)
    with pytest.raises(TypeError, match=r"offsets\[1\] must be an integer"):
        _checks.ragged([1], [0, True], 1)
    e, eo = _checks.ragged([], [0], 0)
    assert e.size == 0 and eo.tolist() == [0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 8), min_size=1, max_size=8), st.integers(0, 8))
def test_check_offsets_agrees_with_the_plain_definition(values, total):
    off = np.array(values, dtype=np.int64)
    ok = values[0] == 0 and values[-1] == total and all(a <= b for a, b in zip(values, values[1:]))
    if ok:
        k = _checks.check_offsets(off, total)
        assert k == max([b - a for a, b in zip(values, values[1:])], default=0)
    else:
        with pytest.raises(ValueError, match="offsets"):
            _checks.check_offsets(off, total)


def test_one_offsets_check_for_every_concept():
    """The batch machine, the indexes and the accept kernels all apply the same
    check, each naming its own parameter."""
    with pytest.raises(ValueError, match=r"row_offsets\[-1\]=1 must equal len\(row_tokens\)=2"):
        _checks_machine.slot_ragged([1, 2], [0, 1], 1, "row_tokens")
    with pytest.raises(ValueError, match=r"cache_offsets\[0\] must be 0"):
        _checks_machine.slot_ragged([1, 2], [1, 2], 1, "row_caches")
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0, got 1"):
        _checks_drafting.batch_tokens([1, 2, 3, 4], [1, 2, 3], 2)
    with pytest.raises(ValueError, match=r"offsets\[-1\]=3 must equal len\(draft\)=4"):
        _checks_accept.draft_offsets(np.array([0, 3], dtype=np.int64), 4)


# -------------------------------------------------------------------------------------
# the contract through the public entry points, on both implementations
# -------------------------------------------------------------------------------------


@pytest.mark.parametrize("module, cls", [("ngram_index", "NgramIndex"), ("suffix_index", "SuffixIndex")])
@pytest.mark.parametrize("tokens, offsets, message", BAD_OFFSETS)
def test_extend_batch_refuses_bad_offsets_and_changes_nothing(impl, module, cls, tokens, offsets, message):
    mod = impl.module(module)
    a, b = getattr(mod, cls)(1), getattr(mod, cls)(1)
    a.extend([9])
    for t, o in ((tokens, offsets), (np.array(tokens, dtype=np.int64), np.array(offsets, dtype=np.int64))):
        with pytest.raises(ValueError, match=message):
            mod.extend_batch([a, b], t, o)
    assert a.tokens.tolist() == [9] and len(b) == 0
    mod.extend_batch([a, b], [1, 2, 3], [0, 1, 3])
    assert a.tokens.tolist() == [9, 1] and b.tokens.tolist() == [2, 3]


@pytest.mark.parametrize("module, cls", [("ngram_index", "NgramIndex"), ("suffix_index", "SuffixIndex")])
def test_the_issue_case_skips_no_token(impl, module, cls):
    """``extend_batch(indexes, [1, 2, 3, 4], [1, 2, 3])`` once skipped token 1 (and 4)."""
    mod = impl.module(module)
    ixs = [getattr(mod, cls)(1), getattr(mod, cls)(1)]
    with pytest.raises(ValueError, match="offsets"):
        mod.extend_batch(ixs, [1, 2, 3, 4], [1, 2, 3])
    assert [len(ix) for ix in ixs] == [0, 0]


def test_longest_match_batch_holds_the_contract(impl):
    ngi = impl.module("ngram_index")
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0, got 1"):
        ngi.longest_match_batch([1, 2, 3, 4], [1, 2, 3], 1, 1, 2)
    with pytest.raises(ValueError, match=r"offsets\[-1\]=3 must equal len\(tokens\)=4"):
        ngi.longest_match_batch(np.array([1, 2, 3, 4]), [0, 2, 3], 1, 1, 2)
    drafts, off, lengths = ngi.longest_match_batch([1, 2, 1, 5, 5], [0, 3, 5], 1, 1, 2)
    assert off.tolist()[0] == 0 and lengths.shape == (2,)


@pytest.mark.parametrize("module, cls", [("ngram_index", "NgramIndex"), ("suffix_index", "SuffixIndex")])
def test_propose_batch_counts(impl, module, cls):
    mod = impl.module(module)
    ixs = [getattr(mod, cls)(1), getattr(mod, cls)(1)]
    mod.extend_batch(ixs, [1, 2, 1, 3, 4, 3], [0, 3, 6])
    d, o, n = mod.propose_batch(ixs, [2, 1])
    assert o.tolist()[0] == 0 and o.tolist()[-1] == d.shape[0] and n.tolist() == np.diff(o).tolist()
    with pytest.raises(ValueError, match="max_k holds 1 counts for 2 requests"):
        mod.propose_batch(ixs, [1])
    with pytest.raises(TypeError, match=r"max_k\[1\] must be an integer"):
        mod.propose_batch(ixs, [1, 1.5])
    with pytest.raises(ValueError, match=r"max_k must be non-negative, got max_k\[0\]=-1"):
        mod.propose_batch(ixs, [-1, 1])


def _batch(bm):
    b = bm.BatchState(2, 4)
    b.admit([0, 1], [1, 2, 3], [0, 2, 3], [10, 11])
    b.advance_prefill([0, 1], [7, 8], [20, 21])
    return b


def test_batch_state_holds_the_contract(impl):
    bm = impl.module("batch")
    b = bm.BatchState(2, 4)
    for positions, offsets, message in [
        ([1, 2, 3], [1, 2, 3], r"offsets\[0\] must be 0, got 1"),
        ([1, 2, 3], [0, 2, 2], r"offsets\[-1\]=2 must equal len\(positions\)=3"),
        ([1, 2, 3], [0, 3, 2], "offsets must be nondecreasing"),
        ([1, 2, 3], [0, 3], r"offsets holds 2 entries for 2 slots; it needs B \+ 1 = 3"),
    ]:
        with pytest.raises(ValueError, match=message):
            b.admit([0, 1], positions, offsets, [10, 11])
    assert b.states.tolist() == [0, 0]
    b = _batch(bm)
    before = b.states.tolist()
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0, got 1"):
        b.enter_verify([0, 1], [1, 2, 3, 4], [1, 2, 3])
    with pytest.raises(ValueError, match=r"offsets\[-1\]=3 must equal len\(tokens\)=4"):
        b.enter_verify([0, 1], [1, 2, 3, 4], [0, 2, 3])
    assert b.states.tolist() == before
    b.enter_verify([0, 1], [1, 2, 3], [0, 2, 3])
    verify = b.states.tolist()
    with pytest.raises(ValueError, match=r"row_offsets\[0\] must be 0, got 1"):
        b.accept([0, 1], [1, 2, 3, 4], [1, 2, 3], [30, 31, 32], [0, 2, 3])
    with pytest.raises(ValueError, match=r"cache_offsets\[-1\]=2 must equal len\(row_caches\)=3"):
        b.accept([0, 1], [1, 2, 3], [0, 2, 3], [30, 31, 32], [0, 2, 2])
    assert b.states.tolist() == verify
    b.accept([0, 1], [1, 2, 3], [0, 2, 3], [30, 31, 32], [0, 2, 3])


def test_batch_state_token_ids(impl):
    bm = impl.module("batch")
    b = bm.BatchState(2, 4)
    with pytest.raises(TypeError, match=r"positions\[1\] must be an integer token id, got float"):
        b.admit([0, 1], [1, 2.0, 3], [0, 2, 3], [10, 11])
    with pytest.raises(TypeError, match=r"slots\[0\] must be an integer, got bool"):
        b.admit([True, 1], [1, 2, 3], [0, 2, 3], [10, 11])
    assert b.states.tolist() == [0, 0]


def _accept_args():
    draft = np.array([1, 2, 3, 4], dtype=np.int64)
    p = np.full((4, 5), 0.2)
    return draft, p


@pytest.mark.parametrize("offsets, message", [
    ([1, 2, 4], r"offsets\[0\] must be 0, got 1"),
    ([0, 2, 3], r"offsets\[-1\]=3 must equal len\(draft\)=4"),
    ([0, 3, 2, 4], "offsets must be nondecreasing"),
    ([], "offsets must hold one entry per row plus one"),
])
def test_accept_kernels_hold_the_contract(impl, offsets, message):
    acc = impl.module("accept")
    draft, p = _accept_args()
    with pytest.raises(ValueError, match=message):
        acc.exact_batch(draft, draft, offsets)
    with pytest.raises(ValueError, match=message):
        acc.min_run_batch(draft, draft, offsets, 2)
    with pytest.raises(ValueError, match=message):
        acc.speculative_batch(draft, offsets, p, None, np.random.default_rng(0))
    with pytest.raises(ValueError, match=message):
        acc.typical_batch(draft, offsets, p)


def test_accept_kernels_token_ids(impl):
    acc = impl.module("accept")
    with pytest.raises(TypeError, match=r"draft\[1\] must be an integer token id, got bool"):
        acc.exact_batch([1, True], [1, 2], [0, 2])
    with pytest.raises(TypeError, match=r"offsets\[1\] must be an integer, got float"):
        acc.exact_batch([1, 2], [1, 2], [0, 2.0])
    tokens, accepted = acc.exact_batch([1, 2, 3], [1, 9, 3], [0, 2, 3])
    assert accepted.tolist() == [1, 1]


def test_accept_rule_batch_calls_hold_the_contract():
    draft, p = _accept_args()
    for call in (
        lambda off: accept_rule.Exact().accept_batch(draft, draft, off),
        lambda off: accept_rule.MinRun(2).accept_batch(draft, draft, off),
        lambda off: accept_rule.SpeculativeSampling(np.random.default_rng(0)).sample_batch(draft, off, p),
        lambda off: accept_rule.TypicalAcceptance().accept_batch(draft, off, p),
    ):
        with pytest.raises(ValueError, match=r"offsets\[0\] must be 0, got 1"):
            call([1, 2, 4])
        with pytest.raises(ValueError, match=r"offsets\[-1\]=3 must equal len\(draft\)=4"):
            call([0, 2, 3])
        call([0, 2, 4])


# -------------------------------------------------------------------------------------
# one stats checker, the rule kinds
# -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stats, exc, message",
    [
        ([0, 0, 0, 0], TypeError, "stats must be a tuple of 4 counts"),
        ((0, 0, 0), ValueError, "stats must hold 4 counts"),
        ((1, 2, 3, 0), ValueError, "stats accepted=3 is beyond drafted=2"),
        ((1, 4, 4, 2), ValueError, "stats full_accepts=2 is beyond steps=1"),
        ((0, 1, 0, 0), ValueError, "stats drafted=1 with no recorded step"),
        ((2**63, 0, 0, 0), OverflowError, "stats steps=9223372036854775808 is beyond int64"),
        ((1, -1, 0, 0), ValueError, "stats drafted must be a non-negative integer"),
    ],
)
def test_one_stats_checker(stats, exc, message):
    with pytest.raises(exc, match=message):
        _checks_drafting.check_stats(stats)


@pytest.mark.parametrize("module, cls", [("ngram_index", "NgramIndex"), ("suffix_index", "SuffixIndex")])
def test_both_index_kinds_restore_stats_by_the_same_rule(impl, module, cls):
    ix = getattr(impl.module(module), cls)(1)
    ix.extend([1, 2, 1])
    ix.record(3, 2)
    ix.record(2, 2)
    clone = pickle.loads(pickle.dumps(ix))
    assert clone.stats == ix.stats
    with pytest.raises(ValueError, match="stats accepted=3 is beyond drafted=2"):
        clone._restore_stats((1, 2, 3, 0))


def test_rule_kinds_come_from_the_class_not_its_name():
    kind = _checks_accept.rule_kind
    assert kind(None) == (_checks_accept.R_EXACT, 0)
    assert kind(accept_rule.Exact()) == (_checks_accept.R_EXACT, 0)
    assert kind(accept_rule.MinRun(3)) == (_checks_accept.R_MINRUN, 3)
    assert kind(accept_rule.SpeculativeSampling(np.random.default_rng(0)))[0] == _checks_accept.R_SPEC
    assert kind(accept_rule.TypicalAcceptance())[0] == _checks_accept.R_TYPICAL

    class Exact:  # same name, another rule
        def accepted_rows(self, draft, choices):
            return 0

    class Stricter(accept_rule.Exact):  # a subclass that does not declare its kind
        __slots__ = ()

    assert kind(Exact()) == (_checks_accept.R_OTHER, 0)
    assert kind(Stricter()) == (_checks_accept.R_OTHER, 0)
    with pytest.raises(TypeError, match="rule must be None or an acceptance rule"):
        kind(object())


def test_no_private_names_cross_the_check_modules():
    import ast
    from pathlib import Path

    root = Path(_checks.__file__).parent
    for rel in ("_checks.py", "machine/_checks.py", "accept/_checks.py", "drafting/_checks.py",
                "placement/_checks.py"):
        tree = ast.parse((root / rel).read_text())
        assert ast.get_docstring(tree), rel
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("_checks"):
                assert not [a.name for a in node.names if a.name.startswith("_")], (rel, node.module)
