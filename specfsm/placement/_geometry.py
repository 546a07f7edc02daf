"""Launch geometry for ``place_rows.cu``: vector width and grid, without CuPy.

Kept apart from the CuPy wrapper so tests can check the kernel's indexing on the host
(the CUDA source compiled as C++ and run block by block) with the exact grid it gets.
"""

from __future__ import annotations

__all__ = ["THREADS", "UNROLL", "MAX_GRID_Y", "vector_width", "grid"]

THREADS = 256  # matches __launch_bounds__(256) in place_rows.cu
UNROLL = 4  # matches PLACE_UNROLL in place_rows.cu
MAX_GRID_Y = 65535
_WIDTHS = (16, 8, 4, 2, 1)


def vector_width(row_bytes: int, src_ptr: int, dst_ptr: int) -> int:
    """The widest access (16/8/4/2/1 bytes) dividing the row size and both base pointers,
    so that every row of ``src`` and ``dst`` starts aligned to it."""
    for w in _WIDTHS:
        if row_bytes % w == 0 and src_ptr % w == 0 and dst_ptr % w == 0:
            return w
    return 1


def grid(B: int, nvec: int, sm_count: int) -> tuple[int, int]:
    """Blocks per row (x) and over requests (y) for B rows of ``nvec`` vectors.

    Chunks of THREADS * UNROLL vectors per block, split finer (down to THREADS vectors)
    when that would leave fewer than 4 blocks per SM; y covers B up to 65535 and the
    kernel strides past that.
    """
    nvec = max(nvec, 1)
    gx = -(-nvec // (THREADS * UNROLL))
    want = 4 * max(sm_count, 1)
    if gx * B < want:
        gx = max(gx, min(-(-nvec // THREADS), -(-want // max(B, 1))))
    return max(gx, 1), max(min(B, MAX_GRID_Y), 1)
