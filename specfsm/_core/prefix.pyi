# Type stub for the compiled module specfsm._core.prefix; its pure-Python twin is
# specfsm/accept/_prefix_py.py (same names, same signatures: tests/test_stubs.py checks both).
__all__ = ["common_prefix"]

def common_prefix(draft: object, row_tokens: object) -> int: ...
