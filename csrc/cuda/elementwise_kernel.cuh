/*
 * elementwise_kernel.cuh: the default path's device templates, for any Op functor shaped like those
 * of elementwise_ops.cuh (NIN, KIND, and for KIND_COMPUTE operator()(a, b, s0, s1) on the compute
 * type): element conversions to and from the compute type, 16-byte vector unpack/pack, the kernel
 * parameters (OpArgs), and the two kernels ew_fast (auto: VPT vectors per thread, no loop) and
 * ew_gs (the grid-stride body of grid1/grid2 and of differing offsets). Device code only: no host
 * API here, so that a kernel file (or a run-time compiler) can instantiate these with its own Op.
 * Every instance is made by the file that launches it (elementwise_auto.cu for ops.def's ops).
 */
#ifndef EWKERN_ELEMENTWISE_KERNEL_CUH
#define EWKERN_ELEMENTWISE_KERNEL_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "elementwise_types.cuh"
#include "elementwise_ops.cuh"
#include "pdl_device.cuh"

namespace ewk {

/* compute type: float for float32/float16/bfloat16, double for float64 */
template <class T> struct Compute { typedef float type; };
template <> struct Compute<double> { typedef double type; };

EW_DEV float to_c(float x) { return x; }
EW_DEV double to_c(double x) { return x; }
EW_DEV float to_c(half_t x) { return __half2float(x); }
EW_DEV float to_c(bf16_t x) { return __bfloat162float(x); }

template <class T> EW_DEV T from_c(typename Compute<T>::type x);
template <> EW_DEV float from_c<float>(float x) { return x; }
template <> EW_DEV double from_c<double>(double x) { return x; }
template <> EW_DEV half_t from_c<half_t>(float x) { return __float2half_rn(x); }
template <> EW_DEV bf16_t from_c<bf16_t>(float x) { return __float2bfloat16_rn(x); }

/* 16-byte vectors <-> compute-type arrays */
template <class T> struct Vec16;
template <> struct Vec16<float> {
    enum { N = 4 };
    static EW_DEV void unpack(uint4 r, float (&c)[4])
    {
        c[0] = __uint_as_float(r.x);
        c[1] = __uint_as_float(r.y);
        c[2] = __uint_as_float(r.z);
        c[3] = __uint_as_float(r.w);
    }
    static EW_DEV uint4 pack(const float (&c)[4])
    {
        return make_uint4(__float_as_uint(c[0]), __float_as_uint(c[1]), __float_as_uint(c[2]),
                          __float_as_uint(c[3]));
    }
};
template <> struct Vec16<double> {
    enum { N = 2 };
    static EW_DEV void unpack(uint4 r, double (&c)[2])
    {
        c[0] = __hiloint2double(int(r.y), int(r.x));
        c[1] = __hiloint2double(int(r.w), int(r.z));
    }
    static EW_DEV uint4 pack(const double (&c)[2])
    {
        return make_uint4(unsigned(__double2loint(c[0])), unsigned(__double2hiint(c[0])),
                          unsigned(__double2loint(c[1])), unsigned(__double2hiint(c[1])));
    }
};
EW_DEV void unpack_word(unsigned w, half_t, float &lo, float &hi)
{
    const float2 f = __half22float2(bits_as<__half2>(w));
    lo = f.x;
    hi = f.y;
}
EW_DEV void unpack_word(unsigned w, bf16_t, float &lo, float &hi)
{
    lo = __uint_as_float(w << 16); /* exactly __bfloat162float */
    hi = __uint_as_float(w & 0xffff0000u);
}
EW_DEV unsigned pack_word(float lo, float hi, half_t) { return as_bits(__floats2half2_rn(lo, hi)); }
EW_DEV unsigned pack_word(float lo, float hi, bf16_t) { return as_bits(__floats2bfloat162_rn(lo, hi)); }
template <class H> struct Vec16Half {
    enum { N = 8 };
    static EW_DEV void unpack(uint4 r, float (&c)[8])
    {
        unpack_word(r.x, H(), c[0], c[1]);
        unpack_word(r.y, H(), c[2], c[3]);
        unpack_word(r.z, H(), c[4], c[5]);
        unpack_word(r.w, H(), c[6], c[7]);
    }
    static EW_DEV uint4 pack(const float (&c)[8])
    {
        return make_uint4(pack_word(c[0], c[1], H()), pack_word(c[2], c[3], H()),
                          pack_word(c[4], c[5], H()), pack_word(c[6], c[7], H()));
    }
};
template <> struct Vec16<half_t> : Vec16Half<half_t> {};
template <> struct Vec16<bf16_t> : Vec16Half<bf16_t> {};

/* kernel parameters of an auto launch: scalars in the compute type, the fill value / bf16 constant
 * rounded once from double, and fill's 16-byte pattern */
template <class T>
struct OpArgs {
    typename Compute<T>::type s0, s1;
    T v;
    uint4 pattern;
    int prefetch; /* ew_fast: blocks below this index prefetch their first vector's lines into L2
                     before pdl_wait (PDL launches; 0: none) */
    int wb;       /* ew_fast: 1: write-back vector stores (st.global), 0: streaming (st.global.cs);
                     the launcher's store rule (elementwise_launch.cuh, store_wb) */
};

/* One 16-byte vector of ew_fast's results where ok (the vector is in the array). WB: write-back
 * (auto_wb's kernels, and the plain form's write-back instance that the launcher picks where the
 * store rule says so). The plain form (PDL false: launches behind a foreign kernel or with PDL
 * off) otherwise streaming (st.global.cs: the written lines are the first the L2 evicts). The PDL
 * form: write-back where the launch asks for it (p.wb, uniform across the grid), else streaming,
 * both stores in straight-line code under predicates of ok and p.wb at the one address (one PTX
 * block: written as two C++ stores, ptxas formed the address twice and branched around them). The
 * plain form keeps one store an instance: the pair's three instructions more cost add / copy /
 * add_const float32 and bfloat16 at 1-4 MiB after a torch kernel 0.05 us (0.974-0.981 -> 0.953-0.956
 * of torch's at 1 MiB on the H200, 59f37f6 against 91efc65), where the PDL form's back-to-back was
 * unchanged. */
template <bool WB, bool PDL, class T>
EW_DEV void store_vec(uint4 *dst, const uint4 &v, const OpArgs<T> &p, bool ok)
{
    if constexpr (WB) {
        if (ok)
            *dst = v;
    } else if constexpr (!PDL) {
        if (ok)
            __stcs(dst, v);
    } else {
        asm volatile("{\n\t.reg .pred g, w, s;\n\tsetp.ne.s32 g, %6, 0;\n\t"
                     "setp.ne.and.s32 w, %5, 0, g;\n\tsetp.eq.and.s32 s, %5, 0, g;\n\t"
                     "@w st.global.v4.b32 [%0], {%1, %2, %3, %4};\n\t"
                     "@s st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};\n\t}"
                     ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(p.wb), "r"(int(ok)) : "memory");
    }
}

template <class Op, class T, class Idx>
EW_DEV T elem(const T *__restrict__ a, const T *__restrict__ b, Idx i, const OpArgs<T> &p)
{
    typedef typename Compute<T>::type C;
    if constexpr (Op::KIND == KIND_FILL) {
        return p.v;
    } else if constexpr (Op::KIND == KIND_COPY) {
        return a[i];
    } else if constexpr (Op::KIND == KIND_NATIVE) {
        return __hfma(a[i], __float2bfloat16_rn(1.0f), p.v);
    } else {
        const C ca = to_c(a[i]);
        C cb = C(0);
        if constexpr (Op::NIN >= 2)
            cb = to_c(b[i]);
        return from_c<T>(typename MathOf<Op, T>::type()(ca, cb, p.s0, p.s1));
    }
}

template <class Op, class T>
EW_DEV uint4 vec_op(uint4 ra, uint4 rb, const OpArgs<T> &p)
{
    typedef typename Compute<T>::type C;
    if constexpr (Op::KIND == KIND_FILL) {
        return p.pattern;
    } else if constexpr (Op::KIND == KIND_COPY) {
        return ra;
    } else if constexpr (Op::KIND == KIND_NATIVE) {
        const __nv_bfloat162 one = __float2bfloat162_rn(1.0f);
        const __nv_bfloat162 c2 = __halves2bfloat162(p.v, p.v);
        uint4 r;
        r.x = as_bits(__hfma2(bits_as<__nv_bfloat162>(ra.x), one, c2));
        r.y = as_bits(__hfma2(bits_as<__nv_bfloat162>(ra.y), one, c2));
        r.z = as_bits(__hfma2(bits_as<__nv_bfloat162>(ra.z), one, c2));
        r.w = as_bits(__hfma2(bits_as<__nv_bfloat162>(ra.w), one, c2));
        return r;
    } else {
        C ca[Vec16<T>::N], cb[Vec16<T>::N], co[Vec16<T>::N];
        Vec16<T>::unpack(ra, ca);
        if constexpr (Op::NIN >= 2)
            Vec16<T>::unpack(rb, cb);
#pragma unroll
        for (int k = 0; k < Vec16<T>::N; ++k)
            co[k] = typename MathOf<Op, T>::type()(ca[k], Op::NIN >= 2 ? cb[k] : C(0), p.s0, p.s1);
        return Vec16<T>::pack(co);
    }
}

/* Edge element j of a vector launch: j < head is element j - head (before a), the others
 * tail0 + (j - head), after the last whole vector. */
template <class Op, class T, class Idx>
EW_DEV void edge(const T *a, const T *b, T *o, Idx j, Idx head, Idx tail0, const OpArgs<T> &p)
{
    const Idx i = j < head ? j - head : tail0 + (j - head);
    o[i] = elem<Op, T, Idx>(a, b, i, p);
}

/* grid1/grid2 (the elementwise study's grid rules) and the rare case of differing offsets.
 * VEC: a, b, o point at the arrays' first element on a 16-byte boundary (the host adds the head),
 * n counts the elements from there on, and the head elements lie before them, at negative
 * indices. The vectors go one per thread, grid-stride beyond; the < N head and < N tail elements
 * are taken by the grid's last threads, which the launcher leaves without a vector so that no
 * thread waits on two loads in a row. !VEC (the pointers' offsets differ): one element per
 * thread, head 0. __launch_bounds__(1024) keeps any block size launchable. */
template <class Op, class T, class Idx, bool VEC>
__global__ void __launch_bounds__(1024)
ew_gs(const T *__restrict__ a, const T *__restrict__ b, T *__restrict__ o, Idx n, Idx head, OpArgs<T> p)
{
    pdl_wait();
    pdl_launch_dependents();
    const Idx tid = Idx(blockIdx.x) * Idx(blockDim.x) + Idx(threadIdx.x);
    const Idx nthr = Idx(gridDim.x) * Idx(blockDim.x);
    if constexpr (VEC) {
        const Idx nvec = n / Idx(Vec16<T>::N);
        const uint4 *av = reinterpret_cast<const uint4 *>(a);
        const uint4 *bv = reinterpret_cast<const uint4 *>(b);
        uint4 *ov = reinterpret_cast<uint4 *>(o);
        for (Idx v = tid; v < nvec; v += nthr) {
            uint4 ra = make_uint4(0, 0, 0, 0), rb = ra;
            if constexpr (Op::NIN >= 1)
                ra = av[v];
            if constexpr (Op::NIN >= 2)
                rb = bv[v];
            ov[v] = vec_op<Op, T>(ra, rb, p);
        }
        const Idx tail0 = nvec * Idx(Vec16<T>::N);
        const Idx nedge = head + (n - tail0);
#pragma unroll 1
        for (Idx j = nthr - 1 - tid; j < nedge; j += nthr)
            edge<Op, T, Idx>(a, b, o, j, head, tail0, p);
    } else {
        for (Idx i = tid; i < n; i += nthr)
            o[i] = elem<Op, T, Idx>(a, b, i, p);
    }
}

/* MathFirst: ew_fast_body runs a thread's every vector's math, past the end too (zeros, computed,
 * not stored), and guards only the stores; otherwise (the default) the math sits inside the
 * vector's `if (v < nvec)`, a region of its own that ptxas does not interleave across a libm-class
 * function's own branches. Measured for float64 exp, log, erf, tanh, sigmoid, silu and gelu (its
 * 1-vector form) against the guarded form, one call per GPU, the two builds' `peers` in turns (two
 * runs each, 4-256 MiB, three methods; ELEMENTWISE_NOTES.md, "The math ahead of the store guard"):
 * only tanh gains on both GPUs (H200 0.4-3% in every method at 4-256 MiB: single launch at 64 / 256
 * MiB 0.955 / 0.950 -> 0.971 / 0.964 of torch's; H100 within 1.5%), so only tanh takes it. exp lost
 * 2-6% on the H200 at 16-256 MiB (34 registers where it had 31: 6 blocks of 256 an SM, not 8),
 * erf 3-5% at 16 MiB on both GPUs, gelu's 1-vector form after a torch kernel 2-5%
 * (its single launches gained 5-10%). */
template <class M, class T> struct MathFirst { enum { value = 0 }; };
template <> struct MathFirst<Op_tanh, double> { enum { value = 1 }; };

/* The default path (auto). Pointers and head as for ew_gs's VEC case. Block k owns the VPT *
 * blockDim.x vectors from k * VPT * blockDim.x; thread t loads its vectors t, t + blockDim.x, ...
 * (coalesced), all of them before it computes and stores any, and stores with st.global.cs
 * (streaming: the written lines are the first the L2 evicts) or, in the PDL form where the launch
 * sets p.wb (the store rule, store_wb in elementwise_launch.cuh: launches that move more bytes than
 * the L2 holds), ordinary write-back stores (store_vec). No loop: the grid covers the array.
 * The head and tail elements (fewer than 2N) go to the last block's last threads, which the
 * launcher leaves without a vector. WB: write-back stores at every size (variant "auto_wb").
 * No __restrict__: out may be an input (add(a, b, out=a)), and with it ptxas moved stores above
 * later loads when VPT = 4 (to save registers), halving the loads in flight.
 * PDL: the form for launches with programmatic dependent launch (prefetch, then pdl_wait). The
 * plain form (PDL false) is launched only without it (pdl_launch_as): it neither prefetches nor
 * waits, which took add float32 at 1 MiB after a torch kernel in a graph from 0.945 to 0.985 of
 * torch's on the H200 (notes: "The plain form for launches without PDL"); it still triggers its
 * dependents early, so an ewkern kernel after it keeps its PDL launch. */
template <class Op, class T, class Idx, int VPT, bool WB, bool PDL>
EW_DEV void ew_fast_body(const T *a, const T *b, T *o, Idx n, Idx head, OpArgs<T> p)
{
    enum { N = Vec16<T>::N };
    const Idx nvec = n / Idx(N);
    const Idx base = Idx(blockIdx.x) * Idx(blockDim.x) * VPT + Idx(threadIdx.x);
    const uint4 *av = reinterpret_cast<const uint4 *>(a);
    const uint4 *bv = reinterpret_cast<const uint4 *>(b);
    uint4 *ov = reinterpret_cast<uint4 *>(o);
    /* B: how many of a thread's vectors the math takes at once (Batch: float64 gelu's coefficients
     * are then loaded once a batch, not once a vector; the plain form gained 3-5% from it, after a
     * torch kernel at 64 MiB 0.948 -> 0.996 of torch's on the H200; dbc7c38, 2cd6ff6). The PDL form
     * batches too, but without the prefetch: batched and prefetching, ptxas moved three of its four
     * loads below the batch's math and it ran 5-10% slower at 64 MiB-1 GiB on the H200; batched
     * without it (the plain form's code after the wait), single launches at 64 MiB went 0.948 ->
     * 1.026 of torch's on the H200 and 0.968 -> 0.997 on the H100 (3fe0810). */
    enum { BM = Op::KIND == KIND_COMPUTE ? int(Batch<typename MathOf<Op, T>::type>::value) : 1,
           B = VPT < BM ? VPT : BM };
    if constexpr (PDL) {
        if (B == 1 && int(blockIdx.x) < p.prefetch && base < nvec) {
            /* the inputs' lines of the first vector (thread 0 leads the block's run) */
            if constexpr (Op::NIN >= 1)
                prefetch_l2_line(av + base, 16u, threadIdx.x == 0);
            if constexpr (Op::NIN >= 2)
                prefetch_l2_line(bv + base, 16u, threadIdx.x == 0);
        }
        pdl_wait();
    }
    pdl_launch_dependents();
    uint4 ra[VPT], rb[VPT];
#pragma unroll
    for (int r = 0; r < VPT; ++r) {
        const Idx v = base + Idx(r) * Idx(blockDim.x);
        ra[r] = rb[r] = make_uint4(0, 0, 0, 0);
        if (v < nvec) {
            if constexpr (Op::NIN >= 1)
                ra[r] = av[v];
            if constexpr (Op::NIN >= 2)
                rb[r] = bv[v];
        }
    }
    if constexpr (B > 1 && VPT % B == 0) {
        /* B vectors' math at once (the last block's vectors past the end are zeros: computed, not
         * stored) */
#pragma unroll
        for (int r0 = 0; r0 < VPT; r0 += B) {
            enum { N2 = Vec16<T>::N * B };
            T x[N2], y[N2];
#pragma unroll
            for (int r = 0; r < B; ++r)
                Vec16<T>::unpack(ra[r0 + r], *reinterpret_cast<T (*)[Vec16<T>::N]>(x + r * Vec16<T>::N));
            typename MathOf<Op, T>::type().template batch<N2>(x, y);
#pragma unroll
            for (int r = 0; r < B; ++r) {
                const Idx v = base + Idx(r0 + r) * Idx(blockDim.x);
                const uint4 res = Vec16<T>::pack(*reinterpret_cast<const T (*)[Vec16<T>::N]>(y + r * Vec16<T>::N));
                store_vec<WB, PDL>(ov + v, res, p, v < nvec);
            }
        }
    } else {
        /* libm-class math (Heavy) sits in the vector's own region unless MathFirst; in the PDL form
         * the rest runs on every vector (zeros past the end: computed, not stored), so that the
         * stores' pair (store_vec) stays predicated straight-line code, as the one streaming store
         * was */
        enum { MF = MathFirst<typename MathOf<Op, T>::type, T>::value || (PDL && !WB && !Heavy<Op>::value) };
#pragma unroll
        for (int r = 0; r < VPT; ++r) {
            const Idx v = base + Idx(r) * Idx(blockDim.x);
            if (!MF && !(v < nvec))
                continue;
            const uint4 res = vec_op<Op, T>(ra[r], rb[r], p);
            store_vec<WB, PDL>(ov + v, res, p, v < nvec);
        }
    }
    if (blockIdx.x == gridDim.x - 1) {
        const Idx tail0 = nvec * Idx(N);
        const Idx nedge = head + (n - tail0);
        const Idx j = Idx(blockDim.x) - 1 - Idx(threadIdx.x);
        if (j < nedge)
            edge<Op, T, Idx>(a, b, o, j, head, tail0, p);
    }
}

/* The default path's two kernels: ew_fast, and ew_fast_r for float64 math that ptxas fits into
 * 32 registers by spilling (FreeRegs). Under __launch_bounds__(1024) alone ptxas keeps a kernel
 * at full occupancy when it judges the spills cheap: float64 exp and sigmoid at 1-2 vectors a
 * thread took 32 registers with 1-2 spilled (STL/LDL), silu 11-21. __maxnreg__(64) (the same
 * bound, stated) lets it use them: exp 31, sigmoid 28, silu 46-52 registers, no spill, 7-13% fewer
 * instructions. H200, 4 MiB (1 vector a thread), ewkern / torch back-to-back and single launch:
 * exp 1.22 -> 1.30, 0.99 -> 1.00-1.03; sigmoid 1.12 -> 1.35, 0.95 -> 1.02-1.04 (ELEMENTWISE_NOTES.md,
 * "Spills at full occupancy"). Other kernels keep ptxas's own choice (their code changes too
 * under the stated bound, unmeasured). */
template <class Op, class T, int VPT> struct FreeRegs {
    enum { H = int(Heavy64<typename MathOf<Op, T>::type>::value) };
    enum { value = sizeof(T) == 8 && VPT <= 2 && (H == int(H64_EXP) || H == int(H64_SILU)) };
};

template <class Op, class T, class Idx, int VPT, bool WB, bool PDL = true>
__global__ void __launch_bounds__(1024)
ew_fast(const T *a, const T *b, T *o, Idx n, Idx head, OpArgs<T> p)
{
    ew_fast_body<Op, T, Idx, VPT, WB, PDL>(a, b, o, n, head, p);
}

template <class Op, class T, class Idx, int VPT, bool WB, bool PDL = true>
__global__ void __maxnreg__(64)
ew_fast_r(const T *a, const T *b, T *o, Idx n, Idx head, OpArgs<T> p)
{
    ew_fast_body<Op, T, Idx, VPT, WB, PDL>(a, b, o, n, head, p);
}

/* the default path's kernel for (Op, T, Idx, VPT, WB, PDL): ew_fast_r where FreeRegs says so */
template <class Op, class T, class Idx, int VPT, bool WB, bool PDL = true>
static inline void (*fast_kernel())(const T *, const T *, T *, Idx, Idx, OpArgs<T>)
{
    if constexpr (FreeRegs<Op, T, VPT>::value)
        return ew_fast_r<Op, T, Idx, VPT, WB, PDL>;
    else
        return ew_fast<Op, T, Idx, VPT, WB, PDL>;
}

/* ---- the backward ops of grads.def (KIND_GRAD): NIN arrays in, NOUT gradients out ---------------
 * The same default path as ew_fast (16-byte vectors, VPT per thread, all loads before the first
 * store, the store rule in the PDL form and streaming stores in the plain one, head and tail on
 * the last block's spare threads, PDL with the first vector prefetched), with the arrays in one
 * parameter struct. An output pointer may be NULL (a gradient not asked for): its stores are
 * skipped, the same branch for every thread. */
template <class T, int NI, int NO> struct Arrays {
    const T *in[NI];
    T *out[NO];
};

template <class Op, class T>
EW_DEV void vec_grad(const uint4 (&r)[Op::NIN], uint4 (&o)[Op::NOUT], const OpArgs<T> &p)
{
    typedef typename Compute<T>::type C;
    enum { N = Vec16<T>::N, NI = Op::NIN, NO = Op::NOUT };
    C c[NI][N], d[NO][N];
#pragma unroll
    for (int q = 0; q < NI; ++q)
        Vec16<T>::unpack(r[q], c[q]);
#pragma unroll
    for (int k = 0; k < N; ++k) {
        C xi[NI], yi[NO];
#pragma unroll
        for (int q = 0; q < NI; ++q)
            xi[q] = c[q][k];
        typename MathOf<Op, T>::type()(xi, yi, p.s0, p.s1);
#pragma unroll
        for (int q = 0; q < NO; ++q)
            d[q][k] = yi[q];
    }
#pragma unroll
    for (int q = 0; q < NO; ++q)
        o[q] = Vec16<T>::pack(d[q]);
}

template <class Op, class T, class Idx>
EW_DEV void elem_grad(const Arrays<T, Op::NIN, Op::NOUT> &arr, Idx i, const OpArgs<T> &p)
{
    typedef typename Compute<T>::type C;
    C xi[Op::NIN], yi[Op::NOUT];
#pragma unroll
    for (int q = 0; q < Op::NIN; ++q)
        xi[q] = to_c(arr.in[q][i]);
    typename MathOf<Op, T>::type()(xi, yi, p.s0, p.s1);
#pragma unroll
    for (int q = 0; q < Op::NOUT; ++q)
        if (Op::NOUT == 1 || arr.out[q])
            arr.out[q][i] = from_c<T>(yi[q]);
}

/* auto for a backward op: pointers and head as for ew_fast (every array from its 16-byte boundary);
 * PDL false: the plain form, as ew_fast's (no prefetch, no wait, streaming stores; WB: its
 * write-back instance, ew_fast_n_wb); the PDL form stores by the launch's store rule (p.wb), as
 * ew_fast's */
template <class Op, class T, class Idx, int VPT, bool PDL, bool WB = false>
EW_DEV void ew_fast_n_body(const Arrays<T, Op::NIN, Op::NOUT> &arr, Idx n, Idx head, const OpArgs<T> &p)
{
    enum { N = Vec16<T>::N, NI = Op::NIN, NO = Op::NOUT };
    const Idx nvec = n / Idx(N);
    const Idx base = Idx(blockIdx.x) * Idx(blockDim.x) * VPT + Idx(threadIdx.x);
    if constexpr (PDL) {
        if (int(blockIdx.x) < p.prefetch && base < nvec) {
#pragma unroll
            for (int q = 0; q < NI; ++q)
                prefetch_l2_line(reinterpret_cast<const uint4 *>(arr.in[q]) + base, 16u, threadIdx.x == 0);
        }
        pdl_wait();
    }
    pdl_launch_dependents();
    uint4 r[VPT][NI];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const Idx v = base + Idx(k) * Idx(blockDim.x);
#pragma unroll
        for (int q = 0; q < NI; ++q)
            r[k][q] = v < nvec ? reinterpret_cast<const uint4 *>(arr.in[q])[v] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const Idx v = base + Idx(k) * Idx(blockDim.x);
        if (v < nvec) {
            uint4 o[NO];
            vec_grad<Op, T>(r[k], o, p);
#pragma unroll
            for (int q = 0; q < NO; ++q)
                if (NO == 1 || arr.out[q])
                    store_vec<WB, PDL>(reinterpret_cast<uint4 *>(arr.out[q]) + v, o[q], p, true);
        }
    }
    if (blockIdx.x == gridDim.x - 1) {
        const Idx tail0 = nvec * Idx(N);
        const Idx nedge = head + (n - tail0);
        const Idx j = Idx(blockDim.x) - 1 - Idx(threadIdx.x);
        if (j < nedge)
            elem_grad<Op, T, Idx>(arr, j < head ? j - head : tail0 + (j - head), p);
    }
}

/* FreeRegs for the backward ops (specialised beside them): float64 erf's gradient at 1 vector a
 * thread, its usual form, took 32 registers with 6 values spilled (STL/LDL on the main path) under
 * __launch_bounds__(1024) alone, as the forward exp did before ew_fast_r. A trait of its own:
 * FreeRegs's Heavy64 test would also take float64 gelu's and silu's gradients, which do not spill
 * there and were not measured in the other form */
template <class Op, class T, int VPT> struct FreeRegsN { enum { value = 0 }; };

template <class Op, class T, class Idx, int VPT, bool PDL = true>
__global__ void __launch_bounds__(1024)
ew_fast_n(Arrays<T, Op::NIN, Op::NOUT> arr, Idx n, Idx head, OpArgs<T> p)
{
    ew_fast_n_body<Op, T, Idx, VPT, PDL>(arr, n, head, p);
}

template <class Op, class T, class Idx, int VPT, bool PDL = true>
__global__ void __maxnreg__(64)
ew_fast_n_r(Arrays<T, Op::NIN, Op::NOUT> arr, Idx n, Idx head, OpArgs<T> p)
{
    ew_fast_n_body<Op, T, Idx, VPT, PDL>(arr, n, head, p);
}

/* the backward default path's kernel for (Op, T, Idx, VPT, PDL): ew_fast_n_r where FreeRegsN says so */
template <class Op, class T, class Idx, int VPT, bool PDL = true>
static inline void (*fast_n_kernel())(Arrays<T, Op::NIN, Op::NOUT>, Idx, Idx, OpArgs<T>)
{
    if constexpr (FreeRegsN<Op, T, VPT>::value)
        return ew_fast_n_r<Op, T, Idx, VPT, PDL>;
    else
        return ew_fast_n<Op, T, Idx, VPT, PDL>;
}

/* The plain form's write-back instance (32-bit indices), as ew_fast's plain_kernel: the streaming
 * instance's code with write-back stores, which the launcher takes where the store rule says so
 * (a gradient is what the next backward kernel reads: in a captured training step a backward
 * kernel behind a torch kernel takes the plain form). Kernels of their own names, so that the
 * other forms keep theirs. */
template <class Op, class T, int VPT>
__global__ void __launch_bounds__(1024)
ew_fast_n_wb(Arrays<T, Op::NIN, Op::NOUT> arr, int n, int head, OpArgs<T> p)
{
    ew_fast_n_body<Op, T, int, VPT, false, true>(arr, n, head, p);
}

template <class Op, class T, int VPT>
__global__ void __maxnreg__(64)
ew_fast_n_r_wb(Arrays<T, Op::NIN, Op::NOUT> arr, int n, int head, OpArgs<T> p)
{
    ew_fast_n_body<Op, T, int, VPT, false, true>(arr, n, head, p);
}

/* the plain form (32-bit indices) by the launch's store rule: the write-back instance where wb */
template <class Op, class T, int VPT>
static inline void (*plain_n_kernel(int wb))(Arrays<T, Op::NIN, Op::NOUT>, int, int, OpArgs<T>)
{
    if (!wb)
        return fast_n_kernel<Op, T, int, VPT, false>();
    if constexpr (FreeRegsN<Op, T, VPT>::value)
        return ew_fast_n_r_wb<Op, T, VPT>;
    else
        return ew_fast_n_wb<Op, T, VPT>;
}

/* The arrays' offsets from a 16-byte boundary differ: one element per thread, grid-stride. */
template <class Op, class T>
__global__ void __launch_bounds__(1024)
ew_elem_n(Arrays<T, Op::NIN, Op::NOUT> arr, int64_t n, OpArgs<T> p)
{
    pdl_wait();
    pdl_launch_dependents();
    const int64_t nthr = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += nthr)
        elem_grad<Op, T, int64_t>(arr, i, p);
}

} /* namespace ewk */

#endif /* EWKERN_ELEMENTWISE_KERNEL_CUH */
