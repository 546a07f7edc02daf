"""Row-cache placement after a K-row verify: one API for the host and the device.

``place_rows`` is the batched gather ``dst[b] = src[b, index[b]]`` that resumes every
request from the row its verify settled on; ``snapshot`` is the copy ``enter_verify``
keeps; ``settle_index`` turns a batch's accepted counts into ``index``. Host memory
(numpy arrays, and CPU tensors of other libraries such as torch, read as numpy views of
their own memory through DLPack: no copy, the writes land in the tensor) goes to the
active implementation's host kernel (compiled, or its twin: ``specfsm._impl``); device
memory (CuPy arrays, and CUDA tensors such as torch's, viewed as CuPy arrays through
``__cuda_array_interface__``: no copy) goes to ``specfsm.placement._cupy``, imported
only then. A torch CUDA tensor is written on torch's current stream of its device unless
``stream`` says otherwise. The functions return the caller's own ``dst``/``out``.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import _impl
from .._checks import host_array


__all__ = ["place_rows", "snapshot", "settle_index", "check_errors"]

_host = _impl.load("place")  # the active implementation's host kernels, bound once at import


def _is_cupy(x: object) -> bool:
    return type(x).__module__.startswith("cupy")


def _on_device(*xs: object) -> bool:
    """Whether any of ``xs`` is device memory: a CuPy array or another library's CUDA
    tensor (it has ``__cuda_array_interface__``)."""
    return any(_is_cupy(x) or hasattr(x, "__cuda_array_interface__") for x in xs)


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
    C-contiguous and both in host memory (numpy arrays or CPU tensors: copied on the
    host) or both on one device (CuPy arrays or CUDA tensors: one kernel launch for the
    batch, on ``stream`` or the current stream, with no synchronisation). ``index`` is B int32/int64 entries, on the host or (CuPy only) on
    the device; ``index[b] < 0`` leaves ``dst[b]`` untouched. Any dtype is copied as raw
    bytes. Refuses bad shapes, dtypes, contiguity or devices, overlapping ``src`` and
    ``dst``, and a host ``index`` entry >= K (IndexError, before anything is copied);
    device entries >= K are skipped and reported by ``check_errors``.
    """
    if _on_device(src, index, dst):
        cp = _cupy_path()
        (s, i, d), stream = cp.device_views((src, index, dst), stream)
        cp.place_rows(s, i, d, stream)
        return dst
    if stream is not None:
        raise ValueError("stream applies to CuPy arrays only, and CUDA tensors; src and dst are on the host")
    _host.place_rows(host_array(src, "src", raw=True), host_array(index, "index"),
                     host_array(dst, "dst", raw=True))
    return dst


def snapshot(src, out=None, stream=None):
    """An independent copy of ``src`` on the same device (into ``out`` when given).

    Host memory is copied on the host (numpy's own copy is one memcpy for contiguous
    arrays; without ``out`` the copy is a numpy array); device memory on the device, on
    ``stream`` or the current stream, without synchronising. Refuses an ``out`` of another shape, dtype or device, and an
    ``out`` that overlaps ``src``.
    """
    if _on_device(src, out):
        cp = _cupy_path()
        (s, o), stream = cp.device_views((src, out), stream)
        copy = cp.snapshot(s, o, stream)
        return copy if out is None else out
    if stream is not None:
        raise ValueError("stream applies to CuPy arrays only, and CUDA tensors; src is on the host")
    hsrc, hout = host_array(src, "src", raw=True), host_array(out, "out", raw=True)
    if not isinstance(hsrc, np.ndarray):
        raise TypeError(f"src must be a numpy or CuPy array, got {type(src).__name__}")
    if out is None:
        return hsrc.copy()          # a numpy array (host outputs are numpy)
    if not isinstance(hout, np.ndarray):
        raise TypeError(f"out must be a numpy array like src, got {type(out).__name__}")
    if hout.shape != hsrc.shape:
        raise ValueError(f"out has shape {hout.shape}; it must match src's {hsrc.shape}")
    if hout.dtype != hsrc.dtype:
        raise TypeError(f"out has dtype {hout.dtype}; it must match src's dtype {hsrc.dtype}")
    if not hout.flags.writeable:
        raise ValueError("out is read-only; snapshot writes into it")
    if np.shares_memory(hsrc, hout):
        raise ValueError("src and out overlap in memory; snapshot needs a separate out")
    np.copyto(hout, hsrc)
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
