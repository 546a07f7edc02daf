"""Drafting: what the drafter proposes for the target to verify.

Prompt lookup and the common prefix (``lookup``), the incremental n-gram and suffix
indexes (``ngram_index``, ``suffix_index``), their twins (``_*_py``) and the twins'
shared machinery (``_index_py``), and the one serving-step policy each index kind runs
(``serve`` / ``serve_batch``). The two functions below load on first use, so that
importing a twin module of this package (which ``specfsm._impl`` does while it picks the
implementations) does not reach back into ``_impl`` before it is ready.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .lookup import common_prefix, prompt_lookup

__all__ = ["common_prefix", "prompt_lookup"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import lookup

        return getattr(lookup, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
