"""The compiled indexes and their twins, side by side: every public method and module
function of ``NgramIndex`` and ``SuffixIndex``, driven with random legal and illegal calls
and edge values (counts near 2**62 and 2**63, negative, bool, numpy scalars, huge ids,
empty input), re-entrant arguments and calls from a second thread while the index is
held, must give the same result, or the same exception type and message, and leave
both indexes in the same state.

Each call runs on a compiled index and on its twin built the same way; results are
compared after normalising numpy arrays (values and dtype) and module names in
messages. The ``serve`` cases (``serve`` and ``serve_batch``) are a test of their own, so
a missing serving step on one side does not hide drift in the rest. Skipped when the
compiled core is not built or is switched off (``SPECFSM_NO_EXTENSIONS``). The last
tests check ``serve`` and ``serve_batch`` against their definition, per implementation.
"""

from __future__ import annotations

import re

import copy
import pickle
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm import _impl

KINDS = {"ngram": ("ngram_index", "NgramIndex"), "suffix": ("suffix_index", "SuffixIndex")}


def _modules(kind: str):
    mod, _ = KINDS[kind]
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: the compiled core is switched off")
    try:
        compiled = _impl.kernels("compiled", mod)
    except ImportError as exc:
        pytest.skip(f"the compiled core is not built ({exc})")
    return compiled, _impl.kernels("python", mod)


# --------------------------------------------------------------------------------------
# outcomes, normalised so that the two implementations compare equal
# --------------------------------------------------------------------------------------


def _norm(x):
    if isinstance(x, np.ndarray):
        return ("ndarray", str(x.dtype), x.shape, x.tolist(), bool(x.flags.writeable))
    if isinstance(x, tuple):
        return tuple(_norm(v) for v in x)
    if isinstance(x, list):
        return [_norm(v) for v in x]
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items()}
    if isinstance(x, np.generic):
        return ("np", str(x.dtype), x.item())
    return x


def _message(exc: BaseException) -> str:
    # a class's module names the implementation: specfsm._core.<name> or its twin
    return re.sub(r"specfsm\.(?:_core\.\w+|[\w.]*\._\w+_py)\.", "specfsm.<impl>.", str(exc))


def outcome(thunk):
    try:
        return ("ok", _norm(thunk()))
    except Exception as exc:  # compared: type and message
        return ("raised", type(exc).__name__, _message(exc))


def snapshot(ix, kind: str):
    """Everything observable about one index without changing it."""
    reads = {
        "len": lambda: len(ix),
        "tokens": lambda: ix.tokens,
        "stats": lambda: ix.stats,
        "draft_len": lambda: ix.draft_len,
        "adaptive": lambda: ix.adaptive,
        "min_n": lambda: ix.min_n,
        "max_n": lambda: ix.max_n,
        "prefer": lambda: ix.prefer,
        "match_length": lambda: ix.match_length(),
        "propose": lambda: ix.propose(),
        "repr": lambda: repr(ix),
        "nbytes": lambda: type(ix.nbytes).__name__,
        "bytes_per_token": lambda: type(ix.bytes_per_token).__name__,
    }
    if kind == "suffix":
        reads.update(
            match_end=lambda: ix.match_end(),
            anchor=lambda: (ix.anchor_n, ix.anchor_span, ix.anchor_misses),
            last_tokens=lambda: ix.last_tokens(3),
            n_states=lambda: type(ix.n_states).__name__,
            n_edges=lambda: type(ix.n_edges).__name__,
        )
    return {name: outcome(f) for name, f in reads.items()}


# --------------------------------------------------------------------------------------
# argument strategies: legal, edge and illegal values
# --------------------------------------------------------------------------------------

BIG = [2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1]

small_ids = st.lists(st.integers(0, 4), max_size=12)


@st.composite
def token_args(draw):
    """A token argument: mostly small ids (so that matches happen), sometimes edge or
    illegal ones."""
    base = draw(small_ids)
    form = draw(st.sampled_from(["list"] * 6 + ["tuple", "i64", "i32", "u64", "edge", "bad", "empty"]))
    if form == "list":
        return base
    if form == "tuple":
        return tuple(base)
    if form == "i64":
        return np.array(base, dtype=np.int64)
    if form == "i32":
        return np.array(base, dtype=np.int32)
    if form == "u64":
        return np.array(base + draw(st.sampled_from([[], [2**63 - 1], [2**63]])), dtype=np.uint64)
    if form == "edge":
        return base + [draw(st.sampled_from(BIG + [np.int64(3), np.int32(-7), np.uint64(2**64 - 1)]))]
    if form == "empty":
        return draw(st.sampled_from([[], (), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)]))
    return draw(st.sampled_from([[1, True], [1.5], "abc", 3, None, [[1, 2]], np.zeros((2, 2), dtype=np.int64),
                                 np.array([1.0]), np.array([True]), {1: 2}, b"ab"]))


counts = st.one_of(
    st.integers(0, 10),
    st.sampled_from([2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64]),
    st.sampled_from([None, -1, -(2**63), True, False, np.int64(3), np.int32(2), np.uint64(5),
                     np.int64(2**62), np.uint64(2**63), np.bool_(True), 2.0, "3", [1]]),
)


def _count(draw):
    return draw(counts)


class Reenter:
    """A count whose ``__index__`` calls back into the index (the call's outcome is
    kept, so both implementations' callbacks are compared too)."""

    def __init__(self, value: int, action):
        self.value = value
        self.action = action
        self.seen: list = []

    def __index__(self) -> int:
        self.seen.append(outcome(self.action))
        return self.value


# --------------------------------------------------------------------------------------
# construction
# --------------------------------------------------------------------------------------


@st.composite
def settings_for(draw, kind: str):
    n = st.sampled_from([1, 1, 2, 3, 0, -1, True, 2**31 - 2, 2**62, 2.0])
    args = [draw(n)]
    kw = {}
    if kind == "ngram":
        args.append(draw(st.sampled_from([None, None, 2, 3, 4, 6, 1, 5000, 2**31 - 2, 2**31 - 1, -3])))
        args.append(draw(st.sampled_from(["latest", "earliest", "x", None])))
    else:
        args.append(draw(st.sampled_from([None, None, 2, 3, 8, 1, 2**31, -3, 2**62])))
        args.append(draw(st.sampled_from(["earliest", "latest", "x", 1])))
        if draw(st.booleans()):
            kw["anchor_n"] = draw(st.sampled_from([0, 2, 3, 2**40, -1]))
            kw["anchor_span"] = draw(st.sampled_from([0, 4, 64, 2**40]))
            kw["anchor_misses"] = draw(st.sampled_from([0, 1, 4, 2**62]))
    if draw(st.booleans()):
        kw["draft_len"] = draw(st.sampled_from([0, 1, 3, 4, 8, 16, 40, -1, True]))
        kw["min_draft"] = draw(st.sampled_from([0, 1, 2, 5, -1]))
        kw["max_draft"] = draw(st.sampled_from([4, 8, 16, 32, 2**62, 0]))
    kw["adaptive"] = draw(st.sampled_from([False, True, 0, 1]))
    return args, kw


# --------------------------------------------------------------------------------------
# the calls
# --------------------------------------------------------------------------------------

SINGLE = ["extend", "extend", "append", "propose", "propose", "match_length", "record", "record",
          "record", "pickle", "deepcopy", "reenter", "held", "stats", "tokens", "nbytes"]
SUFFIX_ONLY = ["lookup", "last_tokens", "match_end"]
BATCH = ["extend_batch", "propose_batch", "record_batch"]
SERVE = ["serve", "serve", "serve_batch", "serve_batch_lists", "serve_reenter", "serve_held"]


def _pick_indexes(draw, n_pairs: int):
    """Which pairs a batch call takes: positions (maybe repeated), or a wrong object."""
    form = draw(st.sampled_from(["distinct"] * 4 + ["dup", "empty", "foreign", "single"]))
    if form == "distinct":
        k = draw(st.integers(1, n_pairs))
        return draw(st.permutations(list(range(n_pairs))))[:k]
    if form == "dup":
        return [0, 0]
    if form == "empty":
        return []
    return form


def _offsets_for(draw, b: int, n: int):
    form = draw(st.sampled_from(["ok"] * 5 + ["short", "start", "end", "down", "float"]))
    if form == "ok" or b == 0:
        cuts = sorted(draw(st.lists(st.integers(0, n), min_size=max(b - 1, 0), max_size=max(b - 1, 0))))
        return [0] + cuts + [n] if b else [0] if form == "ok" else [1]
    if form == "short":
        return [0, n]
    if form == "start":
        return [1] + [n] * b
    if form == "end":
        return [0] * b + [n + 1]
    if form == "down":
        return [0] + [n] * (b - 1) + [0] if b > 1 else [0, -1]
    return np.array([0.0] * (b + 1))


def _held_call(ix, call):
    """``call(ix)`` from a second thread while this thread holds the index's writer flag."""
    ix._hold_guard(True)
    out: list = []
    try:
        t = threading.Thread(target=lambda: out.append(outcome(lambda: call(ix))))
        t.start()
        t.join(30)
    finally:
        ix._hold_guard(False)
    return out[0] if out else ("no answer",)


def run_pair(data, kind: str, with_serve: bool):
    compiled, twin = _modules(kind)
    _, cls_name = KINDS[kind]
    mods = {"compiled": compiled, "python": twin}
    n_pairs = data.draw(st.integers(1, 3), label="indexes")
    pools: dict[str, list] = {"compiled": [], "python": []}
    for _ in range(n_pairs):
        args, kw = data.draw(settings_for(kind), label="settings")
        made = {}
        for name, m in mods.items():
            made[name] = outcome(lambda m=m: getattr(m, cls_name)(*args, **kw))
            if made[name][0] == "ok":
                pools[name].append(getattr(m, cls_name)(*args, **kw))
        assert made["compiled"][0] == made["python"][0], (args, kw, made)
        if made["compiled"][0] == "raised":
            assert made["compiled"] == made["python"], (args, kw)
    n_pairs = len(pools["python"])
    if n_pairs == 0:
        return
    ops = SINGLE + (SUFFIX_ONLY if kind == "suffix" else []) + BATCH + (SERVE if with_serve else [])
    log = []
    for _ in range(data.draw(st.integers(1, 25), label="calls")):
        op = data.draw(st.sampled_from(ops), label="op")
        which = data.draw(st.integers(0, n_pairs - 1), label="index")
        got = {}
        if op in ("extend", "append", "propose", "record", "lookup", "last_tokens", "serve"):
            if op == "extend":
                a = (data.draw(token_args(), label="tokens"),)
            elif op == "append":
                a = (data.draw(st.sampled_from([0, 1, 2, 3, 2**63 - 1, 2**63, -(2**63), True, 1.0, np.int64(2), np.uint64(2**64 - 1), "1"]), label="token"),)
            elif op == "propose" or op == "last_tokens":
                a = (_count(data.draw),)
            elif op == "record":
                a = (_count(data.draw), _count(data.draw))
            elif op == "lookup":
                a = (data.draw(token_args(), label="context"), _count(data.draw))
            else:
                a = (data.draw(token_args(), label="tokens"), _count(data.draw), _count(data.draw),
                     _count(data.draw))
            for name in mods:
                ix = pools[name][which]
                got[name] = outcome(lambda ix=ix: getattr(ix, op)(*a))
        elif op in ("match_length", "match_end"):
            for name in mods:
                got[name] = outcome(getattr(pools[name][which], op))
        elif op in ("stats", "tokens", "nbytes"):
            for name in mods:
                ix = pools[name][which]
                got[name] = outcome(lambda ix=ix: getattr(ix, op) if op != "nbytes" else type(ix.nbytes).__name__)
        elif op in ("pickle", "deepcopy"):
            for name in mods:
                ix = pools[name][which]
                dup = outcome(lambda ix=ix: pickle.loads(pickle.dumps(ix)) if op == "pickle" else copy.deepcopy(ix))
                if dup[0] == "ok":
                    made = pickle.loads(pickle.dumps(ix)) if op == "pickle" else copy.deepcopy(ix)
                    got[name] = ("ok", snapshot(made, kind), type(made).__name__)
                else:
                    got[name] = dup
        elif op in ("reenter", "serve_reenter"):
            inner = data.draw(st.sampled_from(["extend", "propose", "record", "stats", "append"]), label="inner")
            value = data.draw(st.integers(0, 3), label="value")
            if op == "reenter":
                target = data.draw(st.sampled_from(["propose", "record_p", "record_a"]), label="where")
            else:
                target = data.draw(st.sampled_from(["drafted", "accepted", "max_k"]), label="where")
            for name in mods:
                ix = pools[name][which]
                action = {
                    "extend": lambda ix=ix: ix.extend([1, 2]),
                    "propose": lambda ix=ix: ix.propose(2),
                    "record": lambda ix=ix: ix.record(1, 1),
                    "stats": lambda ix=ix: ix.stats,
                    "append": lambda ix=ix: ix.append(3),
                }[inner]
                r = Reenter(value, action)
                if op == "reenter":
                    if target == "propose":
                        res = outcome(lambda ix=ix: ix.propose(r))
                    elif target == "record_p":
                        res = outcome(lambda ix=ix: ix.record(r, 0))
                    else:
                        res = outcome(lambda ix=ix: ix.record(4, r))
                else:
                    a3 = {"drafted": (r, 0, None), "accepted": (4, r, None), "max_k": (0, 0, r)}[target]
                    res = outcome(lambda ix=ix: ix.serve([1], *a3))
                got[name] = (res, r.seen)
        elif op in ("held", "serve_held"):
            call_name = data.draw(st.sampled_from(
                ["serve"] if op == "serve_held" else
                ["extend", "append", "propose", "record", "stats", "tokens", "len", "match_length", "pickle"]), label="held")
            calls = {
                "extend": lambda ix: ix.extend([1]),
                "append": lambda ix: ix.append(1),
                "propose": lambda ix: ix.propose(2),
                "record": lambda ix: ix.record(1, 0),
                "stats": lambda ix: ix.stats,
                "tokens": lambda ix: ix.tokens,
                "len": lambda ix: len(ix),
                "match_length": lambda ix: ix.match_length(),
                "pickle": lambda ix: pickle.dumps(ix),
                "serve": lambda ix: ix.serve([1], 0, 0, 2),
            }
            for name in mods:
                got[name] = _held_call(pools[name][which], calls[call_name])
        else:  # the module's batch functions
            pick = _pick_indexes(data.draw, n_pairs)
            b = len(pick) if isinstance(pick, list) else 1
            toks = data.draw(token_args(), label="batch tokens")
            try:
                n = len(toks)
            except TypeError:
                n = 0
            off = _offsets_for(data.draw, b, n)
            per = data.draw(st.sampled_from(["one", "each", "none"]), label="per-index")
            def counts_arg():
                if per == "one":
                    return _count(data.draw)
                if per == "none":
                    return None
                return [data.draw(st.sampled_from([0, 1, 2, 4, 2**62, 2**63 - 1, -1])) for _ in range(b)]
            k1, k2, k3 = counts_arg(), counts_arg(), counts_arg()
            for name, m in mods.items():
                pool = pools[name]
                if pick == "foreign":
                    ixs = [pool[0], pools["python" if name == "compiled" else "compiled"][0]]
                elif pick == "single":
                    ixs = pool[0]
                else:
                    ixs = [pool[i] for i in pick]
                if op == "extend_batch":
                    got[name] = outcome(lambda m=m, ixs=ixs: m.extend_batch(ixs, toks, off))
                elif op == "propose_batch":
                    got[name] = outcome(lambda m=m, ixs=ixs: m.propose_batch(ixs, k1))
                elif op == "record_batch":
                    got[name] = outcome(lambda m=m, ixs=ixs: m.record_batch(ixs, k1, k2))
                elif op == "serve_batch_lists":
                    got[name] = outcome(lambda m=m, ixs=ixs: m.serve_batch_lists(ixs, toks, off, k1, k2, k3))
                else:
                    got[name] = outcome(lambda m=m, ixs=ixs: m.serve_batch(ixs, toks, off, k1, k2, k3))
        log.append((op, got["python"]))
        assert got["compiled"] == got["python"], (op, log)
        for i in range(n_pairs):
            assert snapshot(pools["compiled"][i], kind) == snapshot(pools["python"][i], kind), (op, i, log)


PARITY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("kind", sorted(KINDS))
@PARITY
@given(data=st.data())
def test_every_call_agrees(kind, data):
    """Construction, every method and property, pickling and the batch functions, with
    re-entrant arguments and calls from a second thread while held."""
    run_pair(data, kind, with_serve=False)


@pytest.mark.parametrize("kind", sorted(KINDS))
@PARITY
@given(data=st.data())
def test_every_call_agrees_serving_steps_included(kind, data):
    """The same with ``serve`` and ``serve_batch`` among the calls."""
    run_pair(data, kind, with_serve=True)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_overflowing_records_agree(kind):
    """``record(2**62, 0)`` repeated: refused (OverflowError, nothing changed) at the same
    call with the same message on both; so are batches that would pass int64."""
    compiled, twin = _modules(kind)
    _, cls_name = KINDS[kind]
    runs = []
    for m in (compiled, twin):
        ix = getattr(m, cls_name)(1)
        seen = [outcome(lambda: ix.record(2**62, 0)) for _ in range(3)]
        seen.append(outcome(lambda: ix.record(2**62 - 1, 0)))
        seen.append(outcome(lambda: ix.record(1, 0)))
        seen.append(outcome(lambda: m.record_batch([ix], [1], [0])))
        seen.append(snapshot(ix, kind))
        runs.append(seen)
    assert runs[0] == runs[1]
    assert runs[0][1][:2] == ("raised", "OverflowError") and runs[0][2][:2] == ("raised", "OverflowError")
    assert runs[0][3] == ("ok", 8 if kind == "suffix" else 4)
    assert runs[0][6]["stats"][1]["drafted"] == 2**63 - 1


# --------------------------------------------------------------------------------------
# the serving step against its definition (each implementation on its own)
# --------------------------------------------------------------------------------------


def _cls(impl, kind):
    mod, name = KINDS[kind]
    return getattr(impl.module(mod), name)


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.tuples(small_ids, st.integers(0, 6), st.integers(0, 6), st.sampled_from([None, 0, 1, 3, 8, 40]))),
    adaptive=st.booleans(),
)
def test_serve_is_record_extend_propose(impl, kind, steps, adaptive):
    """``serve(tokens, drafted, accepted, max_k)`` is ``record`` (when drafted),
    ``extend``, then ``propose`` of ``min(draft_len, max_k)`` when adaptive, else of
    ``max_k``; ``serve_batch`` over several indexes is ``serve`` on each, and
    ``serve_batch_lists`` the same drafts, one list per index."""
    C = _cls(impl, kind)
    mod = impl.module(KINDS[kind][0])
    kw = dict(draft_len=4, adaptive=adaptive, min_draft=1, max_draft=9)
    served, ref, batched = C(1, 3, **kw), C(1, 3, **kw), [C(1, 3, **kw), C(2, 4, **kw)]
    listed = [C(1, 3, **kw), C(2, 4, **kw)]
    other = C(2, 4, **kw)
    for toks, d, a, k in steps:
        a = min(a, d)
        got = served.serve(toks, d, a, k)
        if d:
            ref.record(d, a)
        ref.extend(toks)
        limit = ref.draft_len if k is None else (min(ref.draft_len, k) if adaptive else k)
        assert got == ref.propose(limit)
        assert served.stats == ref.stats and served.tokens.tolist() == ref.tokens.tolist()
        want_other = other.serve(toks[::-1], d, a, k)
        out, off, lens = mod.serve_batch(batched, toks + toks[::-1], [0, len(toks), 2 * len(toks)],
                                         [d, d], [a, a], k)
        assert out.dtype == np.int64 and off.tolist() == [0, lens[0], lens[0] + lens[1]]
        assert out.tolist() == got + want_other
        assert batched[0].stats == served.stats and batched[1].stats == other.stats
        rows = mod.serve_batch_lists(listed, np.array(toks + toks[::-1], dtype=np.int64),
                                     [0, len(toks), 2 * len(toks)], [d, d], [a, a], k)
        assert type(rows) is list and all(type(r) is list for r in rows)
        assert rows == [got, want_other] and all(type(t) is int for r in rows for t in r)
        assert listed[0].stats == served.stats and listed[1].stats == other.stats


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_serve_refuses_changing_nothing(impl, kind):
    """A refused serving step (bad counts, accepted beyond drafted, a drafted total past
    int64, the index held by another call, a duplicate in a batch) changes nothing."""
    C = _cls(impl, kind)
    mod = impl.module(KINDS[kind][0])
    ix, jx = C(1, 3), C(1, 3)
    ix.serve([1, 2, 1], 2**62, 0)
    before = (ix.tokens.tolist(), ix.stats, jx.tokens.tolist(), jx.stats)
    refusals = [
        (TypeError, lambda: ix.serve([5], True)),
        (ValueError, lambda: ix.serve([5], -1)),
        (ValueError, lambda: ix.serve([5], 1, 2)),
        (TypeError, lambda: ix.serve([5], 0, 0, 1.0)),
        (TypeError, lambda: ix.serve([1.5])),
        (OverflowError, lambda: ix.serve([5], 2**62, 0)),
        (OverflowError, lambda: ix.serve([2**63])),
        (ValueError, lambda: mod.serve_batch([ix, ix], [5, 6], [0, 1, 2], [0, 0], [0, 0])),
        (OverflowError, lambda: mod.serve_batch([jx, ix], [5, 6], [0, 1, 2], [1, 2**62], [0, 0])),
        (ValueError, lambda: mod.serve_batch([jx, ix], [5, 6], [0, 1, 2], [1, 1], [0, 2])),
        (ValueError, lambda: mod.serve_batch([jx, ix], [5, 6], [0, 2, 1], [1, 1], [0, 0])),
        (ValueError, lambda: mod.serve_batch_lists([ix, ix], [5, 6], [0, 1, 2], [0, 0], [0, 0])),
        (OverflowError, lambda: mod.serve_batch_lists([jx, ix], [5, 6], [0, 1, 2], [1, 2**62], [0, 0])),
        (ValueError, lambda: mod.serve_batch_lists([jx, ix], [5, 6], [0, 1, 2], [1, 1], [0, 2])),
        (ValueError, lambda: mod.serve_batch_lists([jx, ix], [5, 6], [0, 2, 1], [1, 1], [0, 0])),
    ]
    for exc, call in refusals:
        with pytest.raises(exc):
            call()
        assert (ix.tokens.tolist(), ix.stats, jx.tokens.tolist(), jx.stats) == before
    ix._hold_guard(True)
    try:
        with pytest.raises(RuntimeError, match="being changed"):
            mod.serve_batch([jx, ix], [5, 6], [0, 1, 2], [0, 0], [0, 0])
        with pytest.raises(RuntimeError, match="being changed"):
            mod.serve_batch_lists([jx, ix], [5, 6], [0, 1, 2], [0, 0], [0, 0])
        with pytest.raises(RuntimeError, match="being changed"):
            ix.serve([5])
    finally:
        ix._hold_guard(False)
    assert (ix.tokens.tolist(), ix.stats, jx.tokens.tolist(), jx.stats) == before
    assert ix.serve([2], 2**62 - 1, 0) == ix.propose() == [1, 2] and ix.stats["drafted"] == 2**63 - 1


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_serve_batch_reads_plain_arrays_as_it_reads_lists(impl, kind, data):
    """``serve_batch`` and ``serve_batch_lists`` given plain int64 arrays (the compiled
    core's C path) answer, refuse and change exactly what they do given the same values
    as lists: offsets that do not start at 0, decrease or miss the end, counts that are
    negative or accepted beyond drafted, negative draft limits, wrong lengths."""
    C = _cls(impl, kind)
    mod = impl.module(KINDS[kind][0])
    b = data.draw(st.integers(1, 4), label="b")
    toks = data.draw(st.lists(st.integers(0, 5), max_size=12), label="tokens")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(toks)), min_size=b - 1, max_size=b - 1), label="cuts"))
    off = [0, *cuts, len(toks)]
    small = st.integers(-1, 3)
    d = data.draw(st.lists(small, min_size=b, max_size=b), label="drafted")
    a = data.draw(st.lists(small, min_size=b, max_size=b), label="accepted")
    k = data.draw(st.one_of(st.none(), st.integers(0, 9), st.lists(st.integers(-1, 9), min_size=b, max_size=b)),
                  label="max_k")
    fault = data.draw(st.sampled_from(["none", "first", "last", "order", "short", "long"]), label="fault")
    if fault == "first":
        off[0] = 1
    elif fault == "last":
        off[-1] += 1
    elif fault == "order" and b >= 2:
        off[1], off[2] = off[1] + 1, max(off[1] - 1, 0)
    elif fault == "short":
        d = d[:-1]
    elif fault == "long":
        off = off + [len(toks)]
    seeds = [data.draw(st.lists(st.integers(0, 5), max_size=8), label="history") for _ in range(b)]
    arr = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
    for call in (mod.serve_batch, mod.serve_batch_lists):
        runs = []
        for form in ("lists", "arrays"):
            ixs = [C(1, 3) for _ in range(b)]
            for ix, h in zip(ixs, seeds):
                ix.extend(h)
            if form == "lists":
                got = outcome(lambda: call(ixs, toks, off, d, a, k))
            else:
                kk = arr(k) if isinstance(k, list) else k
                got = outcome(lambda: call(ixs, arr(toks), arr(off), arr(d), arr(a), kk))
            runs.append((got, [snapshot(ix, kind) for ix in ixs]))
        assert runs[0] == runs[1], (call.__name__, fault)
