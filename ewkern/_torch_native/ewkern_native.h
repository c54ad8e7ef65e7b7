/*
 * ewkern_native.h: what ewkern._C offers native code that launches its kernels without Python
 * (ewkern.torch's C++ autograd nodes, ewkern/_torch_native/autograd.cpp, built at run time).
 * ewkern._C._native_api is a PyCapsule named "ewkern._C._native_api" holding an ew_native_api.
 * Plain C, included by csrc/native_api.c and by the C++ module; a change of the layout bumps
 * EW_NATIVE_API_VERSION (the module refuses another version, and the loader's cache key holds
 * this file).
 */
#ifndef EWKERN_NATIVE_H
#define EWKERN_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EW_NATIVE_API_VERSION 2

/* One launch of an elementwise or backward kernel (ops.def / grads.def rows): in[k] and out point
 * at element 0 of contiguous buffers of n elements of the kernel's dtype; out2 is a two-gradient
 * backward's second gradient; a gradient not wanted is NULL (not both). scalar[] as the op's
 * scalars (add_const/mul_const c; axpby alpha, beta). stream: the cudaStream_t (CUDA); device:
 * the CUDA device, current on the calling thread when launch is called. */
typedef struct ew_native_launch {
    const void *in[3];
    void *out, *out2;
    int64_t n;
    double scalar[2];
    void *stream;
    int device;
} ew_native_launch;

/* One launch of rmse or rmse_backward: a and b contiguous, viewed as [outer][n][inner] (batch (o, j)
 * reduces a[o][:][j]); rmse writes out (outer * inner values, float32; float64 for float64 inputs);
 * rmse_backward reads grad and r (the result's gradient and the result, that shape and dtype) and
 * writes out (a's gradient) and out2 (b's), either NULL when not wanted, not both. */
typedef struct ew_native_rmse {
    const void *a, *b, *grad, *r;
    void *out, *out2;
    int64_t outer, n, inner;
    void *stream;
    int device;
} ew_native_rmse;

typedef struct ew_native_api {
    int version;                /* EW_NATIVE_API_VERSION */
    /* The auto kernel of op (ops.def's and grads.def's names: "gelu", "mul_backward"; "rmse",
     * "rmse_backward") for dtype
     * (0 float32, 1 float16, 2 bfloat16, 3 float64) on the cpu (cuda = 0) or CUDA (1): an opaque
     * handle, NULL where there is none. Call it holding the GIL (the lookups are made once). */
    const void *(*auto_kernel)(const char *op, int dtype, int cuda);
    /* Run it: 0, or the CUDA error (CUDA) or errno value (CPU). No GIL needed. */
    int (*launch)(const void *kernel, const ew_native_launch *args);
    /* Run an auto kernel of "rmse" or "rmse_backward": 0 or an error as launch's. No GIL needed. */
    int (*launch_rmse)(const void *kernel, const ew_native_rmse *args);
    /* What launch's nonzero result means, with the kernel's op, variant and dtype, into buf. */
    void (*describe_error)(const void *kernel, int err, char *buf, size_t len);
    /* Run a run-time kernel's recorded launches (a C plan's program, csrc/rtc.h's ew_rtc_run:
     * nwords int64 words) with params (plen bytes: the argument struct, its pointers and scalars
     * written) on stream, the device current: 0; a CUDA error (msg: the launch that failed); or -1
     * with msg saying what is wrong with the program. No GIL needed. */
    int (*rtc_run)(const int64_t *prog, int64_t nwords, char *params, int64_t plen, void *stream, char *msg,
                   size_t msglen);
} ew_native_api;

#ifdef __cplusplus
}
#endif
#endif /* EWKERN_NATIVE_H */
