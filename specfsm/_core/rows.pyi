# Type stub for the compiled module specfsm._core.rows; its pure-Python twin is
# specfsm/drafting/_rows_py.py (same names, same signatures: tests/test_stubs.py checks both).
from typing import Any

__all__ = ["steady_rows"]

def steady_rows(
    sampled: Any, num_tokens: Any, tok: Any, n_old: Any, seen: Any, tail: Any, spos: Any, spread: Any, anchors: Any,
    deep_first: int, deep_every: int, short: int, cap: int, pool_filter: Any, filter_mul: Any
) -> tuple | None: ...
