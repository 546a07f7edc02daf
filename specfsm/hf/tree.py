"""Tree verification on the ragged batch cache: one forward evaluates a tree of draft
tokens per request, each node attending to its request's context and its own ancestors,
and the accepted path's columns are what the cache keeps.

A request's tree of ``N >= 0`` nodes (none: the root alone, a decode) is the drafter's flat form (``specfsm.tree``): ``tokens[N]``
and ``parents[N]``, ``parents[i]`` in ``[-1, i)``, -1 being the root (the request's last
token, not yet in the cache). The forward feeds ``N + 1`` columns per request: column 0
the root, column ``i + 1`` node ``i``, at position ``valid + depth`` (the root at depth 0),
so the tokens of any root-to-node path sit at the positions a chain of them would take.
One 4-D additive mask (``(B, 1, W, width + W)``, 0 where a row may attend, the dtype's
least value elsewhere) lets each fed column see the request's consumed cache columns (the
2-D hole mask of ``RaggedBatch``), itself and its ancestors; a request with a smaller
tree fills its extra columns with copies of the root, which attend as the root does and
are holes afterwards. Only attention implementations that apply a custom 4-D mask as
given can do this: ``eager``, ``sdpa`` and specfsm's grouped ``sdpa`` (``check_tree_attention`` refuses the others,
flash attention and flex attention among them, naming the implementation).

``keep_paths`` keeps, per request, the root column and the accepted path's node columns:
in a batch the other fed columns become holes (positions need no change: the path's are
consecutive), trailing columns no request kept are cropped, and ``RaggedBatch.compact``
gathers the holes away when that pays; a batch of one has its path's columns moved to
consecutive columns at once (one gather per layer over the fed block) and the rest
cropped, so it keeps decoding without a mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .attention import GROUPED
from .evaluate import RaggedBatch, UnsupportedModel

__all__ = ["TREE_ATTENTION", "check_tree_attention", "tree_depths", "tree_ancestors", "feed_tree", "keep_paths"]

#: The attention implementations that apply a custom 4-D mask as given (transformers 5
#: passes a 4-D ``attention_mask`` through unchanged; eager adds it to the scores, sdpa
#: hands it to ``scaled_dot_product_attention`` as an additive mask, the grouped one
#: tiled for its rows, ``specfsm.hf.attention``).
TREE_ATTENTION = ("eager", "sdpa", GROUPED)


def check_tree_attention(model: Any) -> str:
    """The model's attention implementation, if it can verify a tree; else
    ``UnsupportedModel`` naming it and how to load one that can."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager"
    if impl not in TREE_ATTENTION:
        raise UnsupportedModel(
            f"tree verification needs an attention implementation that applies a custom 4-D mask "
            f"({' or '.join(TREE_ATTENTION)}); this model uses {impl!r}: load it with "
            f"attn_implementation='sdpa' (or verify chains)")
    return impl


def _parents(parents: Any) -> np.ndarray:
    p = np.asarray(parents)
    if p.ndim != 1 or (p.dtype.kind not in "iu" and len(p)):
        raise ValueError(f"parents must be a 1-D integer sequence, got {p.dtype} of shape {p.shape}")
    p = p.astype(np.int64, copy=False)
    bad = np.nonzero((p < -1) | (p >= np.arange(len(p))))[0]
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"parents[{i}] = {int(p[i])} must be in [-1, {i}) (parents before children)")
    return p


def tree_depths(parents: Any) -> np.ndarray:
    """The depth of every fed column of a tree (``N + 1`` of them: the root 0, node ``i``
    one more than its parent)."""
    p = _parents(parents)
    d = np.zeros(len(p) + 1, dtype=np.int64)
    for i, q in enumerate(p.tolist()):
        d[i + 1] = d[q + 1] + 1
    return d


def tree_ancestors(parents: Any) -> np.ndarray:
    """``(N + 1, N + 1)`` booleans: ``[r, c]`` when fed column ``c`` is column ``r`` or
    one of its ancestors (column 0, the root, is every column's)."""
    p = _parents(parents)
    n = len(p) + 1
    anc = np.zeros((n, n), dtype=bool)
    anc[0, 0] = True
    for i, q in enumerate(p.tolist()):
        anc[i + 1] = anc[q + 1]
        anc[i + 1, i + 1] = True
    return anc


def feed_tree(rb: RaggedBatch, roots: Sequence[int], trees: Sequence[tuple[Any, Any]],
              valid: Sequence[int], dtype: Any) -> Any:
    """One forward of every request's tree: row ``j`` feeds ``roots[j]`` then
    ``trees[j] = (tokens, parents)`` at positions from ``valid[j]`` (the tokens its
    cache holds); returns the logits ``(B, W, vocab)``, column ``i + 1`` of row ``j``
    being the target's distribution after node ``i``. ``dtype``: the model's float type
    (the mask's)."""
    import torch

    b = len(trees)
    if not (b == len(roots) == len(valid)) or not b:
        raise ValueError(f"feed_tree: {len(roots)} roots, {len(trees)} trees and {len(valid)} lengths for one batch")
    shapes = []
    for j, (tok, par) in enumerate(trees):
        t = np.asarray(tok)
        if t.ndim != 1 or (t.dtype.kind not in "iu" and len(t)) or len(t) != len(np.asarray(par)):
            raise ValueError(f"trees[{j}]: tokens must be a 1-D integer sequence as long as parents")
        shapes.append((t.astype(np.int64, copy=False), tree_ancestors(par), tree_depths(par)))
    w = max(len(t) + 1 for t, _, _ in shapes)
    width, buf = rb.width, rb.buf
    if width + w > buf.shape[1]:
        nb = torch.zeros((buf.shape[0], 2 * (width + w)), dtype=torch.long)
        nb[:, :width] = buf[:, :width]
        rb.buf = buf = nb
    ids = torch.empty((b, w), dtype=torch.long)
    pos = torch.empty((b, w), dtype=torch.long)
    fed = np.zeros((b, w, w), dtype=bool)
    buf[:, width:width + w] = 0
    for j, (t, anc, depth) in enumerate(shapes):
        n = len(t) + 1
        ids[j, 0] = int(roots[j])
        ids[j, 1:n] = torch.from_numpy(t)
        ids[j, n:] = int(roots[j])
        pos[j, :n] = torch.from_numpy(depth + int(valid[j]))
        pos[j, n:] = int(valid[j])
        fed[j, :n, :n] = anc
        fed[j, n:, 0] = True  # a filler column attends as the root does (its output is unused)
        buf[j, width:width + n] = 1
    seen = torch.cat([buf[:, :width].bool()[:, None, :].expand(b, w, width), torch.from_numpy(fed)], dim=2)
    mask = torch.zeros((b, 1, w, width + w), dtype=dtype)
    mask.masked_fill_(~seen[:, None], torch.finfo(dtype).min)
    rb.width = width + w
    rb.fed = w
    return rb.forward(ids, pos, mask, rb.cache)


def keep_paths(rb: RaggedBatch, paths: Sequence[Sequence[int]]) -> None:
    """After ``feed_tree``: row ``j`` keeps the root column and the columns of the nodes
    in ``paths[j]`` (node indices, root to leaf, each the child of the one before); the
    other fed columns become holes and trailing columns no row kept are cropped. A batch
    of one has its kept columns moved together at once (module docstring)."""
    import torch

    width, w = rb.width, rb.fed
    base = width - w
    keeps = []
    for j, path in enumerate(paths):
        cols = [0] + [int(a) + 1 for a in path]
        if any(not 0 < c < w for c in cols[1:]) or any(x >= y for x, y in zip(cols, cols[1:])):
            raise ValueError(f"paths[{j}] = {list(path)} is not an ascending path of fed nodes (fewer than {w})")
        keeps.append(cols)
    if len(keeps) != rb.buf.shape[0]:
        raise ValueError(f"keep_paths: {len(keeps)} paths for a batch of {rb.buf.shape[0]}")
    if len(keeps) == 1:
        cols = keeps[0]
        m = len(cols)
        if cols != list(range(m)):
            index = torch.tensor(cols) + base
            with torch.inference_mode():  # the cache's tensors come from inference-mode forwards
                for layer in rb.cache.layers:
                    if not getattr(layer, "is_initialized", True) or getattr(layer, "keys", None) is None:
                        continue
                    layer.keys[:, :, base:base + m] = layer.keys.index_select(2, index)
                    layer.values[:, :, base:base + m] = layer.values.index_select(2, index)
        rb.buf[0, base + m:width] = 0
        if w > m:
            rb.cache.crop(m - w)  # transformers 5: a negative count of columns to remove
        rb.width = base + m
        return
    for j, cols in enumerate(keeps):
        row = torch.zeros(w, dtype=torch.long)
        row[cols] = 1
        rb.buf[j, base:width] = row
    trailing = w - max(c[-1] + 1 for c in keeps)
    if trailing:
        rb.cache.crop(-trailing)
        rb.width = width - trailing
