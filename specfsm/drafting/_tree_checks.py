"""Argument checks and limits of the suffix index's tree drafts (``propose_tree``).

Shared by the compiled ``specfsm._core.suffix_index`` and its twin, so both refuse the
same arguments with the same messages.
"""

from __future__ import annotations

from .._checks import check_count

__all__ = ["MAX_TREE_NODES", "TREE_OCCURRENCES", "TREE_WINDOW", "TREE_CONTEXTS", "DEFAULT_TREE_WIDTH",
           "TREE_AGREE_SPAN", "TREE_AGREE_MIN", "check_tree_args"]

MAX_TREE_NODES = 1024     # the largest budget (and depth, and width) a tree may ask for
TREE_OCCURRENCES = 32     # per context: the latest earlier occurrences a tree counts
TREE_WINDOW = 2048        # occurrences counted end at most this many positions back
TREE_CONTEXTS = 3         # the matched suffix and at most two shorter ones
DEFAULT_TREE_WIDTH = 4    # children per node when ``max_width`` is None
TREE_AGREE_SPAN = 32      # the last tokens the chain's agreement compares
TREE_AGREE_MIN = 24       # the agreement at which the tree copies (keeps the chain whole)


def _limit(value: object, name: str) -> int:
    v = check_count(value, name)
    if v < 1 or v > MAX_TREE_NODES:
        raise ValueError(f"{name} must be between 1 and {MAX_TREE_NODES}, got {v}")
    return v


def check_tree_args(budget: object, max_depth: object, max_width: object) -> tuple[int, int, int]:
    """``propose_tree``'s limits as ints: ``budget`` nodes (1..MAX_TREE_NODES),
    ``max_depth`` (None: the budget) and ``max_width`` (None: DEFAULT_TREE_WIDTH), each
    1..MAX_TREE_NODES. Raises TypeError or ValueError naming the argument."""
    b = _limit(budget, "budget")
    d = b if max_depth is None else _limit(max_depth, "max_depth")
    w = DEFAULT_TREE_WIDTH if max_width is None else _limit(max_width, "max_width")
    return b, d, w
