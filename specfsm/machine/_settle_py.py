"""Settling a verify evaluation: validation and the placement choice (pure-Python twin)."""

from __future__ import annotations

from .._checks import INT64_MAX, check_count
from ._checks import settle_reason
from ..errors import IllegalTransition

__all__ = ["settle"]


def _length(value: object, name: str) -> int:
    """A length: a non-negative integer within int64 (``check_count``'s TypeError and
    ValueError, OverflowError beyond int64, each naming ``name``)."""
    if type(value) is not int or value < 0:
        value = check_count(value, name)
    if value > INT64_MAX:  # type: ignore[operator]
        raise OverflowError(f"{name}={value} is beyond int64")
    return value  # type: ignore[return-value]


def settle(
    draft_len: int, accepted: object, n_row_tokens: int, n_row_caches: int, attempted: str
) -> int:
    """Index of the row cache to resume from after accepting ``accepted`` of ``draft_len`` rows.

    That is ``accepted`` when a draft row was rejected, ``accepted - 1`` when every row
    was accepted. Refuses (``IllegalTransition(attempted, reason)``, the reason from
    ``specfsm.machine._checks.settle_reason``, the same text in both implementations) an empty
    draft, ``accepted`` beyond the draft, a ``row_caches`` that is not one entry per draft
    row, and a ``row_tokens`` that does not reach row ``accepted`` when a row was rejected.
    ``attempted`` that is not a str raises TypeError; ``accepted`` that is not a
    non-negative integer TypeError/ValueError; ``draft_len``, ``n_row_tokens`` and
    ``n_row_caches`` that are not non-negative integers within int64
    TypeError/ValueError/OverflowError (converted in argument order, each naming itself).
    """
    if not isinstance(attempted, str):
        raise TypeError(f"attempted must be a transition name (str), got {type(attempted).__name__}")
    draft_len = _length(draft_len, "draft_len")
    if type(accepted) is not int or accepted < 0:
        accepted = check_count(accepted, "accepted")
    n_row_tokens = _length(n_row_tokens, "n_row_tokens")
    n_row_caches = _length(n_row_caches, "n_row_caches")
    reason = settle_reason(draft_len, accepted, n_row_tokens, n_row_caches)  # type: ignore[arg-type]
    if reason is not None:
        raise IllegalTransition(attempted, reason)
    return accepted - 1 if accepted == draft_len else accepted  # type: ignore[operator,return-value]
