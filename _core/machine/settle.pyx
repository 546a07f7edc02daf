# cython: language_level=3
"""Settling a verify evaluation: validation and the placement choice (compiled)."""

from libc.stdint cimport int64_t

from specfsm._checks import check_count
from specfsm.machine._checks import settle_reason
from specfsm.errors import IllegalTransition

__all__ = ["settle"]

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1


cdef int64_t _length(object value, str name) except -1:
    """A length: a non-negative integer within int64 (``check_count``'s TypeError and
    ValueError, OverflowError beyond int64, each naming ``name``), as the twin's."""
    cdef int overflow = 0
    cdef long long v
    if type(value) is int:
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow and v >= 0:
            return v
    value = check_count(value, name)   # raises for what is not a count
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        raise OverflowError(f"{name}={value} is beyond int64")
    return v


def settle(draft_len, accepted, n_row_tokens, n_row_caches, attempted):
    cdef int64_t d, t, c, n
    if not isinstance(attempted, str):
        raise TypeError(f"attempted must be a transition name (str), got {type(attempted).__name__}")
    d = _length(draft_len, "draft_len")
    if type(accepted) is not int or accepted < 0:
        accepted = check_count(accepted, "accepted")
    t = _length(n_row_tokens, "n_row_tokens")
    c = _length(n_row_caches, "n_row_caches")
    # compared as Python ints: ``accepted`` may not fit an int64, and d + 1 would wrap
    # at INT64_MAX
    if accepted > d:
        raise IllegalTransition(attempted, settle_reason(d, accepted, t, c))
    n = accepted
    if d == 0 or c != d or (n < d and t <= n):
        raise IllegalTransition(attempted, settle_reason(d, accepted, t, c))
    return n - 1 if n == d else n
