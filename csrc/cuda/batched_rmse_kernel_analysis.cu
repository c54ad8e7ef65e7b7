/*
 * batched_rmse_kernel_analysis.cu: batched RMSE on the GPU in the steps of the paper
 * (batched-rmse-kernel-analysis.txt; papers/README.md, item R1), versions 1-5. The default path,
 * version 6, is rmse_auto.cu; the shared types and helpers are in rmse_common.cuh.
 *
 * Inputs a, b are viewed as [outer][n][inner]; batch (o, j) is the n elements at
 * (o * n + i) * inner + j, and out[o * inner + j] = sqrt(sum_i (a - b)^2 / n).
 * out is float32 for float32/float16/bfloat16 inputs, float64 for float64.
 * n == 0 gives NaN for every batch; outer * inner == 0 launches nothing.
 *
 * Versions, in the order of the paper (batched-rmse-kernel-analysis.txt). Time each on the
 * paper's shape, 16 batches of 1024 x 1024 float32, with `python -m ewkern.bench r1`
 * (ewkern.rmse(..., variant=<name>); outer = 16, n = 2^20, inner = 1):
 *   1 "atomic"     one block per batch, every squared difference atomically added into out[batch],
 *                  then sqrt(out / n) by the same block after a barrier. The paper: ~20 ms, 5x
 *                  slower than 2; an H100: 26 ms, 14x. Contiguous batches only; honours block.
 *   2 "block"      one block per batch, a private sum per thread over a block-stride loop, one block
 *                  reduction (warp shuffles + shared memory), one write. Contiguous; honours block.
 *   3 "multiblock" a 2-D grid (blocks per batch x batches): each block reduces its grid-stride share
 *                  and adds it atomically into out (zeroed first); a second launch takes
 *                  sqrt(out / n). Default 48 blocks per batch x 512 threads (the paper's numbers);
 *                  honours block and grid (grid = blocks per batch). Contiguous only.
 *   4 "occupancy"  3's kernel with block size and blocks per batch from
 *                  cudaOccupancyMaxPotentialBlockSize (whose grid is SMs x resident blocks per SM),
 *                  clamped to n as the paper does. Contiguous only.
 *   5 "int32"      4 with 32-bit indices, __restrict__ pointers and an unrolled main loop without
 *                  bounds checks (a separate guarded tail): the paper's register-pressure step.
 *                  Falls back to 4 when batches * n does not fit 32 bits. Contiguous only.
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <atomic>
#include <limits.h>
#include <stdint.h>

#include "ewkern_kernels.h"
#include "device_cache.cuh"
#include "rmse_common.cuh"

namespace {

/* =============================================================================================
 * 1 atomic
 * =========================================================================================== */
template <typename T>
__global__ void rmse_atomic_kernel(const T *a, const T *b, out_t<T> *out, int64_t batches, int64_t n)
{
    typedef out_t<T> O;
    for (int64_t bt = blockIdx.x; bt < batches; bt += gridDim.x) {
        const T *pa = a + bt * n, *pb = b + bt * n;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(out + bt, (O)sq1(pa[i], pb[i]));
        __syncthreads(); /* every atomic of this batch is done */
        if (threadIdx.x == 0) out[bt] = finish_o(atomicAdd(out + bt, (O)0), n);
    }
}

/* =============================================================================================
 * 2 block
 * =========================================================================================== */
template <typename T>
__global__ void rmse_block_kernel(const T *a, const T *b, out_t<T> *out, int64_t batches, int64_t n)
{
    typedef out_t<T> O;
    for (int64_t bt = blockIdx.x; bt < batches; bt += gridDim.x) {
        const T *pa = a + bt * n, *pb = b + bt * n;
        O v = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (O)sq1(pa[i], pb[i]);
        v = block_sum(v);
        if (threadIdx.x == 0) out[bt] = finish_o(v, n);
    }
}

/* =============================================================================================
 * 3 multiblock (and 4 occupancy, the same kernel configured at run time)
 * =========================================================================================== */
template <typename T>
__global__ void rmse_multiblock_kernel(const T *a, const T *b, out_t<T> *out, int64_t batches,
                                       int64_t n)
{
    typedef out_t<T> O;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t bt = blockIdx.y; bt < batches; bt += gridDim.y) {
        const T *pa = a + bt * n, *pb = b + bt * n;
        O v = 0;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            v += (O)sq1(pa[i], pb[i]);
        v = block_sum(v);
        if (threadIdx.x == 0) atomicAdd(out + bt, v);
    }
}

/* out[k] = sqrt(out[k] / n): the second launch of 3, 4 and 5. */
template <typename O>
__global__ void rmse_finalize_kernel(O *out, int64_t batches, int64_t n)
{
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < batches;
         k += (int64_t)blockDim.x * gridDim.x)
        out[k] = finish_o(out[k], n);
}

/* =============================================================================================
 * 5 int32: 32-bit indices, restrict, an unguarded 4-way unrolled main loop, a guarded tail.
 * The launcher guarantees batches * n + 4 * stride + 65536 <= INT_MAX, so nothing overflows.
 * =========================================================================================== */
template <typename T>
__global__ void rmse_int32_kernel(const T *__restrict__ a, const T *__restrict__ b,
                                  out_t<T> *__restrict__ out, int batches, int n)
{
    typedef out_t<T> O;
    const int stride = blockDim.x * gridDim.x;
    for (int bt = blockIdx.y; bt < batches; bt += gridDim.y) {
        const T *__restrict__ pa = a + bt * n;
        const T *__restrict__ pb = b + bt * n;
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        O v = 0;
        for (; i + 3 * stride < n; i += 4 * stride) {
            const O s0 = (O)sq1(pa[i], pb[i]);
            const O s1 = (O)sq1(pa[i + stride], pb[i + stride]);
            const O s2 = (O)sq1(pa[i + 2 * stride], pb[i + 2 * stride]);
            const O s3 = (O)sq1(pa[i + 3 * stride], pb[i + 3 * stride]);
            v += s0;
            v += s1;
            v += s2;
            v += s3;
        }
        for (; i < n; i += stride) v += (O)sq1(pa[i], pb[i]);
        v = block_sum(v);
        if (threadIdx.x == 0) atomicAdd(out + bt, v);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Launchers
 * ------------------------------------------------------------------------------------------- */
/* Versions 1-5 need inner == 1 (once there is work: n == 0 or no batches is the same for every
 * layout); the host checks EW_CONTIGUOUS_BATCHES_ONLY, this is a guard. */
static inline bool contiguous(const void *p) { return ((const ew_rmse_args *)p)->inner == 1; }

template <typename O>
static int launch_finalize(O *out, int64_t batches, int64_t n, cudaStream_t s)
{
    rmse_finalize_kernel<O><<<(unsigned)min64(cdiv(batches, 256), 65535), 256, 0, s>>>(out, batches, n);
    return (int)cudaGetLastError();
}

/* 1 atomic */
template <typename T>
static int launch_atomic(const void *p)
{
    const ew_rmse_args *args = (const ew_rmse_args *)p;
    const rmse_view v = view_of(p);
    typedef out_t<T> O;
    if (v.batches == 0) return 0;
    if (v.n == 0) return launch_fill_nan<O>((O *)v.out, v.batches, v.s);
    if (!contiguous(p)) return (int)cudaErrorInvalidValue;
    const int block = args->block > 0 ? args->block : 256;
    RMSE_TRY(cudaMemsetAsync(v.out, 0, (size_t)v.batches * sizeof(O), v.s));
    rmse_atomic_kernel<T><<<(unsigned)min64(v.batches, GRID_CAP), block, 0, v.s>>>(
        (const T *)v.a, (const T *)v.b, (O *)v.out, v.batches, v.n);
    return (int)cudaGetLastError();
}

/* 2 block */
template <typename T>
static int launch_block(const void *p)
{
    const ew_rmse_args *args = (const ew_rmse_args *)p;
    const rmse_view v = view_of(p);
    typedef out_t<T> O;
    if (v.batches == 0) return 0;
    if (v.n == 0) return launch_fill_nan<O>((O *)v.out, v.batches, v.s);
    if (!contiguous(p)) return (int)cudaErrorInvalidValue;
    const int block = args->block > 0 ? args->block : 256;
    rmse_block_kernel<T><<<(unsigned)min64(v.batches, GRID_CAP), block, 0, v.s>>>(
        (const T *)v.a, (const T *)v.b, (O *)v.out, v.batches, v.n);
    return (int)cudaGetLastError();
}

/* 3 multiblock, also the body of 4: zero out, the 2-D grid, the finalisation. */
template <typename T>
static int run_multiblock(const rmse_view &v, int64_t per_batch, int block)
{
    typedef out_t<T> O;
    if (v.n == 0) return launch_fill_nan<O>((O *)v.out, v.batches, v.s);
    RMSE_TRY(cudaMemsetAsync(v.out, 0, (size_t)v.batches * sizeof(O), v.s));
    const dim3 grid((unsigned)min64(per_batch, GRID_X_MAX), (unsigned)min64(v.batches, GRID_Y_MAX));
    rmse_multiblock_kernel<T><<<grid, block, 0, v.s>>>((const T *)v.a, (const T *)v.b, (O *)v.out,
                                                       v.batches, v.n);
    RMSE_TRY(cudaGetLastError());
    return launch_finalize<O>((O *)v.out, v.batches, v.n, v.s);
}

template <typename T>
static int launch_multiblock(const void *p)
{
    const ew_rmse_args *args = (const ew_rmse_args *)p;
    const rmse_view v = view_of(p);
    typedef out_t<T> O;
    if (v.batches == 0) return 0;
    if (v.n == 0) return launch_fill_nan<O>((O *)v.out, v.batches, v.s);
    if (!contiguous(p)) return (int)cudaErrorInvalidValue;
    return run_multiblock<T>(v, args->grid > 0 ? args->grid : 48, args->block > 0 ? args->block : 512);
}

/* 4 occupancy: cudaOccupancyMaxPotentialBlockSize once per (kernel, device), cached. Its grid
 * is the device's resident-block count (SMs x blocks per SM), which the paper (CUDA.jl's
 * launch_configuration) uses as blocks per batch; occupancy_split clamps both to n. */
struct occ_entry {
    std::atomic<int> grid, block;
};

template <typename K>
static int occupancy_split(occ_entry *cache, K kernel, int device, int64_t n, int64_t *per_batch, int64_t *block)
{
    occ_entry *e = device >= 0 && device < kMaxCachedDevices ? &cache[device] : NULL;
    int g = 0, b = 0;
    if (e && e->block.load(std::memory_order_acquire) > 0) {
        g = e->grid.load(std::memory_order_relaxed);
        b = e->block.load(std::memory_order_relaxed);
    } else {
        RMSE_TRY(cudaOccupancyMaxPotentialBlockSize(&g, &b, kernel, 0, 0));
        if (e) {
            e->grid.store(g, std::memory_order_relaxed);
            e->block.store(b, std::memory_order_release);
        }
    }
    *per_batch = max64(1, min64(g, n));
    *block = max64(1, min64(b, cdiv(n, *per_batch)));
    return 0;
}

template <typename T>
static int launch_occupancy(const void *p)
{
    static occ_entry cache[kMaxCachedDevices];
    const ew_rmse_args *args = (const ew_rmse_args *)p;
    const rmse_view v = view_of(p);
    typedef out_t<T> O;
    if (v.batches == 0) return 0;
    if (v.n == 0) return launch_fill_nan<O>((O *)v.out, v.batches, v.s);
    if (!contiguous(p)) return (int)cudaErrorInvalidValue;
    int64_t per_batch, block;
    RMSE_TRY((cudaError_t)occupancy_split(cache, rmse_multiblock_kernel<T>, args->device, v.n, &per_batch, &block));
    return run_multiblock<T>(v, per_batch, (int)block);
}

/* 5 int32 */
template <typename T>
static int launch_int32(const void *p)
{
    static occ_entry cache[kMaxCachedDevices];
    const ew_rmse_args *args = (const ew_rmse_args *)p;
    const rmse_view v = view_of(p);
    typedef out_t<T> O;
    if (v.batches == 0) return 0;
    if (v.n == 0) return launch_fill_nan<O>((O *)v.out, v.batches, v.s);
    if (!contiguous(p)) return (int)cudaErrorInvalidValue;
    int64_t per_batch, block;
    RMSE_TRY((cudaError_t)occupancy_split(cache, rmse_int32_kernel<T>, args->device, v.n, &per_batch, &block));
    const int64_t stride = per_batch * block;
    if (v.batches > INT_MAX / v.n || v.batches * v.n + 4 * stride + 65536 > INT_MAX)
        return launch_occupancy<T>(p); /* too large for 32-bit indices: version 4 */
    RMSE_TRY(cudaMemsetAsync(v.out, 0, (size_t)v.batches * sizeof(O), v.s));
    const dim3 grid((unsigned)per_batch, (unsigned)min64(v.batches, GRID_Y_MAX));
    rmse_int32_kernel<T><<<grid, (int)block, 0, v.s>>>((const T *)v.a, (const T *)v.b, (O *)v.out,
                                                       (int)v.batches, (int)v.n);
    RMSE_TRY(cudaGetLastError());
    return launch_finalize<O>((O *)v.out, v.batches, v.n, v.s);
}

/* ---------------------------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------------------------- */
#define RMSE_CONTIG EW_CONTIGUOUS_BATCHES_ONLY
#define K_ATOMIC(T) rmse_atomic_kernel<T>
#define K_BLOCK(T) rmse_block_kernel<T>
#define K_MULTIBLOCK(T) rmse_multiblock_kernel<T>
#define K_INT32(T) rmse_int32_kernel<T>

static const ew_kernel rmse_table[] = {
    RMSE_ROWS("atomic", launch_atomic, K_ATOMIC, EW_USES_BLOCK | RMSE_CONTIG,
              "one block per batch, an atomicAdd into out per element, sqrt after a barrier"),
    RMSE_ROWS("block", launch_block, K_BLOCK, EW_USES_BLOCK | RMSE_CONTIG,
              "one block per batch, private sums and one block reduction (shuffles + shared memory)"),
    RMSE_ROWS("multiblock", launch_multiblock, K_MULTIBLOCK, EW_USES_BLOCK | EW_USES_GRID | RMSE_CONTIG,
              "blocks per batch x batches grid, one atomicAdd per block, a second launch for sqrt"),
    RMSE_ROWS("occupancy", launch_occupancy, K_MULTIBLOCK, RMSE_CONTIG,
              "multiblock with block size and blocks per batch from the occupancy API"),
    RMSE_ROWS("int32", launch_int32, K_INT32, RMSE_CONTIG,
              "occupancy with 32-bit indices, restrict and an unguarded unrolled main loop"),
};

} /* namespace */

extern "C" const ew_kernel *ew_cuda_batched_rmse_kernel_analysis_table(int *count)
{
    *count = (int)(sizeof(rmse_table) / sizeof(rmse_table[0]));
    return rmse_table;
}
