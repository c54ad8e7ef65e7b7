/*
 * elementwise_auto.cuh: what elementwise_auto.cu (the default path) makes for another kernel file:
 * the grid-stride launches of auto's body under the elementwise study's grid rules, for family 6 of
 * elementwise_ops_on_gpus.cu. run_gs (defined in elementwise_run.cuh) is also auto's path when the
 * pointers' offsets differ, so its kernels for the (op, dtype) pairs of EWK_GS_LIST are made in
 * elementwise_auto.cu alone (explicit instantiations there; elementwise_gelu64.cu makes float64
 * gelu's own). The host stub of a __global__ template instance is local to the
 * file that makes it (nvcc's -static-global-template-stub in whole-program mode), so that file also
 * hands out the kernel's address (gs_kernel) for the table rows.
 */
#ifndef EWKERN_ELEMENTWISE_AUTO_CUH
#define EWKERN_ELEMENTWISE_AUTO_CUH

#include "ewkern_kernels.h"
#include "elementwise_types.cuh"

namespace ewk {

/* (op, element type, dtype) of the grid1/grid2 rows */
#define EWK_GS_LIST(X) \
    X(log, float, EW_FLOAT32) \
    X(log, bf16_t, EW_BFLOAT16) \
    X(erf, float, EW_FLOAT32) \
    X(erf, bf16_t, EW_BFLOAT16) \
    X(add_const, float, EW_FLOAT32) \
    X(add_const, bf16_t, EW_BFLOAT16)

/* the ops' functors (elementwise_ops.cuh); their names are all a caller needs */
#define EWK_GS_DECLARE(NAME, T, DT) struct Op_##NAME;
EWK_GS_LIST(EWK_GS_DECLARE)
#undef EWK_GS_DECLARE

enum GridRule { GRID_1, GRID_2 };

/* Op on element type T over a->n elements on the grid-stride body (ew_gs): GRID_1 = one unit per
 * thread, GRID_2 = at most SMs x threads_per_SM / block x 32 blocks. 0 or a cudaError_t. */
template <class Op, class T> int run_gs(const ew_args *a, GridRule rule);
/* ew_gs<Op, T, int, true>, the kernel of the 16-byte-vector case */
template <class Op, class T> const void *gs_kernel();

/* auto for float64 gelu, made in elementwise_gelu64.cu: its launcher (the table row's) and main
 * kernel. That op's coefficients sit in __constant__ memory (elementwise_ops.cuh), and a module
 * with any __constant__ data costs each launch of every kernel in it about 0.12 us, used or not
 * (H200, a 1 MiB add: 1.70 against 1.57 us back-to-back without PDL, 0.12 us after a torch kernel;
 * ELEMENTWISE_NOTES.md), so they get a file, and module, of their own. */
int launch_auto_gelu64(const void *args);
const void *auto_gelu64_kernel();
/* and float64 gelu_backward's (elementwise_backward.cu's table row), whose math reads the same
 * coefficients */
int launch_grad_gelu64(const void *args);
const void *grad_gelu64_kernel();

} /* namespace ewk */

#endif /* EWKERN_ELEMENTWISE_AUTO_CUH */
