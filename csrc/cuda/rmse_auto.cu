/*
 * rmse_auto.cu: batched RMSE on the GPU, the default path (version 6 of the ladder whose versions 1-5,
 * the paper's, are in batched_rmse_kernel_analysis.cu); the shared types and helpers are in
 * rmse_common.cuh.
 *
 * Inputs a, b are viewed as [outer][n][inner]; batch (o, j) is the n elements at
 * (o * n + i) * inner + j, and out[o * inner + j] = sqrt(sum_i (a - b)^2 / n).
 * out is float32 for float32/float16/bfloat16 inputs, float64 for float64.
 * n == 0 gives NaN for every batch (rmse_fill_nan, made here for both files); outer * inner == 0
 * launches nothing.
 *
 *   6 "auto"       the default, every layout. Deterministic: no floating-point atomics; per-(batch,
 *                  chunk) partials summed in a fixed order; the split depends on the shape, the
 *                  dtype and the inputs' alignment mod 16 bytes, never on the device or on timing
 *                  (the grid may depend on the device and on PDL; the order of no sum does).
 *                  Squares summed in float per 4 x 16-byte step, in double per thread and beyond
 *                  (rows of at most 64 and columns of at most 8 rows: in float, at most 8 terms
 *                  per lane before a shuffle tree, or the n rows in order).
 *                  16-byte loads with scalar head and tail (a batch may start misaligned).
 *                  inner == 1: rows of at most 64 elements with a and b 16-byte aligned: tiles of
 *                  whole rows (16 KiB of each input for float32) loaded through shared memory, then
 *                  1..8 lanes per row; other short batches (<= 128 vectors): a group of 1..32 lanes
 *                  per batch; longer: one block per 16 KiB chunk of a batch (64, 128 or 256
 *                  threads: the fewest that take 4 vectors each), then a combine launch (a
 *                  programmatic dependent launch on sm_90) when a batch has several chunks.
 *                  Under PDL the kernels prefetch the lines of each thread's first load into L2
 *                  before the wait (pdl.cuh, prefetch_l2); the short kernel in its first wave only.
 *                  inner > 1: at most 8 rows (32 for 16-bit inputs), 16-byte units: 1, 2 or 4
 *                  column units per thread, every row of each (shortcols); else a coalesced
 *                  column kernel (consecutive threads on
 *                  consecutive j, each looping over i) whose column tiles narrow to 128 bytes of a
 *                  row before i is split into chunks, when outer * inner is small.
 *                  Time it with `python -m ewkern.bench peers` (16 x 2^20, 16 x 3*2^20,
 *                  1024 x 4096, 8 x 2^24, 65536 x 64 and batch-last 2^20 x 16, against torch and
 *                  torch.dot over the same elements, cold L2); RMSE_NOTES.md has the measurements.
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <atomic>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "ewkern_kernels.h"
#include "device_cache.cuh"
#include "pdl.cuh"
#include "rmse_common.cuh"

namespace {

/* ---------------------------------------------------------------------------------------------
 * 16-byte vectors: diffs() unpacks one pair of 16-byte vectors into W = 16 / sizeof(T)
 * differences a - b in the arithmetic type.
 * ------------------------------------------------------------------------------------------- */
template <typename T> struct vec16;
template <> struct vec16<float> {
    enum { W = 4 };
    static __device__ __forceinline__ void diffs(const uint4 &x, const uint4 &y, float d[4])
    {
        d[0] = __uint_as_float(x.x) - __uint_as_float(y.x);
        d[1] = __uint_as_float(x.y) - __uint_as_float(y.y);
        d[2] = __uint_as_float(x.z) - __uint_as_float(y.z);
        d[3] = __uint_as_float(x.w) - __uint_as_float(y.w);
    }
};
__device__ __forceinline__ float2 f16x2_to_float2(unsigned u)
{
    __half2_raw r;
    r.x = (unsigned short)(u & 0xffffu);
    r.y = (unsigned short)(u >> 16);
    return __half22float2(__half2(r));
}
template <> struct vec16<__half> {
    enum { W = 8 };
    static __device__ __forceinline__ void diffs(const uint4 &x, const uint4 &y, float d[8])
    {
        const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float2 p = f16x2_to_float2(xs[k]), q = f16x2_to_float2(ys[k]);
            d[2 * k] = p.x - q.x;
            d[2 * k + 1] = p.y - q.y;
        }
    }
};
template <> struct vec16<__nv_bfloat16> {
    enum { W = 8 };
    /* bfloat16 -> float is exact: the 16 bits are the float's top half. */
    static __device__ __forceinline__ void diffs(const uint4 &x, const uint4 &y, float d[8])
    {
        const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            d[2 * k] = __uint_as_float(xs[k] << 16) - __uint_as_float(ys[k] << 16);
            d[2 * k + 1] = __uint_as_float(xs[k] & 0xffff0000u) - __uint_as_float(ys[k] & 0xffff0000u);
        }
    }
};
template <> struct vec16<double> {
    enum { W = 2 };
    static __device__ __forceinline__ void diffs(const uint4 &x, const uint4 &y, double d[2])
    {
        d[0] = __hiloint2double((int)x.y, (int)x.x) - __hiloint2double((int)y.y, (int)y.x);
        d[1] = __hiloint2double((int)x.w, (int)x.z) - __hiloint2double((int)y.w, (int)y.z);
    }
};

/* Pairwise (tree) sum of the squares of W differences: error grows with log2(W), not W. */
template <typename A, int W>
__device__ __forceinline__ A tree_sumsq(const A d[W])
{
    A q[W];
#pragma unroll
    for (int e = 0; e < W; ++e) q[e] = d[e] * d[e];
#pragma unroll
    for (int s = W / 2; s > 0; s >>= 1) {
#pragma unroll
        for (int e = 0; e < s; ++e) q[e] += q[e + s];
    }
    return q[0];
}

/* Unit of the auto kernels' loads (ld.global.cs: streaming, evict-first; measured 2% faster than
 * __ldg on the 32 MiB shapes, RMSE_NOTES.md): VEC = true reads 16-byte vectors (W elements), false reads
 * single elements (W = 1; used when a and b are not equally aligned mod 16 bytes). */
template <typename T, bool VEC> struct unit_io;
template <typename T> struct unit_io<T, true> {
    enum { W = vec16<T>::W };
    typedef uint4 raw;
    static __device__ __forceinline__ uint4 load(const T *p, int64_t k)
    {
        return __ldcs(reinterpret_cast<const uint4 *>(p) + k);
    }
    static __device__ __forceinline__ void diffs(const uint4 &x, const uint4 &y, acc_t<T> d[W])
    {
        vec16<T>::diffs(x, y, d);
    }
    static __device__ __forceinline__ uint4 zero() { return make_uint4(0u, 0u, 0u, 0u); }
};
template <typename T> struct unit_io<T, false> {
    enum { W = 1 };
    typedef T raw;
    static __device__ __forceinline__ T load(const T *p, int64_t k) { return __ldcs(p + k); }
    static __device__ __forceinline__ void diffs(const T &x, const T &y, acc_t<T> d[1])
    {
        d[0] = elem<T>::to_acc(x) - elem<T>::to_acc(y);
    }
    static __device__ __forceinline__ T zero() { return T(); }
};

/* Before pdl_wait(): the L2 line of unit k of p, from a run of consecutive units that the caller
 * leads (pdl.cuh, prefetch_l2_line). */
template <typename T, bool VEC>
__device__ __forceinline__ void prefetch_unit(const T *p, int64_t k, bool lead)
{
    if (VEC)
        prefetch_l2_line(reinterpret_cast<const uint4 *>(p) + k, 16u, lead);
    else
        prefetch_l2_line(p + k, (unsigned)sizeof(T), lead);
}

/* Sum of squares of one unit pair (W elements), tree-ordered. */
template <typename T, bool VEC>
__device__ __forceinline__ acc_t<T> unit_sumsq(const typename unit_io<T, VEC>::raw &x,
                                               const typename unit_io<T, VEC>::raw &y)
{
    enum { W = unit_io<T, VEC>::W };
    acc_t<T> d[W];
    unit_io<T, VEC>::diffs(x, y, d);
    return tree_sumsq<acc_t<T>, W>(d);
}

/* Elements before the first 16-byte boundary at or after p (at most n). b has the same count
 * whenever a and b are equally aligned mod 16, which the VEC path requires. */
template <typename T>
__device__ __forceinline__ int head_elems(const T *p, int64_t n)
{
    const unsigned mis = (unsigned)((uintptr_t)p & 15u);
    const int h = mis ? (int)((16u - mis) / sizeof(T)) : 0;
    return n < (int64_t)h ? (int)n : h;
}

/* =============================================================================================
 * 6 auto
 * =========================================================================================== */
/* Programmatic dependent launch (pdl.cuh, sm_90+): every auto kernel waits for the previous
 * kernel in its stream before touching memory and lets the next one launch early; the combine
 * kernel thereby launches while the first pass drains and waits for its partials. */

/* The auto kernels' constants. Each was timed on an H100 (RMSE_NOTES.md); the split of a
 * shape into chunks depends only on these, the shape, the dtype and the alignment mod 16. */
enum {
    AUTO_BLOCK = 256,          /* threads per block of every auto kernel (fixed: it sets the sum order) */
    AUTO_UNROLL = 4,           /* 16-byte loads of each input in flight per thread */
    AUTO_CHUNK_UNITS = 1024,   /* rows kernel: 16-byte units per chunk = one unrolled step per thread
                                  (16 KiB of each input); 2048 and 4096 timed 0.5-1.5% slower */
    AUTO_SMALL_UNITS = 128,    /* rows: batches of at most this many units go to the group kernel,
                                  longer ones to the rows kernel at 64/128/256 threads (RMSE_NOTES.md:
                                  at 128 units, 16384 x 512 f32, 3058 GB/s against 2912 for the rows
                                  kernel; at 256 units, 8192 x 1024, 2819 against 3253) */
    AUTO_TINY_UNITS = 16,      /* group kernel: batches of at most this many units take about 2 units
                                  per lane instead of AUTO_UNROLL (65536 x 64 f32: 2425 vs 2230 GB/s) */
    AUTO_TARGET_CHUNKS = 2048, /* cols kernel: split rows until about this many blocks of work */
    AUTO_COL_ROWS = 16,        /* cols kernel: at least this many rows per thread in a chunk */
    AUTO_COL_MIN_WC = 8,       /* cols kernel: at least this many column units per block */
    AUTO_SHORT_N = 64,         /* rows: batches of at most this many elements take the short kernel */
    AUTO_SHORT_COLS_N = 8,     /* columns: at most this many float64 rows take the shortcols kernel */
    AUTO_SHORT_COLS_N32 = 32,  /* the same for float32 rows (short_cols_limit: both GPUs) */
    AUTO_SHORT_COLS_N16 = 256, /* the same for 16-bit rows (float sums in runs of 32 rows) */
    AUTO_SHORT_COLS_SPLIT = 32, /* shortcols: float sums in runs of this many rows (31 epsilons each) */
    AUTO_SHORT_MIN_BLOCKS = 128 /* short and shortcols kernels: at least this many blocks, else the
                                   group / cols kernel (the grid of rmse_grid: 2^16-2^18 batches of
                                   1-8 elements ran at 0.2-0.6 of torch's best with 16-64 blocks,
                                   before the shortcols kernel took 1-2 units a thread: it now
                                   starts lower for few rows, shortcols_grid); a constant, not the
                                   SM count, so the kernel and with it the sum order depend on
                                   the shape only */
};

/* __launch_bounds__(256, 1): the explicit minimum of one block lets ptxas keep more loads in
 * flight (more registers); timed 1-6% faster than __launch_bounds__(256) on the H100. */
#define RMSE_AUTO_BOUNDS __launch_bounds__(AUTO_BLOCK, 1)
static_assert(AUTO_UNROLL == 4, "the auto kernels' step sums are written out for 4 loads");
static_assert(AUTO_CHUNK_UNITS % (AUTO_BLOCK * AUTO_UNROLL) == 0, "a chunk is whole unrolled steps");

/* Unit u of the rows kernel: batch bt, chunk c, the chunk's first vector (ca, cb) and its
 * vector count m; pure arithmetic (no memory access), so the first unit's is formed before
 * pdl_wait() and the loads follow the wait at once. */
template <typename T, bool VEC>
struct RowsUnit {
    enum { W = unit_io<T, VEC>::W };
    const T *pa, *pb, *ca, *cb;
    int64_t bt, c, nv;
    int h, m;
    __device__ __forceinline__ RowsUnit(const T *a, const T *b, int64_t n, int64_t chunks, int64_t u)
    {
        bt = chunks == 1 ? u : u / chunks; /* no 64-bit division in the common case */
        c = u - bt * chunks;
        pa = a + bt * n;
        pb = b + bt * n;
        h = VEC ? head_elems(pa, n) : 0;
        nv = (n - h) / W;
        const int64_t v0 = c * AUTO_CHUNK_UNITS, left = nv - v0;
        m = left <= 0 ? 0 : left < AUTO_CHUNK_UNITS ? (int)left : AUTO_CHUNK_UNITS;
        ca = pa + h + v0 * W;
        cb = pb + h + v0 * W;
    }
};

/* Contiguous batches, long: unit u = (batch u / chunks, chunk u % chunks), one block of NT threads
 * each (NT is fixed per shape, so the sum order is too).
 * A batch is a head of up to W - 1 elements (to the first 16-byte boundary), nv full vectors,
 * and a tail; chunk c owns vectors [c * CHUNK, (c + 1) * CHUNK), chunk 0 also the head and the
 * last chunk the tail. Each thread keeps a double sum; each unrolled step of AUTO_UNROLL
 * vectors is tree-summed in the arithmetic type first. chunks == 1 writes out directly, otherwise
 * partial[u] for the combine kernel. */
template <typename T, bool VEC, int NT = AUTO_BLOCK>
__global__ void __launch_bounds__(NT, 1)
rmse_auto_rows_kernel(const T *a, const T *b, out_t<T> *out, double *partial, int64_t n,
                      int64_t chunks, int64_t units, bool prefetch)
{
    typedef unit_io<T, VEC> io;
    typedef typename io::raw raw;
    typedef acc_t<T> A;
    enum { W = io::W, STEP = NT * AUTO_UNROLL };
    const int tid = threadIdx.x;
    int64_t u = blockIdx.x;
    RowsUnit<T, VEC> w(a, b, n, chunks, u);
    if (prefetch && tid < w.m) {
        /* the first of the thread's AUTO_UNROLL loads of each input (all of them measured slower) */
        prefetch_unit<T, VEC>(w.ca, tid, tid == 0);
        prefetch_unit<T, VEC>(w.cb, tid, tid == 0);
    }
    pdl_wait();
    pdl_launch_dependents();
    for (; u < units; u += gridDim.x, w = RowsUnit<T, VEC>(a, b, n, chunks, u)) {
        const T *ca = w.ca, *cb = w.cb;
        const int m = w.m;
        /* AUTO_UNROLL loads of each input in flight per step: full steps unguarded, then at most one
         * guarded step, so a short chunk (a batch of a few hundred vectors) still issues all its
         * loads at once */
        double acc = 0.0;
        int k = tid;
        for (; k + (AUTO_UNROLL - 1) * NT < m; k += STEP) {
            raw x[AUTO_UNROLL], y[AUTO_UNROLL];
#pragma unroll
            for (int r = 0; r < AUTO_UNROLL; ++r) {
                x[r] = io::load(ca, k + r * NT);
                y[r] = io::load(cb, k + r * NT);
            }
            A s[AUTO_UNROLL];
#pragma unroll
            for (int r = 0; r < AUTO_UNROLL; ++r) s[r] = unit_sumsq<T, VEC>(x[r], y[r]);
            acc += (double)((s[0] + s[1]) + (s[2] + s[3]));
        }
        if (k < m) {
            raw x[AUTO_UNROLL], y[AUTO_UNROLL];
#pragma unroll
            for (int r = 0; r < AUTO_UNROLL; ++r) {
                const bool in = k + r * NT < m;
                x[r] = in ? io::load(ca, k + r * NT) : io::zero();
                y[r] = in ? io::load(cb, k + r * NT) : io::zero();
            }
            A s[AUTO_UNROLL];
#pragma unroll
            for (int r = 0; r < AUTO_UNROLL; ++r) s[r] = unit_sumsq<T, VEC>(x[r], y[r]);
            acc += (double)((s[0] + s[1]) + (s[2] + s[3]));
        }
        /* head and tail are each shorter than W <= 8 elements: one per thread */
        if (w.c == 0 && tid < w.h) acc += (double)sq1(w.pa[tid], w.pb[tid]);
        if (VEC && w.c == chunks - 1) {
            const int64_t i = w.h + w.nv * W + tid;
            if (tid < W && i < n) acc += (double)sq1(w.pa[i], w.pb[i]);
        }
        acc = block_sum<double, NT>(acc);
        if (tid == 0) {
            if (chunks == 1)
                out[w.bt] = finish_double<out_t<T>>(acc, n);
            else
                partial[u] = acc;
        }
    }
}

/* Contiguous batches, short (at most AUTO_SMALL_UNITS vectors): a group of G = 2^glog lanes
 * (1..32, inside one warp) per batch, 256 / G batches per block per step. Loops run per warp
 * (every lane of a warp takes the same trips) so the group shuffles always have the whole warp. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(AUTO_BLOCK)
rmse_auto_small_kernel(const T *a, const T *b, out_t<T> *out, int64_t batches, int64_t n, int glog,
                       bool prefetch)
{
    typedef unit_io<T, VEC> io;
    typedef typename io::raw raw;
    typedef acc_t<T> A;
    enum { W = io::W };
    const int G = 1 << glog;
    const int lane = threadIdx.x & (G - 1);
    const int per_warp = 32 >> glog;
    const int64_t warp_id = (int64_t)blockIdx.x * (AUTO_BLOCK / 32) + (threadIdx.x >> 5);
    const int64_t warp_stride = (int64_t)gridDim.x * (AUTO_BLOCK / 32) * per_warp;
    /* the lane's batch: pure arithmetic, formed before pdl_wait() for the first step */
    struct Lane {
        const T *pa, *pb;
        int64_t bt;
        int h, nv;
        bool valid;
        __device__ __forceinline__ Lane(const T *a, const T *b, int64_t n, int64_t batches, int64_t bt_)
        {
            bt = bt_;
            valid = bt < batches;
            pa = a + (valid ? bt : 0) * n;
            pb = b + (valid ? bt : 0) * n;
            h = VEC ? head_elems(pa, n) : 0;
            nv = (int)((n - h) / W);
        }
    };
    const int64_t first = warp_id * per_warp, sub = (threadIdx.x & 31) >> glog;
    Lane w(a, b, n, batches, first + sub);
    if (prefetch && w.valid && lane < w.nv) {
        /* the first of the lane's loads of each input; a warp's batches are contiguous */
        prefetch_unit<T, VEC>(w.pa + w.h, lane, lane == 0);
        prefetch_unit<T, VEC>(w.pb + w.h, lane, lane == 0);
    }
    pdl_wait();
    pdl_launch_dependents();
    for (int64_t wbase = first; wbase < batches; wbase += warp_stride, w = Lane(a, b, n, batches, wbase + sub)) {
        double acc = 0.0;
        if (w.valid) {
            const T *pa = w.pa, *pb = w.pb;
            const int h = w.h, nv = w.nv;
            const T *va = pa + h, *vb = pb + h;
            for (int k = lane; k < nv; k += AUTO_UNROLL * G) {
                raw x[AUTO_UNROLL], y[AUTO_UNROLL];
#pragma unroll
                for (int r = 0; r < AUTO_UNROLL; ++r) {
                    const bool in = k + r * G < nv;
                    x[r] = in ? io::load(va, k + r * G) : io::zero();
                    y[r] = in ? io::load(vb, k + r * G) : io::zero();
                }
                A s[AUTO_UNROLL];
#pragma unroll
                for (int r = 0; r < AUTO_UNROLL; ++r) s[r] = unit_sumsq<T, VEC>(x[r], y[r]);
                acc += (double)((s[0] + s[1]) + (s[2] + s[3]));
            }
            /* head and tail: fewer than W elements each */
#pragma unroll 1
            for (int e = lane; e < h; e += G) acc += (double)sq1(pa[e], pb[e]);
#pragma unroll 1
            for (int e = h + nv * W + lane; e < n; e += G) acc += (double)sq1(pa[e], pb[e]);
        }
        for (int off = G >> 1; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (w.valid && lane == 0) out[w.bt] = finish_double<out_t<T>>(acc, n);
    }
}

/* Contiguous batches, short rows (n <= the host's short limit), a and b 16-byte aligned: tile k is
 * tb whole batches (tb * n elements, a multiple of 16 bytes, so every tile starts aligned). The
 * block reads its tile with AUTO_UNROLL 16-byte loads of each input per thread, all in flight at
 * once and coalesced whatever n is, and stores the squared differences in shared memory (one pad
 * word per 32, so rows of 2^k elements do not fall on one bank); then G = 2^glog lanes per batch
 * add its n squares (lane l: l, l + G, ... in order, then xor shuffles) and write out coalesced.
 * The group and rows kernels give each batch its own loads, which short rows make tiny and
 * many; here the loads are as wide and as many as the rows kernel's, for any n. */
__device__ __forceinline__ int short_pad(int i) { return i + (i >> 5); }

template <typename T>
__global__ void __launch_bounds__(AUTO_BLOCK)
rmse_auto_short_kernel(const T *a, const T *b, out_t<T> *out, int64_t batches, int n, int tb, int glog,
                       int64_t tiles, int64_t prefetch_blocks)
{
    typedef unit_io<T, true> io;
    typedef acc_t<T> A;
    enum { W = io::W, ELEMS = AUTO_BLOCK * AUTO_UNROLL * W };
    __shared__ A sq[ELEMS + ELEMS / 32];
    const int tid = threadIdx.x;
    const int G = 1 << glog, lane = tid & (G - 1), grp = tid >> glog, per_pass = AUTO_BLOCK >> glog;
    int64_t k = blockIdx.x;
    if ((int64_t)blockIdx.x < prefetch_blocks && (int64_t)tid * W < (batches - k * tb) * n) {
        /* the line of the thread's first load of each input */
        prefetch_unit<T, true>(a + k * tb * n, tid, tid == 0);
        prefetch_unit<T, true>(b + k * tb * n, tid, tid == 0);
    }
    pdl_wait();
    pdl_launch_dependents();
    for (; k < tiles; k += gridDim.x) {
        const int64_t b0 = k * tb;
        const int nb = batches - b0 < tb ? (int)(batches - b0) : tb;
        const int ne = nb * n, nfv = ne / W;
        const T *ta = a + b0 * n, *tbp = b + b0 * n;
        uint4 x[AUTO_UNROLL], y[AUTO_UNROLL];
#pragma unroll
        for (int r = 0; r < AUTO_UNROLL; ++r) {
            const int v = tid + r * AUTO_BLOCK;
            x[r] = v < nfv ? io::load(ta, v) : io::zero();
            y[r] = v < nfv ? io::load(tbp, v) : io::zero();
        }
#pragma unroll
        for (int r = 0; r < AUTO_UNROLL; ++r) {
            const int v = tid + r * AUTO_BLOCK;
            if (v < nfv) {
                A d[W];
                io::diffs(x[r], y[r], d);
#pragma unroll
                for (int e = 0; e < W; ++e) sq[short_pad(v * W + e)] = d[e] * d[e];
            }
        }
        /* the array's last elements after its last whole vector (the last tile only) */
        if (tid < ne - nfv * W) {
            const int i = nfv * W + tid;
            sq[short_pad(i)] = sq1(ta[i], tbp[i]);
        }
        __syncthreads();
        for (int p = 0; p * per_pass < nb; ++p) {
            const int bl = p * per_pass + grp;
            A s = A(0);
            if (bl < nb) {
                const int base = bl * n;
                for (int e = lane; e < n; e += G) s += sq[short_pad(base + e)];
            }
            for (int off = G >> 1; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
            if (bl < nb && lane == 0) out[b0 + bl] = finish_o(s, n);
        }
        __syncthreads(); /* sq is read before the next tile overwrites it */
    }
}

/* inner > 1: batch (o, j) is column j of the [n][inner] slab o. A block covers wc column units
 * (16-byte vectors of W consecutive j, or single j) by rthreads = 256 / wc rows: thread
 * (r, cv) reads rows r, r + rthreads, ... of its column unit, so a warp reads consecutive memory.
 * unit u = ((o * tiles + t) * chunks + c): slab o, column tile t, row chunk c. Per-column sums
 * are combined across r in a fixed order: warp shuffles then the 8 warps in order when wc divides
 * 32, else a shared-memory tree; chunks == 1 writes out directly, otherwise
 * partial[(o * inner + j) * chunks + c]. */
template <typename T, bool VEC>
__global__ void RMSE_AUTO_BOUNDS
rmse_auto_cols_kernel(const T *a, const T *b, out_t<T> *out, double *partial, int64_t n,
                      int64_t inner, int64_t ncu, int wc, int64_t tiles, int64_t chunks,
                      int64_t rows_per_chunk, int64_t units)
{
    typedef unit_io<T, VEC> io;
    typedef typename io::raw raw;
    typedef acc_t<T> A;
    enum { W = io::W };
    __shared__ double sh[AUTO_BLOCK * W];
    const int rthreads = AUTO_BLOCK / wc;
    const int cv = threadIdx.x % wc, r = threadIdx.x / wc;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool shuffle_rows = wc <= 32 && (wc & (wc - 1)) == 0; /* then rthreads * wc == 256 */
    int top = 1;
    while (top < rthreads) top <<= 1;
    pdl_wait();
    pdl_launch_dependents();
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const int64_t c = u % chunks, ot = u / chunks;
        const int64_t t = ot % tiles, o = ot / tiles;
        const int64_t gcu = t * wc + cv; /* column unit */
        const bool active = r < rthreads && gcu < ncu;
        double acc[W];
#pragma unroll
        for (int e = 0; e < W; ++e) acc[e] = 0.0;
        const int64_t i0 = c * rows_per_chunk;
        const int64_t i1 = n - i0 < rows_per_chunk ? n : i0 + rows_per_chunk;
        if (active && i0 + r < i1) {
            const int64_t off = (o * n + i0 + r) * inner + gcu * W;
            const T *pa = a + off, *pb = b + off;
            const int64_t step = (int64_t)rthreads * inner; /* elements between a thread's rows */
            const int64_t cnt = (i1 - i0 - r + rthreads - 1) / rthreads;
            int64_t k = 0;
            for (; k + AUTO_UNROLL <= cnt; k += AUTO_UNROLL) {
                raw x[AUTO_UNROLL], y[AUTO_UNROLL];
#pragma unroll
                for (int q = 0; q < AUTO_UNROLL; ++q) {
                    x[q] = io::load(pa + q * step, 0);
                    y[q] = io::load(pb + q * step, 0);
                }
                A d[AUTO_UNROLL][W];
#pragma unroll
                for (int q = 0; q < AUTO_UNROLL; ++q) io::diffs(x[q], y[q], d[q]);
#pragma unroll
                for (int e = 0; e < W; ++e)
                    acc[e] += (double)((d[0][e] * d[0][e] + d[1][e] * d[1][e]) +
                                       (d[2][e] * d[2][e] + d[3][e] * d[3][e]));
                pa += AUTO_UNROLL * step;
                pb += AUTO_UNROLL * step;
            }
            if (k < cnt) {
                /* the last rows, fewer than AUTO_UNROLL: their loads issued at once, absent ones zero */
                raw x[AUTO_UNROLL], y[AUTO_UNROLL];
#pragma unroll
                for (int q = 0; q < AUTO_UNROLL; ++q) {
                    const bool in = k + q < cnt;
                    x[q] = in ? io::load(pa + q * step, 0) : io::zero();
                    y[q] = in ? io::load(pb + q * step, 0) : io::zero();
                }
                A d[AUTO_UNROLL][W];
#pragma unroll
                for (int q = 0; q < AUTO_UNROLL; ++q) io::diffs(x[q], y[q], d[q]);
#pragma unroll
                for (int e = 0; e < W; ++e)
                    acc[e] += (double)((d[0][e] * d[0][e] + d[1][e] * d[1][e]) +
                                       (d[2][e] * d[2][e] + d[3][e] * d[3][e]));
            }
        }
        /* sum the rthreads rows of each column unit in a fixed order, then write one result per
         * (column unit, element): thread q of the block takes q = cv * W + e, so the writes of
         * consecutive threads are consecutive batches */
        const int64_t first = o * inner + t * wc * W; /* the tile's first batch */
        const int64_t left = (ncu - t * wc) * W;      /* batches from there to the slab's last unit */
        if (rthreads == 1) {
            if (r == 0 && gcu < ncu) {
#pragma unroll
                for (int e = 0; e < W; ++e) {
                    const int64_t batch = first + cv * W + e;
                    if (chunks == 1)
                        out[batch] = finish_double<out_t<T>>(acc[e], n);
                    else
                        partial[batch * chunks + c] = acc[e];
                }
            }
            continue;
        }
        if (shuffle_rows) {
            /* wc divides 32: lanes l, l + wc, ... of a warp hold the same column unit */
            for (int off = 16; off >= wc; off >>= 1) {
#pragma unroll
                for (int e = 0; e < W; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], off);
            }
            __syncthreads(); /* the previous unit's readers of sh are done */
            if (lane < wc) {
#pragma unroll
                for (int e = 0; e < W; ++e) sh[(warp * wc + lane) * W + e] = acc[e];
            }
            __syncthreads();
        } else {
            __syncthreads(); /* the previous unit's readers of sh are done */
            if (r < rthreads) {
#pragma unroll
                for (int e = 0; e < W; ++e) sh[(r * wc + cv) * W + e] = acc[e];
            }
            __syncthreads();
            for (int s = top >> 1; s > 0; s >>= 1) {
                if (r < s && r + s < rthreads) {
#pragma unroll
                    for (int e = 0; e < W; ++e) sh[(r * wc + cv) * W + e] += sh[((r + s) * wc + cv) * W + e];
                }
                __syncthreads();
            }
        }
        for (int q = threadIdx.x; q < wc * W && q < left; q += AUTO_BLOCK) {
            double v = sh[q];
            if (shuffle_rows) {
                for (int w = 1; w < AUTO_BLOCK / 32; ++w) v += sh[w * wc * W + q];
            }
            if (chunks == 1)
                out[first + q] = finish_double<out_t<T>>(v, n);
            else
                partial[(first + q) * chunks + c] = v;
        }
    }
}

/* inner > 1 with few rows (n <= short_cols_limit<T>()), 16-byte column units, a, b and out
 * 16-byte aligned: each thread takes U column units AUTO_BLOCK apart (unit U of all outer x ncu,
 * so consecutive threads read consecutive memory) and reads every row of each, R = AUTO_UNROLL / U
 * rows a step, so that AUTO_UNROLL loads of each input are in flight whatever U is; it adds the n
 * squares per element in the arithmetic type in row order (the same bits for every U); its W
 * results per unit go out as 16-byte stores. U = 4 reads one row a step (the form measured in
 * RMSE_NOTES.md); U = 1 and 2 start 4x and 2x the blocks, for shapes where U = 4 would leave
 * the GPU under two waves (auto_shortcols). The cols kernel would give each thread one unit and
 * a block reduction over row threads, too few loads in flight for these shapes.
 * SPLIT (float sums, n > AUTO_SHORT_COLS_SPLIT): each run of AUTO_SHORT_COLS_SPLIT rows is summed
 * alone in row order and the runs' sums are added in order, so a float sum of n squares errs by
 * at most (31 + n / 32) float epsilons instead of n - 1 (RMSE_NOTES.md); with one run (n <= 32)
 * it is the plain kernel's sum plus zero, the same bits. */
template <typename T, int U, bool SPLIT>
__global__ void __launch_bounds__(AUTO_BLOCK, SPLIT && U < 4 ? 3 : U == 4 ? 0 : 1)
rmse_auto_shortcols_kernel(const T *a, const T *b, out_t<T> *out, int64_t outer, int64_t n, int64_t inner,
                           int64_t ncu, int64_t prefetch_blocks)
{
    typedef unit_io<T, true> io;
    typedef acc_t<T> A;
    typedef out_t<T> O;
    enum { W = io::W, R = AUTO_UNROLL / U, SPAN = AUTO_BLOCK * U };
    static_assert(U * R == AUTO_UNROLL, "U units x R rows = AUTO_UNROLL loads of each input a step");
    static_assert(AUTO_SHORT_COLS_SPLIT % R == 0, "a run of rows is whole steps");
    const int64_t units = outer * ncu;
    int64_t base = (int64_t)blockIdx.x * SPAN + threadIdx.x;
    if ((int64_t)blockIdx.x < prefetch_blocks && base < units) {
        const int64_t o = outer == 1 ? 0 : base / ncu, off = (o * n) * inner + (base - o * ncu) * W;
        prefetch_unit<T, true>(a + off, 0, true);
        prefetch_unit<T, true>(b + off, 0, true);
    }
    pdl_wait();
    pdl_launch_dependents();
    for (; base < units; base += (int64_t)gridDim.x * SPAN) {
        int64_t off[U];
        bool in[U];
        A acc[U][W], tot[U][W];   /* tot: SPLIT's sum of the runs (unused otherwise) */
#pragma unroll
        for (int r = 0; r < U; ++r) {
            const int64_t u = base + r * AUTO_BLOCK;
            in[r] = u < units;
            const int64_t o = outer == 1 || !in[r] ? 0 : u / ncu;
            off[r] = (o * n) * inner + (u - o * ncu) * W;
#pragma unroll
            for (int e = 0; e < W; ++e) acc[r][e] = tot[r][e] = A(0);
        }
        int64_t i = 0;
        for (;;) {
            const int64_t stop = SPLIT && i + AUTO_SHORT_COLS_SPLIT < n ? i + AUTO_SHORT_COLS_SPLIT : n;
            for (; i + R <= stop; i += R) {   /* R rows of U units: all loads, then the adds in row order */
                uint4 x[R][U], y[R][U];
#pragma unroll
                for (int q = 0; q < R; ++q)
#pragma unroll
                    for (int r = 0; r < U; ++r) {
                        x[q][r] = in[r] ? io::load(a + off[r] + (i + q) * inner, 0) : io::zero();
                        y[q][r] = in[r] ? io::load(b + off[r] + (i + q) * inner, 0) : io::zero();
                    }
#pragma unroll
                for (int q = 0; q < R; ++q)
#pragma unroll
                    for (int r = 0; r < U; ++r) {
                        A d[W];
                        io::diffs(x[q][r], y[q][r], d);
#pragma unroll
                        for (int e = 0; e < W; ++e) acc[r][e] += d[e] * d[e];
                    }
            }
            if (R > 1)
                for (; i < stop; ++i)   /* the last n % R rows, one at a time */
#pragma unroll
                    for (int r = 0; r < U; ++r) {
                        A d[W];
                        io::diffs(in[r] ? io::load(a + off[r] + i * inner, 0) : io::zero(),
                                  in[r] ? io::load(b + off[r] + i * inner, 0) : io::zero(), d);
#pragma unroll
                        for (int e = 0; e < W; ++e) acc[r][e] += d[e] * d[e];
                    }
            if constexpr (SPLIT) {
#pragma unroll
                for (int r = 0; r < U; ++r)
#pragma unroll
                    for (int e = 0; e < W; ++e) {   /* the run's sum into the total, in run order */
                        tot[r][e] += acc[r][e];
                        acc[r][e] = A(0);
                    }
                if (i >= n) break;
            } else {
                break;
            }
        }
#pragma unroll
        for (int r = 0; r < U; ++r) {
            const int64_t u = base + r * AUTO_BLOCK;
            if (in[r]) {
                const int64_t o = outer == 1 ? 0 : u / ncu;
                __align__(16) O res[W];
#pragma unroll
                for (int e = 0; e < W; ++e) res[e] = finish_o(SPLIT ? tot[r][e] : acc[r][e], n);
                uint4 *dst = reinterpret_cast<uint4 *>(out + o * inner + (u - o * ncu) * W);
#pragma unroll
                for (int h = 0; h < (int)(W * sizeof(O) / 16); ++h) dst[h] = reinterpret_cast<const uint4 *>(res)[h];
            }
        }
    }
}

/* Combine: out[k] = sqrt(sum_c partial[k * chunks + c] / n), the sum in a fixed order.
 * Group version: G = 2^glog lanes (1..32) per batch, lane l adds c = l, l + G, ... in order. */
template <typename O>
__global__ void __launch_bounds__(AUTO_BLOCK)
rmse_auto_combine_group_kernel(const double *partial, O *out, int64_t batches, int64_t chunks,
                               int64_t n, int glog)
{
    const int G = 1 << glog;
    pdl_wait();
    const int lane = threadIdx.x & (G - 1);
    const int per_warp = 32 >> glog;
    const int64_t warp_id = (int64_t)blockIdx.x * (AUTO_BLOCK / 32) + (threadIdx.x >> 5);
    const int64_t warp_stride = (int64_t)gridDim.x * (AUTO_BLOCK / 32) * per_warp;
    for (int64_t wbase = warp_id * per_warp; wbase < batches; wbase += warp_stride) {
        const int64_t bt = wbase + ((threadIdx.x & 31) >> glog);
        double s = 0.0;
        if (bt < batches) {
            const double *p = partial + bt * chunks;
#pragma unroll 4
            for (int64_t c = lane; c < chunks; c += G) s += p[c];
        }
        for (int off = G >> 1; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (bt < batches && lane == 0) out[bt] = finish_double<O>(s, n);
    }
}

/* Block version, for many chunks: thread t adds c = t, t + 256, ... in order, then block_sum. */
template <typename O>
__global__ void __launch_bounds__(AUTO_BLOCK)
rmse_auto_combine_block_kernel(const double *partial, O *out, int64_t batches, int64_t chunks,
                               int64_t n)
{
    pdl_wait();
    for (int64_t bt = blockIdx.x; bt < batches; bt += gridDim.x) {
        const double *p = partial + bt * chunks;
        double s = 0.0;
#pragma unroll 4
        for (int64_t c = threadIdx.x; c < chunks; c += AUTO_BLOCK) s += p[c];
        s = block_sum<double, AUTO_BLOCK>(s);
        if (threadIdx.x == 0) out[bt] = finish_double<O>(s, n);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Launchers
 * ------------------------------------------------------------------------------------------- */
template <typename O>
static int fill_nan(O *out, int64_t batches, cudaStream_t s)
{
    rmse_fill_nan_kernel<O><<<(unsigned)min64(cdiv(batches, 256), 65535), 256, 0, s>>>(out, batches);
    return (int)cudaGetLastError();
}

/* 6 auto */
/* Launch kernel on grid x AUTO_BLOCK, as a programmatic dependent of the previous work in s when
 * pdl is true. */
template <int NT = AUTO_BLOCK, typename K, typename... A>
static int launch_auto_kernel(K kernel, int64_t grid, bool pdl, cudaStream_t s, const A &...args)
{
    const cudaError_t err = pdl_launch(kernel, dim3((unsigned)grid), dim3(NT), 0, s, pdl, args...);
    return err != cudaSuccess ? (int)err : (int)cudaGetLastError();
}

template <typename O>
static int launch_combine(const double *partial, O *out, int64_t batches, int64_t chunks, int64_t n,
                          int dev, cudaStream_t s)
{
    const bool pdl = ewcuda_pdl_active(dev);
    if (chunks >= 128)
        return launch_auto_kernel(rmse_auto_combine_block_kernel<O>, min64(batches, GRID_CAP), pdl, s, partial, out,
                                  batches, chunks, n);
    const int glog = ilog2_ceil(min64(32, max64(1, cdiv(chunks, 4))));
    const int64_t per_block = AUTO_BLOCK >> glog;
    return launch_auto_kernel(rmse_auto_combine_group_kernel<O>, min64(cdiv(batches, per_block), GRID_CAP), pdl, s,
                              partial, out, batches, chunks, n, glog);
}

/* Rows of at most this many elements take the short kernel when a and b are 16-byte aligned.
 * EWKERN_RMSE_SHORT_N=<n> in the environment (read once) moves the limit: a knob for measuring
 * the rule, not for users (0 turns the short kernel off). */
static int64_t short_limit()
{
    static const int64_t v = [] {
        const char *e = getenv("EWKERN_RMSE_SHORT_N");
        return e ? (int64_t)atoll(e) : (int64_t)AUTO_SHORT_N;
    }();
    return v;
}

static inline int64_t gcd64(int64_t x, int64_t y)
{
    while (y) {
        const int64_t t = x % y;
        x = y;
        y = t;
    }
    return x;
}

/* Whole rows per tile of the short kernel: as many as fit AUTO_BLOCK * AUTO_UNROLL vectors, a
 * multiple of q so that tb * n * sizeof(T) is a multiple of 16 (at least q when n <= 64 * W). */
template <typename T>
static inline int64_t short_tile_rows(int64_t n)
{
    const int64_t q = 16 / gcd64(n * (int64_t)sizeof(T), 16);
    return (int64_t)AUTO_BLOCK * AUTO_UNROLL * vec16<T>::W / n / q * q;
}

template <typename T>
static int auto_short(const T *a, const T *b, out_t<T> *out, int64_t batches, int64_t n, int64_t tb, int dev,
                      cudaStream_t s)
{
    /* lanes per batch: the fewest powers of two that leave each at most 8 squares to add */
    const int glog = ilog2_ceil(min64(32, max64(1, cdiv(n, 8))));
    const int64_t tiles = cdiv(batches, tb);
    const bool pdl = ewcuda_pdl_active(dev);
    static std::atomic<int> occ[kMaxCachedDevices];
    const int64_t wave = wave_blocks(occ, (const void *)rmse_auto_short_kernel<T>, AUTO_BLOCK, dev);
    return launch_auto_kernel(rmse_auto_short_kernel<T>, min64(tiles, GRID_CAP), pdl, s, a, b, out, batches, (int)n,
                              (int)tb, glog, tiles, pdl ? wave : (int64_t)0);
}

template <typename T, bool VEC>
static int auto_rows(const T *a, const T *b, out_t<T> *out, int64_t batches, int64_t n, int dev,
                     cudaStream_t s)
{
    enum { W = unit_io<T, VEC>::W };
    /* (a tile holds at least 16 rows of up to 64 * W elements); fewer tiles than
     * AUTO_SHORT_MIN_BLOCKS would leave SMs idle: the group kernel then */
    if (VEC && n <= min64(short_limit(), 64 * W) && (((uintptr_t)a | (uintptr_t)b) & 15u) == 0) {
        const int64_t tb = short_tile_rows<T>(n);
        if (cdiv(batches, tb) >= AUTO_SHORT_MIN_BLOCKS)
            return auto_short<T>(a, b, out, batches, n, tb, dev, s);
    }
    const int64_t units_per_batch = n / W;
    if (units_per_batch <= AUTO_SMALL_UNITS) {
        /* about AUTO_UNROLL vectors per lane (one unrolled step), 2 for tiny batches: more lanes
         * and blocks, so the last wave of blocks is a smaller share of the work */
        const int per_lane = units_per_batch <= AUTO_TINY_UNITS ? 2 : AUTO_UNROLL;
        const int glog = ilog2_ceil(min64(32, max64(1, cdiv(units_per_batch, per_lane))));
        const int64_t per_block = AUTO_BLOCK >> glog;
        const bool pdl = ewcuda_pdl_active(dev);
        /* between one and two waves of blocks: one wave, each block taking a second step (65536 x 64
         * f32 under PDL: 3086 GB/s against 2770 with 1.94 waves; 3.9 waves kept, 2591 against 2441) */
        static std::atomic<int> occ[kMaxCachedDevices];
        int64_t grid = min64(cdiv(batches, per_block), GRID_CAP);
        const int64_t wave = wave_blocks(occ, (const void *)rmse_auto_small_kernel<T, VEC>, AUTO_BLOCK, dev);
        if (grid > wave && grid <= 2 * wave) grid = wave;
        return launch_auto_kernel(rmse_auto_small_kernel<T, VEC>, grid, pdl, s, a, b, out, batches, n, glog, pdl);
    }
    const int64_t chunks = cdiv(units_per_batch, AUTO_CHUNK_UNITS);
    const int64_t units = batches * chunks;
    double *partial = NULL;
    if (chunks > 1) RMSE_TRY(cudaMallocAsync((void **)&partial, (size_t)units * sizeof(double), s));
    /* after a cudaMallocAsync the previous stream item is no kernel to overlap with: no PDL there
     * (a PDL launch measured 54 us instead of 46 at 16 x 2^20 under graph replay) */
    const bool pdl = chunks == 1 && ewcuda_pdl_active(dev);
    /* a one-chunk batch gets the fewest threads that still issue AUTO_UNROLL loads each: 64 up to
     * 256 vectors, 128 up to 512 (2048 x 2048 f32: 3127 GB/s against 2377 with 256 threads issuing
     * two loads each; 8192 x 1024: 3253 against the group kernel's 2819) */
    const int64_t grid = min64(units, GRID_CAP);
    int err;
    if (chunks == 1 && units_per_batch <= 64 * AUTO_UNROLL)
        err = launch_auto_kernel<64>(rmse_auto_rows_kernel<T, VEC, 64>, grid, pdl, s, a, b, out, partial, n, chunks,
                                     units, pdl);
    else if (chunks == 1 && units_per_batch <= 128 * AUTO_UNROLL)
        err = launch_auto_kernel<128>(rmse_auto_rows_kernel<T, VEC, 128>, grid, pdl, s, a, b, out, partial, n, chunks,
                                      units, pdl);
    else
        err = launch_auto_kernel(rmse_auto_rows_kernel<T, VEC>, grid, pdl, s, a, b, out, partial, n, chunks, units,
                                 pdl);
    if (chunks > 1) {
        if (!err) err = launch_combine<out_t<T>>(partial, out, batches, chunks, n, dev, s);
        cudaError_t ferr = cudaFreeAsync(partial, s);
        if (!err) err = (int)ferr;
    }
    return err;
}

template <typename T, bool VEC>
static int auto_cols(const T *a, const T *b, out_t<T> *out, int64_t outer, int64_t n, int64_t inner,
                     int dev, cudaStream_t s)
{
    enum { W = unit_io<T, VEC>::W };
    const int64_t ncu = inner / W;                         /* column units of a row */
    int wc = (int)min64(ncu, AUTO_BLOCK);                  /* column units per block */
    /* Fewer columns per block, more rows, while there are fewer than AUTO_TARGET_CHUNKS blocks and
     * each thread keeps AUTO_UNROLL rows: blocks then add more rows before writing partials, so a
     * shape needs fewer row chunks, fewer partials and often no combine launch. A block keeps at
     * least 128 bytes of each row it reads (and AUTO_COL_MIN_WC units). */
    const int min_wc = (int)max64(AUTO_COL_MIN_WC, 128 / (W * (int64_t)sizeof(T)));
    while ((wc & (wc - 1)) == 0 && wc > min_wc && outer * cdiv(ncu, wc) < AUTO_TARGET_CHUNKS &&
           n >= (int64_t)(AUTO_BLOCK / (wc / 2)) * AUTO_UNROLL)
        wc /= 2;
    const int64_t rthreads = AUTO_BLOCK / wc;              /* rows read at once per block */
    const int64_t tiles = cdiv(ncu, wc);
    const int64_t base = outer * tiles;                    /* blocks of work before splitting rows */
    const int64_t most = max64(1, cdiv(n, rthreads * AUTO_COL_ROWS));
    int64_t chunks = min64(max64(1, cdiv(AUTO_TARGET_CHUNKS, base)), most);
    int64_t rows_per_chunk = cdiv(n, chunks);
    rows_per_chunk = cdiv(rows_per_chunk, rthreads * AUTO_UNROLL) * rthreads * AUTO_UNROLL;
    chunks = cdiv(n, rows_per_chunk);
    const int64_t units = base * chunks;
    double *partial = NULL;
    if (chunks > 1)
        RMSE_TRY(cudaMallocAsync((void **)&partial, (size_t)(outer * inner * chunks) * sizeof(double), s));
    const bool pdl = chunks == 1 && ewcuda_pdl_active(dev);
    int err = launch_auto_kernel(rmse_auto_cols_kernel<T, VEC>, min64(units, GRID_CAP), pdl, s, a, b, out, partial,
                                 n, inner, ncu, wc, tiles, chunks, rows_per_chunk, units);
    if (chunks > 1) {
        if (!err) err = launch_combine<out_t<T>>(partial, out, outer * inner, chunks, n, dev, s);
        cudaError_t ferr = cudaFreeAsync(partial, s);
        if (!err) err = (int)ferr;
    }
    return err;
}

/* Batch-last shapes with at most this many rows take the shortcols kernel (16-byte units, out
 * aligned; a grid shortcols_grid allows), measured on the H100 and the H200
 * (rmse_grid, batch-last, >= 32 MiB, the limit moved by the knob below; RMSE_NOTES.md, "Past 32
 * rows"): float32 up to 32 rows (2^20 x 16 / 32 rows 1.01-1.02 -> 1.08-1.12 / 0.97-1.00 ->
 * 1.03-1.06 of torch.dot, 2^22 x 16 0.96-0.97 -> 0.98-1.00), not 64 (2^22 x 64: 0.98-0.99 ->
 * 0.91-0.96 with the SPLIT form at 4 units a thread); 16-bit inputs up to 256 rows, past 32 in the
 * SPLIT form (2^20 x 64: 0.89-0.97 -> 1.09-1.23; 2^22 x 64: 1.07-1.15 -> 1.09-1.22; 2^20 x 256
 * 1.08-1.15 -> 1.08-1.20; its float sums of 256 squares err by at most 39 epsilons); float64 up to
 * 8 rows (not measured past that: rmse_grid has no float64).
 * EWKERN_RMSE_SHORT_COLS_N=<n> (read once) sets all three limits: a knob for measuring the rule,
 * not for users (0 turns the kernel off). */
template <typename T>
static int64_t short_cols_limit()
{
    static const int64_t env = [] {
        const char *e = getenv("EWKERN_RMSE_SHORT_COLS_N");
        return e ? (int64_t)atoll(e) : (int64_t)-1;
    }();
    if (env >= 0) return env;
    return sizeof(T) == 2 ? (int64_t)AUTO_SHORT_COLS_N16 : sizeof(T) == 4 ? (int64_t)AUTO_SHORT_COLS_N32
                                                                           : (int64_t)AUTO_SHORT_COLS_N;
}

/* Whether a batch-last shape of n rows whose column units fill `blocks` blocks of AUTO_BLOCK x
 * AUTO_UNROLL units takes the shortcols kernel (n already within short_cols_limit): from
 * AUTO_SHORT_MIN_BLOCKS blocks at any n; for float32 and 16-bit inputs (`few`: the dtypes
 * measured) also from 32 at up to 32 rows and from 8 at up to 16 rows. Each
 * thread walks its columns' n rows, so a small grid with many rows leaves too few loads in
 * flight; the cols kernel splits the rows across blocks instead. Measured on the H200 (ff180f8,
 * rmse_grid batch-last <= 32 MiB, the floor moved by the knob below; RMSE_NOTES.md, "The
 * shortcols kernel on small grids"): at 2^18 16-bit batches (32 blocks) of 2-32 rows 5.0-14.8 ->
 * 2.3-10.6 us, float32 (64 blocks) of 2-16 rows 3.8-14.5 -> 2.7-9.4 us; at 2^16 16-bit batches
 * (8 blocks) of 4-16 rows 3.6-4.9 -> 2.1-4.3 us, but 32 / 64 rows 4.6 / 7.8 -> 7.0 / 12.6 us.
 * The choice depends on the shape alone, and with it the sum order.
 * EWKERN_RMSE_SHORT_MIN_BLOCKS=<n> (read once) replaces the rule by "at least n blocks": a knob
 * for measuring it, not for users. */
static bool shortcols_grid(int64_t blocks, int64_t n, bool few)
{
    static const int64_t knob = [] {
        const char *e = getenv("EWKERN_RMSE_SHORT_MIN_BLOCKS");
        const int64_t x = e ? (int64_t)atoll(e) : 0;
        return x > 0 ? x : (int64_t)0;
    }();
    if (knob) return blocks >= knob;
    return blocks >= AUTO_SHORT_MIN_BLOCKS || (few && ((blocks >= 32 && n <= 32) || (blocks >= 8 && n <= 16)));
}

/* Blocks of the shortcols kernel with U units a thread resident at once on device dev. */
template <typename T, int U, bool SPLIT>
static int64_t shortcols_wave(int dev)
{
    static std::atomic<int> occ[kMaxCachedDevices];
    return wave_blocks(occ, (const void *)rmse_auto_shortcols_kernel<T, U, SPLIT>, AUTO_BLOCK, dev);
}

/* The shortcols kernel with U units a thread: one unit per AUTO_BLOCK x U of them, its first wave
 * prefetching under PDL. */
template <typename T, int U, bool SPLIT>
static int launch_shortcols(const T *a, const T *b, out_t<T> *out, int64_t outer, int64_t n, int64_t inner,
                            int64_t ncu, int dev, cudaStream_t s)
{
    const bool pdl = ewcuda_pdl_active(dev);
    return launch_auto_kernel(rmse_auto_shortcols_kernel<T, U, SPLIT>,
                              min64(cdiv(outer * ncu, AUTO_BLOCK * U), GRID_CAP), pdl, s, a, b, out, outer, n,
                              inner, ncu, pdl ? shortcols_wave<T, U, SPLIT>(dev) : (int64_t)0);
}

/* Units per thread: 4 (one row a step) where that still starts two waves of the U = 4 kernel's
 * blocks on this device, else 2 where the U = 2 kernel's grid is two of its waves, else 1 (4 rows
 * a step, the most blocks). Each element's sum is in row order whatever U is, so the choice,
 * which depends on the device, changes no bits. */
template <typename T, bool SPLIT>
static int auto_shortcols_units(const T *a, const T *b, out_t<T> *out, int64_t outer, int64_t n, int64_t inner,
                                int dev, cudaStream_t s)
{
    const int64_t ncu = inner / vec16<T>::W, units = outer * ncu;
    if (cdiv(units, AUTO_BLOCK * 4) >= 2 * shortcols_wave<T, 4, SPLIT>(dev))
        return launch_shortcols<T, 4, SPLIT>(a, b, out, outer, n, inner, ncu, dev, s);
    if (cdiv(units, AUTO_BLOCK * 2) >= 2 * shortcols_wave<T, 2, SPLIT>(dev))
        return launch_shortcols<T, 2, SPLIT>(a, b, out, outer, n, inner, ncu, dev, s);
    return launch_shortcols<T, 1, SPLIT>(a, b, out, outer, n, inner, ncu, dev, s);
}

/* Float sums of more than AUTO_SHORT_COLS_SPLIT rows take the kernel that sums runs of rows
 * (SPLIT); double sums (float64) never need it. The choice depends on n alone: the bits on the
 * shape alone. */
template <typename T>
static int auto_shortcols(const T *a, const T *b, out_t<T> *out, int64_t outer, int64_t n, int64_t inner, int dev,
                          cudaStream_t s)
{
    if constexpr (sizeof(acc_t<T>) == 4) {
        if (n > AUTO_SHORT_COLS_SPLIT) return auto_shortcols_units<T, true>(a, b, out, outer, n, inner, dev, s);
    }
    return auto_shortcols_units<T, false>(a, b, out, outer, n, inner, dev, s);
}

template <typename T>
static int launch_auto(const void *p)
{
    const ew_rmse_args *args = (const ew_rmse_args *)p;
    const rmse_view v = view_of(p);
    typedef out_t<T> O;
    if (v.batches == 0) return 0;
    if (v.n == 0) return launch_fill_nan<O>((O *)v.out, v.batches, v.s);
    const T *a = (const T *)v.a, *b = (const T *)v.b;
    O *out = (O *)v.out;
    const uintptr_t ua = (uintptr_t)a, ub = (uintptr_t)b;
    /* n == 1 in any layout: batch k's one element is element k of a and b, and its result
     * sqrt(d^2 / 1) is elementwise. The shortcols kernel over a single row of all the batches does
     * that with 16-byte loads and stores (1, 2 or 4 units a thread by the grid), from one block up;
     * before, batch-first shapes took the short kernel, which stages each square through shared
     * memory, and batch-last ones under 128 blocks the cols kernel: 2^18-2^20 batches of one
     * element ran at 0.33-0.78 of torch.compile's one fused kernel (rmse_grid, H100 and H200). The
     * same bits: one square in the arithmetic type, then its square root rounded to the output
     * type (sqrtf, or sqrt in double then float as the cols kernel's finish_double: sqrt rounded
     * twice through double is correctly rounded in float). */
    if (v.n == 1 && ((ua | ub | (uintptr_t)out) & 15u) == 0 && v.batches % vec16<T>::W == 0)
        return auto_shortcols<T>(a, b, out, 1, 1, v.batches, args->device, v.s);
    if (args->inner == 1) {
        /* 16-byte loads need a and b equally aligned mod 16 (the head then aligns both) */
        if (((ua ^ ub) & 15u) == 0) return auto_rows<T, true>(a, b, out, v.batches, v.n, args->device, v.s);
        return auto_rows<T, false>(a, b, out, v.batches, v.n, args->device, v.s);
    }
    /* 16-byte column units need both bases aligned and whole vectors per row */
    if ((ua & 15u) == 0 && (ub & 15u) == 0 && args->inner % vec16<T>::W == 0) {
        if (v.n <= short_cols_limit<T>() && ((uintptr_t)out & 15u) == 0 &&
            shortcols_grid(cdiv(args->outer * (args->inner / vec16<T>::W), AUTO_BLOCK * AUTO_UNROLL), v.n,
                           sizeof(T) != 8))
            return auto_shortcols<T>(a, b, out, args->outer, v.n, args->inner, args->device, v.s);
        return auto_cols<T, true>(a, b, out, args->outer, v.n, args->inner, args->device, v.s);
    }
    return auto_cols<T, false>(a, b, out, args->outer, v.n, args->inner, args->device, v.s);
}

/* ---------------------------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------------------------- */
#define K_AUTO(T) rmse_auto_rows_kernel<T, true>

static const ew_kernel rmse_table[] = {
    RMSE_ROWS("auto", launch_auto, K_AUTO, 0u,
              "deterministic fixed-order partials, 16-byte loads, work split per shape, every layout"),
};

} /* namespace */

namespace ewk {
int rmse_fill_nan(float *out, int64_t batches, cudaStream_t s) { return fill_nan<float>(out, batches, s); }
int rmse_fill_nan(double *out, int64_t batches, cudaStream_t s) { return fill_nan<double>(out, batches, s); }
} /* namespace ewk */

extern "C" const ew_kernel *ew_cuda_rmse_auto_table(int *count)
{
    *count = (int)(sizeof(rmse_table) / sizeof(rmse_table[0]));
    return rmse_table;
}
