/*
 * elementwise.cu: every CUDA elementwise kernel of ewkern, one ladder of version families.
 *
 * Each family adds one idea over the one before; each row of the table at the bottom is one
 * (op, variant, dtype) with its launcher and main __global__ function. Time any row with the
 * benchmark (ewkern.bench: op, dtype, variant); registers and SASS notes are in ELEMENTWISE_NOTES.md.
 *
 *  1. naive    add f32: one thread does all the work (grid 1, block 1); C/R plain or __restrict__
 *              pointers, I/S int or size_t index, V1/V2/V4 access width, U1/U2/U4 unroll, N/T/M
 *              (scalar / float* addresses cast to a vector at each access / float2*, float4*
 *              pointers indexed in vectors).
 *              Rows: the 68 of add-kernel-experiments.md's naive table, "NaiveIV1U1NC" ... "NaiveSV4U4MR".
 *  2. tb       add f32: the same matrix spread over all threads, always __restrict__; traversal gs
 *              (grid-stride loop over a.grid blocks, default 2048 x 256) or mo (one thread per U*V
 *              elements, ceil(n / (U*V*block)) blocks). Rows: the paper's 68, "ThreadBlockIV1U1NRmo" ...
 *              "ThreadBlockSV4U4MRgs".
 *  3. pack     add in the f16x8 tutorial's steps, one thread per pack, grid ceil(n / pack / block):
 *              "f32", "f32x4" (float4); "f16", "f16x2" (half2 + __hadd2), "f16x8" (4 half2 loads,
 *              __hadd each), "f16x8pack" (one 128-bit load/store, 4 __hadd2); the same four for bf16.
 *  4. copy     the elementwise-ops study's copy loop (float32, bfloat16): "vec{1,2,4}_i{32,64}_grid{1,2}":
 *              elements per load, 32- or 64-bit loop index, grid1 = ceil(n / vec / block) or
 *              grid2 = min(grid1, SMs * threads_per_SM / block * 32 waves), grid-stride either way.
 *  5. auto     every op x every dtype, the fast default: 16-byte vectors, 1, 2 or 4 per thread
 *              (the fewest that let the grid fit one wave of resident blocks, from the device's SM
 *              count and the kernel's occupancy), every load issued before the first store, no
 *              loop, streaming stores (st.global.cs), the scalar head (up to the 16-byte boundary)
 *              and tail on otherwise idle threads, 32-bit index unless n is too large,
 *              programmatic dependent launch on sm_90+ (pdl.cuh) with the first vector's lines
 *              prefetched into L2 before the wait (then 1 or 2 vectors per thread, never 4);
 *              float16/bfloat16 computed in float32 (log through the SFU's log2), float64 in
 *              double. "auto_wb" (fill, copy, add, add_const, log, erf): the same
 *              with write-back stores. (Measured on the H100: see the notes.)
 *  6. grid1/grid2  log, erf, add_const (float32, bfloat16): a grid-stride body with one vector per
 *              thread under the study's two grid rules: grid1 = ceil(vectors / block), grid2 =
 *              min(grid1, SMs x threads_per_SM / block x 32 waves) from the device.
 *  7. bf16_fma add_const bfloat16 as __hfma2(x, 1, c) on bf16x2 pairs, c rounded to bfloat16 first.
 *
 * Every version is correct for any n >= 0 and any element-aligned pointers (out may equal an input):
 * vector paths peel a scalar head up to the alignment boundary when all pointers share one offset,
 * run a scalar tail, and fall back to scalar accesses when the offsets differ. Families with int
 * indices (I, pack, i32) cut arrays of 2^30 elements or more into launches of 2^30 elements.
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ewkern_kernels.h"
#include "device_cache.cuh"
#include "pdl.cuh"

namespace ewk {

#define EW_DEV __device__ __forceinline__

typedef __half half_t;
typedef __nv_bfloat16 bf16_t;

/* Launches of the 32-bit-index families cover at most this many elements (a multiple of 16, so
 * every chunk starts at the same alignment offset as the array). */
static const int64_t kChunk32 = int64_t(1) << 30;

/* ---------------------------------------------------------------------------------------------
 * Host helpers: grids from the device shape (device_cache.cuh), alignment, chunking.
 * ------------------------------------------------------------------------------------------- */

/* Blocks that fill the device `waves` times over: SMs x resident blocks per SM x waves. */
static int64_t wave_grid(const ew_args *a, int block, int waves)
{
    const DeviceShape d = device_shape(a->device);
    const int per_sm = d.threads_per_sm / block > 0 ? d.threads_per_sm / block : 1;
    return int64_t(d.sms) * per_sm * waves;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t clamp_grid(int64_t g) { return g < 1 ? 1 : (g > INT_MAX ? INT_MAX : g); }

/* Elements before the first `align`-byte boundary when every pointer has the same offset modulo
 * `align` (capped at n); -1 when the offsets differ (vector accesses impossible for all of them). */
static int64_t common_head(const void *const *ptrs, int np, int align, int esize, int64_t n)
{
    const uintptr_t off = reinterpret_cast<uintptr_t>(ptrs[0]) % uintptr_t(align);
    for (int i = 1; i < np; ++i)
        if (reinterpret_cast<uintptr_t>(ptrs[i]) % uintptr_t(align) != off)
            return -1;
    const int64_t head = int64_t((uintptr_t(align) - off) % uintptr_t(align)) / esize;
    return head < n ? head : n;
}

static cudaStream_t stream_of(const ew_args *a) { return static_cast<cudaStream_t>(a->stream); }

/* Calls f(offset, count) for consecutive pieces of at most `chunk` elements; stops at the first
 * launch error and returns it (cudaGetLastError after each launch). */
template <class F>
static int for_chunks(int64_t n, int64_t chunk, F f)
{
    for (int64_t off = 0; off < n; off += chunk) {
        f(off, n - off < chunk ? n - off : chunk);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return int(e);
    }
    return 0;
}

template <class T>
static const T *in_at(const ew_args *a, int k, int64_t off)
{
    return a->in[k] ? static_cast<const T *>(a->in[k]) + off : nullptr;
}
template <class T>
static T *out_at(const ew_args *a, int64_t off)
{
    return static_cast<T *>(a->out) + off;
}

/* ---------------------------------------------------------------------------------------------
 * 1-2. add-kernel-experiments.md: naive (one thread) and thread-block kernels, float32 add.
 * ------------------------------------------------------------------------------------------- */

enum Style { STYLE_N, STYLE_T, STYLE_M };

template <int V> struct FloatVec;
template <> struct FloatVec<1> { typedef float1 type; };
template <> struct FloatVec<2> { typedef float2 type; };
template <> struct FloatVec<4> { typedef float4 type; };

EW_DEV float1 vadd(float1 a, float1 b) { return make_float1(a.x + b.x); }
EW_DEV float2 vadd(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
EW_DEV float4 vadd(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

/* Chunk c: the U*V elements from head + c*U*V (V-aligned, since [0, head) reaches the boundary).
 * All loads of the chunk are issued before its stores, so the compiler may keep them in flight
 * even without __restrict__. */
template <class Idx, int V, int U, int S>
EW_DEV void add_chunk(const float *x, const float *y, float *z, Idx head, Idx c)
{
    typedef typename FloatVec<V>::type VT;
    if (S == STYLE_N) {
        /* N: plain float accesses (V1U1 only) */
        const Idx e = head + c;
        z[e] = x[e] + y[e];
    } else if (S == STYLE_T) {
        /* T: float* addresses in float units, each cast to a V-wide vector at the access
         * (the tutorial's FLOAT4(x[i]) idiom) */
        const Idx e = head + c * Idx(U * V);
        VT xr[U], yr[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            xr[k] = *reinterpret_cast<const VT *>(&x[e + Idx(k * V)]);
            yr[k] = *reinterpret_cast<const VT *>(&y[e + Idx(k * V)]);
        }
#pragma unroll
        for (int k = 0; k < U; ++k)
            *reinterpret_cast<VT *>(&z[e + Idx(k * V)]) = vadd(xr[k], yr[k]);
    } else {
        /* M: float1* / float2* / float4* pointers to the aligned part, indexed in vectors */
        const VT *xv = reinterpret_cast<const VT *>(x + head);
        const VT *yv = reinterpret_cast<const VT *>(y + head);
        VT *zv = reinterpret_cast<VT *>(z + head);
        const Idx j = c * Idx(U);
        VT xr[U], yr[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            xr[k] = xv[j + Idx(k)];
            yr[k] = yv[j + Idx(k)];
        }
#pragma unroll
        for (int k = 0; k < U; ++k)
            zv[j + Idx(k)] = vadd(xr[k], yr[k]);
    }
}

/* vec != 0: x, y, z share one offset modulo 4V bytes and [0, head) reaches the boundary. */
template <class Idx, int V, int U, int S>
EW_DEV void naive_add(const float *x, const float *y, float *z, Idx n, Idx head, int vec)
{
    if (!vec) {
        for (Idx i = 0; i < n; ++i)
            z[i] = x[i] + y[i];
        return;
    }
    const Idx W = Idx(U * V);
#pragma unroll 1
    for (Idx i = 0; i < head; ++i)
        z[i] = x[i] + y[i];
    const Idx nch = (n - head) / W;
    for (Idx c = 0; c < nch; ++c)
        add_chunk<Idx, V, U, S>(x, y, z, head, c);
#pragma unroll 1
    for (Idx i = head + nch * W; i < n; ++i)
        z[i] = x[i] + y[i];
}

template <class Idx, int V, int U, int S, bool MO>
EW_DEV void tb_add(const float *x, const float *y, float *z, Idx n, Idx head, int vec)
{
    const Idx W = Idx(U * V);
    const Idx tid = Idx(blockIdx.x) * Idx(blockDim.x) + Idx(threadIdx.x);
    const Idx nthr = Idx(gridDim.x) * Idx(blockDim.x);
    if (!vec) {
        /* Misaligned: the same traversal, each chunk element by element. */
        for (Idx i = tid * W; i < n; i += nthr * W) {
#pragma unroll
            for (int k = 0; k < U * V; ++k)
                if (i + Idx(k) < n)
                    z[i + k] = x[i + k] + y[i + k];
            if (MO)
                break;
        }
        return;
    }
#pragma unroll 1
    for (Idx i = tid; i < head; i += nthr)
        z[i] = x[i] + y[i];
    const Idx nch = (n - head) / W;
#pragma unroll 1
    for (Idx i = head + nch * W + tid; i < n; i += nthr)
        z[i] = x[i] + y[i];
    if (MO) {
        if (tid < nch)
            add_chunk<Idx, V, U, S>(x, y, z, head, tid);
    } else {
        for (Idx c = tid; c < nch; c += nthr)
            add_chunk<Idx, V, U, S>(x, y, z, head, c);
    }
}

#define EWK_IDX_I int
#define EWK_IDX_S size_t
#define EWK_PTRQ_C
#define EWK_PTRQ_R __restrict__
#define EWK_TRAV_mo true
#define EWK_TRAV_gs false

/* name, index (I int / S size_t), V, U, style (N/T/M), C/R: the paper's naive table, its order. */
#define EWK_NAIVE_LIST(X) \
    X(NaiveIV1U1NC, I, 1, 1, N, C) \
    X(NaiveIV1U1NR, I, 1, 1, N, R) \
    X(NaiveSV1U1NC, S, 1, 1, N, C) \
    X(NaiveSV1U1NR, S, 1, 1, N, R) \
    X(NaiveIV1U2TC, I, 1, 2, T, C) \
    X(NaiveIV1U2TR, I, 1, 2, T, R) \
    X(NaiveIV1U2MC, I, 1, 2, M, C) \
    X(NaiveIV1U2MR, I, 1, 2, M, R) \
    X(NaiveSV1U2TC, S, 1, 2, T, C) \
    X(NaiveSV1U2TR, S, 1, 2, T, R) \
    X(NaiveSV1U2MC, S, 1, 2, M, C) \
    X(NaiveSV1U2MR, S, 1, 2, M, R) \
    X(NaiveIV1U4TC, I, 1, 4, T, C) \
    X(NaiveIV1U4TR, I, 1, 4, T, R) \
    X(NaiveIV1U4MC, I, 1, 4, M, C) \
    X(NaiveIV1U4MR, I, 1, 4, M, R) \
    X(NaiveSV1U4TC, S, 1, 4, T, C) \
    X(NaiveSV1U4TR, S, 1, 4, T, R) \
    X(NaiveSV1U4MC, S, 1, 4, M, C) \
    X(NaiveSV1U4MR, S, 1, 4, M, R) \
    X(NaiveIV2U1TC, I, 2, 1, T, C) \
    X(NaiveIV2U1TR, I, 2, 1, T, R) \
    X(NaiveIV2U1MC, I, 2, 1, M, C) \
    X(NaiveIV2U1MR, I, 2, 1, M, R) \
    X(NaiveSV2U1TC, S, 2, 1, T, C) \
    X(NaiveSV2U1TR, S, 2, 1, T, R) \
    X(NaiveSV2U1MC, S, 2, 1, M, C) \
    X(NaiveSV2U1MR, S, 2, 1, M, R) \
    X(NaiveIV2U2TC, I, 2, 2, T, C) \
    X(NaiveIV2U2TR, I, 2, 2, T, R) \
    X(NaiveIV2U2MC, I, 2, 2, M, C) \
    X(NaiveIV2U2MR, I, 2, 2, M, R) \
    X(NaiveSV2U2TC, S, 2, 2, T, C) \
    X(NaiveSV2U2TR, S, 2, 2, T, R) \
    X(NaiveSV2U2MC, S, 2, 2, M, C) \
    X(NaiveSV2U2MR, S, 2, 2, M, R) \
    X(NaiveIV2U4TC, I, 2, 4, T, C) \
    X(NaiveIV2U4TR, I, 2, 4, T, R) \
    X(NaiveIV2U4MC, I, 2, 4, M, C) \
    X(NaiveIV2U4MR, I, 2, 4, M, R) \
    X(NaiveSV2U4TC, S, 2, 4, T, C) \
    X(NaiveSV2U4TR, S, 2, 4, T, R) \
    X(NaiveSV2U4MC, S, 2, 4, M, C) \
    X(NaiveSV2U4MR, S, 2, 4, M, R) \
    X(NaiveIV4U1TC, I, 4, 1, T, C) \
    X(NaiveIV4U1TR, I, 4, 1, T, R) \
    X(NaiveIV4U1MC, I, 4, 1, M, C) \
    X(NaiveIV4U1MR, I, 4, 1, M, R) \
    X(NaiveSV4U1TC, S, 4, 1, T, C) \
    X(NaiveSV4U1TR, S, 4, 1, T, R) \
    X(NaiveSV4U1MC, S, 4, 1, M, C) \
    X(NaiveSV4U1MR, S, 4, 1, M, R) \
    X(NaiveIV4U2TC, I, 4, 2, T, C) \
    X(NaiveIV4U2TR, I, 4, 2, T, R) \
    X(NaiveIV4U2MC, I, 4, 2, M, C) \
    X(NaiveIV4U2MR, I, 4, 2, M, R) \
    X(NaiveSV4U2TC, S, 4, 2, T, C) \
    X(NaiveSV4U2TR, S, 4, 2, T, R) \
    X(NaiveSV4U2MC, S, 4, 2, M, C) \
    X(NaiveSV4U2MR, S, 4, 2, M, R) \
    X(NaiveIV4U4TC, I, 4, 4, T, C) \
    X(NaiveIV4U4TR, I, 4, 4, T, R) \
    X(NaiveIV4U4MC, I, 4, 4, M, C) \
    X(NaiveIV4U4MR, I, 4, 4, M, R) \
    X(NaiveSV4U4TC, S, 4, 4, T, C) \
    X(NaiveSV4U4TR, S, 4, 4, T, R) \
    X(NaiveSV4U4MC, S, 4, 4, M, C) \
    X(NaiveSV4U4MR, S, 4, 4, M, R)

/* name, index, V, U, style, traversal (mo / gs): the paper's thread-block tables, their order. */
#define EWK_TB_LIST(X) \
    X(ThreadBlockIV1U1NRmo, I, 1, 1, N, mo) \
    X(ThreadBlockIV1U1NRgs, I, 1, 1, N, gs) \
    X(ThreadBlockSV1U1NRmo, S, 1, 1, N, mo) \
    X(ThreadBlockSV1U1NRgs, S, 1, 1, N, gs) \
    X(ThreadBlockIV1U2TRmo, I, 1, 2, T, mo) \
    X(ThreadBlockIV1U2TRgs, I, 1, 2, T, gs) \
    X(ThreadBlockIV1U2MRmo, I, 1, 2, M, mo) \
    X(ThreadBlockIV1U2MRgs, I, 1, 2, M, gs) \
    X(ThreadBlockSV1U2TRmo, S, 1, 2, T, mo) \
    X(ThreadBlockSV1U2TRgs, S, 1, 2, T, gs) \
    X(ThreadBlockSV1U2MRmo, S, 1, 2, M, mo) \
    X(ThreadBlockSV1U2MRgs, S, 1, 2, M, gs) \
    X(ThreadBlockIV1U4TRmo, I, 1, 4, T, mo) \
    X(ThreadBlockIV1U4TRgs, I, 1, 4, T, gs) \
    X(ThreadBlockIV1U4MRmo, I, 1, 4, M, mo) \
    X(ThreadBlockIV1U4MRgs, I, 1, 4, M, gs) \
    X(ThreadBlockSV1U4TRmo, S, 1, 4, T, mo) \
    X(ThreadBlockSV1U4TRgs, S, 1, 4, T, gs) \
    X(ThreadBlockSV1U4MRmo, S, 1, 4, M, mo) \
    X(ThreadBlockSV1U4MRgs, S, 1, 4, M, gs) \
    X(ThreadBlockIV2U1TRmo, I, 2, 1, T, mo) \
    X(ThreadBlockIV2U1TRgs, I, 2, 1, T, gs) \
    X(ThreadBlockIV2U1MRmo, I, 2, 1, M, mo) \
    X(ThreadBlockIV2U1MRgs, I, 2, 1, M, gs) \
    X(ThreadBlockSV2U1TRmo, S, 2, 1, T, mo) \
    X(ThreadBlockSV2U1TRgs, S, 2, 1, T, gs) \
    X(ThreadBlockSV2U1MRmo, S, 2, 1, M, mo) \
    X(ThreadBlockSV2U1MRgs, S, 2, 1, M, gs) \
    X(ThreadBlockIV2U2TRmo, I, 2, 2, T, mo) \
    X(ThreadBlockIV2U2TRgs, I, 2, 2, T, gs) \
    X(ThreadBlockIV2U2MRmo, I, 2, 2, M, mo) \
    X(ThreadBlockIV2U2MRgs, I, 2, 2, M, gs) \
    X(ThreadBlockSV2U2TRmo, S, 2, 2, T, mo) \
    X(ThreadBlockSV2U2TRgs, S, 2, 2, T, gs) \
    X(ThreadBlockSV2U2MRmo, S, 2, 2, M, mo) \
    X(ThreadBlockSV2U2MRgs, S, 2, 2, M, gs) \
    X(ThreadBlockIV2U4TRmo, I, 2, 4, T, mo) \
    X(ThreadBlockIV2U4TRgs, I, 2, 4, T, gs) \
    X(ThreadBlockIV2U4MRmo, I, 2, 4, M, mo) \
    X(ThreadBlockIV2U4MRgs, I, 2, 4, M, gs) \
    X(ThreadBlockSV2U4TRmo, S, 2, 4, T, mo) \
    X(ThreadBlockSV2U4TRgs, S, 2, 4, T, gs) \
    X(ThreadBlockSV2U4MRmo, S, 2, 4, M, mo) \
    X(ThreadBlockSV2U4MRgs, S, 2, 4, M, gs) \
    X(ThreadBlockIV4U1TRmo, I, 4, 1, T, mo) \
    X(ThreadBlockIV4U1TRgs, I, 4, 1, T, gs) \
    X(ThreadBlockIV4U1MRmo, I, 4, 1, M, mo) \
    X(ThreadBlockIV4U1MRgs, I, 4, 1, M, gs) \
    X(ThreadBlockSV4U1TRmo, S, 4, 1, T, mo) \
    X(ThreadBlockSV4U1TRgs, S, 4, 1, T, gs) \
    X(ThreadBlockSV4U1MRmo, S, 4, 1, M, mo) \
    X(ThreadBlockSV4U1MRgs, S, 4, 1, M, gs) \
    X(ThreadBlockIV4U2TRmo, I, 4, 2, T, mo) \
    X(ThreadBlockIV4U2TRgs, I, 4, 2, T, gs) \
    X(ThreadBlockIV4U2MRmo, I, 4, 2, M, mo) \
    X(ThreadBlockIV4U2MRgs, I, 4, 2, M, gs) \
    X(ThreadBlockSV4U2TRmo, S, 4, 2, T, mo) \
    X(ThreadBlockSV4U2TRgs, S, 4, 2, T, gs) \
    X(ThreadBlockSV4U2MRmo, S, 4, 2, M, mo) \
    X(ThreadBlockSV4U2MRgs, S, 4, 2, M, gs) \
    X(ThreadBlockIV4U4TRmo, I, 4, 4, T, mo) \
    X(ThreadBlockIV4U4TRgs, I, 4, 4, T, gs) \
    X(ThreadBlockIV4U4MRmo, I, 4, 4, M, mo) \
    X(ThreadBlockIV4U4MRgs, I, 4, 4, M, gs) \
    X(ThreadBlockSV4U4TRmo, S, 4, 4, T, mo) \
    X(ThreadBlockSV4U4TRgs, S, 4, 4, T, gs) \
    X(ThreadBlockSV4U4MRmo, S, 4, 4, M, mo) \
    X(ThreadBlockSV4U4MRgs, S, 4, 4, M, gs)

#define EWK_NAIVE_KERNEL(NAME, I, V, U, S, R) \
    __global__ void add_##NAME(const float *EWK_PTRQ_##R x, const float *EWK_PTRQ_##R y, \
                               float *EWK_PTRQ_##R z, EWK_IDX_##I n, EWK_IDX_##I head, int vec) \
    { \
        naive_add<EWK_IDX_##I, V, U, STYLE_##S>(x, y, z, n, head, vec); \
    }
EWK_NAIVE_LIST(EWK_NAIVE_KERNEL)

#define EWK_TB_KERNEL(NAME, I, V, U, S, TR) \
    __global__ void add_##NAME(const float *__restrict__ x, const float *__restrict__ y, \
                               float *__restrict__ z, EWK_IDX_##I n, EWK_IDX_##I head, int vec) \
    { \
        tb_add<EWK_IDX_##I, V, U, STYLE_##S, EWK_TRAV_##TR>(x, y, z, n, head, vec); \
    }
EWK_TB_LIST(EWK_TB_KERNEL)

/* Offsets and head of one piece of an add launch, for V-wide accesses. */
struct AddPiece {
    const float *x, *y;
    float *z;
    int64_t head;
    int vec;
};

static AddPiece add_piece(const ew_args *a, int V, int64_t off, int64_t cnt)
{
    AddPiece p;
    p.x = in_at<float>(a, 0, off);
    p.y = in_at<float>(a, 1, off);
    p.z = out_at<float>(a, off);
    const void *ptrs[3] = {p.z, p.x, p.y};
    const int64_t head = common_head(ptrs, 3, 4 * V, 4, cnt);
    p.vec = head >= 0;
    p.head = head >= 0 ? head : 0;
    return p;
}

template <class Idx>
static int run_naive(const ew_args *a, int V, void (*kern)(const float *, const float *, float *, Idx, Idx, int))
{
    if (a->n <= 0)
        return 0;
    const int64_t chunk = sizeof(Idx) == 4 ? kChunk32 : a->n;
    return for_chunks(a->n, chunk, [&](int64_t off, int64_t cnt) {
        const AddPiece p = add_piece(a, V, off, cnt);
        kern<<<1, 1, 0, stream_of(a)>>>(p.x, p.y, p.z, Idx(cnt), Idx(p.head), p.vec);
    });
}

template <class Idx>
static int run_tb(const ew_args *a, int V, int U, bool mo,
                  void (*kern)(const float *, const float *, float *, Idx, Idx, int))
{
    if (a->n <= 0)
        return 0;
    const int block = a->block > 0 ? a->block : 256;
    const int64_t W = int64_t(U) * V;
    int64_t gs_grid = a->grid > 0 ? a->grid : 2048;
    int64_t chunk = a->n;
    if (sizeof(Idx) == 4) {
        /* int index: pieces of 2^30 elements, and a grid-stride step of at most 2^30 elements,
         * so that i + step never passes INT_MAX. */
        chunk = kChunk32;
        const int64_t max_grid = kChunk32 / (int64_t(block) * W);
        if (gs_grid > max_grid)
            gs_grid = max_grid > 0 ? max_grid : 1;
    } else if (mo) {
        /* size_t index: only the grid size limits a monolithic launch. */
        const int64_t most = (int64_t(INT_MAX) * block * W) & ~int64_t(15);
        if (chunk > most)
            chunk = most;
    }
    return for_chunks(a->n, chunk, [&](int64_t off, int64_t cnt) {
        const AddPiece p = add_piece(a, V, off, cnt);
        const int64_t grid = mo ? clamp_grid(ceil_div(cnt, W * block)) : clamp_grid(gs_grid);
        kern<<<unsigned(grid), block, 0, stream_of(a)>>>(p.x, p.y, p.z, Idx(cnt), Idx(p.head), p.vec);
    });
}

#define EWK_NAIVE_LAUNCHER(NAME, I, V, U, S, R) \
    static int launch_##NAME(const void *args) \
    { \
        return run_naive<EWK_IDX_##I>(static_cast<const ew_args *>(args), V, add_##NAME); \
    }
EWK_NAIVE_LIST(EWK_NAIVE_LAUNCHER)

#define EWK_TB_LAUNCHER(NAME, I, V, U, S, TR) \
    static int launch_##NAME(const void *args) \
    { \
        return run_tb<EWK_IDX_##I>(static_cast<const ew_args *>(args), V, U, EWK_TRAV_##TR, add_##NAME); \
    }
EWK_TB_LIST(EWK_TB_LAUNCHER)

/* ---------------------------------------------------------------------------------------------
 * 3. cuda-vectorization-f16x8.md: one thread per pack, int index, grid ceil(n / pack / block).
 * ------------------------------------------------------------------------------------------- */

template <class T> struct Pair;
template <> struct Pair<half_t> { typedef __half2 type; };
template <> struct Pair<bf16_t> { typedef __nv_bfloat162 type; };

template <class P>
EW_DEV P bits_as(unsigned w)
{
    P p;
    memcpy(&p, &w, sizeof(p));
    return p;
}
template <class P>
EW_DEV unsigned as_bits(P p)
{
    unsigned w;
    memcpy(&w, &p, sizeof(w));
    return w;
}

enum PackKind { PACK_X2, PACK_X8, PACK_X8PACK };

/* PACK elements at a, b, c (aligned for the kind's loads). */
template <class T, int KIND>
EW_DEV void pack_op(const T *a, const T *b, T *c)
{
    typedef typename Pair<T>::type T2;
    if (KIND == PACK_X2) {
        *reinterpret_cast<T2 *>(c) =
            __hadd2(*reinterpret_cast<const T2 *>(a), *reinterpret_cast<const T2 *>(b));
    } else if (KIND == PACK_X8) {
        /* the tutorial's "f16x8": four 32-bit pair loads, one scalar __hadd per element */
        T2 ra[4], rb[4], rc[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            ra[k] = reinterpret_cast<const T2 *>(a)[k];
            rb[k] = reinterpret_cast<const T2 *>(b)[k];
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            rc[k].x = __hadd(ra[k].x, rb[k].x);
            rc[k].y = __hadd(ra[k].y, rb[k].y);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k)
            reinterpret_cast<T2 *>(c)[k] = rc[k];
    } else {
        /* "x8pack": one 128-bit load per input, four __hadd2, one 128-bit store */
        const uint4 ra = *reinterpret_cast<const uint4 *>(a);
        const uint4 rb = *reinterpret_cast<const uint4 *>(b);
        uint4 rc;
        rc.x = as_bits(__hadd2(bits_as<T2>(ra.x), bits_as<T2>(rb.x)));
        rc.y = as_bits(__hadd2(bits_as<T2>(ra.y), bits_as<T2>(rb.y)));
        rc.z = as_bits(__hadd2(bits_as<T2>(ra.z), bits_as<T2>(rb.z)));
        rc.w = as_bits(__hadd2(bits_as<T2>(ra.w), bits_as<T2>(rb.w)));
        *reinterpret_cast<uint4 *>(c) = rc;
    }
}

/* vec != 0: pointers share one offset modulo the kind's load size, [0, head) reaches it. */
template <class T, int PACK, int KIND>
EW_DEV void pack_add(const T *a, const T *b, T *c, int n, int head, int vec)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int nthr = gridDim.x * blockDim.x;
    if (!vec) {
        const int i0 = t * PACK;
#pragma unroll
        for (int k = 0; k < PACK; ++k)
            if (i0 + k < n)
                c[i0 + k] = __hadd(a[i0 + k], b[i0 + k]);
        return;
    }
#pragma unroll 1
    for (int i = t; i < head; i += nthr)
        c[i] = __hadd(a[i], b[i]);
    const int m = (n - head) / PACK;
    if (t < m)
        pack_op<T, KIND>(a + head + t * PACK, b + head + t * PACK, c + head + t * PACK);
#pragma unroll 1
    for (int i = head + m * PACK + t; i < n; i += nthr)
        c[i] = __hadd(a[i], b[i]);
}

__global__ void add_f32(const float *a, const float *b, float *c, int n, int head, int vec)
{
    (void)head;
    (void)vec;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}

__global__ void add_f32x4(const float *a, const float *b, float *c, int n, int head, int vec)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int nthr = gridDim.x * blockDim.x;
    if (!vec) {
        const int i0 = 4 * t;
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (i0 + k < n)
                c[i0 + k] = a[i0 + k] + b[i0 + k];
        return;
    }
#pragma unroll 1
    for (int i = t; i < head; i += nthr)
        c[i] = a[i] + b[i];
    const int m = (n - head) / 4;
    if (t < m) {
        const float4 ra = reinterpret_cast<const float4 *>(a + head)[t];
        const float4 rb = reinterpret_cast<const float4 *>(b + head)[t];
        float4 rc;
        rc.x = ra.x + rb.x;
        rc.y = ra.y + rb.y;
        rc.z = ra.z + rb.z;
        rc.w = ra.w + rb.w;
        reinterpret_cast<float4 *>(c + head)[t] = rc;
    }
#pragma unroll 1
    for (int i = head + 4 * m + t; i < n; i += nthr)
        c[i] = a[i] + b[i];
}

#define EWK_HALF_KERNELS(P, T) \
    __global__ void add_##P(const T *a, const T *b, T *c, int n, int head, int vec) \
    { \
        (void)head; \
        (void)vec; \
        const int i = blockIdx.x * blockDim.x + threadIdx.x; \
        if (i < n) \
            c[i] = __hadd(a[i], b[i]); \
    } \
    __global__ void add_##P##x2(const T *a, const T *b, T *c, int n, int head, int vec) \
    { \
        pack_add<T, 2, PACK_X2>(a, b, c, n, head, vec); \
    } \
    __global__ void add_##P##x8(const T *a, const T *b, T *c, int n, int head, int vec) \
    { \
        pack_add<T, 8, PACK_X8>(a, b, c, n, head, vec); \
    } \
    __global__ void add_##P##x8pack(const T *a, const T *b, T *c, int n, int head, int vec) \
    { \
        pack_add<T, 8, PACK_X8PACK>(a, b, c, n, head, vec); \
    }
EWK_HALF_KERNELS(f16, half_t)
EWK_HALF_KERNELS(bf16, bf16_t)

/* pack: elements per thread; align: bytes the pack loads need (1 = any element alignment). */
template <class T>
static int run_pack(const ew_args *a, int pack, int align,
                    void (*kern)(const T *, const T *, T *, int, int, int))
{
    if (a->n <= 0)
        return 0;
    const int block = a->block > 0 ? a->block : 256;
    return for_chunks(a->n, kChunk32, [&](int64_t off, int64_t cnt) {
        const T *x = in_at<T>(a, 0, off), *y = in_at<T>(a, 1, off);
        T *z = out_at<T>(a, off);
        const void *ptrs[3] = {z, x, y};
        const int64_t head = common_head(ptrs, 3, align, int(sizeof(T)), cnt);
        const int64_t grid = clamp_grid(ceil_div(ceil_div(cnt, pack), block));
        kern<<<unsigned(grid), block, 0, stream_of(a)>>>(x, y, z, int(cnt), head >= 0 ? int(head) : 0,
                                                         head >= 0);
    });
}

static int launch_f32(const void *p) { return run_pack<float>(static_cast<const ew_args *>(p), 1, 4, add_f32); }
static int launch_f32x4(const void *p) { return run_pack<float>(static_cast<const ew_args *>(p), 4, 16, add_f32x4); }
static int launch_f16(const void *p) { return run_pack<half_t>(static_cast<const ew_args *>(p), 1, 2, add_f16); }
static int launch_f16x2(const void *p) { return run_pack<half_t>(static_cast<const ew_args *>(p), 2, 4, add_f16x2); }
static int launch_f16x8(const void *p) { return run_pack<half_t>(static_cast<const ew_args *>(p), 8, 4, add_f16x8); }
static int launch_f16x8pack(const void *p) { return run_pack<half_t>(static_cast<const ew_args *>(p), 8, 16, add_f16x8pack); }
static int launch_bf16(const void *p) { return run_pack<bf16_t>(static_cast<const ew_args *>(p), 1, 2, add_bf16); }
static int launch_bf16x2(const void *p) { return run_pack<bf16_t>(static_cast<const ew_args *>(p), 2, 4, add_bf16x2); }
static int launch_bf16x8(const void *p) { return run_pack<bf16_t>(static_cast<const ew_args *>(p), 8, 4, add_bf16x8); }
static int launch_bf16x8pack(const void *p) { return run_pack<bf16_t>(static_cast<const ew_args *>(p), 8, 16, add_bf16x8pack); }

/* ---------------------------------------------------------------------------------------------
 * 4. elementwise-ops-on-gpus.md: the copy loop, vec1/vec2/vec4 x 32/64-bit index x grid1/grid2.
 * ------------------------------------------------------------------------------------------- */

template <int BYTES> struct Bytes;
template <> struct Bytes<2> { typedef unsigned short type; };
template <> struct Bytes<4> { typedef unsigned int type; };
template <> struct Bytes<8> { typedef uint2 type; };
template <> struct Bytes<16> { typedef uint4 type; };

/* Grid-stride copy of V-element vectors. in and out point at the array's first element on a
 * V-element boundary (the host adds the head), n counts the elements from there on, and the head
 * elements before in/out and the tail after the last whole vector go one by one. The vector loop
 * comes first and addresses the kernel's own pointer parameters, so it is the first loop in the
 * SASS and reads like the study's (base + i * vector size). */
template <class T, int V, class Idx>
EW_DEV void copy_body(const T *__restrict__ in, T *__restrict__ out, Idx n, Idx head)
{
    typedef typename Bytes<sizeof(T)>::type E;
    typedef typename Bytes<V * sizeof(T)>::type VT;
    const Idx tid = Idx(blockIdx.x) * Idx(blockDim.x) + Idx(threadIdx.x);
    const Idx stride = Idx(blockDim.x) * Idx(gridDim.x);
    const VT *iv = reinterpret_cast<const VT *>(in);
    VT *ov = reinterpret_cast<VT *>(out);
    const Idx nv = n / Idx(V);
    for (Idx i = tid; i < nv; i += stride)
        ov[i] = iv[i];
    const E *ie = reinterpret_cast<const E *>(in);
    E *oe = reinterpret_cast<E *>(out);
#pragma unroll 1
    for (Idx i = nv * Idx(V) + tid; i < n; i += stride)
        oe[i] = ie[i];
#pragma unroll 1
    for (Idx i = tid; i < head; i += stride)
        (oe - head)[i] = (ie - head)[i];
}

#define EWK_COPY_KERNEL(V, IB, IDX) \
    template <class T> \
    __global__ void copy_vec##V##_i##IB(const T *__restrict__ in, T *__restrict__ out, IDX n, IDX head) \
    { \
        copy_body<T, V, IDX>(in, out, n, head); \
    }
EWK_COPY_KERNEL(1, 32, uint32_t)
EWK_COPY_KERNEL(2, 32, uint32_t)
EWK_COPY_KERNEL(4, 32, uint32_t)
EWK_COPY_KERNEL(1, 64, uint64_t)
EWK_COPY_KERNEL(2, 64, uint64_t)
EWK_COPY_KERNEL(4, 64, uint64_t)

template <class T, int V, class Idx> struct CopyKernel;
#define EWK_COPY_PICK(V, IB, IDX) \
    template <class T> struct CopyKernel<T, V, IDX> { \
        static void (*get())(const T *, T *, IDX, IDX) { return copy_vec##V##_i##IB<T>; } \
    };
EWK_COPY_PICK(1, 32, uint32_t)
EWK_COPY_PICK(2, 32, uint32_t)
EWK_COPY_PICK(4, 32, uint32_t)
EWK_COPY_PICK(1, 64, uint64_t)
EWK_COPY_PICK(2, 64, uint64_t)
EWK_COPY_PICK(4, 64, uint64_t)

/* grid1 = ceil(n / vec / block); grid2 = min(grid1, SMs * threads_per_SM / block * 32). */
template <class T, int V, class Idx, int GRID>
static int launch_copy(const void *args)
{
    const ew_args *a = static_cast<const ew_args *>(args);
    if (a->n <= 0)
        return 0;
    const int block = a->block > 0 ? a->block : 256;
    const int64_t chunk = sizeof(Idx) == 4 ? kChunk32 : a->n;
    return for_chunks(a->n, chunk, [&](int64_t off, int64_t cnt) {
        const T *x = in_at<T>(a, 0, off);
        T *z = out_at<T>(a, off);
        const void *ptrs[2] = {z, x};
        const int64_t head = common_head(ptrs, 2, int(V * sizeof(T)), int(sizeof(T)), cnt);
        const int v = head >= 0 ? V : 1; /* differing offsets: the vec1 loop */
        int64_t grid = ceil_div((head >= 0 ? cnt - head : cnt) / v, block);
        if (GRID == 2) {
            const int64_t g2 = wave_grid(a, block, 32);
            grid = grid < g2 ? grid : g2;
        }
        void (*kern)(const T *, T *, Idx, Idx) =
            head >= 0 ? CopyKernel<T, V, Idx>::get() : CopyKernel<T, 1, Idx>::get();
        const int64_t h = head >= 0 ? head : 0;
        kern<<<unsigned(clamp_grid(grid)), block, 0, stream_of(a)>>>(x + h, z + h, Idx(cnt - h), Idx(h));
    });
}

/* ---------------------------------------------------------------------------------------------
 * 5. auto: every op of ops.def for every dtype.
 * ------------------------------------------------------------------------------------------- */

/* compute type: float for float32/float16/bfloat16, double for float64 */
template <class T> struct Compute { typedef float type; };
template <> struct Compute<double> { typedef double type; };

EW_DEV float to_c(float x) { return x; }
EW_DEV double to_c(double x) { return x; }
EW_DEV float to_c(half_t x) { return __half2float(x); }
EW_DEV float to_c(bf16_t x) { return __bfloat162float(x); }

template <class T> EW_DEV T from_c(typename Compute<T>::type x);
template <> EW_DEV float from_c<float>(float x) { return x; }
template <> EW_DEV double from_c<double>(double x) { return x; }
template <> EW_DEV half_t from_c<half_t>(float x) { return __float2half_rn(x); }
template <> EW_DEV bf16_t from_c<bf16_t>(float x) { return __float2bfloat16_rn(x); }

/* 16-byte vectors <-> compute-type arrays */
template <class T> struct Vec16;
template <> struct Vec16<float> {
    enum { N = 4 };
    static EW_DEV void unpack(uint4 r, float (&c)[4])
    {
        c[0] = __uint_as_float(r.x);
        c[1] = __uint_as_float(r.y);
        c[2] = __uint_as_float(r.z);
        c[3] = __uint_as_float(r.w);
    }
    static EW_DEV uint4 pack(const float (&c)[4])
    {
        return make_uint4(__float_as_uint(c[0]), __float_as_uint(c[1]), __float_as_uint(c[2]),
                          __float_as_uint(c[3]));
    }
};
template <> struct Vec16<double> {
    enum { N = 2 };
    static EW_DEV void unpack(uint4 r, double (&c)[2])
    {
        c[0] = __hiloint2double(int(r.y), int(r.x));
        c[1] = __hiloint2double(int(r.w), int(r.z));
    }
    static EW_DEV uint4 pack(const double (&c)[2])
    {
        return make_uint4(unsigned(__double2loint(c[0])), unsigned(__double2hiint(c[0])),
                          unsigned(__double2loint(c[1])), unsigned(__double2hiint(c[1])));
    }
};
EW_DEV void unpack_word(unsigned w, half_t, float &lo, float &hi)
{
    const float2 f = __half22float2(bits_as<__half2>(w));
    lo = f.x;
    hi = f.y;
}
EW_DEV void unpack_word(unsigned w, bf16_t, float &lo, float &hi)
{
    lo = __uint_as_float(w << 16); /* exactly __bfloat162float */
    hi = __uint_as_float(w & 0xffff0000u);
}
EW_DEV unsigned pack_word(float lo, float hi, half_t) { return as_bits(__floats2half2_rn(lo, hi)); }
EW_DEV unsigned pack_word(float lo, float hi, bf16_t) { return as_bits(__floats2bfloat162_rn(lo, hi)); }
template <class H> struct Vec16Half {
    enum { N = 8 };
    static EW_DEV void unpack(uint4 r, float (&c)[8])
    {
        unpack_word(r.x, H(), c[0], c[1]);
        unpack_word(r.y, H(), c[2], c[3]);
        unpack_word(r.z, H(), c[4], c[5]);
        unpack_word(r.w, H(), c[6], c[7]);
    }
    static EW_DEV uint4 pack(const float (&c)[8])
    {
        return make_uint4(pack_word(c[0], c[1], H()), pack_word(c[2], c[3], H()),
                          pack_word(c[4], c[5], H()), pack_word(c[6], c[7], H()));
    }
};
template <> struct Vec16<half_t> : Vec16Half<half_t> {};
template <> struct Vec16<bf16_t> : Vec16Half<bf16_t> {};

/* accurate math, overloaded on the compute type (no fast-math intrinsics) */
EW_DEV float m_exp(float x) { return expf(x); }
EW_DEV double m_exp(double x) { return exp(x); }
EW_DEV float m_log(float x) { return logf(x); }
EW_DEV double m_log(double x) { return log(x); }
EW_DEV float m_sqrt(float x) { return sqrtf(x); }
EW_DEV double m_sqrt(double x) { return sqrt(x); }
EW_DEV float m_erf(float x) { return erff(x); }
EW_DEV double m_erf(double x) { return erf(x); }
EW_DEV float m_erfc(float x) { return erfcf(x); }
EW_DEV double m_erfc(double x) { return erfc(x); }
EW_DEV float m_tanh(float x) { return tanhf(x); }
EW_DEV double m_tanh(double x) { return tanh(x); }
EW_DEV float m_fma(float a, float b, float c) { return fmaf(a, b, c); }
EW_DEV double m_fma(double a, double b, double c) { return fma(a, b, c); }
EW_DEV float m_abs(float x) { return fabsf(x); }
EW_DEV double m_abs(double x) { return fabs(x); }
EW_DEV float m_rsqrt(float x) { return rsqrtf(x); }   /* 2 ulp (CUDA math), a few instructions */
EW_DEV double m_rsqrt(double x) { return rsqrt(x); }  /* 1 ulp */
/* a / b for b in [1, 2]: __fdividef is within 2 ulp there and has no slow path */
EW_DEV float m_div_1to2(float a, float b) { return __fdividef(a, b); }
EW_DEV double m_div_1to2(double a, double b) { return a / b; }

/* 1/sqrt(2) split as hi + lo in each compute type */
template <class C> struct Rsqrt2;
template <> struct Rsqrt2<float> {
    static EW_DEV float hi() { return 0.707106769084930419921875f; }
    static EW_DEV float lo() { return 1.2101617104478970e-08f; }
};
template <> struct Rsqrt2<double> {
    static EW_DEV double hi() { return 0.70710678118654757; }
    static EW_DEV double lo() { return -4.8336466567264567e-17; /* 1/sqrt(2) - hi */ }
};

/* 1 / (1 + e^-x) without overflow: e = e^-|x| <= 1, numerator 1 (x >= 0) or e (x < 0), and
 * the denominator in [1, 2]. */
template <class C>
EW_DEV C sigmoid_of(C x)
{
    const C e = m_exp(-m_abs(x));
    return m_div_1to2(x >= C(0) ? C(1) : e, C(1) + e);
}

/* e^x for x below `limit()`, where e^x itself would be subnormal or nearly so:
 * e^x = e^(x + hi) * e^lo * 2^-k, hi + lo = k ln 2, hi a multiple of 2^-7 so that x + hi is exact. */
template <class C> struct TinyExp;
template <> struct TinyExp<float> {
    static EW_DEV float limit() { return -64.0f; }
    static EW_DEV float hi() { return 44.359375f; }                   /* 5678 / 128 */
    static EW_DEV float elo() { return 1.00204664736595744366f; }     /* e^(64 ln 2 - hi) */
    static EW_DEV float scale() { return 5.42101086242752217004e-20f; } /* 2^-64 */
};
template <> struct TinyExp<double> {
    static EW_DEV double limit() { return -256.0; }
    static EW_DEV double hi() { return 177.4453125; }                 /* 22713 / 128 */
    static EW_DEV double elo() { return 1.00036579023093566098; }     /* e^(256 ln 2 - hi) */
    static EW_DEV double scale() { return 8.63616855509444462539e-78; } /* 2^-256 */
};

/* x * sigmoid(x). Below TinyExp::limit() 1 + e^x rounds to 1 and silu = x e^x, formed from a
 * normal-range exponential and scaled once, so results near and below the subnormal range keep
 * their accuracy (x * e^x with a subnormal e^x would lose it). */
template <class C>
EW_DEV C silu_of(C x)
{
    if (x < TinyExp<C>::limit())
        return (x * (m_exp(x + TinyExp<C>::hi()) * TinyExp<C>::elo())) * TinyExp<C>::scale();
    return x * sigmoid_of(x);
}

/* x/2 * (1 + erf(x / sqrt 2)) = x/2 * erfc(u), u = -x / sqrt 2: erfc for every x, so that there
 * is no cancellation in 1 + erf for x < 0 and no divergent branch. Where u > 0 (x < 0) erfc falls
 * fast and u's own rounding (x * hi is rounded, hi != 1/sqrt 2) matters: it is put back to first
 * order with erfc'(u) / erfc(u) = -h(u), h(u) ~ u + sqrt(u^2 + 1.65) (within a few % for u >= 0;
 * the correction itself is below 2^-17 relative, so h is formed in float). For u <= 0,
 * erfc(u) is in [1, 2] and insensitive to that rounding. */
template <class C>
EW_DEV C gelu_of(C x)
{
    const C hi = Rsqrt2<C>::hi();
    const C u = -(x * hi);
    const C ulo = -(m_fma(x, hi, u) + x * Rsqrt2<C>::lo()); /* exact u = u + ulo, to first order */
    const C e = m_erfc(u);
    const float uf = float(u < C(64) ? u : C(64)); /* erfc(u) is 0 long before; keeps h finite */
    const float y = fmaf(uf, uf, 1.65f);
    const float h = uf + y * rsqrtf(y);
    const C corr = u > C(0) ? C(h) * ulo : C(0);
    return C(0.5) * x * m_fma(-e, corr, e);
}

/* Each op: NIN inputs, KIND, and for KIND_COMPUTE the function on the compute type. */
enum OpKind { KIND_COMPUTE, KIND_COPY, KIND_FILL, KIND_NATIVE };

#define EWK_OP(NAME, NIN_, EXPR) \
    struct Op_##NAME { \
        enum { NIN = NIN_, KIND = KIND_COMPUTE }; \
        template <class C> EW_DEV C operator()(C a, C b, C s0, C s1) const \
        { \
            (void)a; (void)b; (void)s0; (void)s1; \
            return EXPR; \
        } \
    };
EWK_OP(add, 2, a + b)
EWK_OP(sub, 2, a - b)
EWK_OP(mul, 2, a * b)
EWK_OP(div, 2, a / b)
EWK_OP(maximum, 2, (a >= b || a != a) ? a : b) /* NaN if either is NaN (a NaN: a; b NaN: b) */
EWK_OP(minimum, 2, (a <= b || a != a) ? a : b)
EWK_OP(add_const, 1, a + s0)
EWK_OP(mul_const, 1, a * s0)
EWK_OP(axpby, 2, s0 * a + s1 * b)
EWK_OP(neg, 1, -a)
EWK_OP(abs, 1, m_abs(a))
EWK_OP(exp, 1, m_exp(a))
EWK_OP(log, 1, m_log(a))
EWK_OP(sqrt, 1, m_sqrt(a))
EWK_OP(rsqrt, 1, m_rsqrt(a))
EWK_OP(erf, 1, m_erf(a))
EWK_OP(tanh, 1, m_tanh(a))
EWK_OP(sigmoid, 1, sigmoid_of(a))
EWK_OP(relu, 1, (a > C(0) || a != a) ? a : C(0))
EWK_OP(gelu, 1, gelu_of(a))
EWK_OP(silu, 1, silu_of(a))
struct Op_copy {
    enum { NIN = 1, KIND = KIND_COPY };
};
/* One PTX approximation on a float, each a single MUFU instruction of the SFU in SASS. Without
 * .ftz, subnormal inputs and results keep their value (a few more instructions around the MUFU). */
#define EWK_PTX_F32(NAME, INSN) \
    EW_DEV float NAME(float x) \
    { \
        float r; \
        asm(INSN " %0, %1;" : "=f"(r) : "f"(x)); \
        return r; \
    }
EWK_PTX_F32(lg2_approx, "lg2.approx.f32")
EWK_PTX_F32(ex2_approx, "ex2.approx.f32")
EWK_PTX_F32(ex2_approx_ftz, "ex2.approx.ftz.f32")
EWK_PTX_F32(rcp_approx_ftz, "rcp.approx.ftz.f32")
EWK_PTX_F32(tanh_approx, "tanh.approx.f32")
EWK_PTX_F32(sqrt_approx, "sqrt.approx.f32")
#undef EWK_PTX_F32

/* log for float16/bfloat16 results: ln a = log2(a) ln 2 from the SFU (lg2.approx.f32, without
 * .ftz so that subnormal bfloat16 inputs keep their value; MUFU.LG2 in SASS). Its error, at most
 * 2^-22 absolute on [0.5, 2] and 2 float ulp elsewhere (CUDA C++ Programming Guide, __log2f),
 * stays under 0.4 ulp of a float16 result and far under one of a bfloat16 result, so the op keeps
 * its 2-ulp bound; it replaces logf's ~20 instructions per element, which with 8 elements per
 * 16-byte vector made 16-bit log partly issue-bound (ELEMENTWISE_NOTES.md). */
struct Op_log_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return lg2_approx(a) * 0.693147180559945309f; }
};
/* gelu for float, float16 and bfloat16 results (float64 keeps gelu_of): x Phi(x) with
 * Phi(x) = erfc(-x / sqrt 2) / 2, from one erfc(z), z = |x| / sqrt 2, for both signs:
 *     x < 0: x erfc(z) / 2,    x >= 0: x (1 - erfc(z) / 2),
 *     erfc(z) = t 2^(-z^2 log2 e + s Q(s)),  t = 1 / (1 + z / 2),  s = 1 - t,
 * with Q fitted by scripts/gelu_fit.py (s Q(s) is log2(erfc(z) / t) + z^2 log2 e on z in [0, 10];
 * it is 0 at z = 0, so Horner's rounding stays relative near x = 0). Branch-free, one reciprocal and
 * one exp2 on the SFU (rcp.approx, ex2.approx: MUFU.RCP, MUFU.EX2), no cancellation for x << 0
 * (libdevice erfcf and the u-rounding correction of gelu_of cost about 60 instructions an element,
 * which made 16-bit gelu compute-bound at 0.55-0.6 of torch's erff form; ELEMENTWISE_NOTES.md).
 * The rounding of z, z^2 and the exponent costs about a^2 / 2 ulp for a << 0 (the stated bound's
 * 2 a^2 term); the rest stays under 4 ulp. */
static const float kLog2e = 1.44269504088896341f;
static const float kRsqrt2 = 0.707106781186547524f;
/* float results: degree 10 (fit error 6e-9 relative), t to 0.5 ulp by one Newton step, and z
 * clamped to 16 (erfc(16) = 1e-113 underflows as erfc(inf) would) so that x = +-inf keeps t finite;
 * (x erfc) / 2 rounds once into the subnormal range. */
struct Op_gelu_f32 {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float x, float, float, float) const
    {
        const float z = fminf(fabsf(x) * kRsqrt2, 16.0f);
        const float d = fmaf(z, 0.5f, 1.0f);
        float t = rcp_approx_ftz(d);
        t = fmaf(t, fmaf(-d, t, 1.0f), t);
        const float s = 1.0f - t;
        float q = -0.20092766f;
        q = fmaf(q, s, 0.6277097f);
        q = fmaf(q, s, -0.5815188f);
        q = fmaf(q, s, 0.11310536f);
        q = fmaf(q, s, -0.12101603f);
        q = fmaf(q, s, 0.071952134f);
        q = fmaf(q, s, 0.28323686f);
        q = fmaf(q, s, 0.23216939f);
        q = fmaf(q, s, -0.4374274f);
        q = fmaf(q, s, -1.8131202f);
        const float m = t * ex2_approx(fmaf(z * z, -kLog2e, s * q)); /* erfc(z) */
        return x < 0.0f ? (x * m) * 0.5f : x * (1.0f - 0.5f * m);
    }
};
/* float16/bfloat16 results: degree 5 (fit error 9e-6 relative, far under half a 16-bit ulp), no
 * Newton step, and the exponent raised by 32 (taken back in one product) so that .ftz flushes
 * nothing a bfloat16 subnormal result needs. x = +inf: t = 0, m = 0, x (1 - 0) = inf;
 * x = -inf: -inf * 0 = NaN, as the ops.def formula gives. */
struct Op_gelu_h16 {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float x, float, float, float) const
    {
        const float z = fabsf(x) * kRsqrt2;
        const float t = rcp_approx_ftz(fmaf(z, 0.5f, 1.0f));
        const float s = 1.0f - t;
        float q = -0.32583496f;
        q = fmaf(q, s, 0.6181457f);
        q = fmaf(q, s, 0.11428998f);
        q = fmaf(q, s, -0.4197283f);
        q = fmaf(q, s, -1.813977f);
        const float m = t * ex2_approx_ftz(fmaf(z * z, -kLog2e, fmaf(s, q, 32.0f))); /* erfc(z) 2^32 */
        const float h = m * 0x1p-33f;
        return x * (x < 0.0f ? h : 1.0f - h);
    }
};
/* exp, tanh and sqrt for float16/bfloat16 results, on the SFU: libm's expf and tanhf (10-20
 * instructions) and sqrtf's IEEE fix-up made 16-bit exp, tanh and sqrt issue-bound on the H200
 * (0.95-0.99 of torch at 256 MiB-1 GiB, 8 elements per 16-byte vector). Errors, relative, before
 * the one rounding to 16 bits (half a 16-bit ulp is 2^-11 or 2^-8): exp 2^-17 (x log2 e rounded,
 * |x| < 128) + 2^-22 (ex2.approx), tanh 2^-10.99 (tanh.approx, PTX ISA), sqrt 2^-23; all inside
 * the ops' stated bounds (exp, tanh: 2 ulp; sqrt: 1 ulp), checked on every 16-bit input by
 * tests/test_elementwise.py. Without .ftz, subnormal inputs and results keep their value. */
struct Op_exp_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return ex2_approx(a * kLog2e); }
};
struct Op_tanh_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return tanh_approx(a); }
};
struct Op_sqrt_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return sqrt_approx(a); }
};
/* The arithmetic an op runs for element type T: Op itself except where a cheaper form keeps
 * the op's accuracy bound for that type. */
template <class Op, class T> struct MathOf { typedef Op type; };
template <> struct MathOf<Op_log, half_t> { typedef Op_log_sfu type; };
template <> struct MathOf<Op_log, bf16_t> { typedef Op_log_sfu type; };
template <> struct MathOf<Op_exp, half_t> { typedef Op_exp_sfu type; };
template <> struct MathOf<Op_exp, bf16_t> { typedef Op_exp_sfu type; };
template <> struct MathOf<Op_tanh, half_t> { typedef Op_tanh_sfu type; };
template <> struct MathOf<Op_tanh, bf16_t> { typedef Op_tanh_sfu type; };
template <> struct MathOf<Op_sqrt, half_t> { typedef Op_sqrt_sfu type; };
template <> struct MathOf<Op_sqrt, bf16_t> { typedef Op_sqrt_sfu type; };
template <> struct MathOf<Op_gelu, float> { typedef Op_gelu_f32 type; };
template <> struct MathOf<Op_gelu, half_t> { typedef Op_gelu_h16 type; };
template <> struct MathOf<Op_gelu, bf16_t> { typedef Op_gelu_h16 type; };
/* ops whose math (a libm-class function per element) is a real share of a 16-byte vector's time;
 * asked of MathOf<Op, T>, so 16-bit log (Op_log_sfu, 4 instructions) is not one: with 1 vector
 * per thread past 32 waves it ran 0.4-0.5% faster than with 2 (log float16 256 MiB-2 GiB) */
template <class Op> struct Heavy { enum { value = 0 }; };
template <> struct Heavy<Op_exp> { enum { value = 1 }; };
template <> struct Heavy<Op_log> { enum { value = 1 }; };
template <> struct Heavy<Op_erf> { enum { value = 1 }; };
template <> struct Heavy<Op_tanh> { enum { value = 1 }; };
template <> struct Heavy<Op_sigmoid> { enum { value = 1 }; };
template <> struct Heavy<Op_gelu> { enum { value = 1 }; };
template <> struct Heavy<Op_gelu_h16> { enum { value = 1 }; };
template <> struct Heavy<Op_silu> { enum { value = 1 }; };
struct Op_fill {
    enum { NIN = 0, KIND = KIND_FILL };
};
/* 7. add_const bfloat16 as a native bf16x2 fma: x * 1 + c with c rounded to bfloat16. */
struct Op_add_const_bf16fma {
    enum { NIN = 1, KIND = KIND_NATIVE };
};

#define EW_OP(name, inputs, scalars, definition, accuracy) \
    static_assert(int(Op_##name::NIN) == (inputs), "ops.def and elementwise.cu disagree on " #name);
#include "ops.def"
#undef EW_OP

/* kernel parameters of an auto launch: scalars in the compute type, the fill value / bf16 constant
 * rounded once from double, and fill's 16-byte pattern */
template <class T>
struct OpArgs {
    typename Compute<T>::type s0, s1;
    T v;
    uint4 pattern;
    int prefetch; /* ew_fast: blocks below this index prefetch their first vector's lines into L2
                     before pdl_wait (PDL launches; 0: none) */
};

template <class Op, class T, class Idx>
EW_DEV T elem(const T *__restrict__ a, const T *__restrict__ b, Idx i, const OpArgs<T> &p)
{
    typedef typename Compute<T>::type C;
    if constexpr (Op::KIND == KIND_FILL) {
        return p.v;
    } else if constexpr (Op::KIND == KIND_COPY) {
        return a[i];
    } else if constexpr (Op::KIND == KIND_NATIVE) {
        return __hfma(a[i], __float2bfloat16_rn(1.0f), p.v);
    } else {
        const C ca = to_c(a[i]);
        C cb = C(0);
        if constexpr (Op::NIN >= 2)
            cb = to_c(b[i]);
        return from_c<T>(typename MathOf<Op, T>::type()(ca, cb, p.s0, p.s1));
    }
}

template <class Op, class T>
EW_DEV uint4 vec_op(uint4 ra, uint4 rb, const OpArgs<T> &p)
{
    typedef typename Compute<T>::type C;
    if constexpr (Op::KIND == KIND_FILL) {
        return p.pattern;
    } else if constexpr (Op::KIND == KIND_COPY) {
        return ra;
    } else if constexpr (Op::KIND == KIND_NATIVE) {
        const __nv_bfloat162 one = __float2bfloat162_rn(1.0f);
        const __nv_bfloat162 c2 = __halves2bfloat162(p.v, p.v);
        uint4 r;
        r.x = as_bits(__hfma2(bits_as<__nv_bfloat162>(ra.x), one, c2));
        r.y = as_bits(__hfma2(bits_as<__nv_bfloat162>(ra.y), one, c2));
        r.z = as_bits(__hfma2(bits_as<__nv_bfloat162>(ra.z), one, c2));
        r.w = as_bits(__hfma2(bits_as<__nv_bfloat162>(ra.w), one, c2));
        return r;
    } else {
        C ca[Vec16<T>::N], cb[Vec16<T>::N], co[Vec16<T>::N];
        Vec16<T>::unpack(ra, ca);
        if constexpr (Op::NIN >= 2)
            Vec16<T>::unpack(rb, cb);
#pragma unroll
        for (int k = 0; k < Vec16<T>::N; ++k)
            co[k] = typename MathOf<Op, T>::type()(ca[k], Op::NIN >= 2 ? cb[k] : C(0), p.s0, p.s1);
        return Vec16<T>::pack(co);
    }
}

/* Edge element j of a vector launch: j < head is element j - head (before a), the others
 * tail0 + (j - head), after the last whole vector. */
template <class Op, class T, class Idx>
EW_DEV void edge(const T *a, const T *b, T *o, Idx j, Idx head, Idx tail0, const OpArgs<T> &p)
{
    const Idx i = j < head ? j - head : tail0 + (j - head);
    o[i] = elem<Op, T, Idx>(a, b, i, p);
}

/* grid1/grid2 (the elementwise study's grid rules) and the rare case of differing offsets.
 * VEC: a, b, o point at the arrays' first element on a 16-byte boundary (the host adds the head),
 * n counts the elements from there on, and the head elements lie before them, at negative
 * indices. The vectors go one per thread, grid-stride beyond; the < N head and < N tail elements
 * are taken by the grid's last threads, which the launcher leaves without a vector so that no
 * thread waits on two loads in a row. !VEC (the pointers' offsets differ): one element per
 * thread, head 0. __launch_bounds__(1024) keeps any block size launchable. */
template <class Op, class T, class Idx, bool VEC>
__global__ void __launch_bounds__(1024)
ew_gs(const T *__restrict__ a, const T *__restrict__ b, T *__restrict__ o, Idx n, Idx head, OpArgs<T> p)
{
    pdl_wait();
    pdl_launch_dependents();
    const Idx tid = Idx(blockIdx.x) * Idx(blockDim.x) + Idx(threadIdx.x);
    const Idx nthr = Idx(gridDim.x) * Idx(blockDim.x);
    if constexpr (VEC) {
        const Idx nvec = n / Idx(Vec16<T>::N);
        const uint4 *av = reinterpret_cast<const uint4 *>(a);
        const uint4 *bv = reinterpret_cast<const uint4 *>(b);
        uint4 *ov = reinterpret_cast<uint4 *>(o);
        for (Idx v = tid; v < nvec; v += nthr) {
            uint4 ra = make_uint4(0, 0, 0, 0), rb = ra;
            if constexpr (Op::NIN >= 1)
                ra = av[v];
            if constexpr (Op::NIN >= 2)
                rb = bv[v];
            ov[v] = vec_op<Op, T>(ra, rb, p);
        }
        const Idx tail0 = nvec * Idx(Vec16<T>::N);
        const Idx nedge = head + (n - tail0);
#pragma unroll 1
        for (Idx j = nthr - 1 - tid; j < nedge; j += nthr)
            edge<Op, T, Idx>(a, b, o, j, head, tail0, p);
    } else {
        for (Idx i = tid; i < n; i += nthr)
            o[i] = elem<Op, T, Idx>(a, b, i, p);
    }
}

/* The default path (auto). Pointers and head as for ew_gs's VEC case. Block k owns the VPT *
 * blockDim.x vectors from k * VPT * blockDim.x; thread t loads its vectors t, t + blockDim.x, ...
 * (coalesced), all of them before it computes and stores any, and stores with st.global.cs
 * (streaming: the written lines are the first the L2 evicts). No loop: the grid covers the array.
 * The head and tail elements (fewer than 2N) go to the last block's last threads, which the
 * launcher leaves without a vector. WB: ordinary write-back stores instead (variant "auto_wb").
 * No __restrict__: out may be an input (add(a, b, out=a)), and with it ptxas moved stores above
 * later loads when VPT = 4 (to save registers), halving the loads in flight. */
template <class Op, class T, class Idx, int VPT, bool WB>
__global__ void __launch_bounds__(1024)
ew_fast(const T *a, const T *b, T *o, Idx n, Idx head, OpArgs<T> p)
{
    enum { N = Vec16<T>::N };
    const Idx nvec = n / Idx(N);
    const Idx base = Idx(blockIdx.x) * Idx(blockDim.x) * VPT + Idx(threadIdx.x);
    const uint4 *av = reinterpret_cast<const uint4 *>(a);
    const uint4 *bv = reinterpret_cast<const uint4 *>(b);
    uint4 *ov = reinterpret_cast<uint4 *>(o);
    if (int(blockIdx.x) < p.prefetch && base < nvec) {
        /* the inputs' lines of the first vector (thread 0 leads the block's run) */
        if constexpr (Op::NIN >= 1)
            prefetch_l2_line(av + base, 16u, threadIdx.x == 0);
        if constexpr (Op::NIN >= 2)
            prefetch_l2_line(bv + base, 16u, threadIdx.x == 0);
    }
    pdl_wait();
    pdl_launch_dependents();
    uint4 ra[VPT], rb[VPT];
#pragma unroll
    for (int r = 0; r < VPT; ++r) {
        const Idx v = base + Idx(r) * Idx(blockDim.x);
        ra[r] = rb[r] = make_uint4(0, 0, 0, 0);
        if (v < nvec) {
            if constexpr (Op::NIN >= 1)
                ra[r] = av[v];
            if constexpr (Op::NIN >= 2)
                rb[r] = bv[v];
        }
    }
#pragma unroll
    for (int r = 0; r < VPT; ++r) {
        const Idx v = base + Idx(r) * Idx(blockDim.x);
        if (v < nvec) {
            const uint4 res = vec_op<Op, T>(ra[r], rb[r], p);
            if constexpr (WB)
                ov[v] = res;
            else
                __stcs(ov + v, res);
        }
    }
    if (blockIdx.x == gridDim.x - 1) {
        const Idx tail0 = nvec * Idx(N);
        const Idx nedge = head + (n - tail0);
        const Idx j = Idx(blockDim.x) - 1 - Idx(threadIdx.x);
        if (j < nedge)
            edge<Op, T, Idx>(a, b, o, j, head, tail0, p);
    }
}

static const int kAutoBlock = 256;

template <class T> static T host_round(double x);
template <> float host_round<float>(double x) { return float(x); }
template <> double host_round<double>(double x) { return x; }
template <> half_t host_round<half_t>(double x) { return __double2half(x); }
template <> bf16_t host_round<bf16_t>(double x) { return __double2bfloat16(x); }

template <class T>
static OpArgs<T> op_args(const ew_args *a)
{
    typedef typename Compute<T>::type C;
    OpArgs<T> p;
    p.prefetch = 0;
    p.s0 = C(a->scalar[0]);
    p.s1 = C(a->scalar[1]);
    p.v = host_round<T>(a->scalar[0]);
    unsigned char bytes[16];
    for (int k = 0; k < 16; k += int(sizeof(T)))
        memcpy(bytes + k, &p.v, sizeof(T));
    memcpy(&p.pattern, bytes, 16);
    return p;
}

/* Pointers of an auto-family launch: the head (elements before the common 16-byte boundary, -1
 * when the offsets differ) and the vector count. */
template <class Op, class T>
struct AutoView {
    const T *x, *y;
    T *z;
    int64_t n, head, nvec, nedge;
    explicit AutoView(const ew_args *a)
    {
        n = a->n;
        x = in_at<T>(a, 0, 0);
        y = in_at<T>(a, 1, 0);
        z = out_at<T>(a, 0);
        const void *ptrs[3] = {z, x, y};
        head = n > 0 ? common_head(ptrs, 1 + Op::NIN, 16, int(sizeof(T)), n) : 0;
        nvec = head >= 0 ? (n - head) / Vec16<T>::N : 0;
        nedge = head >= 0 ? n - nvec * Vec16<T>::N : n;
    }
    const T *xh() const { return x ? x + head : nullptr; }
    const T *yh() const { return y ? y + head : nullptr; }
};

enum GridRule { GRID_1, GRID_2 };

/* grid1 / grid2 (the study's rules) on the grid-stride body. units: 16-byte vectors plus edge
 * elements (or elements, when the offsets differ). GRID_1: ceil(units / block), one unit per
 * thread; GRID_2: min(GRID_1, SMs x threads_per_SM / block x 32), grid-stride beyond it. */
template <class Op, class T>
static int run_gs(const ew_args *a, GridRule rule)
{
    const AutoView<Op, T> w(a);
    if (w.n <= 0)
        return 0;
    const int64_t units = w.head >= 0 ? w.nvec + w.nedge : w.n;
    const int block = a->block > 0 ? a->block : kAutoBlock;
    int64_t grid = ceil_div(units, block);
    if (rule == GRID_2) {
        const int64_t cap = wave_grid(a, block, 32);
        grid = grid < cap ? grid : cap;
    }
    grid = clamp_grid(grid);
    const int64_t nthr = grid * block;
    /* indices formed stay between -head and n + 2 * nthr */
    const bool i32 = w.n + 2 * nthr < int64_t(INT_MAX);
    const OpArgs<T> p = op_args<T>(a);
    const cudaStream_t s = stream_of(a);
    const dim3 g{unsigned(grid)}, bl{unsigned(block)};
    const bool pdl = ewcuda_pdl_active(a->device);
    cudaError_t err;
    if (w.head < 0) /* offsets differ: element accesses, 64-bit index (rare path, one instance) */
        err = pdl_launch(ew_gs<Op, T, int64_t, false>, g, bl, 0, s, pdl, w.x, w.y, w.z, w.n, int64_t(0), p);
    else if (i32)
        err = pdl_launch(ew_gs<Op, T, int, true>, g, bl, 0, s, pdl, w.xh(), w.yh(), w.z + w.head,
                         int(w.n - w.head), int(w.head), p);
    else
        err = pdl_launch(ew_gs<Op, T, int64_t, true>, g, bl, 0, s, pdl, w.xh(), w.yh(), w.z + w.head,
                         w.n - w.head, w.head, p);
    return err != cudaSuccess ? int(err) : int(cudaGetLastError());
}

/* auto: VPT, the vectors per thread, from the waves W = vectors / (SMs x resident threads) of the
 * one-vector kernel (the SM count and the kernel's occupancy at this block size come from the
 * device): W <= 1: 1; 1 < W <= 2: 2 (one wave of blocks, each thread issuing 2 + 2 loads before
 * its stores); 2 < W <= 4: 4 when that grid fills at least 85% of one wave of the 4-vector kernel
 * and PDL is off, else 1; W > 4: 1 (many waves). A grid much below one wave leaves SMs with a
 * block more than others (measured slower). Under PDL each thread prefetches its first vector
 * before the wait, and there 1 vector per thread beat 4 (copy 16 MiB: 2815 against 2665 GB/s).
 * Heavy ops (libm-class math, not the SFU log) in 16-bit types: 1, and 2 beyond 32 waves.
 * Measurements: ELEMENTWISE_NOTES.md. */
/* EWKERN_AUTO_VPT=1|2|4 in the environment (read once) fixes auto's vectors per thread: a knob
 * for measuring the rule above, not for users. */
static int forced_vpt()
{
    static const int v = [] {
        const char *e = getenv("EWKERN_AUTO_VPT");
        const int x = e ? atoi(e) : 0;
        return (x == 1 || x == 2 || x == 4) ? x : 0;
    }();
    return v;
}

/* EWKERN_PDL_PREFETCH=none|wave|all (read once): which blocks of a PDL launch prefetch their first
 * vector's lines before the wait; a knob for measuring the rule in run_fast, not for users. */
enum PrefetchRule { PREFETCH_NONE, PREFETCH_WAVE, PREFETCH_ALL };
static PrefetchRule prefetch_rule()
{
    static const PrefetchRule r = [] {
        const char *e = getenv("EWKERN_PDL_PREFETCH");
        if (e && !strcmp(e, "none"))
            return PREFETCH_NONE;
        if (e && !strcmp(e, "all"))
            return PREFETCH_ALL;
        return PREFETCH_WAVE;
    }();
    return r;
}

template <class Op, class T, bool WB>
static int run_fast(const ew_args *a)
{
    const AutoView<Op, T> w(a);
    if (w.n <= 0)
        return 0;
    if (w.head < 0)
        return run_gs<Op, T>(a, GRID_1);
    const int block = a->block > 0 ? a->block : kAutoBlock;
    const int dev = a->device;
    const bool pdl = ewcuda_pdl_active(dev);
    static std::atomic<int> occ1[kMaxCachedDevices], occ4[kMaxCachedDevices];
    const int64_t wave1 = wave_blocks(occ1, (const void *)ew_fast<Op, T, int, 1, WB>, block, dev) * block;
    /* 32-bit indices when every index formed fits (grid * vpt * block <= nvec + 2 * 4 * block) */
    const bool i32 = w.n + w.nvec + 8 * int64_t(block) < int64_t(INT_MAX);
    int vpt = 1;
    if (!i32) {
        vpt = 1; /* the 64-bit instance takes 1 vector per thread */
    } else if (const int forced = forced_vpt()) {
        vpt = forced;
    } else if (int(Op::KIND) == KIND_FILL) {
        /* write-only: past one wave, 2 stores per thread. With 1 the H200 wrote at 0.73 of torch's
         * fill (3350 against 4550 GB/s at 64 MiB-1 GiB); with 2 at 1.00; the H100 the same either way */
        vpt = w.nvec > wave1 ? 2 : 1;
    } else if (Heavy<typename MathOf<Op, T>::type>::value && sizeof(T) == 2) {
        /* 8 transcendental evaluations per vector: more threads beat more loads in flight up to
         * tens of waves (log float16 at 16 MiB: 2590 GB/s with 1, 2396 with 4); 2 per thread past 32 */
        vpt = w.nvec > 32 * wave1 ? 2 : 1;
    } else if (w.nvec > wave1 && w.nvec <= 2 * wave1) {
        vpt = 2;
    } else if (w.nvec > 2 * wave1 && w.nvec <= 4 * wave1) {
        const int64_t wave4 = wave_blocks(occ4, (const void *)ew_fast<Op, T, int, 4, WB>, block, dev) * block * 4;
        if (w.nvec <= wave4 && 100 * w.nvec >= 85 * wave4 && !pdl)
            vpt = 4;
    }
    const int64_t per_block = int64_t(vpt) * block;
    int64_t grid = ceil_div(w.nvec, per_block);
    if (grid < 1)
        grid = 1;
    /* the last block's last nedge threads must own no vector */
    if ((grid - 1) * per_block + (block - w.nedge) < w.nvec)
        grid += 1;
    OpArgs<T> p = op_args<T>(a);
    if (pdl) {
        /* only blocks that can be resident before the previous kernel ends have a wait to hide a
         * prefetch behind: the first wave (later blocks would issue it and load at once) */
        const PrefetchRule r = prefetch_rule();
        const int64_t wave_blocks = wave1 / block;
        p.prefetch = r == PREFETCH_NONE ? 0 : r == PREFETCH_ALL ? INT_MAX : int(wave_blocks < INT_MAX ? wave_blocks : INT_MAX);
    }
    const cudaStream_t s = stream_of(a);
    const dim3 g{unsigned(clamp_grid(grid))}, bl{unsigned(block)};
    const T *xh = w.xh(), *yh = w.yh();
    T *zh = w.z + w.head;
    cudaError_t err;
    if (i32) {
        const int n32 = int(w.n - w.head), h32 = int(w.head);
        if (vpt == 1)
            err = pdl_launch(ew_fast<Op, T, int, 1, WB>, g, bl, 0, s, pdl, xh, yh, zh, n32, h32, p);
        else if (vpt == 2)
            err = pdl_launch(ew_fast<Op, T, int, 2, WB>, g, bl, 0, s, pdl, xh, yh, zh, n32, h32, p);
        else
            err = pdl_launch(ew_fast<Op, T, int, 4, WB>, g, bl, 0, s, pdl, xh, yh, zh, n32, h32, p);
    } else {
        err = pdl_launch(ew_fast<Op, T, int64_t, 1, WB>, g, bl, 0, s, pdl, xh, yh, zh, w.n - w.head, w.head, p);
    }
    return err != cudaSuccess ? int(err) : int(cudaGetLastError());
}

template <class Op, class T>
static int launch_auto(const void *args) { return run_fast<Op, T, false>(static_cast<const ew_args *>(args)); }
template <class Op, class T>
static int launch_auto_wb(const void *args) { return run_fast<Op, T, true>(static_cast<const ew_args *>(args)); }
template <class Op, class T>
static int launch_grid1(const void *args) { return run_gs<Op, T>(static_cast<const ew_args *>(args), GRID_1); }
template <class Op, class T>
static int launch_grid2(const void *args) { return run_gs<Op, T>(static_cast<const ew_args *>(args), GRID_2); }

#define EWK_AUTO_KERNEL(Op, T) ((const void *)ew_fast<Op, T, int, 1, false>)
#define EWK_GS_KERNEL(Op, T) ((const void *)ew_gs<Op, T, int, true>)

/* ---------------------------------------------------------------------------------------------
 * The table.
 * ------------------------------------------------------------------------------------------- */

#define EWK_B EW_USES_BLOCK
#define EWK_BG (EW_USES_BLOCK | EW_USES_GRID)

#define EWK_ABOUT_IDX_I "int index"
#define EWK_ABOUT_IDX_S "size_t index"
#define EWK_ABOUT_STYLE_N "scalar float accesses"
#define EWK_ABOUT_STYLE_T "vector accesses cast from float* addresses"
#define EWK_ABOUT_STYLE_M "vector accesses through float1/2/4 pointers indexed in vectors"
#define EWK_ABOUT_PTR_C "plain pointers"
#define EWK_ABOUT_PTR_R "__restrict__ pointers"
#define EWK_ABOUT_TRAV_gs "grid-stride over a.grid blocks (default 2048 x 256)"
#define EWK_ABOUT_TRAV_mo "one thread per U*V elements, ceil(n / (U*V*block)) blocks"

#define EWK_NAIVE_ROW(NAME, I, V, U, S, R) \
    {"add", #NAME, EW_FLOAT32, launch_##NAME, (const void *)add_##NAME, 0, \
     "naive: one thread for all n; " EWK_ABOUT_IDX_##I ", V" #V " x U" #U ", " EWK_ABOUT_STYLE_##S ", " \
     EWK_ABOUT_PTR_##R},
#define EWK_TB_ROW(NAME, I, V, U, S, TR) \
    {"add", #NAME, EW_FLOAT32, launch_##NAME, (const void *)add_##NAME, EWK_TB_FLAGS_##TR, \
     "thread-block: " EWK_ABOUT_TRAV_##TR "; " EWK_ABOUT_IDX_##I ", V" #V " x U" #U ", " EWK_ABOUT_STYLE_##S \
     ", __restrict__ pointers"},
#define EWK_TB_FLAGS_gs EWK_BG
#define EWK_TB_FLAGS_mo EWK_B

#define EWK_COPY_ROWS(T, DT, V, IB, IDX) \
    {"copy", "vec" #V "_i" #IB "_grid1", DT, launch_copy<T, V, IDX, 1>, (const void *)copy_vec##V##_i##IB<T>, EWK_B, \
     "copy study: " #V " elements per load, " #IB "-bit loop index, grid1 = ceil(n / " #V " / block)"}, \
    {"copy", "vec" #V "_i" #IB "_grid2", DT, launch_copy<T, V, IDX, 2>, (const void *)copy_vec##V##_i##IB<T>, EWK_B, \
     "copy study: " #V " elements per load, " #IB "-bit loop index, grid2 = min(grid1, SMs x threads/SM / block x 32)"},
#define EWK_COPY_DTYPE(T, DT) \
    EWK_COPY_ROWS(T, DT, 1, 32, uint32_t) \
    EWK_COPY_ROWS(T, DT, 2, 32, uint32_t) \
    EWK_COPY_ROWS(T, DT, 4, 32, uint32_t) \
    EWK_COPY_ROWS(T, DT, 1, 64, uint64_t) \
    EWK_COPY_ROWS(T, DT, 2, 64, uint64_t) \
    EWK_COPY_ROWS(T, DT, 4, 64, uint64_t)

#define EWK_AUTO_ABOUT \
    "fast default: 16-byte vectors, 1/2/4 per thread so the grid fits one wave of the device when it can, " \
    "all loads before the first store, streaming stores, head/tail on spare threads (scalar if offsets " \
    "differ), 32-bit index when n allows, PDL on sm_90+ with an L2 prefetch of the first vector before the wait"
#define EWK_AUTO_ROW(NAME, T, DT) \
    {#NAME, "auto", DT, launch_auto<Op_##NAME, T>, EWK_AUTO_KERNEL(Op_##NAME, T), EWK_B, EWK_AUTO_ABOUT},
#define EW_OP(name, inputs, scalars, definition, accuracy) \
    EWK_AUTO_ROW(name, float, EW_FLOAT32) \
    EWK_AUTO_ROW(name, half_t, EW_FLOAT16) \
    EWK_AUTO_ROW(name, bf16_t, EW_BFLOAT16) \
    EWK_AUTO_ROW(name, double, EW_FLOAT64)

#define EWK_GRID_ROWS(NAME, T, DT) \
    {#NAME, "grid1", DT, launch_grid1<Op_##NAME, T>, EWK_GS_KERNEL(Op_##NAME, T), EWK_B, \
     "grid-stride body, one 16-byte vector per thread: grid1 = ceil(vectors / block)"}, \
    {#NAME, "grid2", DT, launch_grid2<Op_##NAME, T>, EWK_GS_KERNEL(Op_##NAME, T), EWK_B, \
     "grid-stride body with grid2 = min(grid1, SMs x threads/SM / block x 32)"},
#define EWK_WB_ROWS(NAME) \
    {#NAME, "auto_wb", EW_FLOAT32, launch_auto_wb<Op_##NAME, float>, (const void *)ew_fast<Op_##NAME, float, int, 1, true>, \
     EWK_B, "auto with ordinary write-back stores instead of streaming (st.global.cs) stores"}, \
    {#NAME, "auto_wb", EW_FLOAT16, launch_auto_wb<Op_##NAME, half_t>, (const void *)ew_fast<Op_##NAME, half_t, int, 1, true>, \
     EWK_B, "auto with ordinary write-back stores instead of streaming (st.global.cs) stores"}, \
    {#NAME, "auto_wb", EW_BFLOAT16, launch_auto_wb<Op_##NAME, bf16_t>, (const void *)ew_fast<Op_##NAME, bf16_t, int, 1, true>, \
     EWK_B, "auto with ordinary write-back stores instead of streaming (st.global.cs) stores"},

static const ew_kernel kTable[] = {
    /* 1. naive */
    EWK_NAIVE_LIST(EWK_NAIVE_ROW)
    /* 2. thread-block */
    EWK_TB_LIST(EWK_TB_ROW)
    /* 3. f16x8 tutorial */
    {"add", "f32", EW_FLOAT32, launch_f32, (const void *)add_f32, EWK_B,
     "tutorial baseline: one float per thread"},
    {"add", "f32x4", EW_FLOAT32, launch_f32x4, (const void *)add_f32x4, EWK_B,
     "one float4 (128-bit) load/store per thread"},
    {"add", "f16", EW_FLOAT16, launch_f16, (const void *)add_f16, EWK_B,
     "one half per thread, native __hadd"},
    {"add", "f16x2", EW_FLOAT16, launch_f16x2, (const void *)add_f16x2, EWK_B,
     "one half2 (32-bit) per thread, __hadd2"},
    {"add", "f16x8", EW_FLOAT16, launch_f16x8, (const void *)add_f16x8, EWK_B,
     "8 halves per thread as four half2 loads, a scalar __hadd per element"},
    {"add", "f16x8pack", EW_FLOAT16, launch_f16x8pack, (const void *)add_f16x8pack, EWK_B,
     "8 halves per thread in one 128-bit load/store, four __hadd2"},
    {"add", "bf16", EW_BFLOAT16, launch_bf16, (const void *)add_bf16, EWK_B,
     "one bfloat16 per thread, native __hadd"},
    {"add", "bf16x2", EW_BFLOAT16, launch_bf16x2, (const void *)add_bf16x2, EWK_B,
     "one bfloat162 (32-bit) per thread, __hadd2"},
    {"add", "bf16x8", EW_BFLOAT16, launch_bf16x8, (const void *)add_bf16x8, EWK_B,
     "8 bfloat16 per thread as four bfloat162 loads, a scalar __hadd per element"},
    {"add", "bf16x8pack", EW_BFLOAT16, launch_bf16x8pack, (const void *)add_bf16x8pack, EWK_B,
     "8 bfloat16 per thread in one 128-bit load/store, four __hadd2"},
    /* 4. copy study */
    EWK_COPY_DTYPE(float, EW_FLOAT32)
    EWK_COPY_DTYPE(bf16_t, EW_BFLOAT16)
    /* 5. auto: every op of ops.def x float32, float16, bfloat16, float64 */
#include "ops.def"
    /* 6. the grid rules on auto's body */
    EWK_GRID_ROWS(log, float, EW_FLOAT32)
    EWK_GRID_ROWS(log, bf16_t, EW_BFLOAT16)
    EWK_GRID_ROWS(erf, float, EW_FLOAT32)
    EWK_GRID_ROWS(erf, bf16_t, EW_BFLOAT16)
    EWK_GRID_ROWS(add_const, float, EW_FLOAT32)
    EWK_GRID_ROWS(add_const, bf16_t, EW_BFLOAT16)
    /* the store policy of auto, for the five ops of the speed bar and fill (write-only) */
    EWK_WB_ROWS(fill)
    EWK_WB_ROWS(copy)
    EWK_WB_ROWS(add)
    EWK_WB_ROWS(add_const)
    EWK_WB_ROWS(log)
    EWK_WB_ROWS(erf)
    /* 7. native bfloat16 fma */
    {"add_const", "bf16_fma", EW_BFLOAT16, launch_auto<Op_add_const_bf16fma, bf16_t>,
     EWK_AUTO_KERNEL(Op_add_const_bf16fma, bf16_t), EWK_B,
     "auto with __hfma2(x, 1, c) on bf16x2 pairs; c is rounded to bfloat16 first"},
};
#undef EW_OP

} /* namespace ewk */

extern "C" const ew_kernel *ew_cuda_elementwise_table(int *count)
{
    if (count)
        *count = int(sizeof(ewk::kTable) / sizeof(ewk::kTable[0]));
    return ewk::kTable;
}
