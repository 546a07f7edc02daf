"""Hostile arguments for the parity tests that run a compiled module and its pure-Python
twin side by side (``test_kernel_hostile_parity.py``, ``test_index_hostile_parity.py``).

It holds what both files draw their arguments from and compare their outcomes with: the
int64 edges, the pool of odd scalars, integer sequences in every layout and dtype
(``layout``, ``sequence_arg``), the callback objects that rewrite other arguments while
they are converted (``Hook``, ``HookInt``, ``poison``, ``maker``), ``pair`` of
implementations, and ``norm`` / ``outcome``, which turn a result or a clean refusal into a
comparable value. Where the two files differ (the exceptions they allow, the integers
they draw, how a hook fires) they say so through the arguments here.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from specfsm import _impl

#: the exceptions that count as a clean refusal (a file may allow more)
CLEAN = (TypeError, ValueError, IndexError, OverflowError, RuntimeError)

I64 = 2**63 - 1
I64MIN = -(2**63)
#: int64's and int32's edges, just past them, and huge Python ints
EXTREME = [I64, I64 - 1, I64MIN, I64MIN + 1, I64 + 1, I64MIN - 1, 2**64, 2**64 - 1, 2**31 - 1,
           2**31, -(2**31) - 1, 2**32, 2**62, 10**30, -(10**30)]


def hostile_settings(max_examples):
    """Hypothesis settings for the property tests: no deadline, big draws allowed."""
    return settings(max_examples=max_examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def scalar_pool():
    """Scalars of every kind for integer arguments: a fresh list on every call (it holds
    lists and arrays, which a test may rewrite)."""
    return [True, False, 1.0, 2.5, float("nan"), np.int64(2), np.int32(1), np.uint64(2**64 - 1),
            np.float64(1.0), np.bool_(True), None, "1", b"1", [1], np.array(2), np.array([1])]


def pair(name):
    """(compiled module or None, twin module) of kernel module ``name``."""
    twin = _impl.kernels("python", name)
    if _impl.NO_EXTENSIONS:
        return None, twin
    try:
        return _impl.kernels("compiled", name), twin
    except ImportError:
        return None, twin


# --------------------------------------------------------------------------------------
# outcomes
# --------------------------------------------------------------------------------------
def norm(x, repr_floats=False):
    """``x`` as a comparable value: types, dtypes and shapes included; with
    ``repr_floats`` the values of float, complex and object arrays are compared by their
    repr (so NaN equals NaN)."""
    if isinstance(x, np.ndarray):
        values = x.tolist()
        if repr_floats and x.dtype.kind in "fcO":
            values = repr(values)
        return ("ndarray", type(x).__name__, str(x.dtype), x.shape, values)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [norm(v, repr_floats) for v in x])
    if isinstance(x, dict):
        return ("dict", sorted((k, norm(v, repr_floats)) for k, v in x.items()))
    if isinstance(x, np.generic):
        return ("np", str(x.dtype), repr(x.item()))
    return (type(x).__name__, repr(x) if isinstance(x, float) else x)


def outcome(thunk, allowed=CLEAN, *, repr_floats=False, what=None):
    """("ok", normed result of ``thunk()``) or ("raised", exception type); an exception
    outside ``allowed`` fails the test (``what``: the callee, named in the report)."""
    try:
        return ("ok", norm(thunk(), repr_floats))
    except allowed as exc:
        return ("raised", type(exc).__name__)
    except BaseException as exc:  # noqa: BLE001 - the report is the point
        head = f"{what} raised {type(exc).__name__}, not" if what else "not"
        pytest.fail(f"{head} a clean refusal:\n{traceback.format_exc()}")


# --------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------
class Seq(Sequence):
    """A plain ``collections.abc.Sequence`` that is not a list."""

    def __init__(self, values):
        self._v = list(values)

    def __len__(self):
        return len(self._v)

    def __getitem__(self, i):
        return self._v[i]


class Sub(np.ndarray):
    """An ndarray subclass (the ``subclass`` layout)."""


class HookInt(np.int64):
    """A numpy integer whose ``__index__`` runs ``action`` first: on every conversion, or
    (a subclass with ``once`` set) on the first one only."""

    action = None
    once = False

    def __index__(self):
        act = self.action
        if act is not None:
            if self.once:
                self.action = None
            act()
        return int(np.int64(self))


class Hook:
    """An integer-like scalar whose conversion runs ``action`` first."""

    def __init__(self, value, action):
        self.value = value
        self.action = action

    def __index__(self):
        self.action()
        return int(self.value)


NUMPY_LAYOUTS = {
    "int64": np.int64, "int32": np.int32, "uint64": np.uint64, "int8": np.int8,
    "uint16": np.uint16, "int64be": ">i8", "int32be": ">i4", "float64": np.float64,
    "bool": np.bool_, "object": object,
}
LAYOUTS = sorted(NUMPY_LAYOUTS) + [
    "list", "tuple", "sequence", "npints", "bools", "floats", "strided", "reversed",
    "fortran2d", "c2d", "zero_d", "readonly", "subclass", "unaligned", "hooked",
]


def layout(values, how, hook_int=HookInt):
    """``values`` (Python ints) in layout ``how``; a layout that cannot hold them gives an
    object array (numpy refuses to convert out-of-range ints). ``"hooked"``: a list of
    ``hook_int`` objects, whose hooks ``maker`` may arm."""
    vals = list(values)

    def arr(dtype=np.int64):
        try:
            return np.array(vals, dtype=dtype)
        except (OverflowError, ValueError):
            return np.array(vals + [None], dtype=object)[:-1]

    if how == "list":
        return vals
    if how == "tuple":
        return tuple(vals)
    if how == "sequence":
        return Seq(vals)
    if how == "npints":
        return [np.int64(v) if I64MIN <= v <= I64 else v for v in vals]
    if how == "bools":
        return [bool(v % 2) for v in vals]
    if how == "floats":
        return [float(v) for v in vals]
    if how == "hooked":
        return [hook_int(v) if I64MIN <= v <= I64 else v for v in vals]
    if how in NUMPY_LAYOUTS:
        return arr(NUMPY_LAYOUTS[how])
    a = arr()
    if a.dtype == object:
        return a
    if how == "strided":
        return np.repeat(a, 2)[::2]
    if how == "reversed":
        return a[::-1].copy()[::-1]
    if how == "fortran2d":
        return np.asfortranarray(np.stack([a, a]))
    if how == "c2d":
        return a.reshape(1, -1)
    if how == "zero_d":
        return np.array(vals[0] if vals else 0)
    if how == "readonly":
        a.flags.writeable = False
        return a
    if how == "subclass":
        return a.view(Sub)
    if how == "unaligned":
        buf = np.zeros(a.nbytes + 1, dtype=np.uint8)
        out = buf[1:].view(np.int64)
        out[:] = a
        return out
    raise AssertionError(how)


def offsets(sizes):
    """The offsets of consecutive runs of ``sizes``: 0, then the running sums."""
    off = [0]
    for n in sizes:
        off.append(off[-1] + n)
    return off


@st.composite
def sequence_arg(draw, valid, ints, scalars, *, entries=None, plain="list", fresh=lambda s: s,
                 hook_int=HookInt):
    """A factory for one sequence argument: ``valid`` as it is, edited with values from
    ``ints``, random (entries from ``entries``, else ``ints``), or one of ``scalars`` in
    its place (through ``fresh``); in any layout, else ``plain``."""
    kind = draw(st.sampled_from(["valid", "valid", "edited", "random", "scalar"]))
    vals = list(valid)
    if kind == "scalar":
        s = draw(scalars)
        return lambda: fresh(s)
    if kind == "edited":
        for _ in range(draw(st.integers(1, 2))):
            if vals and draw(st.booleans()):
                vals[draw(st.integers(0, len(vals) - 1))] = draw(ints)
            else:
                vals.insert(draw(st.integers(0, len(vals))), draw(ints))
    elif kind == "random":
        vals = draw(st.lists(ints if entries is None else entries, max_size=8))
    how = draw(st.sampled_from(LAYOUTS)) if draw(st.booleans()) else plain
    return lambda: layout(vals, how, hook_int)


# --------------------------------------------------------------------------------------
# arguments that rewrite other arguments
# --------------------------------------------------------------------------------------
def poison(obj, how, *, nan_for_max=False):
    """Rewrite ``obj`` (an argument already passed) in place: extreme entries (float
    entries: -1.0, or NaN for ``"max"`` with ``nan_for_max``), a new shape or dtype, a
    cleared or grown list."""
    if isinstance(obj, np.ndarray) and obj.flags.writeable and obj.size:
        if how == "reshape" and obj.ndim == 2 and obj.flags.c_contiguous:
            obj.shape = obj.shape[::-1]
        elif how == "retype" and obj.flags.c_contiguous and obj.dtype.itemsize == 8:
            obj.dtype = np.int32 if obj.dtype.kind in "iu" else np.float32
        elif obj.dtype.kind in "iu":
            info = np.iinfo(obj.dtype)
            obj.reshape(-1)[:] = info.max if how in ("max", "reshape") else info.min
        elif obj.dtype.kind == "f":
            obj.reshape(-1)[:] = np.nan if nan_for_max and how == "max" else -1.0
    elif type(obj) is list:
        if how in ("max", "retype"):
            obj.clear()
        else:
            obj.extend([I64, 5, 0])


def maker(factories, armed=(), *, hookable=lambda x: type(x) is int, hook=Hook, nan_for_max=False):
    """``make()``: fresh arguments from the factories, with the hooks in ``armed``
    (``(kind, slot, target, how)``) set so that converting one argument rewrites another
    (in the same fresh set): kind ``"scalar"`` wraps a ``hookable`` argument in ``hook``,
    ``"entry"`` arms the last ``HookInt`` of a list argument, ``"any"`` does whichever
    fits."""

    def make():
        args = [f() for f in factories]
        for kind, slot, target, how in armed:
            act = (lambda t=target, h=how: poison(args[t], h, nan_for_max=nan_for_max))
            a = args[slot]
            if kind in ("scalar", "any") and hookable(a):
                args[slot] = hook(a, act)
            elif kind in ("entry", "any") and type(a) is list:
                hooked = [v for v in a if isinstance(v, HookInt)]
                if hooked:
                    hooked[-1].action = act
        return args

    return make
