"""Drafting: what the drafter proposes for the target to verify.

Prompt lookup and the common prefix (``lookup``), the incremental n-gram and suffix
indexes (``ngram_index``, ``suffix_index``), their twins and shared machinery, and
the one serving-step policy each index kind runs.
"""

from specfsm.drafting.lookup import common_prefix, prompt_lookup

__all__ = ["common_prefix", "prompt_lookup"]
