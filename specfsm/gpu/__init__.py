"""Optional GPU support: row-cache placement and snapshots for CuPy caches.

``import specfsm.gpu`` works without CuPy or a GPU. The functions take numpy arrays (run
on the host, compiled core or twin) or CuPy arrays (one custom kernel launch); CuPy is
imported only when a CuPy array arrives. ``has_cupy_gpu()`` says whether CuPy sees a
device. The placement itself lives in ``specfsm.placement`` (host and CuPy); this
package is its documented import path.
"""

from __future__ import annotations

import functools

from ..placement.place import check_errors, place_rows, settle_index, snapshot

__all__ = ["has_cupy_gpu", "place_rows", "snapshot", "settle_index", "check_errors"]


@functools.cache
def has_cupy_gpu() -> bool:
    """Whether CuPy imports and sees at least one CUDA device (computed once, then cached).

    A missing or broken CuPy (ImportError, missing CUDA libraries) and CUDA runtime errors
    (no driver, no device) all mean False.
    """
    try:
        import cupy
    except (ImportError, OSError, RuntimeError):
        return False
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except (cupy.cuda.runtime.CUDARuntimeError, RuntimeError, OSError):
        return False
