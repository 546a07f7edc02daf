"""The guard protocol (``_core/common/_guard.pxd``, twin ``specfsm/_guard.py``), checked
structurally for every guarded class on both implementations: the public methods and
properties are read from the twin class (``test_signatures.public_surface``), so a name
added to a class without the guard fails here.

For each class: while a writer holds the guard (``_hold_guard(True)``) every public
method and property, pickling and copying, and the module's batch calls over it raise
RuntimeError, and all of them work again once it is released; an instance made with
``__new__`` refuses every one of them; a second ``__init__`` is refused and changes
nothing; an ``__init__`` that failed leaves an instance that refuses every call.

A new guarded class is one row of ``GUARDED``.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

import inspect

from specfsm import _impl
from test_signatures import public_surface

#: sample positional arguments of the methods that need some (a row may add its own)
ARGS: dict[str, tuple] = {
    "extend": ([1, 2],),
    "append": (1,),
    "lookup": ([1],),
    "last_tokens": (2,),
    "record": (1, 0),
    "serve": ([1],),
    "propose_tree": (4,),
    # module-level batch calls, after the list of indexes
    "extend_batch": ([1], [0, 1]),
    "record_batch": ([1], [0]),
    "serve_batch": ([1], [0, 1], [0], [0]),
    "serve_batch_lists": ([1], [0, 1], [0], [0]),
    "propose_tree_batch": (4,),
    "update": ([1], [[2, 3]]),
    "row": (1,),
    "propose_trees": ([1, 2], 4),
}


@dataclass
class Guarded:
    """One guarded class: its kernel module, its name, how to build a ready instance
    (given the class), the arguments of a second ``__init__`` and of one that fails,
    sample arguments for its methods beyond ``ARGS``, what a snapshot reads beyond the
    properties, a call that changes a ready instance, and whether it pickles (one that
    does not refuses pickling and copying with TypeError once the guard lets it through)."""

    module: str
    name: str
    make: Callable[[type], Any]
    reinit: tuple = ()
    bad_init: tuple = ()
    args: dict[str, tuple] = field(default_factory=dict)
    reads: Callable[[Any], list] = lambda ix: [("len", len(ix)), ("propose", ix.propose(4))]
    change: Callable[[Any], Any] = lambda ix: ix.extend([5])
    pickles: bool = True


GUARDED = [
    Guarded("suffix_index", "SuffixIndex", lambda cls: _filled(cls(1, None, "latest")), (2, 4), (0,)),
    Guarded("ngram_index", "NgramIndex", lambda cls: _filled(cls(1, 3)), (2, 4), (0,)),
    Guarded("recycling", "RecyclingTable", lambda cls: _recycled(cls(8, 2)), (4, 2), (0,),
            args={"propose_tree": (1, 4)},
            reads=lambda t: [("rows", [t.row(i).tolist() for i in range(8)]), ("filled", t.filled()),
                             ("tree", [a.tolist() for a in t.propose_trees([1, 2, 3], 6)])],
            change=lambda t: t.update([5], [[1]])),
    Guarded("suffix_trie", "SuffixTrie", lambda cls: _counted(cls(4)), (3,), (1,),
            args={"extend": (1, [1, 2]), "close": (1,), "speculate": ([1, 2], 4)},
            reads=lambda t: [("drafts", [t.speculate(c, 4, 0, 0.0) for c in ([1], [2], [1, 2], [3])])],
            change=lambda t: t.extend(2, [5]), pickles=False),
]

#: the calls that pickle or copy (``_uses``)
PICKLING = ("pickle", "copy.copy", "copy.deepcopy")


def _recycled(t):
    t.update([1, 2, 3], [[2, 3], [3, 1], [5, 5]])
    return t


def _counted(t):
    t.extend(0, [1, 2, 1, 2, 3])
    t.extend(1, [2, 1])
    return t


def _filled(ix):
    ix.extend([1, 2, 3, 1, 2, 3, 1])
    ix.record(4, 2)
    return ix


def _surface(module: str, name: str) -> tuple[list[tuple[str, bool, int]], list[tuple[str, int]]]:
    """From the twin: the class's public methods and properties as ``(name,
    is_property, required positional arguments after self)`` (``__len__`` counts as
    public), and the module's functions over a sequence of its instances (first
    parameter ``indexes``) as ``(name, required arguments after it)``."""
    methods, properties = public_surface(module, name)
    members = [(p, True, 0) for p in sorted(properties)]
    for m, params in methods.items():
        if m == "__init__":
            continue
        pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        members.append((m, False, sum(p.default is p.empty for p in pos)))
    batch: list[tuple[str, int]] = []
    twin = _impl.kernels("python", module)
    for fname in twin.__all__:
        fn = getattr(twin, fname)
        if isinstance(fn, type) or not callable(fn):
            continue
        params = list(inspect.signature(fn).parameters.values())
        if params and params[0].name == "indexes":
            pos = [p for p in params[1:] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            batch.append((fname, sum(p.default is p.empty for p in pos)))
    assert members, f"no class {name} in the twin of {module}"
    return members, batch


def _uses(row: Guarded, mod, ix) -> dict[str, Callable[[], Any]]:
    """Every call to check on ``ix``: each public member from the stub, pickling,
    copying, and the module's batch calls over ``[ix]``."""
    members, batch = _surface(row.module, row.name)
    args = {**ARGS, **row.args}
    out: dict[str, Callable[[], Any]] = {}
    for name, prop, required in members:
        if prop:
            out[name] = lambda name=name: getattr(ix, name)
        elif name == "__len__":
            out[name] = lambda: len(ix)
        else:
            a = args.get(name, ())
            assert len(a) >= required, f"give {row.name}.{name} sample arguments in ARGS or the row"
            out[name] = lambda name=name, a=a: getattr(ix, name)(*a)
    for name, required in batch:
        a = args.get(name, ())
        assert len(a) >= required, f"give {row.module}.{name} sample arguments in ARGS or the row"
        out[f"{row.module}.{name}"] = lambda name=name, a=a: getattr(mod, name)([ix], *a)
    out["pickle"] = lambda: pickle.dumps(ix)
    out["copy.copy"] = lambda: copy.copy(ix)
    out["copy.deepcopy"] = lambda: copy.deepcopy(ix)
    return out


def _plain(v):
    if isinstance(v, np.ndarray):
        return ("array", v.tolist())
    if isinstance(v, dict):
        return sorted((k, _plain(x)) for k, x in v.items())
    return v


def _snapshot(row: Guarded, ix) -> list:
    """Everything a caller can read off ``ix`` (its properties, its length, a draft)."""
    members, _ = _surface(row.module, row.name)
    snap = [(name, _plain(getattr(ix, name))) for name, prop, _ in members if prop]
    return snap + row.reads(ix)


ROWS = [pytest.param(r, id=r.name) for r in GUARDED]


@pytest.mark.parametrize("row", ROWS)
def test_stub_names_exist_on_both_classes(impl, row):
    cls = getattr(impl.module(row.module), row.name)
    members, batch = _surface(row.module, row.name)
    missing = [n for n, _, _ in members if not hasattr(cls, n)]
    missing += [n for n, _ in batch if not hasattr(impl.module(row.module), n)]
    assert not missing and hasattr(cls, "_hold_guard"), missing


@pytest.mark.parametrize("row", ROWS)
def test_every_name_refuses_while_a_writer_holds_the_guard(impl, row):
    mod = impl.module(row.module)
    ix = row.make(getattr(mod, row.name))
    before = _snapshot(row, ix)
    uses = _uses(row, mod, ix)
    ix._hold_guard(True)
    try:
        allowed = []
        for name, use in uses.items():
            try:
                use()
            except RuntimeError as exc:
                assert row.name in str(exc), (name, str(exc))
            else:
                allowed.append(name)
        assert not allowed, f"allowed while a writer holds the guard: {allowed}"
        with pytest.raises(RuntimeError):
            ix._hold_guard(True)              # a second writer is refused like any other
    finally:
        ix._hold_guard(False)
    assert _snapshot(row, ix) == before  # nothing refused changed anything
    for name, use in uses.items():       # released: every call works again
        if name in PICKLING and not row.pickles:
            with pytest.raises(TypeError, match="cannot be pickled"):
                use()
        else:
            use()


@pytest.mark.parametrize("row", ROWS)
def test_new_made_instance_refuses_every_call(impl, row):
    mod = impl.module(row.module)
    cls = getattr(mod, row.name)
    raw = cls.__new__(cls)
    allowed = []
    for name, use in _uses(row, mod, raw).items():
        try:
            use()
        except RuntimeError as exc:
            assert "not initialised" in str(exc) or "only once" in str(exc), (name, str(exc))
        else:
            allowed.append(name)
    assert not allowed, f"allowed on an instance made with __new__: {allowed}"
    assert row.name in repr(raw)         # repr still works, and says so
    with pytest.raises(RuntimeError):
        raw._hold_guard(True)


@pytest.mark.parametrize("row", ROWS)
def test_second_init_is_refused_and_changes_nothing(impl, row):
    cls = getattr(impl.module(row.module), row.name)
    ix = row.make(cls)
    before = _snapshot(row, ix)
    with pytest.raises(RuntimeError, match="only once"):
        ix.__init__(*row.reinit)
    with pytest.raises(RuntimeError, match="only once"):
        ix.__init__(*row.bad_init)       # refused before its arguments are even checked
    assert _snapshot(row, ix) == before
    row.change(ix)                        # and the instance is still usable


@pytest.mark.parametrize("row", ROWS)
def test_failed_init_leaves_an_instance_that_refuses_every_call(impl, row):
    mod = impl.module(row.module)
    cls = getattr(mod, row.name)
    raw = cls.__new__(cls)
    with pytest.raises((TypeError, ValueError)):
        raw.__init__(*row.bad_init)
    allowed = []
    for name, use in _uses(row, mod, raw).items():
        try:
            use()
        except RuntimeError:
            pass
        else:
            allowed.append(name)
    assert not allowed, f"allowed after a failed __init__: {allowed}"
    with pytest.raises(RuntimeError, match="only once"):
        raw.__init__(*row.reinit)
