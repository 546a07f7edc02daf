"""Prompt-lookup (n-gram) drafting (pure-Python twin)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._checks import INT64_MAX, INT64_MIN, check_count, entries, token_id, token_ids

__all__ = ["prompt_lookup"]


def _id_at(h: Sequence, i: int, n: int) -> int:
    """Entry ``i`` of ``h`` (``n`` entries) as a token id (``specfsm._checks.token_id``)."""
    x = h[i]
    if type(x) is int and INT64_MIN <= x <= INT64_MAX:
        return x
    v = token_id(x, "history", i)
    if len(h) != n:  # a numpy-integer subclass's __index__ may have changed the list
        raise RuntimeError("history changed size during prompt_lookup")
    return v


def _match_end(h: Sequence, ngram: int) -> int:
    """End of the most recent earlier occurrence of ``h``'s last ``ngram`` ids, or -1.

    Reads the entries in the compiled kernel's order, so both raise for the same first
    bad entry: the needle (the last ``ngram`` entries) first, then candidate ends from
    ``n - 2`` down, and for a candidate whose entry equals the needle's last, its other
    ``ngram - 1`` entries from the front.
    """
    n = len(h)
    if ngram == 0 or n <= ngram:
        return -1
    base = n - ngram
    needle = [_id_at(h, base + j, n) for j in range(ngram)]
    lo = ngram - 1
    last = needle[lo]
    last_obj = h[n - 1]  # an entry that is this very object equals it: not read again
    for e in range(n - 2, lo - 1, -1):
        if h[e] is not last_obj and _id_at(h, e, n) != last:
            continue
        s = e - lo
        j = 0
        while j < lo and _id_at(h, s + j, n) == needle[j]:
            j += 1
        if j == lo:
            return e + 1
    return -1


def prompt_lookup(history: object, ngram: object, max_k: object):
    """Draft up to ``max_k`` ids that followed the most recent earlier occurrence of
    ``history``'s last ``ngram`` ids (``draft_prompt_lookup`` of the original design).

    ``history`` holds token ids: a 1-D integer numpy array, or a list or tuple (or other
    sequence) of Python ints or numpy integers. Returns an empty draft when ``ngram`` or
    ``max_k`` is 0, when ``history`` is not longer than ``ngram``, or when there is no
    earlier occurrence. A numpy ``history`` gives a numpy draft (a plain ndarray) of the
    same dtype, cut from the ids as converted (the history is read once); anything else
    gives a list of Python ints. A list entry that the search reads and that is not a
    token id raises TypeError naming it (OverflowError beyond int64).
    """
    ngram = check_count(ngram, "ngram")
    max_k = check_count(max_k, "max_k")
    if isinstance(history, np.ndarray):
        # read once: the draft is cut from the converted ids, in the caller's dtype
        dt = history.dtype
        arr = token_ids(history, "history")
        ids = arr.tolist()
        end = -1 if max_k == 0 else _match_end(ids, ngram)
        if end < 0:
            return np.empty(0, dtype=dt)
        return np.array(arr[end : end + min(len(ids) - end, max_k)], dtype=dt)
    h = entries(history, "history", listed=True)
    n = len(h)
    end = -1 if max_k == 0 else _match_end(h, ngram)
    if end < 0:
        return []
    return [_id_at(h, i, n) for i in range(end, end + min(n - end, max_k))]
