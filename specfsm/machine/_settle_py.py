"""Settling a verify evaluation: validation and the placement choice (pure-Python twin)."""

from __future__ import annotations

from .._checks import check_count
from ._checks import settle_reason
from ..errors import IllegalTransition

__all__ = ["settle"]


def settle(
    draft_len: int, accepted: object, n_row_tokens: int, n_row_caches: int, attempted: str
) -> int:
    """Index of the row cache to resume from after accepting ``accepted`` of ``draft_len`` rows.

    That is ``accepted`` when a draft row was rejected, ``accepted - 1`` when every row
    was accepted. Refuses (``IllegalTransition(attempted, reason)``, the reason from
    ``specfsm.machine._checks.settle_reason``, the same text in both implementations) an empty
    draft, ``accepted`` beyond the draft, a ``row_caches`` that is not one entry per draft
    row, and a ``row_tokens`` that does not reach row ``accepted`` when a row was rejected.
    ``accepted`` that is not a non-negative integer raises TypeError/ValueError.
    """
    if type(accepted) is not int or accepted < 0:
        accepted = check_count(accepted, "accepted")
    reason = settle_reason(draft_len, accepted, n_row_tokens, n_row_caches)
    if reason is not None:
        raise IllegalTransition(attempted, reason)
    return accepted - 1 if accepted == draft_len else accepted
