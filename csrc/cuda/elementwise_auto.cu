/*
 * elementwise_auto.cu: the default path of every elementwise op, the variant "auto" that ewkern.add,
 * ewkern.log, ... run, and its two store/arithmetic alternatives.
 *
 * Each row of the table at the bottom is one (op, variant, dtype) with its launcher and main __global__
 * function. Time any row with the benchmark (ewkern.bench: op, dtype, variant; `python -m ewkern.bench
 * e3` times every op x dtype, `python -m ewkern.bench peers` auto against torch); registers, SASS and the
 * measurements behind each launch rule are in ELEMENTWISE_NOTES.md. The kernels themselves are device
 * templates in elementwise_kernel.cuh, the op math in elementwise_ops.cuh, the launch rules in
 * elementwise_launch.cuh and elementwise_run.cuh; this file instantiates every kernel its table
 * launches but float64 gelu's, which elementwise_gelu64.cu makes (elementwise_auto.cuh says why).
 *
 *  5. "auto"   every op x every dtype, the fast default: 16-byte vectors, 1, 2 or 4 per thread
 *              (the fewest that let the grid fit one wave of resident blocks, from the device's SM
 *              count and the kernel's occupancy), every load issued before the first store, no
 *              loop, streaming stores (st.global.cs) for outputs under 1/32 of the L2 and write-back
 *              stores from there (store_wb), the scalar head (up to the 16-byte boundary)
 *              and tail on otherwise idle threads, 32-bit index unless n is too large,
 *              programmatic dependent launch on sm_90+ (pdl.cuh) with the first vector's lines
 *              prefetched into L2 before the wait (then 1 or 2 vectors per thread, never 4;
 *              float64 exp/log/erf/tanh/sigmoid/silu/gelu take 4 past 4 waves, torch's shape);
 *              float16/bfloat16 computed in float32 (log through the SFU's log2), float64 in
 *              double. "auto_wb" (fill, copy, add, add_const, log, erf): the same
 *              with write-back stores. (Measured on the H100: see the notes.)
 *  7. "bf16_fma" add_const bfloat16 as __hfma2(x, 1, c) on bf16x2 pairs, c rounded to bfloat16 first.
 *
 * (Families 1-4 and 6 are the reference studies: add_kernel_experiments.cu, cuda_vectorization_f16x8.cu,
 * elementwise_ops_on_gpus.cu; family 6, the study's grid rules on auto's body, launches through run_gs
 * here, declared in elementwise_auto.cuh.)
 *
 * Every version is correct for any n >= 0 and any element-aligned pointers (out may equal an input):
 * the vectors follow a scalar head up to the 16-byte boundary when all pointers share one offset, a
 * scalar tail ends them, and a one-element-per-thread grid-stride instance takes pointers whose
 * offsets differ.
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
#include "elementwise_common.cuh"
#include "elementwise_ops.cuh"
#include "elementwise_kernel.cuh"
#include "elementwise_auto.cuh"
#include "elementwise_launch.cuh"
#include "elementwise_run.cuh"

namespace ewk {

#define EW_OP(name, inputs, scalars, definition, accuracy) \
    static_assert(int(Op_##name::NIN) == (inputs), "ops.def and elementwise_ops.cuh disagree on " #name);
#include "ops.def"
#undef EW_OP

#define EWK_AUTO_KERNEL(Op, T) ((const void *)fast_kernel<Op, T, int, 1, false>())

/* An auto row's launcher and main kernel: made here for every (op, dtype) but float64 gelu, whose
 * kernels elementwise_gelu64.cu makes (elementwise_auto.cuh says why). */
template <class Op, class T> struct AutoRow {
    static int launch(const void *args) { return launch_auto<Op, T>(args); }
    static const void *kernel() { return EWK_AUTO_KERNEL(Op, T); }
};
template <> struct AutoRow<Op_gelu, double> {
    static int launch(const void *args) { return launch_auto_gelu64(args); }
    static const void *kernel() { return auto_gelu64_kernel(); }
};

/* run_gs and its kernel's address for the (op, dtype) pairs of family 6 (elementwise_auto.cuh): made
 * here once, where auto's fallback instantiates the same kernels. */
template <class Op, class T>
const void *gs_kernel() { return (const void *)ew_gs<Op, T, int, true>; }

#define EWK_GS_INSTANCE(NAME, T, DT) \
    template int run_gs<Op_##NAME, T>(const ew_args *, GridRule); \
    template const void *gs_kernel<Op_##NAME, T>();
EWK_GS_LIST(EWK_GS_INSTANCE)

/* ---------------------------------------------------------------------------------------------
 * The table.
 * ------------------------------------------------------------------------------------------- */

#define EWK_B EW_USES_BLOCK

#define EWK_AUTO_ABOUT \
    "fast default: 16-byte vectors, 1/2/4 per thread so the grid fits one wave of the device when it can, " \
    "all loads before the first store, streaming stores for outputs under 1/32 of the L2 (write-back from " \
    "there), head/tail on spare threads (scalar if offsets differ), 32-bit index when n allows, PDL on sm_90+ " \
    "with an L2 prefetch of the first vector before the wait"
#define EWK_AUTO_ROW(NAME, T, DT) \
    {#NAME, "auto", DT, AutoRow<Op_##NAME, T>::launch, AutoRow<Op_##NAME, T>::kernel(), EWK_B, EWK_AUTO_ABOUT},
#define EW_OP(name, inputs, scalars, definition, accuracy) \
    EWK_AUTO_ROW(name, float, EW_FLOAT32) \
    EWK_AUTO_ROW(name, half_t, EW_FLOAT16) \
    EWK_AUTO_ROW(name, bf16_t, EW_BFLOAT16) \
    EWK_AUTO_ROW(name, double, EW_FLOAT64)

#define EWK_WB_ROWS(NAME) \
    {#NAME, "auto_wb", EW_FLOAT32, launch_auto_wb<Op_##NAME, float>, (const void *)ew_fast<Op_##NAME, float, int, 1, true>, \
     EWK_B, "auto with ordinary write-back stores instead of streaming (st.global.cs) stores"}, \
    {#NAME, "auto_wb", EW_FLOAT16, launch_auto_wb<Op_##NAME, half_t>, (const void *)ew_fast<Op_##NAME, half_t, int, 1, true>, \
     EWK_B, "auto with ordinary write-back stores instead of streaming (st.global.cs) stores"}, \
    {#NAME, "auto_wb", EW_BFLOAT16, launch_auto_wb<Op_##NAME, bf16_t>, (const void *)ew_fast<Op_##NAME, bf16_t, int, 1, true>, \
     EWK_B, "auto with ordinary write-back stores instead of streaming (st.global.cs) stores"},

static const ew_kernel kTable[] = {
    /* 5. auto: every op of ops.def x float32, float16, bfloat16, float64 */
#include "ops.def"
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

/* auto's rule with every input given, and for the run-time kernels of ewkern.rtc (declared in
 * cuda_api.h) */
extern "C" void ewcuda_auto_plan_rule(long long nvec, long long nedge, int block, long long wave1, long long wave4,
                                      int i32, int pdl, int fill, int heavy16, int heavy64, long long heavy16_from,
                                      int wide, int max_vpt, int heavy_math, int *vpt, long long *grid,
                                      int *prefetch)
{
    const ewk::AutoPlan plan = ewk::auto_plan(nvec, nedge, block, wave1, i32 != 0, pdl != 0, fill != 0, heavy16,
                                              [&] { return int64_t(wave4); }, heavy64, heavy16_from, wide != 0,
                                              max_vpt, heavy_math != 0);
    *vpt = plan.vpt;
    *grid = plan.grid;
    *prefetch = plan.prefetch;
}

extern "C" void ewcuda_auto_plan(int device, long long nvec, long long nedge, int block, long long wave1,
                                 long long wave4, int i32, int pdl, int heavy, int elems, int wide, int max_vpt,
                                 int *vpt, long long *grid, int *prefetch)
{
    ewcuda_auto_plan_rule(nvec, nedge, block, wave1, wave4, i32, pdl, 0, heavy && elems == 8 ? 2 : 0,
                          heavy && elems == 2 ? int(ewk::H64_EXP) : 0, 32, wide && pdl, max_vpt, 0, vpt, grid,
                          prefetch);
}

extern "C" int ewcuda_store_wb(int device, long long bytes, long long out_bytes)
{
    return ewk::store_wb(device, int64_t(bytes), int64_t(out_bytes));
}

extern "C" const ew_kernel *ew_cuda_elementwise_auto_table(int *count)
{
    if (count)
        *count = int(sizeof(ewk::kTable) / sizeof(ewk::kTable[0]));
    return ewk::kTable;
}
