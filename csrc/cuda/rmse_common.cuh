/*
 * rmse_common.cuh: what both batched-RMSE kernel files share (batched_rmse_kernel_analysis.cu, the
 * paper's ladder; rmse_auto.cu, the default): element and arithmetic types, the squared difference,
 * the finishing sqrt(sum / n), the block reduction, the n == 0 kernel, and the launchers' helpers
 * (the argument view, grid limits, integer helpers, the table rows of one version).
 *
 * Inputs a, b are viewed as [outer][n][inner]; batch (o, j) is the n elements at
 * (o * n + i) * inner + j, and out[o * inner + j] = sqrt(sum_i (a - b)^2 / n).
 * out is float32 for float32/float16/bfloat16 inputs, float64 for float64.
 * n == 0 gives NaN for every batch; outer * inner == 0 launches nothing.
 */
#ifndef EWKERN_RMSE_COMMON_CUH
#define EWKERN_RMSE_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <limits.h>
#include <stdint.h>

#include "ewkern_kernels.h"

/* n == 0: out[k] = NaN for k < batches, on stream s; 0 or a cudaError_t. Made in rmse_auto.cu, so
 * that rmse_fill_nan_kernel is compiled in one file. */
namespace ewk {
int rmse_fill_nan(float *out, int64_t batches, cudaStream_t s);
int rmse_fill_nan(double *out, int64_t batches, cudaStream_t s);
} /* namespace ewk */

namespace {

/* ---------------------------------------------------------------------------------------------
 * Element types: T is the stored type, acc_t<T> the arithmetic type (float, or double for
 * float64), out_t<T> the output type (the same).
 * ------------------------------------------------------------------------------------------- */
template <typename T> struct elem;
template <> struct elem<float> {
    typedef float acc;
    static __device__ __forceinline__ float to_acc(float x) { return x; }
};
template <> struct elem<__half> {
    typedef float acc;
    static __device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
};
template <> struct elem<__nv_bfloat16> {
    typedef float acc;
    static __device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
};
template <> struct elem<double> {
    typedef double acc;
    static __device__ __forceinline__ double to_acc(double x) { return x; }
};
template <typename T> using acc_t = typename elem<T>::acc;
template <typename T> using out_t = typename elem<T>::acc;

/* Squared difference of one element pair, in the arithmetic type. */
template <typename T>
__device__ __forceinline__ acc_t<T> sq1(T x, T y)
{
    acc_t<T> d = elem<T>::to_acc(x) - elem<T>::to_acc(y);
    return d * d;
}

/* sqrt(sum / n) in double, rounded once to the output type; NaN for n == 0. */
template <typename O>
__device__ __forceinline__ O finish_double(double sum, int64_t n)
{
    if (n == 0) return (O)__longlong_as_double(0x7ff8000000000000LL);
    return (O)sqrt(sum / (double)n);
}

/* The ladder's finalisation, in the output type as the paper does it. */
__device__ __forceinline__ float finish_o(float sum, int64_t n)
{
    return n == 0 ? __int_as_float(0x7fc00000) : sqrtf(sum / (float)n);
}
__device__ __forceinline__ double finish_o(double sum, int64_t n)
{
    return n == 0 ? __longlong_as_double(0x7ff8000000000000LL) : sqrt(sum / (double)n);
}

/* ---------------------------------------------------------------------------------------------
 * Reductions. Both give the same bits for the same inputs every time (a fixed tree).
 * ------------------------------------------------------------------------------------------- */

/* Sum over the block's threads, any blockDim.x from 1 to 1024 (partial last warps are guarded).
 * The result is valid in thread 0. Ends with no barrier pending: safe to call in a loop.
 * NT > 0: the kernel's block size is NT, fixed at compile time (the masks fold away). */
template <typename A, int NT = 0>
__device__ __forceinline__ A block_sum(A v)
{
    __shared__ A warp_part[32];
    const int nt = NT > 0 ? NT : (int)blockDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (nt + 31) >> 5;
    int width = nt - warp * 32;
    width = width > 32 ? 32 : width;
    unsigned mask = width == 32 ? 0xffffffffu : ((1u << width) - 1u);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        A o = __shfl_down_sync(mask, v, off);
        if (lane + off < width) v += o;
    }
    __syncthreads(); /* warp_part may still be read by a previous call */
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? warp_part[lane] : A(0);
        width = nwarps > 32 ? 32 : nt < 32 ? nt : 32;
        mask = width == 32 ? 0xffffffffu : ((1u << width) - 1u);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            A o = __shfl_down_sync(mask, v, off);
            if (lane + off < width) v += o;
        }
    }
    return v;
}

/* n == 0: NaN everywhere (launched by ewk::rmse_fill_nan alone). */
template <typename O>
__global__ void rmse_fill_nan_kernel(O *out, int64_t batches)
{
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < batches;
         k += (int64_t)blockDim.x * gridDim.x)
        out[k] = finish_double<O>(0.0, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Launchers' helpers
 * ------------------------------------------------------------------------------------------- */
#define RMSE_TRY(call)                                                                         \
    do {                                                                                       \
        cudaError_t rmse_err_ = (call);                                                        \
        if (rmse_err_ != cudaSuccess) return (int)rmse_err_;                                   \
    } while (0)

static const int64_t GRID_X_MAX = INT_MAX;   /* gridDim.x limit */
static const int64_t GRID_Y_MAX = 65535;     /* gridDim.y limit */
static const int64_t GRID_CAP = 1 << 30;     /* grid-stride kernels never need more blocks */

static inline int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }
static inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }
static inline int64_t max64(int64_t x, int64_t y) { return x > y ? x : y; }
static inline int ilog2_ceil(int64_t x)
{
    int l = 0;
    while (((int64_t)1 << l) < x) ++l;
    return l;
}

struct rmse_view {
    const void *a, *b;
    void *out;
    int64_t batches, n;
    cudaStream_t s;
};

static inline rmse_view view_of(const void *p)
{
    const ew_rmse_args *a = (const ew_rmse_args *)p;
    rmse_view v;
    v.a = a->a;
    v.b = a->b;
    v.out = a->out;
    v.batches = a->outer * a->inner;
    v.n = a->n;
    v.s = (cudaStream_t)a->stream;
    return v;
}

template <typename O>
static inline int launch_fill_nan(O *out, int64_t batches, cudaStream_t s)
{
    return ewk::rmse_fill_nan(out, batches, s);
}

/* The table rows of one version, one per dtype; KERNEL(T) names the version's main __global__ function
 * for element type T. */
#define RMSE_ROWS(variant, launch, KERNEL, flags, about)                                               \
    {"rmse", variant, EW_FLOAT32, launch<float>, (const void *)KERNEL(float), flags, about},            \
    {"rmse", variant, EW_FLOAT16, launch<__half>, (const void *)KERNEL(__half), flags, about},          \
    {"rmse", variant, EW_BFLOAT16, launch<__nv_bfloat16>, (const void *)KERNEL(__nv_bfloat16), flags,   \
     about},                                                                                            \
    {"rmse", variant, EW_FLOAT64, launch<double>, (const void *)KERNEL(double), flags, about}

} /* namespace */

#endif /* EWKERN_RMSE_COMMON_CUH */
