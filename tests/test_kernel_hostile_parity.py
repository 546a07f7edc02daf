"""The kernels of ``accept``, ``prefix``, ``settle``, ``place``, ``tree``, ``ngram``,
``recycling`` (``tree_shape`` and every method of ``RecyclingTable``, the tables left
after each call compared too) and ``suffix_trie`` (every method of ``SuffixTrie`` and
the batches ``extend_tries`` and ``speculate_tries``, the tries left after each call
compared too) under hostile arguments: the compiled module and its twin, side by side in one process
(``specfsm._impl.kernels``), must return equal results (values, shapes, dtypes and the
caller's arrays after the call) or raise the same exception type, which must be a clean
one (TypeError, ValueError, IndexError, OverflowError, RuntimeError, IllegalTransition).

Every argument of every public function is fed, one or several at a time: extreme int64
values (and just past them, and huge Python ints), every layout and dtype (lists,
tuples, other sequences, ndarray subclasses, strided, Fortran-order, 0-d and 2-D arrays,
int8 to uint64, big-endian, float, bool and object arrays, read-only arrays), scalars of
every kind for counts and flags, and conversion callbacks (``__index__``, ``__float__``,
``__bool__``) that rewrite the other arguments after they were passed. Without a compiled
core (or with ``SPECFSM_NO_EXTENSIONS``) the twin runs alone and must still refuse
cleanly. Then targeted tests: one rule per argument where the two used to differ, the
twin's probability-row sums in the compiled order, a Generator subclass whose draw
rewrites the probabilities already checked, a numpy history read once by
``prompt_lookup``, ``sample_tree_batch`` with arguments that change on every read, and
a finalizer that resizes the caller's arrays in place while a compiled call checks them.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specfsm import _impl
from specfsm.errors import IllegalTransition

import hostile_values as hv
from hostile_values import EXTREME, I64, Sub, offsets, pair
from test_suffix_trie import liar

ALLOWED = hv.CLEAN + (IllegalTransition,)
SETTINGS = hv.hostile_settings(120)

#: the public kernels of each module in scope, as this file drives them
FUNCTIONS = {
    "accept": {"check_probs", "exact_batch", "min_run_batch", "speculative_batch", "typical_batch"},
    "prefix": {"common_prefix"},
    "settle": {"settle"},
    "place": {"place_rows", "settle_index"},
    "tree": {"check_tree", "accept_tree", "accept_tree_batch", "place_path", "place_path_batch"},
    "ngram": {"prompt_lookup"},
    "recycling": {"tree_shape", "RecyclingTable"},
    "suffix_trie": {"SuffixTrie", "extend_tries", "speculate_tries"},
}


# --------------------------------------------------------------------------------------
# outcomes
# --------------------------------------------------------------------------------------
def norm(x):
    return hv.norm(x, repr_floats=True)  # NaN equals NaN


def outcome(fn, args, watch=()):
    """("ok", result, watched arguments after the call) or ("raised", exception type,
    watched arguments); an exception outside ALLOWED fails the test."""
    got = hv.outcome(lambda: fn(*args), ALLOWED, repr_floats=True, what=f"{fn.__module__}.{fn.__name__}")
    return got + (tuple(norm(args[i]) for i in watch),)


def same(module, fn_name, make, watch=()):
    """Call ``fn_name`` of both implementations on fresh arguments from ``make()``; the
    outcomes must be equal (the twin alone when there is no compiled core)."""
    compiled, twin = pair(module)
    want = outcome(getattr(twin, fn_name), make(), watch)
    if compiled is not None:
        got = outcome(getattr(compiled, fn_name), make(), watch)
        assert got == want, (f"{module}.{fn_name}: compiled {got!r}\n twin {want!r}\n"
                             f"arguments {_show(make())}")
    return want


def _show(args):
    out = []
    for a in args:
        try:
            text = f"{type(a).__name__} {a!r}"
        except Exception:  # noqa: BLE001 - a hostile object's repr
            text = type(a).__name__
        out.append(text if not isinstance(a, Hook) else f"Hook({a.value!r})")
    return ", ".join(out)


# --------------------------------------------------------------------------------------
# hostile arguments (the layouts and hooks: hostile_values)
# --------------------------------------------------------------------------------------
class Hook(hv.Hook):
    """An integer-, float- and bool-like scalar whose conversion runs ``action`` first."""

    def __float__(self):
        self.action()
        return float(self.value)

    def __bool__(self):
        self.action()
        return bool(self.value)


ints = st.one_of(st.integers(-3, 12), st.sampled_from(EXTREME))
scalars = st.one_of(ints, st.sampled_from(hv.scalar_pool()))


def int_seq(valid):
    """A factory for one sequence argument: ``valid`` as it is, edited with extreme
    values, random, or a scalar in its place; in any layout."""
    # the pool holds lists and arrays: never shared
    return hv.sequence_arg(valid, ints, scalars, plain="int64", fresh=copy.deepcopy)


@st.composite
def scalar_arg(draw, valid):
    kind = draw(st.sampled_from(["valid", "valid", "other"]))
    s = valid if kind == "valid" else draw(scalars)
    return lambda: copy.deepcopy(s)


@st.composite
def hooks(draw, n_args, scalar_slots, seq_slots):
    """Which conversions rewrite which arguments: [(kind, slot, target, how)]."""
    out = []
    for _ in range(draw(st.integers(0, 2))):
        kinds = (["scalar"] if scalar_slots else []) + (["entry"] if seq_slots else [])
        if not kinds:
            break
        kind = draw(st.sampled_from(kinds))
        slot = draw(st.sampled_from(scalar_slots if kind == "scalar" else seq_slots))
        out.append((kind, slot, draw(st.integers(0, n_args - 1)),
                    draw(st.sampled_from(["max", "min", "reshape", "retype"]))))
    return out


def maker(factories, armed=()):
    """``make()``: fresh arguments from the factories, with the hooks in ``armed`` set so
    that converting one argument rewrites another (in the same fresh set)."""
    return hv.maker(factories, armed, hookable=_hookable, hook=Hook, nan_for_max=True)


def _hookable(x):
    return type(x) in (int, float, bool) and not (type(x) is float and x != x)


# --------------------------------------------------------------------------------------
# valid inputs
# --------------------------------------------------------------------------------------
@st.composite
def ragged(draw, vocab):
    lens = draw(st.lists(st.integers(0, 4), min_size=0, max_size=4))
    off = offsets(lens)
    draft = draw(st.lists(st.integers(0, vocab - 1), min_size=off[-1], max_size=off[-1]))
    choices = [x if draw(st.booleans()) else draw(st.integers(0, vocab - 1)) for x in draft]
    return draft, choices, off


@st.composite
def prob_rows(draw, n, v):
    """A factory for an N x V probability argument: valid rows in many layouts and
    dtypes, or broken ones."""
    seed = draw(st.integers(0, 2**32 - 1))
    p = np.random.default_rng(seed).random((n, v)) + 1e-3
    p /= p.sum(axis=1, keepdims=True)
    how = draw(st.sampled_from(["f64", "f64", "f32", "f16", "longdouble", "F", "strided", "be",
                                "list", "int", "bool", "object", "complex", "1d", "3d", "T",
                                "nan", "neg", "sum", "readonly", "subclass", "empty_v", "rows+1"]))

    def make():
        a = p.copy()
        if how == "f32":
            return a.astype(np.float32)
        if how == "f16":
            return a.astype(np.float16)
        if how == "longdouble":
            return a.astype(np.longdouble)
        if how == "F":
            return np.asfortranarray(a)
        if how == "strided":
            return np.repeat(a, 2, axis=1)[:, ::2]
        if how == "be":
            return a.astype(">f8")
        if how == "list":
            return a.tolist()
        if how in ("int", "bool", "object", "complex"):
            return a.astype({"int": np.int64, "bool": np.bool_, "object": object, "complex": np.complex128}[how])
        if how == "1d":
            return a.reshape(-1)
        if how == "3d":
            return a[None]
        if how == "T":
            return np.ascontiguousarray(a.T).T
        if how in ("nan", "neg", "sum") and a.size:
            a[-1, -1] = {"nan": np.nan, "neg": -0.5, "sum": 0.9}[how]
        if how == "readonly":
            a.flags.writeable = False
        if how == "subclass":
            return a.view(Sub)
        if how == "empty_v":
            return np.zeros((n, 0))
        if how == "rows+1":
            return np.vstack([a, np.full((1, v), 1.0 / v)])
        return a

    return make


def _tree(draw, n):
    parents = [draw(st.integers(-1, i - 1)) if i else -1 for i in range(n)]
    tokens = [100 + i for i in range(n)]
    return tokens, parents


# --------------------------------------------------------------------------------------
# every public kernel, every argument
# --------------------------------------------------------------------------------------
def test_every_public_kernel_is_driven():
    for name, driven in FUNCTIONS.items():
        twin = _impl.kernels("python", name)
        public = {n for n in twin.__all__ if callable(getattr(twin, n))}
        assert public == driven, name
        compiled, _ = pair(name)
        if compiled is not None:
            assert set(compiled.__all__) == set(twin.__all__), name


@SETTINGS
@given(data=st.data())
def test_exact_and_min_run_batch(data):
    draft, choices, off = data.draw(ragged(8))
    f = [data.draw(int_seq(draft)), data.draw(int_seq(choices)), data.draw(int_seq(off))]
    armed = data.draw(hooks(3, [], [0, 1, 2]))
    same("accept", "exact_batch", maker(f, armed))
    fm = f + [data.draw(scalar_arg(data.draw(st.sampled_from([0, 1, 2, 5] + EXTREME))))]
    armed = data.draw(hooks(4, [3], [0, 1, 2]))
    same("accept", "min_run_batch", maker(fm, armed))


@SETTINGS
@given(data=st.data())
def test_speculative_batch(data):
    v = data.draw(st.integers(1, 6))
    draft, _, off = data.draw(ragged(v))
    n, b = len(draft), len(off) - 1
    u = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).random(n + b) * 0.999
    u_how = data.draw(st.sampled_from(["array", "array", "gen", "f32", "list", "2d", "strided", "int",
                                       "bool", "short", "long", "one", "nan", "neg", "big"]))

    def uniforms():
        if u_how == "gen":
            return np.random.default_rng(5)
        a = u.copy()
        return {"array": a, "f32": a.astype(np.float32), "list": a.tolist(), "2d": a[None],
                "strided": np.repeat(a, 2)[::2], "int": a.astype(np.int64), "bool": a > 0.5,
                "short": a[:-1], "long": np.append(a, 0.5), "one": np.array(0.5),
                "nan": np.full_like(a, np.nan), "neg": -a - 0.1, "big": a.astype(">f8")}[u_how]

    q_kind = data.draw(st.sampled_from(["none", "none", "rows"]))
    f = [data.draw(int_seq(draft)), data.draw(int_seq(off)), data.draw(prob_rows(n, v)),
         (lambda: None) if q_kind == "none" else data.draw(prob_rows(n, v)), uniforms,
         data.draw(scalar_arg(True))]
    armed = data.draw(hooks(6, [5], [0, 1]))
    same("accept", "speculative_batch", maker(f, armed))


@SETTINGS
@given(data=st.data())
def test_typical_batch_and_check_probs(data):
    v = data.draw(st.integers(1, 6))
    draft, _, off = data.draw(ragged(v))
    n = len(draft)
    reals = st.sampled_from([0.09, 0.3, 0.0, -0.1, float("inf"), float("nan"), 1e308, 10**400, True,
                             np.float32(0.5), np.int64(1), None, "0.1"])
    f = [data.draw(int_seq(draft)), data.draw(int_seq(off)), data.draw(prob_rows(n, v)),
         data.draw(scalar_arg(0.09)) if data.draw(st.booleans()) else (lambda r=data.draw(reals): r),
         data.draw(scalar_arg(0.3)) if data.draw(st.booleans()) else (lambda r=data.draw(reals): r),
         data.draw(scalar_arg(True))]
    armed = data.draw(hooks(6, [3, 4, 5], [0, 1]))
    same("accept", "typical_batch", maker(f, armed))
    name = data.draw(st.sampled_from(["probs", "p", None, 5, b"x"]))
    same("accept", "check_probs", maker([data.draw(prob_rows(n, v)), lambda: name]))


@SETTINGS
@given(data=st.data())
def test_common_prefix(data):
    a = data.draw(st.lists(st.integers(0, 3), max_size=8))
    b = a[: data.draw(st.integers(0, len(a)))] + data.draw(st.lists(st.integers(0, 3), max_size=4))
    f = [data.draw(int_seq(a)), data.draw(int_seq(b))]
    same("prefix", "common_prefix", maker(f))


@SETTINGS
@given(data=st.data())
def test_settle(data):
    k = data.draw(st.integers(0, 6))
    attempted = data.draw(st.sampled_from(["accept", "accept", None, 5, b"accept", ["accept"]]))
    f = [data.draw(scalar_arg(k)), data.draw(scalar_arg(data.draw(st.integers(0, k + 1)))),
         data.draw(scalar_arg(data.draw(st.integers(0, k + 1)))), data.draw(scalar_arg(k)),
         lambda: attempted]
    armed = data.draw(hooks(5, [0, 1, 2, 3], []))
    same("settle", "settle", maker(f, armed))


@SETTINGS
@given(data=st.data())
def test_place_rows_and_settle_index(data):
    B, K, R = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 4)), data.draw(st.integers(0, 3))
    dtype = data.draw(st.sampled_from([np.float32, np.int64, np.uint8, np.complex64]))
    index = [data.draw(st.integers(-1, K - 1)) for _ in range(B)]
    src_how = data.draw(st.sampled_from(["ok", "ok", "ok", "F", "1d", "other_dtype", "object", "dst_ro",
                                         "dst_shape", "list"]))

    def src():
        s = np.arange(B * K * R, dtype=np.int64).astype(dtype).reshape(B, K, R)
        if src_how == "F":
            return np.asfortranarray(s)
        if src_how == "1d":
            return s.reshape(-1)
        if src_how == "object":
            return s.astype(object)
        if src_how == "list":
            return s.tolist()
        return s

    def dst():
        d = np.full((B, R), 7, dtype=np.float64 if src_how == "other_dtype" else dtype)
        if src_how == "dst_ro":
            d.flags.writeable = False
        if src_how == "dst_shape":
            return np.zeros((B + 1, R), dtype=dtype)
        return d

    f = [src, data.draw(int_seq(index)), dst]
    armed = data.draw(hooks(3, [], [1]))
    same("place", "place_rows", maker(f, armed), watch=(2,))
    acc = [data.draw(st.integers(0, 3)) for _ in range(B)]
    lens = [a + data.draw(st.integers(0, 2)) for a in acc]
    f = [data.draw(int_seq(acc)), data.draw(int_seq(lens))]
    armed = data.draw(hooks(2, [], [0, 1]))
    same("place", "settle_index", maker(f, armed))


@SETTINGS
@given(data=st.data())
def test_tree_acceptance(data):
    n = data.draw(st.integers(1, 6))
    tokens, parents = _tree(data.draw, n)
    rows = [data.draw(st.sampled_from(tokens + [1, 2])) for _ in range(n + 1)]
    f = [data.draw(int_seq(tokens)), data.draw(int_seq(parents))]
    same("tree", "check_tree", maker(f, data.draw(hooks(2, [], [0, 1]))))
    f3 = f + [data.draw(int_seq(rows))]
    same("tree", "accept_tree", maker(f3, data.draw(hooks(3, [], [0, 1, 2]))))
    B = data.draw(st.integers(0, 3))
    trees = [_tree(data.draw, data.draw(st.integers(1, 4))) for _ in range(B)]
    t = [x for tr in trees for x in tr[0]]
    p = [x for tr in trees for x in tr[1]]
    off = offsets(len(tr[0]) for tr in trees)
    r = [data.draw(st.sampled_from(t + [1])) if t else 1 for _ in range(len(t) + B)]
    f4 = [data.draw(int_seq(t)), data.draw(int_seq(p)), data.draw(int_seq(off)), data.draw(int_seq(r))]
    same("tree", "accept_tree_batch", maker(f4, data.draw(hooks(4, [], [0, 1, 2, 3]))))


@SETTINGS
@given(data=st.data())
def test_tree_placement(data):
    L = data.draw(st.integers(1, 7))
    base = data.draw(st.integers(0, L - 1))
    room = L - 1 - base
    path = sorted(data.draw(st.sets(st.integers(0, max(room - 1, 0)), max_size=room))) if room else []
    cache_how = data.draw(st.sampled_from(["ok", "ok", "ok", "F", "ro", "object", "0d", "list", "3d"]))

    def cache(shape=(L, 3)):
        c = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
        if cache_how == "F":
            return np.asfortranarray(c) if c.ndim > 1 and c.shape[-1] > 1 else c[..., None][..., [0, 0]].T
        if cache_how == "ro":
            c.flags.writeable = False
        if cache_how == "object":
            return c.astype(object)
        if cache_how == "0d":
            return np.array(1.0)
        if cache_how == "list":
            return c.tolist()
        if cache_how == "3d":
            return c[None]
        return c

    f = [cache, data.draw(scalar_arg(base)), data.draw(int_seq(path))]
    same("tree", "place_path", maker(f, data.draw(hooks(3, [1], [2]))), watch=(0,))
    B = data.draw(st.integers(0, 3))
    bases = [data.draw(st.integers(0, L - 1)) for _ in range(B)]
    paths = [sorted(data.draw(st.sets(st.integers(0, max(L - 2 - b, 0)), max_size=L - 1 - b))) if L - 1 - b else []
             for b in bases]
    flat = [x for pth in paths for x in pth]
    off = offsets(len(pth) for pth in paths)
    f = [lambda: cache((B, L, 2)), data.draw(int_seq(bases)), data.draw(int_seq(flat)), data.draw(int_seq(off))]
    same("tree", "place_path_batch", maker(f, data.draw(hooks(4, [], [1, 2, 3]))), watch=(0,))


@SETTINGS
@given(data=st.data())
def test_prompt_lookup(data):
    h = data.draw(st.lists(st.integers(0, 3), max_size=12))
    f = [data.draw(int_seq(h)), data.draw(scalar_arg(data.draw(st.integers(0, 3)))),
         data.draw(scalar_arg(data.draw(st.integers(0, 5))))]
    same("ngram", "prompt_lookup", maker(f, data.draw(hooks(3, [1, 2], [0]))))


@SETTINGS
@given(data=st.data())
def test_tree_shape(data):
    f = [data.draw(scalar_arg(data.draw(st.integers(1, 40)))) for _ in range(2)]
    f.append(data.draw(scalar_arg(data.draw(st.integers(1, 8)))))
    same("recycling", "tree_shape", maker(f, data.draw(hooks(3, [0, 1, 2], []))))


def _table_rows(t):
    return norm((t.__reduce__()[1][3], t.updates))


def same_table(setup, method, make, watch=(), module="recycling", after=_table_rows):
    """``method`` of an object of each implementation of ``module`` made by
    ``setup(module)``, on fresh arguments from ``make()``: equal outcomes and equal
    objects after, as ``after`` reads them (the twin alone when there is no compiled
    core)."""
    compiled, twin = pair(module)
    outs = []
    for mod in (twin, compiled):
        if mod is not None:
            t = setup(mod)
            outs.append(outcome(getattr(t, method), make(), watch) + (after(t),))
    assert all(o == outs[0] for o in outs), (f"{module}.{method}: compiled {outs[-1]!r}\n twin {outs[0]!r}\n"
                                             f"arguments {_show(make())}")
    return outs[0]


@st.composite
def topk_arg(draw, rows, m):
    """A factory for ``update``'s rows: valid (a list of rows, or a 2-D array in some
    layout), one id per row (any 1-D layout), or broken."""
    how = draw(st.sampled_from(["list", "tuple", "int64", "int32", "uint8", "be", "F", "strided", "float",
                                "bool", "object", "3d", "ragged", "1d", "empty"]))
    if how == "1d":
        return draw(int_seq([r[0] for r in rows]))
    conv = {"int64": np.int64, "int32": np.int32, "uint8": np.uint8, "be": ">i8", "float": np.float64,
            "bool": np.bool_, "object": object}

    def make():
        if how in ("list", "ragged"):
            out = [list(r) for r in rows]
            if how == "ragged" and out:
                out[-1].append(0)
            return out
        if how == "tuple":
            return tuple(tuple(r) for r in rows)
        a = np.array(rows, dtype=np.int64).reshape(len(rows), m)
        if how in conv:
            return a.astype(conv[how])
        if how == "F":
            return np.asfortranarray(a)
        if how == "strided":
            return np.repeat(a, 2, axis=1)[:, ::2]
        if how == "3d":
            return a[None]
        return a[:, :0]

    return make


@SETTINGS
@given(data=st.data())
def test_recycling_table(data):
    vocab, k = data.draw(st.sampled_from([1, 3, 12])), data.draw(st.sampled_from([1, 2, 8]))
    ids = st.integers(0, vocab - 1)
    seed_rows = data.draw(st.lists(st.lists(ids, min_size=k + 1, max_size=k + 1), max_size=4))

    def setup(mod):
        t = mod.RecyclingTable(vocab, k)
        t.update(list(range(len(seed_rows))) if vocab >= len(seed_rows) else [0] * len(seed_rows), seed_rows)
        return t

    n, m = data.draw(st.integers(0, 4)), data.draw(st.integers(1, 4))
    tokens = data.draw(st.lists(ids, min_size=n, max_size=n))
    rows = data.draw(st.lists(st.lists(ids, min_size=m, max_size=m), min_size=n, max_size=n))
    f = [data.draw(int_seq(tokens)), data.draw(topk_arg(rows, m))]
    same_table(setup, "update", maker(f, data.draw(hooks(2, [], [0]))))
    root = data.draw(st.one_of(ids, st.sampled_from(EXTREME)))
    limits = [data.draw(scalar_arg(data.draw(st.integers(1, 30))))]
    limits += [data.draw(scalar_arg(data.draw(st.one_of(st.none(), st.integers(1, 6))))) for _ in range(2)]
    same_table(setup, "propose_tree", maker([data.draw(scalar_arg(root))] + limits,
                                           data.draw(hooks(4, [0, 1, 2, 3], []))))
    roots = data.draw(st.lists(ids, max_size=5))
    same_table(setup, "propose_trees", maker([data.draw(int_seq(roots))] + limits,
                                            data.draw(hooks(4, [1, 2, 3], [0]))))
    same_table(setup, "row", maker([data.draw(scalar_arg(root))]))


def _trie_state(t):
    """What a caller can read off a trie: its counts and the drafts of a few contexts."""
    drafts = [t.speculate(c, t.depth, f, 0.0) for c in ([0], [1], [0, 1], [2, 1, 0]) for f in (0, 1.5)]
    return norm((len(t), t.n_nodes, t.open_sequences, t.nbytes, repr(t), drafts))


@SETTINGS
@given(data=st.data())
def test_suffix_trie(data):
    depth, ties = data.draw(st.sampled_from([2, 3, 8])), data.draw(st.sampled_from(["first", "last"]))
    toks = st.lists(st.integers(0, 3), max_size=8)
    fed = data.draw(st.lists(toks, max_size=3))

    def setup(mod):
        t = mod.SuffixTrie(depth, ties)
        for i, s in enumerate(fed):
            t.extend(i, s)
        return t

    def trie_call(method, factories, armed):
        same_table(setup, method, maker(factories, armed), module="suffix_trie", after=_trie_state)

    seq = data.draw(scalar_arg(data.draw(st.integers(-1, 3))))
    trie_call("extend", [seq, data.draw(int_seq(data.draw(toks)))], data.draw(hooks(2, [0], [1])))
    trie_call("close", [seq], data.draw(hooks(1, [0], [])))
    f = [data.draw(int_seq(data.draw(toks))), data.draw(scalar_arg(data.draw(st.integers(0, 10)))),
         data.draw(scalar_arg(data.draw(st.sampled_from([0, 0.0, 0.5, 1, 1.5, 2.5])))),
         data.draw(scalar_arg(data.draw(st.sampled_from([0, 0.0, 0.1, 0.5, 1.0]))))]
    trie_call("speculate", f, data.draw(hooks(4, [1, 2, 3], [0])))


@st.composite
def tries_arg(draw, pool, n):
    """A factory for a batch's ``tries`` (or ``others``) over the tries of ``pool`` (a
    list that ``same_tries`` fills with one implementation's tries before each call),
    valid (repeats included) or broken, and the count of valid rows."""
    idx = draw(st.lists(st.integers(0, n - 1), max_size=5))
    how = draw(st.sampled_from(["list"] * 6 + ["tuple", "entry", "liar", "raw", "one", "gen", "none"]))

    def make():
        rows = [pool[i] for i in idx]
        cls = type(pool[0])
        broken = {"tuple": lambda: tuple(rows), "entry": lambda: rows[1:] + [5], "liar": lambda: [liar(cls)] + rows[1:],
                  "raw": lambda: rows[:-1] + [cls.__new__(cls)], "one": lambda: pool[0], "gen": lambda: iter(rows),
                  "none": lambda: None}
        return broken[how]() if how in broken else rows

    return make, len(idx)


def same_tries(setup, pool, fn_name, make, watch=()):
    """``fn_name`` of each implementation of ``suffix_trie`` on the tries ``setup(module)``
    makes (put in ``pool``, which ``make``'s factories read) and fresh arguments from
    ``make()``: equal outcomes and equal tries after."""
    compiled, twin = pair("suffix_trie")
    outs = []
    for mod in (twin, compiled):
        if mod is not None:
            pool[:] = setup(mod)
            tries = list(pool)
            outs.append(outcome(getattr(mod, fn_name), make(), watch) + (tuple(_trie_state(t) for t in tries),))
    assert all(o == outs[0] for o in outs), (f"suffix_trie.{fn_name}: compiled {outs[-1]!r}\n twin {outs[0]!r}\n"
                                             f"arguments {_show(make())}")
    return outs[0]


@SETTINGS
@given(data=st.data())
def test_suffix_trie_batches(data):
    settings = data.draw(st.lists(st.tuples(st.sampled_from([2, 3, 8]), st.sampled_from(["first", "last"])),
                                  min_size=1, max_size=3))
    toks = st.lists(st.integers(0, 3), max_size=6)
    fed = data.draw(st.lists(toks, max_size=3))
    pool: list = []

    def setup(mod):
        out = [mod.SuffixTrie(d, ties) for d, ties in settings]
        for j, t in enumerate(out):
            for i, s in enumerate(fed[j:]):
                t.extend(i, s)
        return out

    tries, b = data.draw(tries_arg(pool, len(settings)))
    seqs = [data.draw(st.integers(-1, 3)) for _ in range(b)]
    rows = [data.draw(toks) for _ in range(b)]
    off = offsets(len(r) for r in rows)
    f = [tries, data.draw(int_seq(seqs)), data.draw(int_seq([t for r in rows for t in r])), data.draw(int_seq(off))]
    same_tries(setup, pool, "extend_tries", maker(f, data.draw(hooks(4, [], [1, 2, 3]))))
    others, _ = data.draw(tries_arg(pool, len(settings)))
    ks = [data.draw(st.integers(0, 10)) for _ in range(b)]
    max_k = data.draw(st.one_of(scalar_arg(data.draw(st.integers(0, 10))), int_seq(ks)))
    f = [tries, data.draw(int_seq(seqs)), max_k, others,
         data.draw(scalar_arg(data.draw(st.sampled_from([0, 0.0, 0.5, 1, 1.5, 2.5])))),
         data.draw(scalar_arg(data.draw(st.sampled_from([0, 0.0, 0.1, 0.5, 1.0]))))]
    same_tries(setup, pool, "speculate_tries", maker(f, data.draw(hooks(6, [2, 4, 5], [1, 2]))))


# --------------------------------------------------------------------------------------
# one rule per argument, where the two implementations used to differ
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("m", [2**63, 2**64, 10**30, np.uint64(2**64 - 1), I64])
def test_min_run_batch_takes_any_count(m):
    """A run can never reach a count beyond the longest draft: every huge ``m`` answers
    as a count just past it does (the compiled module used to overflow a C integer)."""
    out = same("accept", "min_run_batch", lambda: [[1, 2, 3], [1, 2, 3], [0, 3], m])
    assert out[0] == "ok" and out[1][1][1][4] == [0]


@pytest.mark.parametrize("args, exc", [
    ((1.0, 1, 1, 1, "accept"), TypeError),
    ((2, 1, 2.5, 2, "accept"), TypeError),
    ((2, 1, 2, np.float64(2), "accept"), TypeError),
    ((np.bool_(True), 1, 1, 1, "accept"), TypeError),
    ((True, 1, 1, 1, "accept"), TypeError),
    ((2, 1, None, 2, "accept"), TypeError),
    ((2**63, 1, 2, 2, "accept"), OverflowError),
    ((2, 1, 2**64, 2, "accept"), OverflowError),
    ((2, 1, 2, np.uint64(2**64 - 1), "accept"), OverflowError),
    ((-1, 0, 0, -1, "accept"), ValueError),
    ((2, 1, -5, 2, "accept"), ValueError),
    ((3, 3, 3, 3, 5), TypeError),
    ((3, 3, 3, 3, None), TypeError),
    ((3, 1, 3, 3, b"accept"), TypeError),
])
def test_settle_counts_and_transition_have_one_rule(args, exc):
    """``draft_len``, ``n_row_tokens`` and ``n_row_caches`` are non-negative integers
    within int64 (TypeError, ValueError, OverflowError naming them) and ``attempted`` a
    str, in both implementations, whatever the other arguments."""
    compiled, twin = pair("settle")
    for mod in (m for m in (compiled, twin) if m is not None):
        with pytest.raises(exc):
            mod.settle(*args)


@pytest.mark.parametrize("name", [5, b"probs", None, ["probs"]])
def test_check_probs_refuses_a_name_that_is_not_a_str(name):
    compiled, twin = pair("accept")
    for mod in (m for m in (compiled, twin) if m is not None):
        with pytest.raises(TypeError, match="name must be a str"):
            mod.check_probs(np.full((1, 2), 0.5), name)


def test_probability_row_sums_are_summed_in_one_order():
    """Rows whose sum lies within rounding of 1 +- PROB_ATOL: the twin sums in the
    compiled check's order (eight lanes, then pairs), so both accept or refuse alike."""
    rng = np.random.default_rng(0)
    compiled, twin = pair("accept")
    rows = []
    for _ in range(3000):
        v = int(rng.integers(1, 40))
        x = rng.random(v) ** int(rng.integers(1, 6))
        x /= x.sum()
        x *= 1 + rng.choice([1e-3, -1e-3]) * (1 + rng.normal() * 1e-13)
        rows.append(x)
    for dtype in (np.float64, np.float32):
        for x in rows:
            p = x[None].astype(dtype)
            want = outcome(twin.check_probs, [p])
            if compiled is not None:
                assert outcome(compiled.check_probs, [p]) == want, x.tolist()


class RewritingGenerator(np.random.Generator):
    """A Generator subclass whose draw rewrites the probability rows it was given after
    they were checked (its ``random`` is Python code run by the kernel)."""

    victim: np.ndarray
    how = "reshape"

    def random(self, size=None, dtype=np.float64, out=None):
        a = self.victim
        if self.how == "reshape":
            a.shape = (a.shape[0] * 2, a.shape[1] // 2)
        elif self.how == "retype":
            a.dtype = np.float32
        else:
            a[:] = np.nan
        return np.full(size, 0.99)


@pytest.mark.parametrize("how", ["reshape", "retype", "nan"])
@pytest.mark.parametrize("which", ["target", "draft"])
def test_generator_subclass_cannot_change_checked_probs(how, which):
    """The kernels read the probability rows they checked, whatever a Generator
    subclass's ``random`` does to the caller's arrays: both give the answer of the rows
    as passed, and every emitted token is in the vocabulary."""
    V = 4
    draft, off = [1, 2, 3, 0, 1], [0, 3, 5]
    clean = np.full((5, V), 1.0 / V)

    def make():
        p, q = clean.copy(), np.full((5, V), 1.0 / V)
        gen = RewritingGenerator(np.random.PCG64(1))
        gen.victim, gen.how = (p if which == "target" else q), how
        return [draft, off, p, q, gen]

    want = outcome(_impl.kernels("python", "accept").speculative_batch,
                   [draft, off, clean.copy(), clean.copy(), np.full(7, 0.99)])
    compiled, twin = pair("accept")
    for mod in (m for m in (compiled, twin) if m is not None):
        got = outcome(mod.speculative_batch, make())
        assert got == want, (mod.__name__, got)
        out = np.array(got[1][1][0][4])
        assert (out < V).all()


class LyingHistory(np.ndarray):
    """An int64 history whose item access answers differently from its data."""

    def __getitem__(self, key):
        return np.full(5, 99, dtype=np.int64)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, ">i8", np.uint64])
def test_prompt_lookup_reads_a_numpy_history_once(dtype):
    """The draft comes from the converted history, in the caller's dtype, as a plain
    ndarray: a subclass's own indexing is never consulted (it is read as its memory, or
    refused alike by both), and a strided or converted array is not read a second
    time."""
    h = np.array([1, 2, 3, 1, 2, 3, 4, 1, 2], dtype=np.int64)
    for make in (lambda: [h.astype(dtype).view(LyingHistory), 2, 3],
                 lambda: [np.repeat(h.astype(dtype), 2)[::2], 2, 3]):
        got = same("ngram", "prompt_lookup", make)
        if got[0] == "ok":
            assert got[1] == ("ndarray", "ndarray", str(np.dtype(dtype)), (3,), [3, 4, 1]), got


# --------------------------------------------------------------------------------------
# sample_tree_batch reads each argument once
# --------------------------------------------------------------------------------------
class Shifting(Sequence):
    """A sequence that holds ``readings[k]`` after k passes over it (then stays on the
    last): each iteration is a pass; ``len`` and item access answer the current reading,
    so a second pass, or indexing after one, sees other values."""

    def __init__(self, readings):
        self.readings = [list(r) for r in readings]
        self.reads = 0

    def _now(self):
        return self.readings[min(self.reads, len(self.readings) - 1)]

    def __len__(self):
        return len(self._now())

    def __iter__(self):
        values = list(self._now())
        self.reads += 1
        return iter(values)

    def __getitem__(self, i):
        return self._now()[i]


def _sample_batch_case():
    tokens = np.array([1, 3, 2, 0, 4, 1, 2, 0], dtype=np.int64)
    parents = np.array([-1, -1, 0, 0, 1, 2, -1, 0], dtype=np.int64)
    V = 5
    probs = np.random.default_rng(3).dirichlet(np.ones(V), size=len(tokens) + 2)
    return tokens, parents, probs


@pytest.mark.parametrize("argument", ["offsets", "tokens", "parents"])
def test_sample_tree_batch_reads_each_sequence_once(argument):
    """Offsets, tokens and parents that change between readings (a hostile sequence):
    ``sample_tree_batch`` samples exactly as with their first reading, or refuses
    without drawing."""
    from specfsm.tree.sampling import sample_tree_batch

    tokens, parents, probs = _sample_batch_case()
    first = {"offsets": [0, 6, 8], "tokens": tokens.tolist(), "parents": parents.tolist()}
    later = {"offsets": [0, 2, 8], "tokens": [0, 0, 0, 0, 0, 0, 0, 0],
             "parents": [-1, 0, 1, 2, 3, 4, -1, 0]}
    want = sample_tree_batch(tokens, parents, np.array(first["offsets"]), probs, np.random.default_rng(11))
    args = dict(first)
    args[argument] = Shifting([first[argument]] + [later[argument]] * 5)
    g = np.random.default_rng(11)
    state = g.bit_generator.state
    try:
        got = sample_tree_batch(args["tokens"], args["parents"], args["offsets"], probs, g)
    except ALLOWED:
        assert g.bit_generator.state == state  # a refused call draws nothing
        return
    assert args[argument].reads <= 1, f"{argument} was read {args[argument].reads} times"
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------
# a finalizer that resizes the caller's arrays in place while the checks run
# --------------------------------------------------------------------------------------
# The checks of place_rows and place_path run Python code, and so may run the garbage
# collector, and so a finalizer: one that resizes the caller's cache or destination in
# place (``resize(refcheck=False)``) after its shape was checked would leave the copy
# writing far past the new, small buffer; the acceptance kernels, which read the
# probability rows in place through typed views, would read a freed buffer. A chain of finalizers lands the resize at the
# k-th collection of the call, for every k; every call must return or refuse cleanly.
# In a child process: writing past the buffer may crash. The compiled module only: the
# twin moves rows through numpy views, and ``refcheck=False`` frees memory under any
# live view (numpy's own hazard, which no Python code can guard against).
_FINALIZER_BODY = """
import gc
import numpy as np
from specfsm import _impl
kern = {n: _impl.kernels(IMPL, n) for n in ("place", "tree", "accept")}
CLEAN = (TypeError, ValueError, IndexError, OverflowError, RuntimeError)
BIG = 1 << 22  # bytes per row: a resized array is far smaller than the rows moved

class Step:
    # collected at one collection; leaves the next link as garbage for the next one
    def __init__(self, left, victim):
        self.left, self.victim = left, victim
        self.cycle = self
    def __del__(self):
        if self.left:
            Step(self.left - 1, self.victim)
        else:
            try:
                self.victim.resize((1,), refcheck=False)
            except Exception:
                pass

def arrays(which):
    if which == "place_rows":
        src = np.ones((2, 3, BIG // 8), dtype=np.float64)
        dst = np.zeros((2, BIG // 8), dtype=np.float64)
        return dst, (lambda: kern["place"].place_rows(src, np.array([1, 2]), dst))
    if which == "place_path":
        cache = np.ones((6, BIG // 8), dtype=np.float64)
        return cache, (lambda: kern["tree"].place_path(cache, 0, np.array([1, 3])))
    if which == "place_path_batch":
        cache = np.ones((2, 6, BIG // 8), dtype=np.float64)
        return cache, (lambda: kern["tree"].place_path_batch(cache, [0, 1], [1, 3, 2], [0, 2, 3]))
    p = np.full((3, BIG // 8), 8.0 / BIG)  # read, not written: a freed buffer is read
    acc = kern["accept"]
    if which == "check_probs":
        return p, (lambda: acc.check_probs(p))
    if which == "typical_batch":
        return p, (lambda: acc.typical_batch([1, 2, 3], [0, 3], p, 0.0, 0.0))
    return p, (lambda: acc.speculative_batch([1, 2, 3], [0, 3], p, p.copy(), np.full(4, 0.5)))

out = []
for which in ("place_rows", "place_path", "place_path_batch", "check_probs", "typical_batch",
              "speculative_batch"):
    for k in range(40):
        victim, call = arrays(which)
        gc.collect()
        Step(k, victim)
        old = gc.get_threshold()
        gc.set_threshold(1)
        try:
            call()
            got = "ok"
        except CLEAN as exc:
            got = type(exc).__name__
        finally:
            gc.set_threshold(*old)
            gc.collect()
        out.append(got)
print(sorted(set(out)))
"""


def test_a_finalizer_resizing_the_caller_arrays_cannot_send_a_kernel_past_them():
    from isolated import run_isolated

    if pair("tree")[0] is None:
        pytest.skip("no compiled core: the twin moves rows through numpy views")
    seen = run_isolated(_FINALIZER_BODY, "compiled", timeout=300)
    assert "RuntimeError" in seen, seen  # some collection landed after the checks
