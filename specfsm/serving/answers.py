"""The target's answers as the batch step takes them: token ids for requests whose tokens
are not integer ids (``Vocab``), the answers' row tokens, probability rows and row
caches gathered and checked (``gather``, ``usual_rows``, ``stack``), and the rules
the loop settles itself (a ``select`` rule's counts, ``settle_selects``; a caller's
``accepted_rows`` rule shown the tokens, ``TokenRule``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._checks import check_count
from ..accept.rules import select_rows
from ..machine.batch import PREFILL, VERIFY
from .requests import Request

__all__ = ["TargetError", "Vocab", "TokenRule", "Chosen", "integer_ids", "gather", "usual_rows", "stack", "settle_selects"]


class TargetError(RuntimeError):
    """The target answered an evaluation with rows the loop cannot use."""


class Vocab:
    """Token <-> int64 id for requests whose tokens are not all integer ids: the batch
    holds ids, the target, the drafter sessions and the outputs see the tokens."""

    __slots__ = ("ids", "tokens")

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.tokens: list[Any] = []

    def id(self, token: Any) -> int:
        i = self.ids.get(token)
        if i is None:
            i = self.ids[token] = len(self.tokens)
            self.tokens.append(token)
        return i

    def encode(self, tokens: Sequence[Any]) -> list[int]:
        return [self.id(t) for t in tokens]

    def decode(self, ids: Sequence[int]) -> list[Any]:
        toks = self.tokens
        return [toks[i] for i in ids]


class TokenRule:
    """A caller's ``accepted_rows`` rule seen through a ``Vocab``: it judges the tokens,
    not the batch's ids."""

    __slots__ = ("rule", "vocab")

    def __init__(self, rule: Any, vocab: Vocab) -> None:
        self.rule, self.vocab = rule, vocab

    def accepted_rows(self, draft: Sequence[int], choices: Sequence[int]) -> Any:
        return self.rule.accepted_rows(self.vocab.decode(draft), self.vocab.decode(choices))


def integer_ids(requests: Sequence[Request]) -> bool:
    """Whether every prompt and eos is a non-negative integer id (the batch's own tokens)."""
    for r in requests:
        if r.eos is not None and not (isinstance(r.eos, (int, np.integer)) and r.eos >= 0):
            return False
        p = r.prompt
        if isinstance(p, np.ndarray):
            if p.dtype.kind not in "iu" or (p.dtype.kind == "i" and p.size and p.min() < 0):
                return False
        elif not all(type(t) is int and t >= 0 for t in p):
            if not all(isinstance(t, (int, np.integer)) and t >= 0 for t in p):
                return False
    return True


def decode_choice(rule: Any, p: Any, greedy: Any) -> Any:
    """The token a decode or prefill row emits under a sampling rule: a draw from the
    row's distribution for ``SpeculativeSampling`` (with the rule's generator, so
    the emitted tokens follow the target's distribution), the target's own choice
    otherwise (a sampling target's choice is its sample)."""
    rng = getattr(rule, "rng", None)
    if rng is None:
        return greedy
    p = np.asarray(p, dtype=np.float64)
    return int(rng.choice(p.shape[0], p=p / p.sum()))


class Chosen:
    """The counts a ``select`` rule chose, slot by slot, as an ``accepted_rows`` rule for
    the step (which asks once per verifying slot, in ``slots`` order); refuses a draft
    other than the one the count was chosen for."""

    __slots__ = ("chosen", "at")

    def __init__(self, chosen: list[tuple[list[int], int]]) -> None:
        self.chosen, self.at = chosen, 0

    def accepted_rows(self, draft: Sequence[int], choices: Sequence[int]) -> int:
        want, n = self.chosen[self.at]
        if list(draft) != want:  # pragma: no cover - the step's order is slots order
            raise RuntimeError("the step asked for a verify the loop did not settle")
        self.at += 1
        return n


def gather(bs: Any, slots: Any, feeds: list[list[Any]], answers: list[tuple[Any, Any, Any]],
            rule: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """The targets' answers as the step's flat row tokens, probability rows (when the
    rule needs them) and each slot's row caches; a prefill or a decode reads its last
    row only. Refuses an answer short of rows (TargetError)."""
    rows_all: list[Any] = []
    probs_all: list[Any] = []
    row_caches: list[Any] = []
    codes: list[int] | None = None  # the slots' states, read when an answer needs them
    for j, (rows, probs, rc) in enumerate(answers):
        m = len(feeds[j])
        if probs is None and len(rows) == m and len(rc) == m:  # the usual answer
            rows_all += rows
            row_caches.append(rc)
            continue
        if codes is None:
            codes = bs.states[slots].tolist()
        if codes[j] != VERIFY:
            if len(rows) == 0 or len(rc) == 0:
                kind = "prefill" if codes[j] == PREFILL else "decode"
                raise TargetError(
                    f"the target answered a {kind} evaluation with {len(rows)} row tokens and "
                    f"{len(rc)} row caches; it needs at least one"
                )
            last = rows[-1] if probs is None else decode_choice(rule, probs[-1], rows[-1])
            rows_all += [last] * m
            row_caches.append([rc[-1]] * m)
            if probs is not None:
                p = np.asarray(probs, dtype=np.float64)
                probs_all.append(p if p.shape[0] == m else np.repeat(p[-1:], m, axis=0))
        else:
            if len(rows) < m or len(rc) < m:
                raise TargetError(
                    f"the target answered {m} input rows with {len(rows)} row tokens "
                    f"and {len(rc)} row caches; it needs one of each per row"
                )
            rows_all += rows[:m]
            row_caches.append(rc)
            if probs is not None:
                probs_all.append(np.asarray(probs, dtype=np.float64)[:m])
    return rows_all, probs_all, row_caches


def stack(probs_all: list[Any]) -> np.ndarray:
    """One N x V array of the slots' probability rows, a narrower vocabulary padded with
    zeros (one copy)."""
    v = max(p.shape[1] for p in probs_all)
    allp = np.zeros((sum(p.shape[0] for p in probs_all), v), dtype=np.float64)
    r0 = 0
    for p in probs_all:
        allp[r0 : r0 + p.shape[0], : p.shape[1]] = p
        r0 += p.shape[0]
    return allp


def settle_selects(bs: Any, slots: list[int], offs: list[int], rows: np.ndarray, probs: np.ndarray,
                    rule: Any) -> Chosen:
    """A ``select`` rule's decision for every verifying slot, before the step: its row
    tokens replace the target's at that slot's rows (the last rows keep the target's,
    a bonus row among them), and the count it chose is what the step accepts."""
    codes = bs.states[np.asarray(slots, dtype=np.int64)].tolist()
    chosen = []
    for j, s in enumerate(slots):
        if codes[j] != VERIFY:
            continue
        draft = bs.slot_fields(s)[3]
        a, b = offs[j], offs[j + 1]
        n, toks = select_rows(rule, draft, probs[a:b])
        n = check_count(n, "accepted")
        if n > len(draft):
            raise ValueError(f"{type(rule).__name__}.select accepted {n} rows of a {len(draft)}-token draft")
        toks = list(toks)[: b - a]
        rows[a : a + len(toks)] = toks
        chosen.append((draft, n))
    return Chosen(chosen)


def usual_rows(answers: list[tuple[Any, Any, Any]], feeds: list[list[Any]], rows_all: list[Any],
                row_caches: list[Any]) -> bool:
    """Collect the answers' row tokens and row caches while each answer is the usual one
    (one row token and one row cache per fed row); False at the first that is not."""
    for (rows, _p, rc), f in zip(answers, feeds):
        m = len(f)
        if len(rows) != m or len(rc) != m:
            return False
        rows_all += rows
        row_caches.append(rc)
    return True
