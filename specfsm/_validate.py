"""Argument checks shared by the compiled core, its pure-Python twin and the public layer.

Both implementations call these at their Python boundary, so a bad argument gets the
same exception and the same message whichever one is active; the public modules
(``accept_rule``, ``state``) and the optional GPU package call them too. This module
imports only numpy and the standard library: it sits below everything else in the
package (see ARCHITECTURE.md).

One section per concern, in this order: counts; token ids and entry sequences; settling a
verify; the acceptance kernels; row placement. Helpers that other sections do not need
keep a leading underscore.

The token-id rule (README, "Token ids"): functions over token ids take a 1-D numpy
array of an integer dtype, or a list or tuple of Python ints or numpy integers; floats,
bools, strings and other objects are refused with TypeError naming the argument (and
the entry), ids beyond int64 with OverflowError. The state machine and
``common_prefix`` are generic instead: their entries are any values compared with ``==``
(``as_entries``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    # counts
    "INT64_MAX",
    "INT64_MIN",
    "INT32_MAX",
    "check_count",
    # token ids and entry sequences
    "as_token_array",
    "as_entries",
    "check_entries",
    "id_value",
    "as_id_array",
    # settling a verify
    "settle_reason",
    # acceptance kernels
    "PROB_ATOL",
    "PROB_OK",
    "PROB_NONFINITE",
    "PROB_NEGATIVE",
    "PROB_BADSUM",
    "as_offsets",
    "check_offsets",
    "check_id_range",
    "prepare_exact",
    "as_prob_rows",
    "as_uniforms",
    "check_uniforms",
    "draw_uniforms",
    "prepare_speculative",
    "as_real",
    "check_real",
    "nonnegative_real",
    "prepare_typical",
    "prob_error",
    # row placement
    "check_place_arrays",
    "index_reason",
    "host_index_array",
    "as_host_index",
    "overlap_message",
    "byte_bounds",
    "ranges_overlap",
    "as_settle_arrays",
    "settle_index_reason",
]

# --- counts ---------------------------------------------------------------------------
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
INT32_MAX = 2**31 - 1


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


# --- token ids and entry sequences ----------------------------------------------------
_NATIVE_IDS = (np.dtype(np.int32), np.dtype(np.int64))
_EXACT_INT = frozenset({int})


def as_token_array(arr: np.ndarray, name: str) -> np.ndarray:
    """Return a 1-D, C-contiguous, native-order int32 or int64 view (or copy) of ``arr``.

    Other integer dtypes are widened to int64; uint64 is accepted when every id fits in
    int64. Refuses arrays that are not 1-D and non-integer dtypes (floats, bools,
    objects, strings).
    """
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


def as_entries(x: object, name: str) -> Sequence:
    """The entries of a generic sequence (the state machine's and ``common_prefix``'s
    rule): a list or tuple as it is, an integer ndarray as a list of Python ints, any
    other ``Sequence`` (not a string) as a list.

    Refuses other objects, 2-D arrays and non-integer dtypes.
    """
    if type(x) is list or type(x) is tuple:
        return x  # type: ignore[return-value]
    if isinstance(x, np.ndarray):
        return as_token_array(x, name).tolist()
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes, bytearray)):
        return list(x)
    raise TypeError(
        f"{name} must be a list, tuple or 1-D integer numpy array, got {type(x).__name__}"
    )


def check_entries(tokens: Any, name: str) -> Any:
    """``tokens`` as it is when it is a list, tuple, 1-D integer array or other sequence
    (the state machine's entries: any values compared with ``==``), empty included: the
    original design's ``start`` and ``enter_verify`` take any ``Vec``.

    Refuses anything else (TypeError, or ValueError for a 2-D array).
    """
    t = type(tokens)
    if t is list or t is tuple:
        return tokens
    if isinstance(tokens, np.ndarray):
        as_token_array(tokens, name)  # raises on 2-D arrays and unsupported dtypes
        return tokens
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__") or not hasattr(
        tokens, "__getitem__"
    ):
        raise TypeError(
            f"{name} must be a list, tuple or 1-D integer numpy array, got {t.__name__}"
        )
    return tokens


def id_value(x: object, name: str, i: int) -> int:
    """Entry ``i`` of the token-id sequence ``name`` as a Python int, or raise.

    A token id is a Python int (a subclass's value, not the object) or a numpy integer,
    within int64. Refuses bools, floats, strings and anything else (TypeError naming
    ``name[i]``) and ids beyond int64 (OverflowError). Runs no code of the entry's own
    except a numpy-integer subclass's ``__index__``.
    """
    t = type(x)
    if t is int:
        v = x
    elif t is bool or t is np.bool_:
        raise TypeError(f"{name}[{i}] must be an integer token id, got bool {x!r}")
    elif issubclass(t, int):
        v = int.__index__(x)  # type: ignore[arg-type]  # the value, without the subclass's methods
    elif issubclass(t, np.integer):
        v = operator.index(x)  # type: ignore[arg-type]
    else:
        raise TypeError(f"{name}[{i}] must be an integer token id, got {t.__name__} {x!r}")
    if not INT64_MIN <= v <= INT64_MAX:  # type: ignore[operator]
        raise OverflowError(f"{name}[{i}]={v} is beyond int64")
    return v  # type: ignore[return-value]


def as_id_array(x: object, name: str, own: bool = False) -> np.ndarray:
    """A 1-D int32/int64 C-contiguous array of token ids from an array, list or tuple;
    with ``own`` an array no one else holds (a copy whenever the input's memory could be).

    Refuses what ``as_token_array`` refuses and, in a list, entries that are not token
    ids (``id_value``: TypeError or OverflowError naming the first bad entry)."""
    if own and type(x) is np.ndarray and x.ndim == 1 and x.dtype in _NATIVE_IDS:
        return np.array(x, order="C")  # the common case: one copy, already in shape
    fresh = False
    if not isinstance(x, np.ndarray):
        if isinstance(x, (str, bytes)) or not hasattr(x, "__len__"):
            raise TypeError(
                f"{name} must be a 1-D integer array, list or tuple, got {type(x).__name__}"
            )
        fresh = type(x) is list or type(x) is tuple  # np.asarray builds a new array
        if fresh:
            entries: list | tuple = x  # type: ignore[assignment]
            if not set(map(type, entries)) <= _EXACT_INT:
                # numpy would read a bool among ints as an int, a float among them as a
                # float: every entry is held to the rule, the first bad one named
                x = [id_value(v, name, i) for i, v in enumerate(entries)]
        arr = np.asarray(x)
        if arr.size == 0 and arr.ndim == 1:
            arr = arr.astype(np.int64)
        elif arr.dtype == object and arr.ndim == 1:
            # ids beyond int64 (numpy keeps them as objects): name the first
            arr = np.array([id_value(v, name, i) for i, v in enumerate(arr.tolist())], np.int64)
        x = arr
    elif type(x) is not np.ndarray:
        x = np.asarray(x)  # a subclass: its overrides are not run again below
    out = as_token_array(x, name)  # type: ignore[arg-type]
    if own and out is x and not fresh:
        out = out.copy()
    return out


# --- settling a verify ----------------------------------------------------------------
def settle_reason(draft_len: int, accepted: int, n_row_tokens: int, n_row_caches: int) -> str | None:
    """Why settling a verify (``Verify.accept``/``accept_rows`` and the batch's settle)
    refuses these rows, or None when it accepts them.

    The text completes ``serving fsm: <transition> is not legal: ...``.
    """
    if draft_len == 0:
        return "the draft is empty: there is no row to settle"
    if accepted > draft_len:
        return f"accepted={accepted} is beyond the {draft_len}-token draft"
    if n_row_caches != draft_len:
        return (
            f"row_caches holds {n_row_caches} {_entries(n_row_caches)} for a {draft_len}-token "
            "draft; it needs one per draft row"
        )
    if accepted < draft_len and n_row_tokens <= accepted:
        return (
            f"row_tokens holds {n_row_tokens} {_entries(n_row_tokens)}; rejecting at row "
            f"{accepted} needs row_tokens[{accepted}]"
        )
    return None


def _entries(n: int) -> str:
    return "entry" if n == 1 else "entries"


# --- acceptance kernels ---------------------------------------------------------------
# Every ``prepare_*`` first converts all of its arguments (running whatever Python code
# that takes: ``__index__``, ``__float__``, ``__array__``, ``__bool__``), taking private
# copies of the small control arrays (draft, choices, offsets, uniforms), and only then
# validates, on those copies. Nothing the caller holds can change them afterwards, so
# the compiled kernels may read them with the GIL released.

#: How far a probability row's sum may stray from 1 (absolute, summed in float64).
PROB_ATOL = 1e-3

# What the probability-row check found (the compiled check returns the same codes).
PROB_OK, PROB_NONFINITE, PROB_NEGATIVE, PROB_BADSUM = 0, 1, 2, 3

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_INT64 = np.dtype(np.int64)
_LIST_CHECK_MAX = 64  # up to this many entries, checks run on Python lists (cheaper than numpy calls)


def as_offsets(offsets: object, name: str = "offsets") -> np.ndarray:
    """``offsets`` converted to a private int64 array (not yet checked)."""
    if type(offsets) is np.ndarray and offsets.ndim == 1 and offsets.dtype == _INT64:
        return np.array(offsets, order="C")  # the common case: one copy
    off = as_id_array(offsets, name, own=True)
    if off.dtype != _INT64:
        off = off.astype(np.int64)
    return off


def check_offsets(off: np.ndarray, total: int, name: str = "offsets") -> int:
    """K_max, refusing offsets that do not describe ``total`` rows.

    Order is checked by comparing neighbours (never by subtracting int64 values, which
    wraps around near -2**63); the row counts are taken only once the offsets are known
    to run from 0 to ``total`` without decreasing."""
    n = off.shape[0]
    if n == 0:
        raise ValueError(f"{name} must hold B + 1 entries starting at 0, got an empty array")
    if n <= _LIST_CHECK_MAX:
        # Python ints: the steps are exact, so K_max is gathered on the way
        values = off.tolist()
        first = prev = values[0]
        last = values[-1]
        bad = -1
        k_max = 0
        for i in range(1, n):
            x = values[i]
            if x < prev:
                bad = i - 1
                break
            if x - prev > k_max:
                k_max = x - prev
            prev = x
    else:
        first, last = int(off[0]), int(off[-1])
        dec = off[:-1] > off[1:]
        bad = int(np.argmax(dec)) if dec.any() else -1
    if first != 0:
        raise ValueError(f"{name}[0] must be 0, got {first}")
    if bad >= 0:
        raise ValueError(
            f"{name} must be non-decreasing, got {name}[{bad}]={int(off[bad])} > "
            f"{name}[{bad + 1}]={int(off[bad + 1])}"
        )
    if last != total:
        raise ValueError(f"{name}[-1]={last} must equal the flat draft length {total}")
    if n <= _LIST_CHECK_MAX:
        return k_max
    # every entry now lies in [0, total]: the int64 differences cannot wrap
    return int(np.diff(off).max())


def check_id_range(arr: np.ndarray, name: str, hi: int, what: str) -> None:
    """Refuse ids outside [0, hi)."""
    n = arr.shape[0]
    if n == 0:
        return
    if n <= _LIST_CHECK_MAX:
        values = arr.tolist()
        lo_v, hi_v = min(values), max(values)
        if lo_v >= 0 and hi_v < hi:
            return
        lo_i, hi_i = values.index(lo_v), values.index(hi_v)
    else:
        lo_i, hi_i = int(np.argmin(arr)), int(np.argmax(arr))
    if arr[lo_i] < 0:
        raise ValueError(f"{name}[{lo_i}]={int(arr[lo_i])} is negative; token ids must be >= 0")
    if arr[hi_i] >= hi:
        raise ValueError(f"{name}[{hi_i}]={int(arr[hi_i])} is outside {what} [0, {hi})")


def prepare_exact(draft: object, choices: object, offsets: object, fast=None):
    """(draft, choices, offsets, K_max) converted into private arrays, then checked.

    ``fast``: the compiled module's ``(check_offsets, check_id_range)``, loops in C with
    the same results and errors as this module's (which they call to raise)."""
    offsets_check, ids_check = fast or (check_offsets, check_id_range)
    d = as_id_array(draft, "draft", own=True)
    c = as_id_array(choices, "choices", own=True)
    off = as_offsets(offsets)
    if c.shape[0] != d.shape[0]:
        raise ValueError(
            f"choices holds {c.shape[0]} entries; it needs one per draft row ({d.shape[0]})"
        )
    if d.dtype != c.dtype:
        d = d.astype(np.int64)
        c = c.astype(np.int64)
    k_max = offsets_check(off, d.shape[0])
    ids_check(d, "draft", INT32_MAX + 1, "the int32 output range")
    ids_check(c, "choices", INT32_MAX + 1, "the int32 output range")
    return d, c, off, k_max


def as_prob_rows(x: object, name: str) -> np.ndarray:
    """A C-contiguous, native float32/float64 2-D ndarray (not a subclass) of ``x``;
    read in place when it already is one."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a 2-D float32 or float64 numpy array, got {type(x).__name__}")
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows x vocabulary), got shape {x.shape}")
    if x.dtype not in _FLOATS:
        if x.dtype.kind != "f":
            raise TypeError(f"{name} has dtype {x.dtype}; probabilities must be float32 or float64")
        x = x.astype(np.float64)
    if not x.flags.c_contiguous or not x.dtype.isnative:
        x = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))
    if x.shape[1] == 0:
        raise ValueError(f"{name} has an empty vocabulary (shape {x.shape})")
    return x


def as_uniforms(uniforms: object):
    """(a private float64 copy of ``uniforms``, None), or (None, the Generator to draw
    them from once every argument has been checked)."""
    if isinstance(uniforms, np.random.Generator):
        return None, uniforms
    if not isinstance(uniforms, np.ndarray):
        raise TypeError(
            "uniforms must be a 1-D float64 numpy array or a numpy.random.Generator, "
            f"got {type(uniforms).__name__}"
        )
    return np.array(uniforms, dtype=np.float64, order="C", copy=True), None


def check_uniforms(u: np.ndarray, need: int) -> None:
    """Refuse uniforms that are not ``need`` draws in [0, 1)."""
    if u.ndim != 1 or u.shape[0] != need:
        raise ValueError(
            f"uniforms must be 1-D with one draw per draft row plus one per request "
            f"({need}), got shape {u.shape}"
        )
    if need <= _LIST_CHECK_MAX:
        i = next((i for i, x in enumerate(u.tolist()) if not 0.0 <= x < 1.0), -1)
    else:
        ok = (u >= 0.0) & (u < 1.0)
        i = -1 if ok.all() else int(np.argmax(~ok))
    if i >= 0:
        raise ValueError(f"uniforms[{i}]={float(u[i])!r} is outside [0, 1)")


def draw_uniforms(gen: np.random.Generator, need: int) -> np.ndarray:
    """``need`` draws from ``gen``, taken only after every argument has been checked (so a
    refused call leaves the generator's stream where it was), in a private array."""
    if type(gen) is np.random.Generator:
        return gen.random(need)  # a new float64 array of draws in [0, 1), ours alone
    u = np.array(gen.random(need), dtype=np.float64, order="C", copy=True)  # a subclass
    check_uniforms(u, need)
    return u


def prepare_speculative(draft, offsets, target_probs, draft_probs, uniforms, fast=None):
    """(draft, offsets, P, Q or None, U, K_max, Generator or None) converted, then checked.

    U is None when ``uniforms`` is a Generator: the caller draws from it (with
    ``draw_uniforms``) after its own remaining checks. ``fast``: as for
    ``prepare_exact``."""
    offsets_check, ids_check = fast or (check_offsets, check_id_range)
    d = as_id_array(draft, "draft", own=True)
    off = as_offsets(offsets)
    p = as_prob_rows(target_probs, "target_probs")
    q = None if draft_probs is None else as_prob_rows(draft_probs, "draft_probs")
    u, gen = as_uniforms(uniforms)
    k_max = offsets_check(off, d.shape[0])
    n, v = p.shape
    if n != d.shape[0]:
        raise ValueError(
            f"target_probs has {n} rows; it needs one per draft row ({d.shape[0]})"
        )
    if q is not None:
        if q.shape != p.shape:
            raise ValueError(
                f"draft_probs has shape {q.shape}; it must match target_probs {p.shape}"
            )
        if q.dtype != p.dtype:
            q = q.astype(p.dtype)
    ids_check(d, "draft", v, "the vocabulary")
    if u is not None:
        check_uniforms(u, d.shape[0] + off.shape[0] - 1)
    return d, off, p, q, u, k_max, gen


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


def prepare_typical(draft, offsets, target_probs, posterior_threshold, posterior_alpha,
                    fast=None):
    """(draft, offsets, P, threshold, alpha, K_max) converted, then checked (``fast``: as
    for ``prepare_exact``)."""
    offsets_check, ids_check = fast or (check_offsets, check_id_range)
    thr = as_real(posterior_threshold, "posterior_threshold")
    alpha = as_real(posterior_alpha, "posterior_alpha")
    d = as_id_array(draft, "draft", own=True)
    off = as_offsets(offsets)
    p = as_prob_rows(target_probs, "target_probs")
    check_real(thr, "posterior_threshold")
    check_real(alpha, "posterior_alpha")
    k_max = offsets_check(off, d.shape[0])
    if p.shape[0] != d.shape[0]:
        raise ValueError(
            f"target_probs has {p.shape[0]} rows; it needs one per draft row ({d.shape[0]})"
        )
    ids_check(d, "draft", p.shape[1], "the vocabulary")
    return d, off, p, thr, alpha, k_max


def prob_error(name: str, code: int, row: int, col: int, value: float) -> ValueError:
    """The error for the first bad probability row (same text from both implementations)."""
    if code == PROB_NONFINITE:
        return ValueError(f"{name}[{row}, {col}] is {value:.6g}: probabilities must be finite")
    if code == PROB_NEGATIVE:
        return ValueError(f"{name}[{row}, {col}]={value:.6g} is a negative probability")
    return ValueError(
        f"{name} row {row} sums to {value:.6g}, not 1 (tolerance {PROB_ATOL:g})"
    )


# --- row placement --------------------------------------------------------------------
# Shared by every ``place_rows`` path: the compiled host kernel (``specfsm._core.place``),
# its twin (``specfsm._py.place``) and the CuPy wrapper (``specfsm.gpu._cupy``). Nothing
# here imports CuPy: the functions only read ``shape``, ``dtype``, ``ndim`` and
# ``flags``, which numpy and CuPy arrays share.


def check_place_arrays(src, dst) -> tuple[int, int, int]:
    """``(B, K, row_bytes)`` for ``src`` [B, K, ...] and ``dst`` [B, ...], or raise.

    Refuses a ``src`` under 2-D, a ``dst`` whose shape is not ``src``'s without the K
    axis, differing dtypes, object dtypes (a raw byte copy cannot move references),
    arrays that are not C-contiguous and a read-only ``dst``.
    """
    if src.ndim < 2:
        raise ValueError(
            f"src must be [B, K, ...] (at least 2-D), got a {src.ndim}-D array of shape "
            f"{tuple(src.shape)}"
        )
    expected = (src.shape[0],) + tuple(src.shape[2:])
    if tuple(dst.shape) != expected:
        raise ValueError(
            f"dst must have shape {expected} (src's shape {tuple(src.shape)} without the "
            f"K axis), got {tuple(dst.shape)}"
        )
    if dst.dtype != src.dtype:
        raise TypeError(f"dst has dtype {dst.dtype}; it must match src's dtype {src.dtype}")
    if src.dtype.hasobject:
        raise TypeError(
            f"src has dtype {src.dtype}, which holds Python objects; place_rows copies raw "
            "bytes and cannot move object references"
        )
    if not src.flags.c_contiguous:
        raise ValueError(
            f"src must be C-contiguous (strides {tuple(src.strides)} for shape "
            f"{tuple(src.shape)}); make a contiguous copy first"
        )
    if not dst.flags.c_contiguous:
        raise ValueError(
            f"dst must be C-contiguous (strides {tuple(dst.strides)} for shape "
            f"{tuple(dst.shape)}); place_rows writes rows in place, so pass a contiguous array"
        )
    writeable = getattr(dst.flags, "writeable", True)
    if not writeable:
        raise ValueError("dst is read-only; place_rows writes into it")
    batch = int(src.shape[0])
    rows = int(src.shape[1])
    if batch > INT32_MAX:
        raise ValueError(f"src holds B={batch} requests; place_rows takes at most {INT32_MAX}")
    return batch, rows, int(src.dtype.itemsize) * _product(src.shape[2:])


def _product(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def index_reason(b: int, value: int, K: int) -> str:
    """The message for an ``index[b]`` that names a row past the K rows."""
    return (
        f"index[{b}]={value} is out of range for K={K} rows (entries must be < K; a "
        "negative entry leaves dst[b] untouched)"
    )


def host_index_array(index) -> np.ndarray:
    """``index`` as a numpy array that the call owns (always a copy), converted before
    anything is checked: whatever the conversion runs (a sequence's ``__getitem__``,
    ``__array__``) and whatever other threads later write into the caller's array, the
    checked entries are the ones copied. ``as_host_index`` then checks it."""
    if type(index) is np.ndarray:
        return index.copy()
    arr = np.array(index)
    if arr.size == 0 and arr.ndim == 1 and arr.dtype.kind == "f":
        arr = np.zeros(0, np.int64)  # np.array([]) is float64
    return arr


def as_host_index(index, B: int, K: int, check_range: bool = True) -> np.ndarray:
    """``index`` as a 1-D, C-contiguous, native int32 or int64 numpy array of B entries.

    Accepts any 1-D integer array-like (lists too); other integer widths are widened to
    int64. Refuses other shapes, non-integer dtypes, a length other than B and any entry
    >= K (IndexError naming the first such entry), so nothing is copied on bad input.
    ``check_range=False`` leaves the last check to a caller that scans the returned array
    itself (raising with ``index_reason`` for the first entry >= K); entries that the
    conversion to int64 would change are still checked here.
    """
    arr = index if type(index) is np.ndarray else np.asarray(index)
    if arr.ndim != 1:
        raise ValueError(
            f"index must be 1-D (one entry per request), got a {arr.ndim}-D array of shape "
            f"{arr.shape}"
        )
    dt = arr.dtype
    if dt.kind not in "iu":
        if arr.size == 0 and dt.kind == "f" and type(index) is not np.ndarray:
            arr, dt = np.zeros(0, np.int64), np.dtype(np.int64)  # np.asarray([]) is float64
        else:
            raise TypeError(f"index has dtype {dt}; it must be int32 or int64")
    if arr.shape[0] != B:
        raise ValueError(
            f"index has {arr.shape[0]} entries; it needs one per request (B={B})"
        )
    if B and (check_range or dt not in _NATIVE_IDS) and int(arr.max()) >= K:
        b = int(np.argmax(arr >= K))
        raise IndexError(index_reason(b, int(arr[b]), K))
    if dt not in _NATIVE_IDS:
        arr = arr.astype(np.int32 if (dt.kind == "i" and dt.itemsize == 4) else np.int64)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


def overlap_message(a: str, b: str) -> str:
    """The message for two ``place_rows`` arguments that share memory."""
    return (
        f"{a} and {b} overlap in memory; place_rows needs separate arrays (a row could be "
        "overwritten before it is read)"
    )


def byte_bounds(ptr: int, shape, strides, itemsize: int) -> tuple[int, int]:
    """``[lo, hi)``: the bytes an array with these pointer, shape and strides can touch."""
    lo = hi = ptr
    for n, s in zip(shape, strides):
        if n == 0:
            return ptr, ptr
        extent = (int(n) - 1) * int(s)
        if extent < 0:
            lo += extent
        else:
            hi += extent
    return lo, hi + itemsize


def ranges_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two ``[lo, hi)`` byte ranges share a byte (empty ranges share none)."""
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]


def _as_count_array(values, name: str) -> np.ndarray:
    arr = values.copy() if type(values) is np.ndarray else np.array(values)  # private
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D (one entry per request), got a {arr.ndim}-D array of shape "
            f"{arr.shape}"
        )
    if arr.dtype.kind not in "iu":
        if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64
            return np.zeros(0, np.int64)
        raise TypeError(f"{name} has dtype {arr.dtype}; it must hold integers")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size:
        big = arr > np.uint64(INT64_MAX)
        if big.any():
            b = int(np.argmax(big))
            raise OverflowError(f"{name}[{b}]={int(arr[b])} does not fit in int64")
    if arr.dtype != np.dtype(np.int64) or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=np.int64)
    return arr


def as_settle_arrays(accepted, draft_lens) -> tuple[np.ndarray, np.ndarray]:
    """``accepted`` and ``draft_lens`` as private (copied) 1-D int64 arrays of one
    length, or raise.

    Refuses shapes other than 1-D, non-integer dtypes and differing lengths; the values
    themselves are checked by the settle loop (see ``settle_index_reason``).
    """
    a = _as_count_array(accepted, "accepted")
    d = _as_count_array(draft_lens, "draft_lens")
    if a.shape[0] != d.shape[0]:
        raise ValueError(
            f"accepted has {a.shape[0]} entries and draft_lens {d.shape[0]}; they need one "
            "entry per request each"
        )
    return a, d


def settle_index_reason(b: int, accepted: int, draft_len: int) -> str:
    """Why request ``b`` cannot be settled (``settle_index`` raises ValueError with it)."""
    if draft_len < 0:
        return f"draft_lens[{b}]={draft_len} is negative"
    if accepted < 0:
        return f"accepted[{b}]={accepted} is negative"
    return (
        f"accepted[{b}]={accepted} is beyond the draft's {draft_len} rows "
        f"(draft_lens[{b}]={draft_len})"
    )


# --- index checks (suffix and n-gram indexes) ---
# The suffix index (compiled ``_core/suffix_index.pyx``, twin ``specfsm/_py/suffix_index.py``)
# takes every argument check from here; the token, offsets, per-index count, draft-length
# and record checks below (``as_ids`` to ``validate_offsets``) serve the n-gram index and
# the batch state too, with the same messages in both implementations.

#: positions and states are 32-bit: a suffix index holds at most this many tokens
MAX_SUFFIX_TOKENS = 2**30 - 1
#: ``max_n=None`` (no cap on the match length) is stored as this
UNBOUNDED = MAX_SUFFIX_TOKENS + 1
#: adaptive draft length: added after a fully accepted draft, taken after a rejection
GROW_STEP = 2
SHRINK_STEP = 1


def as_ids(tokens: object, name: str) -> np.ndarray:
    """Token ids as a 1-D C-contiguous int32 or int64 ndarray (the caller's own array
    when it already is one: copy before relying on it).

    Accepts a 1-D integer ndarray or a list/tuple (or other sequence) of Python or numpy
    integers. Refuses 2-D input, non-integer entries (floats, bools, strings) and ids
    beyond int64.
    """
    from collections.abc import Sequence

    if isinstance(tokens, np.ndarray):
        return as_token_array(tokens, name)
    if isinstance(tokens, (str, bytes, bytearray)) or not isinstance(tokens, Sequence):
        raise TypeError(
            f"{name} must be a list, tuple or 1-D integer numpy array, "
            f"got {type(tokens).__name__}"
        )
    if len(tokens) == 0:
        return np.zeros(0, dtype=np.int64)
    if type(tokens) is list or type(tokens) is tuple:
        kinds = set(map(type, tokens))
        if bool in kinds or np.bool_ in kinds:  # numpy would read a bool among ints as an int
            raise TypeError(f"{name} must hold integer ids, got bools")
    try:
        arr = np.asarray(tokens)
    except (ValueError, TypeError) as exc:  # ragged nesting and the like
        raise ValueError(f"{name} must be a flat sequence of integer ids ({exc})") from None
    if arr.dtype == object:
        for x in arr.reshape(-1).tolist():
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"{name} must hold integer ids, got {type(x).__name__} {x!r}")
            if not INT64_MIN <= int(x) <= INT64_MAX:
                raise OverflowError(f"{name} holds ids beyond int64 (got {int(x)!r})")
        raise TypeError(f"{name} must hold integer ids")  # pragma: no cover - unreachable
    if arr.dtype.kind == "b":
        raise TypeError(f"{name} must hold integer ids, got bools")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer ids, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got a {arr.ndim}-D array of shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > INT64_MAX:
        raise OverflowError(f"{name} holds ids beyond int64 (got {int(arr.max())!r})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_prefer(prefer: object) -> bool:
    """True for ``"earliest"``, False for ``"latest"``; refuses anything else."""
    if type(prefer) is str:
        if prefer == "latest":
            return False
        if prefer == "earliest":
            return True
    raise ValueError(f"prefer must be 'latest' or 'earliest', got {prefer!r}")


def check_batch_counts(counts: object, n: int, defaults: list[int] | None, name: str = "max_k") -> np.ndarray:
    """Per-index counts as a fresh int64 array of ``n`` entries: one count for every
    index, a sequence or array of ``n`` counts, or (when ``defaults`` is given) None for
    ``defaults``."""
    if counts is None:
        if defaults is None:
            raise TypeError(f"{name} must be a non-negative integer or one count per request, got None")
        return np.asarray(defaults, dtype=np.int64).reshape(n)
    if isinstance(counts, (np.ndarray, list, tuple)):
        # copied first, validated after: the copy is what the kernel reads
        ks = np.array(as_ids(counts, name), dtype=np.int64, copy=True)
        if ks.shape[0] != n:
            raise ValueError(f"{name} holds {ks.shape[0]} counts for {n} requests")
        if ks.shape[0] and ks.min() < 0:
            i = int(np.flatnonzero(ks < 0)[0])
            raise ValueError(f"{name} must be non-negative, got {name}[{i}]={int(ks[i])}")
        return ks
    k = check_count(counts, name)
    return np.full(n, min(k, INT64_MAX), dtype=np.int64)


def check_draft_limits(draft_len: object, min_draft: object, max_draft: object) -> tuple[int, int, int]:
    """``(draft_len, min_draft, max_draft)`` as counts with
    ``min_draft <= draft_len <= max_draft``."""
    k = check_count(draft_len, "draft_len")
    lo = check_count(min_draft, "min_draft")
    hi = check_count(max_draft, "max_draft")
    if lo > hi:
        raise ValueError(f"min_draft must not exceed max_draft, got {lo} > {hi}")
    if not lo <= k <= hi:
        raise ValueError(f"draft_len must lie in [min_draft, max_draft] = [{lo}, {hi}], got {k}")
    return k, lo, hi


def check_record(proposed: object, accepted: object) -> tuple[int, int]:
    """``(proposed, accepted)`` as counts with ``accepted <= proposed``."""
    p = check_count(proposed, "proposed")
    a = check_count(accepted, "accepted")
    if a > p:
        raise ValueError(f"accepted={a} is beyond the {p} drafted tokens")
    return p, a


def own_offsets(offsets: object) -> np.ndarray:
    """``offsets`` converted and copied into a fresh int64 array, before any check: a
    caller's array changed later (another thread) cannot change what was validated."""
    off = np.array(as_ids(offsets, "offsets"), dtype=np.int64, copy=True)
    if off.shape[0] < 1:
        raise ValueError("offsets must hold at least one entry (B + 1 boundaries for B requests)")
    return off


def validate_offsets(off: np.ndarray, n_tokens: int) -> None:
    """Checks an owned offsets copy: first entry >= 0, last <= n_tokens, and each entry
    <= the next (compared, never subtracted: int64 differences wrap around)."""
    if off[0] < 0:
        raise ValueError(f"offsets must be non-negative, got offsets[0]={int(off[0])}")
    if off[-1] > n_tokens:
        raise ValueError(f"offsets[-1]={int(off[-1])} is beyond the {n_tokens} tokens given")
    if off.shape[0] > 1:
        down = off[:-1] > off[1:]
        if down.any():
            i = int(np.flatnonzero(down)[0])
            raise ValueError(
                f"offsets must be nondecreasing, got offsets[{i}]={int(off[i])} > "
                f"offsets[{i + 1}]={int(off[i + 1])}"
            )


def own_batch_arrays(tokens: object, offsets: object, b: int) -> tuple[np.ndarray, np.ndarray]:
    """A B-index batch call's ``tokens`` and ``offsets`` converted and copied into fresh
    int64 arrays the call owns, ``offsets`` holding B + 1 entries (their values are
    checked by ``validate_offsets``, or by the caller's own loop over the copy)."""
    src = np.array(as_ids(tokens, "tokens"), dtype=np.int64, copy=True)
    off = own_offsets(offsets)
    if off.shape[0] != b + 1:
        raise ValueError(
            f"offsets holds {off.shape[0]} entries for {b} indexes; it needs B + 1 = {b + 1}"
        )
    return src, off

def check_suffix_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``(min_n, max_n)`` as ints, ``max_n=None`` meaning no cap (``UNBOUNDED``).
    Refuses ``min_n < 1`` and ``min_n > max_n``."""
    lo = check_count(min_n, "min_n")
    if lo < 1:
        raise ValueError(f"min_n must be at least 1, got {lo}")
    if max_n is None:
        return min(lo, UNBOUNDED), UNBOUNDED
    hi = check_count(max_n, "max_n")
    if hi < lo:
        raise ValueError(f"min_n must not exceed max_n, got min_n={lo} > max_n={hi}")
    return min(lo, UNBOUNDED), min(hi, UNBOUNDED)


def check_anchor(anchor_n: object, anchor_span: object, anchor_misses: object) -> tuple[int, int, int]:
    """``(anchor_n, anchor_span, anchor_misses)`` as counts (``anchor_n=0`` switches the
    anchor off), capped at ``MAX_SUFFIX_TOKENS``."""
    an = check_count(anchor_n, "anchor_n")
    span = check_count(anchor_span, "anchor_span")
    miss = check_count(anchor_misses, "anchor_misses")
    return min(an, MAX_SUFFIX_TOKENS), min(span, MAX_SUFFIX_TOKENS), min(miss, MAX_SUFFIX_TOKENS)


def check_suffix_stats(stats: object) -> tuple[int, int, int, int]:
    """Pickled statistics ``(steps, drafted, accepted, full_accepts)``, checked to be
    counts that some sequence of ``record`` calls could have produced: the n-gram index's
    check (``_check_stats``), since a suffix index records within the same limits (each
    count at most int64's), so every state ``record`` reaches pickles and loads back."""
    return _check_stats(stats)


# --- n-gram index and batch checks ---
# Shared by specfsm._core.ngram_index / specfsm._core.batch and their twins
# specfsm._py.ngram_index / specfsm._py.batch (same messages in both).


from .errors import IllegalTransition as _IllegalTransition  # noqa: E402

#: the index stores positions as 32-bit ints: at most this many tokens per index
MAX_INDEX_TOKENS = 2**31 - 2
#: an index keeps one hash table per n-gram length: at most this many lengths
MAX_LEVELS = 4096


def _check_ngram_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``(min_n, max_n)`` as ints; ``max_n=None`` means ``min_n``. Refuses ``min_n < 1``
    and ``min_n > max_n``."""
    lo = check_count(min_n, "min_n")
    if lo < 1:
        raise ValueError(f"min_n must be at least 1, got {lo}")
    if max_n is None:
        return lo, lo
    hi = check_count(max_n, "max_n")
    if hi < lo:
        raise ValueError(f"min_n must not exceed max_n, got min_n={lo} > max_n={hi}")
    return lo, hi


def _check_index_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``_check_ngram_range`` for an index, which keeps one table per n: also refuses
    ``max_n`` beyond ``MAX_INDEX_TOKENS`` and more than ``MAX_LEVELS`` values of n."""
    lo, hi = _check_ngram_range(min_n, max_n)
    if hi > MAX_INDEX_TOKENS:
        raise ValueError(f"max_n must be at most {MAX_INDEX_TOKENS} for an NgramIndex, got {hi}")
    if hi - lo + 1 > MAX_LEVELS:
        raise ValueError(
            f"an NgramIndex keeps at most {MAX_LEVELS} n-gram lengths, got "
            f"min_n={lo}, max_n={hi}"
        )
    return lo, hi



def _check_offsets(offsets: object, n_tokens: int) -> np.ndarray:
    """Request boundaries as a fresh int64 array (owned by the call) of B + 1
    nondecreasing entries within ``[0, n_tokens]``."""
    off = own_offsets(offsets)
    validate_offsets(off, n_tokens)
    return off


def _check_total(drafted: int, proposed: int) -> None:
    """Refuses a record that would take the drafted-token count beyond int64."""
    if proposed > INT64_MAX - drafted:
        raise OverflowError(
            f"proposed={proposed} would take the drafted-token count beyond int64 "
            f"(already {drafted})"
        )


_STAT_NAMES = ("steps", "drafted", "accepted", "full_accepts")


def _check_stats(stats: object) -> tuple[int, int, int, int]:
    """Unpickled statistics ``(steps, drafted, accepted, full_accepts)``, refused unless
    they are counts that ``record`` could have produced."""
    if not isinstance(stats, tuple):
        raise TypeError(f"stats must be a tuple of 4 counts, got {type(stats).__name__}")
    if len(stats) != 4:
        raise ValueError(f"stats must hold 4 counts {_STAT_NAMES}, got {len(stats)}")
    vals = []
    for name, v in zip(_STAT_NAMES, stats):
        c = check_count(v, f"stats {name}")
        if c > INT64_MAX:
            raise OverflowError(f"stats {name}={c} is beyond int64")
        vals.append(c)
    steps, drafted, accepted, full = vals
    if accepted > drafted:
        raise ValueError(f"stats accepted={accepted} is beyond drafted={drafted}")
    if full > steps or full > accepted:
        raise ValueError(
            f"stats full_accepts={full} is beyond steps={steps} or accepted={accepted}"
        )
    if steps == 0 and drafted:
        raise ValueError(f"stats drafted={drafted} with no recorded step")
    return steps, drafted, accepted, full






# the batch (specfsm._core.batch, specfsm._py.batch): state codes and argument checks
FREE, PREFILL, DECODE, VERIFY, ACCEPT, ROLLBACK, DONE = range(7)
STATE_NAMES = ("free", "prefill", "decode", "verify", "accept", "rollback", "done")
#: at most this many slots per batch and tokens per draft (keeps every index in int32 range)
MAX_SLOTS = 2**24
MAX_DRAFT = 4096

def _ids(x: object, name: str) -> np.ndarray:
    """A 1-D int64 array the call owns (always a fresh copy). Refuses bools, floats,
    strings, 2-D input and ids beyond int64."""
    if isinstance(x, (bool, np.bool_, str, bytes)):
        raise TypeError(f"{name} must be a 1-D sequence of integers, got {type(x).__name__} {x!r}")
    if isinstance(x, np.ndarray):
        arr = as_token_array(x, name)
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a flat sequence of integers ({exc})") from None
        if arr.ndim == 0:
            raise TypeError(f"{name} must be a 1-D sequence of integers, got {type(x).__name__} {x!r}")
        if arr.size == 0:
            arr = np.zeros(0, dtype=np.int64)
        if arr.dtype == object:
            for v in arr.reshape(-1).tolist():
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                    raise TypeError(f"{name} must hold integers, got {type(v).__name__} {v!r}")
            raise OverflowError(f"{name} holds integers beyond int64")
        if arr.dtype.kind == "b" or arr.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
        arr = as_token_array(arr, name)
    return np.array(arr, dtype=np.int64, copy=True)


def _slots(slots: object, capacity: int) -> np.ndarray:
    """Distinct slot numbers in ``[0, capacity)`` as a fresh int64 array."""
    if isinstance(slots, (int, np.integer)) and not isinstance(slots, (bool, np.bool_)):
        slots = [slots]
    s = _ids(slots, "slots")
    if s.shape[0]:
        lo, hi = int(s.min()), int(s.max())
        if lo < 0 or hi >= capacity:
            bad = lo if lo < 0 else hi
            raise IndexError(f"slots holds {bad}, outside the batch's {capacity} slots")
        if np.unique(s).shape[0] != s.shape[0]:
            u, c = np.unique(s, return_counts=True)
            raise ValueError(f"slots must be distinct, got slot {int(u[c > 1][0])} twice")
    return s


def _per_slot(x: object, n: int, name: str) -> np.ndarray:
    """One integer per slot (a scalar applies to every slot) as a fresh int64 array."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        v = int(x)
        if not -(2**63) <= v <= INT64_MAX:
            raise OverflowError(f"{name}={v} is beyond int64")
        return np.full(n, v, dtype=np.int64)
    a = _ids(x, name)
    if a.shape[0] != n:
        raise ValueError(f"{name} holds {a.shape[0]} entries for {n} slots")
    return a


def _ragged(tokens: object, offsets: object, n: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, offsets)`` as fresh int64 arrays: ``n + 1`` nondecreasing offsets from 0
    to ``len(tokens)`` (checked neighbour by neighbour)."""
    t = _ids(tokens, name)
    off = _ids(offsets, f"{name}_offsets" if name != "tokens" else "offsets")
    oname = "offsets" if name == "tokens" else f"{name}_offsets"
    if off.shape[0] != n + 1:
        raise ValueError(f"{oname} holds {off.shape[0]} entries; {n} slots need {n + 1}")
    if off[0] != 0:
        raise ValueError(f"{oname}[0] must be 0, got {int(off[0])}")
    if off[-1] != t.shape[0]:
        raise ValueError(f"{oname}[-1]={int(off[-1])} must equal len({name})={t.shape[0]}")
    if n and not (off[:-1] <= off[1:]).all():
        i = int(np.flatnonzero(off[:-1] > off[1:])[0])
        raise ValueError(
            f"{oname} must be nondecreasing, got {oname}[{i}]={int(off[i])} > "
            f"{oname}[{i + 1}]={int(off[i + 1])}"
        )
    return t, off


def _capacity(capacity: object, k_max: object) -> tuple[int, int]:
    c = check_count(capacity, "capacity")
    k = check_count(k_max, "k_max")
    if not 1 <= c <= MAX_SLOTS:
        raise ValueError(f"capacity must lie in [1, {MAX_SLOTS}], got {c}")
    if not 1 <= k <= MAX_DRAFT:
        raise ValueError(f"k_max must lie in [1, {MAX_DRAFT}], got {k}")
    return c, k


def _indexes(indexes: object, n: int) -> list:
    """One NgramIndex (of this implementation) or None per admitted slot."""
    if indexes is None:
        return [None] * n
    try:
        out = list(indexes)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"indexes must be a sequence of NgramIndex or None, got {type(indexes).__name__}") from None
    if len(out) != n:
        raise ValueError(f"indexes holds {len(out)} entries for {n} slots")
    return out


def _check_index_types(ixs: list, cls: type | tuple[type, ...]) -> None:
    """Each entry None or an instance of ``cls`` (the batch's index classes)."""
    for j, ix in enumerate(ixs):
        if ix is not None and not isinstance(ix, cls):
            raise TypeError(
                f"indexes[{j}] must be an NgramIndex or SuffixIndex of the same implementation, "
                "or None, "
                f"got {type(ix).__module__}.{type(ix).__name__}"
            )


#: rule kinds the step knows: greedy exact, min-run, speculative sampling, typical, any other
R_EXACT, R_MINRUN, R_SPEC, R_TYPICAL, R_OTHER = range(5)


def _rule_kind(rule: object) -> tuple[int, int]:
    """``(kind, m)`` for a rule; refuses objects that are not rules."""
    if rule is None:
        return R_EXACT, 0
    name = type(rule).__name__
    mod = type(rule).__module__
    if mod == "specfsm.accept_rule":
        if name == "Exact":
            return R_EXACT, 0
        if name == "MinRun":
            return R_MINRUN, int(rule.m)  # type: ignore[attr-defined]
        if name == "SpeculativeSampling":
            return R_SPEC, 0
        if name == "TypicalAcceptance":
            return R_TYPICAL, 0
    if callable(getattr(rule, "accepted_rows", None)):
        return R_OTHER, 0
    raise TypeError(f"rule must be None or an acceptance rule (with accepted_rows), got {name}")


def _probs_rows(probs: object, n_rows: int) -> np.ndarray:
    if probs is None:
        raise TypeError("this rule needs probs: one probability row per evaluated row (N x V)")
    if not isinstance(probs, np.ndarray):
        probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] != n_rows:
        raise ValueError(f"probs must be {n_rows} x V (one row per evaluated row), got shape {probs.shape}")
    return probs


class _Required:
    """The default that marks a required parameter of the compiled batch's methods:
    Cython's own message for a missing positional argument does not name it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<required>"


#: see ``_Required``; ``_missing`` raises the TypeError Python itself would
REQUIRED = _Required()


def _missing(method: str, names: tuple[str, ...], values: tuple[object, ...]) -> None:
    """TypeError naming the parameters of ``method`` left at ``REQUIRED`` (as Python's
    own message for a missing positional argument does)."""
    gone = [n for n, v in zip(names, values) if v is REQUIRED]
    if gone:
        shown = " and ".join(repr(n) for n in gone)
        plural = "s" if len(gone) > 1 else ""
        raise TypeError(f"{method}() missing {len(gone)} required positional argument{plural}: {shown}")


def _resume_index(slots: np.ndarray, rows: np.ndarray, capacity: object) -> np.ndarray:
    """``StepResult.resume_index``: ``rows`` (one per entry of ``slots``) scattered into
    ``capacity`` entries, -1 for a slot the step did not evaluate. Refuses a capacity
    that does not cover every slot of the step."""
    c = check_count(capacity, "capacity")
    if slots.shape[0] and int(slots.min()) < 0:
        raise ValueError(f"slots holds {int(slots.min())}: a step's slots are non-negative")
    if slots.shape[0] and int(slots.max()) >= c:
        raise ValueError(
            f"capacity={c} does not cover slot {int(slots.max())} of this step: "
            "resume_index needs the batch's capacity"
        )
    out = np.full(c, -1, dtype=np.int64)
    out[slots] = rows
    return out


def _illegal(attempted: str, slots: list[int], states: list[int], reasons: list[str] | None = None):
    """``IllegalTransition(attempted)`` naming the slots and the state each was in."""
    names = [STATE_NAMES[s] for s in states]
    rs = list(reasons) if reasons else [None] * len(slots)
    shown = "; ".join(
        f"slot {s} ({n}): {r}" if r else f"slot {s} is in {n}" for s, n, r in zip(slots[:8], names[:8], rs[:8])
    )
    more = f"; and {len(slots) - 8} more slots" if len(slots) > 8 else ""
    reason = shown + more
    err = _IllegalTransition(attempted, reason)
    err.slots = list(slots)
    err.states = names
    return err
