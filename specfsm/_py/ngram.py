"""Prompt-lookup (n-gram) drafting (pure-Python twin)."""

from __future__ import annotations

import numpy as np

from .._validate import as_token_array, check_count
from ._seq import as_entries

__all__ = ["prompt_lookup"]


def _match_end(h, ngram: int) -> int:
    """End of the most recent earlier occurrence of ``h``'s last ``ngram`` entries, or -1."""
    n = len(h)
    if ngram == 0 or n <= ngram:
        return -1
    search_end = n - ngram
    needle = list(h[search_end:])
    for start in range(search_end - 1, -1, -1):
        if list(h[start : start + ngram]) == needle:
            return start + ngram
    return -1


def prompt_lookup(history: object, ngram: object, max_k: object):
    """Draft up to ``max_k`` entries that followed the most recent earlier occurrence of
    ``history``'s last ``ngram`` entries.

    Returns an empty draft when ``ngram`` or ``max_k`` is 0, when ``history`` is not
    longer than ``ngram``, or when there is no earlier occurrence. A numpy ``history``
    gives a numpy draft of the same dtype; anything else gives a list.
    """
    ngram = check_count(ngram, "ngram")
    max_k = check_count(max_k, "max_k")
    if isinstance(history, np.ndarray):
        h = as_token_array(history, "history").tolist()
    else:
        h = as_entries(history, "history")
    end = -1 if max_k == 0 else _match_end(h, ngram)
    if end < 0:
        return history[:0].copy() if isinstance(history, np.ndarray) else []
    take = min(len(h) - end, max_k)
    if isinstance(history, np.ndarray):
        return history[end : end + take].copy()
    return list(h[end : end + take])
