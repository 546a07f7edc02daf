"""Tree verification's public face: check a tree of drafts, accept the longest path the
target confirmed (one tree or a ragged batch of them), and move that path's cache rows
into consecutive rows, on the host (numpy) or on the device (CuPy, one kernel launch).

A tree of N nodes is ``tokens[N]`` and ``parents[N]`` (``parents[i]`` in ``[-1, i)``: parents
before children, -1 the root, which is the request's last token, already in the cache).
The target evaluates N + 1 rows (row 0 the root's, row i + 1 node i's, each node attending
to the context and its ancestors); ``row_tokens[r]`` is its greedy choice after row r.
Every function is the active implementation's kernel (``specfsm._impl``: the compiled
``specfsm._core.tree`` or its twin ``specfsm.tree._tree_py``), bound once at import; the
placements send a CuPy cache to ``specfsm.placement._cupy`` after checking the path on
the host with those same kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import _impl
from .._checks import int64_ids
from .._checks import host_array
from ..placement.place import _cupy_path, _is_cupy, _on_device
from ._checks import as_base, ids64

__all__ = ["check_tree", "accept_tree", "accept_tree_batch", "place_path", "place_path_batch"]

_k = _impl.load("tree")

if TYPE_CHECKING:  # type checkers read the twin: typed Python with the same names
    from ._tree_py import accept_tree, accept_tree_batch, check_tree
else:
    check_tree = _k.check_tree
    accept_tree = _k.accept_tree
    accept_tree_batch = _k.accept_tree_batch

_host_place_path = _k.place_path
_host_place_path_batch = _k.place_path_batch


def _host_controls(*arrays: object) -> None:
    for name, a in zip(("base", "path", "path_offsets"), arrays):
        if _is_cupy(a):
            raise TypeError(
                f"{name} must be on the host (a list or numpy array) for a CuPy cache: the "
                "path is checked there before the launch; call .get() on it first"
            )


def _checked_meta(B: int, L: int, base: object, path: object, path_offsets: object | None):
    """The device kernel's ``meta`` (``[base (B) | offsets (B + 1) | path]``, int64) for B
    requests of a cache of L rows, or None when no row moves; raises what the host
    placement raises for the same arguments, before anything is launched.

    ``path_offsets`` None: one request (``place_path``'s arguments). The checks are the
    active implementation's own, run on a zero-byte stand-in of the cache, over the
    call's private copies of the arrays (what is uploaded is what was checked).
    """
    if path_offsets is None:
        bases = np.array([as_base(base)], dtype=np.int64)
        p = ids64(path, "path")
        offsets = np.array([0, p.shape[0]], dtype=np.int64)
        _host_place_path(np.empty((L, 0), np.uint8), bases[0], p)
    else:
        bases = int64_ids(base, "base")
        p = ids64(path, "path")
        offsets = int64_ids(path_offsets, "path_offsets")
        _host_place_path_batch(np.empty((B, L, 0), np.uint8), bases, p, offsets)
    counts = np.diff(offsets)
    local = np.arange(p.shape[0], dtype=np.int64) - np.repeat(offsets[:-1], counts)
    if not (p != local).any():
        return None  # every accepted row is already where it belongs
    return np.concatenate([bases, offsets, p])


def place_path(cache, base, path, stream=None):
    """Move the accepted path's rows to consecutive rows, in place; returns ``cache``.

    ``cache`` is a C-contiguous ``[L, ...]`` array (numpy or a CPU tensor, writeable; or
    CuPy or a CUDA tensor, on torch's current stream unless ``stream`` says) whose row
    ``base`` is the root's and row ``base + 1 + i`` node i's (the tree evaluation's order);
    row ``base + 1 + path[j]`` moves to row ``base + 1 + j``, as raw bytes. Refuses (before
    moving anything) a bad cache, ``base`` not below L, and a ``path`` entry that is
    negative, not after the one before it, or beyond the cache (IndexError). A CuPy cache
    is moved by one kernel launch on ``stream`` (or the current stream) without
    synchronising; ``base`` and ``path`` stay host values, checked before the launch.
    """
    if _on_device(cache):
        _host_controls(base, path)
        cp = _cupy_path()
        (c,), stream = cp.device_views((cache,), stream)
        _, L, row = cp.check_path_cache(c, False)
        meta = _checked_meta(1, L, base, path, None)
        cp.place_path(c, meta, 1, L, row, stream)
        return cache
    if stream is not None:
        raise ValueError("stream applies to CuPy arrays only; the cache is on the host")
    _host_place_path(host_array(cache, "cache", raw=True), base, path)
    return cache


def place_path_batch(cache, base, path, path_offsets, stream=None):
    """``place_path`` for B requests in one call; returns ``cache``.

    ``cache`` is ``[B, L, ...]``, ``base`` B roots' rows, ``path`` the accepted node
    indices of every request concatenated with ``path_offsets`` (B + 1, as
    ``accept_tree_batch`` returns them). Refuses as ``place_path`` does, naming the slot
    (and the entry within its path), before anything moves. A CuPy cache takes one
    kernel launch for the whole batch, as ``place_path``.
    """
    if _on_device(cache):
        _host_controls(base, path, path_offsets)
        cp = _cupy_path()
        (c,), stream = cp.device_views((cache,), stream)
        B, L, row = cp.check_path_cache(c, True)
        meta = _checked_meta(B, L, base, path, path_offsets)
        cp.place_path(c, meta, B, L, row, stream)
        return cache
    if stream is not None:
        raise ValueError("stream applies to CuPy arrays only; the cache is on the host")
    _host_place_path_batch(host_array(cache, "cache", raw=True), base, path, path_offsets)
    return cache
