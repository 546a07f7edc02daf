"""Row-cache placement (``specfsm.gpu``): the host kernels (compiled and twin, through
``impl``) always; the CUDA source's indexing emulated on the host when a C++ compiler is
present; the CuPy path only where CuPy sees a device. Every result is compared with
``src[arange(B), index]`` (rows with a negative index keep their old contents)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specfsm.gpu
from specfsm import _impl
from specfsm.placement import _geometry

try:  # a real bfloat16 when ml_dtypes is installed; uint16 stands in for its size otherwise
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BF16 = np.dtype(np.uint16)

DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.int8)]
DTYPE_IDS = ["float16", f"bf16-sized-{BF16.name}", "float32", "int8"]
# CuPy has no bfloat16 dtype: on the device uint16 always stands in for its size
GPU_DTYPES = [np.dtype(np.float16), np.dtype(np.uint16), np.dtype(np.float32), np.dtype(np.int8)]
GPU_DTYPE_IDS = ["float16", "bf16-sized-uint16", "float32", "int8"]
# trailing shapes: 16-byte multiples for every dtype, and row sizes that are not
TRAILING = [(64,), (7,), (3, 5), (1,), ()]


def reference(src, index, dst_before):
    """``src[arange(B), index]`` where index >= 0, the old row elsewhere."""
    out = np.array(dst_before, copy=True)
    index = np.asarray(index)
    keep = index >= 0
    out[keep] = src[np.arange(src.shape[0])[keep], index[keep]]
    return out


def random_case(rng, B, K, trailing, dtype, index_dtype=np.int64, negative=True):
    shape = (B, K) + tuple(trailing)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    src = raw.view(dtype).reshape(shape)
    before = rng.integers(0, 256, size=B * int(np.prod(trailing, dtype=np.int64)) * dtype.itemsize,
                          dtype=np.uint8).view(dtype).reshape((B,) + tuple(trailing))
    low = -1 if negative else 0
    index = rng.integers(low, K, size=B).astype(index_dtype) if K else np.full(B, -1, index_dtype)
    return src, index, before


def assert_bytes_equal(a, b):
    """Equal as raw bytes (NaN payloads in float16/bfloat16 rows compare too)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


# --------------------------------------------------------------------------- host path


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("trailing", TRAILING, ids=str)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_place_rows_matches_fancy_indexing(impl, dtype, trailing, index_dtype):
    k = impl.module("place")
    rng = np.random.default_rng([dtype.itemsize, len(trailing), np.dtype(index_dtype).itemsize])
    for B, K in [(1, 1), (1, 5), (3, 5), (64, 8)]:
        src, index, before = random_case(rng, B, K, trailing, dtype, index_dtype)
        dst = before.copy()
        assert k.place_rows(src, index, dst) is dst
        assert_bytes_equal(dst, reference(src, index, before))


@pytest.mark.parametrize("B", [1, 4096])
def test_place_rows_batch_sizes(impl, B):
    k = impl.module("place")
    rng = np.random.default_rng(B)
    src, index, before = random_case(rng, B, 5, (9,), np.dtype(np.float16))
    dst = before.copy()
    k.place_rows(src, index, dst)
    assert_bytes_equal(dst, reference(src, index, before))


def test_place_rows_unaligned_rows_and_pointers(impl):
    k = impl.module("place")
    rng = np.random.default_rng(7)
    B, K, R = 5, 3, 37  # 37-byte rows, base pointers offset by one byte
    sbuf = np.zeros(1 + B * K * R, np.uint8)
    dbuf = np.zeros(1 + B * R, np.uint8)
    src = sbuf[1:].reshape(B, K, R)
    dst = dbuf[1:].reshape(B, R)
    src[...] = rng.integers(0, 256, src.shape)
    index = np.array([2, -1, 0, 1, 2])
    before = dst.copy()
    k.place_rows(src, index, dst)
    assert_bytes_equal(dst, reference(src, index, before))
    assert dbuf[0] == 0  # nothing written before dst


def test_negative_index_leaves_rows_untouched(impl):
    k = impl.module("place")
    src = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2)
    dst = np.full((4, 2), -7.0, np.float32)
    k.place_rows(src, [-1, 2, -5, 0], dst)
    assert dst.tolist() == [[-7.0, -7.0], [10.0, 11.0], [-7.0, -7.0], [18.0, 19.0]]
    k.place_rows(src, np.full(4, -1), dst)  # a step where no request speculates
    assert dst.tolist() == [[-7.0, -7.0], [10.0, 11.0], [-7.0, -7.0], [18.0, 19.0]]


def test_index_at_or_beyond_k_is_refused_before_any_copy(impl):
    k = impl.module("place")
    src = np.ones((3, 4, 2), np.int8)
    dst = np.zeros((3, 2), np.int8)
    with pytest.raises(IndexError, match=r"index\[1\]=4 is out of range for K=4"):
        k.place_rows(src, [0, 4, 0], dst)
    with pytest.raises(IndexError, match=r"index\[2\]=1000 is out of range"):
        k.place_rows(src, np.array([1, 2, 1000], np.int32), dst)
    with pytest.raises(IndexError, match=r"index\[0\]=18446744073709551615"):
        k.place_rows(src, np.array([2**64 - 1, 0, 0], np.uint64), dst)
    assert not dst.any()  # request 0 was valid, but nothing was copied


def test_k_zero_takes_only_negative_indices(impl):
    k = impl.module("place")
    src = np.zeros((2, 0, 3), np.float32)
    dst = np.ones((2, 3), np.float32)
    k.place_rows(src, [-1, -1], dst)
    assert (dst == 1).all()
    with pytest.raises(IndexError, match="K=0"):
        k.place_rows(src, [-1, 0], dst)


def test_empty_batch(impl):
    k = impl.module("place")
    dst = np.zeros((0, 4), np.float32)
    assert k.place_rows(np.zeros((0, 3, 4), np.float32), np.zeros(0, np.int64), dst) is dst
    assert k.place_rows(np.zeros((0, 3, 4), np.float32), [], dst) is dst


@pytest.mark.parametrize(
    "src_shape, dst_shape, message",
    [
        ((6,), (6,), r"src must be \[B, K, \.\.\.\] \(at least 2-D\), got a 1-D array"),
        ((2, 3, 4), (2, 5), r"dst must have shape \(2, 4\) \(src's shape \(2, 3, 4\) without the K axis\), got \(2, 5\)"),
        ((2, 3, 4), (3, 4), r"dst must have shape \(2, 4\)"),
        ((2, 3, 4), (2, 3, 4), r"dst must have shape \(2, 4\)"),
        ((2, 3), (2, 1), r"dst must have shape \(2,\)"),
    ],
)
def test_bad_shapes_are_refused(impl, src_shape, dst_shape, message):
    k = impl.module("place")
    with pytest.raises(ValueError, match=message):
        k.place_rows(np.zeros(src_shape, np.float32), np.zeros(src_shape[0], np.int64), np.zeros(dst_shape, np.float32))


def test_bad_arguments_are_refused(impl):
    k = impl.module("place")
    src = np.zeros((2, 3, 4), np.float32)
    dst = np.zeros((2, 4), np.float32)
    idx = np.zeros(2, np.int64)
    with pytest.raises(TypeError, match="dst has dtype float16; it must match src's dtype float32"):
        k.place_rows(src, idx, dst.astype(np.float16))
    with pytest.raises(TypeError, match="holds Python objects"):
        k.place_rows(src.astype(object), idx, dst.astype(object))
    with pytest.raises(ValueError, match="src must be C-contiguous"):
        k.place_rows(np.zeros((2, 3, 8), np.float32)[:, :, ::2], idx, dst)
    with pytest.raises(ValueError, match="dst must be C-contiguous"):
        k.place_rows(src, idx, np.zeros((2, 8), np.float32)[:, ::2])
    ro = dst.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dst is read-only"):
        k.place_rows(src, idx, ro)
    with pytest.raises(ValueError, match=r"index must be 1-D \(one entry per request\), got a 2-D"):
        k.place_rows(src, np.zeros((2, 1), np.int64), dst)
    with pytest.raises(ValueError, match=r"index has 3 entries; it needs one per request \(B=2\)"):
        k.place_rows(src, [0, 0, 0], dst)
    with pytest.raises(TypeError, match="index has dtype float64; it must be int32 or int64"):
        k.place_rows(src, [0.0, 1.0], dst)
    with pytest.raises(TypeError, match="index has dtype bool"):
        k.place_rows(src, [True, False], dst)
    with pytest.raises(TypeError, match="src and dst must be numpy arrays here, got list"):
        k.place_rows(src.tolist(), idx, dst)


def test_overlapping_arrays_are_refused(impl):
    k = impl.module("place")
    B, K, R = 3, 2, 4
    buf = np.arange(B * K * R + B * R, dtype=np.float32)
    src = buf[: B * K * R].reshape(B, K, R)
    dst = buf[R : R + B * R].reshape(B, R)  # inside src
    before = buf.copy()
    with pytest.raises(ValueError, match="src and dst overlap in memory"):
        k.place_rows(src, [0, 1, 0], dst)
    one = np.zeros((B, 1, R), np.float32)
    with pytest.raises(ValueError, match="src and dst overlap"):
        k.place_rows(one, [0, 0, 0], one[:, 0])  # K == 1: dst is src's only row
    ints = np.zeros((B, 2), np.int64)
    out = np.zeros(B, np.int64)
    with pytest.raises(ValueError, match="index and dst overlap in memory"):
        k.place_rows(ints, out, out)
    assert np.array_equal(buf, before)
    # adjacent, non-overlapping buffers are fine
    dst_ok = buf[B * K * R :].reshape(B, R)
    k.place_rows(src, [0, 1, 0], dst_ok)
    assert np.array_equal(dst_ok, src[np.arange(B), [0, 1, 0]])


def test_read_only_src_is_accepted(impl):
    k = impl.module("place")
    src = np.arange(2 * 2 * 3, dtype=np.int8).reshape(2, 2, 3)
    src.flags.writeable = False
    dst = np.zeros((2, 3), np.int8)
    k.place_rows(src, [1, 0], dst)
    assert dst.tolist() == [[3, 4, 5], [6, 7, 8]]


@settings(max_examples=150, deadline=None)
@given(
    B=st.integers(0, 12),
    K=st.integers(0, 6),
    trailing=st.lists(st.integers(0, 5), max_size=2).map(tuple),
    dtype=st.sampled_from(DTYPES),
    index_dtype=st.sampled_from([np.int32, np.int64]),
    seed=st.integers(0, 2**32 - 1),
    bad=st.booleans(),
)
def test_compiled_twin_and_reference_agree(B, K, trailing, dtype, index_dtype, seed, bad):
    rng = np.random.default_rng(seed)
    src, index, before = random_case(rng, B, K, trailing, dtype, index_dtype)
    if bad and B:
        index[rng.integers(0, B)] = K + int(rng.integers(0, 3))
    results = []
    for kind in ("compiled", "python"):
        if kind == "compiled" and _impl.NO_EXTENSIONS:
            continue
        dst = before.copy()
        try:
            _impl.kernels(kind, "place").place_rows(src, index, dst)
            results.append(("ok", dst.tobytes()))
        except IndexError as exc:
            assert_bytes_equal(dst, before)
            results.append(("IndexError", str(exc)))
    assert all(r == results[0] for r in results)
    if not (index >= K).any():
        assert results[0] == ("ok", reference(src, index, before).tobytes())
    else:
        assert results[0][0] == "IndexError"


# --------------------------------------------------------------------------- settle_index


def test_settle_index_follows_the_seed_rule(impl):
    k = impl.module("place")
    out = k.settle_index([0, 2, 3, 0, 4, 1], [3, 3, 3, 0, 5, 1])
    assert out.dtype == np.int64
    # rejected at row n -> n; all accepted -> n - 1; not speculating -> -1
    assert out.tolist() == [0, 2, 2, -1, 4, 0]
    assert k.settle_index(np.array([], np.int64), []).tolist() == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=20))
def test_settle_index_matches_one_request_settle(impl, pairs):
    k = impl.module("place")
    pairs = [(min(a, d), d) for a, d in pairs]
    accepted = [a for a, _ in pairs]
    draft_lens = [d for _, d in pairs]
    expected = [
        -1 if d == 0 else impl.settle(d, a, d + 1, d, "accept") for a, d in pairs
    ]
    assert k.settle_index(accepted, draft_lens).tolist() == expected
    assert k.settle_index(np.array(accepted, np.int32), np.array(draft_lens, np.uint8)).tolist() == expected


def test_settle_index_refuses_bad_counts(impl):
    k = impl.module("place")
    with pytest.raises(ValueError, match=r"accepted\[1\]=4 is beyond the draft's 3 rows \(draft_lens\[1\]=3\)"):
        k.settle_index([1, 4, 9], [3, 3, 3])
    with pytest.raises(ValueError, match=r"accepted\[0\]=1 is beyond the draft's 0 rows"):
        k.settle_index([1], [0])
    with pytest.raises(ValueError, match=r"accepted\[2\]=-1 is negative"):
        k.settle_index([0, 0, -1], [1, 1, 1])
    with pytest.raises(ValueError, match=r"draft_lens\[0\]=-2 is negative"):
        k.settle_index([0], [-2])
    with pytest.raises(ValueError, match="accepted has 2 entries and draft_lens 3"):
        k.settle_index([0, 0], [1, 1, 1])
    with pytest.raises(ValueError, match="accepted must be 1-D"):
        k.settle_index([[0]], [1])
    with pytest.raises(TypeError, match="draft_lens has dtype float64; it must hold integers"):
        k.settle_index([0], [1.5])
    with pytest.raises(OverflowError, match=r"accepted\[0\]=18446744073709551615 does not fit in int64"):
        k.settle_index(np.array([2**64 - 1], np.uint64), [1])


# --------------------------------------------------------------------------- public API


def test_public_api_dispatches_numpy_to_the_active_host_kernel():
    assert specfsm.placement.place._host is _impl.load("place")  # what the numpy path calls
    src = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    dst = np.zeros((2, 2), np.float32)
    assert specfsm.gpu.place_rows(src, specfsm.gpu.settle_index([3, 1], [3, 2]), dst) is dst
    assert dst.tolist() == [[4.0, 5.0], [8.0, 9.0]]
    with pytest.raises(ValueError, match="stream applies to CuPy arrays only"):
        specfsm.gpu.place_rows(src, [0, 0], dst, stream=object())
    assert specfsm.gpu.check_errors() is None  # host paths never set the device flag


def test_snapshot_on_the_host():
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    snap = specfsm.gpu.snapshot(src)
    assert snap is not src and not np.shares_memory(snap, src)
    assert np.array_equal(snap, src)
    src[0, 0] = 99
    assert snap[0, 0] == 0
    out = np.zeros_like(src)
    assert specfsm.gpu.snapshot(src, out) is out and np.array_equal(out, src)
    assert np.array_equal(specfsm.gpu.snapshot(src[:, ::2]), src[:, ::2])
    with pytest.raises(ValueError, match=r"out has shape \(4, 3\); it must match src's \(3, 4\)"):
        specfsm.gpu.snapshot(src, np.zeros((4, 3), np.float32))
    with pytest.raises(TypeError, match="out has dtype float64"):
        specfsm.gpu.snapshot(src, np.zeros((3, 4)))
    with pytest.raises(ValueError, match="src and out overlap in memory"):
        specfsm.gpu.snapshot(src, src)
    with pytest.raises(TypeError, match="src must be a numpy or CuPy array, got list"):
        specfsm.gpu.snapshot([1, 2])
    # two views of one buffer that share bytes; interleaved ones that do not are fine
    buf = np.arange(8, dtype=np.float32)
    with pytest.raises(ValueError, match="overlap"):
        specfsm.gpu.snapshot(buf[:6], buf[2:])
    specfsm.gpu.snapshot(buf[0::2], buf[1::2])
    assert buf.tolist() == [0, 0, 2, 2, 4, 4, 6, 6]


def test_settle_index_refuses_device_arrays_by_name():
    class FakeDeviceArray:  # stands in for a CuPy array: only its module name matters
        __module__ = "cupy._core.core"

    with pytest.raises(TypeError, match=r"call \.get\(\) on CuPy counts first"):
        specfsm.gpu.settle_index(FakeDeviceArray(), [1])


def test_has_cupy_gpu_is_false_when_cupy_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    specfsm.gpu.has_cupy_gpu.cache_clear()
    try:
        assert specfsm.gpu.has_cupy_gpu() is False
    finally:
        specfsm.gpu.has_cupy_gpu.cache_clear()


def test_package_imports_and_runs_without_cupy():
    code = (
        "import sys; sys.modules['cupy'] = None\n"
        "import numpy as np, specfsm, specfsm.gpu as g\n"
        "assert g.has_cupy_gpu() is False\n"
        "d = np.zeros((1, 2), np.int8)\n"
        "g.place_rows(np.ones((1, 2, 2), np.int8), [1], d)\n"
        "assert d.tolist() == [[1, 1]]\n"
        "v = specfsm.Decode(1, np.ones(3)).enter_verify([5])\n"
        "assert 'specfsm.placement._cupy' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_kernel_source_ships_with_the_package():
    text = resources.files("specfsm.placement").joinpath("place_rows.cu").read_text("utf-8")
    for w in (16, 8, 4, 2, 1):
        for i in (32, 64):
            assert f"place_rows_w{w}_i{i}" in text
        assert f"place_path_w{w}" in text
    assert f"#define PLACE_UNROLL {_geometry.UNROLL}" in text
    assert f"__launch_bounds__({_geometry.THREADS})" in text


def test_launch_geometry():
    assert _geometry.vector_width(64, 256, 512) == 16
    assert _geometry.vector_width(64, 256 + 8, 512) == 8
    assert _geometry.vector_width(14, 0, 0) == 2
    assert _geometry.vector_width(37, 0, 0) == 1
    # big rows: 16 KiB of 16-byte vectors per block; small batches split rows finer
    assert _geometry.grid(64, 262144, 132) == (256, 64)
    assert _geometry.grid(8, 4096, 132) == (4096 // _geometry.THREADS, 8)  # 1 vector/thread
    assert _geometry.grid(8, 65536, 132) == (66, 8)  # >= 4 blocks per SM
    assert _geometry.grid(100000, 1, 132) == (1, 65535)
    assert _geometry.grid(1, 0, 132) == (1, 1)


# ----------------------------------------- the CUDA source's indexing, emulated on the host

_EMULATOR = r"""
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(x)
struct dim3 { unsigned x, y, z; };
// per host thread, so that concurrent emulated launches (see the error-word test) do not
// share their block and thread coordinates
static thread_local dim3 blockIdx, blockDim, gridDim, threadIdx;
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
// CUDA's 64-bit atomics, as real host atomics (GCC/Clang builtins)
static unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp,
                                    unsigned long long val) {
    __atomic_compare_exchange_n(p, &cmp, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;  // the value seen: cmp itself on success, the current value on failure
}
static unsigned long long atomicExch(unsigned long long* p, unsigned long long val) {
    return __atomic_exchange_n(p, val, __ATOMIC_SEQ_CST);
}
#include "place_rows.cu"
extern "C" void run_take_errors(unsigned long long* e, unsigned long long* out) {
    gridDim = {1, 1, 1}; blockDim = {1, 1, 1}; blockIdx = {0, 0, 0}; threadIdx = {0, 0, 0};
    place_rows_take_errors(e, out);
}
template <typename V, typename I>
static void emulate(void (*k)(const V*, const I*, V*, unsigned long long*, long long, long long, long long),
                    const void* s, const void* i, void* d, unsigned long long* e, long long B, long long K,
                    long long n, unsigned gx, unsigned gy, unsigned t) {
    gridDim = {gx, gy, 1}; blockDim = {t, 1, 1};
    for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x)
            for (unsigned th = 0; th < t; ++th) {
                blockIdx = {x, y, 0}; threadIdx = {th, 0, 0};
                k((const V*)s, (const I*)i, (V*)d, e, B, K, n);
            }
}
#define RUN(NAME, V, I) extern "C" void run_##NAME(const void* s, const void* i, void* d, \
    unsigned long long* e, long long B, long long K, long long n, unsigned gx, unsigned gy, unsigned t) \
    { emulate<V, I>(NAME, s, i, d, e, B, K, n, gx, gy, t); }
RUN(place_rows_w16_i32, uint4, int) RUN(place_rows_w16_i64, uint4, long long)
RUN(place_rows_w8_i32, uint2, int) RUN(place_rows_w8_i64, uint2, long long)
RUN(place_rows_w4_i32, unsigned int, int) RUN(place_rows_w4_i64, unsigned int, long long)
RUN(place_rows_w2_i32, unsigned short, int) RUN(place_rows_w2_i64, unsigned short, long long)
RUN(place_rows_w1_i32, unsigned char, int) RUN(place_rows_w1_i64, unsigned char, long long)
// place_path: every block and thread in turn, forwards or (reverse) backwards, since the
// result must not depend on the order threads run in
template <typename V>
static void emulate_path(void (*k)(V*, const long long*, long long, long long, long long),
                         void* c, const long long* m, long long B, long long L, long long n,
                         unsigned gx, unsigned gy, unsigned t, int reverse) {
    gridDim = {gx, gy, 1}; blockDim = {t, 1, 1};
    for (unsigned yy = 0; yy < gy; ++yy)
        for (unsigned xx = 0; xx < gx; ++xx)
            for (unsigned tt = 0; tt < t; ++tt) {
                unsigned y = reverse ? gy - 1 - yy : yy, x = reverse ? gx - 1 - xx : xx;
                blockIdx = {x, y, 0}; threadIdx = {reverse ? t - 1 - tt : tt, 0, 0};
                k((V*)c, m, B, L, n);
            }
}
#define RUN_PATH(NAME, V) extern "C" void run_##NAME(void* c, const long long* m, long long B, \
    long long L, long long n, unsigned gx, unsigned gy, unsigned t, int r) \
    { emulate_path<V>(NAME, c, m, B, L, n, gx, gy, t, r); }
RUN_PATH(place_path_w16, uint4) RUN_PATH(place_path_w8, uint2) RUN_PATH(place_path_w4, unsigned int)
RUN_PATH(place_path_w2, unsigned short) RUN_PATH(place_path_w1, unsigned char)
"""


@pytest.fixture(scope="module")
def emulated_kernel(tmp_path_factory):
    """place_rows.cu compiled as C++ with every block and thread run in turn (the kernel
    has no shared memory or barriers, so that is a faithful model of its indexing)."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to emulate the CUDA kernel on the host")
    d = tmp_path_factory.mktemp("emulated_kernel")
    (d / "place_rows.cu").write_text(
        resources.files("specfsm.placement").joinpath("place_rows.cu").read_text("utf-8")
    )
    (d / "emulate.cpp").write_text(_EMULATOR)
    lib = d / "libemulate.so"
    subprocess.run(
        [cxx, "-O1", "-std=c++14", "-shared", "-fPIC", "-Wno-unknown-pragmas", "-o", str(lib),
         str(d / "emulate.cpp")],
        check=True, capture_output=True, timeout=120,
    )
    return ctypes.CDLL(str(lib))


ERR_EMPTY = 2**31 - 1  # the empty error word: count 0 (high 32 bits), no first row


def decode(word):
    """(rows skipped, first such b) from an error word, as ``_cupy.decode_errors`` reads it."""
    word = int(word)
    return [word >> 32, word & 0xFFFFFFFF]


def take_errors(lib, err):
    """``place_rows_take_errors``, emulated: the word's reports, and the word emptied."""
    out = np.zeros(1, np.uint64)
    lib.run_take_errors(ctypes.c_void_p(err.ctypes.data), ctypes.c_void_p(out.ctypes.data))
    return decode(out[0])


def emulate_launch(lib, src, index, dst, sm_count=4, err=None):
    """The launch ``specfsm.placement._cupy.place_rows`` makes, run by the emulator (into the
    error word ``err`` when given, a fresh one otherwise)."""
    B, K = src.shape[:2]
    row = src.dtype.itemsize * int(np.prod(src.shape[2:], dtype=np.int64))
    if row and K:
        width = _geometry.vector_width(row, src.ctypes.data, dst.ctypes.data)
        nvec = row // width
    else:
        width, nvec = 1, 0
    gx, gy = _geometry.grid(B, nvec, sm_count)
    if err is None:
        err = np.array([ERR_EMPTY], np.uint64)
    fn = getattr(lib, f"run_place_rows_w{width}_i{index.dtype.itemsize * 8}")
    c = ctypes.c_void_p
    fn(c(src.ctypes.data), c(index.ctypes.data), c(dst.ctypes.data), c(err.ctypes.data),
       ctypes.c_longlong(B), ctypes.c_longlong(K), ctypes.c_longlong(nvec),
       ctypes.c_uint(gx), ctypes.c_uint(gy), ctypes.c_uint(_geometry.THREADS))
    return width, err


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("trailing", [(2048,), (7,), (3, 5), ()], ids=str)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_cuda_kernel_indexing_emulated(emulated_kernel, dtype, trailing, index_dtype):
    rng = np.random.default_rng(3)
    for B, K in [(1, 1), (3, 5), (33, 4)]:
        src, index, before = random_case(rng, B, K, trailing, dtype, index_dtype)
        if B > 1:
            index[1] = K  # out of range on the device: skipped and reported
            index[-1] = K + 5
        dst = before.copy()
        width, err = emulate_launch(emulated_kernel, src, index, dst)
        ok = index < K
        expected = reference(src, np.where(ok, index, -1), before)
        assert_bytes_equal(dst, expected)
        bad = np.nonzero(~ok)[0]
        assert decode(err[0]) == [len(bad), int(bad[0]) if len(bad) else 2**31 - 1]
        row = dtype.itemsize * int(np.prod(trailing, dtype=np.int64))
        if row % 16 == 0 and row:
            assert width == 16


def test_cuda_kernel_unaligned_pointers_and_large_batches_emulated(emulated_kernel):
    rng = np.random.default_rng(5)
    B, K, R = 4, 3, 64  # 16-byte rows, but base pointers one byte off: byte path
    sbuf = np.zeros(1 + B * K * R, np.uint8)
    dbuf = np.zeros(1 + B * R, np.uint8)
    src, dst = sbuf[1:].reshape(B, K, R), dbuf[1:].reshape(B, R)
    src[...] = rng.integers(0, 256, src.shape)
    index = np.array([2, 0, -1, 1], np.int64)
    width, err = emulate_launch(emulated_kernel, src, index, dst)
    assert width == 1 and decode(err[0]) == [0, ERR_EMPTY]
    assert_bytes_equal(dst, reference(src, index, np.zeros((B, R), np.uint8)))
    # B past the grid's y limit: the kernel strides over requests
    B = 70000
    src = rng.integers(0, 100, (B, 2, 1)).astype(np.int8)
    dst = np.zeros((B, 1), np.int8)
    index = rng.integers(-1, 2, B).astype(np.int32)
    width, err = emulate_launch(emulated_kernel, src, index, dst)
    assert_bytes_equal(dst, reference(src, index, np.zeros((B, 1), np.int8)))


def test_error_word_accumulates_and_is_taken_atomically_emulated(emulated_kernel):
    """Launches sharing one device's error word add their counts and keep the smallest
    row; taking the word returns exactly the reports so far and leaves it empty."""
    lib = emulated_kernel
    src = np.zeros((6, 2, 4), np.float32)
    dst = np.zeros((6, 4), np.float32)
    err = np.array([ERR_EMPTY], np.uint64)
    emulate_launch(lib, src, np.array([0, 5, 1, 1, 9, 0], np.int64), dst, err=err)  # b = 1, 4
    emulate_launch(lib, src, np.array([7, 0, 0, 0, 0, -1], np.int32), dst, err=err)  # b = 0
    assert decode(err[0]) == [3, 0]
    assert take_errors(lib, err) == [3, 0]
    assert int(err[0]) == ERR_EMPTY and take_errors(lib, err) == [0, ERR_EMPTY]
    emulate_launch(lib, src, np.array([0, 0, 0, 0, 0, 3], np.int64), dst, err=err)
    assert take_errors(lib, err) == [1, 5]


def test_error_word_loses_no_report_while_taken_concurrently_emulated(emulated_kernel):
    """Launches reporting from one host thread while another takes the word over and
    over (ctypes calls run without the GIL, on both cores): every report is counted
    exactly once. Reading the word and then writing it back empty, as the old flag
    did, loses the reports that land in between."""
    import threading

    lib = emulated_kernel
    B, launches = 64, 300
    src = np.zeros((B, 2, 1), np.int8)
    dst = np.zeros((B, 1), np.int8)
    index = np.where(np.arange(B) % 2 == 0, 5, 0).astype(np.int64)  # 32 bad rows a launch
    err = np.array([ERR_EMPTY], np.uint64)
    taken = []
    done = threading.Event()

    def launcher():
        for _ in range(launches):
            emulate_launch(lib, src, index, dst, err=err)
        done.set()

    def taker():
        while not done.is_set():
            taken.append(take_errors(lib, err))
        taken.append(take_errors(lib, err))

    threads = [threading.Thread(target=launcher), threading.Thread(target=taker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c for c, _ in taken) == launches * (B // 2)
    # a take may split a launch: its first row is then any bad row, never a good one
    assert all(first % 2 == 0 and first < B for c, first in taken if c)
    assert all(first == ERR_EMPTY for c, first in taken if not c)
    assert int(err[0]) == ERR_EMPTY


# ------------------------------------- a tree's accepted paths (place_path), emulated

def path_case(rng, B, L, trailing, dtype, identity=False):
    """A [B, L, ...] cache of random bytes, each request's root row and an accepted path
    (increasing node indices that fit the cache; sometimes empty, or ``identity``)."""
    shape = (B, L) + tuple(trailing)
    cache = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize,
                         dtype=np.uint8).view(dtype).reshape(shape)
    bases, paths = [], []
    for _ in range(B):
        base = int(rng.integers(0, L))
        room = L - 1 - base  # nodes that fit after the root
        n = int(rng.integers(0, room + 1)) if room else 0
        path = list(range(n)) if identity else sorted(rng.choice(room, size=n, replace=False).tolist()) if n else []
        bases.append(base)
        paths.append(path)
    flat = np.array([v for p in paths for v in p], dtype=np.int64)
    off = np.cumsum([0] + [len(p) for p in paths]).astype(np.int64)
    return cache, bases, paths, flat, off


def path_reference(cache, bases, paths):
    """The numpy gather: row ``base + 1 + j`` of request b takes the old row
    ``base + 1 + path[j]``; every other row keeps its bytes."""
    out = cache.copy()
    for b, (v, p) in enumerate(zip(bases, paths)):
        if p:
            out[b, v + 1:v + 1 + len(p)] = cache[b, v + 1 + np.array(p, dtype=np.int64)]
    return out


def emulate_path_launch(lib, cache, bases, flat, off, sm_count=4, reverse=False):
    """The launch ``specfsm.tree.place_path_batch`` makes for a CuPy cache (its checked
    ``meta``, ``_cupy.place_path``'s width and grid), run by the emulator in place."""
    from specfsm.tree import tree as tree_face

    B, L = cache.shape[:2]
    row = cache.dtype.itemsize * int(np.prod(cache.shape[2:], dtype=np.int64))
    meta = tree_face._checked_meta(B, L, bases, flat, off)
    if meta is None or B == 0 or row == 0:
        return None
    width = _geometry.vector_width(row, cache.ctypes.data, cache.ctypes.data)
    nvec = row // width
    gx, gy = _geometry.grid(B, nvec, sm_count)
    c = ctypes.c_void_p
    getattr(lib, f"run_place_path_w{width}")(
        c(cache.ctypes.data), c(meta.ctypes.data), ctypes.c_longlong(B), ctypes.c_longlong(L),
        ctypes.c_longlong(nvec), ctypes.c_uint(gx), ctypes.c_uint(gy),
        ctypes.c_uint(_geometry.THREADS), ctypes.c_int(int(reverse)))
    return width


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("trailing", [(2048,), (7,), (3, 5), (1,)], ids=str)
@pytest.mark.parametrize("reverse", [False, True], ids=["forwards", "backwards"])
def test_cuda_path_kernel_is_the_numpy_gather_emulated(emulated_kernel, dtype, trailing, reverse):
    rng = np.random.default_rng([dtype.itemsize, len(trailing), int(reverse)])
    for B, L in [(1, 2), (1, 9), (5, 12), (33, 6)]:
        cache, bases, paths, flat, off = path_case(rng, B, L, trailing, dtype)
        expected = path_reference(cache, bases, paths)
        width = emulate_path_launch(emulated_kernel, cache, bases, flat, off, reverse=reverse)
        assert_bytes_equal(cache, expected)
        row = dtype.itemsize * int(np.prod(trailing))
        if width is not None and row % 16 == 0:
            assert width == 16


def test_cuda_path_kernel_wide_rows_unaligned_and_large_batches_emulated(emulated_kernel):
    rng = np.random.default_rng(21)
    # rows of 40,000 bytes: several blocks per row (x), every thread strided over chunks
    cache, bases, paths, flat, off = path_case(rng, 3, 10, (10000,), np.dtype(np.float32))
    expected = path_reference(cache, bases, paths)
    emulate_path_launch(emulated_kernel, cache, bases, flat, off, sm_count=1)
    assert_bytes_equal(cache, expected)
    # 16-byte rows one byte off alignment: the byte path
    buf = np.zeros(1 + 2 * 7 * 16, np.uint8)
    cache = buf[1:].reshape(2, 7, 16)
    cache[...] = rng.integers(0, 256, cache.shape)
    expected = path_reference(cache, [0, 2], [[1, 3, 5], [2, 3]])
    width = emulate_path_launch(emulated_kernel, cache, [0, 2], [1, 3, 5, 2, 3], [0, 3, 5])
    assert width == 1
    assert_bytes_equal(cache, expected)
    # B past the grid's y limit: the kernel strides over requests
    cache, bases, paths, flat, off = path_case(rng, 70000, 4, (1,), np.dtype(np.int8))
    expected = path_reference(cache, bases, paths)
    emulate_path_launch(emulated_kernel, cache, bases, flat, off)
    assert_bytes_equal(cache, expected)


def test_device_path_meta_is_checked_like_the_host(impl):
    """What a CuPy cache's launch gets: the host's refusals (same type and message, the
    active implementation's own checks), the packed [base | offsets | path], and None
    when every accepted row is already in place (no launch)."""
    from specfsm.tree import tree as tree_face

    meta = tree_face._checked_meta(2, 8, [0, 3], [1, 2, 0], [0, 2, 3])
    assert meta.dtype == np.int64 and meta.tolist() == [0, 3, 0, 2, 3, 1, 2, 0]
    assert tree_face._checked_meta(2, 8, [0, 3], [0, 1, 0], [0, 2, 3]) is None
    assert tree_face._checked_meta(2, 8, [0, 3], [], [0, 0, 0]) is None
    assert tree_face._checked_meta(1, 8, 2, [1, 4], None).tolist() == [2, 0, 2, 1, 4]
    k = impl.module("tree")
    bad = [
        (2, 8, [0, 3], [2, 1, 0], [0, 2, 3]),   # not increasing
        (2, 8, [0, 3], [1, 9, 0], [0, 2, 3]),   # beyond the cache
        (2, 8, [0, 8], [1, 2, 0], [0, 2, 3]),   # base beyond the cache
        (2, 8, [0, 3], [1, 2, 0], [0, 3, 2]),   # offsets that do not tile
        (2, 8, [0], [1, 2, 0], [0, 2, 3]),      # a base per request
        (2, 8, [0, 3], [1.5, 2, 0], [0, 2, 3]),  # not integers
    ]
    for B, L, base, path, off in bad:
        with pytest.raises(Exception) as host:
            k.place_path_batch(np.zeros((B, L, 2), np.float32), base, path, off)
        with pytest.raises(type(host.value)) as dev:
            tree_face._checked_meta(B, L, base, path, off)
        assert str(dev.value) == str(host.value)
    with pytest.raises(IndexError) as host:
        k.place_path(np.zeros((8, 2), np.float32), 7, [0])
    with pytest.raises(IndexError) as dev:
        tree_face._checked_meta(1, 8, 7, [0], None)
    assert str(dev.value) == str(host.value)


def test_place_path_stream_is_for_cupy_caches_only():
    cache = np.zeros((1, 4, 2), np.float32)
    with pytest.raises(ValueError, match="stream applies to CuPy arrays only"):
        specfsm.place_path_batch(cache, [0], [1], [0, 1], stream=object())
    with pytest.raises(ValueError, match="stream applies to CuPy arrays only"):
        specfsm.place_path(cache[0], 0, [1], stream=object())


# --------------------------------------------------------------------------- CuPy path

@pytest.fixture
def cp():
    if not specfsm.gpu.has_cupy_gpu():
        pytest.skip("CuPy is not installed or sees no CUDA device")
    import cupy

    return cupy

@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=GPU_DTYPE_IDS)
@pytest.mark.parametrize("trailing", [(64,), (7,), (3, 5), (1,)], ids=str)
@pytest.mark.gpu
def test_gpu_place_path_is_the_numpy_gather(cp, dtype, trailing):
    rng = np.random.default_rng([dtype.itemsize, len(trailing), 7])
    for B, L in [(1, 2), (1, 17), (7, 12), (1024, 9)]:
        cache, bases, paths, flat, off = path_case(rng, B, L, trailing, dtype)
        d = cp.asarray(cache)
        assert specfsm.place_path_batch(d, bases, flat, off) is d
        assert_bytes_equal(cp.asnumpy(d), path_reference(cache, bases, paths))
        one = cp.asarray(cache[0])
        assert specfsm.place_path(one, bases[0], paths[0]) is one
        assert_bytes_equal(cp.asnumpy(one), path_reference(cache[:1], bases[:1], paths[:1])[0])


@pytest.mark.gpu
def test_gpu_place_path_stream_unaligned_and_refusals(cp):
    rng = np.random.default_rng(23)
    cache, bases, paths, flat, off = path_case(rng, 64, 9, (1024,), np.dtype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        d = cp.asarray(cache)
    specfsm.place_path_batch(d, bases, flat, off, stream=stream)
    stream.synchronize()
    assert_bytes_equal(cp.asnumpy(d), path_reference(cache, bases, paths))
    buf = cp.zeros(1 + 2 * 7 * 16, cp.uint8)
    d = buf[1:].reshape(2, 7, 16)
    host = rng.integers(0, 256, (2, 7, 16)).astype(np.uint8)
    d[...] = cp.asarray(host)
    specfsm.place_path_batch(d, [0, 2], [1, 3, 5, 2, 3], [0, 3, 5])
    assert_bytes_equal(cp.asnumpy(d), path_reference(host, [0, 2], [[1, 3, 5], [2, 3]]))
    d = cp.asarray(host)
    with pytest.raises(ValueError, match=r"slot 0: path\[1\]=1 is not after path\[0\]=3"):
        specfsm.place_path_batch(d, [0, 2], [3, 1, 5, 2, 3], [0, 3, 5])
    with pytest.raises(IndexError, match="slot 1: path"):
        specfsm.place_path_batch(d, [0, 2], [1, 3, 5, 2, 9], [0, 3, 5])
    with pytest.raises(TypeError, match="path must be on the host"):
        specfsm.place_path_batch(d, [0, 2], cp.asarray([1, 3, 5, 2, 3]), [0, 3, 5])
    with pytest.raises(ValueError, match="cache must be C-contiguous"):
        specfsm.place_path_batch(d[:, :, ::2], [0, 2], [1], [0, 1, 1])
    with pytest.raises(TypeError, match="stream must be a cupy.cuda.Stream"):
        specfsm.place_path_batch(d, [0, 2], [1], [0, 1, 1], stream=object())
    assert_bytes_equal(cp.asnumpy(d), host)  # every refusal moved nothing



@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=GPU_DTYPE_IDS)
@pytest.mark.parametrize("trailing", [(64,), (7,), (3, 5), ()], ids=str)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("index_on", ["host", "device"])
@pytest.mark.gpu
def test_gpu_place_rows_matches_fancy_indexing(cp, dtype, trailing, index_dtype, index_on):
    rng = np.random.default_rng(11)
    for B, K in [(1, 1), (1, 5), (7, 5), (4096, 5)]:
        src, index, before = random_case(rng, B, K, trailing, dtype, index_dtype)
        d_src, d_dst = cp.asarray(src), cp.asarray(before)
        idx = cp.asarray(index) if index_on == "device" else index
        assert specfsm.gpu.place_rows(d_src, idx, d_dst) is d_dst
        assert_bytes_equal(cp.asnumpy(d_dst), reference(src, index, before))
    specfsm.gpu.check_errors()


@pytest.mark.gpu
def test_gpu_unaligned_base_pointers(cp):
    rng = np.random.default_rng(12)
    for offset in (1, 2, 4, 8):
        B, K, R = 6, 3, 4096
        sbuf = cp.zeros(offset + B * K * R, cp.uint8)
        dbuf = cp.zeros(offset + B * R, cp.uint8)
        src, dst = sbuf[offset:].reshape(B, K, R), dbuf[offset:].reshape(B, R)
        host = rng.integers(0, 256, (B, K, R)).astype(np.uint8)
        src[...] = cp.asarray(host)
        index = np.array([2, 0, -1, 1, 2, 0])
        specfsm.gpu.place_rows(src, index, dst)
        assert_bytes_equal(cp.asnumpy(dst), reference(host, index, np.zeros((B, R), np.uint8)))
        assert int(dbuf[:offset].sum()) == 0


@pytest.mark.gpu
def test_gpu_device_index_beyond_k_is_skipped_and_reported(cp):
    src = cp.arange(4 * 3 * 8, dtype=cp.float32).reshape(4, 3, 8)
    dst = cp.full((4, 8), -1.0, cp.float32)
    specfsm.gpu.place_rows(src, cp.asarray([0, 3, 2, 99], cp.int64), dst)
    with pytest.raises(IndexError, match=r"skipped 2 row\(s\) on device \d+ .*first at b=1"):
        specfsm.gpu.check_errors()
    got = cp.asnumpy(dst)
    assert (got[1] == -1).all() and (got[3] == -1).all()
    assert np.array_equal(got[0], cp.asnumpy(src[0, 0])) and np.array_equal(got[2], cp.asnumpy(src[2, 2]))
    specfsm.gpu.check_errors()  # the flag was cleared


@pytest.mark.gpu
def test_gpu_reports_from_two_streams_are_all_counted(cp):
    """Both streams report into the device's one error word; one check takes both."""
    src = cp.zeros((4, 2, 8), cp.float32)
    dsts = [cp.zeros((4, 8), cp.float32) for _ in range(2)]
    streams = [cp.cuda.Stream(), cp.cuda.Stream()]
    for dst, stream, bad in zip(dsts, streams, (1, 3)):
        with stream:
            index = cp.zeros(4, cp.int64)
            index[bad] = 9
        specfsm.gpu.place_rows(src, index, dst, stream=stream)
    with pytest.raises(IndexError, match=r"skipped 2 row\(s\) on device \d+ .*first at b=1"):
        specfsm.gpu.check_errors()
    specfsm.gpu.check_errors()  # taken: nothing left


@pytest.mark.gpu
def test_gpu_host_index_beyond_k_is_refused_before_launch(cp):
    src = cp.ones((3, 2, 4), cp.float16)
    dst = cp.zeros((3, 4), cp.float16)
    with pytest.raises(IndexError, match=r"index\[2\]=2 is out of range for K=2"):
        specfsm.gpu.place_rows(src, [0, 1, 2], dst)
    assert not bool(dst.any())


@pytest.mark.gpu
def test_gpu_bad_arguments_are_refused(cp):
    src = cp.zeros((2, 3, 4), cp.float32)
    dst = cp.zeros((2, 4), cp.float32)
    with pytest.raises(ValueError, match=r"dst must have shape \(2, 4\)"):
        specfsm.gpu.place_rows(src, [0, 0], cp.zeros((2, 5), cp.float32))
    with pytest.raises(ValueError, match="at least 2-D"):
        specfsm.gpu.place_rows(cp.zeros(4, cp.float32), [0], cp.zeros(4, cp.float32))
    with pytest.raises(TypeError, match="must match src's dtype"):
        specfsm.gpu.place_rows(src, [0, 0], dst.astype(cp.float16))
    with pytest.raises(ValueError, match="src must be C-contiguous"):
        specfsm.gpu.place_rows(cp.zeros((2, 3, 8), cp.float32)[:, :, ::2], [0, 0], dst)
    with pytest.raises(TypeError, match="must both be numpy arrays or both CuPy arrays"):
        specfsm.gpu.place_rows(src, [0, 0], np.zeros((2, 4), np.float32))
    with pytest.raises(TypeError, match="index has dtype float32"):
        specfsm.gpu.place_rows(src, cp.zeros(2, cp.float32), dst)
    with pytest.raises(ValueError, match=r"index has 3 entries; it needs one per request \(B=2\)"):
        specfsm.gpu.place_rows(src, cp.zeros(3, cp.int32), dst)
    buf = cp.zeros(2 * 3 * 4 + 8, cp.float32)
    with pytest.raises(ValueError, match="src and dst overlap in memory"):
        specfsm.gpu.place_rows(buf[:24].reshape(2, 3, 4), [0, 0], buf[4:12].reshape(2, 4))
    with pytest.raises(TypeError, match="stream must be a cupy.cuda.Stream"):
        specfsm.gpu.place_rows(src, [0, 0], dst, stream=object())


@pytest.mark.gpu
def test_gpu_stream_argument(cp):
    rng = np.random.default_rng(13)
    src, index, before = random_case(rng, 64, 5, (1024,), np.dtype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        d_src, d_dst, d_idx = cp.asarray(src), cp.asarray(before), cp.asarray(index)
    specfsm.gpu.place_rows(d_src, d_idx, d_dst, stream=stream)
    snap = specfsm.gpu.snapshot(d_dst, stream=stream)
    stream.synchronize()
    assert_bytes_equal(cp.asnumpy(d_dst), reference(src, index, before))
    assert_bytes_equal(cp.asnumpy(snap), cp.asnumpy(d_dst))
    specfsm.gpu.check_errors(stream=stream)


@pytest.mark.gpu
def test_gpu_snapshot_and_enter_verify(cp):
    from specfsm import Decode

    cache = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    snap = specfsm.gpu.snapshot(cache)
    assert isinstance(snap, cp.ndarray) and snap.data.ptr != cache.data.ptr
    assert bool((snap == cache).all())
    out = cp.zeros_like(cache)
    assert specfsm.gpu.snapshot(cache, out) is out and bool((out == cache).all())
    assert bool((specfsm.gpu.snapshot(cache[:, ::2]) == cache[:, ::2]).all())
    with pytest.raises(ValueError, match="src and out overlap"):
        specfsm.gpu.snapshot(cache, cache)
    with pytest.raises(TypeError, match="out must be a CuPy array"):
        specfsm.gpu.snapshot(cache, np.zeros((2, 3), np.float32))
    verify = Decode(7, {"ssm": cache, "conv": [cache[0]]}).enter_verify([5, 6])
    s = verify.snapshot
    assert isinstance(s["ssm"], cp.ndarray) and s["ssm"].data.ptr != cache.data.ptr
    cache[...] = -1
    assert float(s["ssm"][1, 2]) == 5.0 and float(s["conv"][0][0]) == 0.0


# -- caller-owned arrays rewritten by another thread during the call -----------------
# place_rows and settle_index copy the index / counts into arrays the call owns before
# checking them, and the copy loop re-checks each row index where it reads the row: a
# thread that writes huge or negative values into the caller's index while calls run
# (GIL released) can change which rows are copied, never make the loop read outside src.
# Bounded in time; in a child process, so a crash fails this test only.
_PLACE_RACE_BODY = """
import sys, threading, time
import numpy as np
from specfsm import _impl
sys.setswitchinterval(1e-5)
k = _impl.kernels(IMPL, "place")
B, K, R = 256, 4, 2048
src = np.ones((B, K, R), np.float32)
dst = np.zeros((B, R), np.float32)
idx64 = np.zeros(B, np.int64)
idx32 = np.zeros(B, np.int32)
acc = np.zeros(B, np.int64)
lens = np.full(B, 3, np.int64)
stop = time.monotonic() + 1.0

def mutate():
    i = 0
    while time.monotonic() < stop:
        b = i % B
        idx64[b] = 10**12 if i % 2 else 2**62
        idx32[b] = 2**31 - 1
        acc[b] = 10**9
        lens[b] = -(2**63)
        idx64[b] = i % K
        idx32[b] = i % K
        acc[b] = i % 3
        lens[b] = 3
        i += 1

t = threading.Thread(target=mutate)
t.start()
calls = refused = 0
while time.monotonic() < stop:
    for fn in (
        lambda: k.place_rows(src, idx64, dst),
        lambda: k.place_rows(src, idx32, dst),
        lambda: k.settle_index(acc, lens),
    ):
        calls += 1
        try:
            fn()
        except (IndexError, ValueError):
            refused += 1
t.join()
assert (dst == 1).sum() + (dst == 0).sum() == dst.size
# the arrays valid again: every call returns, and copies what it is told
dst[:] = 0
src[:, 2] = 2
idx64[:] = 2
acc[:] = np.arange(B) % 3
lens[:] = 3
assert k.place_rows(src, idx64, dst) is dst and (dst == 2).all()
assert k.settle_index(acc, lens).tolist() == (np.arange(B) % 3).tolist()
print("calls", calls, "refused", refused)
"""


def test_threads_rewriting_the_index_during_place_rows(impl):
    from isolated import run_isolated

    impl.module("place")  # a compiled core that does not import fails here, by name
    words = run_isolated(_PLACE_RACE_BODY, impl.name).split()
    assert words[0] == "calls" and words[2] == "refused"
    calls, refused = int(words[1]), int(words[3])
    # the writer restores each entry at once: most calls see valid arrays and return
    assert calls > 0 and refused < calls, f"every one of {calls} calls was refused"


def test_settle_index_int64_arrays_refusals_and_copies(impl):
    """Plain int64 arrays (the compiled core's memcpy path) give the same answers and
    errors as lists, and the result never aliases the inputs."""
    k = impl.module("place")
    a = np.array([1, 4, 0, 3], np.int64)
    d = np.array([3, 4, 0, 5], np.int64)
    out = k.settle_index(a, d)
    assert out.tolist() == [1, 3, -1, 3] and not np.shares_memory(out, a)
    with pytest.raises(ValueError, match=r"accepted\[1\]=5 is beyond the draft's 4 rows"):
        k.settle_index(np.array([1, 5], np.int64), np.array([3, 4], np.int64))
    with pytest.raises(ValueError, match=rf"draft_lens\[1\]={-(2**63)} is negative"):
        k.settle_index(np.array([1, 2], np.int64), np.array([3, -(2**63)], np.int64))
    with pytest.raises(ValueError, match="accepted has 2 entries and draft_lens 3"):
        k.settle_index(np.zeros(2, np.int64), np.zeros(3, np.int64))
    assert k.settle_index(np.zeros(0, np.int64), np.zeros(0, np.int64)).shape == (0,)


def test_index_conversion_runs_before_any_check(impl):
    """A sequence index runs Python code while it is converted; the arrays are checked
    after that, and the copy loop reads the converted copy, not the caller's list."""
    k = impl.module("place")
    src = np.arange(2 * 3 * 2, dtype=np.int16).reshape(2, 3, 2)
    dst = np.zeros((2, 2), np.int16)
    backing = [2, 0]

    class Index:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            value = backing[i]
            backing[:] = [10**9, 10**9]  # rewrite what a later read would see
            return value

    with pytest.raises(IndexError, match=r"index\[1\]=1000000000 is out of range"):
        k.place_rows(src, Index(), dst)
    backing[:] = [2, 0]
    idx = list(backing)
    k.place_rows(src, idx, dst)
    assert dst.tolist() == [[4, 5], [6, 7]]
