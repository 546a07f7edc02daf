"""Row-cache placement after a K-row verify: one API for numpy (host) and CuPy (device).

``place_rows`` is the batched gather ``dst[b] = src[b, index[b]]`` that resumes every
request from the row its verify settled on; ``snapshot`` is the copy ``enter_verify``
keeps; ``settle_index`` turns a batch's accepted counts into ``index``. numpy arrays go
to the active implementation's host kernel (compiled, or its twin: ``specfsm._impl``);
CuPy arrays go to ``specfsm.placement._cupy``, which is imported only then.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import _impl


__all__ = ["place_rows", "snapshot", "settle_index", "check_errors"]

_host = _impl.load("place")  # the active implementation's host kernels, bound once at import


def _is_cupy(x: object) -> bool:
    return type(x).__module__.startswith("cupy")


_cupy_module = None


def _cupy_path():
    global _cupy_module
    if _cupy_module is None:
        from . import _cupy

        _cupy_module = _cupy
    return _cupy_module


def place_rows(src, index, dst, stream=None):
    """Copy row ``index[b]`` of ``src[b]`` into ``dst[b]`` for each request ``b``; returns ``dst``.

    ``src`` is [B, K, ...], ``dst`` [B, ...] with the same trailing shape and dtype, both
    C-contiguous and both numpy (copied on the host) or both CuPy on one device (one
    kernel launch for the batch, on ``stream`` or the current stream, with no
    synchronisation). ``index`` is B int32/int64 entries, on the host or (CuPy only) on
    the device; ``index[b] < 0`` leaves ``dst[b]`` untouched. Any dtype is copied as raw
    bytes. Refuses bad shapes, dtypes, contiguity or devices, overlapping ``src`` and
    ``dst``, and a host ``index`` entry >= K (IndexError, before anything is copied);
    device entries >= K are skipped and reported by ``check_errors``.
    """
    if _is_cupy(src) or _is_cupy(dst) or _is_cupy(index):
        return _cupy_path().place_rows(src, index, dst, stream)
    if stream is not None:
        raise ValueError("stream applies to CuPy arrays only; src and dst are on the host")
    return _host.place_rows(src, index, dst)


def snapshot(src, out=None, stream=None):
    """An independent copy of ``src`` on the same device (into ``out`` when given).

    numpy arrays are copied on the host (numpy's own copy is one memcpy for contiguous
    arrays); CuPy arrays are copied on the device, on ``stream`` or the current stream,
    without synchronising. Refuses an ``out`` of another shape, dtype or device, and an
    ``out`` that overlaps ``src``.
    """
    if _is_cupy(src) or _is_cupy(out):
        return _cupy_path().snapshot(src, out, stream)
    if stream is not None:
        raise ValueError("stream applies to CuPy arrays only; src is on the host")
    if not isinstance(src, np.ndarray):
        raise TypeError(f"src must be a numpy or CuPy array, got {type(src).__name__}")
    if out is None:
        return src.copy()
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array like src, got {type(out).__name__}")
    if out.shape != src.shape:
        raise ValueError(f"out has shape {out.shape}; it must match src's {src.shape}")
    if out.dtype != src.dtype:
        raise TypeError(f"out has dtype {out.dtype}; it must match src's dtype {src.dtype}")
    if not out.flags.writeable:
        raise ValueError("out is read-only; snapshot writes into it")
    if np.shares_memory(src, out):
        raise ValueError("src and out overlap in memory; snapshot needs a separate out")
    np.copyto(out, src)
    return out


def settle_index(accepted, draft_lens) -> np.ndarray:
    """The ``index`` for ``place_rows`` after a batched verify (an int64 numpy array).

    For request ``b``, ``draft_lens[b]`` draft rows of which ``accepted[b]`` were
    accepted: row ``accepted[b]`` when a row was rejected, ``accepted[b] - 1`` when every
    row was accepted, -1 (cache left alone) when the request drafted nothing. Refuses
    (ValueError naming the request) negative counts and ``accepted[b] > draft_lens[b]``.
    Host arrays or lists only: call ``.get()`` on device counts first.
    """
    if _is_cupy(accepted) or _is_cupy(draft_lens):
        raise TypeError(
            "settle_index takes host arrays or lists; call .get() on CuPy counts first"
        )
    return _host.settle_index(accepted, draft_lens)


def check_errors(device: int | None = None, stream=None) -> None:
    """Raise IndexError if a ``place_rows`` launch skipped rows for a device index >= K.

    This is the synchronisation point for device-side indices: it waits for ``stream``
    when given, otherwise for ``device`` (or every device ``place_rows`` has run on),
    then reads and clears the device's error word in one atomic exchange on the device,
    so a report from a launch still running on another stream is never lost (it is
    raised now or by the next call). Host paths never set it (host indices are checked
    before copying), so without CuPy this returns at once.
    """
    mod = sys.modules.get("specfsm.placement._cupy")
    if mod is None:
        return None
    return mod.check_errors(device, stream)
