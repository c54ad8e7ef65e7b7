/*
 * elementwise.c: the CPU elementwise kernels, one "auto" variant per (op, dtype).
 *
 * Versions (variant names as the registry lists them):
 *   auto  float32/float64: one compiler-vectorised loop (#pragma omp simd) per (op, dtype), compiled
 *         per ISA (AVX-512, AVX2 + FMA, the baseline; the widest this CPU has runs);
 *         float16/bfloat16: the arithmetic ops in one pass, widened to float in registers
 *         (AVX-512 or AVX2, chosen at run time), the math ops by a table of all 65536 results,
 *         abs/neg/relu on the bits; otherwise (the baseline ISA) tiles of EW_TILE elements
 *         converted to float in a stack buffer; always computed in float, rounded once on the way
 *         back. copy moves bits; fill stores one precomputed value. Runs on the OpenMP team from
 *         EW_PAR_MIN_* elements, on the calling thread below that.
 *
 * The launchers are generated: ops.def lists the ops (EW_OP X-macro); below, EWF_<op> gives
 * each op's arithmetic once for any compute type T, EWK_<op> its kind, and the EW_DT_* traits
 * say how a dtype is stored, converted and computed. Timing: ewkern's bench package, device
 * "cpu"; csrc/cpu/CPU_NOTES.md has single-thread figures.
 *
 * Numerical choices (all within the semantics of ops.def):
 *   copy             bit copy (a signalling NaN stays signalling), for every dtype.
 *   maximum/minimum  NaN if either side is NaN; otherwise NumPy's scalar rule
 *                    (a >= b ? a : b), so maximum(-0.0, 0.0) is -0.0.
 *   relu             NumPy's maximum(a, 0): NaN stays NaN, -0.0 stays -0.0.
 *   sigmoid          e = exp(-|a|), r = 1 / (1 + e), a >= 0 ? r : e * r. Equal to
 *                    1 / (1 + e^-a) but keeps full relative accuracy for large negative a
 *                    (where exp(-a) overflows and the literal formula flushes to 0).
 *   silu             a * sigmoid(a), with the sigmoid above (same reason).
 *   gelu             a / 2 * erfc(-a / sqrt(2)). Equal to a / 2 * (1 + erf(a / sqrt(2))) but
 *                    without the cancellation of 1 + erf for a below about -3, which in float
 *                    leaves no correct digit by a = -6. For a << 0 gelu's condition number is
 *                    about a^2, so rounding a / sqrt(2) costs up to ~a^2 / 2 ulp there.
 *   fill             float16/bfloat16 convert the double scalar to the dtype with one rounding
 *                    (round to odd into float, then to nearest even), so no double rounding.
 *   add_const, mul_const, axpby  scalars are first converted to the compute type
 *                    ((float) for float32/float16/bfloat16, double for float64), as ops.def says.
 *   sqrt, rsqrt      vectorise only when built with -fno-math-errno (errno is never read here).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../ewkern_kernels.h"
#include "cpu_math.h"
#include "half.h"
#include "half_simd.h"
#include "team.h"

/* EW_X86_DISPATCH (cpu_math.h): the per-ISA forms below; -DEW_CPU_NO_DISPATCH builds the
 * baseline and the portable float16/bfloat16 converters only. */
#if EW_X86_DISPATCH
#include <immintrin.h>
#endif

/* ---- loop shapes ------------------------------------------------------------------------- */

/* Elements per float16/bfloat16 tile: two float buffers of 4 KiB stay in L1. */
#define EW_TILE 1024

/* Below these element counts a launch runs on the calling thread only: waking the OpenMP team
 * costs microseconds, which a cheap op on 2^15 elements (128 KiB per float32 array) about
 * matches. Transcendental ops are roughly 10x dearer per element, so they thread sooner. */
#define EW_PAR_MIN_CHEAP ((int64_t)1 << 15)
#define EW_PAR_MIN_HEAVY ((int64_t)1 << 12)
#define EW_PAR_MIN_VEC ((int64_t)1 << 14)

/* The most elements of a block that a block function takes at once (EW_BLOCKS). */
#define EW_VBLOCK ((int64_t)1 << 13)

#ifdef _OPENMP
#define EW_SIMD _Pragma("omp simd")
#define EW_PARALLEL_SIMD _Pragma("omp parallel for simd schedule(static)")
#define EW_PARALLEL _Pragma("omp parallel for schedule(static)")
#elif defined(__GNUC__)
#define EW_SIMD _Pragma("GCC ivdep")
#define EW_PARALLEL_SIMD _Pragma("GCC ivdep")
#define EW_PARALLEL
#else
#define EW_SIMD
#define EW_PARALLEL_SIMD
#define EW_PARALLEL
#endif

/* for (i = 0; i < n; i++) body, vectorised, on the OpenMP team when n >= par_min. omp simd
 * tells the compiler there is no dependence between iterations, which holds for out == in[k]
 * exactly (each iteration reads its element before writing it) and needs no alias check. */
#define EW_FOR(i, n, par_min, ...)                                                           \
    do {                                                                                     \
        if ((n) < (par_min)) {                                                               \
            EW_SIMD                                                                          \
            for (int64_t i = 0; i < (n); i++) { __VA_ARGS__; }                               \
        } else {                                                                             \
            EW_PARALLEL_SIMD                                                                 \
            for (int64_t i = 0; i < (n); i++) { __VA_ARGS__; }                               \
        }                                                                                    \
    } while (0)

/* call(i0, m) on blocks [i0, i0 + m) covering [0, n): on the OpenMP team when n >= par_min, each
 * thread a contiguous run of blocks (a static schedule) of at most EW_VBLOCK elements, the same
 * number of blocks a thread (ew_block_size); else as one block on the calling thread. For the
 * block functions compiled once per ISA (the math ops, the float32/float64 arithmetic, fill). */
static int64_t ew_block_size(int64_t n)
{
#ifdef _OPENMP
    const int64_t nth = omp_get_max_threads();
#else
    const int64_t nth = 1;
#endif
    const int64_t per = (n + nth - 1) / nth;              /* elements a thread */
    const int64_t k = (per + EW_VBLOCK - 1) / EW_VBLOCK;  /* blocks a thread */
    const int64_t bs = ((per + k - 1) / k + 63) & ~(int64_t)63;
    return bs < EW_VBLOCK ? bs : EW_VBLOCK;
}
#define EW_BLOCKS(n, par_min, i0, m, ...)                                                    \
    do {                                                                                     \
        if ((n) < (par_min)) {                                                               \
            const int64_t i0 = 0, m = (n);                                                   \
            __VA_ARGS__;                                                                     \
        } else {                                                                             \
            const int64_t bs_ = ew_block_size(n);                                            \
            const int64_t nblocks_ = ((n) + bs_ - 1) / bs_;                                  \
            EW_PARALLEL                                                                      \
            for (int64_t t_ = 0; t_ < nblocks_; t_++) {                                      \
                const int64_t i0 = t_ * bs_;                                                 \
                const int64_t m = (n) - i0 < bs_ ? (n) - i0 : bs_;                           \
                __VA_ARGS__;                                                                 \
            }                                                                                \
        }                                                                                    \
    } while (0)

/* copy: the C library's memcpy (the widest moves the CPU has, non-temporal stores for large
 * blocks), in pieces on the OpenMP team when parallel: at most 1 MiB, and at least one piece a
 * thread where that leaves 64 KiB a piece. An element loop compiled for the baseline ISA copied
 * float32 at half NumPy's speed on one thread (8 MiB: 583 against 287 us). With pieces of 1 MiB
 * alone, 1 MiB went to one thread: 19 us against torch's 9.3 on two (CI host, in cache). */
#define EW_COPY_PIECE ((int64_t)1 << 20)
#define EW_COPY_MIN_PIECE ((int64_t)1 << 16)
static void ew_copy_bytes(void *dst, const void *src, int64_t nbytes, int parallel)
{
#ifdef _OPENMP
    const int64_t nthreads = omp_get_max_threads();
#else
    const int64_t nthreads = 1;
#endif
    int64_t piece = (nbytes + nthreads - 1) / nthreads;
    piece = (piece + 4095) & ~(int64_t)4095;   /* whole pages */
    piece = piece > EW_COPY_PIECE ? EW_COPY_PIECE : piece < EW_COPY_MIN_PIECE ? EW_COPY_MIN_PIECE : piece;
    if (!parallel || nbytes <= piece) {
        memcpy(dst, src, (size_t)nbytes);
        return;
    }
    const int64_t npieces = (nbytes + piece - 1) / piece;
    EW_PARALLEL
    for (int64_t k = 0; k < npieces; k++) {
        const int64_t off = k * piece;
        const int64_t len = nbytes - off < piece ? nbytes - off : piece;
        memcpy((char *)dst + off, (const char *)src + off, (size_t)len);
    }
}

/* ---- compute-type helpers ---------------------------------------------------------------- */

/* libm names for float (suffix f) and for double. */
#define EW_M_float(fn) fn##f
#define EW_M_double(fn) fn
#define EW_M(T, fn) EW_M_I(T, fn)
#define EW_M_I(T, fn) EW_M_##T(fn)
#define EW_CAT(x, y) EW_CAT_I(x, y)
#define EW_CAT_I(x, y) x##y

#define EW_SQRT1_2 0.707106781186547524400844362104849039

#define EW_DEFINE_SIGMOID(T)                                                                 \
    static inline T ew_sigmoid_##T(T a)                                                      \
    {                                                                                        \
        const T e = EW_M(T, exp)(-EW_M(T, fabs)(a));                                         \
        const T r = (T)1 / ((T)1 + e), er = e * r; /* both arms before the ?: (backward.c) */ \
        return a >= 0 ? r : er;                                                              \
    }
EW_DEFINE_SIGMOID(float)
EW_DEFINE_SIGMOID(double)

/* relu as a bit mask rather than a ?: (which gcc turns into a branch it then will not
 * if-convert when the loop also converts to float16; see half.h). isless is the quiet
 * comparison: false for NaN, so NaN passes through, and -0.0 stays -0.0. */
static inline float ew_relu_float(float a)
{
    const uint32_t keep = 0u - (uint32_t)!isless(a, 0.0f);
    return ew_bits_float(ew_float_bits(a) & keep);
}

/* double: the mask's bool -> 64-bit conversion kept gcc 12 from vectorizing the loop (a scalar
 * ucomisd/setbe/and per element: relu float64 at 0.85 of NumPy, 4 MiB); float64 never goes
 * through float16 tiles, so the plain select vectorizes (cmpltpd + andnpd), with the same results. */
static inline double ew_relu_double(double a)
{
    return isless(a, 0.0) ? 0.0 : a;
}

/* Round a double to float, rounding to odd: correct when the float is then rounded (to
 * nearest even) to float16 or bfloat16, which have at least two bits fewer. */
static float ew_double_to_float_odd(double d)
{
    float f = (float)d;
    if ((double)f != d && !isnan(d)) {
        uint32_t u = ew_float_bits(f);
        if (fabs((double)f) > fabs(d))
            u -= 1;                                /* truncate toward zero (f != 0 here) */
        f = ew_bits_float(u | 1u);
    }
    return f;
}

/* ---- per-op arithmetic --------------------------------------------------------------------
 * T is the compute type; A and B are the loaded inputs, C0 and C1 the scalars (c, alpha/beta,
 * value), all of type T. One line per row of ops.def. copy and fill do not use theirs (their
 * kind below sends them to a bit copy and a store of one precomputed value). */
#define EWF_copy(T)      (A)
#define EWF_fill(T)      (C0)
#define EWF_add(T)       (A + B)
#define EWF_sub(T)       (A - B)
#define EWF_mul(T)       (A * B)
#define EWF_div(T)       (A / B)
#define EWF_maximum(T)   ((A >= B || A != A) ? A : B)
#define EWF_minimum(T)   ((A <= B || A != A) ? A : B)
#define EWF_add_const(T) (A + C0)
#define EWF_mul_const(T) (A * C0)
#define EWF_axpby(T)     (C0 * A + C1 * B)
#define EWF_neg(T)       (-A)
#define EWF_abs(T)       (EW_M(T, fabs)(A))
#define EWF_exp(T)       (EW_M(T, exp)(A))
#define EWF_log(T)       (EW_M(T, log)(A))
#define EWF_sqrt(T)      (EW_M(T, sqrt)(A))
#define EWF_rsqrt(T)     ((T)1 / EW_M(T, sqrt)(A))
#define EWF_erf(T)       (EW_M(T, erf)(A))
#define EWF_tanh(T)      (EW_M(T, tanh)(A))
#define EWF_sigmoid(T)   (EW_CAT(ew_sigmoid_, T)(A))
#define EWF_relu(T)      (EW_CAT(ew_relu_, T)(A))
#define EWF_gelu(T)      ((T)0.5 * A * EW_M(T, erfc)(-A * (T)EW_SQRT1_2))
#define EWF_silu(T)      (A * EW_CAT(ew_sigmoid_, T)(A))

/* Kinds: COPY and FILL have their own loops; MATH ops call a math function per element and run
 * as block functions compiled once per ISA (below), so they use the vector math library
 * (libmvec) at the widest vectors the CPU has; without libmvec they call scalar libm and go
 * parallel sooner (EW_PAR_MIN_HEAVY). sqrt and rsqrt are MATH too, for the wider vectors.
 * ABS and NEG are arithmetic, except that on float16/bfloat16 they work on the sign bit alone, as
 * NumPy's do (exact, NaN payloads kept; a trip through float tiles ran at half NumPy's speed).
 * RELU likewise: on float16/bfloat16 a negative number below -0 (not a NaN) becomes +0, every other
 * value keeps its bits, as maximum(a, 0) in float and rounded back gives them; float32/float64
 * compute it as ARITH does. */
enum { EW_KIND_COPY, EW_KIND_FILL, EW_KIND_ARITH, EW_KIND_MATH, EW_KIND_ABS, EW_KIND_NEG, EW_KIND_RELU };
#define EWK_copy      EW_KIND_COPY
#define EWK_fill      EW_KIND_FILL
#define EWK_add       EW_KIND_ARITH
#define EWK_sub       EW_KIND_ARITH
#define EWK_mul       EW_KIND_ARITH
#define EWK_div       EW_KIND_ARITH
#define EWK_maximum   EW_KIND_ARITH
#define EWK_minimum   EW_KIND_ARITH
#define EWK_add_const EW_KIND_ARITH
#define EWK_mul_const EW_KIND_ARITH
#define EWK_axpby     EW_KIND_ARITH
#define EWK_neg       EW_KIND_NEG
#define EWK_abs       EW_KIND_ABS
#define EWK_exp       EW_KIND_MATH
#define EWK_log       EW_KIND_MATH
#define EWK_sqrt      EW_KIND_MATH
#define EWK_rsqrt     EW_KIND_MATH
#define EWK_erf       EW_KIND_MATH
#define EWK_tanh      EW_KIND_MATH
#define EWK_sigmoid   EW_KIND_MATH
#define EWK_relu      EW_KIND_RELU
#define EWK_gelu      EW_KIND_MATH
#define EWK_silu      EW_KIND_MATH

#if EW_CPU_LIBMVEC
#define EW_PAR_MIN(kind) ((kind) == EW_KIND_MATH ? EW_PAR_MIN_VEC : EW_PAR_MIN_CHEAP)
#else
#define EW_PAR_MIN(kind) ((kind) == EW_KIND_MATH ? EW_PAR_MIN_HEAVY : EW_PAR_MIN_CHEAP)
#endif

/* ---- saturated lanes ---------------------------------------------------------------------
 * libmvec's vector functions hand every lane outside their main range to the scalar libm
 * function, one lane at a time; where many lanes saturate an op ran 10-45x slower (CI host,
 * 2^18 float32: exp of N(0, 300^2) 1366 us against 30, gelu of N(0, 30^2) 1434 against 107, log
 * with half its inputs negative 746 against 29; CPU_NOTES.md, "Saturated lanes"). A float32 math
 * block is taken in chunks of EW_SAT_CHUNK: a chunk whose sample has a lane whose result
 * saturates (EWS_<op>, from the least and greatest of 4 runs of EW_SAT_RUN inputs spread over the
 * chunk: a scan of the whole chunk cost exp and log 16-18% on ordinary inputs, the sample about
 * 1/16 of that) runs the op's saturated form
 * (EWFS_<op>: cpu_math.h's ew_*_sat_float), which gives such lanes a harmless argument (0; log
 * 1) by a bit mask (gcc turns `f(s ? 0 : x)` back into a call on x) and selects libm's value for
 * them afterwards: exp's inf and 0, erfc's 0,
 * log's -inf, inf and (x - x) / (x - x) (libm's own NaN for x < 0, the quieted payload of a NaN).
 * The same bits as before in every lane; a chunk without such a lane runs the op as before. The
 * bounds lie past the last finite or nonzero result (expf: 88.72 and -103.97; erfcf: 10.06), so
 * lanes with subnormal results still take the function's own path. float64 keeps the plain form
 * (its bool-to-64-bit masks kept gcc 12 from vectorising relu's loop: see ew_relu_double). */
/* which (op, compute type) pairs scan; the lanes each one's saturated form changes */
#define EWSAT_exp_float 1
#define EWSAT_log_float 1
#define EWSAT_sigmoid_float 2
#define EWSAT_silu_float 2
#define EWSAT_gelu_float 2   /* 2: the FMA forms compute by the fit (EWFF_), the baseline as 1 */
#define EWSAT_exp_double 0
#define EWSAT_log_double 0
#define EWSAT_sigmoid_double 0
#define EWSAT_silu_double 0
#define EWSAT_gelu_double 0
#define EWSAT_sqrt_float 0
#define EWSAT_sqrt_double 0
#define EWSAT_rsqrt_float 0
#define EWSAT_rsqrt_double 0
#define EWSAT_erf_float 0
#define EWSAT_erf_double 0
#define EWSAT_tanh_float 0
#define EWSAT_tanh_double 0
/* from a chunk's least and greatest input (its NaNs aside: they take the function's own path),
 * and the saturated forms (float: only float pairs scan) */
#define EWS_exp(lo, hi)     (hi > 89.0f || lo < -104.0f)
#define EWS_log(lo, hi)     (lo <= 0.0f || hi > FLT_MAX)
#define EWS_sigmoid(lo, hi) (hi > 104.0f || lo < -104.0f)
#define EWS_silu(lo, hi)    EWS_sigmoid(lo, hi)
#define EWS_gelu(lo, hi)    (-lo * (float)EW_SQRT1_2 > 10.25f)
#define EWFS_exp     ew_exp_sat_float(A)
#define EWFS_log     ew_log_sat_float(A)
#define EWFS_sigmoid ew_sigmoid_sat_float(A)
#define EWFS_silu    (A * ew_sigmoid_sat_float(A))
#define EWFS_gelu    (0.5f * A * ew_erfc_sat_float(-A * (float)EW_SQRT1_2))
/* the forms without a libm call that the AVX2 and AVX-512 forms run (EWSAT_<op>_<T> 2; cpu_math.h) */
#define EWFF_gelu    ew_gelu_fit_float(A)
#define EWFF_sigmoid ew_sigmoid_fit_float(A)
#define EWFF_silu    (A * ew_sigmoid_fit_float(A))

/* ---- math ops: block functions, one per ISA ---------------------------------------------
 * ew_math_<op>_<T>(a, out, m) computes out[i] = op(a[i]) for i < m (out == a allowed) with the
 * widest vector ISA this CPU has: AVX-512 (F, DQ, VL, BW), AVX2 + FMA, or the build's baseline
 * (SSE2 on plain x86-64), chosen at each call (__builtin_cpu_supports reads a table). Each
 * variant is the same omp simd loop compiled for its ISA; with libmvec (cpu_math.h) the math
 * calls in it become calls of libmvec's vector functions of that ISA (16 floats per call with
 * AVX-512), otherwise they stay scalar libm calls. The arithmetic around the calls is the same
 * in every variant (-std=c11 keeps fp-contract off: no FMA is formed from a * b + c), so
 * variants differ only where libmvec's ISA variants do, within the bounds in CPU_NOTES.md, and
 * in float gelu, whose AVX2 and AVX-512 forms compute a fitted erfc with FMA (EWSAT 2 below).
 * EWV_<op> names the block function of a MATH op (a placeholder for the others, never called). */
/* the plain loop (EWSAT_<op>_<T> 0), or chunks that scan for saturated lanes (1) */
#define EW_DEFINE_MATH_VARIANT(name, T, sfx, attr)                                           \
    EW_CAT(EW_MATH_VARIANT_, EW_CAT(EWSAT_##name##_, T))(name, T, sfx, attr)
/* dst[i] = FORM for i < n, FORM an expression in A = src[i]: the loop of every form below */
#define EW_MATH_LOOP(T, FORM, src, dst, n)                                                   \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int64_t i = 0; i < (n); i++) {                                                  \
            const T A = (src)[i];                                                            \
            (dst)[i] = FORM;                                                                 \
        }                                                                                    \
    }
#define EW_MATH_PLAIN(name, T, sfx, attr, FORM)                                              \
    attr static void ew_math_##name##_##T##_##sfx(const T *a, T *out, int64_t m)             \
    EW_MATH_LOOP(T, FORM, a, out, m)
#define EW_MATH_VARIANT_0(name, T, sfx, attr) EW_MATH_PLAIN(name, T, sfx, attr, EWF_##name(T))
#define EW_MATH_VARIANT_1(name, T, sfx, attr)                                                \
    attr static void ew_math_##name##_##T##_##sfx(const T *a, T *out, int64_t m)             \
    {                                                                                        \
        for (int64_t c0 = 0; c0 < m; c0 += EW_SAT_CHUNK) {                                   \
            const int64_t cm = m - c0 < EW_SAT_CHUNK ? m - c0 : EW_SAT_CHUNK;                \
            const T *ac = a + c0;                                                            \
            T *oc = out + c0;                                                                \
            EW_SAT_SAMPLE(T, ac, cm, lo, hi)                                                 \
            if (EWS_##name(lo, hi))                                                          \
                EW_MATH_LOOP(T, EWFS_##name, ac, oc, cm)                                     \
            else                                                                             \
                EW_MATH_LOOP(T, EWF_##name(T), ac, oc, cm)                                   \
        }                                                                                    \
    }

/* EWSAT 2: the AVX2 and AVX-512 forms a plain loop of the op's fitted form (EWFF_<op>: FMA, no
 * libm call, no lane that saturates slowly), the baseline (no FMA instruction: fmaf would be a
 * libm call an element) the form of EWSAT 1 */
#define EW_MATH_VARIANT_2(name, T, sfx, attr) EW_CAT(EW_MATH_FIT_, sfx)(name, T, sfx, attr)
#define EW_MATH_FIT_base EW_MATH_VARIANT_1
#define EW_MATH_FIT_avx2 EW_MATH_FIT_LOOP
#define EW_MATH_FIT_avx512 EW_MATH_FIT_LOOP
#define EW_MATH_FIT_LOOP(name, T, sfx, attr) EW_MATH_PLAIN(name, T, sfx, attr, EWFF_##name)

#define EW_DEFINE_MATH(name, T)                                                              \
    EW_ISA_FORMS(EW_DEFINE_MATH_VARIANT, name, T)                                            \
    static void ew_math_##name##_##T(const T *a, T *out, int64_t m)                          \
    {                                                                                        \
        EW_ISA_CALL(ew_math_##name##_##T, a, out, m);                                        \
    }

#define EW_MATH_OPS(X) X(exp) X(log) X(sqrt) X(rsqrt) X(erf) X(tanh) X(sigmoid) X(gelu) X(silu)
#define EW_DEFINE_MATH_BOTH(name) EW_DEFINE_MATH(name, float) EW_DEFINE_MATH(name, double)
EW_MATH_OPS(EW_DEFINE_MATH_BOTH)

static void ew_math_none_float(const float *a, float *out, int64_t m) { (void)a; (void)out; (void)m; }
static void ew_math_none_double(const double *a, double *out, int64_t m) { (void)a; (void)out; (void)m; }
#define EWV_MATH(name) ew_math_##name##_
#define EWV_NONE(name) ew_math_none_
#define EWV_copy      EWV_NONE
#define EWV_fill      EWV_NONE
#define EWV_add       EWV_NONE
#define EWV_sub       EWV_NONE
#define EWV_mul       EWV_NONE
#define EWV_div       EWV_NONE
#define EWV_maximum   EWV_NONE
#define EWV_minimum   EWV_NONE
#define EWV_add_const EWV_NONE
#define EWV_mul_const EWV_NONE
#define EWV_axpby     EWV_NONE
#define EWV_neg       EWV_NONE
#define EWV_abs       EWV_NONE
#define EWV_exp       EWV_MATH
#define EWV_log       EWV_MATH
#define EWV_sqrt      EWV_MATH
#define EWV_rsqrt     EWV_MATH
#define EWV_erf       EWV_MATH
#define EWV_tanh      EWV_MATH
#define EWV_sigmoid   EWV_MATH
#define EWV_relu      EWV_NONE
#define EWV_gelu      EWV_MATH
#define EWV_silu      EWV_MATH
/* the block function of op name for compute type T */
#define EWV_FN(name, T) EW_CAT(EWV_##name(name), T)

int ew_cpu_isa_cap(void)
{
    static _Atomic int cap = -1;   /* read once; a race only computes the same value twice */
    int c = atomic_load_explicit(&cap, memory_order_relaxed);
    if (c < 0) {
        const char *e = getenv("EWKERN_CPU_ISA");
        c = e && !strcmp(e, "baseline") ? 0 : e && !strcmp(e, "avx2") ? 1 : 2;
        atomic_store_explicit(&cap, c, memory_order_relaxed);
    }
    return c;
}

const char *ew_cpu_math_library(void)
{
#if EW_CPU_LIBMVEC
    if (EW_HAVE_AVX512())
        return "glibc libmvec, AVX-512 variants (picked at run time on this CPU)";
    if (EW_HAVE_AVX2_FMA())
        return ew_cpu_isa_cap() < 2 ? "glibc libmvec, AVX2 variants (EWKERN_CPU_ISA=avx2)"
                                    : "glibc libmvec, AVX2 variants (picked at run time on this CPU)";
    return ew_cpu_isa_cap() < 1 ? "glibc libmvec, SSE variants (EWKERN_CPU_ISA=baseline)"
                                : "glibc libmvec, SSE variants (picked at run time on this CPU)";
#else
    return "scalar libm (this build has no libmvec: not found, or EWKERN_NO_LIBMVEC=1)";
#endif
}

/* ---- float16/bfloat16 <-> float over a block ----------------------------------------------
 * The portable versions vectorise half.h's converters with whatever ISA the build targets
 * (SSE2 on plain x86-64). On x86, float16 also has an F16C version (vcvtph2ps/vcvtps2ph,
 * round to nearest even) and bfloat16 the same portable C compiled for AVX-512 and for AVX2
 * (CI host, AMD EPYC, 2 threads: bfloat16 add of 1 MiB 203 -> 115 us with the AVX-512 form,
 * 16 MiB 2.77 -> 1.84 ms). Each call picks the best the CPU has. All versions give the same bits, with one exception that cannot reach an output: F16C
 * quiets a signalling float16 NaN on the way in, the portable code on the way out. */
#define EW_DEFINE_F16_CONVERTERS(sfx, attr)                                                  \
    attr static void ew_f16_to_f32_##sfx(const uint16_t *src, float *dst, int m)             \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int j = 0; j < m; j++) dst[j] = ew_half_to_float(src[j]);                       \
    }                                                                                        \
    attr static void ew_f32_to_f16_##sfx(const float *src, uint16_t *dst, int m)             \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int j = 0; j < m; j++) dst[j] = ew_float_to_half(src[j]);                       \
    }
#define EW_DEFINE_BF16_CONVERTERS(sfx, attr)                                                 \
    attr static void ew_bf16_to_f32_##sfx(const uint16_t *src, float *dst, int m)            \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int j = 0; j < m; j++) dst[j] = ew_bf16_to_float(src[j]);                       \
    }                                                                                        \
    attr static void ew_f32_to_bf16_##sfx(const float *src, uint16_t *dst, int m)            \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int j = 0; j < m; j++) dst[j] = ew_float_to_bf16(src[j]);                       \
    }

EW_DEFINE_F16_CONVERTERS(portable, )
EW_DEFINE_BF16_CONVERTERS(portable, )

#if EW_X86_DISPATCH
EW_DEFINE_BF16_CONVERTERS(avx2, __attribute__((target("avx2"))))
EW_DEFINE_BF16_CONVERTERS(avx512, EW_ISA_AVX512)

__attribute__((target("avx,f16c"))) static void ew_f16_to_f32_f16c(const uint16_t *src,
                                                                     float *dst, int m)
{
    int j = 0;
    for (; j + 8 <= m; j += 8)
        _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + j))));
    for (; j < m; j++)
        dst[j] = ew_half_to_float(src[j]);
}

__attribute__((target("avx,f16c"))) static void ew_f32_to_f16_f16c(const float *src,
                                                                     uint16_t *dst, int m)
{
    int j = 0;
    for (; j + 8 <= m; j += 8)
        _mm_storeu_si128((__m128i *)(dst + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
    for (; j < m; j++)
        dst[j] = ew_float_to_half(src[j]);
}

#define EW_HAVE_AVX2() (ew_cpu_isa_cap() >= 1 && __builtin_cpu_supports("avx2"))
#else
#define EW_HAVE_AVX2() 0
#define ew_f16_to_f32_f16c ew_f16_to_f32_portable
#define ew_f32_to_f16_f16c ew_f32_to_f16_portable
#define ew_bf16_to_f32_avx2 ew_bf16_to_f32_portable
#define ew_f32_to_bf16_avx2 ew_f32_to_bf16_portable
#define ew_bf16_to_f32_avx512 ew_bf16_to_f32_portable
#define ew_f32_to_bf16_avx512 ew_f32_to_bf16_portable
#endif

void ew_f16_to_f32_block(const uint16_t *src, float *dst, int m)
{
    if (EW_HAVE_F16C())
        ew_f16_to_f32_f16c(src, dst, m);
    else
        ew_f16_to_f32_portable(src, dst, m);
}

void ew_f32_to_f16_block(const float *src, uint16_t *dst, int m)
{
    if (EW_HAVE_F16C())
        ew_f32_to_f16_f16c(src, dst, m);
    else
        ew_f32_to_f16_portable(src, dst, m);
}

void ew_bf16_to_f32_block(const uint16_t *src, float *dst, int m)
{
    if (EW_HAVE_AVX512())
        ew_bf16_to_f32_avx512(src, dst, m);
    else if (EW_HAVE_AVX2())
        ew_bf16_to_f32_avx2(src, dst, m);
    else
        ew_bf16_to_f32_portable(src, dst, m);
}

void ew_f32_to_bf16_block(const float *src, uint16_t *dst, int m)
{
    if (EW_HAVE_AVX512())
        ew_f32_to_bf16_avx512(src, dst, m);
    else if (EW_HAVE_AVX2())
        ew_f32_to_bf16_avx2(src, dst, m);
    else
        ew_f32_to_bf16_portable(src, dst, m);
}

/* ---- dtype traits -------------------------------------------------------------------------
 * ST: storage type; CT: compute type; TILED: goes through float tiles (TOF/FROMF convert a
 * block; SV converts one value); CS: scalar (double) -> CT for add_const/mul_const/axpby;
 * FS: fill value (double) -> CT such that SV(FS(x)) rounds x once. */
#define EW_DT_f32_ST float
#define EW_DT_f32_CT float
#define EW_DT_f32_ENUM EW_FLOAT32
#define EW_DT_f32_TILED 0
#define EW_DT_f32_SV(x) (x)
#define EW_DT_f32_TOF(src, dst, m) ((void)0)
#define EW_DT_f32_FROMF(src, dst, m) ((void)0)
#define EW_DT_f32_CS(x) ((float)(x))
#define EW_DT_f32_FS(x) ((float)(x))
#define EW_DT_f32_TOFN NULL
#define EW_DT_f32_FROMFN NULL
#define EW_DT_f32_NEGINF 0u

#define EW_DT_f16_ST uint16_t
#define EW_DT_f16_CT float
#define EW_DT_f16_ENUM EW_FLOAT16
#define EW_DT_f16_TILED 1
#define EW_DT_f16_SV(x) ew_float_to_half(x)
#define EW_DT_f16_TOF(src, dst, m) ew_f16_to_f32_block(src, dst, m)
#define EW_DT_f16_FROMF(src, dst, m) ew_f32_to_f16_block(src, dst, m)
#define EW_DT_f16_CS(x) ((float)(x))
#define EW_DT_f16_FS(x) ew_double_to_float_odd(x)
#define EW_DT_f16_TOFN ew_f16_to_f32_block
#define EW_DT_f16_FROMFN ew_f32_to_f16_block
#define EW_DT_f16_NEGINF 0xfc00u   /* -inf's bits (relu) */

#define EW_DT_bf16_ST uint16_t
#define EW_DT_bf16_CT float
#define EW_DT_bf16_ENUM EW_BFLOAT16
#define EW_DT_bf16_TILED 1
#define EW_DT_bf16_SV(x) ew_float_to_bf16(x)
#define EW_DT_bf16_TOF(src, dst, m) ew_bf16_to_f32_block(src, dst, m)
#define EW_DT_bf16_FROMF(src, dst, m) ew_f32_to_bf16_block(src, dst, m)
#define EW_DT_bf16_CS(x) ((float)(x))
#define EW_DT_bf16_FS(x) ew_double_to_float_odd(x)
#define EW_DT_bf16_TOFN ew_bf16_to_f32_block
#define EW_DT_bf16_FROMFN ew_f32_to_bf16_block
#define EW_DT_bf16_NEGINF 0xff80u

#define EW_DT_f64_ST double
#define EW_DT_f64_CT double
#define EW_DT_f64_ENUM EW_FLOAT64
#define EW_DT_f64_TILED 0
#define EW_DT_f64_SV(x) (x)
#define EW_DT_f64_TOF(src, dst, m) ((void)0)
#define EW_DT_f64_FROMF(src, dst, m) ((void)0)
#define EW_DT_f64_CS(x) ((double)(x))
#define EW_DT_f64_FS(x) ((double)(x))
#define EW_DT_f64_TOFN NULL
#define EW_DT_f64_FROMFN NULL
#define EW_DT_f64_NEGINF 0u

#define EW_DT(dt, what) EW_DT_##dt##_##what

/* ---- float16/bfloat16 arithmetic in one pass ---------------------------------------------
 * add, sub, mul, div, maximum, minimum, add_const, mul_const, axpby, sqrt and rsqrt (EWA_<op>
 * below): each group of W elements (16 with AVX-512, 8 with AVX2) is loaded, widened to float in
 * registers, computed by the op's own line (EWV16_<op>: EWF_<op> on GCC's vector types, whose
 * arithmetic is the scalar float arithmetic lane by lane, -std=c11: no FMA formed), rounded back
 * and stored. The float tiles made four passes over L1 a tile (each input to float, the op, back
 * to 16 bits); on the CI host (2 threads, 1 MiB, inputs in cache) float16 add took 58 us there
 * against torch's 28.5. The same bits as the tiles (half_simd.h's converters; the last m % W
 * elements through half.h's scalar ones).
 * The baseline ISA (and a CPU without F16C, for float16) keeps the tiles (the pick returns NULL). */
typedef void (*ew_a16_fn)(const uint16_t *a, const uint16_t *b, uint16_t *out, int64_t m, float c0, float c1);

#define EW_DT_f16_TOFLOAT(h) ew_half_to_float(h)
#define EW_DT_bf16_TOFLOAT(h) ew_bf16_to_float(h)

#if EW_X86_DISPATCH
#define EW_A16_FORM(name, inputs, dt, sfx, attr, W, VT, WIDEN, NARROW)                       \
    attr static void ew_a16_##name##_##dt##_##sfx(const uint16_t *a, const uint16_t *b,       \
                                                  uint16_t *out, int64_t m, float C0, float C1) \
    {                                                                                        \
        (void)C0; (void)C1;                                                                  \
        int64_t i = 0;                                                                       \
        for (; i + (W) <= m; i += (W)) {                                                     \
            const VT A = WIDEN(a + i);                                                       \
            const VT B = (inputs) >= 2 ? WIDEN(b + i) : A;                                   \
            (void)B;                                                                         \
            NARROW(out + i, EWV16_##name(VT));                                               \
        }                                                                                    \
        for (; i < m; i++) {                                                                 \
            const float A = EW_DT(dt, TOFLOAT)(a[i]);                                        \
            const float B = (inputs) >= 2 ? EW_DT(dt, TOFLOAT)(b[i]) : A;                    \
            (void)B;                                                                         \
            out[i] = EW_DT(dt, SV)(EWF_##name(float));                                       \
        }                                                                                    \
    }

#define EW_DEFINE_A16(name, inputs, dt, f16c)                                                \
    EW_A16_FORM(name, inputs, dt, avx512, EW_ISA_AVX512, 16, __m512, ew_w16_##dt, ew_n16_##dt) \
    EW_A16_FORM(name, inputs, dt, avx2, EW_ISA_AVX2_F16C, 8, __m256, ew_w8_##dt, ew_n8_##dt)  \
    static ew_a16_fn ew_a16_pick_##name##_##dt(void) { return EW_PICK16(ew_a16_##name##_##dt, f16c); }
#else
#define EW_DEFINE_A16(name, inputs, dt, f16c)                                                \
    static ew_a16_fn ew_a16_pick_##name##_##dt(void) { return NULL; }
#endif

/* the op's line on GCC's vector types (VT): EWF_<op>, but for maximum/minimum, whose ?: C does not
 * take on vectors: the same choice as a select of the lanes' bits by the comparisons' masks (a lane
 * of A where A >= B, or A is NaN; else B's, NaN included) */
#define EWV16_add       EWF_add
#define EWV16_sub       EWF_sub
#define EWV16_mul       EWF_mul
#define EWV16_div       EWF_div
#define EWV16_add_const EWF_add_const
#define EWV16_mul_const EWF_mul_const
#define EWV16_axpby     EWF_axpby
#define EW_V16_PICK(T, keep)                                                                 \
    __extension__({                                                                          \
        const __typeof__(A != A) k_ = (keep) | (A != A);                                     \
        (T)(((__typeof__(k_))A & k_) | ((__typeof__(k_))B & ~k_));                           \
    })
#define EWV16_maximum(T) EW_V16_PICK(T, A >= B)
#define EWV16_minimum(T) EW_V16_PICK(T, A <= B)
/* sqrt and rsqrt: the vector square root (correctly rounded, as sqrtf), the division as the
 * scalar line's; the same bits as the table of the math ops (whose entries come from the same
 * float operations on the same widened values), without a table read an element */
#define EWV16_sqrt(T) _Generic((A), __m512: _mm512_sqrt_ps, __m256: _mm256_sqrt_ps)(A)
#define EWV16_rsqrt(T) (1.0f / EWV16_sqrt(T))

#define EW_A16_OPS(X) X(add, 2) X(sub, 2) X(mul, 2) X(div, 2) X(maximum, 2) X(minimum, 2) X(add_const, 1) \
    X(mul_const, 1) X(axpby, 2) X(sqrt, 1) X(rsqrt, 1)
#define EW_DEFINE_A16_BOTH(name, inputs) EW_DEFINE_A16(name, inputs, f16, 1) EW_DEFINE_A16(name, inputs, bf16, 0)
EW_A16_OPS(EW_DEFINE_A16_BOTH)

/* the one-pass form of op name for dtype dt on this CPU, or NULL (the tiles) */
#define EWA_YES(name, dt) ew_a16_pick_##name##_##dt()
#define EWA_NO(name, dt) ((ew_a16_fn)NULL)
#define EWA_copy      EWA_NO
#define EWA_fill      EWA_NO
#define EWA_add       EWA_YES
#define EWA_sub       EWA_YES
#define EWA_mul       EWA_YES
#define EWA_div       EWA_YES
#define EWA_maximum   EWA_YES
#define EWA_minimum   EWA_YES
#define EWA_add_const EWA_YES
#define EWA_mul_const EWA_YES
#define EWA_axpby     EWA_YES
#define EWA_neg       EWA_NO
#define EWA_abs       EWA_NO
#define EWA_exp       EWA_NO
#define EWA_log       EWA_NO
#define EWA_sqrt      EWA_YES
#define EWA_rsqrt     EWA_YES
#define EWA_erf       EWA_NO
#define EWA_tanh      EWA_NO
#define EWA_sigmoid   EWA_NO
#define EWA_relu      EWA_NO
#define EWA_gelu      EWA_NO
#define EWA_silu      EWA_NO
#define EW_DT_f32_A16(name) ((ew_a16_fn)NULL)
#define EW_DT_f64_A16(name) ((ew_a16_fn)NULL)
#define EW_DT_f16_A16(name) EWA_##name(name, f16)
#define EW_DT_bf16_A16(name) EWA_##name(name, bf16)

/* ---- the launchers ----------------------------------------------------------------------- */

/* float32/float64: compute straight from the arrays. Inputs the op does not read are never
 * loaded (the condition is a constant). */
#define EW_DIRECT_BODY(name, inputs, dt)                                                     \
    const EW_DT(dt, CT) A = (inputs) >= 1 ? a[i] : (EW_DT(dt, CT))0;                         \
    const EW_DT(dt, CT) B = (inputs) >= 2 ? b[i] : (EW_DT(dt, CT))0;                         \
    (void)A; (void)B;                                                                        \
    out[i] = EWF_##name(EW_DT(dt, CT))

/* float16/bfloat16 math ops (exp, log, ..., one input): a table of the result for each of the
 * 65536 input bit patterns, made on the first call of at least EW_LUT_MIN elements by the tile
 * path's own functions (the converters and the op's block function), so a lookup returns the
 * very bits the tiles would, NaN payloads included; then every element is one table read (128
 * KiB a table, in L2; the tiles cost a conversion in and out around libmvec, which put float16
 * exp and log at 0.60-0.75 of NumPy's own half-precision loops on one thread). A table is
 * published once (compare-and-swap: a thread that loses frees its copy) and kept for the life
 * of the process; if it cannot be allocated the tiles run. */
#define EW_LUT_SIZE 65536
#define EW_LUT_MIN ((int64_t)1 << 14)
typedef void (*ew_math_fn)(const float *, float *, int64_t);
typedef void (*ew_tof_fn)(const uint16_t *, float *, int);
typedef void (*ew_fromf_fn)(const float *, uint16_t *, int);

static const uint16_t *ew_lut(_Atomic(uint16_t *) *slot, int64_t n, ew_math_fn math, ew_tof_fn tof,
                              ew_fromf_fn fromf)
{
    uint16_t *t = atomic_load_explicit(slot, memory_order_acquire);
    if (t != NULL || n < EW_LUT_MIN || tof == NULL || fromf == NULL)
        return t;
    t = (uint16_t *)malloc(EW_LUT_SIZE * sizeof *t);
    if (t == NULL)
        return NULL;
    _Alignas(64) uint16_t idx[EW_TILE];
    _Alignas(64) float buf[EW_TILE];
    for (int base = 0; base < EW_LUT_SIZE; base += EW_TILE) {
        for (int j = 0; j < EW_TILE; j++)
            idx[j] = (uint16_t)(base + j);
        tof(idx, buf, EW_TILE);
        math(buf, buf, EW_TILE);
        fromf(buf, t + base, EW_TILE);
    }
    uint16_t *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(slot, &expected, t, memory_order_acq_rel, memory_order_acquire)) {
        free(t);
        t = expected;
    }
    return t;
}

/* Loops on the bits, one function per ISA (as below): fill by element size, and float16/bfloat16
 * abs, neg and relu on the sign bit (relu: below -0 down to -inf, neginf, becomes +0, every other
 * pattern keeps its bits). Compiled for the baseline alone they stored 16 bytes an instruction:
 * fill of 1 MiB took 8.8-9.0 us on the CI host's two threads in cache, torch's fill_ 4.0-4.3
 * (CPU_NOTES.md, "float32/float64 arithmetic per ISA"). */
#define EW_DEFINE_BITS_VARIANT(unused, sfx, attr)                                            \
    attr static void ew_fill16_##sfx(uint16_t *o, int64_t n, uint16_t v)                     \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int64_t i = 0; i < n; i++) o[i] = v;                                            \
    }                                                                                        \
    attr static void ew_fill32_##sfx(uint32_t *o, int64_t n, uint32_t v)                     \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int64_t i = 0; i < n; i++) o[i] = v;                                            \
    }                                                                                        \
    attr static void ew_fill64_##sfx(uint64_t *o, int64_t n, uint64_t v)                     \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int64_t i = 0; i < n; i++) o[i] = v;                                            \
    }                                                                                        \
    attr static void ew_abs16_##sfx(const uint16_t *a, uint16_t *o, int64_t n)               \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int64_t i = 0; i < n; i++) o[i] = (uint16_t)(a[i] & 0x7fffu);                   \
    }                                                                                        \
    attr static void ew_neg16_##sfx(const uint16_t *a, uint16_t *o, int64_t n)               \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int64_t i = 0; i < n; i++) o[i] = (uint16_t)(a[i] ^ 0x8000u);                   \
    }                                                                                        \
    attr static void ew_relu16_##sfx(const uint16_t *a, uint16_t *o, int64_t n, unsigned neginf) \
    {                                                                                        \
        EW_SIMD                                                                              \
        for (int64_t i = 0; i < n; i++)                                                      \
            o[i] = (uint16_t)(a[i] > 0x8000u && a[i] <= neginf ? 0u : a[i]);                 \
    }
EW_ISA_FORMS(EW_DEFINE_BITS_VARIANT, bits)

/* out[0, m) = the element at v (size bytes: 2, 4 or 8) */
static void ew_fill_block(void *out, int64_t m, const void *v, size_t size)
{
    if (size == 2) {
        uint16_t x;
        memcpy(&x, v, 2);
        EW_ISA_CALL(ew_fill16, (uint16_t *)out, m, x);
    } else if (size == 4) {
        uint32_t x;
        memcpy(&x, v, 4);
        EW_ISA_CALL(ew_fill32, (uint32_t *)out, m, x);
    } else {
        uint64_t x;
        memcpy(&x, v, 8);
        EW_ISA_CALL(ew_fill64, (uint64_t *)out, m, x);
    }
}

/* float32/float64 arithmetic (the ARITH ops, neg, abs, relu): EW_DIRECT_BODY over a block, one
 * function per ISA as the math ops' block functions are (the same omp simd loop compiled for
 * AVX-512, AVX2 + FMA and the baseline; the widest this CPU has is called). No FMA is formed
 * (-std=c11 keeps fp-contract off: axpby's s0 * a + s1 * b rounds twice in every form), so every
 * form gives the same bits. Compiled for the baseline alone (SSE2 on x86-64) the loop moved 16
 * bytes an instruction, and float32 add of 1 MiB on the CI host's two threads took 17.0 us in
 * cache against torch's 15.9 (36-38 against 29-32 from memory): CPU_NOTES.md, "float32/float64
 * arithmetic per ISA". The other ops' and dtypes' functions are empty (never called). */
#define EW_DIRECT_KIND(name) (EWK_##name == EW_KIND_ARITH || EWK_##name == EW_KIND_NEG             \
                              || EWK_##name == EW_KIND_ABS || EWK_##name == EW_KIND_RELU)
#define EW_DEFINE_DIRECT_VARIANT(name, inputs, dt, sfx, attr)                                \
    attr static void ew_direct_##name##_##dt##_##sfx(const EW_DT(dt, ST) *a, const EW_DT(dt, ST) *b, \
                                                     EW_DT(dt, ST) *out, int64_t n,          \
                                                     EW_DT(dt, CT) C0, EW_DT(dt, CT) C1)     \
    {                                                                                        \
        (void)a; (void)b; (void)out; (void)n; (void)C0; (void)C1;                            \
        if (!EW_DT(dt, TILED) && EW_DIRECT_KIND(name)) {                                     \
            EW_SIMD                                                                          \
            for (int64_t i = 0; i < n; i++) { EW_DIRECT_BODY(name, inputs, dt); }            \
        }                                                                                    \
    }

#define EW_DEFINE_DIRECT(name, inputs, dt)                                                   \
    EW_ISA_FORMS(EW_DEFINE_DIRECT_VARIANT, name, inputs, dt)                                 \
    static void ew_direct_##name##_##dt(const EW_DT(dt, ST) *a, const EW_DT(dt, ST) *b,      \
                                        EW_DT(dt, ST) *out, int64_t n, EW_DT(dt, CT) C0,     \
                                        EW_DT(dt, CT) C1)                                    \
    {                                                                                        \
        EW_ISA_CALL(ew_direct_##name##_##dt, a, b, out, n, C0, C1);                          \
    }

/* M(name, inputs, dt) for each of the four dtypes */
#define EW_EACH_DTYPE(M, name, inputs) M(name, inputs, f32) M(name, inputs, f16) M(name, inputs, bf16) M(name, inputs, f64)

#define EW_OP(name, inputs, scalars, def, acc) EW_EACH_DTYPE(EW_DEFINE_DIRECT, name, inputs)
#include "../ops.def"
#undef EW_OP

/* float16/bfloat16: one tile. Both inputs are converted before the output is written, so
 * out == in[k] is safe. */
#define EW_TILE_BODY(name, inputs, dt)                                                       \
    _Alignas(64) float ta[EW_TILE];                                                          \
    _Alignas(64) float tb[EW_TILE];                                                          \
    const int64_t i0 = t * EW_TILE;                                                          \
    const int m = (int)(n - i0 < EW_TILE ? n - i0 : EW_TILE);                                \
    if ((inputs) >= 1)                                                                       \
        EW_DT(dt, TOF)(a + i0, ta, m);                                                       \
    if ((inputs) >= 2)                                                                       \
        EW_DT(dt, TOF)(b + i0, tb, m);                                                       \
    if (EWK_##name == EW_KIND_MATH) {                                                        \
        EWV_FN(name, float)(ta, ta, m);                                                      \
    } else {                                                                                 \
        EW_SIMD                                                                              \
        for (int j = 0; j < m; j++) {                                                        \
            const float A = (inputs) >= 1 ? ta[j] : 0.0f;                                    \
            const float B = (inputs) >= 2 ? tb[j] : 0.0f;                                    \
            (void)A; (void)B;                                                                \
            ta[j] = EWF_##name(float);                                                       \
        }                                                                                    \
    }                                                                                        \
    EW_DT(dt, FROMF)(ta, out + i0, m)

#define EW_DEFINE_LAUNCHER(name, inputs, dt)                                                 \
    static int ew_cpu_##name##_##dt(const void *argp)                                        \
    {                                                                                        \
        const ew_args *args = (const ew_args *)argp;                                         \
        const int64_t n = args->n;                                                           \
        const int64_t par_min = EW_PAR_MIN(EWK_##name);                                      \
        const EW_DT(dt, ST) *a = (const EW_DT(dt, ST) *)args->in[0];                         \
        const EW_DT(dt, ST) *b = (const EW_DT(dt, ST) *)args->in[1];                         \
        EW_DT(dt, ST) *out = (EW_DT(dt, ST) *)args->out;                                     \
        const EW_DT(dt, CT) C0 = EW_DT(dt, CS)(args->scalar[0]);                             \
        const EW_DT(dt, CT) C1 = EW_DT(dt, CS)(args->scalar[1]);                             \
        (void)C0; (void)C1;                                                                  \
        static _Atomic(uint16_t *) lut_slot;   /* float16/bfloat16 math: ew_lut */            \
        const uint16_t *lut = NULL;                                                          \
        ew_a16_fn a16 = NULL;                  /* float16/bfloat16 arithmetic in one pass */  \
        (void)lut; (void)a16;                                                                \
        if (n <= 0)                                                                          \
            return n == 0 ? 0 : EINVAL;                                                      \
        if (!out || ((inputs) >= 1 && !a) || ((inputs) >= 2 && !b))                          \
            return EINVAL;                                                                   \
        if (EWK_##name == EW_KIND_COPY) {                                                    \
            if ((const void *)out != (const void *)a)                                        \
                ew_copy_bytes(out, a, n * (int64_t)sizeof *out, n >= par_min);               \
        } else if (EWK_##name == EW_KIND_FILL) {                                             \
            const EW_DT(dt, ST) v = EW_DT(dt, SV)(EW_DT(dt, FS)(args->scalar[0]));           \
            EW_BLOCKS(n, par_min, i0, m, ew_fill_block(out + i0, m, &v, sizeof v));          \
        } else if (EW_DT(dt, TILED) && (EWK_##name == EW_KIND_ABS || EWK_##name == EW_KIND_NEG \
                                         || EWK_##name == EW_KIND_RELU)) {                   \
            const uint16_t *ab = (const uint16_t *)(const void *)a;                          \
            uint16_t *ob = (uint16_t *)(void *)out;                                          \
            if (EWK_##name == EW_KIND_ABS)                                                   \
                EW_BLOCKS(n, par_min, i0, m, EW_ISA_CALL(ew_abs16, ab + i0, ob + i0, m));    \
            else if (EWK_##name == EW_KIND_NEG)                                              \
                EW_BLOCKS(n, par_min, i0, m, EW_ISA_CALL(ew_neg16, ab + i0, ob + i0, m));    \
            else   /* below -0 down to -inf: +0 */                                           \
                EW_BLOCKS(n, par_min, i0, m,                                                 \
                          EW_ISA_CALL(ew_relu16, ab + i0, ob + i0, m, EW_DT(dt, NEGINF)));   \
        } else if (EW_DT(dt, TILED) && (a16 = EW_DT(dt, A16)(name)) != NULL) {               \
            const uint16_t *ab = (const uint16_t *)(const void *)a;                          \
            const uint16_t *bb = (const uint16_t *)(const void *)b;                          \
            uint16_t *ob = (uint16_t *)(void *)out;                                          \
            if (n < par_min) {                                                               \
                a16(ab, bb, ob, n, (float)C0, (float)C1);                                    \
            } else {                                                                         \
                const int64_t ntiles = (n + EW_TILE - 1) / EW_TILE;                          \
                EW_PARALLEL                                                                  \
                for (int64_t t = 0; t < ntiles; t++) {                                       \
                    const int64_t i0 = t * EW_TILE;                                          \
                    const int64_t m = n - i0 < EW_TILE ? n - i0 : EW_TILE;                   \
                    a16(ab + i0, (inputs) >= 2 ? bb + i0 : NULL, ob + i0, m, (float)C0, (float)C1); \
                }                                                                            \
            }                                                                                \
        } else if (EW_DT(dt, TILED) && EWK_##name == EW_KIND_MATH &&                         \
                   (lut = ew_lut(&lut_slot, n, EWV_FN(name, float), EW_DT(dt, TOFN),            \
                                 EW_DT(dt, FROMFN))) != NULL) {                                 \
            const uint16_t *ab = (const uint16_t *)(const void *)a;                          \
            uint16_t *ob = (uint16_t *)(void *)out;                                          \
            EW_FOR(i, n, EW_PAR_MIN_CHEAP, ob[i] = lut[ab[i]]);                              \
        } else if (!EW_DT(dt, TILED) && EWK_##name == EW_KIND_MATH) {                        \
            /* ST == CT here; the casts only let the tiled dtypes compile this dead branch */ \
            const EW_DT(dt, CT) *ac = (const EW_DT(dt, CT) *)(const void *)a;                \
            EW_DT(dt, CT) *oc = (EW_DT(dt, CT) *)(void *)out;                                \
            EW_BLOCKS(n, par_min, i0, m, EWV_FN(name, EW_DT(dt, CT))(ac + i0, oc + i0, m));   \
        } else if (!EW_DT(dt, TILED)) {                                                      \
            EW_BLOCKS(n, par_min, i0, m,                                                     \
                      ew_direct_##name##_##dt((inputs) >= 1 ? a + i0 : a, (inputs) >= 2 ? b + i0 : b, \
                                              out + i0, m, C0, C1));                         \
        } else {                                                                             \
            const int64_t ntiles = (n + EW_TILE - 1) / EW_TILE;                              \
            EW_TEAM_FOR(n >= par_min, t, ntiles, EW_TILE_BODY(name, inputs, dt););           \
        }                                                                                    \
        return 0;                                                                            \
    }

#define EW_OP(name, inputs, scalars, def, acc) EW_EACH_DTYPE(EW_DEFINE_LAUNCHER, name, inputs)
#include "../ops.def"
#undef EW_OP

/* ---- the table --------------------------------------------------------------------------- */

#define EW_ABOUT_AUTO                                                                        \
    "OpenMP + compiler-vectorised loop per ISA (threads from 2^15 elements, 2^12 for libm ops); " \
    "f16/bf16 arithmetic widened in registers (AVX-512/AVX2 picked at run time), math by 2^16-entry " \
    "tables, else float tiles"

#define EW_ROW(name, dt)                                                                     \
    {#name, "auto", EW_DT(dt, ENUM), ew_cpu_##name##_##dt, NULL, 0, EW_ABOUT_AUTO},

static const ew_kernel ew_cpu_elementwise_rows[] = {
#define EW_OP(name, inputs, scalars, def, acc)                                                  \
    EW_ROW(name, f32) EW_ROW(name, f16) EW_ROW(name, bf16) EW_ROW(name, f64)
#include "../ops.def"
#undef EW_OP
};

const ew_kernel *ew_cpu_elementwise_table(int *count)
{
    *count = (int)(sizeof ew_cpu_elementwise_rows / sizeof ew_cpu_elementwise_rows[0]);
    return ew_cpu_elementwise_rows;
}
