/*
 * elementwise_run.cuh: the host side of one auto launch, shared by the files that make auto's
 * kernels: the pointers of a launch (AutoView), the grid-stride launches (run_gs: grid1/grid2 and
 * differing offsets) and the default path (run_fast: auto_plan's vectors per thread, grid and PDL
 * prefetch), and the table's launchers. Templates only: each file that includes this instantiates
 * the kernels it launches. elementwise_auto.cu makes every (op, dtype) but float64 gelu, which
 * elementwise_gelu64.cu makes (its coefficients live in __constant__ memory, which would cost every
 * other kernel of a shared module time at each launch: elementwise_ops.cuh).
 */
#ifndef EWKERN_ELEMENTWISE_RUN_CUH
#define EWKERN_ELEMENTWISE_RUN_CUH

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "ewkern_kernels.h"
#include "device_cache.cuh"
#include "pdl.cuh"
#include "elementwise_common.cuh"
#include "elementwise_ops.cuh"
#include "elementwise_kernel.cuh"
#include "elementwise_auto.cuh"
#include "elementwise_launch.cuh"

namespace ewk {

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

/* grid1 / grid2 (the study's rules, elementwise_ops_on_gpus.cu) on the grid-stride body; also auto's path
 * when the offsets differ (GRID_1). units: 16-byte vectors plus edge
 * elements (or elements, when the offsets differ). GRID_1: ceil(units / block), one unit per
 * thread; GRID_2: min(GRID_1, SMs x threads_per_SM / block x 32), grid-stride beyond it. */
template <class Op, class T>
int run_gs(const ew_args *a, GridRule rule)
{
    const AutoView<Op, T> w(a);
    if (w.n <= 0)
        return 0;
    const int64_t units = w.head >= 0 ? w.nvec + w.nedge : w.n;
    const int block = a->block > 0 ? a->block : auto_block();
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

/* ew_fast's plain form for a launch of VPT vectors a thread that the store rule (wb) sends to
 * write-back or streaming stores: its write-back instance or its streaming one (auto_wb, WB: its
 * one form, write-back already) */
template <class Op, class T, int VPT, bool WB>
static inline auto plain_kernel(int wb)
{
    return !WB && wb ? fast_kernel<Op, T, int, VPT, true, false>() : fast_kernel<Op, T, int, VPT, WB, WB>();
}

template <class Op, class T, bool WB>
static int run_fast(const ew_args *a)
{
    const AutoView<Op, T> w(a);
    if (w.n <= 0)
        return 0;
    if (w.head < 0)
        return run_gs<Op, T>(a, GRID_1);
    const int block = a->block > 0 ? a->block : auto_block();
    const int dev = a->device;
    const bool pdl = ewcuda_pdl_active(dev);
    static std::atomic<int> occ1[kMaxCachedDevices], occ4[kMaxCachedDevices];
    const int64_t wave1 = wave_blocks(occ1, (const void *)fast_kernel<Op, T, int, 1, WB>(), block, dev) * block;
    /* 32-bit indices when every index formed fits (grid * vpt * block <= nvec + 2 * 4 * block) */
    const bool i32 = w.n + w.nvec + 8 * int64_t(block) < int64_t(INT_MAX);
    const bool heavy16 = Heavy<typename MathOf<Op, T>::type>::value && sizeof(T) == 2;
    const cudaStream_t s = stream_of(a);
    /* decided before the plan: on a wide device (wide_sm) a programmatic launch at 2-4 waves takes
     * 4 vectors a thread without the prefetch, a plain one (behind a foreign kernel in a captured
     * graph) 1 with the plain form, as before (H200 8ecf70e, 16 MiB after torch.mul, ewkern / torch:
     * copy 0.987 -> 0.944-0.961, exp 0.985-0.996 -> 0.946-0.965 with 4 a thread there) */
    const PdlDecision d = pdl_decide(s, pdl);
    const AutoPlan plan = auto_plan(w.nvec, w.nedge, block, wave1, i32, pdl, int(Op::KIND) == KIND_FILL, heavy16, [&] {
        return wave_blocks(occ4, (const void *)fast_kernel<Op, T, int, 4, WB>(), block, dev) * block * 4;
    }, sizeof(T) == 8 ? int(Heavy64<typename MathOf<Op, T>::type>::value) : 0, heavy16 ? heavy16_waves(dev) : 32,
                                    wide_launch<Op>(dev, d));
    const int vpt = plan.vpt;
    const int64_t grid = plan.grid;
    OpArgs<T> p = op_args<T>(a);
    p.prefetch = plan.prefetch;
    /* the store rule (store_wb): the PDL form reads it, the plain form is chosen by it (below) */
    p.wb = store_wb(dev, w.n * int64_t(sizeof(T)) * (Op::NIN + 1), w.n * int64_t(sizeof(T)));
    const dim3 g{unsigned(clamp_grid(grid))}, bl{unsigned(block)};
    const T *xh = w.xh(), *yh = w.yh();
    T *zh = w.z + w.head;
    cudaError_t err;
    if (i32) {
        /* launches without PDL take ew_fast's plain form (no prefetch, no wait), in two instances:
         * streaming stores, and write-back stores where the store rule says so (plain_kernel), chosen here
         * because a run-time predicate in the plain form cost it 0.05 us at 1-4 MiB after a torch
         * kernel (91efc65). One form for auto_wb (a study variant) and for 64-bit indices (> 2^31
         * elements: 0.1 us is nothing) */
        const int n32 = int(w.n - w.head), h32 = int(w.head);
        if (vpt == 1)
            err = pdl_launch_as(fast_kernel<Op, T, int, 1, WB>(), plain_kernel<Op, T, 1, WB>(p.wb), g, bl, 0, s, d,
                                xh, yh, zh, n32, h32, p);
        else if (vpt == 2)
            err = pdl_launch_as(fast_kernel<Op, T, int, 2, WB>(), plain_kernel<Op, T, 2, WB>(p.wb), g, bl, 0, s, d,
                                xh, yh, zh, n32, h32, p);
        else
            err = pdl_launch_as(fast_kernel<Op, T, int, 4, WB>(), plain_kernel<Op, T, 4, WB>(p.wb), g, bl, 0, s, d,
                                xh, yh, zh, n32, h32, p);
    } else {
        const auto k64 = fast_kernel<Op, T, int64_t, 1, WB>();
        err = pdl_launch_as(k64, k64, g, bl, 0, s, d, xh, yh, zh, w.n - w.head, w.head, p);
    }
    return err != cudaSuccess ? int(err) : int(cudaGetLastError());
}

template <class Op, class T>
static int launch_auto(const void *args) { return run_fast<Op, T, false>(static_cast<const ew_args *>(args)); }
template <class Op, class T>
static int launch_auto_wb(const void *args) { return run_fast<Op, T, true>(static_cast<const ew_args *>(args)); }

} /* namespace ewk */

#endif /* EWKERN_ELEMENTWISE_RUN_CUH */
