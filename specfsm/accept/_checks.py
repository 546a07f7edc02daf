"""Argument checks of the acceptance rules and their kernels.

Preparing the exact, speculative and typical kernels' arguments, probability rows,
uniforms, and telling the rules apart by kind. Shared by ``specfsm.accept.rules``, the
compiled ``specfsm._core.accept``/``batch`` and their twins, so both raise the same
errors.

Every ``prepare_*`` first converts all of its arguments (running whatever Python code
that takes: ``__index__``, ``__float__``, ``__array__``, ``__bool__``), taking private
copies of the small control arrays (draft, choices, offsets, uniforms), and only then
validates, on those copies. Nothing the caller holds can change them afterwards, so the
compiled kernels may read them with the GIL released.
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    INT32_MAX,
    LIST_CHECK_MAX,
    as_real,
    check_offsets,
    check_real,
    host_array,
    int64_ids,
    token_ids,
)

__all__ = [
    "PROB_ATOL",
    "PROB_OK",
    "PROB_NONFINITE",
    "PROB_NEGATIVE",
    "PROB_BADSUM",
    "R_EXACT",
    "R_MINRUN",
    "R_SPEC",
    "R_TYPICAL",
    "R_OTHER",
    "RULE_KINDS",
    "draft_offsets",
    "check_id_range",
    "prepare_exact",
    "as_prob_rows",
    "check_name",
    "as_uniforms",
    "check_uniforms",
    "draw_uniforms",
    "prepare_speculative",
    "prepare_typical",
    "prob_error",
    "rule_kind",
    "step_probs",
]

#: How far a probability row's sum may stray from 1 (absolute, summed in float64).
PROB_ATOL = 1e-3

# What the probability-row check found (the compiled check returns the same codes).
PROB_OK, PROB_NONFINITE, PROB_NEGATIVE, PROB_BADSUM = 0, 1, 2, 3

#: rule kinds the batch step knows: greedy exact, min-run, speculative sampling, typical,
#: any other rule (called through its ``accepted_rows``)
R_EXACT, R_MINRUN, R_SPEC, R_TYPICAL, R_OTHER = range(5)
#: a rule class's own ``kind`` attribute (``specfsm.accept.rules``) -> its code
RULE_KINDS = {"exact": R_EXACT, "min_run": R_MINRUN, "speculative": R_SPEC, "typical": R_TYPICAL}

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def draft_offsets(off: np.ndarray, total: int, name: str = "offsets") -> int:
    """K_max (the longest draft), refusing owned offsets that break the (tokens,
    offsets) contract for a flat draft of ``total`` rows."""
    return check_offsets(off, total, None, name, "draft")


def check_id_range(arr: np.ndarray, name: str, hi: int, what: str) -> None:
    """Refuse ids outside [0, hi)."""
    n = arr.shape[0]
    if n == 0:
        return
    if n <= LIST_CHECK_MAX:
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

    ``fast``: the compiled module's ``(draft_offsets, check_id_range)``, loops in C with
    the same results and errors as this module's (which they call to raise)."""
    offsets_check, ids_check = fast or (draft_offsets, check_id_range)
    d = token_ids(draft, "draft", own=True)
    c = token_ids(choices, "choices", own=True)
    off = int64_ids(offsets, "offsets")
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


def check_name(name: object) -> None:
    """Refuse (TypeError) a ``name`` for messages that is not a str."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (the argument's name in messages), got {type(name).__name__}")


def as_prob_rows(x: object, name: str) -> np.ndarray:
    """A C-contiguous, native float32/float64 2-D ndarray (not a subclass) of ``x``;
    read in place when it already is one (a CPU tensor: a view of its memory)."""
    x = host_array(x, name)
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
    if need <= LIST_CHECK_MAX:
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
    ``draw_uniforms``) after its own remaining checks; P and Q are then private copies
    when it is a Generator subclass (whose ``random`` runs Python code after the
    checks). ``fast``: as for ``prepare_exact``."""
    offsets_check, ids_check = fast or (draft_offsets, check_id_range)
    d = token_ids(draft, "draft", own=True)
    off = int64_ids(offsets, "offsets")
    p = as_prob_rows(target_probs, "target_probs")
    q = None if draft_probs is None else as_prob_rows(draft_probs, "draft_probs")
    u, gen = as_uniforms(uniforms)
    if gen is not None and type(gen) is not np.random.Generator:
        # a subclass's random() is Python code that runs after every check (and may
        # reshape, retype or rewrite the caller's arrays): the kernels read rows it
        # cannot reach, the call's own copies
        p = np.array(p, order="C", copy=True)
        q = None if q is None else np.array(q, order="C", copy=True)
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


def prepare_typical(draft, offsets, target_probs, posterior_threshold, posterior_alpha,
                    fast=None):
    """(draft, offsets, P, threshold, alpha, K_max) converted, then checked (``fast``: as
    for ``prepare_exact``)."""
    offsets_check, ids_check = fast or (draft_offsets, check_id_range)
    thr = as_real(posterior_threshold, "posterior_threshold")
    alpha = as_real(posterior_alpha, "posterior_alpha")
    d = token_ids(draft, "draft", own=True)
    off = int64_ids(offsets, "offsets")
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


def rule_kind(rule: object) -> tuple[int, int]:
    """``(kind, m)`` for a rule: None is greedy exact; a class that declares its own
    ``kind`` (``specfsm.accept.rules``'s rules: a subclass that does not declare one is
    another rule) gets that kind's code, ``m`` for a min-run rule; any other object with
    ``accepted_rows`` is ``R_OTHER``. Refuses objects that are not rules."""
    if rule is None:
        return R_EXACT, 0
    declared = vars(type(rule)).get("kind")
    kind = RULE_KINDS.get(declared) if type(declared) is str else None
    if kind is not None:
        return kind, (int(rule.m) if kind == R_MINRUN else 0)  # type: ignore[attr-defined]
    if callable(getattr(rule, "accepted_rows", None)):
        return R_OTHER, 0
    raise TypeError(
        f"rule must be None or an acceptance rule (with accepted_rows), got {type(rule).__name__}"
    )


def step_probs(probs: object, n_rows: int) -> np.ndarray:
    """The batch step's ``probs``: one row per evaluated row (N x V)."""
    if probs is None:
        raise TypeError("this rule needs probs: one probability row per evaluated row (N x V)")
    probs = host_array(probs, "probs")
    if not isinstance(probs, np.ndarray):
        probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] != n_rows:
        raise ValueError(f"probs must be {n_rows} x V (one row per evaluated row), got shape {probs.shape}")
    return probs
