"""Tree verification's public face: check a tree of drafts, accept the longest path the
target confirmed (one tree or a ragged batch of them), and move that path's cache rows
into consecutive rows on the host.

A tree of N nodes is ``tokens[N]`` and ``parents[N]`` (``parents[i]`` in ``[-1, i)``: parents
before children, -1 the root, which is the request's last token, already in the cache).
The target evaluates N + 1 rows (row 0 the root's, row i + 1 node i's, each node attending
to the context and its ancestors); ``row_tokens[r]`` is its greedy choice after row r.
Every function is the active implementation's kernel (``specfsm._impl``: the compiled
``specfsm._core.tree`` or its twin ``specfsm.tree._tree_py``), bound once at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _impl

__all__ = ["check_tree", "accept_tree", "accept_tree_batch", "place_path", "place_path_batch"]

if TYPE_CHECKING:  # type checkers read the twin: typed Python with the same names
    from ._tree_py import accept_tree, accept_tree_batch, check_tree, place_path, place_path_batch
else:
    _k = _impl.load("tree")
    check_tree = _k.check_tree
    accept_tree = _k.accept_tree
    accept_tree_batch = _k.accept_tree_batch
    place_path = _k.place_path
    place_path_batch = _k.place_path_batch
