"""``ngram_index`` and ``suffix_index`` under hostile arguments: the compiled module and
its twin, side by side in one process (``specfsm._impl.kernels``), must return equal
results and leave equal indexes, or raise the same exception type, which must be a clean
one (TypeError, ValueError, IndexError, OverflowError, RuntimeError).

Every public method and batch function of both index kinds (constructors, ``extend``,
``append``, ``propose``, ``propose_tree``, ``lookup``, ``last_tokens``, ``record``,
``serve``, ``stats``, ``nbytes``, pickling and its statistics, ``extend_batch``,
``propose_batch``, ``propose_tree_batch``, ``record_batch``, ``serve_batch``,
``serve_batch_lists``, ``longest_match`` and ``longest_match_batch``) is fed extreme
integers (int64's and int32's edges, just past them, huge Python ints) in every integer
argument, on indexes whose statistics sit at int64's edge, and every layout and dtype in
every sequence argument (lists, tuples, other sequences, numpy integers, bools, floats,
int8 to uint64, big-endian, float, bool and object arrays, strided, reversed,
Fortran-order, 2-D, 0-d, read-only, subclassed and unaligned arrays), some of them armed
to rewrite another argument while they are converted. Then targeted tests: the rules the
two implementations used to differ on, every method called with a ``self`` of another
type (in a subprocess: it used to crash the compiled core), and sequences whose contents
change between readings, which must be read once.

Without a compiled core (or with ``SPECFSM_NO_EXTENSIONS``) the twin runs alone and must
still refuse cleanly.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hostile_values as hv
from isolated import TESTS, child_env
from hostile_values import I64, I64MIN, Seq, maker, offsets, outcome

SETTINGS = hv.hostile_settings(60)

#: the shared extreme ints, and more around int32's and 2**30, and -1
EXTREME = hv.EXTREME + [2**31 - 2, 2**30 - 1, 2**30, -(2**31), -1]
MODULES = {"ngram": ("ngram_index", "NgramIndex"), "suffix": ("suffix_index", "SuffixIndex")}
KINDS = list(MODULES)


def pair(kind):
    """(compiled module or None, twin module) of index kind ``kind``."""
    return hv.pair(MODULES[kind][0])


# --------------------------------------------------------------------------------------
# outcomes (``outcome(thunk)``: hostile_values)
# --------------------------------------------------------------------------------------
def snapshot(ix, kind):
    """Everything observable about one index, read without changing it."""
    reads = [
        lambda: len(ix), lambda: ix.tokens, lambda: ix.stats, lambda: ix.draft_len,
        lambda: (ix.min_n, ix.max_n, ix.prefer, ix.adaptive), lambda: ix.match_length(),
        lambda: ix.propose(), lambda: ix.propose(3), lambda: type(ix.nbytes).__name__,
    ]
    if kind == "suffix":
        reads += [lambda: ix.match_end(), lambda: ix.propose_tree(8, 4, 2),
                  lambda: (ix.anchor_n, ix.anchor_span, ix.anchor_misses), lambda: ix.last_tokens(4)]
    return [outcome(r) for r in reads]


# --------------------------------------------------------------------------------------
# hostile arguments (the layouts and hooks: hostile_values)
# --------------------------------------------------------------------------------------
class HookInt(hv.HookInt):
    """A numpy integer whose ``__index__`` runs ``action`` first, once."""

    once = True


ints = st.one_of(st.integers(0, 6), st.sampled_from(EXTREME))
SCALARS = hv.scalar_pool() + [np.int64(I64), (2,)]
scalars = st.one_of(ints, st.sampled_from(SCALARS))


def seq_arg(valid, vocab=4):
    """A factory for one sequence argument: ``valid`` as it is, edited with extreme
    values, random, or a scalar in its place; in any layout."""
    return hv.sequence_arg(valid, ints, scalars, entries=st.one_of(st.integers(0, vocab - 1), ints),
                           plain="list", hook_int=HookInt)


@st.composite
def count_arg(draw, valid):
    """A factory for one count argument: ``valid``, an extreme int or another scalar."""
    kind = draw(st.sampled_from(["valid", "valid", "int", "other"]))
    s = valid if kind == "valid" else draw(ints) if kind == "int" else draw(scalars)
    return lambda: s


@st.composite
def limit_arg(draw, valid, b):
    """A factory for ``max_k``-like arguments: None, a count, or one count per index."""
    kind = draw(st.sampled_from(["none", "count", "count", "per"]))
    if kind == "none":
        return lambda: None
    if kind == "count":
        return draw(count_arg(valid))
    return draw(seq_arg([valid] * b))


@st.composite
def hooks(draw, n_args):
    """Which conversions rewrite which arguments: [("any", slot, target, how)]."""
    return [("any", draw(st.integers(0, n_args - 1)), draw(st.integers(0, n_args - 1)),
             draw(st.sampled_from(["max", "min", "retype"])))
            for _ in range(draw(st.integers(0, 2)))]


# --------------------------------------------------------------------------------------
# indexes
# --------------------------------------------------------------------------------------
STAT_EDGES = [None, None, (3, 10, 4, 1), (I64, 5, 2, 1), (10, I64, 3, 2), (I64 - 1, I64 - 2, 0, 0),
              (I64, I64, I64, I64), (2**62, 6643791661235938878, 23378828344655645, 7)]


@st.composite
def setups(draw, kind):
    """A valid index (settings, history, statistics) of ``kind``: built the same way on
    both implementations."""
    vocab = draw(st.sampled_from([2, 3, 5]))
    hist = draw(st.lists(st.integers(0, vocab - 1), max_size=40))
    if hist and draw(st.integers(0, 4)) == 0:
        hist[draw(st.integers(0, len(hist) - 1))] = draw(st.sampled_from([I64, I64MIN, 2**31, -(2**31) - 1]))
    prefer = draw(st.sampled_from(["latest", "earliest"]))
    adaptive = draw(st.booleans())
    big = draw(st.sampled_from([None, 2**31 - 2, 2**31, 2**40, I64, 2**64]))
    if big is None:
        kmin, k, kmax = 0, draw(st.sampled_from([0, 1, 3, 4, 8])), draw(st.sampled_from([8, 16]))
    else:
        kmin, k, kmax = draw(st.sampled_from([0, 1, big - 1])), big - 1, big
    kw = dict(draft_len=k, adaptive=adaptive, min_draft=kmin, max_draft=kmax)
    if kind == "ngram":
        lo = draw(st.sampled_from([1, 1, 2, 3, 33]))
        args = (lo, lo + draw(st.sampled_from([0, 1, 2, 4])), prefer)
    else:
        lo = draw(st.sampled_from([1, 1, 2, 3]))
        args = (lo, draw(st.sampled_from([None, lo, lo + 2, 2**40])), prefer)
        kw.update(anchor_n=draw(st.sampled_from([0, 0, 2, 3, 2**40])),
                  anchor_span=draw(st.sampled_from([0, 4, 64, I64])),
                  anchor_misses=draw(st.sampled_from([0, 1, 4, 2**64])))
    return {"args": args, "kw": kw, "hist": hist, "stats": draw(st.sampled_from(STAT_EDGES)),
            "vocab": vocab}


def build(mod, kind, setup):
    cls = getattr(mod, MODULES[kind][1])
    ix = cls(*setup["args"], **setup["kw"])
    ix.extend(setup["hist"])
    if setup["stats"] is not None:
        ix._restore_stats(setup["stats"])
    return ix


# --------------------------------------------------------------------------------------
# the calls: name -> (kinds, argument factories drawn from data, call)
# --------------------------------------------------------------------------------------
def draw_call(data, kind, name, setup, b):
    """``(factories, call)``: ``call(mod, indexes, args)`` runs method ``name`` on the
    indexes (the first is the one single-index methods use) with ``args``."""
    vocab = setup["vocab"]
    d = data.draw
    toks = d(st.lists(st.integers(0, vocab - 1), max_size=6))
    sizes = [d(st.integers(0, 3)) for _ in range(b)]
    flat = d(st.lists(st.integers(0, vocab - 1), min_size=sum(sizes), max_size=sum(sizes)))
    off = offsets(sizes)
    if name == "extend":
        return [d(seq_arg(toks, vocab))], lambda m, ix, a: ix[0].extend(a[0])
    if name == "append":
        return [d(count_arg(toks[0] if toks else 1))], lambda m, ix, a: ix[0].append(a[0])
    if name == "propose":
        return [d(limit_arg(3, 1))], lambda m, ix, a: ix[0].propose(a[0])
    if name == "record":
        p = d(st.integers(0, 5))
        return ([d(count_arg(p)), d(count_arg(d(st.integers(0, p))))],
                lambda m, ix, a: ix[0].record(a[0], a[1]))
    if name == "serve":
        p = d(st.integers(0, 5))
        return ([d(seq_arg(toks, vocab)), d(count_arg(p)), d(count_arg(d(st.integers(0, p)))),
                 d(limit_arg(4, 1))], lambda m, ix, a: ix[0].serve(*a))
    if name == "stats":
        return [], lambda m, ix, a: ix[0].stats
    if name == "nbytes":
        return [], lambda m, ix, a: (type(ix[0].nbytes).__name__, type(ix[0].bytes_per_token).__name__)
    if name == "pickle":
        return [], lambda m, ix, a: snapshot(pickle.loads(pickle.dumps(ix[0])), kind)
    if name == "restore_stats":
        st4 = [d(st.sampled_from([0, 1, 5, I64, I64 + 1, -1])) for _ in range(4)]
        return [d(seq_arg(st4))], lambda m, ix, a: ix[0]._restore_stats(
            tuple(a[0]) if isinstance(a[0], (list, np.ndarray, Seq)) else a[0])
    if name == "constructor":
        lo = setup["args"][0]
        return ([d(count_arg(lo)), d(count_arg(setup["args"][1])), d(count_arg(setup["kw"]["draft_len"])),
                 d(count_arg(setup["kw"]["min_draft"])), d(count_arg(setup["kw"]["max_draft"]))]
                + ([d(count_arg(setup["kw"]["anchor_n"])), d(count_arg(setup["kw"]["anchor_span"])),
                    d(count_arg(setup["kw"]["anchor_misses"]))] if kind == "suffix" else []),
                lambda m, ix, a: _construct(m, kind, setup, a))
    if name == "extend_batch":
        return ([d(seq_arg(flat, vocab)), d(seq_arg(off))],
                lambda m, ix, a: m.extend_batch(ix, a[0], a[1]))
    if name == "propose_batch":
        return [d(limit_arg(3, b))], lambda m, ix, a: m.propose_batch(ix, a[0])
    if name == "record_batch":
        ps = [d(st.integers(0, 4)) for _ in range(b)]
        return ([d(st.one_of(count_arg(ps[0] if ps else 1), seq_arg(ps))),
                 d(st.one_of(count_arg(0), seq_arg([d(st.integers(0, p)) for p in ps])))],
                lambda m, ix, a: m.record_batch(ix, a[0], a[1]))
    if name in ("serve_batch", "serve_batch_lists"):
        ps = [d(st.integers(0, 4)) for _ in range(b)]
        fn = name
        return ([d(seq_arg(flat, vocab)), d(seq_arg(off)),
                 d(st.one_of(count_arg(ps[0] if ps else 1), seq_arg(ps))),
                 d(st.one_of(count_arg(0), seq_arg([d(st.integers(0, p)) for p in ps]))),
                 d(limit_arg(3, b))],
                lambda m, ix, a: getattr(m, fn)(ix, *a))
    if name == "propose_tree":
        return ([d(count_arg(d(st.integers(1, 12)))), d(st.one_of(st.just(lambda: None), count_arg(3))),
                 d(st.one_of(st.just(lambda: None), count_arg(2)))],
                lambda m, ix, a: ix[0].propose_tree(*a))
    if name == "propose_tree_batch":
        return ([d(count_arg(d(st.integers(1, 12)))), d(st.one_of(st.just(lambda: None), count_arg(3))),
                 d(st.one_of(st.just(lambda: None), count_arg(2)))],
                lambda m, ix, a: m.propose_tree_batch(ix, *a))
    if name == "lookup":
        return [d(seq_arg(toks, vocab)), d(limit_arg(3, 1))], lambda m, ix, a: ix[0].lookup(*a)
    if name == "last_tokens":
        return [d(count_arg(3))], lambda m, ix, a: ix[0].last_tokens(a[0])
    if name == "longest_match":
        return ([d(seq_arg(setup["hist"], vocab)), d(count_arg(1)), d(count_arg(3)), d(count_arg(4))],
                lambda m, ix, a: m.longest_match(*a, setup["args"][2]))
    if name == "longest_match_batch":
        return ([d(seq_arg(flat, vocab)), d(seq_arg(off)), d(count_arg(1)), d(count_arg(3)),
                 d(limit_arg(2, b))],
                lambda m, ix, a: m.longest_match_batch(*a, setup["args"][2]))
    raise AssertionError(name)


def _construct(m, kind, setup, a):
    cls = getattr(m, MODULES[kind][1])
    kw = dict(setup["kw"], draft_len=a[2], min_draft=a[3], max_draft=a[4])
    if kind == "suffix":
        kw.update(anchor_n=a[5], anchor_span=a[6], anchor_misses=a[7])
    ix = cls(a[0], a[1], setup["args"][2], **kw)
    ix.extend(setup["hist"])
    ix.record(3, 1)
    ix.record(2, 2)
    return snapshot(ix, kind)


COMMON = ["constructor", "extend", "append", "propose", "record", "serve", "stats", "nbytes",
          "pickle", "restore_stats", "extend_batch", "propose_batch", "record_batch",
          "serve_batch", "serve_batch_lists"]
CALLS = [(k, n) for k in KINDS for n in COMMON]
CALLS += [("ngram", n) for n in ("longest_match", "longest_match_batch")]
CALLS += [("suffix", n) for n in ("propose_tree", "propose_tree_batch", "lookup", "last_tokens")]


def run_pair(kind, setup, b, factories, call, armed=()):
    """Runs ``call`` on fresh indexes of both implementations; returns both outcomes
    (result, then every index's snapshot), the twin's first."""
    compiled, twin = pair(kind)
    got = []
    for mod in (twin, compiled):
        if mod is None:
            continue
        ixs = [build(mod, kind, setup) for _ in range(b)]
        args = maker(factories, armed)()
        res = outcome(lambda: call(mod, ixs, args))
        got.append((res, [snapshot(ix, kind) for ix in ixs]))
    return got


@pytest.mark.parametrize("kind,name", CALLS, ids=[f"{k}-{n}" for k, n in CALLS])
@SETTINGS
@given(data=st.data())
def test_every_method_on_hostile_arguments(kind, name, data):
    setup = data.draw(setups(kind))
    b = data.draw(st.integers(1, 3))
    factories, call = draw_call(data, kind, name, setup, b)
    armed = data.draw(hooks(len(factories))) if factories else []
    got = run_pair(kind, setup, b, factories, call, armed)
    if len(got) == 2:
        assert got[1] == got[0], f"{kind}.{name}: compiled {got[1]!r}\n twin {got[0]!r}"


# --------------------------------------------------------------------------------------
# every integer argument, every extreme value (deterministic)
# --------------------------------------------------------------------------------------
SWEEP_VALUES = EXTREME + [0, 1, 3] + SCALARS


def _sweep_calls(kind):
    """(label, call(mod, indexes, v)) with ``v`` in one integer argument."""
    out = [
        ("propose(max_k)", lambda m, ix, v: ix[0].propose(v)),
        ("record(proposed)", lambda m, ix, v: ix[0].record(v, 0)),
        ("record(accepted)", lambda m, ix, v: ix[0].record(5, v)),
        ("serve(drafted)", lambda m, ix, v: ix[0].serve([1], v, 0)),
        ("serve(accepted)", lambda m, ix, v: ix[0].serve([1], 5, v)),
        ("serve(max_k)", lambda m, ix, v: ix[0].serve([1], 0, 0, v)),
        ("append(token)", lambda m, ix, v: ix[0].append(v)),
        ("extend([token])", lambda m, ix, v: ix[0].extend([v])),
        ("propose_batch(max_k)", lambda m, ix, v: m.propose_batch(ix, v)),
        ("propose_batch([max_k])", lambda m, ix, v: m.propose_batch(ix, [v] * len(ix))),
        ("record_batch(proposed)", lambda m, ix, v: m.record_batch(ix, v, 0)),
        ("record_batch([proposed])", lambda m, ix, v: m.record_batch(ix, [v] * len(ix), 0)),
        ("record_batch(accepted)", lambda m, ix, v: m.record_batch(ix, I64, v)),
        ("extend_batch(offsets)", lambda m, ix, v: m.extend_batch(ix, [1, 2], [0, v, 2][: len(ix)] + [2])),
        ("serve_batch(drafted)", lambda m, ix, v: m.serve_batch(ix, [], [0] * (len(ix) + 1), v, 0)),
        ("serve_batch([drafted])", lambda m, ix, v: m.serve_batch(ix, [], [0] * (len(ix) + 1), [v] * len(ix), 0)),
        ("serve_batch(accepted)", lambda m, ix, v: m.serve_batch(ix, [], [0] * (len(ix) + 1), 7, v)),
        ("serve_batch(max_k)", lambda m, ix, v: m.serve_batch(ix, [1], [0] + [1] * len(ix), 0, 0, v)),
        ("serve_batch_lists(max_k)", lambda m, ix, v: m.serve_batch_lists(ix, [1], [0] + [1] * len(ix), 0, 0, v)),
        ("serve_batch_lists([max_k])", lambda m, ix, v: m.serve_batch_lists(ix, [1], [0] + [1] * len(ix), 0, 0, [v] * len(ix))),
        ("serve_batch(offsets)", lambda m, ix, v: m.serve_batch(ix, [1, 2], ([0, v] + [2] * len(ix))[: len(ix) + 1],
                                                                [0] * len(ix), 0)),
        ("restore_stats(steps)", lambda m, ix, v: ix[0]._restore_stats((v, 0, 0, 0))),
        ("restore_stats(drafted)", lambda m, ix, v: ix[0]._restore_stats((1, v, 0, 0))),
        ("record after restore", lambda m, ix, v: (ix[0]._restore_stats((v, 0, 0, 0)), ix[0].record(0, 0))),
        ("serve after restore", lambda m, ix, v: (ix[0]._restore_stats((1, v, 0, 0)), ix[0].serve([], 1, 0))),
    ]
    for i, arg in enumerate(["min_n", "max_n", "draft_len", "min_draft", "max_draft"]):
        out.append((f"constructor({arg})", lambda m, ix, v, i=i: _ctor(m, kind, i, v)))
    if kind == "ngram":
        out += [
            ("longest_match(min_n)", lambda m, ix, v: m.longest_match([1, 2, 1, 2, 1], v, 2**40, 3)),
            ("longest_match(max_n)", lambda m, ix, v: m.longest_match([1, 2, 1, 2, 1], 1, v, 3)),
            ("longest_match(max_k)", lambda m, ix, v: m.longest_match([1, 2, 1, 2, 1], 1, 2, v)),
            ("longest_match_batch(max_k)", lambda m, ix, v: m.longest_match_batch([1, 2, 1, 2], [0, 4], 1, 2, v)),
            ("longest_match_batch(offsets)", lambda m, ix, v: m.longest_match_batch([1, 2, 1, 2], [0, v, 4], 1, 2, 3)),
        ]
    else:
        for i, arg in enumerate(["anchor_n", "anchor_span", "anchor_misses"]):
            out.append((f"constructor({arg})", lambda m, ix, v, i=i: _ctor(m, kind, 5 + i, v)))
        out += [
            ("propose_tree(budget)", lambda m, ix, v: ix[0].propose_tree(v)),
            ("propose_tree(max_depth)", lambda m, ix, v: ix[0].propose_tree(6, v)),
            ("propose_tree(max_width)", lambda m, ix, v: ix[0].propose_tree(6, 3, v)),
            ("propose_tree_batch(budget)", lambda m, ix, v: m.propose_tree_batch(ix, v)),
            ("propose_tree_batch(max_width)", lambda m, ix, v: m.propose_tree_batch(ix, 5, None, v)),
            ("lookup(max_k)", lambda m, ix, v: ix[0].lookup([1, 2], v)),
            ("lookup([token])", lambda m, ix, v: ix[0].lookup([1, v], 3)),
            ("last_tokens(count)", lambda m, ix, v: ix[0].last_tokens(v)),
        ]
    return out


def _ctor(m, kind, i, v):
    cls = getattr(m, MODULES[kind][1])
    args = [1, 3, 0, 0, 8, 0, 64, 4]
    args[i] = v
    kw = dict(draft_len=args[2], min_draft=args[3], max_draft=args[4], adaptive=True)
    if kind == "suffix":
        kw.update(anchor_n=args[5], anchor_span=args[6], anchor_misses=args[7])
    if i == 2:
        kw["max_draft"] = v  # draft_len needs room within [min_draft, max_draft]
    ix = cls(args[0], args[1], **kw)
    ix.extend([1, 2, 1, 2, 1, 2, 3, 1, 2])
    for p, a in ((3, 1), (2, 2), (4, 4)):
        ix.record(p, a)
    return snapshot(ix, kind)


SWEEP = [(k, label) for k in KINDS for label, _ in _sweep_calls(k)]


@pytest.mark.parametrize("kind,label", SWEEP, ids=[f"{k}-{lab}" for k, lab in SWEEP])
def test_every_integer_argument_at_the_edges(kind, label):
    call = dict(_sweep_calls(kind))[label]
    compiled, twin = pair(kind)
    mismatches = []
    for v in SWEEP_VALUES:
        for b in (1, 2):
            got = []
            for mod in (twin, compiled):
                if mod is None:
                    continue
                ixs = [build(mod, kind, {"args": (1, 3, "latest"), "kw": {"draft_len": 4, "adaptive": True},
                                         "hist": [1, 2, 3, 1, 2, 3, 1], "stats": None}) for _ in range(b)]
                res = outcome(lambda: call(mod, ixs, v))
                got.append((res, [snapshot(ix, kind) for ix in ixs]))
            if len(got) == 2 and got[0] != got[1]:
                mismatches.append(f"{label} v={v!r} b={b}:\n  compiled {got[1]!r}\n  twin     {got[0]!r}")
    assert not mismatches, "\n".join(mismatches[:4])


# --------------------------------------------------------------------------------------
# the rules the two used to differ on
# --------------------------------------------------------------------------------------
def _both(kind):
    compiled, twin = pair(kind)
    return [m for m in (twin, compiled) if m is not None]


@pytest.mark.parametrize("kind", KINDS)
def test_draft_lengths_beyond_the_capacity_are_capped_alike(kind):
    """A draft is never longer than the index can hold: ``draft_len``, ``min_draft`` and
    ``max_draft`` beyond it are stored capped, by both implementations."""
    cap = pair(kind)[1].MAX_INDEX_TOKENS if kind == "ngram" else pair(kind)[1].MAX_SUFFIX_TOKENS
    for mod in _both(kind):
        cls = getattr(mod, MODULES[kind][1])
        ix = cls(1, 2, draft_len=2**40, min_draft=2**40 - 1, max_draft=2**64, adaptive=True)
        assert ix.draft_len == cap
        ix.record(3, 1)
        assert ix.draft_len == cap and ix.stats["draft_len"] == cap
        assert pickle.loads(pickle.dumps(ix)).draft_len == cap


@pytest.mark.parametrize("kind", KINDS)
def test_acceptance_rate_is_the_same_double(kind):
    rates = set()
    for mod in _both(kind):
        ix = getattr(mod, MODULES[kind][1])(1)
        ix.record(6643791661235938878, 23378828344655645)
        rates.add(ix.stats["acceptance_rate"])
    assert rates == {float(23378828344655645) / float(6643791661235938878)}


@pytest.mark.parametrize("kind", KINDS)
def test_the_step_count_cannot_pass_int64(kind):
    """``record`` and a verified ``serve`` add a step: at int64's maximum they refuse
    (OverflowError), changing nothing, as a drafted total beyond int64 is refused."""
    for mod in _both(kind):
        cls = getattr(mod, MODULES[kind][1])
        calls = [lambda ix: ix.record(0, 0), lambda ix: ix.record(1, 1),
                 lambda ix: ix.serve([1], 1, 0), lambda ix: mod.record_batch([ix], [0], [0]),
                 lambda ix: mod.serve_batch([ix], [1], [0, 1], [1], [1]),
                 lambda ix: mod.serve_batch_lists([ix], [1], [0, 1], [2], [0])]
        for call in calls:
            ix = cls(1)
            ix.extend([1, 2, 1])
            ix._restore_stats((I64, 5, 2, 1))
            before = snapshot(ix, "ngram")
            with pytest.raises(OverflowError):
                call(ix)
            assert snapshot(ix, "ngram") == before
            assert ix.stats["steps"] == I64
        ix = cls(1)
        ix._restore_stats((I64, 5, 2, 1))
        assert ix.serve([1], 0, 0) == []      # nothing verified: no step, allowed
        ix = cls(1)
        ix._restore_stats((I64 - 1, 5, 2, 1))
        with pytest.raises(OverflowError):
            mod.record_batch([ix, ix], [0, 0], [0, 0])   # listed twice: two steps
        assert ix.stats["steps"] == I64 - 1
        ix.record(0, 0)
        assert pickle.loads(pickle.dumps(ix)).stats["steps"] == I64


@pytest.mark.parametrize("kind", KINDS)
def test_counts_beyond_int64_are_refused_and_limits_clipped(kind):
    """One rule per argument: a count (``proposed``, ``accepted``, ``drafted``) beyond
    int64 is refused (OverflowError), a scalar as one entry per index, as ``record`` and
    ``serve`` refuse it (a scalar used to be clipped and recorded as int64's maximum);
    one limit (``max_k``) beyond int64 means no limit, as ``propose(max_k)`` reads it,
    while one limit per index is an integer array like any other, each within int64."""
    for mod in _both(kind):
        cls = getattr(mod, MODULES[kind][1])
        for big in (2**63, 2**64, 10**30):
            for form in [big, [big]] + ([np.array([big], dtype=np.uint64)] if big < 2**64 else []):
                ix = cls(1)
                with pytest.raises(OverflowError):
                    mod.record_batch([ix], form, 0)
                with pytest.raises(OverflowError):
                    mod.serve_batch([ix], [], [0, 0], form, 0)
                with pytest.raises(OverflowError):
                    mod.serve_batch_lists([ix], [], [0, 0], form, 0)
                assert ix.stats["steps"] == 0
            with pytest.raises(OverflowError):
                cls(1).record(big, 0)
            with pytest.raises(OverflowError):
                cls(1).serve([], big, 0)
            ix = cls(1)
            ix.extend([1, 2, 3, 1, 2])
            assert ix.propose(big) == [3, 1, 2]
            assert mod.propose_batch([ix], big)[0].tolist() == [3, 1, 2]
            assert mod.serve_batch_lists([ix], [], [0, 0], 0, 0, big) == [[3, 1, 2]]
            for form in [[big]] + ([np.array([big], dtype=np.uint64)] if big < 2**64 else []):
                with pytest.raises(OverflowError):
                    mod.propose_batch([ix], form)
                with pytest.raises(OverflowError):
                    mod.serve_batch_lists([ix], [], [0, 0], 0, 0, form)
            if kind == "ngram":
                assert mod.longest_match_batch([1, 2, 1], [0, 3], 1, 1, big)[0].tolist() == [2, 1]


@pytest.mark.parametrize("kind", KINDS)
def test_a_spoofed_class_is_not_an_index(kind):
    """An object whose ``__class__`` claims the index class is refused (TypeError) by every
    batch call: ``isinstance`` believes it, the implementations must not."""
    for mod in _both(kind):
        cls = getattr(mod, MODULES[kind][1])

        class Fake:
            __class__ = property(lambda self: cls)  # noqa: A003

        f = Fake()
        calls = [lambda: mod.propose_batch([f]), lambda: mod.record_batch([f], [1], [0]),
                 lambda: mod.extend_batch([f], [1], [0, 1]), lambda: mod.serve_batch([f], [1], [0, 1], [0], [0]),
                 lambda: mod.serve_batch_lists([f], [1], [0, 1], [0], [0]), lambda: mod.propose_batch(f)]
        if kind == "suffix":
            calls.append(lambda: mod.propose_tree_batch([f], 3))
        for call in calls:
            with pytest.raises(TypeError):
                call()


def test_longest_match_batch_converts_its_tokens_last():
    """A conversion of ``offsets`` or ``max_k`` that rewrites the caller's token array
    (its dtype or its values) happens before the tokens are read, in both."""
    results = []
    for mod in _both("ngram"):
        got = []
        for how in ("retype", "values"):
            for slot in ("offsets", "max_k"):
                t = np.array([1, 2, 1, 2, 1, 2], dtype=np.int64)
                act = ((lambda t=t: setattr(t, "dtype", np.int32)) if how == "retype"
                       else (lambda t=t: t.__setitem__(slice(None), [3, 1, 3, 1, 3, 3])))
                h = HookInt(6 if how == "values" else 12) if slot == "offsets" else HookInt(3)
                h.action = act
                off = [0, h] if slot == "offsets" else [0, 6 if how == "values" else 12]
                got.append(outcome(lambda: mod.longest_match_batch(t, off, 1, 2, 3 if slot == "offsets" else h)))
        results.append(got)
    assert all(r == results[0] for r in results)
    assert all(o[0] == "ok" for o in results[0]), results[0]


def test_longest_match_reads_its_history_once():
    """A numpy history is converted once: the draft is cut from the converted copy (in
    the history's dtype), not by indexing the caller's object again."""

    class Spy(np.ndarray):
        reads = 0

        def __getitem__(self, i):
            type(self).reads += 1
            return np.ndarray.__getitem__(self, i)

    for mod in _both("ngram"):
        for dtype, cls in ((np.int64, Spy), (np.int32, Spy), (np.uint16, Spy), (">i8", np.ndarray),
                           (np.uint64, np.ndarray)):
            h = np.array([1, 2, 3, 1, 2], dtype=dtype).view(cls)
            Spy.reads = 0
            out = mod.longest_match(h, 1, 2, 3)
            assert Spy.reads == 0
            assert type(out) is np.ndarray and out.dtype == np.dtype(dtype) and out.tolist() == [3, 1, 2]
            empty = mod.longest_match(h, 3, 3, 3)
            assert type(empty) is np.ndarray and empty.dtype == np.dtype(dtype) and empty.size == 0


@pytest.mark.parametrize("kind", KINDS)
def test_tokens_cannot_be_written_through(kind):
    """``tokens`` is read-only for good: its WRITEABLE flag cannot be set back on a view
    of the index's buffer (the compiled n-gram index, and the suffix index once it holds
    int64, used to hand out one that could be, and then be rewritten)."""
    for mod in _both(kind):
        for hist in ([1, 2, 3, 1, 2, 3], [1, 2**40, 3, 1, 2**40, 3]):
            ix = getattr(mod, MODULES[kind][1])(1)
            ix.extend(hist)
            before = snapshot(ix, kind)
            v = ix.tokens
            assert not v.flags.writeable
            try:
                v.flags.writeable = True
                v[:] = 9
                v[1:].flags.writeable = True
            except ValueError:
                pass
            assert snapshot(ix, kind) == before


# --------------------------------------------------------------------------------------
# a self of another type
# --------------------------------------------------------------------------------------
FOREIGN_SELF = textwrap.dedent(
    """
    import inspect, sys
    from specfsm import _impl
    kind, mod, cls_name = sys.argv[1:4]
    cls = getattr(_impl.kernels(kind, mod), cls_name)
    twin = getattr(_impl.kernels("python", mod), cls_name)
    other = getattr(_impl.kernels(kind, "suffix_index" if mod == "ngram_index" else "ngram_index"),
                    "SuffixIndex" if cls_name == "NgramIndex" else "NgramIndex")
    # the members both implementations have: the twin's public ones and these
    names = sorted({n for n in dir(twin) if not n.startswith("_")}
                   | {"__init__", "__len__", "__repr__", "__reduce__", "_hold_guard", "_restore_stats"})
    # (the twin's methods shared by both kinds, defined once on their base class, take
    # an index of the other kind: only the compiled core is held to refusing it there)
    foreign = (object(), 12345, "x" * 200, [0] * 40) + ((other(1),) if kind == "compiled" else ())
    wrong = []
    for name in names:
        member = inspect.getattr_static(cls, name)
        for obj in foreign:
            for nargs in range(4):
                try:
                    if isinstance(member, property) or type(member).__name__ == "getset_descriptor":
                        if nargs:
                            break
                        member.__get__(obj, cls)
                    elif callable(member):
                        getattr(cls, name)(obj, *([1] * nargs))
                    else:
                        break
                except TypeError:
                    continue
                except BaseException as exc:
                    wrong.append(f"{cls_name}.{name} on {type(obj).__name__} with {nargs} args: "
                                 f"{type(exc).__name__}: {exc}")
                else:
                    wrong.append(f"{cls_name}.{name} on {type(obj).__name__} with {nargs} args: allowed")
    print("\\n".join(wrong))
    sys.exit(1 if wrong else 0)
    """
)


@pytest.mark.parametrize("impl_kind", ["compiled", "python"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_method_refuses_a_self_of_another_type(impl_kind, kind):
    """``NgramIndex.extend(obj, ...)`` and the like, ``obj`` not an index of that class (an
    object, an int, a string, the other index kind, a list): TypeError from every method
    and property (the compiled core used to read and write ``obj`` as an index, and
    crashed). Run in a subprocess, so a crash is a failure rather than a dead test run."""
    if impl_kind == "compiled" and pair(kind)[0] is None:
        pytest.skip("no compiled core")
    mod, cls_name = MODULES[kind]
    # the same specfsm as this run (the installed package in CI: from the checkout's root,
    # python -c would import the never-built sources there instead)
    proc = subprocess.run([sys.executable, "-c", FOREIGN_SELF, impl_kind, mod, cls_name], cwd=TESTS,
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


# --------------------------------------------------------------------------------------
# sequences that change between readings
# --------------------------------------------------------------------------------------
class Shifty(Sequence):
    """A sequence whose every reading (``len``, an item) gives different values; it counts
    its readings, item by item."""

    def __init__(self, n, base=0):
        self.n = n
        self.base = base
        self.reads: dict = {}
        self.given: dict = {}

    def __len__(self):
        self.reads["len"] = self.reads.get("len", 0) + 1
        return self.n + self.reads["len"] - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            raise TypeError("no slices")
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.reads[i] = self.reads.get(i, 0) + 1
        v = self.base + (i + self.reads[i]) % 3
        self.given[i] = v
        return v


def _changing_calls(kind):
    calls = {
        "extend": lambda m, ix, s: ix[0].extend(s),
        "serve": lambda m, ix, s: ix[0].serve(s, 0, 0, 3),
        "extend_batch(tokens)": lambda m, ix, s: m.extend_batch(ix[:1], s, [0, 4]),
        "serve_batch(tokens)": lambda m, ix, s: m.serve_batch(ix[:1], s, [0, 4], [0], [0], 3),
        "serve_batch_lists(tokens)": lambda m, ix, s: m.serve_batch_lists(ix[:1], s, [0, 4], [0], [0], 3),
        "propose_batch(max_k)": lambda m, ix, s: m.propose_batch(ix, s),
        "record_batch(proposed)": lambda m, ix, s: m.record_batch(ix, s, [0] * 4),
        "serve_batch(drafted)": lambda m, ix, s: m.serve_batch(ix, [], [0] * 5, s, [0] * 4),
        "serve_batch(max_k)": lambda m, ix, s: m.serve_batch(ix, [], [0] * 5, [0] * 4, [0] * 4, s),
        "serve_batch(offsets)": lambda m, ix, s: m.serve_batch(ix[:3], [1, 2, 1], s, [0] * 3, [0] * 3),
        "extend_batch(offsets)": lambda m, ix, s: m.extend_batch(ix[:3], [1, 2, 1], s),
        "indexes": lambda m, ix, s: m.propose_batch(_Indexes(ix)),
    }
    if kind == "ngram":
        calls["longest_match(history)"] = lambda m, ix, s: m.longest_match(s, 1, 2, 3)
        calls["longest_match_batch(tokens)"] = lambda m, ix, s: m.longest_match_batch(s, [0, 4], 1, 2, 3)
        calls["longest_match_batch(offsets)"] = lambda m, ix, s: m.longest_match_batch([1, 2, 1], s, 1, 2, 3)
    else:
        calls["lookup(context)"] = lambda m, ix, s: ix[0].lookup(s, 3)
        calls["propose_tree_batch(indexes)"] = lambda m, ix, s: m.propose_tree_batch(_Indexes(ix), 4)
    return calls


class _Indexes(Sequence):
    """A sequence of indexes that gives one more on every reading of its length."""

    def __init__(self, ixs):
        self.ixs = ixs
        self.lens = 0

    def __len__(self):
        self.lens += 1
        return min(self.lens, len(self.ixs))

    def __getitem__(self, i):
        if not 0 <= i < len(self.ixs):
            raise IndexError(i)
        return self.ixs[i]


CHANGING = [(k, label) for k in KINDS for label in _changing_calls(k)]


@pytest.mark.parametrize("kind,label", CHANGING, ids=[f"{k}-{lab}" for k, lab in CHANGING])
def test_a_changing_sequence_is_read_once(kind, label):
    """Every entry of a sequence argument is read at most once, and both implementations
    give the same outcome from what that one reading gave."""
    call = _changing_calls(kind)[label]
    got = []
    for mod in _both(kind):
        ixs = [build(mod, kind, {"args": (1, 3, "latest"), "kw": {}, "hist": [1, 2, 1, 2], "stats": None})
               for _ in range(4)]
        s = Shifty(4)
        res = outcome(lambda: call(mod, ixs, s))
        assert all(n == 1 for k, n in s.reads.items() if k != "len"), (label, s.reads)
        got.append((res, [snapshot(ix, kind) for ix in ixs], s.given))
    assert all(g == got[0] for g in got), got


@pytest.mark.parametrize("kind", KINDS)
def test_list_entries_that_rewrite_their_list(kind):
    """Entries whose conversion clears, grows or rewrites the very list being read, and
    arguments whose conversion rewrites the tokens passed before them."""
    for what in ("clear", "grow", "rewrite", "retype-other"):
        got = []
        for mod in _both(kind):
            ixs = [build(mod, kind, {"args": (1, 3, "latest"), "kw": {}, "hist": [1, 2, 1], "stats": None})
                   for _ in range(2)]
            results = []
            for make in range(5):
                lst = [1, 2, 1, 2, 1]
                arr = np.array([1, 2, 1, 2], dtype=np.int64)
                hook = HookInt(4 if make == 3 else 1)
                lst[2] = hook
                if what == "clear":
                    hook.action = lst.clear
                elif what == "grow":
                    hook.action = lambda lst=lst: lst.extend([7, 7, 7])
                elif what == "rewrite":
                    hook.action = lambda lst=lst: lst.__setitem__(slice(None), [9] * 5)
                else:
                    hook.action = lambda arr=arr: setattr(arr, "dtype", np.int32)
                call = [lambda: ixs[0].extend(lst),
                        lambda: ixs[0].serve(arr, 0, 0, hook),
                        lambda: mod.serve_batch(ixs, arr, [0, 2, 4], [0, 0], [0, 0], [3, hook]),
                        lambda: mod.extend_batch(ixs, arr, [0, 2, hook]),
                        lambda: mod.serve_batch_lists(ixs, lst, [0, 1, 5], [0, 0], [0, 0])][make]
                results.append(outcome(call))
            got.append((results, [snapshot(ix, kind) for ix in ixs]))
        assert all(g == got[0] for g in got), (what, got)
