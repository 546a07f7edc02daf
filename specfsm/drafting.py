"""Drafting helpers: prompt lookup over the tokens a request has produced so far."""

from __future__ import annotations

from typing import Any

from . import _impl

__all__ = ["prompt_lookup", "common_prefix"]


def prompt_lookup(history: Any, ngram: int, max_k: int) -> Any:
    """Draft up to ``max_k`` tokens that followed the most recent earlier occurrence of
    ``history``'s last ``ngram`` tokens (``draft_prompt_lookup`` of the Rust design specfsm
    was ported from).

    ``history`` is a list or tuple of any values with ``==`` (integer lists take the
    compiled path), or a 1-D integer numpy array (int32 or int64; narrower integer
    dtypes are widened). Returns a list, or for a numpy ``history`` a numpy array of
    its dtype. The draft is empty when ``ngram`` or ``max_k`` is 0, ``history`` is not
    longer than ``ngram``, or nothing earlier matches. Refuses negative or non-integer
    ``ngram``/``max_k``, 2-D arrays and non-integer dtypes.
    """
    return _impl.current().prompt_lookup(history, ngram, max_k)


def common_prefix(draft: Any, row_tokens: Any) -> int:
    """How many leading entries of ``draft`` and ``row_tokens`` are equal (the greedy
    acceptance count ``ServingState.accept`` uses)."""
    return _impl.current().common_prefix(draft, row_tokens)
