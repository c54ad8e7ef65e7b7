/*
 * add_kernel_experiments.cu: add-kernel-experiments.md's two float32 add families, the naive and the
 * thread-block kernels (136 rows, the paper's names and order).
 *
 * Each row of the table at the bottom is one variant of add float32 with its launcher and __global__
 * function. Time any row with the benchmark (ewkern.bench: op add, dtype float32, variant; the
 * study's own run is `python -m ewkern.bench a1`); registers and SASS notes are in ELEMENTWISE_NOTES.md.
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
 *
 * Every version is correct for any n >= 0 and any element-aligned pointers (out may equal an input):
 * the vector accesses follow a scalar head up to the alignment boundary when all pointers share one
 * offset, a scalar tail ends them, and the kernels fall back to scalar accesses when the offsets
 * differ. The I (int index) versions cut arrays of 2^30 elements or more into launches of 2^30
 * elements.
 */
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "ewkern_kernels.h"
#include "elementwise_common.cuh"

namespace ewk {

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

static const ew_kernel kTable[] = {
    /* 1. naive */
    EWK_NAIVE_LIST(EWK_NAIVE_ROW)
    /* 2. thread-block */
    EWK_TB_LIST(EWK_TB_ROW)
};

} /* namespace ewk */

extern "C" const ew_kernel *ew_cuda_add_kernel_experiments_table(int *count)
{
    if (count)
        *count = int(sizeof(ewk::kTable) / sizeof(ewk::kTable[0]));
    return ewk::kTable;
}
