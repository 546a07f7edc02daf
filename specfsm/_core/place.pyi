# Type stub for the compiled module specfsm._core.place; its pure-Python twin is
# specfsm/gpu/_place_py.py (same names, same signatures: tests/test_stubs.py checks both).
import numpy as np

__all__ = ["place_rows", "settle_index"]

def place_rows(src: np.ndarray, index: object, dst: np.ndarray) -> np.ndarray: ...
def settle_index(accepted: object, draft_lens: object) -> np.ndarray: ...
