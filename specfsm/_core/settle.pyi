# Type stub for the compiled module specfsm._core.settle; its pure-Python twin is
# specfsm/machine/_settle_py.py (same names, same signatures: tests/test_stubs.py checks both).
__all__ = ["settle"]

def settle(draft_len: int, accepted: object, n_row_tokens: int, n_row_caches: int, attempted: str) -> int: ...
