/*
 * ewkern_kernels.h: the contract between the host code (csrc/ C files) and every kernel,
 * CPU (csrc/cpu/ C files) and CUDA (csrc/cuda/ .cu files). Plain C, included from both.
 *
 * Each kernel file exports one table of ew_kernel entries through a function
 *     const ew_kernel *ew_<backend>_<family>_table(int *count);
 * The host registry (csrc/registry.c) concatenates these tables; nothing else
 * names a kernel. Adding a version means adding one row to its file's table.
 */
#ifndef EWKERN_KERNELS_H
#define EWKERN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types, in the order NumPy spells them. */
typedef enum {
    EW_FLOAT32 = 0,
    EW_FLOAT16 = 1,
    EW_BFLOAT16 = 2,
    EW_FLOAT64 = 3,
    EW_NDTYPES = 4
} ew_dtype;

/* Arguments of one elementwise launch.
 * in[k] and out point at element 0 of contiguous buffers of n elements; the pointers are
 * aligned to the element size only (a view starting at element 1 is legal). out may equal
 * any in[k] (in-place: add(a, b, out=a)); it never partially overlaps them.
 * Computation for float16/bfloat16 is in float32 unless the variant says otherwise;
 * float64 computes in double. */
typedef struct ew_args {
    const void *in[3];   /* inputs; unused ones are NULL (three for the backward ops of grads.def) */
    void *out;
    void *out2;          /* backward ops of two gradients: the second (b's); NULL when not asked for,
                            and out may then be NULL too (only b's gradient asked for) */
    int64_t n;           /* element count, may be 0 */
    double scalar[2];    /* add_const/mul_const: c = scalar[0]; axpby: alpha = scalar[0],
                            beta = scalar[1]; fill: value = scalar[0] */
    int block;           /* CUDA: threads per block, 0 = the variant's default */
    int grid;            /* CUDA: blocks of a grid-stride variant, 0 = the variant's default */
    void *stream;        /* CUDA: cudaStream_t to launch on; CPU: unused */
    int device;          /* CUDA: device ordinal (already current when called) */
} ew_args;

/* Arguments of one batched RMSE launch.
 * The inputs are contiguous arrays viewed as [outer][n][inner]; element i of batch (o, j)
 * is at index (o * n + i) * inner + j. The batches are the outer * inner pairs (o, j), and
 * out[o * inner + j] = sqrt(sum_i (a - b)^2 / n). inner == 1 is "each batch contiguous"
 * (reduce trailing axes); outer == 1 is "batch is the fastest axis" (reduce leading axes).
 * out is float32 for float32/float16/bfloat16 inputs and float64 for float64 inputs.
 * n == 0 gives NaN; outer * inner == 0 launches nothing. */
typedef struct ew_rmse_args {
    const void *a, *b;
    void *out;
    int64_t outer, n, inner;
    int block;           /* 0 = the version's default */
    int grid;            /* blocks per batch for multi-block versions, 0 = default */
    void *stream;
    int device;
} ew_rmse_args;

/* Arguments of one rmse_backward launch: a, b and the layout as in ew_rmse_args; grad and r (the
 * forward's result) hold outer * inner values, float32 (float64 for float64 inputs); out and
 * out2 receive grad_a = (a - b) grad / (n r) per batch and grad_b = -grad_a, in the inputs'
 * dtype; either may be NULL (that gradient not asked for), never both. */
typedef struct ew_rmse_grad_args {
    const void *grad, *a, *b, *r;
    void *out, *out2;
    int64_t outer, n, inner;
    int block;
    void *stream;
    int device;
} ew_rmse_grad_args;

/* A launcher: 0 on success, otherwise a cudaError_t value (CUDA) or an errno value (CPU).
 * args points at an ew_args (elementwise and backward tables), an ew_rmse_args (rmse) or an
 * ew_rmse_grad_args (rmse_backward).
 * A CUDA launcher calls cudaGetLastError() after its launches and returns it. */
typedef int (*ew_launch_fn)(const void *args);

/* Which launch parameters a variant honours (the host checks them before launching). */
enum {
    EW_USES_BLOCK = 1u << 0,   /* ew_args.block / ew_rmse_args.block */
    EW_USES_GRID = 1u << 1,    /* ew_args.grid / ew_rmse_args.grid */
    EW_CONTIGUOUS_BATCHES_ONLY = 1u << 2  /* rmse: needs inner == 1 */
};

typedef struct ew_kernel {
    const char *op;          /* "add", "copy", "rmse", ... */
    const char *variant;     /* "auto", "ThreadBlockIV4U4MRgs", "f16x8pack", ... */
    ew_dtype dtype;
    ew_launch_fn launch;
    const void *kernel;      /* the main __global__ function (for cudaFuncGetAttributes); NULL on CPU */
    unsigned flags;          /* EW_USES_* */
    const char *about;       /* one line: what this version adds over the one before */
} ew_kernel;

/* The tables. CUDA: one per kernel file (csrc/cuda/<file>.cu exports ew_cuda_<file>_table), the
 * reference studies' files first, then the default paths. */
const ew_kernel *ew_cpu_elementwise_table(int *count);
const ew_kernel *ew_cpu_rmse_table(int *count);
const ew_kernel *ew_cuda_add_kernel_experiments_table(int *count);
const ew_kernel *ew_cuda_cuda_vectorization_f16x8_table(int *count);
const ew_kernel *ew_cuda_elementwise_ops_on_gpus_table(int *count);
const ew_kernel *ew_cuda_batched_rmse_kernel_analysis_table(int *count);
const ew_kernel *ew_cuda_elementwise_auto_table(int *count);
const ew_kernel *ew_cuda_rmse_auto_table(int *count);
const ew_kernel *ew_cpu_backward_table(int *count);            /* grads.def's ops and rmse_backward */
const ew_kernel *ew_cuda_elementwise_backward_table(int *count);  /* the same on CUDA */

#ifdef __cplusplus
}
#endif
#endif /* EWKERN_KERNELS_H */
