"""Optional GPU support: row-cache placement and snapshots for CuPy caches.

``import specfsm.gpu`` works without CuPy or a GPU. The functions take numpy arrays (run
on the host, compiled core or twin) or CuPy arrays (one custom kernel launch); CuPy is
imported only when a CuPy array arrives. ``has_cupy_gpu()`` says whether CuPy sees a
device. The host twin (``_place_py``) and the checks both implementations share
(``_checks``) sit beside ``place`` (the dispatch) and ``_cupy`` (the CUDA kernels).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .place import check_errors, place_rows, settle_index, snapshot

__all__ = ["has_cupy_gpu", "place_rows", "snapshot", "settle_index", "check_errors"]
_PLACE = ("place_rows", "snapshot", "settle_index", "check_errors")


def __getattr__(name: str) -> Any:
    # the placement functions load on first use: the compiled host kernel imports this
    # package's checks (specfsm.gpu._checks) while specfsm._impl is still picking the
    # implementations, before gpu.place can bind the active one
    if name in _PLACE:
        from . import place

        return getattr(place, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
