/*
 * elementwise_backward.cu: the backward ops of grads.def and rmse_backward, the kernels that
 * ewkern.torch's autograd runs (one kernel per gradient step: it reads grad and what the forward
 * saved once and writes each gradient once). Time them with `python -m ewkern.bench train`
 * (forward + backward against torch eager and torch.compile); the math is in elementwise_grads.cuh,
 * the kernels in elementwise_kernel.cuh, the launch rule in elementwise_launch.cuh.
 *
 *  "auto"  every backward op x float32, float16, bfloat16, float64: auto's body with NIN arrays in
 *          and NOUT gradients out (ew_fast_n): 16-byte vectors, 1, 2 or 4 per thread by the same
 *          rule as the forward ops, loads before stores, streaming stores, head and tail on the
 *          last block's spare threads, 32-bit index unless n is too large, PDL with the first
 *          vector prefetched (a launch without PDL takes the plain form, which neither prefetches
 *          nor waits; on a wide device a programmatic launch at 2-4 waves 4 vectors a thread and
 *          no prefetch, as the forward ops); a gradient not asked for (output_mask) is not stored;
 *          arrays whose offsets from a 16-byte boundary differ take one element per thread
 *          (ew_elem_n).
 *          float16/bfloat16 computed in float32 (gelu, silu, erf on the SFU), float64 in double.
 *  "auto" rmse_backward: grad_a = (a - b) grad / (n r) and grad_b = -grad_a over the [outer][n]
 *          [inner] view in one pass: 16-byte vectors of a and b, each element's batch found by
 *          counting from the vector's first (one division per vector), grid-stride over one wave.
 *
 * Every version is correct for any n >= 0 and any element-aligned pointers (a gradient may be
 * written over grad).
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

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
#include "elementwise_grad_run.cuh"
#include "elementwise_auto.cuh"

namespace ewk {

/* grads.def names the ops <op>_backward; the functors are Grad_<op> */
typedef Grad_gelu Grad_gelu_backward;
typedef Grad_silu Grad_silu_backward;
typedef Grad_sigmoid Grad_sigmoid_backward;
typedef Grad_tanh Grad_tanh_backward;
typedef Grad_erf Grad_erf_backward;
typedef Grad_exp Grad_exp_backward;
typedef Grad_log Grad_log_backward;
typedef Grad_sqrt Grad_sqrt_backward;
typedef Grad_rsqrt Grad_rsqrt_backward;
typedef Grad_abs Grad_abs_backward;
typedef Grad_relu Grad_relu_backward;
typedef Grad_mul Grad_mul_backward;
typedef Grad_div Grad_div_backward;
typedef Grad_maximum Grad_maximum_backward;
typedef Grad_minimum Grad_minimum_backward;
typedef Grad_axpby Grad_axpby_backward;

#define EW_GRAD(name, args, inputs, outputs, scalars, def, acc) \
    static_assert(int(Grad_##name::NIN) == (inputs) && int(Grad_##name::NOUT) == (outputs), \
                  "grads.def and elementwise_grads.cuh disagree on " #name);
#include "grads.def"
#undef EW_GRAD


template <> struct NarrowRule<Grad_div> { enum { value = 1 }; };
template <> struct FreeRegsN<Grad_erf, double, 1> { enum { value = 1 }; };

/* ---- rmse_backward ----------------------------------------------------------------------------- */

/* grad_a (and -grad_a) of element e: batch (o, j) of e = (o n + i) inner + j */
template <class T, class Idx>
struct RmseGrad {
    typedef typename Compute<T>::type C;
    const T *a, *b;
    const C *g, *r;
    T *o1, *o2;
    Idx total, n, inner;
};

template <class T, class Idx>
EW_DEV void rmse_grad_store(const RmseGrad<T, Idx> &q, Idx e, typename Compute<T>::type d)
{
    if (q.o1)
        q.o1[e] = from_c<T>(d);
    if (q.o2)
        q.o2[e] = from_c<T>(-d);
}

/* the scale of batch (o, j): grad / (n r), in the compute type */
template <class T, class Idx>
EW_DEV typename Compute<T>::type rmse_scale(const RmseGrad<T, Idx> &q, Idx batch)
{
    typedef typename Compute<T>::type C;
    return __ldg(q.g + batch) / (C(q.n) * __ldg(q.r + batch));
}

/* VEC: a, b, o1, o2 share one offset from a 16-byte boundary, the first `head` elements before it
 * (the arrays start there); the vectors go grid-stride, the head and tail elements to the last
 * threads. !VEC: one element per thread. */
template <class T, class Idx, bool VEC>
__global__ void __launch_bounds__(256) rmse_backward_kernel(RmseGrad<T, Idx> q, Idx head)
{
    typedef typename Compute<T>::type C;
    enum { N = Vec16<T>::N };
    pdl_wait();
    pdl_launch_dependents();
    const Idx tid = Idx(blockIdx.x) * Idx(blockDim.x) + Idx(threadIdx.x);
    const Idx nthr = Idx(gridDim.x) * Idx(blockDim.x);
    const Idx per_row = q.n * q.inner;
    Idx nvec = 0;
    if constexpr (VEC) {
        nvec = (q.total - head) / Idx(N);
        const uint4 *av = reinterpret_cast<const uint4 *>(q.a + head);
        const uint4 *bv = reinterpret_cast<const uint4 *>(q.b + head);
        for (Idx v = tid; v < nvec; v += nthr) {
            C ca[N], cb[N], d[N];
            Vec16<T>::unpack(av[v], ca);
            Vec16<T>::unpack(bv[v], cb);
            const Idx e0 = head + v * Idx(N);
            /* (o, i, j) of the first element, then counted up */
            Idx o = e0 / per_row, rem = e0 - o * per_row;
            Idx i = rem / q.inner, j = rem - i * q.inner;
#pragma unroll
            for (int k = 0; k < N; ++k) {
                d[k] = (ca[k] - cb[k]) * rmse_scale(q, o * q.inner + j);
                if (++j == q.inner) {
                    j = 0;
                    if (++i == q.n) {
                        i = 0;
                        ++o;
                    }
                }
            }
            if (q.o1)
                __stcs(reinterpret_cast<uint4 *>(q.o1 + head) + v, Vec16<T>::pack(d));
            if (q.o2) {
#pragma unroll
                for (int k = 0; k < N; ++k)
                    d[k] = -d[k];
                __stcs(reinterpret_cast<uint4 *>(q.o2 + head) + v, Vec16<T>::pack(d));
            }
        }
    }
    /* the elements outside the vectors: the head, then from head + nvec N on */
    const Idx tail0 = head + nvec * Idx(N);
    const Idx nedge = VEC ? head + (q.total - tail0) : q.total;
    for (Idx t = VEC ? nthr - 1 - tid : tid; t < nedge; t += nthr) {
        const Idx e = !VEC ? t : (t < head ? t : tail0 + (t - head));
        const Idx o = e / per_row, j = e - (e / q.inner) * q.inner;
        rmse_grad_store(q, e, (to_c(q.a[e]) - to_c(q.b[e])) * rmse_scale(q, o * q.inner + j));
    }
}

template <class T>
static int launch_rmse_backward(const void *args)
{
    const ew_rmse_grad_args *a = static_cast<const ew_rmse_grad_args *>(args);
    typedef typename Compute<T>::type C;
    const int64_t total = a->outer * a->n * a->inner;
    if (total <= 0)
        return 0;
    const void *ptrs[4];
    int np = 0;
    ptrs[np++] = a->a;
    ptrs[np++] = a->b;
    if (a->out)
        ptrs[np++] = a->out;
    if (a->out2)
        ptrs[np++] = a->out2;
    const int64_t head = common_head(ptrs, np, 16, int(sizeof(T)), total);
    const int block = a->block > 0 ? a->block : 256;
    const DeviceShape d = device_shape(a->device);
    const int64_t units = head >= 0 ? (total - head) / Vec16<T>::N + Vec16<T>::N * 2 : total;
    const int64_t cap = int64_t(d.sms) * (d.threads_per_sm / block > 0 ? d.threads_per_sm / block : 1) * 4;
    const dim3 g{unsigned(clamp_grid(std::min(ceil_div(units, block), cap)))}, bl{unsigned(block)};
    const bool pdl = ewcuda_pdl_active(a->device);
    const cudaStream_t s = static_cast<cudaStream_t>(a->stream);
    const bool i32 = total + 2 * int64_t(g.x) * block < int64_t(INT_MAX);
    cudaError_t err;
#define EWK_RMSE_GRAD_LAUNCH(Idx, VEC) \
    { \
        const RmseGrad<T, Idx> q{static_cast<const T *>(a->a), static_cast<const T *>(a->b), \
                                 static_cast<const C *>(a->grad), static_cast<const C *>(a->r), \
                                 static_cast<T *>(a->out), static_cast<T *>(a->out2), Idx(total), Idx(a->n), \
                                 Idx(a->inner)}; \
        err = pdl_launch(rmse_backward_kernel<T, Idx, VEC>, g, bl, 0, s, pdl, q, Idx(head > 0 ? head : 0)); \
    }
    if (head >= 0 && i32)
        EWK_RMSE_GRAD_LAUNCH(int, true)
    else if (head >= 0)
        EWK_RMSE_GRAD_LAUNCH(int64_t, true)
    else
        EWK_RMSE_GRAD_LAUNCH(int64_t, false)
#undef EWK_RMSE_GRAD_LAUNCH
    return err != cudaSuccess ? int(err) : int(cudaGetLastError());
}

/* ---- the table ------------------------------------------------------------------------------------ */

#define EWK_GRAD_ABOUT \
    "auto's body with NIN arrays in and NOUT gradients out: 16-byte vectors, 1/2/4 per thread by auto's rule, " \
    "streaming stores, head/tail on spare threads, PDL with the first vector prefetched"
/* A backward row's launcher and main kernel: made here for every (op, dtype) but float64 gelu's,
 * which elementwise_gelu64.cu makes (its math reads float64 gelu's coefficients in __constant__
 * memory, which would cost every kernel of this module about 0.12 us a launch). */
template <class Op, class T> struct GradRow {
    static int launch(const void *args) { return launch_grad<Op, T>(args); }
    static const void *kernel() { return (const void *)fast_n_kernel<Op, T, int, 1>(); }
};
template <> struct GradRow<Grad_gelu, double> {
    static int launch(const void *args) { return launch_grad_gelu64(args); }
    static const void *kernel() { return grad_gelu64_kernel(); }
};
#define EWK_GRAD_ROW(NAME, T, DT) \
    {#NAME, "auto", DT, GradRow<Grad_##NAME, T>::launch, GradRow<Grad_##NAME, T>::kernel(), \
     EW_USES_BLOCK, EWK_GRAD_ABOUT},
#define EWK_RMSE_GRAD_ROW(T, DT) \
    {"rmse_backward", "auto", DT, launch_rmse_backward<T>, (const void *)rmse_backward_kernel<T, int, true>, \
     EW_USES_BLOCK, "one pass over 16-byte vectors of a and b, each element's batch counted from its vector's " \
     "first, grad / (n r) per element, grid-stride over 4 waves"},

static const ew_kernel kTable[] = {
#define EW_GRAD(name, args, inputs, outputs, scalars, def, acc) \
    EWK_GRAD_ROW(name, float, EW_FLOAT32) \
    EWK_GRAD_ROW(name, half_t, EW_FLOAT16) \
    EWK_GRAD_ROW(name, bf16_t, EW_BFLOAT16) \
    EWK_GRAD_ROW(name, double, EW_FLOAT64)
#include "grads.def"
#undef EW_GRAD
    EWK_RMSE_GRAD_ROW(float, EW_FLOAT32)
    EWK_RMSE_GRAD_ROW(half_t, EW_FLOAT16)
    EWK_RMSE_GRAD_ROW(bf16_t, EW_BFLOAT16)
    EWK_RMSE_GRAD_ROW(double, EW_FLOAT64)
};

} /* namespace ewk */

extern "C" const ew_kernel *ew_cuda_elementwise_backward_table(int *count)
{
    if (count)
        *count = int(sizeof(ewk::kTable) / sizeof(ewk::kTable[0]));
    return ewk::kTable;
}
