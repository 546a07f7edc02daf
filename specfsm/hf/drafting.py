"""The transformers generator's drafting policy in the serving loop: one session per
request (its index or history, what its drafts achieved) and one width per step.

``StepDrafter(gen, budget)`` is the drafter ``SpeculativeGenerator.generate`` hands
``specfsm.serving.loop.serve``. Each session drafts from the request's own
``SuffixIndex`` / ``NgramIndex`` (the active implementation's), prompt lookup over its
history, or the user's callable; a draft cut short by the end of the history is
continued periodically (``periodic``). ``propose_step`` takes every live session's draft
and chooses the step's width (``cost.choose_batch_width``: the width that ends the batch
soonest, 0 included; for one request, expected tokens per unit of forward cost) from
the acceptance by match class shared by the run's requests (``AcceptanceByMatch``),
each request's own recent drafts over it (``RequestBackoff``), and the forward cost
(fixed, learnt online from the run's forwards, or calibrated); a request that stopped
drafting is probed with 3 tokens now and then, the gap doubling after each failed probe
and, in a batch of B (where a probe widens every row of the padded forward), B times as
long, a due probe taking along every request half-way to its own. ``verified`` hands
each verify's counts to those estimates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _impl
from ..serving.loop import TreeDraft
from .cost import AcceptanceStats, CostModel, RequestBackoff, choose_batch_width, choose_width, expected_tokens
from .recycle import merged_trees, recycle_step, settle_tree

__all__ = ["StepDrafter", "checked_draft", "tree_budget"]

_prompt_lookup = _impl.load("ngram").prompt_lookup  # the active implementation's

#: a tree may add nodes beside the chain while the forward costs at most this much more
TREE_SLACK = 1.05


def tree_budget(cost: CostModel | None, batch: int, width: int, cap: int) -> int:
    """The node budget of a tree whose main branch is a ``width``-token chain: the
    largest ``n`` in ``[width, min(cap, width + width // 2)]`` whose ``batch * (n + 1)``
    rows cost at most ``TREE_SLACK`` times the chain's ``batch * (width + 1)`` (no cost
    model: the chain's own budget)."""
    if cost is None or width < 1:
        return width
    limit = cost(batch * (width + 1)) * TREE_SLACK
    best = width
    for n in range(width + 1, min(cap, width + width // 2) + 1):
        if cost(batch * (n + 1)) <= limit:
            best = n
    return best


def checked_draft(draft: Any, k: int) -> list[int]:
    """A callable drafter's proposal as a list of at most ``k`` ints; TypeError for
    anything that is not a sequence of integers (a float is not truncated to an id)."""
    if isinstance(draft, (str, bytes, bytearray)) or not hasattr(draft, "__iter__"):
        raise TypeError(f"the drafter must return a sequence of token ids, got {type(draft).__name__}")
    if isinstance(draft, np.ndarray):
        if draft.ndim != 1:
            raise TypeError(f"the drafter must return a 1-D sequence of token ids, got an array of shape {draft.shape}")
        if draft.dtype.kind in "iu":
            return [int(t) for t in draft[:k].tolist()]
    out = []
    for i, t in enumerate(draft):
        if i >= k:
            break
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"the drafter returned a non-integer token id at position {i}: {type(t).__name__} {t!r}")
        out.append(int(t))
    return out


class _Session:
    """One request's drafting: its index (or its history), and what its drafts achieved."""

    __slots__ = ("owner", "history", "prompt_len", "index", "stats", "idle", "match", "recent", "predicted", "probing",
                 "depth", "natural", "pending", "accepted")

    def __init__(self, owner: StepDrafter, prompt: list[int], index: Any) -> None:
        self.owner = owner
        self.history = prompt
        self.prompt_len = len(prompt)
        self.index = index
        if index is not None:
            index.extend(np.asarray(prompt, dtype=np.int64))
        self.stats = AcceptanceStats(decay=0.8)  # this request's acceptance by position
        self.idle = 0  # steps since this request last verified a draft
        self.match: int | None = None  # the match length behind the current draft (None: unknown)
        self.recent = RequestBackoff()  # what this request's own drafts achieved recently
        self.predicted = 0.0  # accepted draft tokens the shared estimate expects of the current draft
        self.probing = False  # the current draft is a probe (the request had stopped drafting)
        self.depth = 0  # the current tree draft's depth (0: a chain)
        self.natural = 0  # the current draft's tokens from the index itself (past them: periodic)
        self.pending: Any = None  # the current draft when it is the recycling table's tree alone
        self.accepted = 0  # its verify's accepted draft tokens, until the emitted tokens come

    def extend(self, tokens: Sequence[int]) -> None:
        if self.pending is not None:
            settle_tree(self.owner.gen, self, self.accepted, tokens)
        self.history += tokens
        if self.index is not None:
            self.index.extend(tokens)

    def verified(self, drafted: int, accepted: int) -> None:
        if self.pending is not None:
            self.accepted = accepted
            return
        self.owner.verified(self, drafted, accepted)


class StepDrafter:
    """The drafter of one ``SpeculativeGenerator`` (see the module docstring)."""

    __slots__ = ("gen", "sessions", "budget")

    def __init__(self, gen: Any, budget: int) -> None:
        self.gen = gen
        self.sessions: list[_Session] = []  # in the order they were made (the requests')
        self.budget = budget  # the tokens each request may emit (the run's max_new_tokens)

    def session(self, prompt: Sequence[int]) -> _Session:
        s = _Session(self, [int(t) for t in prompt], self.gen._new_index())
        self.sessions.append(s)
        return s

    def _propose(self, s: _Session, k: int, least: int) -> list[int]:
        # ``least``: the shortest draft worth a verify (without the bonus row a one-token
        # draft is worth exactly one decode)
        gen = self.gen
        if k < least:
            return []
        if s.index is not None:
            d = s.index.propose(k)
            s.match = s.index.match_length()
        elif gen.drafter == "prompt":
            arr = np.asarray(s.history, dtype=np.int64)
            d = []
            top = gen.max_n if gen.max_n is not None else 4  # set in __init__ for "prompt"
            for n in range(top, gen.min_n - 1, -1):
                found = _prompt_lookup(arr, n, k)
                if len(found):
                    d = found.tolist()
                    break
        else:
            d = checked_draft(gen.drafter(list(s.history), k), k)
            bad = [t for t in d if not 0 <= t < gen._vocab]
            if bad:
                raise ValueError(f"the drafter proposed token id {bad[0]}, outside the vocabulary 0..{gen._vocab - 1}")
        s.natural = len(d)
        if gen.periodic and 0 < len(d) < k:
            # the match's continuation ran into the end of the history: the history is
            # periodic with period len(d) from the match on, so continue the period
            d = [d[i % len(d)] for i in range(k)]
        return d if len(d) >= least else []

    def propose_step(self, sessions: Sequence[_Session], limits: Sequence[int]) -> list[Any]:
        """The drafts of one step (``limits[j]`` tokens at most for ``sessions[j]``),
        cut to the step's width (with ``gen.tree``, trees around them: ``_trees``)."""
        gen = self.gen
        cost: CostModel | None = None
        if gen.drafter == "recycle":  # the table alone
            return recycle_step(self, sessions, limits, self._cost_for(len(sessions))(len(sessions))
                                if gen.adaptive else None)
        bonus = gen.bonus
        least = 2 - bonus
        drafts = [self._propose(s, lim, least) for s, lim in zip(sessions, limits)]
        if gen.adaptive and any(drafts):
            cost_for = self._cost_for(len(sessions))
            cost = cost_for(len(sessions))
            kk = gen.k_max + bonus
            prior = gen.global_stats.conditional(kk, prior=0.8, weight=2.0)
            shared = [gen.by_match.conditional(s.match, kk) if s.match is not None else None for s in sessions]
            if gen.backoff:
                # each request's own recent drafts over the shared estimate (RequestBackoff)
                conds = [s.stats.conditional(kk, prior=prior, weight=4.0) if c is None
                         else s.recent.conditional(s.match or 0, c) for s, c in zip(sessions, shared)]
            else:
                conds = [s.stats.conditional(kk, prior=prior, weight=4.0) if c is None else c
                         for s, c in zip(sessions, shared)]
            # with the bonus row a K-token draft is worth a (K + 1)-token draft without
            # it: K + 1 rows, the same expected tokens
            avail = [len(d) + bonus if d else 0 for d in drafts]
            if gen.objective == "makespan":  # the batch ends with its last request: end it soonest
                left = [self.budget - (len(s.history) - s.prompt_len) for s in sessions]
                w = choose_batch_width(conds, avail, left, cost_for, gen.k_max + bonus) - bonus
            else:
                w = choose_width(conds, avail, cost, gen.k_max + bonus) - bonus
            # a probe widens every row of the step's padded forward, so in a batch of B
            # it costs about B times what it costs alone: the gaps grow with B, and a
            # due probe takes along every request at least half-way to its own
            b = len(sessions)
            gaps = [b * (max(s.recent.probe_gap, gen.probe_every) if gen.backoff else gen.probe_every)
                    for s in sessions]
            if w < least and any(s.idle >= g and d for s, d, g in zip(sessions, drafts, gaps)):
                # a request that stopped drafting is probed now and then (3 tokens:
                # 4 rows, a cheap width): acceptance changes along a request; with
                # backoff a failed probe doubles that request's gap (up to 64 steps)
                drafts = [d[:3] if 2 * s.idle >= g else [] for s, d, g in zip(sessions, drafts, gaps)]
                for s, d in zip(sessions, drafts):
                    s.probing = bool(d)
            else:
                drafts = [d[:w] if w >= least else [] for d in drafts]
                for s in sessions:
                    s.probing = False
            for s, d, c in zip(sessions, drafts, shared):
                # what the shared estimate expects this draft to have accepted
                s.predicted = expected_tokens(c, len(d) + 1) - 1 if d and c is not None else 0.0
        for s, d in zip(sessions, drafts):
            s.idle = 0 if d else s.idle + 1
        if gen.recycling is not None and not any(drafts):  # no chain anywhere: the table's trees alone
            return recycle_step(self, sessions, limits, self._cost_for(len(sessions))(len(sessions))
                                if gen.adaptive else None)
        gen.last_run.widths.append(max((len(d) for d in drafts), default=0))
        if gen.tree:
            return self._trees(sessions, drafts, limits, cost if gen.adaptive and any(drafts) else None)
        return drafts

    def _cost_for(self, batch: int) -> Any:
        """The forward's cost by rows for each batch size: the generator's fixed table,
        the online one, or one calibrated now (``calibrate="upfront"``)."""
        gen = self.gen
        if gen.cost is not None:
            fixed = gen.cost
        elif gen.calibration == "online":
            return gen.online.model
        else:
            fixed = gen.calibrate(batch=min(batch, 8))
        return lambda n: fixed

    def _trees(self, sessions: Sequence[_Session], drafts: list[list[int]], limits: Sequence[int],
               cost: CostModel | None) -> list[Any]:
        """Each drafting session's tree: ``propose_tree`` as deep as its chain, with the
        chain's length plus the nodes ``tree_budget`` allows (the chain its main branch
        in the copying regime)."""
        w = max((len(d) for d in drafts), default=0)
        budget = tree_budget(cost, len(sessions), w, max(limits, default=0))
        if self.gen.recycling is not None:
            return merged_trees(self, sessions, drafts, limits, budget)
        out: list[Any] = []
        for s, d, lim in zip(sessions, drafts, limits):
            s.depth = 0
            if not d or len(d) > s.natural:
                # nothing to draft, or a chain continued periodically past the index's
                # own continuation: the tree would not hold that part, so the chain it is
                out.append(d)
                continue
            tok, par = s.index.propose_tree(min(budget, lim), max_depth=len(d))
            if len(tok) <= len(d) and bool((par == np.arange(-1, len(tok) - 1)).all()):
                # the tree is a chain (the width chooser's, or in the free regime the
                # continuation that recurs most): verify it as one
                out.append(tok.tolist())
                continue
            s.depth = len(d)
            self.gen.last_run.trees += 1
            out.append(TreeDraft(tok, par))
        return out

    def verified(self, s: _Session, k: int, n: int) -> None:
        """A verify of ``k`` drafted tokens with ``n`` accepted, into the estimates."""
        gen = self.gen
        if s.depth:  # a tree: its main branch's length is the draft the estimates know
            k, n, s.depth = s.depth, min(n, s.depth), 0
        s.stats.record(k, n)
        gen.global_stats.record(k, n)
        if s.match is not None:
            gen.by_match.record(s.match, k, n)
            if gen.backoff:
                s.recent.record(s.match, k, n, s.predicted)
        if s.probing:
            s.probing = False
            g = max(s.recent.probe_gap, gen.probe_every)
            s.recent.probe_gap = gen.probe_every if n >= 2 else min(2 * g, 64)
