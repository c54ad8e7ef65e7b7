/*
 * cpu_math.h: which vector math library the CPU kernels call, for the kernels and for
 * ewkern.build_info(); which ISA form of a loop runs (the dispatch below); the 16-bit block
 * converters that elementwise.c defines and backward.c shares.
 *
 *     const char *ew_cpu_math_library(void)
 *         "glibc libmvec, <ISA> variants" when the build links libmvec (setup.py defines
 *         EW_CPU_LIBMVEC=1 where it finds it), with the ISA whose variants this CPU runs
 *         (AVX-512, AVX2 or SSE4, picked at run time); "scalar libm (...)" otherwise.
 *
 * With EW_CPU_LIBMVEC, the declarations below tell gcc that glibc's libmvec has vector versions
 * of these functions (the x86_64 vector function ABI: _ZGVbN4v_expf for SSE, _ZGVdN8v_expf for
 * AVX2, _ZGVeN16v_expf for AVX-512, ...), so an `omp simd` loop that calls expf calls the
 * vector version of the ISA the loop is compiled for. glibc's own <math.h> declares them only
 * under -ffast-math, which ewkern does not use (it would change NaN, inf and -0.0 handling in
 * every op). The functions are the same ones; only these declarations are added.
 * libmvec's accuracy: glibc documents at most 4 ulp for its vector functions; the bounds of the
 * ops that use them are in CPU_NOTES.md and asserted by tests/test_cpu_math.py.
 */
#ifndef EWKERN_CPU_MATH_H
#define EWKERN_CPU_MATH_H

#include <float.h>
#include <math.h>
#include <stdint.h>

#include "erfc_fit.h"   /* EW_ERFC_FIT_Q_F32 */
#include "half.h"       /* ew_float_bits, ew_bits_float */

const char *ew_cpu_math_library(void);

/* ISA dispatch (elementwise.c's math ops and 16-bit converters, backward.c's loops): a loop
 * compiled three times, for AVX-512 (F, DQ, VL, BW), AVX2 + FMA and the build's baseline, and
 * picked at each call (__builtin_cpu_supports reads a table libgcc fills before constructors
 * run). EWKERN_CPU_ISA=avx2 or =baseline in the environment (read once, ew_cpu_isa_cap) caps the
 * pick, so that one machine can run and test every form; the run-time kernels read the same
 * variable. Build with -DEW_CPU_NO_DISPATCH for the baseline alone (and the portable 16-bit
 * converters). */
int ew_cpu_isa_cap(void);   /* 2: any, 1: up to AVX2 (+ FMA, F16C), 0: the baseline */
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) \
    && !defined(EW_CPU_NO_DISPATCH)
#define EW_X86_DISPATCH 1
#define EW_ISA_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")))
#define EW_ISA_AVX2 __attribute__((target("avx2,fma")))
#define EW_HAVE_AVX512() (ew_cpu_isa_cap() >= 2 && __builtin_cpu_supports("avx512f")                 \
                          && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") \
                          && __builtin_cpu_supports("avx512bw"))
#define EW_HAVE_AVX2_FMA() (ew_cpu_isa_cap() >= 1 && __builtin_cpu_supports("avx2") \
                            && __builtin_cpu_supports("fma"))
#else
#define EW_X86_DISPATCH 0
#define EW_HAVE_AVX512() 0
#define EW_HAVE_AVX2_FMA() 0
#endif

/* A loop in every ISA form, and the call of the form this CPU runs: EW_ISA_FORMS(VARIANT, x...)
 * expands VARIANT(x..., sfx, attr) for each form (sfx base, avx2, avx512; attr the target
 * attribute), which defines fn_<sfx>; EW_ISA_CALL(fn, args...) calls the widest fn_<sfx> this CPU
 * has under the EWKERN_CPU_ISA cap. */
#if EW_X86_DISPATCH
#define EW_ISA_FORMS(VARIANT, ...) \
    VARIANT(__VA_ARGS__, base, ) VARIANT(__VA_ARGS__, avx2, EW_ISA_AVX2) VARIANT(__VA_ARGS__, avx512, EW_ISA_AVX512)
#define EW_ISA_CALL(fn, ...)            \
    do {                                \
        if (EW_HAVE_AVX512())           \
            fn##_avx512(__VA_ARGS__);   \
        else if (EW_HAVE_AVX2_FMA())    \
            fn##_avx2(__VA_ARGS__);     \
        else                            \
            fn##_base(__VA_ARGS__);     \
    } while (0)
#else
#define EW_ISA_FORMS(VARIANT, ...) VARIANT(__VA_ARGS__, base, )
#define EW_ISA_CALL(fn, ...) fn##_base(__VA_ARGS__)
#endif

/* float16/bfloat16 <-> float over a block of m elements, the widest form this CPU has (F16C,
 * AVX-512 or AVX2 compiled, portable C): the same bits in every form (elementwise.c). */
void ew_f16_to_f32_block(const uint16_t *src, float *dst, int m);
void ew_f32_to_f16_block(const float *src, uint16_t *dst, int m);
void ew_bf16_to_f32_block(const uint16_t *src, float *dst, int m);
void ew_f32_to_bf16_block(const float *src, uint16_t *dst, int m);

#if defined(EW_CPU_LIBMVEC) && EW_CPU_LIBMVEC
#if !defined(__x86_64__) || !defined(__GNUC__) || !defined(_OPENMP)
#error "EW_CPU_LIBMVEC needs gcc (or clang) with -fopenmp on x86_64"
#endif
#define EW_DECLARE_VECTOR_MATH(fn)                                                           \
    _Pragma("omp declare simd notinbranch") float fn##f(float);                              \
    _Pragma("omp declare simd notinbranch") double fn(double);
EW_DECLARE_VECTOR_MATH(exp)
EW_DECLARE_VECTOR_MATH(log)
EW_DECLARE_VECTOR_MATH(erf)
EW_DECLARE_VECTOR_MATH(erfc)
EW_DECLARE_VECTOR_MATH(tanh)
#undef EW_DECLARE_VECTOR_MATH
#endif

/* Saturated lanes (elementwise.c's math ops and backward.c's loops; elementwise.c, "saturated
 * lanes", says how they are used): float forms of expf, erfcf and logf that give a lane whose
 * result saturates its value without calling the function on it (the argument masked by bits), and
 * the chunk and sample sizes of the scan that picks them. */
#define EW_SAT_CHUNK ((int64_t)4096)
#define EW_SAT_RUN ((int64_t)64)   /* the scan reads 4 runs of 64 a chunk (elementwise.c) */
#ifdef _OPENMP
#define EW_SIMD_MINMAX(lo, hi) _Pragma(EW_STR(omp simd reduction(min:lo) reduction(max:hi)))
#else
#define EW_SIMD_MINMAX(lo, hi)
#endif
#define EW_STR(x) #x
/* lo, hi (declared here, of type T): the least and greatest of the scan's sample of p[0, n) (4
 * runs of EW_SAT_RUN spread over a chunk of EW_SAT_CHUNK; NaNs aside) */
#define EW_SAT_SAMPLE(T, p, n, lo, hi)                                                       \
    T lo = (p)[0], hi = (p)[0];                                                              \
    for (int64_t s0_ = 0; s0_ < (n); s0_ += EW_SAT_CHUNK / 4) {                              \
        const int64_t se_ = (n) - s0_ < EW_SAT_RUN ? (n) : s0_ + EW_SAT_RUN;                 \
        EW_SIMD_MINMAX(lo, hi)                                                               \
        for (int64_t i_ = s0_; i_ < se_; i_++) {                                             \
            lo = (p)[i_] < lo ? (p)[i_] : lo;                                                \
            hi = (p)[i_] > hi ? (p)[i_] : hi;                                                \
        }                                                                                    \
    }
static inline float ew_keep_float(float x, int keep)
{
    return ew_bits_float(ew_float_bits(x) & (0u - (uint32_t)keep));
}
static inline float ew_exp_sat_float(float x)
{
    const int hi = x > 89.0f, lo = x < -104.0f;
    const float r = expf(ew_keep_float(x, !(hi | lo)));
    return hi ? INFINITY : lo ? 0.0f : r;
}
static inline float ew_erfc_sat_float(float x)
{
    const int hi = x > 10.25f;
    const float r = erfcf(ew_keep_float(x, !hi));
    return hi ? 0.0f : r;
}
static inline float ew_log_sat_float(float x)
{
    const int ok = x > 0.0f && x <= FLT_MAX;
    const uint32_t m = 0u - (uint32_t)ok;   /* x where ok, else 1.0f, by bits (as ew_keep_float) */
    const float r = logf(ew_bits_float((ew_float_bits(x) & m) | (0x3f800000u & ~m)));
    return ok ? r : x == 0.0f ? -INFINITY : x == INFINITY ? x : (x - x) / (x - x);
}
/* sigmoid(a) from e = e^-|a| by EXP, as elementwise.c's ew_sigmoid_float: 1 / (1 + e) for a >= 0,
 * e / (1 + e) below (both arms before the ?:, so the loop stays branch-free) */
#define EW_DEFINE_SIGMOID_FLOAT(name, EXP)                                                   \
    static inline float name(float a)                                                        \
    {                                                                                        \
        const float e = EXP(-fabsf(a));                                                      \
        const float r = 1.0f / (1.0f + e), er = e * r;                                       \
        return a >= 0 ? r : er;                                                              \
    }
EW_DEFINE_SIGMOID_FLOAT(ew_sigmoid_sat_float, ew_exp_sat_float)

/* float gelu and its derivative without a libm call (the AVX2 and AVX-512 forms of elementwise.c's
 * gelu and backward.c's gelu_backward; the baseline form, without FMA, keeps libmvec's erfcf and
 * expf): the CUDA kernels' fit of erfc (csrc/cuda/elementwise_ops.cuh, erfc_fit_f32;
 * scripts/gelu_fit.py), for z = |a| / sqrt 2 clamped to 16,
 *     erfc(z) = t 2^(-a^2 log2(e) / 2 + s Q(s)),   t = 1 / (1 + z / 2),   s = 1 - t = z t / 2,
 * and 2^w by a degree-6 polynomial on w's fraction (1.9e-9 relative) with the exponent put in the
 * bits, raised by 64 (taken back in the last product) so that results down to the subnormals round
 * once. Two choices keep the error inside the stated bounds (4 ulp, plus 2 a^2 for a < 0, checked
 * on every float with |a| <= 40 against float64: worst 0.92 of the bound for gelu): s as z t / 2,
 * not 1 - t (t's rounding near 1 moved s, and so the z the fit saw, by 2^-24 absolute: 5.4 ulp
 * near a = 0), and a^2 in the exponent from a itself, not from the rounded z (2 a^2 ulp for a << 0
 * where the bound allows 2 a^2). CI host (AMD EPYC, AVX-512), 2^18 float32 on one thread: 126 us
 * against 200 for libmvec's erfcf. */
static inline float ew_exp2_p64_float(float w)   /* 2^(w + 64); 0 where w < -190 */
{
    const int lo = w < -190.0f;
    const float wc = lo ? -190.0f : w;
    const float r = wc + 0x1.8p23f;                /* w rounded to an integer n in r's low bits */
    const float f = wc - (r - 0x1.8p23f);          /* in [-0.5, 0.5] */
    float p = 0.00015345802f;
    p = fmaf(p, f, 0.0013399931f);
    p = fmaf(p, f, 0.009618489f);
    p = fmaf(p, f, 0.055503286f);
    p = fmaf(p, f, 0.24022646f);
    p = fmaf(p, f, 0.6931472f);
    p = fmaf(p, f, 1.0f);
    const float sc = ew_bits_float((ew_float_bits(r) - 0x4B400000u + 191u) << 23);   /* 2^(n + 64) */
    return lo ? 0.0f : p * sc;
}
/* e^x for x <= 0 without a libm call (the AVX2 and AVX-512 forms of float sigmoid and silu and of
 * silu's gradient): x = n ln 2 + r with n = round(x / ln 2) and r by two FMAs with ln 2 split in a
 * 16-bit head and a tail (n ln2_hi exact for |n| < 2^8), |r| <= ln 2 / 2; e^r by Cephes' degree-7
 * polynomial (1 + r + r^2 P(r), P of degree 5), then 2^(n + 64) put in the bits and 2^-64 taken back
 * in the last product, so that results down to the subnormals round once; 0 below -104 (e^x rounds
 * to 0 below -103.97), a NaN stays NaN. libmvec's expf kept these loops' math from overlapping
 * their loads: with the inputs from memory a step took the loads' time plus the math's, where tanh
 * and gelu's fit (no call) took about the larger (CPU_NOTES.md). */
static inline float ew_exp_neg_fit_float(float x)
{
    const int lo = x < -104.0f;
    const float xc = lo ? -104.0f : x;
    const float nr = fmaf(xc, 1.44269504088896341f, 0x1.8p23f);   /* round(x / ln 2) in nr's low bits */
    const float n = nr - 0x1.8p23f;
    float r = fmaf(n, -0.693145751953125f, xc);
    r = fmaf(n, -1.428606765330187045e-06f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r + 1.0f);
    const float sc = ew_bits_float((ew_float_bits(nr) - 0x4B400000u + 191u) << 23);   /* 2^(n + 64) */
    return lo ? 0.0f : (p * sc) * 0x1p-64f;
}
/* sigmoid with e^-|a| by the fit above */
EW_DEFINE_SIGMOID_FLOAT(ew_sigmoid_fit_float, ew_exp_neg_fit_float)
/* the fit's t, s and Q(s) for z = |a| / sqrt 2 (clamped to 16: a NaN gives 16, its NaN comes back
 * through a in the results) */
static inline float ew_erfc_fit_q_float(float a, float *t_out, float *s_out)
{
    const float z0 = fabsf(a) * 0.707106781186547524f;
    const float z = z0 < 16.0f ? z0 : 16.0f;
    const float t = 1.0f / fmaf(z, 0.5f, 1.0f);
    const float s = 0.5f * z * t;
    float q;
    EW_ERFC_FIT_Q_F32(q, s);   /* erfc_fit.h, shared with the CUDA kernels */
    *t_out = t;
    *s_out = s;
    return q;
}
/* gelu(a) = a erfc(-a / sqrt 2) / 2: a < 0 takes m = erfc(|a| / sqrt 2) 2^64, a >= 0 its complement */
static inline float ew_gelu_fit_float(float a)
{
    float t, s;
    const float q = ew_erfc_fit_q_float(a, &t, &s);
    const float m = t * ew_exp2_p64_float(fmaf(a * a, -0.721347520444481703f, s * q));
    return a < 0.0f ? (a * m) * 0x1p-65f : a * fmaf(m, -0x1p-65f, 1.0f);
}
/* gelu'(a) = Phi(a) + a phi(a), with e = e^(-a^2 / 2) 2^64 kept apart (phi shares it), as the CUDA
 * Grad_gelu_f32: a < 0: e 2^-64 (h + a / sqrt(2 pi)); a >= 0: 1 + e 2^-64 (a / sqrt(2 pi) - h),
 * h = t 2^(s Q(s)) / 2 = Phi(-|a|) / e^(-a^2 / 2) */
static inline float ew_gelu_grad_fit_float(float a)
{
    float t, s;
    const float q = ew_erfc_fit_q_float(a, &t, &s);
    const float e = ew_exp2_p64_float(a * a * -0.721347520444481703f);
    const float h = (t * ew_exp2_p64_float(s * q)) * 0x1p-65f;
    const float u = fmaf(a, 0.398942280401432678f, a < 0.0f ? h : -h);
    return a < 0.0f ? (u * e) * 0x1p-64f : fmaf(u, e * 0x1p-64f, 1.0f);
}
#endif /* EWKERN_CPU_MATH_H */
