"""Drafting helpers: prompt lookup over the tokens a request has produced so far, the
greedy acceptance count, and ``PromptLookupDrafter`` (prompt lookup as a drafter of
``specfsm.serving.loop``: one session per request)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _impl
from .._checks import check_count

__all__ = ["prompt_lookup", "common_prefix", "PromptLookupDrafter"]

# The active implementation's kernels themselves (docstrings: the twin's).
prompt_lookup = _impl.load("ngram").prompt_lookup
common_prefix = _impl.load("prefix").common_prefix


class _PromptLookupSession:
    """Keeps integer histories in a growable int64 buffer (the compiled kernel scans a
    typed view of it); any other entries in a list."""

    __slots__ = ("buf", "n", "history", "ngram")

    def __init__(self, prompt: Sequence[Any], ngram: int) -> None:
        self.ngram = ngram
        self.history: list[Any] | None = None
        self.n = n = len(prompt)
        self.buf = np.empty(max(1024, 2 * n), dtype=np.int64)
        try:
            self.buf[:n] = prompt
            if isinstance(prompt, np.ndarray) and prompt.dtype.kind not in "iu":
                raise TypeError
            if not isinstance(prompt, np.ndarray) and not all(type(t) is int for t in prompt):
                raise TypeError
        except (TypeError, ValueError, OverflowError):
            self.history = list(prompt)

    def extend(self, tokens: Sequence[Any]) -> None:
        if self.history is not None:
            self.history.extend(tokens)
            return
        n = self.n
        m = n + len(tokens)
        buf = self.buf
        if m > len(buf):
            grown = np.empty(2 * m, dtype=np.int64)
            grown[:n] = buf[:n]
            self.buf = buf = grown
        try:
            # a token that numpy coerces (2.0, True) only changes what gets drafted, and
            # every draft is verified, so the output cannot change
            buf[n:m] = tokens
        except (TypeError, ValueError, OverflowError):  # entries that are not int64 ids
            self.history = buf[:n].tolist() + list(tokens)
            return
        self.n = m

    def propose(self, max_k: int) -> Any:
        h: Any = self.history
        if h is None:
            h = self.buf[: self.n]
        return prompt_lookup(h, self.ngram, max_k)


class PromptLookupDrafter:
    """Drafts with ``specfsm.prompt_lookup``: the tokens that followed the most recent
    earlier occurrence of the history's last ``ngram`` tokens (prompt and output alike).
    Refuses an ``ngram`` that is not a positive integer."""

    name = "prompt"

    def __init__(self, ngram: int = 3) -> None:
        ngram = check_count(ngram, "ngram")
        if ngram < 1:
            raise ValueError(f"ngram must be at least 1, got {ngram}")
        self.ngram = ngram

    def session(self, prompt: Sequence[Any]) -> _PromptLookupSession:
        return _PromptLookupSession(prompt, self.ngram)

    def __repr__(self) -> str:
        return f"PromptLookupDrafter(ngram={self.ngram})"
