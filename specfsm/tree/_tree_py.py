"""Greedy acceptance over a tree of drafts, and the in-place placement of the accepted
path's cache rows (pure-Python twin of ``specfsm._core.tree``).

A tree of N nodes is ``tokens[N]`` and ``parents[N]`` (``parents[i]`` in ``[-1, i)``, -1
the root: the request's last token, already in the cache). The target evaluates N + 1
rows, row 0 the root's and row i + 1 node i's; ``row_tokens[r]`` is its greedy choice
after row r. Acceptance walks from the root to the child whose token the target chose at
the current node, as long as there is one.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_count, check_offsets, int64_ids
from ._checks import (
    DUPLICATE_SIBLING,
    NEGATIVE_TOKEN,
    PARENT_BELOW_ROOT,
    PARENT_NOT_BEFORE,
    PATH_BEYOND_CACHE,
    PATH_NEGATIVE,
    PATH_NOT_INCREASING,
    as_base,
    base_error,
    batch_rows_reason,
    check_cache,
    check_lengths,
    empty_tree_reason,
    ids64,
    path_error,
    rows_reason,
    tree_error,
)

__all__ = ["check_tree", "accept_tree", "accept_tree_batch", "place_path", "place_path_batch"]


def _children(t: list[int], p: list[int], where: str) -> list[list[int]]:
    """Each node's children in index order (entry ``q + 1`` for parent ``q``, entry 0 the
    root's), after refusing the first bad node: a negative token, a parent out of range
    or not before its node, then the first pair of siblings with one token."""
    n = len(t)
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for i in range(n):
        q = p[i]
        if t[i] < 0:
            raise tree_error(NEGATIVE_TOKEN, i, -1, t[i], q, where)
        if q < -1:
            raise tree_error(PARENT_BELOW_ROOT, i, -1, t[i], q, where)
        if q >= i:
            raise tree_error(PARENT_NOT_BEFORE, i, -1, t[i], q, where)
        children[q + 1].append(i)
    after = [0] * n  # where node i sits among its siblings
    for sibs in children:
        for a, i in enumerate(sibs):
            after[i] = a + 1
    for i in range(n):
        sibs = children[p[i] + 1]
        for j in sibs[after[i]:]:
            if t[j] == t[i]:
                raise tree_error(DUPLICATE_SIBLING, i, j, t[i], p[i], where)
    return children


def _walk(t: list[int], children: list[list[int]], rows: list[int], first: int) -> list[int]:
    """The accepted path: from the root, the child whose token is the target's choice at
    the current node (rows ``first + 1 + node``, the root's ``first``)."""
    path: list[int] = []
    cur = -1
    while True:
        want = rows[first + cur + 1]
        for c in children[cur + 1]:
            if t[c] == want:
                path.append(c)
                cur = c
                break
        else:
            return path


def check_tree(tokens: object, parents: object) -> tuple[np.ndarray, np.ndarray]:
    """The tree's ``(tokens, parents)`` as fresh int64 arrays, or raise.

    Refuses (naming what is wrong) arrays that are not 1-D integer token ids
    (TypeError/ValueError), lengths that differ, an empty tree, a negative token, a
    parent below -1 or not before its node (a cycle), and siblings with equal tokens
    (ValueError).
    """
    t = ids64(tokens, "tokens")
    p = ids64(parents, "parents")
    check_lengths(t.shape[0], p.shape[0])
    _children(t.tolist(), p.tolist(), "")
    return t, p


def accept_tree(tokens: object, parents: object, row_tokens: object) -> np.ndarray:
    """The accepted path's node indices (int64, root first excluded), greedy.

    ``row_tokens`` holds the target's choice after each of the N + 1 rows (row 0 the
    root's, row i + 1 node i's). The request resumes from row ``path[-1] + 1`` (row 0 when
    the path is empty). Refuses what ``check_tree`` refuses, then ``row_tokens`` that are
    not N + 1 integer ids.
    """
    t = ids64(tokens, "tokens")
    p = ids64(parents, "parents")
    r = ids64(row_tokens, "row_tokens")
    n = t.shape[0]
    check_lengths(n, p.shape[0])
    tl = t.tolist()
    children = _children(tl, p.tolist(), "")
    if r.shape[0] != n + 1:
        raise ValueError(rows_reason(r.shape[0], n))
    return np.array(_walk(tl, children, r.tolist(), 0), dtype=np.int64)


def accept_tree_batch(
    tokens: object, parents: object, offsets: object, row_tokens: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Greedy acceptance for B ragged trees in one call.

    Tree ``b`` is ``tokens[offsets[b]:offsets[b + 1]]`` with its ``parents`` (indices
    local to the tree); its N_b + 1 rows follow the trees before it in ``row_tokens``
    (they start at ``offsets[b] + b``). Returns ``(counts, resume, path, path_offsets)``,
    int64: each tree's accepted count, the row it resumes from (within its own rows),
    the accepted node indices (local) of every tree concatenated, and their offsets
    (B + 1). Refuses offsets that do not tile ``tokens``, an empty tree, ``row_tokens``
    not one row per node plus one per tree, and any tree ``check_tree`` refuses (the
    message names the tree).
    """
    t = ids64(tokens, "tokens")
    p = ids64(parents, "parents")
    off = int64_ids(offsets, "offsets")
    r = ids64(row_tokens, "row_tokens")
    total = t.shape[0]
    check_lengths(total, p.shape[0], batch=True)
    check_offsets(off, total, None, "offsets", "tokens", "trees")
    ol = off.tolist()
    B = len(ol) - 1
    for b in range(B):
        if ol[b] == ol[b + 1]:
            raise ValueError(empty_tree_reason(b, ol[b]))
    if r.shape[0] != total + B:
        raise ValueError(batch_rows_reason(r.shape[0], B, total))
    tl, pl, rl = t.tolist(), p.tolist(), r.tolist()
    counts = np.zeros(B, dtype=np.int64)
    resume = np.zeros(B, dtype=np.int64)
    path_offsets = np.zeros(B + 1, dtype=np.int64)
    nodes: list[int] = []
    for b in range(B):
        lo, hi = ol[b], ol[b + 1]
        tb = tl[lo:hi]
        children = _children(tb, pl[lo:hi], f"tree {b}: ")
        path = _walk(tb, children, rl, lo + b)
        nodes.extend(path)
        counts[b] = len(path)
        resume[b] = path[-1] + 1 if path else 0
        path_offsets[b + 1] = len(nodes)
    return counts, resume, np.array(nodes, dtype=np.int64), path_offsets


def _path_code(path: list[int], base: int, n_rows: int) -> tuple[int, int]:
    """The first refusal of ``path`` (code, entry) for a root at row ``base``, or (0, -1)."""
    prev = -1
    for j, v in enumerate(path):
        if v < 0:
            return PATH_NEGATIVE, j
        if j and v <= prev:
            return PATH_NOT_INCREASING, j
        if v > n_rows - 2 - base:
            return PATH_BEYOND_CACHE, j
        prev = v
    return 0, -1


def _move(rows: np.ndarray, base: int, path: list[int]) -> None:
    for j, v in enumerate(path):
        if v != j:  # v > j: the source row is never one an earlier move wrote
            rows[base + 1 + j] = rows[base + 1 + v]


def place_path(cache: np.ndarray, base: object, path: object) -> np.ndarray:
    """Move the accepted path's rows to consecutive rows, in place; returns ``cache``.

    ``cache`` is a writeable C-contiguous ``[L, ...]`` numpy array whose row ``base`` is
    the root's and row ``base + 1 + i`` node i's (the tree evaluation's order); row
    ``base + 1 + path[j]`` moves to row ``base + 1 + j``, as raw bytes. Refuses (before
    moving anything) a bad cache, ``base`` not below L, and a ``path`` entry that is
    negative, not after the one before it, or beyond the cache (IndexError).
    """
    b0 = as_base(base)
    pl = ids64(path, "path").tolist()
    _, L, row = check_cache(cache, False)
    if b0 >= L:
        raise base_error(b0, L)
    code, j = _path_code(pl, b0, L)
    if code:
        raise path_error(code, j, pl[j], pl[j - 1] if j else -1, b0, L)
    if row and pl:
        _move(cache.reshape(-1).view(np.uint8).reshape(L, row), b0, pl)
    return cache


def place_path_batch(
    cache: np.ndarray, base: object, path: object, path_offsets: object
) -> np.ndarray:
    """``place_path`` for B requests in one call; returns ``cache``.

    ``cache`` is ``[B, L, ...]``, ``base`` B roots' rows, ``path`` the accepted node
    indices of every request concatenated with ``path_offsets`` (B + 1, as
    ``accept_tree_batch`` returns them). Refuses as ``place_path`` does, naming the slot
    (and the entry within its path), before anything moves.
    """
    bases = int64_ids(base, "base").tolist()
    pl = ids64(path, "path").tolist()
    po = int64_ids(path_offsets, "path_offsets")
    B, L, row = check_cache(cache, True)
    if len(bases) != B:
        raise ValueError(f"base holds {len(bases)} entries; it needs one per request (B={B})")
    check_offsets(po, len(pl), B, "path_offsets", "path", "requests")
    ol = po.tolist()
    for b in range(B):
        where = f"slot {b}: "
        v = bases[b]
        if v < 0:
            check_count(v, f"base[{b}]")
        if v >= L:
            raise base_error(v, L, where)
        seg = pl[ol[b]:ol[b + 1]]
        code, j = _path_code(seg, v, L)
        if code:
            raise path_error(code, j, seg[j], seg[j - 1] if j else -1, v, L, where)
    if row and pl:
        rows = cache.reshape(-1).view(np.uint8).reshape(B, L, row)
        for b in range(B):
            _move(rows[b], bases[b], pl[ol[b]:ol[b + 1]])
    return cache
