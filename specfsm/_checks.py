"""The foundation of the argument checks: counts, token ids, (tokens, offsets), reals.

Every entry point of both implementations (the compiled core and its pure-Python twin)
and the public layer converts its arguments through these functions, so a bad argument
gets the same exception and the same message whichever implementation is active. The
concept modules (``machine._checks``, ``accept._checks``, ``drafting._checks``,
``gpu._checks``) build on this one. It imports only numpy and the standard library.

The token-id rule (docs/state-machine.md, "Token ids"), applied by ``token_ids``: a 1-D
numpy array of an integer dtype (int32 and int64 read in place, other integer dtypes
widened; uint64 only while every id fits in int64), or a list or tuple (or another
sequence, not a string, read once as a list) of Python ints or numpy integers. Floats, bools, strings and other objects are refused with TypeError
naming the argument (and the entry), ids beyond int64 with OverflowError, other shapes
with ValueError. The state machine and ``common_prefix`` are generic instead: their
entries are any values compared with ``==`` (``entries``).

Tensors of other libraries (torch, JAX, ...) in host memory are taken as numpy views of
their own memory through DLPack (``host_array``, no copy), so wherever a numpy array is
accepted a CPU torch tensor is too, with the same rules; a tensor in device memory is
refused by the host-side calls (TypeError saying to pass host memory). Outputs are numpy.

The (tokens, offsets) contract, applied by ``ragged``: ``offsets`` holds one integer per
entry plus one, starts at 0, ends at ``len(tokens)`` and never decreases (checked by
comparing neighbours, never by subtracting them: int64 differences wrap).
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "INT32_MAX",
    "LIST_CHECK_MAX",
    "check_count",
    "token_id",
    "token_ids",
    "host_array",
    "int64_ids",
    "entries",
    "ragged",
    "check_offsets",
    "REQUIRED",
    "missing",
    "as_real",
    "check_real",
    "nonnegative_real",
]

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
INT32_MAX = 2**31 - 1
#: up to this many entries, checks run on Python lists (cheaper than numpy calls)
LIST_CHECK_MAX = 64

_NATIVE_IDS = (np.dtype(np.int32), np.dtype(np.int64))
_INT64 = np.dtype(np.int64)
_EXACT_INT = frozenset({int})


# --- counts ---------------------------------------------------------------------------
def check_count(value: object, name: str) -> int:
    """Return ``value`` as a non-negative Python int, or raise naming ``name``.

    Refuses floats, bools, strings and negative numbers.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a non-negative integer, got bool {value!r}")
    try:
        count = operator.index(value)  # type: ignore[arg-type]  # refusal handled below
    except TypeError:
        raise TypeError(
            f"{name} must be a non-negative integer, got {type(value).__name__} {value!r}"
        ) from None
    if count < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {count}")
    return count


# --- token ids ------------------------------------------------------------------------
def token_id(x: object, name: str, i: int, what: str = "an integer token id") -> int:
    """Entry ``i`` of the token-id sequence ``name`` as a Python int, or raise.

    A token id is a Python int (a subclass's value, not the object) or a numpy integer,
    within int64. Refuses bools, floats, strings and anything else (TypeError naming
    ``name[i]``, ``what`` saying what it must be) and ids beyond int64 (OverflowError). Runs no code of the entry's own
    except a numpy-integer subclass's ``__index__``.
    """
    t = type(x)
    if t is int:
        v = x
    elif t is bool or t is np.bool_:
        raise TypeError(f"{name}[{i}] must be {what}, got bool {x!r}")
    elif issubclass(t, int):
        v = int.__index__(x)  # type: ignore[arg-type]  # the value, without the subclass's methods
    elif issubclass(t, np.integer):
        v = operator.index(x)  # type: ignore[arg-type]
    else:
        raise TypeError(f"{name}[{i}] must be {what}, got {t.__name__} {x!r}")
    if not INT64_MIN <= v <= INT64_MAX:  # type: ignore[operator]
        raise OverflowError(f"{name}[{i}]={v} is beyond int64")
    return v  # type: ignore[return-value]


#: DLPack's device type of host memory (kDLCPU)
_DL_CPU = 1


def host_array(x: object, name: str, *, raw: bool = False) -> Any:
    """``x`` itself unless it is a tensor of another library (it has ``__dlpack__``):
    then a numpy view of its memory when that memory is on the host (DLPack, no copy;
    writes through it reach the tensor), else TypeError naming ``name`` and the device.
    A tensor DLPack cannot export (one that requires grad, a dtype numpy lacks such as
    bfloat16) is refused with TypeError too, unless ``raw`` (a caller that copies bytes,
    as the placement does) accepts it as a view of integers of its item size (a torch
    tensor's ``view(dtype)``)."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return x                # numpy arrays (subclasses too) keep their own rules
    try:
        dev = x.__dlpack_device__()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - a tensor-like object that cannot say
        raise TypeError(f"{name}: {type(x).__name__} does not say where its memory is ({exc})") from None
    if int(dev[0]) != _DL_CPU:
        raise TypeError(
            f"{name} is a {type(x).__name__} in device memory (DLPack device {tuple(int(v) for v in dev)}); "
            "this call runs on the host: pass host memory (for torch, tensor.cpu()), or use "
            "the device placement calls, which take device tensors"
        )
    try:
        return np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        if raw and hasattr(x, "view") and hasattr(x, "element_size"):
            lib = sys.modules.get(type(x).__module__.split(".")[0])
            bits = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}.get(int(x.element_size()))  # type: ignore[attr-defined]
            if lib is not None and bits is not None and hasattr(lib, bits):
                return host_array(x.view(getattr(lib, bits)), name)  # type: ignore[attr-defined]
        raise TypeError(f"{name}: cannot read this {type(x).__name__} as a numpy array ({exc})") from None


def _plain_array(arr: np.ndarray, name: str) -> np.ndarray:
    """An integer ndarray as a 1-D, C-contiguous, native int32 or int64 array (itself
    when it already is one)."""
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got a {arr.ndim}-D array of shape {arr.shape}")
    dt = arr.dtype
    if dt.kind not in "iu":
        raise TypeError(
            f"{name} has unsupported dtype {dt}; token arrays must be int32 or int64 "
            "(token ids are integers)"
        )
    if dt not in _NATIVE_IDS:
        if dt.kind == "u" and dt.itemsize == 8 and arr.size and int(arr.max()) > INT64_MAX:
            raise OverflowError(f"{name} holds ids beyond int64 (max {int(arr.max())})")
        if dt.itemsize == 4 and dt.kind == "i":
            arr = arr.astype(np.int32)  # byte-swapped int32
        else:
            arr = arr.astype(np.int64)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


def token_ids(x: object, name: str, *, own: bool = False,
              what: str = "an integer token id") -> np.ndarray:
    """Token ids (the rule in this module's docstring) as a 1-D, C-contiguous, native
    int32 or int64 array: the caller's own array when it already is one, unless ``own``
    asks for an array no one else holds (a copy whenever the input's memory could be).

    An empty list or tuple gives an empty int64 array. Refuses everything the rule
    refuses, the first bad entry of a list named (``token_id``, ``what`` saying what an
    entry must be).
    """
    t = type(x)
    if t is not np.ndarray and hasattr(x, "__dlpack__"):
        x = host_array(x, name)
        t = type(x)
    if t is np.ndarray:
        arr = x  # type: ignore[assignment]
        if own and arr.ndim == 1 and arr.dtype in _NATIVE_IDS:  # type: ignore[attr-defined]
            return np.array(arr, order="C")  # the common case: one copy, already in shape
        out = _plain_array(arr, name)  # type: ignore[arg-type]
        return out.copy() if own and out is x else out
    if isinstance(x, np.ndarray):
        return _plain_array(np.array(x), name)  # a subclass: its own copy, as a base array
    if t is list or t is tuple:
        seq: Any = x
    elif isinstance(x, Sequence) and not isinstance(x, (str, bytes, bytearray)):
        seq = list(x)  # another sequence: its entries, read once
    else:
        raise TypeError(
            f"{name} must be a list, tuple or 1-D integer numpy array, got {t.__name__}"
        )
    if not seq:
        return np.zeros(0, dtype=np.int64)
    if not set(map(type, seq)) <= _EXACT_INT:
        # numpy would read a bool among ints as an int, a float among them as a float,
        # a nested list as a second axis: every entry is held to the rule, the first
        # bad one named
        seq = [_entry_id(v, name, i, what) for i, v in enumerate(seq)]
    try:
        return np.array(seq, dtype=np.int64)
    except OverflowError:  # plain ints beyond int64: name the first
        for i, v in enumerate(seq):
            token_id(v, name, i)
        raise  # pragma: no cover - token_id raised


def _entry_id(x: object, name: str, i: int, what: str) -> int:
    """``token_id`` for an entry of a sequence, refusing a nested sequence as a shape
    error (ValueError: token ids are 1-D)."""
    if isinstance(x, (list, tuple, np.ndarray)):
        raise ValueError(f"{name} must be 1-D, got a {type(x).__name__} at {name}[{i}]")
    return token_id(x, name, i, what)


def int64_ids(x: object, name: str) -> np.ndarray:
    """``token_ids(x, name)`` as a fresh int64 array the call owns (for integer control
    arrays: offsets, slots, per-slot values)."""
    arr = token_ids(x, name, own=True, what="an integer")
    return arr if arr.dtype == _INT64 else arr.astype(np.int64)


# --- entry sequences ------------------------------------------------------------------
def entries(x: object, name: str, *, listed: bool = False) -> Any:
    """The entries of a generic sequence (the state machine's and ``common_prefix``'s
    rule: any values compared with ``==``): a list or tuple, a 1-D integer ndarray, or
    another ``Sequence`` that is not a string. Returned as given, or with ``listed`` a
    list or tuple as given and anything else as a list (an ndarray's entries as Python
    ints).

    Refuses other objects (TypeError), and arrays that ``token_ids`` refuses.
    """
    t = type(x)
    if t is list or t is tuple:
        return x
    x = host_array(x, name)
    if isinstance(x, np.ndarray):
        arr = token_ids(x, name)
        return arr.tolist() if listed else x
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes, bytearray)):
        return list(x) if listed else x
    raise TypeError(
        f"{name} must be a list, tuple or 1-D integer numpy array, got {t.__name__}"
    )


# --- (tokens, offsets) ----------------------------------------------------------------
def check_offsets(off: np.ndarray, total: int, n: int | None = None,
                  name: str = "offsets", of: str = "tokens", rows: str = "rows") -> int:
    """The longest row (``max(off[i + 1] - off[i])``, 0 when there is none), refusing
    an owned int64 ``off`` that breaks the contract: ``n + 1`` entries (when ``n`` is
    given, ``rows`` naming what the rows are), ``off[0] == 0``, ``off[-1] == total`` (the length of ``of``), each entry at
    most the next (neighbours compared, never subtracted)."""
    m = off.shape[0]
    if n is not None and m != n + 1:
        raise ValueError(f"{name} holds {m} entries for {n} {rows}; it needs B + 1 = {n + 1}")
    if m == 0:
        raise ValueError(f"{name} must hold one entry per row plus one, starting at 0; got none")
    if m <= LIST_CHECK_MAX:
        values = off.tolist()
        first = values[0]
        last = values[-1]
        bad = next((i for i in range(m - 1) if values[i] > values[i + 1]), -1)
    else:
        first, last = int(off[0]), int(off[-1])
        dec = off[:-1] > off[1:]
        bad = int(np.argmax(dec)) if dec.any() else -1
    if first != 0:
        raise ValueError(f"{name}[0] must be 0, got {first}")
    if bad >= 0:
        raise ValueError(
            f"{name} must be nondecreasing, got {name}[{bad}]={int(off[bad])} > "
            f"{name}[{bad + 1}]={int(off[bad + 1])}"
        )
    if last != total:
        raise ValueError(f"{name}[-1]={last} must equal len({of})={total}")
    if m == 1:
        return 0
    if m <= LIST_CHECK_MAX:
        return max(values[i + 1] - values[i] for i in range(m - 1))
    # every entry now lies in [0, total]: the int64 differences cannot wrap
    return int(np.diff(off).max())


def ragged(tokens: object, offsets: object, n: int | None, name: str = "tokens",
           offsets_name: str | None = None, *, rows: str = "rows",
           own: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, offsets)`` converted and checked: the tokens by ``token_ids`` (a fresh
    int64 array, or with ``own=False`` ``token_ids``'s int32/int64 array, possibly the
    caller's), the offsets copied into a fresh int64 array first (nothing the caller
    changes later reaches the checked copy), then held to the contract for ``n`` rows
    (``n=None``: as many as the offsets give). ``offsets_name`` defaults to ``offsets``
    for ``tokens`` and ``<name>_offsets`` otherwise."""
    oname = offsets_name or ("offsets" if name == "tokens" else f"{name}_offsets")
    t = token_ids(tokens, name, own=own)
    if own and t.dtype != _INT64:
        t = t.astype(np.int64)
    off = int64_ids(offsets, oname)
    check_offsets(off, t.shape[0], n, oname, name, rows)
    return t, off


# --- missing arguments of compiled methods --------------------------------------------
class _Required:
    """The default that marks a required parameter of the compiled batch's methods:
    Cython's own message for a missing positional argument does not name it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<required>"


#: see ``_Required``; ``missing`` raises the TypeError Python itself would
REQUIRED = _Required()


def missing(method: str, names: tuple[str, ...], values: tuple[object, ...]) -> None:
    """TypeError naming the parameters of ``method`` left at ``REQUIRED`` (as Python's
    own message for a missing positional argument does)."""
    gone = [n for n, v in zip(names, values) if v is REQUIRED]
    if gone:
        shown = " and ".join(repr(n) for n in gone)
        plural = "s" if len(gone) > 1 else ""
        raise TypeError(f"{method}() missing {len(gone)} required positional argument{plural}: {shown}")


# --- reals ----------------------------------------------------------------------------
def as_real(value: object, name: str) -> float:
    """``value`` converted to a float (not yet checked), or TypeError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def check_real(x: float, name: str) -> float:
    """``x`` when it is finite and >= 0, else ValueError naming ``name``."""
    if not (math.isfinite(x) and x >= 0.0):
        raise ValueError(f"{name} must be finite and >= 0, got {x!r}")
    return x


def nonnegative_real(value: object, name: str) -> float:
    """``value`` as a finite, non-negative float, or raise naming ``name``."""
    return check_real(as_real(value, name), name)
