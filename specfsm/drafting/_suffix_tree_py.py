"""Tree drafts from a token history (pure-Python twin of ``_core/drafting/_suffix_tree.pxi``).

The rule, which both implementations follow exactly (the same integer counts, the same
double-precision sums in the same order, the same ties):

* Contexts. ``n_0`` is the index's current match length (nothing matches: an empty
  tree); ``n_1`` and ``n_2`` are the lengths of the suffix automaton's next two states
  up the suffix-link chain from the match (the next shorter suffixes that occur more
  often), each kept only when it is at least ``max(min_n, 1)``. Context ``i`` is the
  last ``n_i`` tokens ``t[L-n_i:L]``.
* Occurrences. An occurrence of context ``i`` is an end ``e``, ``L - TREE_WINDOW < e
  <= L - 1``, with ``t[e-n_i:e] == t[L-n_i:L]``; scanning ``e`` from ``L - 1`` down,
  each context counts its first ``TREE_OCCURRENCES`` (the latest ones), ``N_i`` of them
  (the window bounds the scan's cost; the chain below may start anywhere). The chain: the
  start ``a`` of ``propose``'s draft (``match_end()``, the anchor included), when there
  is one, is one more occurrence (of the "chain" context, ``c_chain`` 0 or 1).
* Regime. The chain's agreement is the number of ``j`` in ``1..TREE_AGREE_SPAN`` with
  ``a - j >= 0`` and ``t[L-j] == t[a-j]``: how much of the recent history the chain's
  occurrence, aligned, also has before it (a long copy agrees past a renamed word, where
  the exact match stops). The tree copies when there is a chain and its agreement is at
  least ``TREE_AGREE_MIN``; else it is free.
* Nodes. A node is a path ``x_1..x_d`` (``d <= max_depth``) after the current last token;
  ``c_i(node)`` is the number of counted occurrences ``e`` of context ``i`` with
  ``e + d <= L`` and ``t[e:e+d] == x_1..x_d``; ``chain(node)`` is 1 when the chain's
  occurrence runs through it. Its estimate, summed left to right in doubles (a missing
  context adds nothing):

  - copying: ``p = chain * 4 + c_0/N_0 * W_0 + c_1/N_1 * W_1 + c_2/N_2 * W_2`` (``W = 1,
    1/4, 1/16``): per context, the product down the path of ``count(context+path+child)
    / count(context+path)``, mixed so that the longest context dominates. The chain's
    weight (4) exceeds all the others together, so ``propose``'s chain (of ``min(budget,
    max_depth)`` tokens) is the tree's first branch: the tree holds the chain of its
    budget and accepts at least as much (and when the chain fills the budget it is the
    tree);
  - free: ``p = DEPTH_DECAY[d - 1] * (chain + c_0 + c_1 + c_2)`` (the sum in integers,
    one product), where ``DEPTH_DECAY[k]`` is 0.9 multiplied by itself ``k`` times in
    doubles (``DEPTH_DECAY[0] = 1``): how many counted occurrences (the chain's one
    more) continue through the node, discounted by 0.9 per level, so that a deep node
    needs more support than a shallow one. The chain is not kept whole: where the copy
    has stopped agreeing, the nodes go to the continuations that recur.
* Best-first. Starting from the root's children, the candidate with the largest ``p``
  joins the tree (ties: ``prefer="earliest"`` takes the candidate whose earliest counted
  occurrence is earliest, ``"latest"`` the one whose latest is latest; no two candidates
  share one), then its children become candidates; a candidate whose parent already has
  ``max_width`` children is dropped. It stops at ``budget`` nodes or when no candidate is
  left. Node ``i``'s parent is the tree index of its parent (``-1``: the root), so
  parents come before children and siblings carry distinct tokens.
"""

from __future__ import annotations

import numpy as np

from ._tree_checks import MAX_TREE_NODES, TREE_AGREE_MIN, TREE_AGREE_SPAN, TREE_OCCURRENCES, TREE_WINDOW

__all__ = ["WEIGHTS", "DEPTH_DECAY", "agreement", "build_tree", "empty_tree"]

WEIGHTS = (1.0, 0.25, 0.0625)   # per context, longest first (exact in binary)
CHAIN_WEIGHT = 4.0              # the chain's occurrence: above all the others together
CHAIN_BIT = 1 << 3              # its bit in an occurrence's mask


def _decay(n: int, r: float = 0.9) -> tuple:
    out = [1.0]
    for _ in range(n - 1):
        out.append(out[-1] * r)
    return tuple(out)


DEPTH_DECAY = _decay(MAX_TREE_NODES)   # the free regime's discount by depth - 1


def agreement(tk: list, a: int) -> int:
    """How many of the last TREE_AGREE_SPAN tokens the chain's occurrence (ending at
    ``a``), aligned with the history's end, has at the same place before it."""
    L = len(tk)
    n = 0
    for j in range(1, TREE_AGREE_SPAN + 1):
        if a - j < 0:
            break
        if tk[L - j] == tk[a - j]:
            n += 1
    return n


def empty_tree() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)


def build_tree(tk: list, ctx: list, chain: int, budget: int, depth: int, width: int,
               earliest: bool) -> tuple[np.ndarray, np.ndarray]:
    """The tree over history ``tk`` for context lengths ``ctx`` (longest first) and the
    chain's start ``chain`` (-1: none)."""
    L = len(tk)
    k = len(ctx)
    n0 = ctx[0] if k else 0
    copying = chain >= 0 and agreement(tk, chain) >= TREE_AGREE_MIN
    occ_e: list[int] = []
    occ_m: list[int] = []
    cnt = [0] * k
    last = tk[L - 1] if L else 0
    for e in range(L - 1 if k else 0, max(L - TREE_WINDOW, 0), -1):
        if tk[e - 1] != last:
            continue
        ml = 1
        while ml < n0 and e - 1 - ml >= 0 and tk[e - 1 - ml] == tk[L - 1 - ml]:
            ml += 1
        mask = 0
        for i in range(k):
            if ml >= ctx[i] and cnt[i] < TREE_OCCURRENCES:
                mask |= 1 << i
                cnt[i] += 1
        if mask:
            occ_e.append(e)
            occ_m.append(mask)
        if cnt[0] >= TREE_OCCURRENCES:
            break
    if chain >= 0:
        if chain in occ_e:
            occ_m[occ_e.index(chain)] |= CHAIN_BIT
        else:
            occ_e.append(chain)
            occ_m.append(CHAIN_BIT)
    if not occ_e:
        return empty_tree()
    toks: list[int] = []
    parents: list[int] = []
    nchild: list[int] = []
    root_children = 0
    cands: list[tuple] = []   # (p, rep, parent, token, depth, occurrences)

    def spawn(parent: int, d: int, js: list) -> None:
        # the children of a node at depth d whose occurrences are js
        if d >= depth:
            return
        groups: dict[int, list] = {}
        for j in js:
            e = occ_e[j]
            if e + d < L:
                groups.setdefault(tk[e + d], []).append(j)
        for tok, g in groups.items():
            c = [0] * k
            for j in g:
                m = occ_m[j]
                for i in range(k):
                    if (m >> i) & 1:
                        c[i] += 1
            p = 0.0
            if copying:
                for j in g:
                    if occ_m[j] & CHAIN_BIT:
                        p += CHAIN_WEIGHT
                for i in range(k):
                    if cnt[i]:
                        p += c[i] / cnt[i] * WEIGHTS[i]
            else:
                n = sum(c)
                for j in g:
                    if occ_m[j] & CHAIN_BIT:
                        n += 1
                p = DEPTH_DECAY[d] * n
            es = [occ_e[j] for j in g]
            rep = min(es) if earliest else max(es)
            cands.append((p, rep, parent, tok, d + 1, g))

    spawn(-1, 0, list(range(len(occ_e))))
    while len(toks) < budget and cands:
        best = 0
        for j in range(1, len(cands)):
            a, b = cands[j], cands[best]
            if a[0] > b[0] or (a[0] == b[0] and ((a[1] < b[1]) if earliest else (a[1] > b[1]))):
                best = j
        p, rep, parent, tok, d, g = cands.pop(best)
        if parent < 0:
            if root_children >= width:
                continue
            root_children += 1
        else:
            if nchild[parent] >= width:
                continue
            nchild[parent] += 1
        toks.append(tok)
        parents.append(parent)
        nchild.append(0)
        spawn(len(toks) - 1, d, g)
    return np.asarray(toks, dtype=np.int64), np.asarray(parents, dtype=np.int64)
