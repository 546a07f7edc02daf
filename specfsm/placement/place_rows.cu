// Row placement for speculative decoding: dst[b] = src[b, index[b]] for a whole batch
// in one launch, as a copy of raw bytes.
//
// Layout: src is [B, K, nvec] vectors of type V, dst is [B, nvec], index is [B].
// The host wrapper (specfsm/placement/_cupy.py) picks V as the widest of 16/8/4/2/1 bytes
// that divides the row size and both base pointers, so every access is aligned; it has
// already checked shapes, dtypes, contiguity, devices and overlap.
//
// Grid: blockIdx.y walks requests (striding by gridDim.y when B > 65535), blockIdx.x
// splits one row into chunks of blockDim.x * UNROLL vectors (striding by gridDim.x).
// index[b] < 0: the request is not speculating; dst[b] is left untouched.
// index[b] >= K: nothing is read or written for b; the row is reported in the device's
// error word *err, one 64-bit word updated atomically as a whole: the high 32 bits count
// the skipped rows (saturating), the low 32 bits keep the smallest such b
// (PLACE_ERR_NONE when none). The host reads it at its chosen synchronisation point
// (specfsm.gpu.check_errors) with place_rows_take_errors, which swaps in the empty word
// and returns the old one in a single atomic exchange: a report from a launch still
// running on another stream lands either in the word taken now or in the fresh one, so
// none is lost or counted twice.

#define PLACE_UNROLL 4
#define PLACE_ERR_NONE 0x7fffffffULL
#define PLACE_ERR_EMPTY PLACE_ERR_NONE  // count 0, no row

__device__ __forceinline__ void place_rows_report(unsigned long long* err, long long b)
{
    const unsigned long long bb =
        (b >= 0 && (unsigned long long)b < PLACE_ERR_NONE) ? (unsigned long long)b : PLACE_ERR_NONE;
    unsigned long long seen = *(volatile unsigned long long*)err;
    unsigned long long assumed;
    do {
        assumed = seen;
        unsigned long long count = assumed >> 32;
        unsigned long long first = assumed & 0xffffffffULL;
        if (count < 0xffffffffULL) {
            count += 1;
        }
        if (bb < first) {
            first = bb;
        }
        seen = atomicCAS(err, assumed, (count << 32) | first);
    } while (seen != assumed);
}

template <typename V, typename I>
__device__ __forceinline__ void place_rows_body(
    const V* __restrict__ src, const I* __restrict__ index, V* __restrict__ dst,
    unsigned long long* __restrict__ err, long long B, long long K, long long nvec)
{
    const long long tpb = blockDim.x;
    const long long first = (long long)blockIdx.x * tpb * PLACE_UNROLL + threadIdx.x;
    const long long stride = (long long)gridDim.x * tpb * PLACE_UNROLL;
    for (long long b = blockIdx.y; b < B; b += gridDim.y) {
        const long long k = (long long)index[b];
        if (k < 0) {
            continue;
        }
        if (k >= K) {
            if (blockIdx.x == 0 && threadIdx.x == 0) {
                place_rows_report(err, b);
            }
            continue;
        }
        const V* __restrict__ s = src + (b * K + k) * nvec;
        V* __restrict__ d = dst + b * nvec;
        long long i = first;
        // Full chunks: PLACE_UNROLL independent loads in flight per thread, then stores.
        for (; i + (PLACE_UNROLL - 1) * tpb < nvec; i += stride) {
            V r[PLACE_UNROLL];
#pragma unroll
            for (int u = 0; u < PLACE_UNROLL; ++u) {
                r[u] = s[i + u * tpb];
            }
#pragma unroll
            for (int u = 0; u < PLACE_UNROLL; ++u) {
                d[i + u * tpb] = r[u];
            }
        }
        // The last, partial chunk (every later chunk starts past the row's end).
#pragma unroll
        for (int u = 0; u < PLACE_UNROLL; ++u) {
            const long long j = i + u * tpb;
            if (j < nvec) {
                d[j] = s[j];
            }
        }
    }
}

#define PLACE_ROWS_KERNEL(NAME, V, I)                                                   \
    extern "C" __global__ void __launch_bounds__(256) NAME(                             \
        const V* __restrict__ src, const I* __restrict__ index, V* __restrict__ dst,    \
        unsigned long long* __restrict__ err, long long B, long long K, long long nvec)  \
    {                                                                                   \
        place_rows_body<V, I>(src, index, dst, err, B, K, nvec);                        \
    }

// 16-byte rows: one 128-bit load and store per vector (ld.global.v4 / st.global.v4).
PLACE_ROWS_KERNEL(place_rows_w16_i32, uint4, int)
PLACE_ROWS_KERNEL(place_rows_w16_i64, uint4, long long)
// Narrower paths for rows (or base pointers) that are not 16-byte aligned.
PLACE_ROWS_KERNEL(place_rows_w8_i32, uint2, int)
PLACE_ROWS_KERNEL(place_rows_w8_i64, uint2, long long)
PLACE_ROWS_KERNEL(place_rows_w4_i32, unsigned int, int)
PLACE_ROWS_KERNEL(place_rows_w4_i64, unsigned int, long long)
PLACE_ROWS_KERNEL(place_rows_w2_i32, unsigned short, int)
PLACE_ROWS_KERNEL(place_rows_w2_i64, unsigned short, long long)
PLACE_ROWS_KERNEL(place_rows_w1_i32, unsigned char, int)
PLACE_ROWS_KERNEL(place_rows_w1_i64, unsigned char, long long)

// Takes the error word: *out = the reports so far, *err = empty, in one atomic exchange.
extern "C" __global__ void place_rows_take_errors(unsigned long long* err, unsigned long long* out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = atomicExch(err, PLACE_ERR_EMPTY);
    }
}

// ---------------------------------------------------------------------------------------
// Path placement after a tree verify, in place: for each request b, the accepted path's
// rows move to consecutive rows after the root,
//     cache[b, base[b] + 1 + j] = cache[b, base[b] + 1 + path[j]]   for j = 0, 1, ...
// as raw bytes. Layout: cache is [B, L, nvec] vectors of type V; meta is one int64 array
// [base (B) | offsets (B + 1) | path (offsets[B])], request b's path being
// path[offsets[b]:offsets[b + 1]]. Everything in meta was checked on the host (specfsm.tree:
// base < L, each path increasing with base + 1 + path[j] < L), so nothing here is checked.
//
// The moves are a gather within one buffer: path[j] >= j (a path increases from 0 or
// more), so the source row of move j is one no earlier move wrote; the only hazard is a
// later move writing a row an earlier move still has to read. Each thread owns its
// columns (vectors i, i + tpb, ... of the same chunks as place_rows) in every row of its
// request and walks j in order, so its read of a column always precedes the write that
// overwrites it: no two threads touch the same address, and no barrier is needed.
// Grid: as place_rows (y over requests, striding past 65535; x over chunks of a row).

template <typename V>
__device__ __forceinline__ void place_path_body(
    V* cache, const long long* __restrict__ meta, long long B, long long L, long long nvec)
{
    const long long* __restrict__ base = meta;
    const long long* __restrict__ offsets = meta + B;
    const long long* __restrict__ path = meta + 2 * B + 1;
    const long long tpb = blockDim.x;
    const long long first = (long long)blockIdx.x * tpb * PLACE_UNROLL + threadIdx.x;
    const long long stride = (long long)gridDim.x * tpb * PLACE_UNROLL;
    for (long long b = blockIdx.y; b < B; b += gridDim.y) {
        const long long lo = offsets[b];
        const long long n = offsets[b + 1] - lo;
        V* rows = cache + (b * L + base[b] + 1) * nvec;  // row 0 here: node 0's slot
        for (long long i = first; i < nvec; i += stride) {
            for (long long j = 0; j < n; ++j) {
                const long long v = path[lo + j];
                if (v == j) {
                    continue;  // already in place
                }
                const V* s = rows + v * nvec;
                V* d = rows + j * nvec;
                V r[PLACE_UNROLL];
#pragma unroll
                for (int u = 0; u < PLACE_UNROLL; ++u) {
                    if (i + u * tpb < nvec) {
                        r[u] = s[i + u * tpb];
                    }
                }
#pragma unroll
                for (int u = 0; u < PLACE_UNROLL; ++u) {
                    if (i + u * tpb < nvec) {
                        d[i + u * tpb] = r[u];
                    }
                }
            }
        }
    }
}

#define PLACE_PATH_KERNEL(NAME, V)                                                      \
    extern "C" __global__ void __launch_bounds__(256) NAME(                             \
        V* cache, const long long* __restrict__ meta, long long B, long long L,          \
        long long nvec)                                                                 \
    {                                                                                   \
        place_path_body<V>(cache, meta, B, L, nvec);                                    \
    }

PLACE_PATH_KERNEL(place_path_w16, uint4)
PLACE_PATH_KERNEL(place_path_w8, uint2)
PLACE_PATH_KERNEL(place_path_w4, unsigned int)
PLACE_PATH_KERNEL(place_path_w2, unsigned short)
PLACE_PATH_KERNEL(place_path_w1, unsigned char)
