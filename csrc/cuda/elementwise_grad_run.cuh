/*
 * elementwise_grad_run.cuh: the launch of a backward op of grads.def on the default path (run_grad:
 * auto's rule for NIN arrays in and NOUT gradients out), shared by elementwise_backward.cu, which
 * makes every (op, dtype) but float64 gelu's, and elementwise_gelu64.cu, which makes that one
 * (elementwise_auto.cuh says why). Templates only: each file that includes this instantiates what it
 * launches.
 */
#ifndef EWKERN_ELEMENTWISE_GRAD_RUN_CUH
#define EWKERN_ELEMENTWISE_GRAD_RUN_CUH

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "ewkern_kernels.h"
#include "device_cache.cuh"
#include "pdl.cuh"
#include "elementwise_common.cuh"
#include "elementwise_grads.cuh"
#include "elementwise_kernel.cuh"
#include "elementwise_launch.cuh"

namespace ewk {

/* The arrays of one launch, each from its first element, and their common head. */
template <class Op, class T>
struct GradView {
    Arrays<T, Op::NIN, Op::NOUT> arr;
    int64_t n, head, nvec, nedge;
    explicit GradView(const ew_args *a)
    {
        n = a->n;
        const void *ptrs[Op::NIN + Op::NOUT];
        int np = 0;
        for (int q = 0; q < Op::NIN; ++q)
            ptrs[np++] = arr.in[q] = static_cast<const T *>(a->in[q]);
        void *const outs[2] = {a->out, a->out2};
        for (int q = 0; q < Op::NOUT; ++q)
            if ((arr.out[q] = static_cast<T *>(outs[q])) != nullptr)
                ptrs[np++] = arr.out[q];
        head = n > 0 ? common_head(ptrs, np, 16, int(sizeof(T)), n) : 0;
        nvec = head >= 0 ? (n - head) / Vec16<T>::N : 0;
        nedge = head >= 0 ? n - nvec * Vec16<T>::N : n;
    }
    /* every pointer moved to the 16-byte boundary (a NULL output stays NULL) */
    Arrays<T, Op::NIN, Op::NOUT> at_head() const
    {
        Arrays<T, Op::NIN, Op::NOUT> r = arr;
        for (int q = 0; q < Op::NIN; ++q)
            r.in[q] += head;
        for (int q = 0; q < Op::NOUT; ++q)
            r.out[q] = r.out[q] ? r.out[q] + head : nullptr;
        return r;
    }
};

template <class Op, class T>
static int run_grad(const ew_args *a)
{
    const GradView<Op, T> w(a);
    if (w.n <= 0)
        return 0;
    const int block = a->block > 0 ? a->block : auto_block();
    const int dev = a->device;
    const bool pdl = ewcuda_pdl_active(dev);
    const cudaStream_t s = stream_of(a);
    OpArgs<T> p = op_args<T>(a);
    cudaError_t err;
    if (w.head < 0) {
        /* offsets differ: one element per thread over at most 32 waves */
        const int64_t grid = clamp_grid(std::min(ceil_div(w.n, block), wave_grid(a, block, 32)));
        err = pdl_launch(ew_elem_n<Op, T>, dim3{unsigned(grid)}, dim3{unsigned(block)}, 0, s, pdl, w.arr, w.n, p);
        return err != cudaSuccess ? int(err) : int(cudaGetLastError());
    }
    static std::atomic<int> occ1[kMaxCachedDevices], occ4[kMaxCachedDevices];
    const int64_t wave1 = wave_blocks(occ1, (const void *)fast_n_kernel<Op, T, int, 1>(), block, dev) * block;
    const bool i32 = w.n + w.nvec + 8 * int64_t(block) < int64_t(INT_MAX);
    /* as run_fast: the decision first, so that a programmatic launch on a wide device takes 4 vectors
     * a thread without the prefetch at 2-4 waves (wide_launch; not div, whose 4-vector backward
     * kernel also spills), and a plain one the plain form; the float64 gradients of gelu, silu and
     * erf count as heavy math for the prefetch rule (heavy_math), as the forward's float64 math does */
    const PdlDecision d = pdl_decide(s, pdl);
    const AutoPlan plan = auto_plan(w.nvec, w.nedge, block, wave1, i32, pdl, false,
                                    Heavy<typename MathOf<Op, T>::type>::value && sizeof(T) == 2, [&] {
        return wave_blocks(occ4, (const void *)fast_n_kernel<Op, T, int, 4>(), block, dev) * block * 4;
    }, 0, 32, wide_launch<Op>(dev, d), 4, sizeof(T) == 8 && Heavy<Op>::value);
    p.prefetch = plan.prefetch;
    /* the store rule, as run_fast's: the gradients are what the next backward kernel reads (the plain
     * form by its instance, plain_n_kernel) */
    p.wb = store_wb(dev, w.n * int64_t(sizeof(T)) * (Op::NIN + Op::NOUT), w.n * int64_t(sizeof(T)) * Op::NOUT);
    const dim3 g{unsigned(clamp_grid(plan.grid))}, bl{unsigned(block)};
    const Arrays<T, Op::NIN, Op::NOUT> arr = w.at_head();
    if (i32) {
        const int n32 = int(w.n - w.head), h32 = int(w.head);
        if (plan.vpt == 1)
            err = pdl_launch_as(fast_n_kernel<Op, T, int, 1>(), plain_n_kernel<Op, T, 1>(p.wb), g, bl, 0, s, d,
                                arr, n32, h32, p);
        else if (plan.vpt == 2)
            err = pdl_launch_as(fast_n_kernel<Op, T, int, 2>(), plain_n_kernel<Op, T, 2>(p.wb), g, bl, 0, s, d,
                                arr, n32, h32, p);
        else
            err = pdl_launch_as(fast_n_kernel<Op, T, int, 4>(), plain_n_kernel<Op, T, 4>(p.wb), g, bl, 0, s, d,
                                arr, n32, h32, p);
    } else {
        const auto k64 = fast_n_kernel<Op, T, int64_t, 1>();
        err = pdl_launch_as(k64, k64, g, bl, 0, s, d, arr, w.n - w.head, w.head, p);
    }
    return err != cudaSuccess ? int(err) : int(cudaGetLastError());
}

template <class Op, class T>
static int launch_grad(const void *args) { return run_grad<Op, T>(static_cast<const ew_args *>(args)); }

} /* namespace ewk */

#endif /* EWKERN_ELEMENTWISE_GRAD_RUN_CUH */
