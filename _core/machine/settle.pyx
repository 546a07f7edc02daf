# cython: language_level=3
"""Settling a verify evaluation: validation and the placement choice (compiled)."""

from specfsm._checks import check_count
from specfsm.machine._checks import settle_reason
from specfsm.errors import IllegalTransition

__all__ = ["settle"]


def settle(Py_ssize_t draft_len, accepted, Py_ssize_t n_row_tokens, Py_ssize_t n_row_caches,
           str attempted):
    """Index of the row cache to resume from after accepting ``accepted`` of ``draft_len`` rows.

    That is ``accepted`` when a draft row was rejected, ``accepted - 1`` when every row
    was accepted. Refuses (``IllegalTransition(attempted, reason)``, the reason from
    ``specfsm.machine._checks.settle_reason``, the same text in both implementations) an empty
    draft, ``accepted`` beyond the draft, a ``row_caches`` that is not one entry per draft
    row, and a ``row_tokens`` that does not reach row ``accepted`` when a row was rejected.
    ``accepted`` that is not a non-negative integer raises TypeError/ValueError.
    """
    cdef Py_ssize_t n
    if type(accepted) is not int or accepted < 0:
        accepted = check_count(accepted, "accepted")
    # compared as Python ints: ``accepted`` may not fit a Py_ssize_t, and draft_len + 1
    # would wrap at PY_SSIZE_T_MAX
    if accepted > draft_len:
        raise IllegalTransition(
            attempted, settle_reason(draft_len, accepted, n_row_tokens, n_row_caches))
    n = accepted
    if (draft_len == 0 or n_row_caches != draft_len
            or (n < draft_len and n_row_tokens <= n)):
        raise IllegalTransition(
            attempted, settle_reason(draft_len, accepted, n_row_tokens, n_row_caches))
    return n - 1 if n == draft_len else n
