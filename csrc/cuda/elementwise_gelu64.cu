/*
 * elementwise_gelu64.cu: auto for float64 gelu and gelu_backward (the table rows in
 * elementwise_auto.cu and elementwise_backward.cu call these).
 * Its branch-free form reads 30 coefficients from __constant__ memory (ULDC.64 into uniform
 * registers; as immediates ptxas needs two UMOVs a DFMA, 1008 instructions against 872 for 8
 * elements, at 52 DP instructions an element), and a module that has __constant__ data costs every
 * kernel in it about 0.12 us a launch (elementwise_auto.cuh): so this file, alone, defines
 * EWK_GELU64_HERE and makes these kernels, and no other kernel shares their module.
 */
#define EWK_GELU64_HERE 1

#include <cuda_runtime.h>

#include "ewkern_kernels.h"
#include "elementwise_run.cuh"
#include "elementwise_grad_run.cuh"

namespace ewk {

int launch_auto_gelu64(const void *args) { return launch_auto<Op_gelu, double>(args); }

const void *auto_gelu64_kernel() { return (const void *)fast_kernel<Op_gelu, double, int, 1, false>(); }

int launch_grad_gelu64(const void *args) { return launch_grad<Grad_gelu, double>(args); }

const void *grad_gelu64_kernel() { return (const void *)fast_n_kernel<Grad_gelu, double, int, 1>(); }

} /* namespace ewk */
