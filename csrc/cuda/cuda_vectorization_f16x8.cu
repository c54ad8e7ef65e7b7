/*
 * cuda_vectorization_f16x8.cu: add in the steps of the cuda-vectorization-f16x8.md tutorial (float32,
 * float16, bfloat16), one thread per pack, int index, grid ceil(n / pack / block) of 256 threads.
 *
 * Each row of the table at the bottom is one variant of add with its launcher and __global__
 * function. Time them with `python -m ewkern.bench v1` (the tutorial's table, against torch.add) or
 * any row with ewkern.bench (op add, dtype, variant); SASS notes are in ELEMENTWISE_NOTES.md.
 *
 *  3. pack     "f32" (one float per thread), "f32x4" (float4); "f16" (one half, __hadd), "f16x2"
 *              (half2 + __hadd2), "f16x8" (4 half2 loads, __hadd each), "f16x8pack" (one 128-bit
 *              load/store, 4 __hadd2); the same four for bf16: "bf16", "bf16x2", "bf16x8",
 *              "bf16x8pack".
 *
 * Every version is correct for any n >= 0 and any element-aligned pointers (out may equal an input):
 * the pack loads follow a scalar head up to their alignment boundary when all pointers share one
 * offset, a scalar tail ends them (the tutorial's f16x8pack drops up to 7 trailing elements: not
 * here), and the kernels fall back to element accesses when the offsets differ. Arrays of 2^30
 * elements or more go in launches of 2^30 elements (int index).
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "ewkern_kernels.h"
#include "elementwise_common.cuh"

namespace ewk {

/* ---------------------------------------------------------------------------------------------
 * 3. cuda-vectorization-f16x8.md: one thread per pack, int index, grid ceil(n / pack / block).
 * ------------------------------------------------------------------------------------------- */

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
 * The table.
 * ------------------------------------------------------------------------------------------- */

#define EWK_B EW_USES_BLOCK

static const ew_kernel kTable[] = {
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
};

} /* namespace ewk */

extern "C" const ew_kernel *ew_cuda_cuda_vectorization_f16x8_table(int *count)
{
    if (count)
        *count = int(sizeof(ewk::kTable) / sizeof(ewk::kTable[0]));
    return ewk::kTable;
}
