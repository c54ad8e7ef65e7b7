/*
 * backward.c: the CPU kernels of the backward ops (csrc/grads.def), one "auto" variant per
 * (op, dtype).
 *
 * Versions:
 *   auto  one pass per (op, dtype) that reads each array once and writes each gradient once. The
 *         loop over elements of the compute type (float, double) is compiled for AVX-512, AVX2 +
 *         FMA and the baseline and picked per call (cpu_math.h), so exp and erfc in it are
 *         libmvec's vector functions of that ISA, as in the forward math ops; float32/float64 run
 *         it on the arrays, float16/bfloat16 on float tiles of EW_BW_TILE elements converted by
 *         the forward's block converters (the same bits as element by element: round to nearest
 *         even on the way back), except where a faster form gives the same bits: the arithmetic
 *         gradients in one pass widened in registers, and gelu, silu, erf by a table of d(a) for
 *         every 16-bit a (below). On the OpenMP team from EW_BW_PAR_MIN elements, in blocks.
 *         Before 2026-11-26 it was one baseline loop calling scalar libm per element: gelu, silu
 *         and erf gradients 3-23x and every float16 gradient 11-50x slower (CPU_NOTES.md).
 *
 * The arithmetic of each op is written once below (EWB_<op>, for compute type T); the CUDA
 * kernels (csrc/cuda/elementwise_backward.cu) compute the same functions, some through fits of
 * their own, and both meet grads.def's bounds (libmvec's ISA variants differ in the last bits of
 * exp and erfc, within those bounds, as the forward ops' do).
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "../ewkern_kernels.h"
#include "cpu_math.h"
#include "half.h"
#include "half_simd.h"
#include "team.h"

#define EW_BW_PAR_MIN ((int64_t)1 << 14)
/* elements per OpenMP block (float32/float64) and per float tile (float16/bfloat16: five float
 * tiles of 4 KiB stay in L1) */
#define EW_BW_BLOCK ((int64_t)1 << 13)
#define EW_BW_TILE 1024

#ifdef _OPENMP
#define EW_BW_SIMD _Pragma("omp simd")
#else
#define EW_BW_SIMD
#endif

#define EW_BW_M_float(fn) fn##f
#define EW_BW_M_double(fn) fn
#define EW_BW_M(T, fn) EW_BW_M_I(T, fn)
#define EW_BW_M_I(T, fn) EW_BW_M_##T(fn)

/* 1 / sqrt(2), 1 / sqrt(2 pi), 2 / sqrt(pi) */
#define EW_BW_SQRT1_2 0.707106781186547524400844362104849039
#define EW_BW_INV_SQRT_2PI 0.398942280401432677939946059934381868
#define EW_BW_2_SQRTPI 1.12837916709551257389615890312154517

/* The ?: below become vector selects because the sources build with -fno-trapping-math
 * (setup.py): under the default, gcc sinks an arm's float work into a branch it will not
 * if-convert, and the AVX2 and SSE forms of these loops stayed scalar (AVX-512's masks hid it).
 *
 * e^(-a^2 / 2^k) with a^2 split into p + e exactly (e = fma(a, a, -p)): e^(-(p + e) / 2^k) =
 * e^(-p / 2^k) (1 - e / 2^k) to first order, so the rounding of a^2 (relative 2^-24 of an
 * exponent that reaches 100) costs nothing. */
#define EW_BW_DEFINE_GAUSS(T, S, EXP, ERFC)                                                  \
    static inline T ew_bw_gauss##S##_##T(T a, T scale)                                       \
    {                                                                                        \
        const T p = a * a;                                                                   \
        const T f = EW_BW_M(T, fma)(a, a, -p);                                               \
        const T e = p < (T)INFINITY ? f : (T)0; /* p = inf: f = -inf, and no correction */   \
        return EXP(-p * scale) * ((T)1 - e * scale);                                         \
    }                                                                                        \
    static inline T ew_bw_sigmoid##S##_##T(T a)                                              \
    {                                                                                        \
        const T e = EXP(-EW_BW_M(T, fabs)(a));                                               \
        const T r = (T)1 / ((T)1 + e), er = e * r;                                           \
        return a >= 0 ? r : er;                                                              \
    }                                                                                        \
    static inline T ew_bw_gelu##S##_##T(T g, T a)                                            \
    {                                                                                        \
        const T cdf = (T)0.5 * ERFC(-a * (T)EW_BW_SQRT1_2);                                  \
        const T pdf = ew_bw_gauss##S##_##T(a, (T)0.5) * (T)EW_BW_INV_SQRT_2PI;               \
        return g * EW_BW_M(T, fma)(a, pdf, cdf);                                             \
    }                                                                                        \
    /* s = sigmoid(a) and 1 - s = sigmoid(-a) each from e = e^-|a| (1 - s from s would cancel for  \
     * a >> 0, where a (1 - s) still matters)                                               */ \
    static inline T ew_bw_silu##S##_##T(T g, T a)                                            \
    {                                                                                        \
        const T e = EXP(-EW_BW_M(T, fabs)(a));                                               \
        const T r = (T)1 / ((T)1 + e), er = e * r;                                           \
        const T s = a >= 0 ? r : er, t = a >= 0 ? er : r;                                    \
        return g * (s * EW_BW_M(T, fma)(a, t, (T)1));                                        \
    }                                                                                        \
    static inline T ew_bw_sign##S##_##T(T a) { return a != a ? a : (T)((a > 0) - (a < 0)); }
EW_BW_DEFINE_GAUSS(float, , expf, erfcf)
EW_BW_DEFINE_GAUSS(double, , exp, erfc)
/* the saturated forms (elementwise.c, "saturated lanes"): float only */
EW_BW_DEFINE_GAUSS(float, _sat, ew_exp_sat_float, ew_erfc_sat_float)
/* e^-|a| without a libm call (the AVX2 and AVX-512 forms of silu's gradient; cpu_math.h) */
EW_BW_DEFINE_GAUSS(float, _fit, ew_exp_neg_fit_float, erfcf)

/* ---- per-op arithmetic: G, A, B the loaded arrays (grad, then the saved ones), S0/S1 the
 * scalars, all of compute type T; O1 (and O2) the gradients. */
#define EWB_gelu_backward(T)    O1 = ew_bw_gelu_##T(G, A)
#define EWB_silu_backward(T)    O1 = ew_bw_silu_##T(G, A)
#define EWB_sigmoid_backward(T) O1 = G * (A * (1.0f - A))   /* 1.0f: T may be a vector type (EW_BW16) */
#define EWB_tanh_backward(T)    O1 = G * EW_BW_M(T, fma)(-A, A, (T)1)
#define EWB_erf_backward(T)     O1 = G * (ew_bw_gauss_##T(A, (T)1) * (T)EW_BW_2_SQRTPI)
#define EWB_exp_backward(T)     O1 = G * A
#define EWB_log_backward(T)     O1 = G / A
#define EWB_sqrt_backward(T)    O1 = G / (A + A)
#define EWB_rsqrt_backward(T)   O1 = ((-0.5f * G * A) * A) * A  /* each step between -G/2 and the result: no spurious overflow */
#define EWB_abs_backward(T)     O1 = G * ew_bw_sign_##T(A)
#define EWB_relu_backward(T)    O1 = A <= (T)0 ? (T)0 : G
#define EWB_mul_backward(T)     O1 = G * B; O2 = G * A
#define EWB_div_backward(T)                                                                  \
    do {                                                                                     \
        const T q = G / B;                                                                   \
        O1 = q;                                                                              \
        O2 = -(q * A) / B;                                                                   \
    } while (0)
#define EWB_maximum_backward(T)                                                              \
    do {                                                                                     \
        const T h = A == B ? G * (T)0.5 : G;                                                 \
        O1 = A < B ? (T)0 : h;                                                               \
        O2 = A > B ? (T)0 : h;                                                               \
    } while (0)
#define EWB_minimum_backward(T)                                                              \
    do {                                                                                     \
        const T h = A == B ? G * (T)0.5 : G;                                                 \
        O1 = A > B ? (T)0 : h;                                                               \
        O2 = A < B ? (T)0 : h;                                                               \
    } while (0)
#define EWB_axpby_backward(T)   O1 = S0 * G; O2 = S1 * G

/* which backward ops take float chunks with saturating lanes through a saturated form (a
 * chunk's least and greatest saved input, as elementwise.c's math ops): gelu's erfc and e^(-a^2/2)
 * underflow past |a| of 14.5, erf's e^(-a^2) past 10.2, silu's e^(-|a|) past 104 */
#define EWBSAT_gelu_backward 2   /* 2: the FMA forms by the fit (EWBX_), the baseline as 1 */
#define EWBSAT_silu_backward 2
#define EWBSAT_sigmoid_backward 0
#define EWBSAT_tanh_backward 0
#define EWBSAT_erf_backward 1
#define EWBSAT_exp_backward 0
#define EWBSAT_log_backward 0
#define EWBSAT_sqrt_backward 0
#define EWBSAT_rsqrt_backward 0
#define EWBSAT_abs_backward 0
#define EWBSAT_relu_backward 0
#define EWBSAT_mul_backward 0
#define EWBSAT_div_backward 0
#define EWBSAT_maximum_backward 0
#define EWBSAT_minimum_backward 0
#define EWBSAT_axpby_backward 0
#define EWBS_gelu_backward(lo, hi) (hi > 14.0f || lo < -14.0f)
#define EWBS_erf_backward(lo, hi)  (hi > 10.0f || lo < -10.0f)
#define EWBS_silu_backward(lo, hi) (hi > 104.0f || lo < -104.0f)
#define EWBF_gelu_backward(T)   O1 = ew_bw_gelu_sat_float(G, A)
/* the forms without a libm call that the AVX2 and AVX-512 forms run (EWBSAT_<op> 2; cpu_math.h) */
#define EWBX_gelu_backward(T)   O1 = G * ew_gelu_grad_fit_float(A)
#define EWBX_silu_backward(T)   O1 = ew_bw_silu_fit_float(G, A)
#define EWBF_erf_backward(T)    O1 = G * (ew_bw_gauss_sat_float(A, 1.0f) * (float)EW_BW_2_SQRTPI)
#define EWBF_silu_backward(T)   O1 = ew_bw_silu_sat_float(G, A)

/* ---- the loop over compute-type elements, one function per ISA ----------------------------
 * ew_bwr_<op>_<T>(g, a, b, o1, o2, S0, S1, m): elements 0..m-1 of arrays of T; a gradient whose
 * pointer is NULL (nobody asked for it) is computed and dropped, the branch the same for every
 * element. */
/* the plain loop, or (float, EWBSAT_<op> 1) chunks whose sample of a holds saturating lanes
 * through the saturated form (elementwise.c, "saturated lanes") */
#define EW_BW_RANGE_VARIANT(name, inputs, outputs, T, sfx, attr)                             \
    EW_BW_PASTE(EW_BW_RANGE_VARIANT_, EW_BW_SAT_##T(EWBSAT_##name))(name, inputs, outputs, T, sfx, attr)
#define EW_BW_SAT_float(flag) flag
#define EW_BW_SAT_double(flag) 0
#define EW_BW_PASTE(x, y) EW_BW_PASTE_I(x, y)
#define EW_BW_PASTE_I(x, y) x##y
#define EW_BW_RANGE_VARIANT_0(name, inputs, outputs, T, sfx, attr)                           \
    attr static void ew_bwr_##name##_##T##_##sfx(const T *g, const T *a, const T *b, T *o1, T *o2, \
                                                 T S0, T S1, int64_t m)                        \
    EW_BW_LOOP(name, inputs, outputs, T, EWB_##name, 0, m)
#define EW_BW_RANGE_VARIANT_1(name, inputs, outputs, T, sfx, attr)                           \
    attr static void ew_bwr_##name##_##T##_##sfx(const T *g, const T *a, const T *b, T *o1, T *o2, \
                                                 T S0, T S1, int64_t m)                        \
    {                                                                                        \
        for (int64_t c0 = 0; c0 < m; c0 += EW_SAT_CHUNK) {                                   \
            const int64_t c1 = m - c0 < EW_SAT_CHUNK ? m : c0 + EW_SAT_CHUNK;                \
            EW_SAT_SAMPLE(T, a + c0, c1 - c0, lo, hi)                                        \
            if (EWBS_##name(lo, hi))                                                         \
                EW_BW_LOOP(name, inputs, outputs, T, EWBF_##name, c0, c1)                    \
            else                                                                             \
                EW_BW_LOOP(name, inputs, outputs, T, EWB_##name, c0, c1)                     \
        }                                                                                    \
    }
/* EWBSAT 2 (float): the AVX2 and AVX-512 forms a plain loop of the fitted form (EWBX_<op>), the
 * baseline (no FMA instruction) the chunks of EWBSAT 1 */
#define EW_BW_RANGE_VARIANT_2(name, inputs, outputs, T, sfx, attr)                           \
    EW_BW_PASTE(EW_BW_FIT_, sfx)(name, inputs, outputs, T, sfx, attr)
#define EW_BW_FIT_base EW_BW_RANGE_VARIANT_1
#define EW_BW_FIT_avx2 EW_BW_FIT_LOOP
#define EW_BW_FIT_avx512 EW_BW_FIT_LOOP
#define EW_BW_FIT_LOOP(name, inputs, outputs, T, sfx, attr)                                  \
    attr static void ew_bwr_##name##_##T##_##sfx(const T *g, const T *a, const T *b, T *o1, T *o2, \
                                                 T S0, T S1, int64_t m)                        \
    EW_BW_LOOP(name, inputs, outputs, T, EWBX_##name, 0, m)
/* elements [c0, c1) by FORM (EWB_<op> or its saturated form) */
#define EW_BW_LOOP(name, inputs, outputs, T, FORM, c0, c1)                                   \
    {                                                                                        \
        EW_BW_SIMD                                                                           \
        for (int64_t i = (c0); i < (c1); i++) {                                              \
            const T G = g[i];                                                                \
            const T A = (inputs) >= 2 ? a[i] : (T)0;                                         \
            const T B = (inputs) >= 3 ? b[i] : (T)0;                                         \
            T O1, O2 = (T)0;                                                                 \
            (void)A; (void)B; (void)S0; (void)S1;                                            \
            FORM(T);                                                                         \
            if (o1)                                                                          \
                o1[i] = O1;                                                                  \
            if ((outputs) >= 2 && o2)                                                        \
                o2[i] = O2;                                                                  \
        }                                                                                    \
    }

#define EW_BW_RANGE(name, inputs, outputs, T)                                                \
    EW_ISA_FORMS(EW_BW_RANGE_VARIANT, name, inputs, outputs, T)                              \
    static void ew_bwr_##name##_##T(const T *g, const T *a, const T *b, T *o1, T *o2, T S0, T S1, \
                                    int64_t m)                                               \
    {                                                                                        \
        EW_ISA_CALL(ew_bwr_##name##_##T, g, a, b, o1, o2, S0, S1, m);                        \
    }

/* ---- dtypes: storage type, compute type, float tiles or not, the block converters (16-bit) ------ */
#define EW_BW_f32_ST float
#define EW_BW_f32_CT float
#define EW_BW_f32_ENUM EW_FLOAT32
#define EW_BW_f32_TILED 0
#define EW_BW_f64_ST double
#define EW_BW_f64_CT double
#define EW_BW_f64_ENUM EW_FLOAT64
#define EW_BW_f64_TILED 0
#define EW_BW_f16_ST uint16_t
#define EW_BW_f16_CT float
#define EW_BW_f16_ENUM EW_FLOAT16
#define EW_BW_f16_TILED 1
#define EW_BW_f16_TOF ew_f16_to_f32_block
#define EW_BW_f16_FROMF ew_f32_to_f16_block
#define EW_BW_bf16_ST uint16_t
#define EW_BW_bf16_CT float
#define EW_BW_bf16_ENUM EW_BFLOAT16
#define EW_BW_bf16_TILED 1
#define EW_BW_bf16_TOF ew_bf16_to_f32_block
#define EW_BW_bf16_FROMF ew_f32_to_bf16_block
#define EW_BW(dt, what) EW_BW_##dt##_##what

/* the arguments of a launch, checked: 0 to run, else the return value */
#define EW_BW_ARGS(inputs, st_t, CT)                                                         \
    const ew_args *args = (const ew_args *)argp;                                             \
    const int64_t n = args->n;                                                               \
    const st_t *g = (const st_t *)args->in[0];                                               \
    const st_t *a = (inputs) >= 2 ? (const st_t *)args->in[1] : NULL;                        \
    const st_t *b = (inputs) >= 3 ? (const st_t *)args->in[2] : NULL;                        \
    st_t *o1 = (st_t *)args->out;                                                            \
    st_t *o2 = (st_t *)args->out2;                                                           \
    const CT S0 = (CT)args->scalar[0];                                                       \
    const CT S1 = (CT)args->scalar[1];                                                       \
    if (n <= 0)                                                                              \
        return n == 0 ? 0 : EINVAL;                                                          \
    if (!g || ((inputs) >= 2 && !a) || ((inputs) >= 3 && !b) || (!o1 && !o2))                \
        return EINVAL;

#define EW_BW_AT(p, i) ((p) ? (p) + (i) : NULL)
#define EW_BW_FN(name, T) EW_BW_FN_I(name, T)   /* ew_bwr_<name>_<T>, T expanded first */
#define EW_BW_FN_I(name, T) ew_bwr_##name##_##T

/* float32/float64: the loop on the arrays, in blocks of EW_BW_BLOCK on the OpenMP team */
#define EW_BW_LAUNCHER_DIRECT(name, inputs, outputs, dt)                                     \
    static int ew_cpu_##name##_##dt(const void *argp)                                        \
    {                                                                                        \
        typedef EW_BW(dt, ST) st_t;                                                          \
        EW_BW_ARGS(inputs, st_t, st_t)                                                       \
        const int64_t nb = (n + EW_BW_BLOCK - 1) / EW_BW_BLOCK;                              \
        EW_TEAM_FOR(n >= EW_BW_PAR_MIN, k, nb,                                               \
            const int64_t i0 = k * EW_BW_BLOCK, m = n - i0 < EW_BW_BLOCK ? n - i0 : EW_BW_BLOCK; \
            EW_BW_FN(name, EW_BW(dt, CT))(g + i0, EW_BW_AT(a, i0), EW_BW_AT(b, i0),           \
                                          EW_BW_AT(o1, i0), EW_BW_AT(o2, i0), S0, S1, m);    \
        );                                                                                   \
        return 0;                                                                            \
    }

/* float16/bfloat16 in one pass, for the gradients that are arithmetic alone (EWBA_<op> below:
 * EWB_<op> compiles on GCC's vector types): each group of W elements (16 with AVX-512, 8 with
 * AVX2) widened in registers (half_simd.h), the op's line, each gradient rounded back and stored;
 * the last m % W through half.h's scalar converters. The same bits as the float tiles (which the
 * baseline ISA keeps, and float16 on a CPU without F16C), at a third of their L1 traffic: the
 * forward ops' one-pass form took float16 mul at 1 MiB from 56 to 16 us (elementwise.c). Every
 * input of a group is loaded before its gradients are stored. */
typedef void (*ew_bw16_fn)(const uint16_t *g, const uint16_t *a, const uint16_t *b, uint16_t *o1, uint16_t *o2,
                           float S0, float S1, int64_t m);
#define EW_BW_f16_TOFLOAT(h) ew_half_to_float(h)
#define EW_BW_f16_SV(x) ew_float_to_half(x)
#define EW_BW_bf16_TOFLOAT(h) ew_bf16_to_float(h)
#define EW_BW_bf16_SV(x) ew_float_to_bf16(x)
#define EW_BW_f16_NEGINF 0xfc00u   /* -inf's bits */
#define EW_BW_bf16_NEGINF 0xff80u

#if EW_X86_DISPATCH
#define EW_BW16_FORM(name, inputs, outputs, dt, sfx, attr, W, VT, WIDEN, NARROW)               \
    attr static void ew_bw16_##name##_##dt##_##sfx(const uint16_t *g, const uint16_t *a,        \
                                                   const uint16_t *b, uint16_t *o1, uint16_t *o2, \
                                                   float S0, float S1, int64_t m)             \
    {                                                                                        \
        int64_t i = 0;                                                                       \
        for (; i + (W) <= m; i += (W)) {                                                     \
            const VT G = WIDEN(g + i);                                                       \
            const VT A = (inputs) >= 2 ? WIDEN(a + i) : G;                                   \
            const VT B = (inputs) >= 3 ? WIDEN(b + i) : G;                                   \
            VT O1, O2 = G;                                                                   \
            (void)A; (void)B; (void)S0; (void)S1;                                            \
            EWBV_##name(VT);                                                                 \
            if (o1)                                                                          \
                NARROW(o1 + i, O1);                                                          \
            if ((outputs) >= 2 && o2)                                                        \
                NARROW(o2 + i, O2);                                                          \
        }                                                                                    \
        for (; i < m; i++) {                                                                 \
            const float G = EW_BW(dt, TOFLOAT)(g[i]);                                        \
            const float A = (inputs) >= 2 ? EW_BW(dt, TOFLOAT)(a[i]) : G;                    \
            const float B = (inputs) >= 3 ? EW_BW(dt, TOFLOAT)(b[i]) : G;                    \
            float O1, O2 = G;                                                                \
            (void)A; (void)B;                                                                \
            EWB_##name(float);                                                               \
            if (o1)                                                                          \
                o1[i] = EW_BW(dt, SV)(O1);                                                   \
            if ((outputs) >= 2 && o2)                                                        \
                o2[i] = EW_BW(dt, SV)(O2);                                                   \
        }                                                                                    \
    }
#define EW_BW16_DEFINE(name, inputs, outputs, dt, f16c)                                      \
    EW_BW16_FORM(name, inputs, outputs, dt, avx512, EW_ISA_AVX512, 16, __m512, ew_w16_##dt, ew_n16_##dt) \
    EW_BW16_FORM(name, inputs, outputs, dt, avx2, EW_ISA_AVX2_F16C, 8, __m256, ew_w8_##dt, ew_n8_##dt) \
    static ew_bw16_fn ew_bw16_pick_##name##_##dt(void) { return EW_PICK16(ew_bw16_##name##_##dt, f16c); }
#else
#define EW_BW16_DEFINE(name, inputs, outputs, dt, f16c)                                      \
    static ew_bw16_fn ew_bw16_pick_##name##_##dt(void) { return NULL; }
#endif
/* the op's line on the vector types (EWBV_<op>): EWB_<op>, but tanh's fma, which C's vector types
 * do not take, as the ISA's fused multiply-add (one rounding, as fmaf: the tiles' bits) */
#define EWBV_sigmoid_backward EWB_sigmoid_backward
#define EWBV_exp_backward     EWB_exp_backward
#define EWBV_log_backward     EWB_log_backward
#define EWBV_sqrt_backward    EWB_sqrt_backward
#define EWBV_rsqrt_backward   EWB_rsqrt_backward
#define EWBV_mul_backward     EWB_mul_backward
#define EWBV_div_backward     EWB_div_backward
#define EWBV_axpby_backward   EWB_axpby_backward
#define EWBV_tanh_backward(T)                                                                \
    O1 = G * _Generic((A), __m512: _mm512_fmadd_ps, __m256: _mm256_fmadd_ps)(-A, A, (T){0} + 1.0f)
#define EW_BW16_OPS(X)                                                                       \
    X(sigmoid_backward, 2, 1) X(exp_backward, 2, 1) X(log_backward, 2, 1) X(sqrt_backward, 2, 1) \
    X(rsqrt_backward, 2, 1) X(mul_backward, 3, 2) X(div_backward, 3, 2) X(axpby_backward, 1, 2) \
    X(tanh_backward, 2, 1)
#define EW_BW16_BOTH(name, inputs, outputs)                                                  \
    EW_BW16_DEFINE(name, inputs, outputs, f16, 1) EW_BW16_DEFINE(name, inputs, outputs, bf16, 0)
EW_BW16_OPS(EW_BW16_BOTH)
#define EWBA_YES(name, dt) ew_bw16_pick_##name##_##dt()
#define EWBA_NO(name, dt) ((ew_bw16_fn)NULL)
#define EWBA_gelu_backward    EWBA_NO
#define EWBA_silu_backward    EWBA_NO
#define EWBA_sigmoid_backward EWBA_YES
#define EWBA_tanh_backward    EWBA_YES
#define EWBA_erf_backward     EWBA_NO
#define EWBA_exp_backward     EWBA_YES
#define EWBA_log_backward     EWBA_YES
#define EWBA_sqrt_backward    EWBA_YES
#define EWBA_rsqrt_backward   EWBA_YES
#define EWBA_abs_backward     EWBA_NO
#define EWBA_relu_backward    EWBA_NO
#define EWBA_mul_backward     EWBA_YES
#define EWBA_div_backward     EWBA_YES
#define EWBA_maximum_backward EWBA_NO
#define EWBA_minimum_backward EWBA_NO
#define EWBA_axpby_backward   EWBA_YES

/* float16/bfloat16 gradients that are G times a function of A alone, d(A), costing exp or erfc an
 * element (EWBK_<op> 1: gelu, silu, erf): a table of d for each of the 65536 patterns of A, made on
 * the first call of at least EW_BW_LUT_MIN elements by the tile loop itself with G = 1 (1 * d is d,
 * NaN included), so that G * table[A] in float is the tile loop's G * d(A), the same bits; kept for
 * the life of the process (256 KiB a table, published once: a thread that loses the race frees its
 * copy); if it cannot be allocated the tiles run. A tile is then G widened, times the entry, rounded
 * back: no libmvec call an element (forward 16-bit math ops read tables the same way, elementwise.c). */
#define EW_BW_LUT_MIN ((int64_t)1 << 14)
#define EW_BW_LUT_SIZE 65536
typedef void (*ew_bw_tof_fn)(const uint16_t *, float *, int);
typedef void (*ew_bwr_float_fn)(const float *, const float *, const float *, float *, float *, float, float,
                                int64_t);

static const float *ew_bw_lut(_Atomic(float *) *slot, int64_t n, ew_bwr_float_fn range, ew_bw_tof_fn tof)
{
    float *t = atomic_load_explicit(slot, memory_order_acquire);
    if (t != NULL || n < EW_BW_LUT_MIN)
        return t;
    t = (float *)malloc(EW_BW_LUT_SIZE * sizeof *t);
    if (t == NULL)
        return NULL;
    _Alignas(64) uint16_t idx[EW_BW_TILE];
    _Alignas(64) float ta[EW_BW_TILE], ones[EW_BW_TILE];
    for (int j = 0; j < EW_BW_TILE; j++)
        ones[j] = 1.0f;
    for (int base = 0; base < EW_BW_LUT_SIZE; base += EW_BW_TILE) {
        for (int j = 0; j < EW_BW_TILE; j++)
            idx[j] = (uint16_t)(base + j);
        tof(idx, ta, EW_BW_TILE);
        range(ones, ta, NULL, t + base, NULL, 0.0f, 0.0f, EW_BW_TILE);
    }
    float *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(slot, &expected, t, memory_order_acq_rel, memory_order_acquire)) {
        free(t);
        t = expected;
    }
    return t;
}
/* EWBK_<op>: the 16-bit form past the one-pass ones: 1 the table of d(A) above, 2 a select on the
 * bits (relu: A <= 0, i.e. +-0 or a negative number down to -inf, gives +0, else G's bits, as the
 * tiles give them but for a signalling NaN in G, which the tiles quieted), 0 the float tiles */
#define EWBK_gelu_backward    1
#define EWBK_silu_backward    1
#define EWBK_erf_backward     1
#define EWBK_sigmoid_backward 0
#define EWBK_tanh_backward    0
#define EWBK_exp_backward     0
#define EWBK_log_backward     0
#define EWBK_sqrt_backward    0
#define EWBK_rsqrt_backward   0
#define EWBK_abs_backward     0
#define EWBK_relu_backward    2
#define EWBK_mul_backward     0
#define EWBK_div_backward     0
#define EWBK_maximum_backward 0
#define EWBK_minimum_backward 0
#define EWBK_axpby_backward   0

/* float16/bfloat16: the one-pass form where the op and the CPU have one, a table of d(A) where the
 * op has one (above), else float tiles (in, the loop, out); groups or tiles on the OpenMP team.
 * Every input of a tile is converted before a gradient is written, so a gradient may be written over
 * an input. */
#define EW_BW_LAUNCHER_TILED(name, inputs, outputs, dt)                                      \
    static int ew_cpu_##name##_##dt(const void *argp)                                        \
    {                                                                                        \
        EW_BW_ARGS(inputs, uint16_t, float)                                                  \
        const int64_t nt = (n + EW_BW_TILE - 1) / EW_BW_TILE;                                \
        const ew_bw16_fn one = EWBA_##name(name, dt);                                        \
        if (one) {                                                                           \
            EW_TEAM_FOR(n >= EW_BW_PAR_MIN, t, nt,                                           \
                const int64_t i0 = t * EW_BW_TILE;                                           \
                one(g + i0, EW_BW_AT(a, i0), EW_BW_AT(b, i0), EW_BW_AT(o1, i0), EW_BW_AT(o2, i0), S0, S1, \
                    n - i0 < EW_BW_TILE ? n - i0 : EW_BW_TILE);                               \
            );                                                                               \
            return 0;                                                                        \
        }                                                                                    \
        if (EWBK_##name == 2 && o1) {                                                        \
            EW_TEAM_FOR(n >= EW_BW_PAR_MIN, t, nt,                                           \
                const int64_t i0 = t * EW_BW_TILE, m = n - i0 < EW_BW_TILE ? n - i0 : EW_BW_TILE; \
                EW_BW_SIMD                                                                   \
                for (int64_t i = i0; i < i0 + m; i++) { /* a mask, not a ?: around the load of g */ \
                    const uint32_t zero = (uint32_t)(a[i] == 0u)                             \
                                          | (uint32_t)((uint16_t)(a[i] - 0x8000u) <= EW_BW(dt, NEGINF) - 0x8000u); \
                    o1[i] = (uint16_t)(g[i] & (zero - 1u));                                  \
                }                                                                            \
            );                                                                               \
            return 0;                                                                        \
        }                                                                                    \
        static _Atomic(float *) lut_slot;                                                    \
        const float *lut = EWBK_##name == 1 ? ew_bw_lut(&lut_slot, n, ew_bwr_##name##_float, EW_BW(dt, TOF)) : NULL; \
        if (lut && o1) {                                                                     \
            EW_TEAM_FOR(n >= EW_BW_PAR_MIN, t, nt,                                           \
                _Alignas(64) float tg[EW_BW_TILE];                                           \
                const int64_t i0 = t * EW_BW_TILE;                                           \
                const int m = (int)(n - i0 < EW_BW_TILE ? n - i0 : EW_BW_TILE);              \
                EW_BW(dt, TOF)(g + i0, tg, m);                                               \
                EW_BW_SIMD                                                                   \
                for (int j = 0; j < m; j++)                                                  \
                    tg[j] = tg[j] * lut[a[i0 + j]];                                          \
                EW_BW(dt, FROMF)(tg, o1 + i0, m);                                            \
            );                                                                               \
            return 0;                                                                        \
        }                                                                                    \
        EW_TEAM_FOR(n >= EW_BW_PAR_MIN, t, nt,                                               \
            _Alignas(64) float tg[EW_BW_TILE], ta[EW_BW_TILE], tb[EW_BW_TILE];               \
            _Alignas(64) float t1[EW_BW_TILE], t2[EW_BW_TILE];                               \
            const int64_t i0 = t * EW_BW_TILE;                                               \
            const int m = (int)(n - i0 < EW_BW_TILE ? n - i0 : EW_BW_TILE);                  \
            EW_BW(dt, TOF)(g + i0, tg, m);                                                   \
            if ((inputs) >= 2)                                                               \
                EW_BW(dt, TOF)(a + i0, ta, m);                                               \
            if ((inputs) >= 3)                                                               \
                EW_BW(dt, TOF)(b + i0, tb, m);                                               \
            ew_bwr_##name##_float(tg, ta, tb, o1 ? t1 : NULL, o2 ? t2 : NULL, S0, S1, m);    \
            if (o1)                                                                          \
                EW_BW(dt, FROMF)(t1, o1 + i0, m);                                            \
            if ((outputs) >= 2 && o2)                                                        \
                EW_BW(dt, FROMF)(t2, o2 + i0, m);                                            \
        );                                                                                   \
        return 0;                                                                            \
    }

/* the per-op helpers are named by compute type: ew_bw_gelu_float, ew_bw_gelu_double */
#define EW_GRAD(name, args, inputs, outputs, scalars, def, acc)                              \
    EW_BW_RANGE(name, inputs, outputs, float)                                                \
    EW_BW_RANGE(name, inputs, outputs, double)                                               \
    EW_BW_LAUNCHER_DIRECT(name, inputs, outputs, f32)                                        \
    EW_BW_LAUNCHER_TILED(name, inputs, outputs, f16)                                         \
    EW_BW_LAUNCHER_TILED(name, inputs, outputs, bf16)                                        \
    EW_BW_LAUNCHER_DIRECT(name, inputs, outputs, f64)
#include "../grads.def"
#undef EW_GRAD

/* rmse_backward: grad_a = (a - b) s, s = grad / (n r) per batch (in the compute type), grad_b =
 * -grad_a; batch (o, j) of the [outer][n][inner] view. The scales first, one division per batch
 * (the same value the element loop used to form per element); then rows of contiguous elements
 * in pieces of EW_BW_TILE on the OpenMP team: batch-first (inner 1) a row is a batch with one
 * scale, otherwise a row is (o, i) and its elements take the scales of o's batches in turn.
 * float16/bfloat16 pieces go through float tiles (the block converters: the same bits as element
 * by element). Before 2026-11-26 one loop formed s per element and converted per element at the
 * baseline: float16 [256, 2048] 3.87 ms, 12x the forward's time (CPU_NOTES.md). */
#define EW_BW_RMSE_LAUNCHER(dt)                                                              \
    static int ew_cpu_rmse_backward_##dt(const void *argp)                                   \
    {                                                                                        \
        const ew_rmse_grad_args *p = (const ew_rmse_grad_args *)argp;                        \
        typedef EW_BW(dt, ST) st_t;                                                          \
        typedef EW_BW(dt, CT) ct_t; /* grad and r: float, or double for float64 */           \
        const st_t *a = (const st_t *)p->a, *b = (const st_t *)p->b;                         \
        const ct_t *g = (const ct_t *)p->grad, *r = (const ct_t *)p->r;                      \
        st_t *o1 = (st_t *)p->out, *o2 = (st_t *)p->out2;                                    \
        const int64_t outer = p->outer, n = p->n, inner = p->inner;                          \
        if (outer < 0 || n < 0 || inner < 0)                                                 \
            return EINVAL;                                                                   \
        if (outer == 0 || n == 0 || inner == 0) /* empty: NULL outs are fine */              \
            return 0;                                                                        \
        if (!o1 && !o2)                                                                      \
            return EINVAL;                                                                   \
        ct_t *sc = (ct_t *)malloc((size_t)(outer * inner) * sizeof(ct_t));                   \
        if (sc == NULL)                                                                      \
            return ENOMEM;                                                                   \
        for (int64_t q = 0; q < outer * inner; q++)                                          \
            sc[q] = g[q] / ((ct_t)n * r[q]);                                                 \
        const int64_t rows = inner == 1 ? outer : outer * n, len = inner == 1 ? n : inner;   \
        const int64_t per = (len + EW_BW_TILE - 1) / EW_BW_TILE; /* pieces a row */          \
        EW_TEAM_FOR(rows * len >= EW_BW_PAR_MIN, t, rows * per,                              \
            const int64_t row = t / per, j0 = (t % per) * EW_BW_TILE;                        \
            const int m = (int)(len - j0 < EW_BW_TILE ? len - j0 : EW_BW_TILE);              \
            const int64_t e0 = row * len + j0;                                               \
            /* the scales of this piece: one (inner 1), or inner's from j0 */                \
            const ct_t *s = inner == 1 ? sc + row : sc + (row / n) * inner + j0;             \
            const int64_t ds = inner == 1 ? 0 : 1;                                           \
            EW_BW_RMSE_PIECE(dt, EW_BW(dt, TILED))                                           \
        );                                                                                   \
        free(sc);                                                                            \
        return 0;                                                                            \
    }
#define EW_BW_RMSE_PIECE(dt, tiled) EW_BW_CAT(EW_BW_RMSE_PIECE_, tiled)(dt)
#define EW_BW_CAT(x, y) EW_BW_CAT_I(x, y)
#define EW_BW_CAT_I(x, y) x##y
/* float32/float64: straight from the arrays */
#define EW_BW_RMSE_PIECE_0(dt)                                                               \
    EW_BW_SIMD                                                                               \
    for (int k = 0; k < m; k++) {                                                            \
        const ct_t d = (a[e0 + k] - b[e0 + k]) * s[k * ds];                                  \
        if (o1)                                                                              \
            o1[e0 + k] = d;                                                                  \
        if (o2)                                                                              \
            o2[e0 + k] = -d;                                                                 \
    }
/* float16/bfloat16: float tiles in and out */
#define EW_BW_RMSE_PIECE_1(dt)                                                               \
    _Alignas(64) float ta[EW_BW_TILE], tb[EW_BW_TILE];                                       \
    EW_BW(dt, TOF)(a + e0, ta, m);                                                           \
    EW_BW(dt, TOF)(b + e0, tb, m);                                                           \
    EW_BW_SIMD                                                                               \
    for (int k = 0; k < m; k++) {                                                            \
        const float d = (ta[k] - tb[k]) * s[k * ds];                                         \
        ta[k] = d;                                                                           \
        tb[k] = -d;                                                                          \
    }                                                                                        \
    if (o1)                                                                                  \
        EW_BW(dt, FROMF)(ta, o1 + e0, m);                                                    \
    if (o2)                                                                                  \
        EW_BW(dt, FROMF)(tb, o2 + e0, m);
EW_BW_RMSE_LAUNCHER(f32)
EW_BW_RMSE_LAUNCHER(f16)
EW_BW_RMSE_LAUNCHER(bf16)
EW_BW_RMSE_LAUNCHER(f64)

#define EW_BW_ABOUT "one loop reading each array once and writing each gradient once (OpenMP from 2^14 elements)"
#define EW_BW_ROW(name, dt) {#name, "auto", EW_BW(dt, ENUM), ew_cpu_##name##_##dt, NULL, 0, EW_BW_ABOUT},

static const ew_kernel ew_cpu_backward_rows[] = {
#define EW_GRAD(name, args, inputs, outputs, scalars, def, acc)                              \
    EW_BW_ROW(name, f32) EW_BW_ROW(name, f16) EW_BW_ROW(name, bf16) EW_BW_ROW(name, f64)
#include "../grads.def"
#undef EW_GRAD
#define EW_BW_RMSE_ROW(dt) {"rmse_backward", "auto", EW_BW(dt, ENUM), ew_cpu_rmse_backward_##dt, NULL, 0, \
    "one pass over a and b, the per-batch scale grad / (n r) formed once per element"},
    EW_BW_RMSE_ROW(f32) EW_BW_RMSE_ROW(f16) EW_BW_RMSE_ROW(bf16) EW_BW_RMSE_ROW(f64)
};

const ew_kernel *ew_cpu_backward_table(int *count)
{
    *count = (int)(sizeof ew_cpu_backward_rows / sizeof ew_cpu_backward_rows[0]);
    return ew_cpu_backward_rows;
}
