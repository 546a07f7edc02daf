"""Hostile scenarios for the recycling table (``specfsm._core.recycling`` and its twin),
registered in ``runner.SCENARIOS`` by ``scenarios(runner)``.

``recycling_inputs`` (one thread): a compiled table and a twin table kept alike, every
method (``update``, ``row``, ``filled``, ``propose_tree``, ``propose_trees``, the
properties, pickling, a second ``__init__``) and ``tree_shape`` called on both with
arguments most of which are broken: extreme integers, every layout and dtype (lists,
tuples, numpy integers, int8 to uint64, big-endian, float, bool and object arrays,
strided, Fortran-order, 0-d, 3-D, subclassed arrays), rows of unequal length, and token
ids whose ``__index__`` updates the same table or rewrites the other arguments while they
are converted. The results, or the exception types, and the tables after every call must
be equal (strictly: a refusal the twin does not make is a mismatch); objects made with
``__new__`` and unbound calls with a ``self`` of another type must be refused.

``recycling_threads``: threads updating one shared table, growing trees from it one
root and a batch at a time, reading rows and properties and pickling it, while other
threads rewrite the caller's tokens, rows and roots with values that break every bound.
Every call returns or raises one of ``ALLOWED``; the table left at the end must hold
valid rows (every row distinct ids of the vocabulary followed by -1s).
"""

from __future__ import annotations

import pickle
import time

import numpy as np


def scenarios(runner):
    """The scenarios, bound to the runner module's helpers (``race``, ``EXTREME``)."""
    return {
        "recycling_inputs": lambda impl, rng, seconds: scenario_recycling_inputs(runner, impl, rng, seconds),
        "recycling_threads": lambda impl, rng, seconds: scenario_recycling_threads(runner, impl, rng, seconds),
    }


class _Sub(np.ndarray):
    """An ndarray subclass whose item access answers otherwise than its memory."""

    def __getitem__(self, key):
        return np.full(3, 2**31 - 7, dtype=np.int64)


_LAYOUTS = [None, "tuple", np.int64, np.int32, np.uint64, np.int8, np.uint16, ">i8", np.float64, np.bool_,
            object, "strided", "fortran", "subclass", "0d", "3d", "npints"]


def _layout(x, how):
    """``x`` (a list of ints, or of equal rows of ints) in layout ``how``."""
    if how is None:
        return [list(r) if isinstance(r, list) else r for r in x]
    if how == "tuple":
        return tuple(tuple(r) if isinstance(r, list) else r for r in x)
    if how == "npints":
        def npint(v):
            return np.int64(v) if -(2**63) <= v < 2**63 else v
        return [[npint(v) for v in r] if isinstance(r, list) else npint(r) for r in x]
    try:
        a = np.array(x, dtype=np.int64 if isinstance(how, str) and not how.startswith(">") else how)
    except (OverflowError, ValueError, TypeError):
        return list(x)
    if how == "strided":
        return np.repeat(a, 2, axis=-1)[..., ::2]
    if how == "fortran":
        return np.asfortranarray(a)
    if how == "subclass":
        return a.view(_Sub)
    if how == "0d":
        return np.array(x[0] if len(x) else 0)
    if how == "3d":
        return a.reshape((1,) + a.shape)
    return a


class _Hooked(np.int64):
    """A token id whose ``__index__`` runs ``action`` first (once)."""

    action = None

    def __index__(self):
        act, self.action = self.action, None
        if act is not None:
            act()
        return int(np.int64(self))


def _rows_of(t):
    """A table's rows, read through pickling (a refused read is its exception type)."""
    try:
        return t.__reduce__()[1][3].tolist(), t.updates
    except Exception as exc:  # noqa: BLE001 - compared as a type
        return type(exc).__name__


class _Pair:
    """A compiled and a twin table built alike, each call made on both and compared."""

    def __init__(self, runner, impl, vocab, k):
        self.runner, self.impl = runner, impl
        self.mods = [impl["recycling"]] + ([impl.twin["recycling"]] if impl.kind == "compiled" else [])
        self.tabs = [m.RecyclingTable(vocab, k) for m in self.mods]
        self.vocab, self.k = vocab, k

    def call(self, label, make, rng):
        """``make(module, table)`` -> (callable, args), each drawing from ``rng`` alike:
        the outcome on each table, compared."""
        state = rng.getstate()
        outs = []
        for m, t in zip(self.mods, self.tabs):
            rng.setstate(state)
            fn, args = make(m, t)
            got = self.runner.attempt(fn, *args)
            outs.append((got[0], self.runner.canon(got[1]) if got[0] == "ok" else got[1], _rows_of(t)))
        if len(outs) == 2 and outs[0] != outs[1]:
            self.impl.mismatches.append(f"{label}: compiled {self.runner.short(outs[0])}, "
                                        f"twin {self.runner.short(outs[1])}")
        return outs[0]


def _ints(runner, rng, vocab, n, broken):
    out = [rng.randrange(vocab) for _ in range(n)]
    if broken and n:
        out[rng.randrange(n)] = rng.choice(runner.EXTREME + [vocab, -1, vocab - 1])
    return out


def _update_args(runner, t, rng, vocab, broken):
    """``update``'s (tokens, topk): valid, or broken in one of many ways."""
    n = rng.randrange(0, 6)
    m = rng.randrange(0 if broken else 1, 6)
    tokens = _ints(runner, rng, vocab, n, broken)
    topk = [_ints(runner, rng, vocab, m, broken and rng.random() < 0.5) for _ in range(n)]
    if broken and topk and rng.random() < 0.3:
        topk[rng.randrange(len(topk))].append(0)         # rows of unequal length
    how = rng.choice(_LAYOUTS) if broken else rng.choice([None, np.int64, np.int32])
    tk, tp = _layout(tokens, how if rng.random() < 0.5 else None), _layout(topk, how)
    if broken and rng.random() < 0.2 and isinstance(tk, list) and tk:
        hooked = _Hooked(rng.randrange(vocab))            # updates the same table while converted
        hooked.action = lambda: t.update([0], [[rng.randrange(vocab)]])
        tk[-1] = hooked
    if broken and rng.random() < 0.1 and m:
        tp = [r[0] for r in topk]                         # one id per row
    return tk, tp


def _tree_args(runner, t, rng, vocab, broken, batch):
    """``propose_tree``'s (``batch``: ``propose_trees``'s) root(s) and limits."""
    limits = [rng.randrange(1, 40), None, None]
    if rng.random() < 0.5:
        limits[1] = rng.randrange(1, 8)
    if rng.random() < 0.5:
        limits[2] = rng.randrange(1, 40)
    if broken:
        limits[rng.randrange(3)] = rng.choice(runner.EXTREME + [0, -1, 1025, 2.0, True, "3", None])
    if not batch:
        root = rng.randrange(vocab) if not broken or rng.random() < 0.5 else rng.choice(
            runner.EXTREME + [vocab, -1, 1.0, True, None, np.int32(1), np.uint64(2**64 - 1)])
        if broken and rng.random() < 0.2:
            root = _Hooked(rng.randrange(vocab))              # updates the table while converted
            new = [[rng.randrange(vocab)]]
            root.action = lambda: t.update([int(np.int64(root))], new)
        return (root, *limits)
    roots = _ints(runner, rng, vocab, rng.randrange(0, 8), broken)
    how = rng.choice(_LAYOUTS) if broken else rng.choice([None, np.int64, np.int32])
    return (_layout(roots, how), *limits)


def _refusals(runner, impl, rng):
    """Objects made with ``__new__`` and unbound calls on a ``self`` of another type."""
    for mod in [impl["recycling"]]:
        cls = mod.RecyclingTable
        raw = cls.__new__(cls)
        for call in (lambda: raw.update([0], [[0]]), lambda: raw.propose_tree(0, 4), lambda: raw.row(0),
                     lambda: raw.propose_trees([0], 4), lambda: raw.filled(), lambda: raw.nbytes,
                     lambda: pickle.dumps(raw)):
            try:
                call()
            except RuntimeError:
                continue
            raise runner.Failure("a RecyclingTable made with __new__ allowed a call")
        if impl.kind != "compiled":
            continue
        for name in ("update", "row", "filled", "propose_tree", "propose_trees", "__reduce__", "_hold_guard"):
            for other in (object(), 7, [0] * 8, "x" * 64):
                try:
                    getattr(cls, name)(other, *([1] * rng.randrange(0, 3)))
                except TypeError:
                    continue
                raise runner.Failure(f"RecyclingTable.{name} took a self of type {type(other).__name__}")


def scenario_recycling_inputs(runner, impl, rng, seconds):
    end = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < end:
        rounds += 1
        vocab, k = rng.choice([1, 2, 5, 17]), rng.choice([1, 2, 3, 8, 32])
        pair = _Pair(runner, impl, vocab, k)
        for _ in range(rng.randrange(1, 12)):
            broken = rng.random() < 0.5
            what = rng.randrange(6)
            if what <= 1:
                pair.call("update", lambda m, t: (t.update, _update_args(runner, t, rng, vocab, broken)), rng)
            elif what == 2:
                pair.call("propose_tree",
                          lambda m, t: (t.propose_tree, _tree_args(runner, t, rng, vocab, broken, False)), rng)
            elif what == 3:
                pair.call("propose_trees",
                          lambda m, t: (t.propose_trees, _tree_args(runner, t, rng, vocab, broken, True)), rng)
            elif what == 4:
                token = rng.choice(runner.EXTREME + [0, vocab, vocab - 1, 1.5, True])
                pair.call("row", lambda m, t: (t.row, (token,)), rng)
                pair.call("filled", lambda m, t: (t.filled, ()), rng)
                pair.call("init", lambda m, t: (t.__init__, (vocab, k)), rng)
            else:
                limits = [rng.choice(runner.EXTREME + [0, 1, 2, 7, 33, 1024, 1025, 2.0, None]) for _ in range(3)]
                for i in range(3):
                    if rng.random() < 0.6:
                        limits[i] = rng.randrange(1, 33)
                pair.call("tree_shape", lambda m, t: (m.tree_shape, limits), rng)
        _refusals(runner, impl, rng)
    return rounds


def scenario_recycling_threads(runner, impl, rng, seconds):
    mod = impl["recycling"]
    vocab, k = 64, 4
    t = mod.RecyclingTable(vocab, k)
    t.update(np.arange(vocab), (np.arange(vocab)[:, None] + np.arange(k) * 7) % vocab)
    n = 48
    tokens = np.array([rng.randrange(vocab) for _ in range(n)], dtype=np.int64)
    tokens32 = tokens.astype(np.int32)
    topk = np.array([[rng.randrange(vocab) for _ in range(k + 2)] for _ in range(n)], dtype=np.int64)
    lasts = np.array([rng.randrange(vocab) for _ in range(32)], dtype=np.int64)
    calls = [
        lambda: t.update(tokens, topk),
        lambda: t.update(tokens32, topk[:, :2]),
        lambda: t.propose_tree(int(lasts[0]) % vocab, 24),
        lambda: t.propose_tree(3, 64, 5, 3),
        lambda: t.propose_trees(lasts, 32),
        lambda: t.propose_trees(lasts, 16, 3, 2),
        lambda: t.row(5),
        lambda: (t.filled(), t.updates, t.nbytes, repr(t)),
        lambda: pickle.loads(pickle.dumps(t)),
    ]
    runner.race(impl, seconds, calls, [tokens, tokens32, topk, lasts], rng, n_mutators=2)
    rows = t.__reduce__()[1][3]
    from specfsm.drafting._tree_checks import check_rows

    try:
        check_rows(rows, vocab, k)
    except ValueError as exc:
        raise runner.Failure(f"the table's rows broke their rule under threads: {exc}") from None
    return 1
