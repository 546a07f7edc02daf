"""Argument checks of tree verification: the tree's arrays, the target's rows, the batch's
trees, and the cache and path of ``place_path``; the messages both implementations raise.

A check that runs over every node (a negative token, a parent out of range or after its
node, equal sibling tokens, a path that does not increase) is a loop in the kernel, which
reports what it found as a code; ``tree_error`` and ``path_error`` turn that code into the
one message. Nothing here is a kernel: the compiled module (``specfsm._core.tree``) and its
twin (``specfsm.tree._tree_py``) both call these.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_count, token_ids

__all__ = [
    "NEGATIVE_TOKEN",
    "PARENT_BELOW_ROOT",
    "PARENT_NOT_BEFORE",
    "DUPLICATE_SIBLING",
    "PATH_NEGATIVE",
    "PATH_NOT_INCREASING",
    "PATH_BEYOND_CACHE",
    "ids64",
    "check_lengths",
    "tree_error",
    "rows_reason",
    "batch_rows_reason",
    "empty_tree_reason",
    "check_cache",
    "as_base",
    "base_error",
    "path_error",
]

# what a kernel's node loop found (0: nothing)
NEGATIVE_TOKEN = 1  #: tokens[i] < 0
PARENT_BELOW_ROOT = 2  #: parents[i] < -1
PARENT_NOT_BEFORE = 3  #: parents[i] >= i (a parent after its child, or a cycle)
DUPLICATE_SIBLING = 4  #: nodes i < j share a parent and a token
PATH_NEGATIVE = 5  #: path[j] < 0
PATH_NOT_INCREASING = 6  #: path[j] <= path[j - 1]
PATH_BEYOND_CACHE = 7  #: base + 1 + path[j] >= the cache's rows

_INT64 = np.dtype(np.int64)


def ids64(x: object, name: str) -> np.ndarray:
    """``x`` as a fresh 1-D int64 array the call owns (``specfsm._checks.token_ids``'s
    rule: integers only, 1-D; TypeError/ValueError/OverflowError naming ``name``)."""
    arr = token_ids(x, name, own=True)
    return arr if arr.dtype == _INT64 else arr.astype(np.int64)


def check_lengths(n_tokens: int, n_parents: int, *, batch: bool = False) -> None:
    """Refuses (ValueError) ``tokens`` and ``parents`` of different lengths, and (unless
    ``batch``, whose offsets say where each tree is) an empty tree."""
    if n_tokens != n_parents:
        raise ValueError(
            f"tokens has {n_tokens} nodes and parents {n_parents}; they must have the same length"
        )
    if n_tokens == 0 and not batch:
        raise ValueError("the tree is empty: tokens and parents need at least one node")


def tree_error(code: int, i: int, j: int, token: int, parent: int, where: str = "") -> ValueError:
    """The refusal a kernel's node loop reported: ``code`` at node ``i`` (and node ``j``,
    its later sibling with the same token, for ``DUPLICATE_SIBLING``); ``token`` and
    ``parent`` are node ``i``'s; ``where`` prefixes the tree's place in a batch."""
    if code == NEGATIVE_TOKEN:
        msg = f"tokens[{i}]={token} is negative; token ids are >= 0"
    elif code == PARENT_BELOW_ROOT:
        msg = f"parents[{i}]={parent} is out of range; a parent is -1 (the root) or an earlier node"
    elif code == PARENT_NOT_BEFORE:
        msg = (
            f"parents[{i}]={parent} is not before node {i}: parents come before their "
            "children (a parent at or after its node would make a cycle)"
        )
    elif code == DUPLICATE_SIBLING:
        msg = (
            f"nodes {i} and {j} are siblings (parent {parent}) with the same token {token}; "
            "sibling tokens must differ"
        )
    else:  # pragma: no cover - the kernels report only the codes above
        msg = f"unknown tree refusal {code} at node {i}"
    return ValueError(where + msg)


def rows_reason(n_rows: int, n_nodes: int) -> str:
    """``row_tokens`` of the wrong length for a tree of ``n_nodes`` nodes."""
    return (
        f"row_tokens holds {n_rows} rows for a tree of {n_nodes} nodes; it needs "
        f"N + 1 = {n_nodes + 1} (row 0 is the root's, row i + 1 node i's)"
    )


def batch_rows_reason(n_rows: int, n_trees: int, n_nodes: int) -> str:
    """A batch's ``row_tokens`` of the wrong length (one row per node plus one per tree)."""
    return (
        f"row_tokens holds {n_rows} rows for {n_trees} trees of {n_nodes} nodes in all; it "
        f"needs one row per node plus one root row per tree = {n_nodes + n_trees}"
    )


def empty_tree_reason(b: int, at: int) -> str:
    """Tree ``b`` of a batch has no node (``offsets[b] == offsets[b + 1] == at``)."""
    return f"tree {b} is empty (offsets[{b}] == offsets[{b + 1}] == {at}); every tree needs a node"


def check_cache(cache: object, batched: bool) -> tuple[int, int, int]:
    """``(B, L, row_bytes)`` of a cache whose rows ``place_path`` moves, or raise.

    The cache is a writeable, C-contiguous numpy array of a dtype without references:
    ``[L, ...]`` (``B`` reported as 1) or, ``batched``, ``[B, L, ...]``; a row is
    everything after the row axis, copied as raw bytes.
    """
    if type(cache) is not np.ndarray:
        raise TypeError(f"cache must be a numpy array, got {type(cache).__name__}")
    need = 2 if batched else 1
    if cache.ndim < need:
        shape = "[B, L, ...]" if batched else "[L, ...]"
        raise ValueError(f"cache must be {shape}, got shape {cache.shape}")
    if cache.dtype.hasobject:
        raise TypeError(f"cache has dtype {cache.dtype}; a raw byte copy cannot move references")
    if not cache.flags.c_contiguous:
        raise ValueError("cache must be C-contiguous")
    if not cache.flags.writeable:
        raise ValueError("cache is read-only; the path's rows are moved in place")
    if batched:
        B, L = int(cache.shape[0]), int(cache.shape[1])
        rest = cache.shape[2:]
    else:
        B, L = 1, int(cache.shape[0])
        rest = cache.shape[1:]
    return B, L, int(np.prod(rest, dtype=np.int64)) * cache.dtype.itemsize


def as_base(base: object) -> int:
    """A single request's ``base`` (the root's row in the cache) as a count >= 0."""
    return check_count(base, "base")


def base_error(base: int, n_rows: int, where: str = "") -> IndexError:
    """A root row ``base`` outside a cache of ``n_rows`` rows."""
    return IndexError(f"{where}base={base} is beyond the cache's {n_rows} rows")


def path_error(code: int, j: int, value: int, prev: int, base: int, n_rows: int,
               where: str = "") -> Exception:
    """The refusal ``place_path``'s loop reported: ``code`` at ``path[j]`` (``value``;
    ``prev`` is ``path[j - 1]``), for a request whose root sits at row ``base`` of a cache
    of ``n_rows`` rows; ``where`` prefixes the request's slot in a batch."""
    if code == PATH_NEGATIVE:
        return ValueError(f"{where}path[{j}]={value} is negative; path entries are node indices")
    if code == PATH_NOT_INCREASING:
        return ValueError(
            f"{where}path[{j}]={value} is not after path[{j - 1}]={prev}; an accepted "
            "path's nodes increase (parents come before their children)"
        )
    if code == PATH_BEYOND_CACHE:
        return IndexError(
            f"{where}path[{j}]={value} is row base + 1 + {value} = {base + 1 + value}, "
            f"beyond the cache's {n_rows} rows (base={base})"
        )
    return ValueError(f"{where}unknown path refusal {code}")  # pragma: no cover
