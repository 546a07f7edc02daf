"""Speculative sampling over a tree of model-free drafts: the emitted tokens are
distributed exactly as the target's sampling would give them, one token at a time.

specfsm's drafters (the suffix index, the n-gram index, prompt lookup) are
deterministic: a node's children are distinct tokens with no draft distribution behind
them (``q`` one-hot on each child). Multi-draft speculative sampling (SpecInfer's
recursive rejection over siblings) then reduces to one draw per node: at node ``u``
with target distribution ``p``, child ``c_1`` is accepted with probability
``min(1, p(c_1) / q_1(c_1)) = p(c_1)``; on rejection the residual is ``p`` with
``c_1`` removed, renormalised, and ``c_2`` is accepted with probability
``p(c_2) / (1 - p(c_1))``; so child ``c_i`` is taken with probability exactly
``p(c_i)`` and the walk stops, emitting a token drawn from ``p`` restricted to the
non-children, with probability ``1 - sum_i p(c_i)``. That is a single draw ``x ~ p``:
follow the child whose token is ``x`` if there is one, else emit ``x``.

So ``sample_tree`` draws one token per row (row 0 the root's, row ``i + 1`` node
``i``'s) by inverse CDF from the row's distribution and walks the tree with those
tokens as the target's choices (``accept_tree``, the active implementation's). Only the
rows on the walked path are consulted, each drawn independently of the rest, so every
emitted token is a draw from the target's distribution given the tokens before it: the
output is distributed as plain sampling, token by token (``tests/test_tree_sampling.py``
checks the joint distribution of the first tokens against the exact one). A draft
distribution (a draft model's children) is not supported: those trees need the
general residual rule.

Draws: ``sample_tree`` takes exactly ``N + 1`` uniforms from ``rng`` (one per row) and
``sample_tree_batch`` ``total + B`` in row order, after every argument is checked (a
refused call draws nothing), so a batch gives the same result as its trees one by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _impl
from .._checks import int64_ids
from ..accept.rules import SpeculativeSampling
from ._checks import ids64
from .tree import accept_tree, accept_tree_batch, check_tree

check_probs = _impl.load("accept").check_probs  # the active implementation's

__all__ = ["sample_rows", "sample_tree", "sample_tree_batch"]


def _generator(rng: Any, seed: Any) -> np.random.Generator:
    """``rng``, or ``default_rng(seed)``; refused as ``SpeculativeSampling`` refuses them."""
    return SpeculativeSampling(rng, seed).rng


def _draw(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Row ``r``'s token: the first entry whose running sum exceeds ``u[r]`` times the
    row's total (never an entry of probability 0)."""
    cs = np.cumsum(p, axis=1, dtype=np.float64)
    t = u * cs[:, -1]
    out = (cs <= t[:, None]).sum(axis=1)
    # float rounding can leave t at the total: take the row's last positive entry
    over = out >= p.shape[1]
    if over.any():
        for r in np.flatnonzero(over).tolist():
            out[r] = int(np.flatnonzero(p[r] > 0)[-1])
    return out.astype(np.int64)


def sample_rows(probs: object, rng: np.random.Generator | None = None, *, seed: Any = None) -> np.ndarray:
    """One token per row of ``probs`` (R x V, each row a distribution), int64, by inverse
    CDF with one uniform per row from ``rng`` (or ``default_rng(seed)``). Refuses rows
    that are not distributions (NaN, infinities, negative entries, a sum other than 1),
    naming the first."""
    p = check_probs(probs, "probs")
    g = _generator(rng, seed)
    return _draw(p, g.random(p.shape[0]))


def sample_tree(tokens: object, parents: object, target_probs: object, rng: np.random.Generator | None = None,
                *, seed: Any = None) -> tuple[np.ndarray, list[int]]:
    """``(path, emitted)`` for one tree: ``path`` the accepted nodes (int64, as
    ``accept_tree`` gives them; the request resumes from row ``path[-1] + 1``, row 0
    when empty), ``emitted`` the accepted nodes' tokens followed by the token drawn at
    the last accepted node's row (``len(path) + 1`` tokens). ``target_probs`` holds the
    target's distribution after each of the N + 1 rows (row 0 the root's). Refuses what
    ``check_tree`` refuses, a ``target_probs`` that is not N + 1 distributions, and an
    rng that is not a ``numpy.random.Generator``; a refused call draws nothing."""
    t, p = check_tree(tokens, parents)
    probs = check_probs(target_probs, "target_probs")
    n = t.shape[0]
    if probs.shape[0] != n + 1:
        raise ValueError(f"target_probs must hold one row per node plus the root's ({n + 1}), got {probs.shape[0]}")
    g = _generator(rng, seed)
    rows = _draw(probs, g.random(n + 1))
    path = accept_tree(t, p, rows)
    last = int(path[-1]) + 1 if len(path) else 0
    return path, [int(x) for x in t[path].tolist()] + [int(rows[last])]


def sample_tree_batch(tokens: object, parents: object, offsets: object, target_probs: object,
                      rng: np.random.Generator | None = None, *, seed: Any = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """B ragged trees at once (``accept_tree_batch``'s layout: tree ``b``'s N_b + 1 rows
    start at ``offsets[b] + b`` in ``target_probs``): ``(counts, resume, path,
    path_offsets, next_tokens)``, the first four as ``accept_tree_batch`` returns them,
    ``next_tokens[b]`` the token drawn at tree ``b``'s resume row (int64). Draws
    ``total + B`` uniforms, one per row in row order, after every argument is checked.
    ``tokens``, ``parents`` and ``offsets`` are each read once, into the call's own
    arrays; everything after reads only those."""
    probs = check_probs(target_probs, "target_probs")
    t = ids64(tokens, "tokens")
    p = ids64(parents, "parents")
    off = int64_ids(offsets, "offsets")
    # accept_tree_batch checks the trees and the row count; on throwaway rows first,
    # so that a refused call draws nothing
    accept_tree_batch(t, p, off, np.zeros(probs.shape[0], dtype=np.int64))
    g = _generator(rng, seed)
    rows = _draw(probs, g.random(probs.shape[0]))
    counts, resume, path, path_offsets = accept_tree_batch(t, p, off, rows)
    # off is checked (0 <= off[b] <= total): starts + resume lies within rows
    starts = off[:-1] + np.arange(counts.shape[0], dtype=np.int64)
    return counts, resume, path, path_offsets, rows[starts + resume]
