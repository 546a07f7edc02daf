# Type stub for the compiled module specfsm._core.accept; its pure-Python twin is
# specfsm/accept/_accept_py.py (same names, same signatures: tests/test_stubs.py checks both).
import numpy as np

__all__ = ["PROB_ATOL", "check_probs", "exact_batch", "min_run_batch", "speculative_batch", "typical_batch"]

PROB_ATOL: float

def check_probs(probs: object, name: str = "probs") -> np.ndarray: ...
def exact_batch(draft: object, choices: object, offsets: object) -> tuple[np.ndarray, np.ndarray]: ...
def min_run_batch(
    draft: object, choices: object, offsets: object, m: object
) -> tuple[np.ndarray, np.ndarray]: ...
def speculative_batch(
    draft: object,
    offsets: object,
    target_probs: object,
    draft_probs: object | None,
    uniforms: object,
    check: bool = True,
) -> tuple[np.ndarray, np.ndarray]: ...
def typical_batch(
    draft: object,
    offsets: object,
    target_probs: object,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    check: bool = True,
) -> tuple[np.ndarray, np.ndarray]: ...
