"""Plain reference implementations, written from the seed, that both the compiled core
and the twin are checked against."""

from __future__ import annotations


def leading_equal(draft, choices) -> int:
    """The seed's zip/take_while/count: leading rows where draft and choice agree."""
    n = 0
    for drafted, chosen in zip(draft, choices):
        if drafted != chosen:
            break
        n += 1
    return n


def draft_prompt_lookup(history, ngram: int, max_k: int) -> list:
    """The seed's ``draft_prompt_lookup``, slice for slice."""
    h = list(history)
    if ngram == 0 or max_k == 0 or len(h) <= ngram:
        return []
    needle = h[len(h) - ngram :]
    for start in range(len(h) - ngram - 1, -1, -1):
        if h[start : start + ngram] == needle:
            end = start + ngram
            return h[end : end + min(len(h) - end, max_k)]
    return []


def settle_index(draft_len: int, accepted: int, n_tokens: int, n_caches: int) -> int | None:
    """The seed's ``settle`` refusals and placement index (None where it refuses)."""
    if (
        draft_len == 0
        or (accepted < draft_len and n_tokens <= accepted)
        or n_caches != draft_len
        or accepted > draft_len
    ):
        return None
    return accepted - 1 if accepted == draft_len else accepted


class OverAcceptingRule:
    """A deliberately wrong acceptance rule: keeps one row past the first disagreement.
    Oracle checks must catch it."""

    def accepted_rows(self, draft, choices) -> int:
        return min(leading_equal(draft, choices) + 1, len(draft))
