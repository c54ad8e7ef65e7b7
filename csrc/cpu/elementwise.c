/*
 * elementwise.c: the CPU elementwise kernels, one "auto" variant per (op, dtype).
 *
 * Versions (variant names as the registry lists them):
 *   auto  one loop per (op, dtype): compiler-vectorised (#pragma omp simd), run on the OpenMP
 *         team when n is large enough to pay for it, single-threaded below that;
 *         float16/bfloat16 load through half.h's branch-free converters, compute in float and
 *         round once on the store; float64 computes in double.
 *
 * The launchers are generated: ops.def lists the ops (EW_OP X-macro), EWF_<op> below gives
 * each op's arithmetic once for any compute type T, and the EW_DT_* traits say how a dtype
 * is stored, loaded, computed and stored back. Timing: ewkern's bench package, device "cpu".
 *
 * Numerical choices (all within the semantics of ops.def):
 *   maximum/minimum  NaN if either side is NaN; otherwise NumPy's scalar rule
 *                    (a >= b ? a : b), so maximum(-0.0, 0.0) is -0.0.
 *   relu             a < 0 ? 0 : a, i.e. NumPy's maximum(a, 0): NaN stays NaN, -0.0 stays -0.0.
 *   sigmoid          e = exp(-|a|), r = 1 / (1 + e), a >= 0 ? r : e * r. Equal to
 *                    1 / (1 + e^-a) but keeps full relative accuracy for large negative a
 *                    (where exp(-a) overflows and the literal formula flushes to 0).
 *   silu             a * sigmoid(a), with the sigmoid above (same reason).
 *   gelu             a / 2 * erfc(-a / sqrt(2)). Equal to a / 2 * (1 + erf(a / sqrt(2))) but
 *                    without the cancellation of 1 + erf for a below about -3, which in float
 *                    leaves no correct digits by a = -6.
 *   fill             float16/bfloat16 convert the double scalar to the dtype with one rounding
 *                    (round to odd into float, then to nearest even), so no double rounding.
 *   add_const, mul_const, axpby  scalars are first converted to the compute type
 *                    ((float) for float32/float16/bfloat16, double for float64), as ops.def says.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>

#include "../ewkern_kernels.h"
#include "half.h"

/* Below these element counts a launch runs on the calling thread only: waking the OpenMP team
 * costs microseconds, which a cheap op on 2^15 elements (128 KiB per float32 array) about
 * matches. Transcendental ops are roughly 10x dearer per element, so they thread sooner. */
#define EW_PAR_MIN_CHEAP ((int64_t)1 << 15)
#define EW_PAR_MIN_HEAVY ((int64_t)1 << 12)

/* ---- compute-type helpers -------------------------------------------------------------- */

/* Every libm name used below, for float (suffix f) and for double. */
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
        const T r = (T)1 / ((T)1 + e);                                                       \
        return a >= 0 ? r : e * r;                                                           \
    }
EW_DEFINE_SIGMOID(float)
EW_DEFINE_SIGMOID(double)

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

/* ---- per-op arithmetic -------------------------------------------------------------------
 * T is the compute type; A and B are the loaded inputs, C0 and C1 the scalars (c, alpha/beta,
 * value), all of type T. Keep one line per row of ops.def. */
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
#define EWF_relu(T)      ((A < 0) ? (T)0 : A)
#define EWF_gelu(T)      ((T)0.5 * A * EW_M(T, erfc)(-A * (T)EW_SQRT1_2))
#define EWF_silu(T)      (A * EW_CAT(ew_sigmoid_, T)(A))

/* Threading threshold per op: ops calling libm transcendentals are "heavy". */
#define EWP_copy      EW_PAR_MIN_CHEAP
#define EWP_fill      EW_PAR_MIN_CHEAP
#define EWP_add       EW_PAR_MIN_CHEAP
#define EWP_sub       EW_PAR_MIN_CHEAP
#define EWP_mul       EW_PAR_MIN_CHEAP
#define EWP_div       EW_PAR_MIN_CHEAP
#define EWP_maximum   EW_PAR_MIN_CHEAP
#define EWP_minimum   EW_PAR_MIN_CHEAP
#define EWP_add_const EW_PAR_MIN_CHEAP
#define EWP_mul_const EW_PAR_MIN_CHEAP
#define EWP_axpby     EW_PAR_MIN_CHEAP
#define EWP_neg       EW_PAR_MIN_CHEAP
#define EWP_abs       EW_PAR_MIN_CHEAP
#define EWP_exp       EW_PAR_MIN_HEAVY
#define EWP_log       EW_PAR_MIN_HEAVY
#define EWP_sqrt      EW_PAR_MIN_CHEAP
#define EWP_rsqrt     EW_PAR_MIN_CHEAP
#define EWP_erf       EW_PAR_MIN_HEAVY
#define EWP_tanh      EW_PAR_MIN_HEAVY
#define EWP_sigmoid   EW_PAR_MIN_HEAVY
#define EWP_relu      EW_PAR_MIN_CHEAP
#define EWP_gelu      EW_PAR_MIN_HEAVY
#define EWP_silu      EW_PAR_MIN_HEAVY

/* ---- dtype traits ------------------------------------------------------------------------
 * ST: storage type; CT: compute type; LD: storage -> CT; SV: CT -> storage;
 * CS: scalar (double) -> CT for add_const/mul_const/axpby; FS: fill value (double) -> CT such
 * that SV(FS(x)) rounds x once. */
#define EW_DT_f32_ST float
#define EW_DT_f32_CT float
#define EW_DT_f32_ENUM EW_FLOAT32
#define EW_DT_f32_LD(x) (x)
#define EW_DT_f32_SV(x) (x)
#define EW_DT_f32_CS(x) ((float)(x))
#define EW_DT_f32_FS(x) ((float)(x))

#define EW_DT_f16_ST uint16_t
#define EW_DT_f16_CT float
#define EW_DT_f16_ENUM EW_FLOAT16
#define EW_DT_f16_LD(x) ew_half_to_float(x)
#define EW_DT_f16_SV(x) ew_float_to_half(x)
#define EW_DT_f16_CS(x) ((float)(x))
#define EW_DT_f16_FS(x) ew_double_to_float_odd(x)

#define EW_DT_bf16_ST uint16_t
#define EW_DT_bf16_CT float
#define EW_DT_bf16_ENUM EW_BFLOAT16
#define EW_DT_bf16_LD(x) ew_bf16_to_float(x)
#define EW_DT_bf16_SV(x) ew_float_to_bf16(x)
#define EW_DT_bf16_CS(x) ((float)(x))
#define EW_DT_bf16_FS(x) ew_double_to_float_odd(x)

#define EW_DT_f64_ST double
#define EW_DT_f64_CT double
#define EW_DT_f64_ENUM EW_FLOAT64
#define EW_DT_f64_LD(x) (x)
#define EW_DT_f64_SV(x) (x)
#define EW_DT_f64_CS(x) ((double)(x))
#define EW_DT_f64_FS(x) ((double)(x))

#define EW_DT(dt, what) EW_DT_##dt##_##what

/* The per-element statement. Inputs an op does not read are never loaded (the condition is a
 * constant, so the dead load disappears); out is written after both loads, so out == in[0] or
 * out == in[1] is safe, and omp simd promises the compiler no cross-iteration dependence,
 * which holds for those exact aliases. */
#define EW_BODY(name, inputs, dt)                                                            \
    {                                                                                        \
        const EW_DT(dt, CT) A = (inputs) >= 1 ? EW_DT(dt, LD)(a[i]) : (EW_DT(dt, CT))0;      \
        const EW_DT(dt, CT) B = (inputs) >= 2 ? EW_DT(dt, LD)(b[i]) : (EW_DT(dt, CT))0;      \
        (void)A; (void)B;                                                                    \
        out[i] = EW_DT(dt, SV)(EWF_##name(EW_DT(dt, CT)));                                   \
    }

#ifdef _OPENMP
#define EW_SIMD _Pragma("omp simd")
#define EW_PARALLEL_SIMD _Pragma("omp parallel for simd schedule(static)")
#elif defined(__GNUC__)
#define EW_SIMD _Pragma("GCC ivdep")
#define EW_PARALLEL_SIMD _Pragma("GCC ivdep")
#else
#define EW_SIMD
#define EW_PARALLEL_SIMD
#endif

#define EW_DEFINE_LAUNCHER(name, inputs, dt)                                                 \
    static int ew_cpu_##name##_##dt(const void *argp)                                        \
    {                                                                                        \
        const ew_args *args = (const ew_args *)argp;                                         \
        const int64_t n = args->n;                                                           \
        const EW_DT(dt, ST) *a = (const EW_DT(dt, ST) *)args->in[0];                         \
        const EW_DT(dt, ST) *b = (const EW_DT(dt, ST) *)args->in[1];                         \
        EW_DT(dt, ST) *out = (EW_DT(dt, ST) *)args->out;                                     \
        const EW_DT(dt, CT) C0 = (inputs) == 0 ? EW_DT(dt, FS)(args->scalar[0])             \
                                               : EW_DT(dt, CS)(args->scalar[0]);             \
        const EW_DT(dt, CT) C1 = EW_DT(dt, CS)(args->scalar[1]);                             \
        (void)a; (void)b; (void)C0; (void)C1;                                                \
        if (n <= 0)                                                                          \
            return n == 0 ? 0 : EINVAL;                                                      \
        if (!out || ((inputs) >= 1 && !a) || ((inputs) >= 2 && !b))                          \
            return EINVAL;                                                                   \
        if (n < EWP_##name) {                                                                \
            EW_SIMD                                                                          \
            for (int64_t i = 0; i < n; i++)                                                  \
                EW_BODY(name, inputs, dt)                                                    \
        } else {                                                                             \
            EW_PARALLEL_SIMD                                                                 \
            for (int64_t i = 0; i < n; i++)                                                  \
                EW_BODY(name, inputs, dt)                                                    \
        }                                                                                    \
        return 0;                                                                            \
    }

#define EW_OP(name, inputs, scalars, def)                                                    \
    EW_DEFINE_LAUNCHER(name, inputs, f32)                                                    \
    EW_DEFINE_LAUNCHER(name, inputs, f16)                                                    \
    EW_DEFINE_LAUNCHER(name, inputs, bf16)                                                   \
    EW_DEFINE_LAUNCHER(name, inputs, f64)
#include "../ops.def"
#undef EW_OP

/* ---- the table ------------------------------------------------------------------------- */

#define EW_ABOUT_AUTO                                                                        \
    "OpenMP + compiler-vectorised loop (threads from 2^15 elements, 2^12 for libm ops); "    \
    "f16/bf16 via branch-free converters, computed in float"

#define EW_ROW(name, dt)                                                                     \
    {#name, "auto", EW_DT(dt, ENUM), ew_cpu_##name##_##dt, NULL, 0, EW_ABOUT_AUTO},

static const ew_kernel ew_cpu_elementwise_rows[] = {
#define EW_OP(name, inputs, scalars, def)                                                    \
    EW_ROW(name, f32) EW_ROW(name, f16) EW_ROW(name, bf16) EW_ROW(name, f64)
#include "../ops.def"
#undef EW_OP
};

const ew_kernel *ew_cpu_elementwise_table(int *count)
{
    *count = (int)(sizeof ew_cpu_elementwise_rows / sizeof ew_cpu_elementwise_rows[0]);
    return ew_cpu_elementwise_rows;
}
