# Type stub for the compiled module specfsm._core.ngram; its pure-Python twin is
# specfsm/drafting/_ngram_py.py (same names, same signatures: tests/test_stubs.py checks both).
from typing import Any

__all__ = ["prompt_lookup"]

# a list for a list or tuple history, an array of the history's dtype for an array
def prompt_lookup(history: object, ngram: object, max_k: object) -> Any: ...
