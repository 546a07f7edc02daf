"""The CuPy path of ``specfsm.gpu``: imported only when a CuPy array arrives.

``place_rows`` launches one kernel from ``place_rows.cu`` for the whole batch, and so does
``place_path`` for a batch of trees' accepted paths (the kernels compiled with
``cupy.RawModule`` on first use, cached per device). RawKernel checks nothing, so
everything is checked before the launch: array types, shapes, dtypes, contiguity,
devices and overlap here, a path's host arrays by ``specfsm.tree``. Nothing in
``place_rows``, ``place_path`` or ``snapshot`` waits for the device (apart from the first
call on a device, which compiles the kernels and sets up the error flag);
``check_errors`` is the one place that does.
"""

from __future__ import annotations

import threading
from importlib import resources

import cupy
import numpy as np

from .._checks import INT32_MAX
from ._checks import (
    as_host_index,
    byte_bounds,
    check_place_arrays,
    host_index_array,
    overlap_message,
    ranges_overlap,
)
from ._geometry import THREADS, grid, vector_width

__all__ = ["place_rows", "snapshot", "check_errors", "check_path_cache", "place_path", "device_views"]

_DEVICE_INDEX = (np.dtype(np.int32), np.dtype(np.int64))

_lock = threading.Lock()
_source: str | None = None
_modules: dict[int, cupy.RawModule] = {}
_kernels: dict[tuple[int, int, int], object] = {}
_flags: dict[int, cupy.ndarray] = {}
_sm_counts: dict[int, int] = {}


def _kernel_source() -> str:
    global _source
    if _source is None:
        _source = resources.files("specfsm.placement").joinpath("place_rows.cu").read_text("utf-8")
    return _source


def _function(dev: int, key: tuple[int, int, int], name: str):
    """Function ``name`` of this device's module (the module compiled once per device,
    each function looked up once, under ``key``). Called with ``dev`` current."""
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                module = _modules.get(dev)
                if module is None:
                    module = cupy.RawModule(code=_kernel_source())
                    _modules[dev] = module
                kernel = module.get_function(name)
                _kernels[key] = kernel
    return kernel


def _kernel(dev: int, width: int, index_bytes: int):
    """The kernel for this device, vector width and index width (compiled once per device).

    Called with ``dev`` current.
    """
    return _function(dev, (dev, width, index_bytes), f"place_rows_w{width}_i{index_bytes * 8}")


#: The empty error word: no row skipped (high 32 bits 0), no first row (INT32_MAX).
ERR_EMPTY = INT32_MAX


def decode_errors(word: int) -> tuple[int, int]:
    """``(rows skipped, smallest such b or INT32_MAX)`` from an error word (see
    ``place_rows.cu``: count in the high 32 bits, first row in the low 32)."""
    return int(word) >> 32, int(word) & 0xFFFFFFFF


def _take_kernel(dev: int):
    """``place_rows_take_errors`` for this device (called with ``dev`` current)."""
    return _function(dev, (dev, 0, 0), "place_rows_take_errors")


def _error_flag(dev: int) -> cupy.ndarray:
    """This device's error word (one uint64, updated atomically by every launch)."""
    flag = _flags.get(dev)
    if flag is None:
        with _lock:
            flag = _flags.get(dev)
            if flag is None:
                flag = cupy.array([ERR_EMPTY], dtype=cupy.uint64)
                # once per device: the flag must hold its initial value before a launch
                # on any other stream can touch it
                cupy.cuda.get_current_stream().synchronize()
                _flags[dev] = flag
    return flag


def _sm_count(dev: int) -> int:
    n = _sm_counts.get(dev)
    if n is None:
        props = cupy.cuda.runtime.getDeviceProperties(dev)
        n = props.get("multiProcessorCount") or cupy.cuda.Device(dev).attributes["MultiProcessorCount"]
        n = int(n)
        _sm_counts[dev] = n
    return n


def _is_cupy(x: object) -> bool:
    return isinstance(x, cupy.ndarray)


def device_views(arrays: tuple, stream):
    """The arrays with every CUDA tensor of another library (anything that has
    ``__cuda_array_interface__`` and is not a CuPy array: torch's, say) replaced by a
    CuPy view of its memory (no copy), and the stream to launch on: ``stream`` itself, a
    stream of that library as a ``cupy.cuda.ExternalStream`` of its handle (it has
    ``cuda_stream``), and with no ``stream`` and a torch tensor among the arrays, torch's
    current stream on that tensor's device, so the work is ordered with the caller's."""
    out, torch_dev = [], None
    for a in arrays:
        if a is None or isinstance(a, cupy.ndarray) or not hasattr(a, "__cuda_array_interface__"):
            out.append(a)
            continue
        if torch_dev is None and type(a).__module__.split(".")[0] == "torch":
            torch_dev = a.device
        out.append(cupy.asarray(a))
    if stream is None and torch_dev is not None:
        import torch

        stream = torch.cuda.current_stream(torch_dev)
    if stream is not None and not isinstance(stream, cupy.cuda.Stream) and hasattr(stream, "cuda_stream"):
        dev = getattr(getattr(stream, "device", None), "index", None)
        stream = cupy.cuda.ExternalStream(int(stream.cuda_stream), *([] if dev is None else [dev]))
    return tuple(out), stream


def _bounds(a: cupy.ndarray) -> tuple[int, int]:
    return byte_bounds(a.data.ptr, a.shape, a.strides, a.dtype.itemsize)


def _check_stream(stream, dev: int) -> None:
    if not (hasattr(stream, "ptr") and hasattr(stream, "__enter__")):
        raise TypeError(
            f"stream must be a cupy.cuda.Stream or ExternalStream, got {type(stream).__name__}"
        )
    sdev = getattr(stream, "device_id", -1)
    if sdev is not None and sdev >= 0 and sdev != dev:
        raise ValueError(f"stream belongs to device {sdev}, but the arrays are on device {dev}")


class _DeviceAndStream:
    """Makes ``dev`` current (only when it is not already) and ``stream`` current when given."""

    __slots__ = ("dev", "stream", "_device")

    def __init__(self, dev: int, stream) -> None:
        self.dev = dev
        self.stream = stream
        self._device = None

    def __enter__(self):
        if cupy.cuda.runtime.getDevice() != self.dev:
            self._device = cupy.cuda.Device(self.dev)
            self._device.__enter__()
        if self.stream is not None:
            self.stream.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            self.stream.__exit__(*exc)
        if self._device is not None:
            self._device.__exit__(*exc)


def place_rows(src, index, dst, stream=None):
    """``dst[b] = src[b, index[b]]`` on the device in one launch; returns ``dst``.

    A host ``index`` is validated here (IndexError for an entry >= K) and uploaded with an
    asynchronous copy on the stream; a device ``index`` is not read by the host: entries
    >= K are skipped by the kernel and reported by ``check_errors``. No synchronisation.
    """
    if not (_is_cupy(src) and _is_cupy(dst)):
        raise TypeError(
            "src and dst must both be numpy arrays or both CuPy arrays, got "
            f"{type(src).__module__}.{type(src).__name__} and "
            f"{type(dst).__module__}.{type(dst).__name__}"
        )
    B, K, row_bytes = check_place_arrays(src, dst)
    dev = src.device.id
    if dst.device.id != dev:
        raise ValueError(f"src is on device {dev} but dst is on device {dst.device.id}")
    on_device = _is_cupy(index)
    if on_device:
        if index.device.id != dev:
            raise ValueError(f"index is on device {index.device.id} but src is on device {dev}")
        if index.ndim != 1:
            raise ValueError(
                f"index must be 1-D (one entry per request), got a {index.ndim}-D array of "
                f"shape {tuple(index.shape)}"
            )
        if index.dtype not in _DEVICE_INDEX:
            raise TypeError(f"index has dtype {index.dtype}; it must be int32 or int64")
        if index.shape[0] != B:
            raise ValueError(
                f"index has {index.shape[0]} entries; it needs one per request (B={B})"
            )
        if not index.flags.c_contiguous:
            raise ValueError("index must be C-contiguous")
    else:
        # a private copy, checked, is what gets uploaded (not the caller's array re-read)
        index = as_host_index(host_index_array(index), B, K)
    # all three are C-contiguous here, so [ptr, ptr + nbytes) is exactly what they touch
    sp = src.data.ptr
    dp = dst.data.ptr
    d_range = (dp, dp + dst.nbytes)
    if ranges_overlap((sp, sp + src.nbytes), d_range):
        raise ValueError(overlap_message("src", "dst"))
    if on_device:
        ip = index.data.ptr
        if ranges_overlap((ip, ip + index.nbytes), d_range):
            raise ValueError(overlap_message("index", "dst"))
    if stream is not None:
        _check_stream(stream, dev)
    if B == 0 or (not on_device and (row_bytes == 0 or K == 0)):
        return dst  # nothing to copy, and a host index was checked in full above
    with _DeviceAndStream(dev, stream):
        if not on_device:
            index = cupy.asarray(index)  # pinned staging + async copy on the current stream
        if row_bytes == 0 or K == 0:
            # nothing to copy, but the kernel still reports device entries >= K
            width, nvec = 1, 0
        else:
            width = vector_width(row_bytes, sp, dp)
            nvec = row_bytes // width
        kernel = _kernel(dev, width, index.dtype.itemsize)
        gx, gy = grid(B, nvec, _sm_count(dev))
        kernel(
            (gx, gy, 1),
            (THREADS, 1, 1),
            (src, index, dst, _error_flag(dev), np.int64(B), np.int64(K), np.int64(nvec)),
        )
    return dst


def snapshot(src, out=None, stream=None):
    """A device copy of ``src`` (into ``out`` when given), on ``stream`` or the current one.

    No synchronisation: the copy is ordered after earlier work on the same stream.
    """
    if not _is_cupy(src):
        raise TypeError(f"src must be a CuPy array here, got {type(src).__name__}")
    dev = src.device.id
    if stream is not None:
        _check_stream(stream, dev)
    if out is not None:
        if not _is_cupy(out):
            raise TypeError(
                f"out must be a CuPy array on device {dev} like src, got {type(out).__name__}"
            )
        if out.device.id != dev:
            raise ValueError(f"src is on device {dev} but out is on device {out.device.id}")
        if tuple(out.shape) != tuple(src.shape):
            raise ValueError(f"out has shape {tuple(out.shape)}; it must match src's {tuple(src.shape)}")
        if out.dtype != src.dtype:
            raise TypeError(f"out has dtype {out.dtype}; it must match src's dtype {src.dtype}")
        if ranges_overlap(_bounds(src), _bounds(out)):
            raise ValueError("src and out overlap in memory; snapshot needs a separate out")
    with _DeviceAndStream(dev, stream):
        if out is None:
            if not src.flags.c_contiguous:
                return src.copy()  # a C-ordered copy on the current stream
            out = cupy.empty(src.shape, dtype=src.dtype)
        if src.nbytes == 0:
            return out
        if src.flags.c_contiguous and out.flags.c_contiguous:
            s = stream if stream is not None else cupy.cuda.get_current_stream()
            out.data.copy_from_device_async(src.data, src.nbytes, s)
        else:
            cupy.copyto(out, src)
    return out


def check_errors(device: int | None = None, stream=None) -> None:
    """Raise IndexError if a ``place_rows`` launch skipped rows for a device index >= K.

    The synchronisation point: waits for ``stream`` when given (every launch to check
    must have been on it), otherwise for the whole device (``device``, or every device
    ``place_rows`` has run on), then takes the device's error word in one atomic
    exchange on the device (reading and clearing it at once), so a report from a launch
    still running on another stream is never lost: it is raised by this call or the next.
    """
    devices = [int(device)] if device is not None else sorted(_flags)
    for dev in devices:
        flag = _flags.get(dev)
        if flag is None:
            continue
        with _DeviceAndStream(dev, stream):
            if stream is not None:
                stream.synchronize()
            else:
                cupy.cuda.Device(dev).synchronize()
            taken = cupy.empty(1, dtype=cupy.uint64)
            _take_kernel(dev)((1, 1, 1), (1, 1, 1), (flag, taken))
            skipped, first = decode_errors(int(taken.get()[0]))  # waits for the exchange
            if skipped:
                raise IndexError(
                    f"place_rows skipped {skipped} row(s) on device {dev} whose device-side "
                    f"index was >= K (first at b={first}); their dst rows were left untouched"
                )


def check_path_cache(cache, batched: bool) -> tuple[int, int, int]:
    """``(B, L, row_bytes)`` of a CuPy cache whose rows a tree's accepted path moves, or
    raise: ``[L, ...]`` (B reported as 1) or, ``batched``, ``[B, L, ...]``, C-contiguous."""
    if not _is_cupy(cache):
        raise TypeError(
            "cache must be a numpy or CuPy array, got "
            f"{type(cache).__module__}.{type(cache).__name__}"
        )
    need = 2 if batched else 1
    shape = tuple(cache.shape)
    if cache.ndim < need:
        want = "[B, L, ...]" if batched else "[L, ...]"
        raise ValueError(f"cache must be {want}, got shape {shape}")
    if not cache.flags.c_contiguous:
        raise ValueError("cache must be C-contiguous")
    rest = shape[need:]
    B, L = (int(shape[0]), int(shape[1])) if batched else (1, int(shape[0]))
    return B, L, int(np.prod(rest, dtype=np.int64)) * cache.dtype.itemsize


def place_path(cache, meta: np.ndarray, B: int, L: int, row_bytes: int, stream=None):
    """The accepted paths' rows moved in place on the device, in one launch; returns ``cache``.

    ``meta`` is the checked host array ``[base (B) | offsets (B + 1) | path]`` (see
    ``place_rows.cu``), or None when no row moves; it is uploaded with an asynchronous
    copy on the stream. No synchronisation.
    """
    dev = cache.device.id
    if stream is not None:
        _check_stream(stream, dev)
    if meta is None or B == 0 or row_bytes == 0:
        return cache
    with _DeviceAndStream(dev, stream):
        m = cupy.asarray(meta)  # pinned staging + async copy on the current stream
        ptr = cache.data.ptr
        width = vector_width(row_bytes, ptr, ptr)
        nvec = row_bytes // width
        kernel = _function(dev, (dev, width, -1), f"place_path_w{width}")
        gx, gy = grid(B, nvec, _sm_count(dev))
        kernel(
            (gx, gy, 1),
            (THREADS, 1, 1),
            (cache, m, np.int64(B), np.int64(L), np.int64(nvec)),
        )
    return cache
