"""specfsm: a control plane for speculative decoding.

The ``ServingState`` machine says which evaluation shape is legal right now (prefill,
single-row decode, K-row verify) and settles what a verify evaluation confirmed; its hot
paths run on a compiled Cython core, or on a pure-Python twin where that is not built or
``SPECFSM_NO_EXTENSIONS=1`` is set. ``USE_EXTENSIONS`` says whether every kernel module is
compiled; ``extensions()`` says which are, and why any fell back to the twin.
"""

from ._impl import USE_EXTENSIONS, extensions
from .accept.rules import (
    AcceptRule,
    Exact,
    MinRun,
    SpeculativeSampling,
    TypicalAcceptance,
    accept_with,
)
from .drafting.lookup import common_prefix, prompt_lookup
from .errors import IllegalTransition, ServingFsmError
from .machine.batch import BatchState, StepResult
from .drafting.batch import extend_batch, propose_batch, record_batch, serve_batch, serve_batch_lists
from .drafting.ngram_index import NgramIndex, longest_match, longest_match_batch
from .machine.state import Accept, Decode, Done, Prefill, Rollback, ServingState, Verify, VerifyTree
from .drafting.suffix_index import SharedSuffixCache, SuffixDrafter, SuffixIndex
from .drafting.recycling import RecyclingTable, merge_trees
from .placement.place import place_rows, snapshot
from .tree.tree import accept_tree, accept_tree_batch, check_tree, place_path, place_path_batch

__version__ = "0.1.0"

__all__ = [
    "USE_EXTENSIONS",
    "extensions",
    "ServingState",
    "Prefill",
    "Decode",
    "Verify",
    "VerifyTree",
    "Accept",
    "Rollback",
    "Done",
    "ServingFsmError",
    "IllegalTransition",
    "prompt_lookup",
    "common_prefix",
    "NgramIndex",
    "longest_match",
    "longest_match_batch",
    "propose_batch",
    "record_batch",
    "extend_batch",
    "serve_batch",
    "serve_batch_lists",
    "SuffixIndex",
    "SuffixDrafter",
    "SharedSuffixCache",
    "RecyclingTable",
    "merge_trees",
    "BatchState",
    "StepResult",
    "AcceptRule", "Exact", "MinRun", "SpeculativeSampling", "TypicalAcceptance", "accept_with",
    "check_tree",
    "accept_tree",
    "accept_tree_batch",
    "place_path",
    "place_path_batch",
    "place_rows",
    "snapshot",
]
