"""The transformers generator's recycling drafters: trees from the target's own
predictions (``drafter="recycle"``) and those trees merged with the suffix index's
(``"suffix-recycle"``).

The generator keeps one ``RecyclingTable`` per model (``SpeculativeGenerator.recycling``),
fed by the target from the logits every forward computes anyway (the top-k ids of every
evaluated row, ``ModelTarget``). Each step:

* ``"suffix-recycle"`` first runs the suffix drafter's own choice (``StepDrafter``: the
  chain's width from the acceptance by match length and the forward's cost, and the
  tree's node budget around it, ``tree_budget``). Each request with a chain drafts the
  chain and the table's tree as one tree of that budget (``specfsm.merge_trees``): the
  chain first (it is what the budget was chosen for), the table's nodes in the nodes
  left (none left: the chain alone, verified as a chain); a request without a chain
  drafts the table's tree in the rows the step's widest draft pays for anyway
  (``merged_trees``). With a fixed ``k`` the budget is ``k`` nodes, and the table's nodes
  come first unless the suffix match is at least ``LONG_MATCH`` tokens (a copy), a
  quarter of the budget then kept for the chain.
* When no request has a chain (and always for ``"recycle"``), each request drafts the
  table's tree after its last token (``recycle_step``), of the node budget ``n`` (0, a
  plain decode, included; at most ``TREE_CAP``) that maximises the step's expected
  tokens per unit of forward cost: a tree cut to its first ``n`` nodes is expected to
  accept what such cuts accepted in the run so far (``BudgetStats``: every verified
  table tree says what each of its cuts would have accepted), the cost being the
  generator's cost by rows; each cut's mean is raised by ``OPTIMISM`` over the square
  root of how many trees measured it (all of it for a cut never measured), so a budget
  that could pay gets tried until its measurement says otherwise, and one that cannot
  pay even so (on a CPU, where a wider forward costs much more) is never drafted. With a
  fixed ``k`` the budget is ``k`` nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..drafting.recycling import merge_trees
from ..serving.loop import TreeDraft

__all__ = ["TREE_CAP", "LONG_MATCH", "OPTIMISM", "BudgetStats", "recycle_step", "merged_trees", "settle_tree"]

TREE_CAP = 64     # the adaptive budget's largest tree
LONG_MATCH = 12   # a suffix match this long leads a merged tree (a copy)
OPTIMISM = 0.5    # accepted tokens a cut is hoped to add beyond its measured mean, over sqrt(its trees)


class BudgetStats:
    """What the table's trees accepted, by how many of their first nodes were kept:
    ``expected()[n]`` is the mean accepted draft tokens of a cut to ``n`` nodes, over the
    verified trees of at least ``n`` nodes (each weighed down by ``decay`` per later tree)."""

    def __init__(self, cap: int = TREE_CAP, decay: float = 0.98) -> None:
        self.cap = cap
        self.decay = decay
        self.acc = np.zeros(cap + 1)
        self.seen = np.zeros(cap + 1)

    def record(self, path: Sequence[int], size: int) -> None:
        """A verified tree of ``size`` nodes whose accepted path is the nodes ``path``
        (root to leaf; indices rise along a path, parents coming first)."""
        m = min(size, self.cap)
        if m < 1:
            return
        cuts = np.arange(1, m + 1)
        self.acc[1:m + 1] = self.acc[1:m + 1] * self.decay + np.searchsorted(np.asarray(path, dtype=np.int64), cuts)
        self.seen[1:m + 1] = self.seen[1:m + 1] * self.decay + 1.0

    def expected(self) -> np.ndarray:
        """Mean accepted tokens by cut (``[0]`` is 0), a cut never verified taking the
        largest verified one's (no gain assumed; all 0 before any tree)."""
        known = np.flatnonzero(self.seen > 0)
        out = np.zeros(self.cap + 1)
        if not len(known):
            return out
        top = int(known[-1])
        out[1:top + 1] = self.acc[1:top + 1] / np.maximum(self.seen[1:top + 1], 1e-12)
        out[top + 1:] = out[top]
        return np.maximum.accumulate(out)


def _budget(gen: Any, b: int, cap: int, cost: Any) -> int:
    """The node budget of a step of ``b`` table trees (module docstring)."""
    if not gen.adaptive:
        return cap
    exp, seen = gen.tree_stats.expected(), gen.tree_stats.seen
    hope = exp[:cap + 1] + OPTIMISM / np.sqrt(np.maximum(seen[:cap + 1], 1.0))
    hope[0] = 0.0
    rates = [b * (1.0 + hope[n]) / cost(b * (n + 1)) for n in range(cap + 1)]
    return int(np.argmax(rates))


def _table_tree(gen: Any, s: Any, n: int, lim: int) -> Any:
    """Session ``s``'s table tree of ``n`` nodes at most ``lim`` deep, as a draft (a
    chain as a list, a tree as a ``TreeDraft``, nothing as []), remembered in
    ``s.pending`` for ``settle_tree``."""
    if n < 1 or lim < 1:
        return []
    tok, par = gen.recycling.propose_tree(s.history[-1], n, max_depth=lim)
    if not len(tok):
        return []
    s.pending = (tok.tolist(), par.tolist())
    if bool((par == np.arange(-1, len(par) - 1)).all()):
        return tok.tolist()
    gen.last_run.trees += 1
    return TreeDraft(tok, par)


def recycle_step(drafter: Any, sessions: Sequence[Any], limits: Sequence[int], cost: Any) -> list[Any]:
    """A step of table trees alone (``"recycle"``, or ``"suffix-recycle"`` when no
    request has a chain): one tree per session, of the step's budget."""
    gen = drafter.gen
    cap = TREE_CAP if gen.adaptive else gen.k
    n = _budget(gen, len(sessions), cap, cost) if cap else 0
    out: list[Any] = []
    for s, lim in zip(sessions, limits):
        s.pending = None
        s.depth = 0
        out.append(_table_tree(gen, s, n, lim))
    gen.last_run.widths.append(max((len(d) for d in out), default=0))
    return out


def merged_trees(drafter: Any, sessions: Sequence[Any], drafts: Sequence[list[int]], limits: Sequence[int],
                 budget: int) -> list[Any]:
    """``"suffix-recycle"``'s step after the suffix drafter's choice (``drafts``, each
    request's chain, and the tree ``budget`` around the widest): a request with a chain
    drafts it and the table's tree in one tree of ``budget`` nodes; one without drafts the
    table's tree in the widest chain's rows."""
    gen = drafter.gen
    if not gen.adaptive:
        budget = gen.k
    w = max((len(d) for d in drafts), default=0)
    out: list[Any] = []
    for s, d, lim in zip(sessions, drafts, limits):
        s.pending = None
        s.depth = 0
        if not d:
            out.append(_table_tree(gen, s, min(w, budget), lim))
            continue
        n = min(budget, lim)
        lead = gen.adaptive or (s.match or 0) >= LONG_MATCH   # the chain chosen to pay, or a copy
        if lead and n <= len(d):  # no room beside the chain
            out.append(d)
            continue
        chain = (np.asarray(d, dtype=np.int64), np.arange(-1, len(d) - 1, dtype=np.int64))
        table = gen.recycling.propose_tree(s.history[-1], n, max_depth=lim)
        tok, par, _ = merge_trees(chain, table, n) if lead else merge_trees(table, chain, n, n // 4)
        if bool((par == np.arange(-1, len(par) - 1)).all()):
            out.append(tok.tolist())
            continue
        s.depth = len(d)
        gen.last_run.trees += 1
        out.append(TreeDraft(tok, par))
    return out


def settle_tree(gen: Any, s: Any, accepted: int, tokens: Sequence[int]) -> None:
    """After a verify of the table tree ``s.pending`` that accepted ``accepted`` draft
    tokens, the first of ``tokens`` (what the request emitted): its accepted path into
    the generator's ``BudgetStats``."""
    tok, par = s.pending
    s.pending = None
    path: list[int] = []
    node = -1
    for t in tokens[:accepted]:
        nxt = next((i for i in range(node + 1, len(tok)) if par[i] == node and tok[i] == t), -1)
        if nxt < 0:
            break
        path.append(nxt)
        node = nxt
    gen.tree_stats.record(path, len(tok))
