/*
 * elementwise_grads.cuh: the math of every backward op of grads.def (elementwise_backward.cu), one
 * Grad_<name> functor per op: NIN arrays in (grad first, then what the forward saved), NOUT
 * gradients out, KIND_GRAD, and operator()(x, y, s0, s1) on the compute type (float for
 * float32/float16/bfloat16, double for float64). The formulas and their rounding order are those of
 * the CPU kernels (csrc/cpu/backward.c), so both backends meet grads.def's bounds the same way,
 * except where MathOf picks a cheaper SFU form inside the same bound (gelu for float, gelu, silu
 * and erf for 16-bit results). Device code only.
 */
#ifndef EWKERN_ELEMENTWISE_GRADS_CUH
#define EWKERN_ELEMENTWISE_GRADS_CUH

#include "elementwise_types.cuh"
#include "elementwise_ops.cuh"

namespace ewk {

/* 1 / sqrt(2 pi), 2 / sqrt(pi) */
template <class C> EW_DEV C inv_sqrt_2pi() { return C(0.398942280401432677939946059934381868); }
template <class C> EW_DEV C two_over_sqrt_pi() { return C(1.12837916709551257389615890312154517); }

/* e^(-a^2 scale) with a^2 = p + e split exactly (e = fma(a, a, -p)): e^(-p scale) (1 - e scale) to
 * first order, so the rounding of a^2 (relative 2^-24 of an exponent that reaches 100 in float)
 * costs nothing; a = +-inf gives 0 (no inf - inf). */
template <class C>
EW_DEV C gauss(C a, C scale)
{
    const C p = a * a;
    const C e = p < C(INFINITY) ? m_fma(a, a, -p) : C(0);
    return m_exp(-p * scale) * (C(1) - e * scale);
}

#define EWK_GRAD(NAME, NIN_, NOUT_) \
    struct Grad_##NAME { \
        enum { NIN = NIN_, NOUT = NOUT_, KIND = KIND_GRAD }; \
        template <class C> EW_DEV void operator()(const C (&x)[NIN_], C (&y)[NOUT_], C s0, C s1) const; \
    }; \
    template <class C> EW_DEV void Grad_##NAME::operator()(const C (&x)[NIN_], C (&y)[NOUT_], C s0, C s1) const

/* Phi(a) + a phi(a): erfc for Phi (no cancellation in 1 + erf for a < 0), the split square for phi */
EWK_GRAD(gelu, 2, 1)
{
    const C g = x[0], a = x[1];
    const C cdf = C(0.5) * m_erfc(-a * Rsqrt2<C>::hi());
    const C pdf = gauss(a, C(0.5)) * inv_sqrt_2pi<C>();
    y[0] = g * m_fma(a, pdf, cdf);
}
/* s (1 + a (1 - s)) with s = sigmoid(a) and 1 - s = sigmoid(-a) each formed from e = e^-|a|
 * (1 - s from a rounded s cancels for a >> 0, where a (1 - s) still counts) */
EWK_GRAD(silu, 2, 1)
{
    const C g = x[0], a = x[1];
    const C e = m_exp(-m_abs(a));
    const C r = C(1) / (C(1) + e);
    const C s = a >= C(0) ? r : e * r, t = a >= C(0) ? e * r : r;
    y[0] = g * (s * m_fma(a, t, C(1)));
}
EWK_GRAD(sigmoid, 2, 1) { y[0] = x[0] * (x[1] * (C(1) - x[1])); }
EWK_GRAD(tanh, 2, 1) { y[0] = x[0] * m_fma(-x[1], x[1], C(1)); }
EWK_GRAD(erf, 2, 1) { y[0] = x[0] * (gauss(x[1], C(1)) * two_over_sqrt_pi<C>()); }
EWK_GRAD(exp, 2, 1) { y[0] = x[0] * x[1]; }
EWK_GRAD(log, 2, 1) { y[0] = x[0] / x[1]; }
EWK_GRAD(sqrt, 2, 1) { y[0] = x[0] / (x[1] + x[1]); }
/* each product between -g/2 and the result: no spurious overflow of y^3 */
EWK_GRAD(rsqrt, 2, 1) { y[0] = ((C(-0.5) * x[0] * x[1]) * x[1]) * x[1]; }
EWK_GRAD(abs, 2, 1)
{
    const C a = x[1];
    y[0] = x[0] * (a != a ? a : C((a > C(0)) - (a < C(0))));
}
EWK_GRAD(relu, 2, 1) { y[0] = x[1] <= C(0) ? C(0) : x[0]; }
EWK_GRAD(mul, 3, 2)
{
    y[0] = x[0] * x[2];
    y[1] = x[0] * x[1];
}
EWK_GRAD(div, 3, 2)
{
    const C q = x[0] / x[2];
    y[0] = q;
    y[1] = -(q * x[1]) / x[2];
}
/* torch's rule: a tie splits grad in halves, the losing side gets 0, NaN loses nowhere */
EWK_GRAD(maximum, 3, 2)
{
    const C a = x[1], b = x[2];
    const C h = a == b ? x[0] * C(0.5) : x[0];
    y[0] = a < b ? C(0) : h;
    y[1] = a > b ? C(0) : h;
}
EWK_GRAD(minimum, 3, 2)
{
    const C a = x[1], b = x[2];
    const C h = a == b ? x[0] * C(0.5) : x[0];
    y[0] = a > b ? C(0) : h;
    y[1] = a < b ? C(0) : h;
}
EWK_GRAD(axpby, 1, 2)
{
    y[0] = s0 * x[0];
    y[1] = s1 * x[0];
}
#undef EWK_GRAD

/* gelu_backward for float16/bfloat16 results: the fitted erfc of Op_gelu_h16 (elementwise_ops.cuh),
 * erfc(z) = t 2^(-z^2 log2 e) 2^(s Q(s)), z = |a| / sqrt 2, on the SFU, with E = 2^(-z^2 log2 e + 32)
 * = e^(-a^2 / 2) 2^32 kept apart so that phi shares it:
 *     a < 0:  E 2^-32 (t F / 2 + a / sqrt(2 pi))        (Phi = t E F 2^-32 / 2)
 *     a >= 0: 1 + E 2^-32 (a / sqrt(2 pi) - t F / 2)     (Phi = 1 - t E F 2^-32 / 2)
 * F = 2^(s Q(s)). Relative errors about 2^-17 (the fit, z^2 log2 e rounded for |a| < 16), far
 * under half a 16-bit ulp of the terms' sizes; the 2^32 keeps E normal until the one scaling. */
struct Grad_gelu_h16 {
    enum { NIN = 2, NOUT = 1, KIND = KIND_GRAD };
    EW_DEV void operator()(const float (&x)[2], float (&y)[1], float, float) const
    {
        const float g = x[0], a = x[1];
        const float z = fabsf(a) * kRsqrt2;
        float t, s;
        const float q = erfc_fit_h16(z, t, s);
        const float e = ex2_approx_ftz(fmaf(z * z, -kLog2e, 32.0f));
        const float h = 0.5f * t * ex2_approx_ftz(s * q);
        const float u = fmaf(a, 0.398942280401432678f, a < 0.0f ? h : -h);
        y[0] = g * (a < 0.0f ? (u * e) * 0x1p-32f : fmaf(u, e * 0x1p-32f, 1.0f));
    }
};
/* gelu_backward for float results: the same split with Op_gelu_f32's fit (elementwise_ops.cuh):
 * degree 10 (6e-9 relative), t to 0.5 ulp by one Newton step, z clamped to 16 (E and erfc
 * underflow to 0 long before), both exponentials on the SFU (ex2.approx, 2 ulp). libdevice's erfcf
 * and expf made float32 gelu_backward compute-bound on the H200 (0.94 of torch at 256 MiB, the
 * train experiment). The rounding of z^2 and the exponent costs about a^2 / 2 ulp for a << 0, inside
 * grads.def's 4 + 2 a^2. */
struct Grad_gelu_f32 {
    enum { NIN = 2, NOUT = 1, KIND = KIND_GRAD };
    EW_DEV void operator()(const float (&x)[2], float (&y)[1], float, float) const
    {
        const float g = x[0], a = x[1];
        const float z = fminf(fabsf(a) * kRsqrt2, 16.0f);
        float t, s;
        const float q = erfc_fit_f32(z, t, s);
        const float e = ex2_approx(z * z * -kLog2e);                 /* e^(-a^2 / 2) */
        const float h = 0.5f * t * ex2_approx(s * q);                /* Phi(-|a|) / e */
        const float u = fmaf(a, 0.398942280401432678f, a < 0.0f ? h : -h);
        y[0] = g * (a < 0.0f ? u * e : fmaf(u, e, 1.0f));
    }
};
/* silu_backward and erf_backward for float16/bfloat16 results: e^x on the SFU (ex2.approx, 2^-22
 * relative) and the reciprocal by rcp.approx (1 ulp): errors far under half a 16-bit ulp. */
struct Grad_silu_h16 {
    enum { NIN = 2, NOUT = 1, KIND = KIND_GRAD };
    EW_DEV void operator()(const float (&x)[2], float (&y)[1], float, float) const
    {
        const float g = x[0], a = x[1];
        const float e = exp_neg_abs_sfu(a);
        const float r = rcp_approx_ftz(1.0f + e);
        const float s = a >= 0.0f ? r : e * r, t = a >= 0.0f ? e * r : r;
        y[0] = g * (s * fmaf(a, t, 1.0f));
    }
};
struct Grad_erf_h16 {
    enum { NIN = 2, NOUT = 1, KIND = KIND_GRAD };
    EW_DEV void operator()(const float (&x)[2], float (&y)[1], float, float) const
    {
        const float a = x[1];
        y[0] = x[0] * (ex2_approx(-(a * a) * kLog2e) * 1.12837916709551257f);
    }
};
/* gelu_backward for float64 results: gelu_grad_f64 (elementwise_ops.cuh), float64 gelu's core with
 * its coefficients in __constant__ memory; defined, and its kernels made, only in
 * elementwise_gelu64.cu (EWK_GELU64_HERE), as the forward's Op_gelu_f64: a kernel file without the
 * coefficients that instantiated it would fail to link. */
struct Grad_gelu_f64 {
    enum { NIN = 2, NOUT = 1, KIND = KIND_GRAD };
    EW_DEV void operator()(const double (&x)[2], double (&y)[1], double, double) const;
};
#ifdef EWK_GELU64_HERE
EW_DEV void Grad_gelu_f64::operator()(const double (&x)[2], double (&y)[1], double, double) const
{
    y[0] = gelu_grad_f64(x[0], x[1], kGelu64P, kExp64Q);
}
#endif
template <> struct MathOf<Grad_gelu, double> { typedef Grad_gelu_f64 type; };
template <> struct MathOf<Grad_gelu, float> { typedef Grad_gelu_f32 type; };
template <> struct MathOf<Grad_gelu, half_t> { typedef Grad_gelu_h16 type; };
template <> struct MathOf<Grad_gelu, bf16_t> { typedef Grad_gelu_h16 type; };
template <> struct MathOf<Grad_silu, half_t> { typedef Grad_silu_h16 type; };
template <> struct MathOf<Grad_silu, bf16_t> { typedef Grad_silu_h16 type; };
template <> struct MathOf<Grad_erf, half_t> { typedef Grad_erf_h16 type; };
template <> struct MathOf<Grad_erf, bf16_t> { typedef Grad_erf_h16 type; };
/* libm-class math per element (auto's launch rule for 16-bit types, as for the forward ops) */
template <> struct Heavy<Grad_gelu> { enum { value = 1 }; };
template <> struct Heavy<Grad_gelu_h16> { enum { value = 1 }; };
template <> struct Heavy<Grad_gelu_f32> { enum { value = 1 }; };
template <> struct Heavy<Grad_silu> { enum { value = 1 }; };
template <> struct Heavy<Grad_silu_h16> { enum { value = 1 }; };
template <> struct Heavy<Grad_erf> { enum { value = 1 }; };

} /* namespace ewk */

#endif /* EWKERN_ELEMENTWISE_GRADS_CUH */
