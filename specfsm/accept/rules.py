"""Acceptance rules: how many drafted rows a verify evaluation keeps.

``Verify.accept_rows`` takes the accepted count from the caller; the rules here
decide it. Row convention (the one ``specfsm.machine.state`` uses throughout): a K-token draft is
verified in one K-row
evaluation; row 0 follows ``last`` and row ``i > 0`` follows ``draft[i - 1]``, so
``choices[i]`` (or ``target_probs[i]``) is the target's view of position ``draft[i]``.

- ``Exact()``: the leading rows where draft and choice agree (greedy decoding).
- ``MinRun(m)``: that count when it is at least ``m``, else 0.
- ``SpeculativeSampling(seed=...)``: the rejection-sampling rule that keeps the emitted
  tokens distributed exactly as the target's.
- ``TypicalAcceptance()``: a relaxed rule accepting any token the target finds typical.

``accept_with(state, rule, ...)`` (also ``Verify.accept_with(rule, ...)``) goes from a
rule to the next state in one call. The batched methods (``Exact.accept_batch``,
``MinRun.accept_batch``, ``SpeculativeSampling.sample_batch``,
``TypicalAcceptance.accept_batch``) run B ragged drafts at once on the compiled core,
GIL released (see ``specfsm.accept._accept_py`` for the flat-array-plus-offsets layout;
``pack_ragged`` builds it from a list of drafts).

There is no bonus row: a K-row verify yields K probability rows, so when all K rows are
accepted ``row_tokens`` is the K draft tokens and decoding resumes from ``draft[-1]``
exactly as ``Verify.accept`` builds its ``Accept``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from .. import _impl
from .._checks import check_count, nonnegative_real, token_ids
from ._checks import PROB_ATOL
from ..errors import IllegalTransition

__all__ = [
    "AcceptRule",
    "Exact",
    "MinRun",
    "SpeculativeSampling",
    "TypicalAcceptance",
    "accept_with",
    "select_rows",
    "pack_ragged",
    "PROB_ATOL",
]

# The active implementation's kernels, bound once at import (``specfsm._impl``).
_common_prefix = _impl.load("prefix").common_prefix
_accept = _impl.load("accept")


@runtime_checkable
class AcceptRule(Protocol):
    """Decides how many leading draft rows to keep, given the target's per-row choices."""

    def accepted_rows(self, draft: Any, choices: Any) -> int: ...


def pack_ragged(seqs: Any, dtype: Any = np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Lay B token sequences end to end: ``(flat, offsets)`` for the batched kernels."""
    lens = [len(s) for s in seqs]
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    if not lens or offsets[-1] == 0:
        return np.zeros(0, dtype=dtype), offsets
    flat = np.concatenate([np.asarray(s, dtype=dtype).reshape(-1) for s in seqs])
    return flat, offsets


class Exact:
    """Greedy exact match: the number of leading rows where draft and choice agree
    (the equality and verifier-exact policies of the Rust design specfsm was ported from)."""

    __slots__ = ()
    kind = "exact"  # how the batch step tells the rule apart (specfsm.accept._checks.rule_kind)

    def accepted_rows(self, draft: Any, choices: Any) -> int:
        return _common_prefix(draft, choices)

    def select(self, draft: Any, choices: Any) -> tuple[int, Any]:
        """``(accepted, row_tokens)``: the row tokens are the target's choices."""
        return _common_prefix(draft, choices), choices

    def accept_batch(self, draft: Any, choices: Any, offsets: Any) -> tuple[np.ndarray, np.ndarray]:
        """B ragged drafts at once: ``(tokens int32 [B, K_max + 1] padded with -1,
        accepted int32 [B])``; ``choices`` is flat like ``draft``."""
        return _accept.exact_batch(draft, choices, offsets)

    def __repr__(self) -> str:
        return "Exact()"

    def __eq__(self, other: object) -> bool:
        return type(other) is Exact

    def __hash__(self) -> int:
        return hash(Exact)


class MinRun:
    """The exact-match count when it is at least ``m``, else 0 (the anchor-macro policy of
    the Rust design specfsm was ported from is ``MinRun(3)``). Refuses a negative or
    non-integer ``m``."""

    __slots__ = ("m",)
    kind = "min_run"  # how the batch step tells the rule apart (specfsm.accept._checks.rule_kind)
    m: int

    def __init__(self, m: int) -> None:
        object.__setattr__(self, "m", check_count(m, "m"))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("MinRun is immutable")

    def accepted_rows(self, draft: Any, choices: Any) -> int:
        n = _common_prefix(draft, choices)
        return n if n >= self.m else 0

    def select(self, draft: Any, choices: Any) -> tuple[int, Any]:
        return self.accepted_rows(draft, choices), choices

    def accept_batch(self, draft: Any, choices: Any, offsets: Any) -> tuple[np.ndarray, np.ndarray]:
        """Batched ``MinRun``; same layout as ``Exact.accept_batch``."""
        return _accept.min_run_batch(draft, choices, offsets, self.m)

    def __repr__(self) -> str:
        return f"MinRun({self.m})"

    def __eq__(self, other: object) -> bool:
        return type(other) is MinRun and other.m == self.m

    def __hash__(self) -> int:
        return hash((MinRun, self.m))


def _single(draft: Any, name: str = "draft") -> np.ndarray:
    d = token_ids(draft, name)
    if d.shape[0] == 0:
        raise ValueError("draft is empty: there is no row to accept")
    return d


class SpeculativeSampling:
    """Speculative (rejection) sampling: the emitted tokens are distributed exactly as
    the target's ``p``.

    Row i is accepted when ``p_i(x_i) > 0`` and ``u_i * q_i(x_i) <= p_i(x_i)`` (that is,
    ``u_i <= min(1, p/q)``; a token the target rules out is never kept), ``u_i`` uniform
    in [0, 1); at the first rejected row the token is drawn from
    ``max(0, p - q)`` normalised. Drafts without probabilities (n-gram drafts) pass
    ``draft_probs=None``: q is one-hot on the drafted token. Draws come from ``rng`` (a
    ``numpy.random.Generator``) or a new ``default_rng(seed)``; each request consumes
    exactly K + 1 draws, so a batch gives the same result as its requests one by one.
    """

    __slots__ = ("rng",)
    kind = "speculative"  # how the batch step tells the rule apart (specfsm.accept._checks.rule_kind)

    def __init__(self, rng: np.random.Generator | None = None, seed: Any = None) -> None:
        if rng is not None and seed is not None:
            raise ValueError("pass rng or seed, not both")
        if rng is None:
            rng = np.random.default_rng(seed)
        elif not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        self.rng = rng

    def sample_rows(
        self, draft: Any, target_probs: Any, draft_probs: Any = None, *, check: bool = True
    ) -> tuple[int, list[int]]:
        """``(accepted, row_tokens)`` for one draft: ``target_probs`` (and ``draft_probs``)
        K x V. ``row_tokens`` is the accepted draft tokens followed by the token drawn at
        the first rejected row; all K accepted: the K draft tokens (no bonus row).
        ``check=False`` skips the O(K V) probability-row check (ids and shapes are
        still checked). Refuses an empty draft and the inputs ``speculative_batch``
        refuses."""
        d = _single(draft)
        k = d.shape[0]
        # the kernel draws K + 1 uniforms from rng only once every argument is checked,
        # so a refused call leaves the stream where it was
        out, acc = _accept.speculative_batch(
            d, np.array([0, k], dtype=np.int64), target_probs, draft_probs, self.rng, check
        )
        n = int(acc[0])
        return n, out[0, : n + 1 if n < k else k].tolist()

    def select(self, draft: Any, target_probs: Any, draft_probs: Any = None, **kw: Any):
        return self.sample_rows(draft, target_probs, draft_probs, **kw)

    def accepted_rows(self, draft: Any, choices: Any) -> int:
        """``AcceptRule`` form: ``choices`` is the K x V target probabilities (consumes
        K + 1 draws)."""
        return self.sample_rows(draft, choices)[0]

    def sample_batch(
        self, draft: Any, offsets: Any, target_probs: Any, draft_probs: Any = None,
        *, check: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """B ragged drafts at once (flat ``draft`` with ``offsets``; ``target_probs`` N x
        V with one row per draft row): ``(tokens int32 [B, K_max + 1] padded with -1,
        accepted int32 [B])``. Draws N + B uniforms from ``rng``, after every argument
        has been checked (a refused call draws nothing)."""
        return _accept.speculative_batch(draft, offsets, target_probs, draft_probs, self.rng, check)

    def __repr__(self) -> str:
        return f"SpeculativeSampling(rng={self.rng!r})"


class TypicalAcceptance:
    """Typical acceptance: row i is accepted while ``p_i(x_i) > min(posterior_threshold,
    posterior_alpha * exp(-H(p_i)))``; at the first rejected row the target's greedy
    choice (argmax) is emitted. Deterministic; refuses thresholds that are negative or
    not finite."""

    __slots__ = ("posterior_threshold", "posterior_alpha")
    kind = "typical"  # how the batch step tells the rule apart (specfsm.accept._checks.rule_kind)

    def __init__(self, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> None:
        self.posterior_threshold = nonnegative_real(posterior_threshold, "posterior_threshold")
        self.posterior_alpha = nonnegative_real(posterior_alpha, "posterior_alpha")

    def sample_rows(self, draft: Any, target_probs: Any, *, check: bool = True) -> tuple[int, list[int]]:
        """``(accepted, row_tokens)`` for one draft and its K x V target probabilities."""
        d = _single(draft)
        k = d.shape[0]
        out, acc = _accept.typical_batch(
            d, np.array([0, k], dtype=np.int64), target_probs,
            self.posterior_threshold, self.posterior_alpha, check,
        )
        n = int(acc[0])
        return n, out[0, : n + 1 if n < k else k].tolist()

    def select(self, draft: Any, target_probs: Any, **kw: Any) -> tuple[int, list[int]]:
        return self.sample_rows(draft, target_probs, **kw)

    def accepted_rows(self, draft: Any, choices: Any) -> int:
        """``AcceptRule`` form: ``choices`` is the K x V target probabilities."""
        return self.sample_rows(draft, choices)[0]

    def accept_batch(
        self, draft: Any, offsets: Any, target_probs: Any, *, check: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """B ragged drafts at once; same layout as ``SpeculativeSampling.sample_batch``."""
        return _accept.typical_batch(
            draft, offsets, target_probs, self.posterior_threshold, self.posterior_alpha, check
        )

    def __repr__(self) -> str:
        return (
            f"TypicalAcceptance(posterior_threshold={self.posterior_threshold!r}, "
            f"posterior_alpha={self.posterior_alpha!r})"
        )


def select_rows(rule: Any, draft: Any, choices: Any, *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """``(accepted, row_tokens)``: what ``rule`` keeps of ``draft`` given ``choices``.

    A rule with ``select`` (the four here) decides both; any other ``AcceptRule`` gives
    the count and ``choices`` are the row tokens (it takes no further arguments). Refuses
    anything that is not a rule (TypeError)."""
    select = getattr(rule, "select", None)
    if select is not None:
        return select(draft, choices, *args, **kwargs)
    if isinstance(rule, AcceptRule):
        if args or kwargs:
            raise TypeError(f"{type(rule).__name__} takes (choices, row_caches) only")
        return rule.accepted_rows(draft, choices), choices
    raise TypeError(
        f"rule must be an AcceptRule (with accepted_rows), got {type(rule).__name__}"
    )


def accept_with(state: Any, rule: Any, choices: Any, row_caches: Any, *args: Any, **kwargs: Any):
    """``Verify -> Accept | Rollback`` with the count decided by ``rule``, in one call
    (the same as ``state.accept_with(rule, choices, row_caches, ...)``).

    ``choices``: the target's per-row greedy choices for ``Exact``/``MinRun`` (and any
    ``AcceptRule`` that only has ``accepted_rows``), the K x V target probabilities for
    ``SpeculativeSampling`` (then ``draft_probs=`` may follow) and ``TypicalAcceptance``.
    ``row_caches``: one cache per draft row, as for ``accept_rows``. Raises
    ``IllegalTransition("accept_with")`` from any state but ``Verify`` (and for anything
    that is not a state).
    """
    # every ServingState has the method (refused but by Verify); this module does not
    # import specfsm.machine.state, which imports it
    method = getattr(type(state), "accept_with", None)
    if method is None:
        raise IllegalTransition("accept_with")
    return method(state, rule, choices, row_caches, *args, **kwargs)
