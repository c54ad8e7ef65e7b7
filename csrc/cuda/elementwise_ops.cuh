/*
 * elementwise_ops.cuh: the math of every op of ops.def on the default path (elementwise_auto.cu):
 * one Op_<name> functor per op (its input count, its kind, its function on the compute type),
 * the accurate math wrappers m_* they call, the sigmoid/silu/gelu helpers, the cheaper SFU forms
 * that MathOf picks for float16/bfloat16 (and gelu for float32), and Heavy (which ops' math is a
 * real share of a vector's time, for auto's launch rule). Device code only.
 */
#ifndef EWKERN_ELEMENTWISE_OPS_CUH
#define EWKERN_ELEMENTWISE_OPS_CUH

#include "elementwise_types.cuh"
#include "erfc_fit.h"   /* EW_ERFC_FIT_Q_F32: the float gelu fit, shared with the CPU */

namespace ewk {

/* accurate math, overloaded on the compute type (no fast-math intrinsics) */
EW_DEV float m_exp(float x) { return expf(x); }
EW_DEV double m_exp(double x) { return exp(x); }
EW_DEV float m_log(float x) { return logf(x); }
EW_DEV double m_log(double x) { return log(x); }
EW_DEV float m_sqrt(float x) { return sqrtf(x); }
EW_DEV double m_sqrt(double x) { return sqrt(x); }
EW_DEV float m_erf(float x) { return erff(x); }
EW_DEV double m_erf(double x) { return erf(x); }
EW_DEV float m_erfc(float x) { return erfcf(x); }
EW_DEV double m_erfc(double x) { return erfc(x); }
EW_DEV float m_tanh(float x) { return tanhf(x); }
EW_DEV double m_tanh(double x) { return tanh(x); }
EW_DEV float m_fma(float a, float b, float c) { return fmaf(a, b, c); }
EW_DEV double m_fma(double a, double b, double c) { return fma(a, b, c); }
EW_DEV float m_abs(float x) { return fabsf(x); }
EW_DEV double m_abs(double x) { return fabs(x); }
EW_DEV float m_rsqrt(float x) { return rsqrtf(x); }   /* 2 ulp (CUDA math), a few instructions */
EW_DEV double m_rsqrt(double x) { return rsqrt(x); }  /* 1 ulp */
/* a / b for b in [1, 2]: a times the SFU's reciprocal (within 2 ulp there, no slow path). The same
 * bits as __fdividef, which is this product for such b, but without its guard for |b| < 2^-126
 * (an FSETP and two predicated FMULs an element that cannot apply to a b in [1, 2]) */
EW_DEV float m_div_1to2(float a, float b)
{
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    return a * r;
}
/* double: the reciprocal seed (rcp.approx.ftz.f64, MUFU.RCP64H), one e + e^2 step and one residual
 * step, within 1 ulp for a in [0, 1] (subnormal a included) and no slow path; a / b is IEEE division
 * with a CALL to its slow path, which also made ptxas rebuild each polynomial constant of the
 * exp before it from two UMOVs (sigmoid float64: 93 instructions an element against torch's 41) */
EW_DEV double m_div_1to2(double a, double b)
{
    double r0;
    asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r0) : "d"(b));
    const double h = fma(-b, r0, 1.0);
    const double r = fma(r0, fma(h, h, h), r0);
    const double q = a * r;
    return fma(r, fma(-b, q, a), q);
}

/* 1/sqrt(2) split as hi + lo in each compute type */
template <class C> struct Rsqrt2;
template <> struct Rsqrt2<float> {
    static EW_DEV float hi() { return 0.707106769084930419921875f; }
    static EW_DEV float lo() { return 1.2101617104478970e-08f; }
};
template <> struct Rsqrt2<double> {
    static EW_DEV double hi() { return 0.70710678118654757; }
    static EW_DEV double lo() { return -4.8336466567264567e-17; /* 1/sqrt(2) - hi */ }
};

/* 1 / (1 + e^-x) without overflow: e = e^-|x| <= 1, numerator 1 (x >= 0) or e (x < 0), and
 * the denominator in [1, 2]. sigmoid_from_e takes e already formed (silu's one exponential). */
template <class C>
EW_DEV C sigmoid_from_e(C x, C e)
{
    return m_div_1to2(x >= C(0) ? C(1) : e, C(1) + e);
}
template <class C>
EW_DEV C sigmoid_of(C x)
{
    return sigmoid_from_e(x, m_exp(-m_abs(x)));
}

/* e^x for x below `limit()`, where e^x itself would be subnormal or nearly so:
 * e^x = e^(x + hi) * e^lo * 2^-k, hi + lo = k ln 2, hi a multiple of 2^-7 so that x + hi is exact. */
template <class C> struct TinyExp;
template <> struct TinyExp<float> {
    static EW_DEV float limit() { return -64.0f; }
    static EW_DEV float hi() { return 44.359375f; }                   /* 5678 / 128 */
    static EW_DEV float elo() { return 1.00204664736595744366f; }     /* e^(64 ln 2 - hi) */
    static EW_DEV float scale() { return 5.42101086242752217004e-20f; } /* 2^-64 */
};
template <> struct TinyExp<double> {
    static EW_DEV double limit() { return -256.0; }
    static EW_DEV double hi() { return 177.4453125; }                 /* 22713 / 128 */
    static EW_DEV double elo() { return 1.00036579023093566098; }     /* e^(256 ln 2 - hi) */
    static EW_DEV double scale() { return 8.63616855509444462539e-78; } /* 2^-256 */
};

/* x * sigmoid(x). Below TinyExp::limit() 1 + e^x rounds to 1 and silu = x e^x, formed from a
 * normal-range exponential and scaled once, so results near and below the subnormal range keep
 * their accuracy (x * e^x with a subnormal e^x would lose it). */
template <class C>
EW_DEV C silu_of(C x)
{
    /* The two forms from one exponential, chosen by selects. As a branch, in float64 ptxas made a
     * second copy of libdevice's exp for the tiny form and kept both paths' values live (144 SASS
     * instructions and 42 branches an element at 4 vectors a thread, 58 registers: 4 blocks of 256
     * an SM, where sigmoid takes 88); in float32 and 16-bit each element's chain sat in a branch
     * region of its own (no cell of the H100 moved either way: ELEMENTWISE_NOTES.md, "silu without
     * a branch"). */
    const bool tiny = x < TinyExp<C>::limit();
    const C e = m_exp(tiny ? x + TinyExp<C>::hi() : -m_abs(x));
    const C s = sigmoid_from_e(x, e);   /* e^-|x| where not tiny; unused where tiny */
    return tiny ? (x * (e * TinyExp<C>::elo())) * TinyExp<C>::scale() : x * s;
}

/* x/2 * (1 + erf(x / sqrt 2)) = x/2 * erfc(u), u = -x / sqrt 2: erfc for every x, so that there
 * is no cancellation in 1 + erf for x < 0 and no divergent branch. Where u > 0 (x < 0) erfc falls
 * fast and u's own rounding (x * hi is rounded, hi != 1/sqrt 2) matters: it is put back to first
 * order with erfc'(u) / erfc(u) = -h(u), h(u) ~ u + sqrt(u^2 + 1.65) (within a few % for u >= 0;
 * the correction itself is below 2^-17 relative, so h is formed in float). For u <= 0,
 * erfc(u) is in [1, 2] and insensitive to that rounding. */
template <class C>
EW_DEV C gelu_of(C x)
{
    const C hi = Rsqrt2<C>::hi();
    const C u = -(x * hi);
    const C ulo = -(m_fma(x, hi, u) + x * Rsqrt2<C>::lo()); /* exact u = u + ulo, to first order */
    const C e = m_erfc(u);
    const float uf = float(u < C(64) ? u : C(64)); /* erfc(u) is 0 long before; keeps h finite */
    const float y = fmaf(uf, uf, 1.65f);
    const float h = uf + y * rsqrtf(y);
    const C corr = u > C(0) ? C(h) * ulo : C(0);
    return C(0.5) * x * m_fma(-e, corr, e);
}

/* Each op: NIN inputs, KIND, and for KIND_COMPUTE the function on the compute type. */
/* KIND_GRAD: a backward op of grads.def (elementwise_grads.cuh): NIN arrays in, NOUT gradients out */
enum OpKind { KIND_COMPUTE, KIND_COPY, KIND_FILL, KIND_NATIVE, KIND_GRAD };

#define EWK_OP(NAME, NIN_, EXPR) \
    struct Op_##NAME { \
        enum { NIN = NIN_, KIND = KIND_COMPUTE }; \
        template <class C> EW_DEV C operator()(C a, C b, C s0, C s1) const \
        { \
            (void)a; (void)b; (void)s0; (void)s1; \
            return EXPR; \
        } \
    };
EWK_OP(add, 2, a + b)
EWK_OP(sub, 2, a - b)
EWK_OP(mul, 2, a * b)
EWK_OP(div, 2, a / b)
EWK_OP(maximum, 2, (a >= b || a != a) ? a : b) /* NaN if either is NaN (a NaN: a; b NaN: b) */
EWK_OP(minimum, 2, (a <= b || a != a) ? a : b)
EWK_OP(add_const, 1, a + s0)
EWK_OP(mul_const, 1, a * s0)
EWK_OP(axpby, 2, s0 * a + s1 * b)
EWK_OP(neg, 1, -a)
EWK_OP(abs, 1, m_abs(a))
EWK_OP(exp, 1, m_exp(a))
EWK_OP(log, 1, m_log(a))
EWK_OP(sqrt, 1, m_sqrt(a))
EWK_OP(rsqrt, 1, m_rsqrt(a))
EWK_OP(erf, 1, m_erf(a))
EWK_OP(tanh, 1, m_tanh(a))
EWK_OP(sigmoid, 1, sigmoid_of(a))
EWK_OP(relu, 1, (a > C(0) || a != a) ? a : C(0))
EWK_OP(gelu, 1, gelu_of(a))
EWK_OP(silu, 1, silu_of(a))
struct Op_copy {
    enum { NIN = 1, KIND = KIND_COPY };
};
/* gelu for float64 results (MathOf<Op_gelu, double>): x Phi(x) from one Phi(-y), y = |x|, for both
 * signs: x < 0: x Phi(-y), x >= 0: x (1 - Phi(-y)), with
 *     Phi(-y) = erfc(y / sqrt 2) / 2 = e^(-y^2/2) R(y),   R(y) = (1 - s) P(s),   s = y / (5 + y),
 * P of degree 19 fitted by scripts/gelu64_fit.py (weighted minimax on y in [0, 40]: relative error
 * under 0.08 x (1 + y^2/2) x 2^-52, the bound 4 + 2 a^2 allowing growth for x << 0), and
 * e^(-y^2/2) = 2^k e^(v/2), v = -y^2 - 2 k ln 2, e^(v/2) = 1 + v (1/2 + v Q(v)), Q of degree 9
 * (1.3e-17); 2^k goes on in two halves so that results in the subnormal range round from a normal
 * product. y is clamped to 40 (e^-800 underflows): x = +inf gives inf (1 - 0), x = -inf NaN
 * (-inf * 0, as the ops.def formula), NaN stays NaN. s is y / (5 + y) from the reciprocal seed and
 * one e + e^2 step, not 1 - 1/(1 + y/5): rounding 1 + y/5 would shift y by 5 x 2^-53 absolute, 3 ulp
 * of R near y = 0. No branch, no cancellation for x << 0, no erfc: libdevice's erfc(double) (two
 * divisions, a degree-24 polynomial, an exp) with gelu_of's rounding correction made 75 DP and 208
 * instructions an element, compute-bound on both GPUs (0.57-0.94 of torch); this is 46 DP and 92
 * instructions (VPT 4), against torch's erf form 49 and 88; the coefficients sit in __constant__
 * memory (ULDC.64 into uniform registers instead of two UMOVs per DFMA). Measured on the host
 * (scripts/gelu64_check.cu compiles this function there, 8 M inputs, against erfcl): at most 0.49
 * of 4 + 2 a^2 (2.06 ulp at x = -0.349), results below 2^-1022 within 289 x 2^-1074. */
#define EWK_GELU64_P(X) X(-0.0014881743856134532) X(0.011434231100881927) X(-0.037691292243027454) \
    X(0.06884299458050186) X(-0.07736697884237168) X(0.06361251726853955) X(-0.05091467052150699) \
    X(0.024526033068739326) X(0.019317359133418553) X(0.004559778696377528) X(-0.08644500145057958) \
    X(-0.012995448589373775) X(0.3020701598633614) X(-0.15010162934439022) X(-0.999982321121062) \
    X(2.5932743275510615) X(-3.3567292228083128) X(2.7605771959863823) X(-1.4947114020071655) X(0.5)
#define EWK_EXP64_Q(X) X(1.225604288699279e-11) X(2.6972730351546257e-10) X(5.3822790000605515e-09) \
    X(9.68809426655027e-08) X(1.5500992080500426e-06) X(2.1701388933119873e-05) X(0.00026041666666656453) \
    X(0.0026041666666640102) X(0.020833333333333336) X(0.12500000000000003)
#define EWK_COEF_ITEM(v) v,
/* Only in the file that defines EWK_GELU64_HERE (elementwise_gelu64.cu): a module with __constant__
 * data costs every one of its kernels about 0.12 us a launch, whether it reads the data or not
 * (elementwise_auto.cuh), so the other kernel files must not have these. */
#ifdef EWK_GELU64_HERE
static __constant__ double kGelu64P[20] = {EWK_GELU64_P(EWK_COEF_ITEM)};
static __constant__ double kExp64Q[10] = {EWK_EXP64_Q(EWK_COEF_ITEM)};
#endif

__host__ __device__ __forceinline__ double bits_f64(long long b)
{
    double d;
    memcpy(&d, &b, 8);
    return d;
}
__host__ __device__ __forceinline__ long long f64_bits(double d)
{
    long long b;
    memcpy(&b, &d, 8);
    return b;
}
/* The core, on both sides so that a host program can check it (the host's seed is a float
 * reciprocal; after the two steps both give s within 0.5 ulp): for y = min(|x|, 40), R(y) and
 * e^(-y^2/2) = e 2^k, e in [0.7, 1.42] and k in [-1154, 0]. */
struct Phi64 {
    double R, e;
    int k, hi; /* hi: x's high word, negative where x < 0 */
};
/* M values at once, each step of the two polynomials taken for all M before the next: ptxas loads
 * each coefficient into a uniform register (ULDC.64) once for the M evaluations (63 uniform
 * registers do not hold the 30 coefficients, so separate evaluations reload them). Each value's
 * operations are those of one evaluation, in the same order: the results are the same bits. */
template <int M>
__host__ __device__ __forceinline__ void phi_f64_n(const double (&x)[M], Phi64 (&f)[M], const double *P, const double *Q)
{
    double y[M], v[M], q[M];
#pragma unroll
    for (int j = 0; j < M; ++j) {
        /* y = min(|x|, 40) and x < 0 on the high word (integer compares; NaN goes to 40, then x * w) */
        const long long xb = f64_bits(x[j]);
        f[j].hi = int(xb >> 32);
        y[j] = (f[j].hi & 0x7fffffff) >= 0x40440000 ? 40.0 : bits_f64(xb & 0x7fffffffffffffffLL);
        /* e^(-y^2/2) = 2^k e^(v/2), v = -y^2 - 2 k ln 2, |v| <= ln 2; Q is fitted in v/2 and its i-th
         * coefficient scaled by 2^-(i+2) (exact) so that e = 1 + v (1/2 + v Q'(v)) */
        const double y2 = y[j] * y[j];
        const double shift = 6755399441055744.0; /* 1.5 x 2^52: adding it rounds to an integer */
        const double kd = fma(y2, -0.72134752044448170368, shift); /* -log2(e) / 2 */
        f[j].k = int(f64_bits(kd)); /* the low word: round(-y^2 log2(e) / 2), in [-1154, 0] */
        const double kf = kd - shift;
        v[j] = fma(kf, -1.38629436073824763298, -y2); /* 2 ln 2 = hi + lo, hi with 11 low zero bits */
        v[j] = fma(kf, -3.81642985854117540004e-10, v[j]);
        q[j] = Q[0];
    }
#pragma unroll
    for (int i = 1; i < 10; ++i)
#pragma unroll
        for (int j = 0; j < M; ++j)
            q[j] = fma(q[j], v[j], Q[i]);
    double s[M], p[M];
#pragma unroll
    for (int j = 0; j < M; ++j) {
        f[j].e = fma(v[j], fma(v[j], q[j], 0.5), 1.0);
        /* s = y / (5 + y): the seed, one e + e^2 step (s within ~1 ulp, which moves R by at most
         * 1.3 ulp at y ~ 3 and less elsewhere) */
        const double D = 5.0 + y[j];
#ifdef __CUDA_ARCH__
        double r0;
        asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r0) : "d"(D));
#else
        const double r0 = double(1.0f / float(D));
#endif
        const double h = fma(-D, r0, 1.0);
        s[j] = y[j] * fma(r0, fma(h, h, h), r0);
        p[j] = P[0];
    }
#pragma unroll
    for (int i = 1; i < 20; ++i)
#pragma unroll
        for (int j = 0; j < M; ++j)
            p[j] = fma(p[j], s[j], P[i]);
#pragma unroll
    for (int j = 0; j < M; ++j)
        f[j].R = (1.0 - s[j]) * p[j];
}
__host__ __device__ __forceinline__ Phi64 phi_f64(double x, const double *P, const double *Q)
{
    const double xs[1] = {x};
    Phi64 f[1];
    phi_f64_n<1>(xs, f, P, Q);
    return f[0];
}
/* x Phi(x) from x's core */
__host__ __device__ __forceinline__ double gelu_of_phi64(double x, const Phi64 &f)
{
    /* 2^k on in two halves, the first onto the bits: e R 2^k1 is normal, its product with 2^k2 rounds
     * once into the subnormal range */
    const int k1 = f.k >> 1, k2 = f.k - k1;
    const double m = bits_f64(f64_bits(f.e * f.R) + (static_cast<long long>(k1) << 52));
    const double E = m * bits_f64(static_cast<long long>(k2 + 1023) << 52); /* Phi(-y) */
    return x * (f.hi < 0 ? E : 1.0 - E);
}
__host__ __device__ __forceinline__ double gelu_f64(double x, const double *P, const double *Q)
{
    return gelu_of_phi64(x, phi_f64(x, P, Q));
}
/* gelu's derivative times g, Phi(x) + x phi(x) from the same core: with E0 = e^(-y^2/2) and
 * Phi(-y) = E0 R, phi(x) = E0 / sqrt(2 pi),
 *     x < 0:  E0 (R + x / sqrt(2 pi))          x >= 0:  1 + E0 (x / sqrt(2 pi) - R)
 * one exponential and no erfc for both terms (libdevice's erfc and exp took about twice the
 * instructions and ran the H200 at 0.65 of ewkern.mul's bytes a second). The sum's rounding is
 * relative to |Phi| + |x phi|, as grads.def's bound; E0 = (e 2^k1) 2^k2 rounds once (u E0 of a
 * subnormal E0, y in about [37.6, 38.6], errs by |u| 2^-1075 absolute, |u| < 16 there). x = +inf: inf x 0 = NaN, as the float64
 * formula (x phi(x)); x = -inf the same. */
__host__ __device__ __forceinline__ double gelu_grad_f64(double g, double x, const double *P, const double *Q)
{
    const Phi64 f = phi_f64(x, P, Q);
    const int k1 = f.k >> 1, k2 = f.k - k1;
    const double E0 = (f.e * bits_f64(static_cast<long long>(k1 + 1023) << 52))
                      * bits_f64(static_cast<long long>(k2 + 1023) << 52);
    const double u = fma(x, 0.398942280401432677939946059934381868, f.hi < 0 ? f.R : -f.R);
    return g * (f.hi < 0 ? u * E0 : fma(u, E0, 1.0));
}
/* float64 gelu's math, defined only where the coefficients are (EWK_GELU64_HERE): a kernel file
 * without them that instantiated it would fail to link (the declared function is never defined). */
struct Op_gelu_f64 {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV double operator()(double x, double, double, double) const;
    /* M elements at once (Batch: the default path's kernel hands it BATCH vectors) */
    template <int M> EW_DEV void batch(const double (&x)[M], double (&y)[M]) const;
};
#ifdef EWK_GELU64_HERE
EW_DEV double Op_gelu_f64::operator()(double x, double, double, double) const { return gelu_f64(x, kGelu64P, kExp64Q); }
template <int M> EW_DEV void Op_gelu_f64::batch(const double (&x)[M], double (&y)[M]) const
{
    Phi64 f[M];
    phi_f64_n<M>(x, f, kGelu64P, kExp64Q);
#pragma unroll
    for (int j = 0; j < M; ++j)
        y[j] = gelu_of_phi64(x[j], f[j]);
}
#endif

/* One PTX approximation on a float, each a single MUFU instruction of the SFU in SASS. Without
 * .ftz, subnormal inputs and results keep their value (a few more instructions around the MUFU). */
#define EWK_PTX_F32(NAME, INSN) \
    EW_DEV float NAME(float x) \
    { \
        float r; \
        asm(INSN " %0, %1;" : "=f"(r) : "f"(x)); \
        return r; \
    }
EWK_PTX_F32(lg2_approx, "lg2.approx.f32")
EWK_PTX_F32(ex2_approx, "ex2.approx.f32")
EWK_PTX_F32(ex2_approx_ftz, "ex2.approx.ftz.f32")
EWK_PTX_F32(rcp_approx_ftz, "rcp.approx.ftz.f32")
EWK_PTX_F32(tanh_approx, "tanh.approx.f32")
EWK_PTX_F32(sqrt_approx, "sqrt.approx.f32")
#undef EWK_PTX_F32

/* log for float16/bfloat16 results: ln a = log2(a) ln 2 from the SFU (lg2.approx.f32, without
 * .ftz so that subnormal bfloat16 inputs keep their value; MUFU.LG2 in SASS). Its error, at most
 * 2^-22 absolute on [0.5, 2] and 2 float ulp elsewhere (CUDA C++ Programming Guide, __log2f),
 * stays under 0.4 ulp of a float16 result and far under one of a bfloat16 result, so the op keeps
 * its 2-ulp bound; it replaces logf's ~20 instructions per element, which with 8 elements per
 * 16-byte vector made 16-bit log partly issue-bound (ELEMENTWISE_NOTES.md). */
struct Op_log_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return lg2_approx(a) * 0.693147180559945309f; }
};
/* gelu for float, float16 and bfloat16 results (float64 keeps gelu_of): x Phi(x) with
 * Phi(x) = erfc(-x / sqrt 2) / 2, from one erfc(z), z = |x| / sqrt 2, for both signs:
 *     x < 0: x erfc(z) / 2,    x >= 0: x (1 - erfc(z) / 2),
 *     erfc(z) = t 2^(-z^2 log2 e + s Q(s)),  t = 1 / (1 + z / 2),  s = 1 - t,
 * with Q fitted by scripts/gelu_fit.py (s Q(s) is log2(erfc(z) / t) + z^2 log2 e on z in [0, 10];
 * it is 0 at z = 0, so Horner's rounding stays relative near x = 0). Branch-free, one reciprocal and
 * one exp2 on the SFU (rcp.approx, ex2.approx: MUFU.RCP, MUFU.EX2), no cancellation for x << 0
 * (libdevice erfcf and the u-rounding correction of gelu_of cost about 60 instructions an element,
 * which made 16-bit gelu compute-bound at 0.55-0.6 of torch's erff form; ELEMENTWISE_NOTES.md).
 * The rounding of z, z^2 and the exponent costs about a^2 / 2 ulp for a << 0 (the stated bound's
 * 2 a^2 term); the rest stays under 4 ulp. */
static const float kLog2e = 1.44269504088896341f;
static const float kRsqrt2 = 0.707106781186547524f;
/* The fit (scripts/gelu_fit.py) for z >= 0: erfc(z) = t 2^(-z^2 log2 e + s Q(s)), t = 1 / (1 + z / 2),
 * s = 1 - t; each returns Q(s) and sets t and s. erfc_fit_f32: degree 10, t to 0.5 ulp by one Newton
 * step; erfc_fit_h16: degree 5, t from the SFU alone. gelu and its backward share them. */
EW_DEV float erfc_fit_f32(float z, float &t, float &s)
{
    const float d = fmaf(z, 0.5f, 1.0f);
    t = rcp_approx_ftz(d);
    t = fmaf(t, fmaf(-d, t, 1.0f), t);
    s = 1.0f - t;
    float q;
    EW_ERFC_FIT_Q_F32(q, s);   /* erfc_fit.h, shared with the CPU's gelu */
    return q;
}
EW_DEV float erfc_fit_h16(float z, float &t, float &s)
{
    t = rcp_approx_ftz(fmaf(z, 0.5f, 1.0f));
    s = 1.0f - t;
    float q = -0.32583496f;
    q = fmaf(q, s, 0.6181457f);
    q = fmaf(q, s, 0.11428998f);
    q = fmaf(q, s, -0.4197283f);
    return fmaf(q, s, -1.813977f);
}
/* float results: degree 10 (fit error 6e-9 relative), t to 0.5 ulp by one Newton step, and z
 * clamped to 16 (erfc(16) = 1e-113 underflows as erfc(inf) would) so that x = +-inf keeps t finite;
 * (x erfc) / 2 rounds once into the subnormal range. */
struct Op_gelu_f32 {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float x, float, float, float) const
    {
        const float z = fminf(fabsf(x) * kRsqrt2, 16.0f);
        float t, s;
        const float q = erfc_fit_f32(z, t, s);
        const float m = t * ex2_approx(fmaf(z * z, -kLog2e, s * q)); /* erfc(z) */
        return x < 0.0f ? (x * m) * 0.5f : x * (1.0f - 0.5f * m);
    }
};
/* float16/bfloat16 results: degree 5 (fit error 9e-6 relative, far under half a 16-bit ulp), no
 * Newton step, and the exponent raised by 32 (taken back in one product) so that .ftz flushes
 * nothing a bfloat16 subnormal result needs. x = +inf: t = 0, m = 0, x (1 - 0) = inf;
 * x = -inf: -inf * 0 = NaN, as the ops.def formula gives. */
struct Op_gelu_h16 {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float x, float, float, float) const
    {
        const float z = fabsf(x) * kRsqrt2;
        float t, s;
        const float q = erfc_fit_h16(z, t, s);
        const float m = t * ex2_approx_ftz(fmaf(z * z, -kLog2e, fmaf(s, q, 32.0f))); /* erfc(z) 2^32 */
        const float h = m * 0x1p-33f;
        return x * (x < 0.0f ? h : 1.0f - h);
    }
};
/* exp, tanh and sqrt for float16/bfloat16 results, on the SFU: libm's expf and tanhf (10-20
 * instructions) and sqrtf's IEEE fix-up made 16-bit exp, tanh and sqrt issue-bound on the H200
 * (0.95-0.99 of torch at 256 MiB-1 GiB, 8 elements per 16-byte vector). Errors, relative, before
 * the one rounding to 16 bits (half a 16-bit ulp is 2^-11 or 2^-8): exp 2^-17 (x log2 e rounded,
 * |x| < 128) + 2^-22 (ex2.approx), tanh 2^-10.99 (tanh.approx, PTX ISA), sqrt 2^-23; all inside
 * the ops' stated bounds (exp, tanh: 2 ulp; sqrt: 1 ulp), checked on every 16-bit input by
 * tests/test_elementwise.py. Without .ftz, subnormal inputs and results keep their value. */
struct Op_exp_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return ex2_approx(a * kLog2e); }
};
struct Op_tanh_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return tanh_approx(a); }
};
struct Op_sqrt_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return sqrt_approx(a); }
};
/* sigmoid and silu for float16/bfloat16 results: e = e^-|x| on the SFU (ex2.approx without .ftz,
 * as silu_backward's 16-bit form), in place of libm's expf and silu's tiny form. Errors, relative,
 * before the one rounding to 16 bits: 2^-17 (|x| log2 e rounded, |x| < 128), 2^-22 (ex2.approx),
 * 2^-23 (the reciprocal), far under half a 16-bit ulp (2^-11 or 2^-8). The tiny form is not needed
 * here: where e^x is a subnormal float (x < -87.3) it keeps 23 - (-x log2 e - 126) bits, at least 16
 * where x e^x is a normal bfloat16 and more than a bfloat16 subnormal holds below that (float16's
 * range ends near x = -17). */
EW_DEV float exp_neg_abs_sfu(float x) { return ex2_approx(-fabsf(x) * kLog2e); }
struct Op_sigmoid_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return sigmoid_from_e(a, exp_neg_abs_sfu(a)); }
};
struct Op_silu_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float a, float, float, float) const { return a * sigmoid_from_e(a, exp_neg_abs_sfu(a)); }
};
/* erf for float16/bfloat16 results (libdevice's erff: about 22 SASS instructions an element, which
 * kept 16-bit erf's single launches at 0.98-0.99 of torch): for |x| >= 2^-7,
 *     erf(x) = sign(x) (1 - 2^(-|x| S(|x|))),   S of degree 4,
 * fitted by scripts/erf16_fit.py (minimax on |x| in (0, 3] of erf's relative error; |x| S(|x|) >= 14
 * beyond, so 1 - 2^-14 and above round to 1 in both types) with ex2.approx.ftz; below 2^-7, where 1 - 2^(...) would
 * cancel, x 2/sqrt(pi) (erf's next term, x^3/3 of that, is under 2^-15 relative there). 10
 * instructions an element. Emulated in float32 on every 16-bit input, with ex2.approx's 2^-22 either
 * way: within 0.54 ulp (float16) and 0.51 (bfloat16) of erf; NaN gives NaN (every compare false),
 * +-inf +-1. */
struct Op_erf_sfu {
    enum { NIN = 1, KIND = KIND_COMPUTE };
    EW_DEV float operator()(float x, float, float, float) const
    {
        const float t = fabsf(x);
        float r = 0x1.88a96ap-9f;
        r = fmaf(r, t, -0x1.e82e80p-6f);
        r = fmaf(r, t, 0x1.310546p-3f);
        r = fmaf(r, t, 0x1.d63580p-1f);
        r = fmaf(r, t, 0x1.a0be98p+0f);
        const float big = copysignf(1.0f - ex2_approx_ftz(-(t * r)), x);
        return t < 0x1p-7f ? x * 1.12837916709551257f : big;
    }
};
/* The arithmetic an op runs for element type T: Op itself except where a cheaper form keeps
 * the op's accuracy bound for that type. */
template <class Op, class T> struct MathOf { typedef Op type; };
template <> struct MathOf<Op_log, half_t> { typedef Op_log_sfu type; };
template <> struct MathOf<Op_log, bf16_t> { typedef Op_log_sfu type; };
template <> struct MathOf<Op_exp, half_t> { typedef Op_exp_sfu type; };
template <> struct MathOf<Op_exp, bf16_t> { typedef Op_exp_sfu type; };
template <> struct MathOf<Op_tanh, half_t> { typedef Op_tanh_sfu type; };
template <> struct MathOf<Op_tanh, bf16_t> { typedef Op_tanh_sfu type; };
template <> struct MathOf<Op_sqrt, half_t> { typedef Op_sqrt_sfu type; };
template <> struct MathOf<Op_sqrt, bf16_t> { typedef Op_sqrt_sfu type; };
template <> struct MathOf<Op_sigmoid, half_t> { typedef Op_sigmoid_sfu type; };
template <> struct MathOf<Op_sigmoid, bf16_t> { typedef Op_sigmoid_sfu type; };
template <> struct MathOf<Op_silu, half_t> { typedef Op_silu_sfu type; };
template <> struct MathOf<Op_silu, bf16_t> { typedef Op_silu_sfu type; };
template <> struct MathOf<Op_erf, half_t> { typedef Op_erf_sfu type; };
template <> struct MathOf<Op_erf, bf16_t> { typedef Op_erf_sfu type; };
template <> struct MathOf<Op_gelu, float> { typedef Op_gelu_f32 type; };
template <> struct MathOf<Op_gelu, half_t> { typedef Op_gelu_h16 type; };
template <> struct MathOf<Op_gelu, bf16_t> { typedef Op_gelu_h16 type; };
template <> struct MathOf<Op_gelu, double> { typedef Op_gelu_f64 type; };
/* ops whose math (a libm-class function per element) is a real share of a 16-byte vector's time;
 * asked of MathOf<Op, T>, so 16-bit log (Op_log_sfu, 4 instructions) is not one: with 1 vector
 * per thread past 32 waves it ran 0.4-0.5% faster than with 2 (log float16 256 MiB-2 GiB) */
template <class Op> struct Heavy { enum { value = 0 }; };
template <> struct Heavy<Op_exp> { enum { value = 1 }; };
template <> struct Heavy<Op_log> { enum { value = 1 }; };
template <> struct Heavy<Op_erf> { enum { value = 1 }; };
template <> struct Heavy<Op_tanh> { enum { value = 1 }; };
template <> struct Heavy<Op_sigmoid> { enum { value = 1 }; };
template <> struct Heavy<Op_gelu> { enum { value = 1 }; };
template <> struct Heavy<Op_gelu_h16> { enum { value = 1 }; };
template <> struct Heavy<Op_gelu_f64> { enum { value = 1 }; };
template <> struct Heavy<Op_silu> { enum { value = 1 }; };
template <> struct Heavy<Op_erf_sfu> { enum { value = 1 }; };
template <> struct Heavy<Op_sigmoid_sfu> { enum { value = 1 }; };
template <> struct Heavy<Op_silu_sfu> { enum { value = 1 }; };
/* float64 math by how auto's plan treats it (asked of MathOf<Op, double>; see auto_plan):
 * H64_EXP (exp and sigmoid: 1 vector per thread at any size), H64_POLY (erf, log, tanh: 1 up to
 * 4 waves, 2 beyond), H64_GELU (4 past 4 waves, and from 2 where the 4-vector grid's last wave is
 * at least half full), H64_SILU (exp and a division per element: 4 past 8 waves). Measured on the
 * H200 and the H100 (ELEMENTWISE_NOTES.md, "float64 vectors per thread by function"). */
enum { H64_NONE = 0, H64_EXP = 1, H64_POLY = 2, H64_GELU = 3, H64_SILU = 4 };
/* Batch<M>::value: the most vectors the default path's kernel (ew_fast, both forms; the PDL form
 * then without its prefetch) hands M's batch() at once (all of a thread's vectors up to it); 1:
 * each vector's elements through operator(). float64 gelu (sm_90, nvcc 13; the counts include the
 * tail's one element; measured on the PDL form in 2cd6ff6): 4 vectors a thread 872 SASS
 * instructions with each vector evaluated alone (each reloaded the coefficients: 146 ULDC.64) ->
 * 784 (58) for all four at once, 40 -> 46 registers, no spill; 2 vectors a thread 520 (90) -> 488
 * (55); two at a time of four: 832. */
template <class M> struct Batch { enum { value = 1 }; };
template <> struct Batch<Op_gelu_f64> { enum { value = 4 }; };
template <class M> struct Heavy64 { enum { value = Heavy<M>::value ? int(H64_EXP) : int(H64_NONE) }; };
template <> struct Heavy64<Op_log> { enum { value = H64_POLY }; };
template <> struct Heavy64<Op_erf> { enum { value = H64_POLY }; };
template <> struct Heavy64<Op_tanh> { enum { value = H64_POLY }; };
template <> struct Heavy64<Op_gelu_f64> { enum { value = H64_GELU }; };
template <> struct Heavy64<Op_silu> { enum { value = H64_SILU }; };
struct Op_fill {
    enum { NIN = 0, KIND = KIND_FILL };
};
/* 7. add_const bfloat16 as a native bf16x2 fma: x * 1 + c with c rounded to bfloat16. */
struct Op_add_const_bf16fma {
    enum { NIN = 1, KIND = KIND_NATIVE };
};

} /* namespace ewk */

#endif /* EWKERN_ELEMENTWISE_OPS_CUH */
