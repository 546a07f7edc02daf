"""Prefix matching of a draft against the target's row tokens (pure-Python twin)."""

from __future__ import annotations

from .._checks import entries

__all__ = ["common_prefix"]


def common_prefix(draft: object, row_tokens: object) -> int:
    """How many leading entries of ``draft`` and ``row_tokens`` are equal (the greedy
    acceptance count ``ServingState.accept`` uses).

    Entries compare with ``==`` (identity counts as equal, as in CPython's containers);
    integer numpy arrays compare by value whatever their dtype.
    """
    a = entries(draft, "draft", listed=True)
    b = entries(row_tokens, "row_tokens", listed=True)
    n = 0
    for x, y in zip(a, b):
        if not (x is y or x == y):
            break
        n += 1
    return n
