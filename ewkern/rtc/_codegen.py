"""Source generation for run-time kernels: one C++ body, two backends.

The user's operation runs once per loop index ``i`` with every non-raw parameter as a local of
its compute type (float for float16/bfloat16, loaded and rounded back to nearest even on the
store), raw parameters as ``ewrtc::Raw`` views (``y[k]``, ``y.size()``, ``y.shape()[d]``) and
``_ind.size()`` the loop size. The same body is compiled

- for the CPU (``cpu_*``): an ``extern "C"`` function over the whole loop (OpenMP when the
  compiler has it), built by the system C++ compiler;
- for CUDA: where every non-raw array is C-contiguous over the loop and the arrays' vectors can
  be aligned together, the default path's body (``vector_source``: vectors of 16 bytes of the
  widest array, 1, 2 or 4 per thread by auto's launch rule, streaming stores, head and tail on
  spare threads, PDL with an L2 prefetch); otherwise a grid-stride ``extern "C" __global__``
  kernel with a 64-bit index that waits for the previous kernel under programmatic dependent
  launch (the fallback kernel: broadcasting, strided views, misaligned arrays).

Each kernel takes one by-value parameter, a struct whose fields ``fields()`` lists once: the
generator writes it as C++ and ``_kernel.py`` builds the same layout with ctypes.
User code is placed under ``#line`` directives, so compiler messages name the kernel and the line
of its operation.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable

from ._params import DTYPES

# glibc libmvec's vector functions declared for the CPU build (EWRTC_MVEC: _build.cpu_target's tier)
MVEC_DECLS = r"""
#if defined(EWRTC_MVEC) && defined(_OPENMP)
/* glibc's libmvec: vector versions of these functions, called from omp simd loops (the x86_64
   vector function ABI); <math.h> declares them only under -ffast-math */
#define EWRTC_VEC(fn) \
    _Pragma("omp declare simd notinbranch") float fn##f(float) noexcept; \
    _Pragma("omp declare simd notinbranch") double fn(double) noexcept;
extern "C" {
EWRTC_VEC(exp) EWRTC_VEC(log) EWRTC_VEC(sin) EWRTC_VEC(cos)
#if EWRTC_MVEC >= 2
EWRTC_VEC(erf) EWRTC_VEC(erfc) EWRTC_VEC(tanh) EWRTC_VEC(expm1) EWRTC_VEC(log1p) EWRTC_VEC(exp2)
EWRTC_VEC(log2) EWRTC_VEC(log10) EWRTC_VEC(sinh) EWRTC_VEC(cosh) EWRTC_VEC(tan) EWRTC_VEC(atan)
EWRTC_VEC(asin) EWRTC_VEC(acos) EWRTC_VEC(cbrt)
#endif
}
#undef EWRTC_VEC
#endif
"""

# CUDA's math functions and intrinsics that the C++ library lacks, for the CPU build: the same
# values where CUDA's are exact or correctly rounded, and the exact functions for CUDA's fast
# approximations (__expf: expf). They live in namespace ewrtc::cm and are reached by macros:
# glibc's <math.h> declares some of these names itself (__expf, __sinf ... as its internal
# functions, without a definition to link; sinpi and cospi from glibc 2.41), which a definition of
# the same name could not follow.
CUDA_MATH_CPU = r"""
namespace ewrtc { namespace cm {
static inline float expf_(float x) { return std::exp(x); }
static inline float exp10f_(float x) { return std::pow(10.0f, x); }
static inline float logf_(float x) { return std::log(x); }
static inline float log2f_(float x) { return std::log2(x); }
static inline float log10f_(float x) { return std::log10(x); }
static inline float sinf_(float x) { return std::sin(x); }
static inline float cosf_(float x) { return std::cos(x); }
static inline float tanf_(float x) { return std::tan(x); }
static inline void sincosf_(float x, float *s, float *c) { *s = std::sin(x); *c = std::cos(x); }
static inline float powf_(float x, float y) { return std::pow(x, y); }
static inline float fdividef(float x, float y) { return x / y; }
static inline float frcp(float x) { return 1.0f / x; }
static inline float fsqrt(float x) { return std::sqrt(x); }
static inline float frsqrt(float x) { return 1.0f / std::sqrt(x); }
/* x clamped to [0, 1]; a NaN gives 0 */
static inline float saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }
static inline double rcbrt(double x) { return 1.0 / std::cbrt(x); }
static inline float rcbrt(float x) { return 1.0f / std::cbrt(x); }
static inline float rcbrtf(float x) { return 1.0f / std::cbrt(x); }
static inline double exp10(double x) { return std::pow(10.0, x); }
static inline float exp10(float x) { return std::pow(10.0f, x); }
static inline float exp10f(float x) { return std::pow(10.0f, x); }
/* sin(pi x) and cos(pi x) without pi x's rounding: x reduced modulo 2 (exact), then an octant */
static inline double sinpi(double x)
{
    if (!std::isfinite(x)) return x - x;
    const double r = std::fmod(x, 2.0), a = std::fabs(r), pi = 3.14159265358979323846;
    double s;
    if (a <= 0.25) s = std::sin(pi * a);
    else if (a <= 0.75) s = std::cos(pi * (a - 0.5));
    else if (a <= 1.25) s = std::sin(pi * (1.0 - a));
    else if (a <= 1.75) s = -std::cos(pi * (a - 1.5));
    else s = -std::sin(pi * (2.0 - a));
    return std::copysign(1.0, r) * s;
}
static inline double cospi(double x)
{
    if (!std::isfinite(x)) return x - x;
    const double a = std::fabs(std::fmod(x, 2.0)), pi = 3.14159265358979323846;
    if (a <= 0.25) return std::cos(pi * a);
    if (a <= 0.75) return -std::sin(pi * (a - 0.5)) + 0.0;
    if (a <= 1.25) return -std::cos(pi * (a - 1.0));
    if (a <= 1.75) return std::sin(pi * (a - 1.5)) + 0.0;
    return std::cos(pi * (2.0 - a));
}
static inline float sinpi(float x) { return (float)sinpi((double)x); }
static inline float cospi(float x) { return (float)cospi((double)x); }
static inline float sinpif(float x) { return (float)sinpi((double)x); }
static inline float cospif(float x) { return (float)cospi((double)x); }
static inline void sincospi(double x, double *s, double *c) { *s = sinpi(x); *c = cospi(x); }
static inline void sincospif(float x, float *s, float *c) { *s = sinpif(x); *c = cospif(x); }
/* the inverse of erfc on (0, 2): Newton's method on log(erfc(x)) (well conditioned from the
   tails to 0), from Giles' approximation ("Approximating the erfinv function", 2010) in the
   middle or the tail's asymptote erfc(x) ~ exp(-x^2) / (x sqrt(pi)) for z < 2^-40 */
static inline double erfcinv(double z)
{
    if (!(z >= 0.0 && z <= 2.0)) return NAN;
    if (z == 0.0) return INFINITY;
    if (z == 2.0) return -INFINITY;
    if (z > 1.0) return -erfcinv(2.0 - z);   /* 2 - z exact */
    double x;
    if (z > 0x1p-40) {
        double w = -std::log(z * (2.0 - z)), p;
        if (w < 5.0) {
            w -= 2.5;
            p = 2.81022636e-08; p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w;
            p = -4.39150654e-06 + p * w; p = 0.00021858087 + p * w; p = -0.00125372503 + p * w;
            p = -0.00417768164 + p * w; p = 0.246640727 + p * w; p = 1.50140941 + p * w;
        } else {
            w = std::sqrt(w) - 3.0;
            p = -0.000200214257; p = 0.000100950558 + p * w; p = 0.00134934322 + p * w;
            p = -0.00367342844 + p * w; p = 0.00573950773 + p * w; p = -0.0076224613 + p * w;
            p = 0.00943887047 + p * w; p = 1.00167406 + p * w; p = 2.83297682 + p * w;
        }
        x = p * (1.0 - z);
    } else {
        const double t = -std::log(z);
        x = std::sqrt(t);
        for (int k = 0; k < 3; ++k) x = std::sqrt(t - std::log(x * 1.7724538509055160273));
    }
    const double lz = std::log(z);
    for (int k = 0; k < 8; ++k) {
        const double e = std::erfc(x), g = std::exp(-x * x);
        /* erfc(x) / erfc'(x) = -e / (2 / sqrt(pi) g); past the underflow of g or e, the limits by
           the asymptote (-1 / (2x); log e = -x^2 - log(x sqrt(pi))) */
        const double ratio = g > 0.0 && e > 0.0 ? e / (1.1283791670955125739 * g) : 0.5 / x;
        const double le = e > 0.0 ? std::log(e) : -x * x - std::log(x * 1.7724538509055160273);
        const double dx = (le - lz) * ratio;
        x += dx;
        if (!(std::fabs(dx) > 1e-17 * std::fabs(x))) break;
    }
    return x;
}
/* the inverse of erf on (-1, 1): Newton on erf(x) - y for |y| <= 1/2, erfcinv(1 - |y|) past it
   (1 - |y| exact there) */
static inline double erfinv(double y)
{
    if (!(y >= -1.0 && y <= 1.0)) return NAN;
    if (std::fabs(y) > 0.5) return std::copysign(erfcinv(1.0 - std::fabs(y)), y);
    if (y == 0.0) return y;
    double w = -std::log((1.0 - y) * (1.0 + y)) - 2.5, p;
    p = 2.81022636e-08; p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w; p = 0.00021858087 + p * w; p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w; p = 0.246640727 + p * w; p = 1.50140941 + p * w;
    double x = p * y;
    for (int k = 0; k < 4; ++k) {
        const double dx = (std::erf(x) - y) / (1.1283791670955125739 * std::exp(-x * x));
        x -= dx;
        if (!(std::fabs(dx) > 1e-17 * std::fabs(x))) break;
    }
    return x;
}
static inline float erfinv(float y) { return (float)erfinv((double)y); }
static inline float erfcinv(float z) { return (float)erfcinv((double)z); }
static inline float erfinvf(float y) { return (float)erfinv((double)y); }
static inline float erfcinvf(float z) { return (float)erfcinv((double)z); }
/* the standard normal distribution function and its inverse */
static inline double normcdf(double x) { return 0.5 * std::erfc(-x * 0.70710678118654752440); }
static inline float normcdf(float x) { return (float)normcdf((double)x); }
static inline float normcdff(float x) { return (float)normcdf((double)x); }
static inline double normcdfinv(double p) { return -1.41421356237309504880 * erfcinv(2.0 * p); }
static inline float normcdfinv(float p) { return (float)normcdfinv((double)p); }
static inline float normcdfinvf(float p) { return (float)normcdfinv((double)p); }
/* erfc(x) exp(x^2): the product below 26, the asymptotic series (continued to 4 terms) past it */
static inline double erfcx(double x)
{
    if (x < 26.0) return std::exp(x * x) * std::erfc(x);
    const double t = 1.0 / (2.0 * x * x);
    return 0.56418958354775628695 / x * (1.0 - t * (1.0 - 3.0 * t * (1.0 - 5.0 * t)));
}
static inline float erfcx(float x) { return (float)erfcx((double)x); }
static inline float erfcxf(float x) { return (float)erfcx((double)x); }
/* Euclidean norms (std::hypot's scaling: no overflow or underflow between) and their reciprocals */
static inline double norm3d(double a, double b, double c) { return std::hypot(a, b, c); }
static inline float norm3d(float a, float b, float c) { return (float)std::hypot((double)a, (double)b, (double)c); }
static inline float norm3df(float a, float b, float c) { return norm3d(a, b, c); }
static inline double rnorm3d(double a, double b, double c) { return 1.0 / std::hypot(a, b, c); }
static inline float rnorm3d(float a, float b, float c) { return (float)(1.0 / std::hypot((double)a, (double)b, (double)c)); }
static inline float rnorm3df(float a, float b, float c) { return rnorm3d(a, b, c); }
static inline double norm4d(double a, double b, double c, double d) { return std::hypot(std::hypot(a, b, c), d); }
static inline float norm4d(float a, float b, float c, float d) { return (float)norm4d((double)a, (double)b, (double)c, (double)d); }
static inline float norm4df(float a, float b, float c, float d) { return norm4d(a, b, c, d); }
static inline double rhypot(double a, double b) { return 1.0 / std::hypot(a, b); }
static inline float rhypot(float a, float b) { return (float)(1.0 / std::hypot((double)a, (double)b)); }
static inline float rhypotf(float a, float b) { return rhypot(a, b); }
} }
#define __expf ewrtc::cm::expf_
#define __exp10f ewrtc::cm::exp10f_
#define __logf ewrtc::cm::logf_
#define __log2f ewrtc::cm::log2f_
#define __log10f ewrtc::cm::log10f_
#define __sinf ewrtc::cm::sinf_
#define __cosf ewrtc::cm::cosf_
#define __tanf ewrtc::cm::tanf_
#define __sincosf ewrtc::cm::sincosf_
#define __powf ewrtc::cm::powf_
#define __fdividef ewrtc::cm::fdividef
#define __saturatef ewrtc::cm::saturatef
#define __frcp_rn ewrtc::cm::frcp
#define __fsqrt_rn ewrtc::cm::fsqrt
#define __frsqrt_rn ewrtc::cm::frsqrt
#define rcbrt ewrtc::cm::rcbrt
#define rcbrtf ewrtc::cm::rcbrtf
#define exp10 ewrtc::cm::exp10
#define exp10f ewrtc::cm::exp10f
#define sinpi ewrtc::cm::sinpi
#define cospi ewrtc::cm::cospi
#define sinpif ewrtc::cm::sinpif
#define cospif ewrtc::cm::cospif
#define sincospi ewrtc::cm::sincospi
#define sincospif ewrtc::cm::sincospif
#define erfinv ewrtc::cm::erfinv
#define erfcinv ewrtc::cm::erfcinv
#define erfinvf ewrtc::cm::erfinvf
#define erfcinvf ewrtc::cm::erfcinvf
#define normcdf ewrtc::cm::normcdf
#define normcdff ewrtc::cm::normcdff
#define normcdfinv ewrtc::cm::normcdfinv
#define normcdfinvf ewrtc::cm::normcdfinvf
#define erfcx ewrtc::cm::erfcx
#define erfcxf ewrtc::cm::erfcxf
#define norm3d ewrtc::cm::norm3d
#define norm3df ewrtc::cm::norm3df
#define rnorm3d ewrtc::cm::rnorm3d
#define rnorm3df ewrtc::cm::rnorm3df
#define norm4d ewrtc::cm::norm4d
#define norm4df ewrtc::cm::norm4df
#define rhypot ewrtc::cm::rhypot
#define rhypotf ewrtc::cm::rhypotf
"""

PRELUDE = r"""
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define EWRTC_FN __device__ __forceinline__
#define EWRTC_M __device__ __forceinline__
#define EWRTC_CUDA 1
#ifndef INFINITY   /* <cmath>'s, which NVRTC does not include */
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#else
#include <cmath>
#include <cstring>
#include <cstdlib>
#if defined(__F16C__)
#include <immintrin.h>
#endif
@MVEC@
#define EWRTC_FN static inline
#define EWRTC_M inline
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define EWRTC_CUDA 0
using std::exp; using std::log; using std::sqrt; using std::erf; using std::erfc; using std::tanh;
using std::sin; using std::cos; using std::tan; using std::pow; using std::fabs; using std::abs;
using std::floor; using std::ceil; using std::round; using std::fmax; using std::fmin; using std::fma;
using std::exp2; using std::log2; using std::log10; using std::log1p; using std::expm1; using std::isnan;
using std::isinf; using std::isfinite; using std::atan2; using std::sinh; using std::cosh; using std::asin;
using std::acos; using std::atan; using std::cbrt; using std::trunc; using std::rint; using std::fmod;
using std::hypot; using std::copysign;
/* C's signbit and isnormal macros, which <cmath> replaces by std:: functions (CUDA has them
   global). signbit by the sign bit's integer: std::signbit's builtin, vectorised in a float16
   tile loop, is an internal compiler error of gcc 12 (AVX-512) */
using std::isnormal;
static inline bool signbit(float x) { unsigned u; std::memcpy(&u, &x, 4); return (u >> 31) != 0; }
static inline bool signbit(double x) { unsigned long long u; std::memcpy(&u, &x, 8); return (u >> 63) != 0; }
template <class I> static inline bool signbit(I x) { return x < 0; }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
static inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
/* CUDA's max/min: fmax/fmin on floating point (a NaN operand gives the other), < on integers;
   mixed operands in their common type, so max(x, 0.0) of a float x is fmax as CUDA's
   max(float, double) is */
static inline float max(float a, float b) { return std::fmax(a, b); }
static inline double max(double a, double b) { return std::fmax(a, b); }
static inline float min(float a, float b) { return std::fmin(a, b); }
static inline double min(double a, double b) { return std::fmin(a, b); }
namespace ewrtc {
template <class R> static inline R max_of(R a, R b) { return a < b ? b : a; }
template <class R> static inline R min_of(R a, R b) { return b < a ? b : a; }
static inline float max_of(float a, float b) { return std::fmax(a, b); }
static inline double max_of(double a, double b) { return std::fmax(a, b); }
static inline float min_of(float a, float b) { return std::fmin(a, b); }
static inline double min_of(double a, double b) { return std::fmin(a, b); }
}
template <class A, class B> static inline auto max(A a, B b) -> decltype(a + b)
{
    return ewrtc::max_of((decltype(a + b))a, (decltype(a + b))b);
}
template <class A, class B> static inline auto min(A a, B b) -> decltype(a + b)
{
    return ewrtc::min_of((decltype(a + b))a, (decltype(a + b))b);
}
@CUDA_MATH@
#endif
typedef long long ptrdiff_t_ewrtc;
namespace ewrtc {
struct half_bits { unsigned short v; };
struct bf16_bits { unsigned short v; };
EWRTC_FN unsigned fbits(float f)
{
#if EWRTC_CUDA
    return __float_as_uint(f);
#else
    unsigned u; std::memcpy(&u, &f, 4); return u;
#endif
}
EWRTC_FN float bitsf(unsigned u)
{
#if EWRTC_CUDA
    return __uint_as_float(u);
#else
    float f; std::memcpy(&f, &u, 4); return f;
#endif
}
/* c ? x : y for c 0 or 1 without a branch: the CPU's loops that convert vectorise */
EWRTC_FN unsigned sel(unsigned c, unsigned x, unsigned y) { return (x & (0u - c)) | (y & (c - 1u)); }
/* IEEE binary16 <-> float, round to nearest even (on the GPU cvt; the CPU's software form is
   branch-free and gives the bits of the branchy textbook form for every half and every float:
   checked exhaustively, all 2^16 and 2^32; NaNs come out quiet with their payload, as F16C's
   vcvtph2ps and vcvtps2ph give them) */
EWRTC_FN float h2f(unsigned short h)
{
#if EWRTC_CUDA
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#else
    const unsigned em = h & 0x7fffu, m = h & 0x3ffu;
    const unsigned sub = fbits((float)(int)m * 0x1p-24f);   /* subnormal: m 2^-24, a normal float */
    const unsigned inf_nan = (em << 13) | 0x7f800000u | sel(em > 0x7c00u, 0x400000u, 0u);   /* NaNs quiet, as F16C */
    const unsigned r = sel(em >= 0x7c00u, inf_nan, sel(em < 0x400u, sub, (em << 13) + 0x38000000u));
    return bitsf(((unsigned)(h & 0x8000u) << 16) | r);
#endif
}
EWRTC_FN unsigned short f2h(float f)
{
#if EWRTC_CUDA
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
#else
    const unsigned x = fbits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    const unsigned nan = sel(ax > 0x7f800000u, 0x200u | ((ax >> 13) & 0x3ffu), 0u);   /* quiet, payload kept */
    const unsigned sub = fbits(bitsf(ax) + 0.5f) - 0x3f000000u;   /* below 2^-14: rounds at 2^-24 */
    const unsigned nrm = (ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13;   /* rebias, round half to even */
    return (unsigned short)(sign | sel(ax >= 0x477ff000u, 0x7c00u | nan, sel(ax < 0x38800000u, sub, nrm)));
#endif
}
EWRTC_FN float b2f(unsigned short b) { return bitsf((unsigned)b << 16); }
EWRTC_FN unsigned short f2b(float f)
{
#if EWRTC_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f)); return b;   /* one instruction */
#endif
    const unsigned x = fbits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
#if !EWRTC_CUDA
/* n halves to floats and back, 8 at a time by F16C where the build has it (the same bits as h2f
   and f2h: exact widening; round to nearest even, NaNs quiet with the payload's top bits); the
   CPU's elementwise loops convert float16 tiles with these (gcc does not vectorise h2f/f2h's
   integer forms into F16C) */
EWRTC_FN void h2f_n(const half_bits *p, float *f, long long n)
{
    long long j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(f + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + j))));
#endif
#if defined(__F16C__)
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(f + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + j))));
#endif
    for (; j < n; ++j)
        f[j] = h2f(p[j].v);
}
EWRTC_FN void f2h_n(const float *f, half_bits *p, long long n)
{
    long long j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16)
        _mm256_storeu_si256((__m256i *)(p + j), _mm512_cvtps_ph(_mm512_loadu_ps(f + j), _MM_FROUND_TO_NEAREST_INT));
#endif
#if defined(__F16C__)
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(p + j), _mm256_cvtps_ph(_mm256_loadu_ps(f + j), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; j < n; ++j)
        p[j].v = f2h(f[j]);
}
/* EWRTC_HV halves to floats and back, one instruction each way (16 by AVX-512F, 8 by F16C; 0:
   neither, the loops then take h2f_n / f2h_n alone): the elementwise loops' fixed-size chunks */
#if defined(__AVX512F__)
#define EWRTC_HV 16
EWRTC_FN void h2f_v(const half_bits *p, float *f)
{
    _mm512_storeu_ps(f, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)));
}
EWRTC_FN void f2h_v(const float *f, half_bits *p)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(_mm512_loadu_ps(f), _MM_FROUND_TO_NEAREST_INT));
}
#elif defined(__F16C__)
#define EWRTC_HV 8
EWRTC_FN void h2f_v(const half_bits *p, float *f)
{
    _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
}
EWRTC_FN void f2h_v(const float *f, half_bits *p)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(_mm256_loadu_ps(f), _MM_FROUND_TO_NEAREST_INT));
}
#else
#define EWRTC_HV 0
#endif
#endif
EWRTC_FN float ld(const half_bits *p) { return h2f(p->v); }
EWRTC_FN float ld(const bf16_bits *p) { return b2f(p->v); }
template <class S> EWRTC_FN S ld(const S *p) { return *p; }
/* ld for a loop that does not vectorise (a CPU reduction's, element by element): a half by F16C's
   one-element vcvtph2ps where the build has it (h2f's bits), not h2f's integer form, which only
   pays where gcc vectorises it */
#if !EWRTC_CUDA && defined(__F16C__)
EWRTC_FN float ld1(const half_bits *p) { return _cvtsh_ss(p->v); }
#else
EWRTC_FN float ld1(const half_bits *p) { return h2f(p->v); }
#endif
template <class S> EWRTC_FN auto ld1(const S *p) { return ld(p); }
EWRTC_FN void st(half_bits *p, float v) { p->v = f2h(v); }
EWRTC_FN void st(bf16_bits *p, float v) { p->v = f2b(v); }
template <class S, class V> EWRTC_FN void st(S *p, V v) { *p = (S)v; }
/* an element of a raw 16-bit array: reads convert to float, writes round */
template <class S, class C> struct Ref {
    S *p;
    EWRTC_M operator C() const { return ld(p); }
    EWRTC_M Ref &operator=(C v) { st(p, v); return *this; }
    EWRTC_M Ref &operator=(const Ref &o) { st(p, (C)o); return *this; }
    EWRTC_M Ref &operator+=(C v) { st(p, ld(p) + v); return *this; }
    EWRTC_M Ref &operator-=(C v) { st(p, ld(p) - v); return *this; }
    EWRTC_M Ref &operator*=(C v) { st(p, ld(p) * v); return *this; }
    EWRTC_M Ref &operator/=(C v) { st(p, ld(p) / v); return *this; }
};
/* a raw parameter: C-contiguous, indexed by its flat (row-major) element index */
template <class S, class C> struct Raw {
    S *p; long long n; int nd; const long long *shp;
    EWRTC_M long long size() const { return n; }
    EWRTC_M int ndim() const { return nd; }
    EWRTC_M const long long *shape() const { return shp; }
    EWRTC_M Ref<S, C> operator[](long long k) const { return Ref<S, C>{p + k}; }
};
template <class S> struct Raw<S, S> {
    S *p; long long n; int nd; const long long *shp;
    EWRTC_M long long size() const { return n; }
    EWRTC_M int ndim() const { return nd; }
    EWRTC_M const long long *shape() const { return shp; }
    EWRTC_M S &operator[](long long k) const { return p[k]; }
};
struct Ind {
    long long n;
    EWRTC_M long long size() const { return n; }
};
} /* namespace ewrtc */
""".replace("@MVEC@", MVEC_DECLS.strip()).replace("@CUDA_MATH@", CUDA_MATH_CPU.strip())

_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def identifiers(code: str) -> set[str]:
    """The identifiers in code (string and character literals and comments are not removed: a
    conservative answer for deciding what the code may use)."""
    return set(_IDENT.findall(code))


class Layout:
    """The argument struct of one compiled instance. mode is 'contig' (every non-raw array is
    C-contiguous over the whole loop: element i is at i * itemsize), 'vector' (as contig, for
    vector_source: the pointers start at element `head`, where every array's vector is aligned,
    nfast = size - head, the launch's prefetch and store policy (wb); inputs may also broadcast over a loop of
    rows of ccols elements: kind 'bcol' is one row, 'brow' one element per row, 'bone' one
    element), 'rows' (the CPU's form of those broadcasts: shape [rows, cols], no vectors) or
    'strided' (ndim dims with byte strides per array; broadcasting is a stride 0). args: (param, dtype name, 'array' |
    'scalar' | 'raw', raw ndim)."""

    def __init__(self, mode: str, ndim: int, args):
        self.mode = mode
        self.ndim = max(ndim, 1)
        self.args = tuple(args)

    def fields(self):
        """(C++ type, field name, ctypes code, count): the struct's fields in order; count 0 is a
        plain field, count >= 1 an array of that many."""
        f = [("long long", "size", "q", 0), ("long long", "shape", "q", self.ndim)]
        if self.mode == "vector":
            f += [("long long", "head", "q", 0), ("long long", "nfast", "q", 0), ("long long", "prefetch", "q", 0),
                  ("long long", "wb", "q", 0), ("long long", "ccols", "q", 0)]
        for p, dt, kind, rnd in self.args:
            if kind == "scalar":
                f.append((DTYPES[dt][1], "s_" + p.name, "scalar:" + dt, 0))
            elif kind in ("array", "bcol", "brow", "bone", "colsum"):
                f.append(("char *", "p_" + p.name, "P", 0))
                if self.mode == "strided":
                    f.append(("long long", "st_" + p.name, "q", self.ndim))
            else:
                f.append(("char *", "p_" + p.name, "P", 0))
                f.append(("long long", "n_" + p.name, "q", 0))
                f.append(("long long", "shp_" + p.name, "q", max(rnd, 1)))
        return f

    def key(self) -> tuple[Any, ...]:
        return (self.mode, self.ndim, tuple((p.name, dt, kind, rnd) for p, dt, kind, rnd in self.args))


def prefetch_then_wait(src: "Source", cond: str, arrays, at: str, first: str) -> None:
    """The prologue of a kernel launched with PDL: where cond holds, each array's vector at
    index `at` prefetched into L2 (one line per `first` lane), then the wait for the previous
    kernel and the early launch of the next."""
    if arrays:
        src.add(f"    if ({cond}) {{")
        for p, dt, kind, _ in arrays:
            src.add(f"        prefetch_l2_line(_u_{p.name} + {at}, unsigned(sizeof(_U_{p.name})), {first});")
        src.add("    }")
    src.add("    pdl_wait();")
    src.add("    pdl_launch_dependents();")


def struct_source(name: str, layout: Layout) -> str:
    lines = [f"struct {name} {{"]
    for ctype, field, _, count in layout.fields():
        lines.append(f"    {ctype} {field}{'[%d]' % count if count else ''};")
    lines.append("};")
    return "\n".join(lines)


def typedefs(type_map, in_params, in_types, out_params, out_types) -> str:
    out = []
    for letter, dt in type_map:
        out.append(f"typedef {DTYPES[dt][1]} {letter};")
    for k, (p, dt) in enumerate(zip(in_params, in_types)):
        out.append(f"typedef {DTYPES[dt][1]} in{k}_type;")
    for k, (p, dt) in enumerate(zip(out_params, out_types)):
        out.append(f"typedef {DTYPES[dt][1]} out{k}_type;")
    return "\n".join(out)


class Source:
    """Accumulates generated lines; `here()` is the #line value for resuming the generated file."""

    def __init__(self, filename: str):
        self.lines: list[str] = []
        self.filename = filename

    def add(self, text: str) -> None:
        self.lines.extend(text.split("\n"))

    def user(self, code: str, kernel: str, what: str, end: str = "", close: str = "") -> None:
        """code under `#line 1 "<kernel>: <what>"`, then `end` (CuPy puts ';' after a statement);
        close: what ends an expression (its ')'), on a line of its own (past a trailing // comment)
        that is still the user's (line count + 1: _build.explain shows the last line), so that an
        expression cut short (`x *`) is reported in the user's code."""
        self.lines.append(f'#line 1 "{kernel}: {what}"')
        self.lines.extend((code + end).split("\n"))
        if close:
            self.lines.append(close)
        self.lines.append(f'#line {len(self.lines) + 2} "{self.filename}"')

    def init(self, indent: str, acc: str, identity: str, kernel: str, what: str = "identity") -> None:
        """`type_reduce acc = (type_reduce)(identity);` with identity under its own #line."""
        self.add(f"{indent}type_reduce {acc} = (type_reduce)(")
        self.user(identity, kernel, what, close=");")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _offsets(src: Source, layout: Layout, index: str, arrays, suffix: str = "") -> None:
    """Byte offsets _ewrtc_off_<name> of element `index` of each array param (mode 'rows': of row _r,
    column _c, by each input's broadcast kind)."""
    if layout.mode == "rows":
        at = {"array": index, "bcol": "_c", "brow": "_r", "bone": "0"}
        for p, dt, kind, _ in arrays:
            src.add(f"        const long long _ewrtc_off_{p.name}{suffix} = ({at[kind]}) * {DTYPES[dt][2]}LL;")
        return
    if layout.mode == "contig":
        for p, dt, kind, _ in arrays:
            src.add(f"        const long long _ewrtc_off_{p.name}{suffix} = ({index}) * {DTYPES[dt][2]}LL;")
        return
    _unravel(src, index, layout.ndim - 1, arrays, "_ewrtc_off_", suffix)


def _unravel(src: Source, index: str, top: int, arrays, prefix: str, suffix: str = "") -> None:
    """<prefix><name><suffix>: each array's byte offset of the element `index` of a strided
    layout's dimensions 0..top (the index unravelled over them, each array at its own strides)."""
    for p, dt, kind, _ in arrays:
        src.add(f"        long long {prefix}{p.name}{suffix} = 0;")
    # the outermost dimension takes what is left of the index (index < size): no division there,
    # none at all for one dimension (a 64-bit division is a called routine of ~70 instructions)
    src.add(f"        {{ long long _r = {index};")
    src.add(f"          for (int _d = {top}; _d > 0; --_d) {{")
    src.add("            const long long _n = _ewrtc_P.shape[_d], _c = _r % _n; _r /= _n;")
    for p, dt, kind, _ in arrays:
        src.add(f"            {prefix}{p.name}{suffix} += _c * _ewrtc_P.st_{p.name}[_d];")
    src.add("          }")
    for p, dt, kind, _ in arrays:
        src.add(f"          {prefix}{p.name}{suffix} += _r * _ewrtc_P.st_{p.name}[0];")
    src.add("        }")


def _loads(src: Source, layout: Layout, ld: str = "ld") -> list:
    """Declare every parameter for the body (the arrays' elements by ewrtc::<ld>: ld1 in a loop
    that does not vectorise); returns the outputs to store afterwards."""
    stores = []
    for p, dt, kind, rnd in layout.args:
        S, C = DTYPES[dt][0], DTYPES[dt][1]
        if kind == "scalar":
            src.add(f"        const {C} {p.name} = _ewrtc_P.s_{p.name};")
        elif kind in ("array", "bcol", "brow", "bone"):
            q = "" if p.is_output else "const "
            src.add(f"        {q}{C} {p.name} = ewrtc::{ld}(({S} *)(_ewrtc_P.p_{p.name} + _ewrtc_off_{p.name}));")
            if p.is_output:
                stores.append((p, S))
        else:
            src.add(f"        const ewrtc::Raw<{S}, {C}> {p.name} = {{({S} *)_ewrtc_P.p_{p.name}, _ewrtc_P.n_{p.name}, {max(rnd, 1)}, "
                    f"_ewrtc_P.shp_{p.name}}};")
    return stores


def elementwise_source(backend: str, name: str, layout: Layout, operation: str, preamble: str, loop_prep: str,
                       after_loop: str, tdefs: str) -> tuple[str, str]:
    """(source, entry symbol) of an elementwise kernel for backend 'cpu' or 'cuda'."""
    fname = f"{name}.{'cpp' if backend == 'cpu' else 'cu'}"
    entry = f"ewrtc_{name}"
    src = Source(fname)
    src.add(PRELUDE)
    src.add(tdefs)
    src.add(struct_source("ewrtc_params", layout))
    if preamble:
        src.user(preamble, name, "preamble")
    arrays = [a for a in layout.args if a[2] in ("array", "bcol", "brow", "bone")]
    # iterations are independent unless the body writes a raw array (it may write any element)
    dense = layout.mode in ("contig", "rows") and not any(k == "raw" for _, _, k, _ in layout.args)
    if backend == "cpu" and dense and any(dt == "float16" and k in ("array", "bcol") for _, dt, k, _ in arrays):
        _cpu_half_tiles(src, entry, name, layout, operation, loop_prep, after_loop, arrays)
        return src.text(), entry
    def body(offsets: bool = True) -> None:   # offsets False: the caller declared _ewrtc_off_<name>
        if offsets:
            _offsets(src, layout, "i", arrays)
        stores = _loads(src, layout)
        src.add("        {")
        src.user(operation, name, "operation", ";")
        src.add("        }")
        for p, S in stores:
            src.add(f"        ewrtc::st(({S} *)(_ewrtc_P.p_{p.name} + _ewrtc_off_{p.name}), {p.name});")
        src.add("    }")

    if backend == "cpu" and layout.mode == "strided" and layout.ndim > 1:
        # by tiles of the last two axes: a tile's start unravelled once (a division per leading
        # dimension), then each array stepped by its own strides; not the per-element unravel (a
        # transposed [1024, 1024] float32 `z = x * y + 1`: 2928 us on the CI host). A tile is one
        # row of the last axis, or where an array steps over more than a cache line along the
        # last axis and less along the one before (a transpose), CPU_STRIDED_TILE x
        # CPU_STRIDED_TILE elements, so that the lines such an array touches along a tile's
        # columns are used again by its next rows (csrc/cpu/CPU_NOTES.md)
        _cpu_entry_head(src, entry, name, loop_prep)
        last = layout.ndim - 1
        T = CPU_STRIDED_TILE
        src.add("    bool _tiled = false;")
        for p, dt, kind, _ in arrays:
            a, b = f"_ewrtc_P.st_{p.name}[{last}]", f"_ewrtc_P.st_{p.name}[{last - 1}]"
            src.add(f"    _tiled = _tiled || (({a} > 64 || {a} < -64) && ({b} < 0 ? -{b} : {b}) < ({a} < 0 ? -{a} : {a}));")
        src.add(f"    const long long _R = _ewrtc_P.shape[{last - 1}], _C = _ewrtc_P.shape[{last}];")
        src.add(f"    const long long _TR = _tiled && _R > 1 ? {T} : 1, _TC = _tiled && _R > 1 ? {T} : _C;")
        src.add("    const long long _nr = (_R + _TR - 1) / _TR, _nc = _C ? (_C + _TC - 1) / _TC : 0;")
        src.add("    const long long _tiles = _R * _C ? _ewrtc_P.size / (_R * _C) * _nr * _nc : 0;")

        def strided_tiles(team: bool) -> None:
            src.add("    for (long long _t = 0; _t < _tiles; ++_t) {")
            src.add("    const long long _o = _t / (_nr * _nc), _rc = _t % (_nr * _nc);")
            src.add("    const long long _r0 = _rc / _nc * _TR, _c0 = _rc % _nc * _TC;")
            src.add("    const long long _r1 = _r0 + _TR < _R ? _r0 + _TR : _R, _c1 = _c0 + _TC < _C ? _c0 + _TC : _C;")
            # the leading dimensions (none for 2-D: _o is 0, and dimension 0 adds nothing)
            _unravel(src, "_o", max(last - 2, 0), arrays, "_ewrtc_tile_")
            src.add("    for (long long _r = _r0; _r < _r1; ++_r) {")
            for p, dt, kind, _ in arrays:
                src.add(f"        const long long _ewrtc_row_{p.name} = _ewrtc_tile_{p.name} + _r * _ewrtc_P.st_{p.name}[{last - 1}];")
            src.add("    for (long long _c = _c0; _c < _c1; ++_c) {")
            src.add("        const long long i = (_o * _R + _r) * _C + _c;")
            for p, dt, kind, _ in arrays:
                src.add(f"        const long long _ewrtc_off_{p.name} = _ewrtc_row_{p.name} + _c * _ewrtc_P.st_{p.name}[{last}];")
            body(offsets=False)
            src.add("    }")
            src.add("    }")
        _cpu_team_loop(src, "parallel for schedule(static)", None, strided_tiles)
    elif backend == "cpu" and layout.mode == "rows":
        # broadcast inputs over rows of _ewrtc_P.shape[1] elements (kinds bcol, brow, bone; the outputs
        # dense): rows split among the threads, a row's columns one simd loop, no index division
        _cpu_entry_head(src, entry, name, loop_prep)

        def rows_loop(team: bool) -> None:
            src.add("    for (long long _r = 0; _r < _ewrtc_P.shape[0]; ++_r) {")
            if dense:
                src.add("#ifdef _OPENMP")
                src.add("#pragma omp simd")
                src.add("#endif")
            src.add("    for (long long _c = 0; _c < _ewrtc_P.shape[1]; ++_c) {")
            src.add("        const long long i = _r * _ewrtc_P.shape[1] + _c;")
            body()
            src.add("    }")
        _cpu_team_loop(src, "parallel for schedule(static)", None, rows_loop)
    elif backend == "cpu":
        _cpu_entry_head(src, entry, name, loop_prep)
        simd = " simd" if dense else ""

        def loop(team: bool) -> None:
            src.add("    for (long long i = 0; i < _ewrtc_P.size; ++i) {")
            body()
        _cpu_team_loop(src, f"parallel for{simd} schedule(static)", "simd" if dense else None, loop)
    else:
        src.add(f'extern "C" __global__ void __launch_bounds__(1024) {entry}(const ewrtc_params _ewrtc_P)')
        src.add("{")
        src.add("#if __CUDA_ARCH__ >= 900")
        src.add('    asm volatile("griddepcontrol.wait;" ::: "memory");')
        src.add('    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");')
        src.add("#endif")
        src.add("    const ewrtc::Ind _ind = {_ewrtc_P.size}; (void)_ind;")
        if loop_prep:
            src.user(loop_prep, name, "loop_prep", ";")
        src.add("    const long long _stride = (long long)gridDim.x * blockDim.x;")
        src.add("    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < _ewrtc_P.size; i += _stride) {")
        body()
    if after_loop:
        src.user(after_loop, name, "after_loop", ";")
    src.add("}")
    return src.text(), entry


CPU_STRIDED_TILE = 32  # rows and columns of a CPU strided kernel's tile where an array is transposed
CPU_HALF_TILE = 512    # elements of a float16 tile converted at once (2 KiB of floats an array)


def _cpu_team_loop(src: Source, pragma: str, one_thread: str | None, loop: Callable[[bool], None]) -> None:
    """The CPU loop that loop(team) writes, twice: under `#pragma omp <pragma> num_threads(_threads)`
    where _threads > 1 (team True), and on the calling thread otherwise (team False; under
    `#pragma omp <one_thread>` where given: simd for a dense loop). One loop with
    `if(parallel: _threads > 1)` opened a parallel region of one thread for the second case:
    libgomp allocates, starts and ends a team on every call (about 0.6 us on the CI host,
    csrc/cpu/team.h: a 16-element `z = x + y` 2.7 us a call against ewkern.add's 0.4). The user's
    code is compiled twice (a compile error in it is reported twice by the compiler, once in the
    message's lines)."""
    src.add("#ifdef _OPENMP")
    src.add("    if (_threads > 1) {")
    src.add(f"#pragma omp {pragma} num_threads(_threads)")
    loop(True)
    src.add("    } else")
    src.add("#endif")
    src.add("    {")
    if one_thread:
        src.add("#ifdef _OPENMP")
        src.add(f"#pragma omp {one_thread}")
        src.add("#endif")
    loop(False)
    src.add("    }")


def _cpu_entry_head(src: Source, entry: str, name: str, loop_prep: str) -> None:
    """The opening of a CPU elementwise entry: its signature, the argument struct copied (stores
    through the arrays' char pointers cannot alias the copy, so the loop keeps the pointers in
    registers and vectorises), _ind, the user's loop_prep."""
    src.add(f'extern "C" void {entry}(const ewrtc_params *_ewrtc_P_, int _threads)')
    src.add("{")
    src.add("    const ewrtc_params _ewrtc_P = *_ewrtc_P_;")
    src.add("    const ewrtc::Ind _ind = {_ewrtc_P.size}; (void)_ind;")
    if loop_prep:
        src.user(loop_prep, name, "loop_prep", ";")


def _cpu_half_tiles(src: Source, entry: str, name: str, layout: Layout, operation: str, loop_prep: str,
                    after_loop: str, arrays) -> None:
    """The CPU body of a contiguous elementwise kernel with float16 arrays: the loop runs over
    tiles of CPU_HALF_TILE elements (split among the threads); each tile's float16 inputs are
    widened into float arrays by F16C (h2f_n), the body runs over the tile as an `omp simd` loop
    with every other array read and written in place, and the float16 outputs are rounded back
    (f2h_n) after it. Outputs the body may read (not only assigned: writes_only) are widened in
    first. The same values as the element-by-element loop: a float16 value is a float in the body
    either way, rounded once where it is stored."""
    half = [a for a in arrays if a[1] == "float16"]
    read = {p.name for p, dt, kind, _ in half if p.is_output and not writes_only(operation, p.name)}
    # (mode 'rows': the same by rows of _ewrtc_P.shape[1] elements, see _cpu_half_tile_loop)
    _cpu_entry_head(src, entry, name, loop_prep)
    _cpu_team_loop(src, "parallel for schedule(static)", None,
                   lambda team: _cpu_half_tile_loop(src, name, layout, operation, half, read))
    if after_loop:
        src.user(after_loop, name, "after_loop", ";")
    src.add("}")


def _cpu_half_tile_loop(src: Source, name: str, layout: Layout, operation: str, half, read) -> None:
    """_cpu_half_tiles' loop over the tiles; in mode 'rows' over the tiles of each row (split among
    the threads by rows), a row's dense and repeated-row ('bcol') float16 arrays in tiles, the
    one-element-a-row and one-element arrays read as they are. A tile runs in chunks of EWRTC_HV
    elements (16 with AVX-512, 8 with F16C alone: one conversion instruction an array), each
    through float arrays of that fixed size, which gcc keeps in registers, and its last part (fewer
    than EWRTC_HV, or all of it without F16C) through float arrays of the tile's size by h2f_n /
    f2h_n. Through tiles of 512 alone the float arrays went through L1 between the passes: `z = x +
    y` float16 at 2^19 elements, 2 threads, ran at 0.6 of ewkern.add (CPU_NOTES.md)."""
    T = CPU_HALF_TILE
    rows = layout.mode == "rows"
    n = "_ewrtc_P.shape[1]" if rows else "_ewrtc_P.size"
    # where element _t0 + _j of the loop (of row _r) lies in each kind of array
    base = {"array": "_r * _ewrtc_P.shape[1] + _t0" if rows else "_t0", "bcol": "_t0", "brow": "_r", "bone": "0"}
    at = {"array": "i", "bcol": "_t0 + _j", "brow": "_r", "bone": "0"}
    tiled = [a for a in half if a[2] in ("array", "bcol")]

    def chunk(size, k: str, count: str, fixed: bool) -> None:
        """elements _j0 .. _j0 + count of the tile through float arrays of `size`, indexed by k"""
        for p, dt, kind, _ in tiled:
            src.add(f"            float _f_{p.name}[{size}];")
            if not p.is_output or p.name in read:
                at_h = f"_h_{p.name} + _j0"
                src.add(f"            ewrtc::h2f_v({at_h}, _f_{p.name});" if fixed
                        else f"            ewrtc::h2f_n({at_h}, _f_{p.name}, {count});")
        src.add("#pragma omp simd")
        src.add(f"            for (long long {k} = 0; {k} < {count}; ++{k}) {{")
        src.add(f"            const long long _j = _j0 + {k}; (void)_j;")
        src.add(f"            const long long i = {'_r * _ewrtc_P.shape[1] + ' if rows else ''}_t0 + _j;")
        stores = []
        for p, dt, kind, rnd in layout.args:
            S, C = DTYPES[dt][0], DTYPES[dt][1]
            q = "" if p.is_output else "const "
            if kind == "scalar":
                src.add(f"            const {C} {p.name} = _ewrtc_P.s_{p.name};")
            elif dt == "float16" and kind in ("array", "bcol"):
                src.add(f"            {q}float {p.name} = _f_{p.name}[{k}];" if not p.is_output or p.name in read
                        else f"            float {p.name} = 0.0f;")
                if p.is_output:
                    stores.append(f"            _f_{p.name}[{k}] = {p.name};")
            else:
                src.add(f"            {q}{C} {p.name} = ewrtc::ld(({S} *)_ewrtc_P.p_{p.name} + {at[kind]});")
                if p.is_output:
                    stores.append(f"            ewrtc::st(({S} *)_ewrtc_P.p_{p.name} + i, {p.name});")
        src.add("            {")
        src.user(operation, name, "operation", ";")
        src.add("            }")
        src.lines.extend(stores)
        src.add("            }")
        for p, dt, kind, _ in tiled:
            if p.is_output:
                at_h = f"_h_{p.name} + _j0"
                src.add(f"            ewrtc::f2h_v(_f_{p.name}, {at_h});" if fixed
                        else f"            ewrtc::f2h_n(_f_{p.name}, {at_h}, {count});")

    if rows:
        src.add("    for (long long _r = 0; _r < _ewrtc_P.shape[0]; ++_r) {")
    src.add(f"    for (long long _t0 = 0; _t0 < {n}; _t0 += {T}) {{")
    src.add(f"        const long long _tn = {n} - _t0 < {T} ? {n} - _t0 : {T};")
    # the tile's start in each tiled array, in a local: P's address reaches the OpenMP region, so
    # through _ewrtc_P.p_<name> gcc reloaded each pointer from the stack after every 16-bit store (3 loads
    # a chunk of 8 in `z = x + y`: 0.93 of ewkern.add float16 on the CI host)
    for p, dt, kind, _ in tiled:
        q = "" if p.is_output else "const "
        src.add(f"        {q}ewrtc::half_bits *const _h_{p.name} = ({q}ewrtc::half_bits *)_ewrtc_P.p_{p.name} + {base[kind]};")
    src.add("        long long _j0 = 0;")
    src.add("#if EWRTC_HV")
    src.add("        for (; _j0 + EWRTC_HV <= _tn; _j0 += EWRTC_HV) {")
    chunk("EWRTC_HV", "_k", "EWRTC_HV", True)
    src.add("        }")
    src.add("#endif")
    src.add("        if (_j0 < _tn) {")
    chunk(T, "_q", "_tn - _j0", False)
    src.add("        }")
    src.add("    }")
    if rows:
        src.add("    }")


def _post_map(src: Source, indent: str, name: str, in_layout: Layout, out_layout: Layout, post_map_expr: str,
              acc: str, index: str = "_ewrtc_o") -> None:
    """A reduction's finish for the output at `index`: the scalar inputs (as CuPy's post_map_expr
    sees them: its kernel's parameters), the outputs' locals (out_layout), _in_ind and _out_ind,
    a = acc, the user's post_map_expr, the stores."""
    outs = [a for a in out_layout.args if a[2] == "array"]
    src.add(f"{indent}{{")
    for p, dt, kind, _ in in_layout.args:
        if kind == "scalar":
            src.add(f"{indent}    const {DTYPES[dt][1]} {p.name} = _ewrtc_PP.in.s_{p.name}; (void){p.name};")
    src.add(f"{indent}    const ewrtc_out &_ewrtc_P = _ewrtc_PP.out;")
    _offsets(src, out_layout, index, outs)
    stores = _loads(src, out_layout)
    src.add(f"{indent}    const ewrtc::Ind _in_ind = {{_ewrtc_PP.in.size}}, _out_ind = {{_ewrtc_PP.out.size}};")
    src.add(f"{indent}    (void)_in_ind; (void)_out_ind;")
    src.add(f"{indent}    const type_reduce a = {acc};")
    src.add(f"{indent}    {{")
    src.user(post_map_expr, name, "post_map_expr", ";")
    src.add(f"{indent}    }}")
    for p, S in stores:
        src.add(f"{indent}    ewrtc::st(({S} *)(_ewrtc_P.p_{p.name} + _ewrtc_off_{p.name}), {p.name});")
    src.add(f"{indent}}}")


def reduction_source(backend: str, name: str, in_layout: Layout, out_layout: Layout, red_size_field: bool,
                     map_expr: str, reduce_expr: str, post_map_expr: str, identity: str | None,
                     reduce_ctype: str, preamble: str, tdefs: str, block: int = 256) -> tuple[str, str]:
    """(source, entry) of a reduction. The loop runs over out_size * red_size input elements in
    the order (output o, reduced r); in_layout is strided over the inputs' broadcast shape with
    the reduced axes moved last, out_layout over the outputs. The CPU reduces each output
    sequentially in r order; CUDA gives each output one block whose threads stride over r and
    combine in a fixed tree, so results are deterministic on both (they may differ in rounding
    from each other)."""
    fname = f"{name}.{'cpp' if backend == 'cpu' else 'cu'}"
    entry = f"ewrtc_{name}"
    src = Source(fname)
    src.add(PRELUDE)
    src.add(tdefs)
    src.add(f"typedef {reduce_ctype} type_reduce;\ntypedef {reduce_ctype} _type_reduce;")
    src.add(struct_source("ewrtc_in", in_layout))
    src.add(struct_source("ewrtc_out", out_layout))
    src.add("struct ewrtc_params { ewrtc_in in; ewrtc_out out; long long red_size; };")
    if preamble:
        src.user(preamble, name, "preamble")
    arrays = [a for a in in_layout.args if a[2] == "array"]

    def map_step(src, acc, first_flag):
        src.add("            const ewrtc_in &_ewrtc_P = _ewrtc_PP.in;")
        _offsets(src, in_layout, "_ewrtc_o * _ewrtc_PP.red_size + _ewrtc_r", arrays)
        _loads(src, in_layout, "ld1" if backend == "cpu" else "ld")
        src.add("            type_reduce _m = (type_reduce)(")
        src.user(map_expr, name, "map_expr", close=");")
        if first_flag:
            src.add(f"            if ({first_flag}) {{ {acc} = _m; {first_flag} = false; continue; }}")
        src.add(f"            {{ const type_reduce a = {acc}, b = _m; {acc} = (type_reduce)(")
        src.user(reduce_expr, name, "reduce_expr", close=");")
        src.add("            }")

    def post(src, acc):
        _post_map(src, "        ", name, in_layout, out_layout, post_map_expr, acc)

    if backend == "cpu":
        src.add(f'extern "C" void {entry}(const ewrtc_params *_ewrtc_PP_, int _threads)')
        src.add("{")
        src.add("    const ewrtc_params &_ewrtc_PP = *_ewrtc_PP_;")

        def loop(team: bool) -> None:
            src.add("    for (long long _ewrtc_o = 0; _ewrtc_o < _ewrtc_PP.out.size; ++_ewrtc_o) {")
            if identity is None:
                src.add("        type_reduce _acc = type_reduce(); bool _first = true;")
            else:
                src.init("        ", "_acc", identity, name)
            src.add("        for (long long _ewrtc_r = 0; _ewrtc_r < _ewrtc_PP.red_size; ++_ewrtc_r) {")
            map_step(src, "_acc", "_first" if identity is None else None)
            src.add("        }")
            post(src, "_acc")
            src.add("    }")
        _cpu_team_loop(src, "parallel for schedule(static)", None, loop)
        src.add("}")
        return src.text(), entry
    if identity is None:
        raise NotImplementedError(f"{name}: a ReductionKernel without identity has no CUDA version yet")
    src.add(f'extern "C" __global__ void __launch_bounds__({block}) {entry}(const ewrtc_params _ewrtc_PP)')
    src.add("{")
    src.add("#if __CUDA_ARCH__ >= 900")
    src.add('    asm volatile("griddepcontrol.wait;" ::: "memory");')
    src.add('    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");')
    src.add("#endif")
    src.add(f"    __shared__ type_reduce _sh[{block}];")
    src.add("    for (long long _ewrtc_o = blockIdx.x; _ewrtc_o < _ewrtc_PP.out.size; _ewrtc_o += gridDim.x) {")
    src.init("        ", "_acc", identity, name)
    src.add(f"        for (long long _ewrtc_r = threadIdx.x; _ewrtc_r < _ewrtc_PP.red_size; _ewrtc_r += {block}) {{")
    map_step(src, "_acc", None)
    src.add("        }")
    src.add("        _sh[threadIdx.x] = _acc;")
    src.add("        __syncthreads();")
    src.add(f"        for (int _w = {block // 2}; _w > 0; _w >>= 1) {{")
    src.add("            if ((int)threadIdx.x < _w) {")
    src.add("                const type_reduce a = _sh[threadIdx.x], b = _sh[threadIdx.x + _w];")
    src.add("                _sh[threadIdx.x] = (type_reduce)(")
    src.user(reduce_expr, name, "reduce_expr", close=");")
    src.add("            }")
    src.add("            __syncthreads();")
    src.add("        }")
    src.add("        if (threadIdx.x == 0) {")
    src.add("            const type_reduce _fin = _sh[0];")
    post(src, "_fin")
    src.add("        }")
    src.add("        __syncthreads();")
    src.add("    }")
    src.add("}")
    return src.text(), entry


# ---- reductions over contiguous rows -----------------------------------------------------------

ROWS_BLOCK = 256
# EWKERN_RTC_ROWS_TAIL_LOOP=1 (read once): the aligned rows forms take a lane's last 1-3 vectors in
# a loop of one a pass, as before 9bd9be0; a knob for measuring that change, not for users
_ROWS_TAIL_STEP = os.environ.get("EWKERN_RTC_ROWS_TAIL_LOOP", "") != "1"


def group_combine(src: Source, acc: str, sh: str, combine) -> None:
    """The lanes of a group (_G lanes from _lane 0, a power of two; groups of 32 or more start at
    a warp) combine their `acc`: a butterfly within the warp in which the lower lane's value is
    always the left operand, then the group's warps in warp order through shared memory `sh` (32
    slots); every lane ends with the group's value, in an order fixed by _G. combine(indent, acc,
    lo, hi) emits acc = reduce(lo, hi). Every lane of the block must reach it (shuffles of whole
    warps, one __syncthreads when _G > 32)."""
    src.add("    for (int _m = 1; _m < _G && _m < 32; _m <<= 1) {")
    src.add(f"        const type_reduce _o = ewrtc::shfl_xor({acc}, _m);")
    src.add("        if (_lane & _m) {")
    combine("            ", acc, "_o", acc)
    src.add("        } else {")
    combine("            ", acc, acc, "_o")
    src.add("        }")
    src.add("    }")
    src.add("    if (_G > 32) {")
    src.add(f"        __shared__ type_reduce {sh}[32];")
    src.add(f"        if ((threadIdx.x & 31) == 0) {sh}[threadIdx.x >> 5] = {acc};")
    src.add("        __syncthreads();")
    src.add("        const int _w0 = int(threadIdx.x >> 5) & ~((_G >> 5) - 1);   /* the group's first warp */")
    src.add(f"        {acc} = {sh}[_w0];")
    src.add("        for (int _w = 1; _w < (_G >> 5); ++_w) {")
    combine("            ", acc, acc, f"{sh}[_w0 + _w]")
    src.add("        }")
    src.add("    }")


def reduction_rows_source(name: str, in_layout: Layout, out_layout: Layout, E: int, map_expr: str, reduce_expr: str,
                          post_map_expr: str, identity: str, reduce_ctype: str, preamble: str,
                          tdefs: str, full: bool = False, aligned: bool = False,
                          min_blocks: int = 0) -> tuple[str, list[str]]:
    """(source, [rows entry, combine entry]) of a CUDA reduction whose inputs are C-contiguous with
    the reduced axes last: output o reduces the R elements from o * R of every input (in_layout
    'contig': pointers and scalars). The two-step engine of rmse's default path, for any map and
    reduce:

      rows     one group of G lanes (a power of two, G | 256) per (output, chunk): the chunk's
               E-element vectors (16 bytes of the widest input; E = 1 when the inputs' starts
               cannot be aligned together) go to the lanes in turn, all loads of a step before
               its math (unrolled by 4); then chunk 0 takes the row's head elements (before its
               first aligned vector) and the last chunk its tail, lane by lane; the lanes combine
               (group_combine: a butterfly of shuffles, then the group's warps in order). With one
               chunk per row the group applies post_map and writes the output; otherwise it
               writes its partial value. With full, G is fixed at ROWS_BLOCK (groups of a whole
               block: rows of 1024+ vectors, chunked rows), its index arithmetic and the lanes'
               load addresses folded into constants (sm_90, (a - b)^2: float32 64 registers ->
               42, 4 -> 5 blocks of 256 an SM; bfloat16 54 -> 40, 4 -> 6); else G is read at
               run time. With aligned (the host's promise: one chunk a row, every row starting
               at a whole vector, R a multiple of E, R / E + 4 * 256 < 2^31), the rows entry is
               the short form: no chunk or head arithmetic, no head or tail loops, vector indices
               in 32 bits. Its first load comes after a few dozen instructions instead of about
               200 (64-bit division and alignment arithmetic), which a single launch with cold
               caches pays in full. min_blocks > 0: the rows entry's __launch_bounds__ asks for
               that many resident blocks of 256 (the host takes 4 where it costs no spill: see
               ReductionKernel's rows path).
      combine  one group per output folds its chunks' partials (lanes over chunks, then the
               same combination) and applies post_map.

    Every combination happens in an order fixed by the shape, E and the inputs' offset from a
    16-byte boundary, never by timing: results are the same from run to run."""
    src = Source(f"{name}.cu")
    src.add(f'#include "{VECTOR_HEADER}"')
    src.add(PRELUDE)
    src.add(VECTOR_PRELUDE)
    src.add(SHFL_PRELUDE)
    src.add(tdefs)
    src.add(f"typedef {reduce_ctype} type_reduce;\ntypedef {reduce_ctype} _type_reduce;")
    src.add(struct_source("ewrtc_in", in_layout))
    src.add(struct_source("ewrtc_out", out_layout))
    src.add("struct ewrtc_params { ewrtc_in in; ewrtc_out out; long long R, nout, head0, nchunks, chunk_vecs, G,"
            " prefetch; char *partial; };")
    if preamble:
        src.user(preamble, name, "preamble")
    arrays = [a for a in in_layout.args if a[2] == "array"]

    def combine(src, indent, acc, lo, hi):
        src.add(f"{indent}{{ const type_reduce a = {lo}, b = {hi}; {acc} = (type_reduce)(")
        src.user(reduce_expr, name, "reduce_expr", close=");")
        src.add(f"{indent}}}")

    def map_into(src, indent, acc, loads):
        """loads: (param, dtype) -> C++ expression of its element"""
        src.add(f"{indent}{{")
        for p, dt, kind, _ in in_layout.args:
            C = DTYPES[dt][1]
            if kind == "array":
                src.add(f"{indent}    const {C} {p.name} = {loads(p, dt)};")
        src.add(f"{indent}    const type_reduce _m = (type_reduce)(")
        src.user(map_expr, name, "map_expr", close=");")
        combine(src, indent + "    ", acc, acc, "_m")
        src.add(f"{indent}}}")

    def finish(src, value_store):
        """the group's lanes combine; lane 0 of a live group stores"""
        group_combine(src, "_acc", "_sh", lambda indent, acc, lo, hi: combine(src, indent, acc, lo, hi))
        src.add("    if (_lane != 0 || !_live) return;")
        value_store(src)

    def post(src):
        _post_map(src, "    ", name, in_layout, out_layout, post_map_expr, "_acc", "_o")

    def header(src, entry, g=None, blocks=0):
        """g: the lanes per group fixed at compile time (None: _ewrtc_PP.G at run time, a power of two:
        groups are counted by shifts, not divisions); blocks: __launch_bounds__'s minimum resident
        blocks (0: none)"""
        bounds = f"{ROWS_BLOCK}, {blocks}" if blocks else f"{ROWS_BLOCK}"
        src.add(f'extern "C" __global__ void __launch_bounds__({bounds}) {entry}(const ewrtc_params _ewrtc_PP)')
        src.add("{")
        src.add(f"    const int _G = {g if g else 'int(_ewrtc_PP.G)'}, _lane = int(threadIdx.x) & (_G - 1);")
        src.add("    const int _gs = __ffs(_G) - 1;   /* log2 G */")
        src.add(f"    const long long _task = (long long)blockIdx.x * ({ROWS_BLOCK} >> _gs) + (threadIdx.x >> _gs);")

    def scalars_and_packs(src):
        for p, dt, kind, _ in in_layout.args:
            S, C = DTYPES[dt][0], DTYPES[dt][1]
            if kind == "scalar":
                src.add(f"    const {C} {p.name} = _ewrtc_PP.in.s_{p.name};")
            else:
                src.add(f"    typedef ewrtc::Pack<{S}, {E}> _U_{p.name};")

    def vector_loops(src, index, v0, v1, held, tail_step=True):
        """the lanes' vectors v0 + _lane, v0 + _lane + _G, ... below v1 (index: their C type),
        four at a time with every load of a step before its math, then the 1-3 left as one such
        step; held: in registers as ewrtc::Held's type (bfloat16 as 32-bit words), else as
        16-bit values; tail_step False: the 1-3 left in a loop of one vector a pass (the chunked
        forms, 64-bit indices: as one step, ptxas sm_90 fit 4 blocks of 256 an SM instead of 5,
        float32 with G fixed at ROWS_BLOCK, bfloat16 with G read at run time). mse over rows in
        bfloat16 (sm_90, ptxas, with the loop for what was left): held, the aligned forms take
        496-600 -> 416-520 instructions in the same or fewer registers, and the chunked form with
        a compile-time G 1336 -> 1272 in 40; the chunked form with G read at run time 1280 ->
        1200, but in 50 registers against 48 (4 blocks of 256 an SM instead of 5; its 4-block
        bound spills, so that is the form built): not held"""
        def T(dt):
            return f"ewrtc::Held<{DTYPES[dt][0]}, {E}>::type" if held else f"ewrtc::Pack<{DTYPES[dt][0]}, {E}>"
        def step(n, ind, guard=None):
            """n vectors a lane from _v: every load (under guard, when given) before the math"""
            # the loops' bodies sit one level in, or two under the guard's `if`
            body = ind + "    " if guard is None else ind + "        "
            for p, dt, kind, _ in arrays:
                src.add(f"{ind}{T(dt)} _r_{p.name}[{n}];")
            src.add("#pragma unroll")
            if guard is None:
                src.add(f"{ind}for (int _q = 0; _q < {n}; ++_q) {{")
            else:
                src.add(f"{ind}for (int _q = 0; _q < {n}; ++_q)")
                src.add(f"{ind}    if ({guard}) {{")
            for p, dt, kind, _ in arrays:
                src.add(f"{body}_r_{p.name}[_q] = " + (f"ewrtc::hold(_u_{p.name} + (_v + _q * _G));" if held
                                                      else f"_u_{p.name}[_v + _q * _G];"))
            src.add(f"{body[:-4]}}}")      # the brace the loop or the guard opened
            src.add("#pragma unroll")
            src.add(f"{ind}for (int _q = 0; _q < {n}; ++_q)")
            if guard is not None:
                src.add(f"{ind}    if ({guard})")
            src.add("#pragma unroll")
            src.add(f"{body}for (int _k = 0; _k < {E}; ++_k)")
            map_into(src, body, "_acc", lambda p, dt: f"ewrtc::elem(_r_{p.name}[_q], _k)")

        src.add(f"        {index} _v = {v0} + _lane;")
        src.add(f"        for (; _v + 3 * _G < {v1}; _v += 4 * _G) {{")
        step(4, "            ")
        src.add("        }")
        if not tail_step:
            src.add(f"        for (; _v < {v1}; _v += _G) {{")
            for p, dt, kind, _ in arrays:
                src.add(f"            const {T(dt)} _r_{p.name} = " + (f"ewrtc::hold(_u_{p.name} + _v);" if held
                                                                      else f"_u_{p.name}[_v];"))
            src.add("#pragma unroll")
            src.add(f"            for (int _k = 0; _k < {E}; ++_k)")
            map_into(src, "            ", "_acc", lambda p, dt: f"ewrtc::elem(_r_{p.name}, _k)")
            src.add("        }")
            return
        # the 1-3 vectors left, as one step: every load first (each under its bound), then the math
        # in the same order as a loop's. A loop of one vector a pass waited for each load before
        # the next: 16-bit mse over 128 rows of 4096 (256 lanes of 2 vectors, no 4-vector step)
        # paid two DRAM round trips in a cold launch, 3.68 us against Triton's 2.98 (H200, ncu)
        src.add(f"        if (_v < {v1}) {{")
        step(3, "            ", f"_v + _q * _G < {v1}")
        src.add("        }")

    rows, comb = f"ewrtc_{name}_rows", f"ewrtc_{name}_comb"
    header(src, rows, ROWS_BLOCK if full else None, min_blocks)
    if aligned:
        src.add("    const long long _o = _task;")
        src.add("    const bool _live = _o < _ewrtc_PP.nout;")
        scalars_and_packs(src)
        src.add(f"    const int _nv = int(_ewrtc_PP.R / {E});")
        for p, dt, kind, _ in arrays:
            src.add(f"    const _U_{p.name} *const _u_{p.name} = (const _U_{p.name} *)((const {DTYPES[dt][0]} *)"
                    f"_ewrtc_PP.in.p_{p.name} + _o * _ewrtc_PP.R);")
        prefetch_then_wait(src, "(long long)blockIdx.x < _ewrtc_PP.prefetch && _live && _lane < _nv", arrays, "_lane",
                           "_lane == 0")
        src.init("    ", "_acc", identity, name)
        src.add("    if (_live) {")
        vector_loops(src, "int", "0", "_nv", True, _ROWS_TAIL_STEP)
        src.add("    }")
        finish(src, post)
        src.add("}")
    else:
        src.add("    const long long _o = _task / _ewrtc_PP.nchunks, _c = _task % _ewrtc_PP.nchunks;")
        src.add("    const bool _live = _o < _ewrtc_PP.nout;")
        scalars_and_packs(src)
        if arrays:
            src.add("    if ((long long)blockIdx.x < _ewrtc_PP.prefetch && _live) {")
            src.add(f"        const long long _i0 = _o * _ewrtc_PP.R, _ia = _i0 + ((_ewrtc_PP.head0 - _i0) % {E} + {E}) % {E};")
            src.add(f"        const long long _v = (_ia + (_c * _ewrtc_PP.chunk_vecs + _lane) * {E});")
            src.add("        if (_v + " + str(E) + " <= _i0 + _ewrtc_PP.R) {")
            for p, dt, kind, _ in arrays:
                src.add(f"            prefetch_l2_line((const {DTYPES[dt][0]} *)_ewrtc_PP.in.p_{p.name} + _v, "
                        f"unsigned(sizeof(_U_{p.name})), _lane == 0);")
            src.add("        }")
            src.add("    }")
        src.add("    pdl_wait();")
        src.add("    pdl_launch_dependents();")
        src.init("    ", "_acc", identity, name)
        src.add("    if (_live) {")
        src.add("        const long long _i0 = _o * _ewrtc_PP.R, _end = _i0 + _ewrtc_PP.R;")
        src.add(f"        long long _ia = _i0 + ((_ewrtc_PP.head0 - _i0) % {E} + {E}) % {E};")
        src.add("        if (_ia > _end) _ia = _end;")
        src.add(f"        const long long _nv = (_end - _ia) / {E}, _ta = _ia + _nv * {E};")
        src.add("        const long long _v0 = _c * _ewrtc_PP.chunk_vecs, _v1 = _v0 + _ewrtc_PP.chunk_vecs < _nv ? _v0 + _ewrtc_PP.chunk_vecs : _nv;")
        for p, dt, kind, _ in arrays:
            src.add(f"        const _U_{p.name} *const _u_{p.name} = (const _U_{p.name} *)((const {DTYPES[dt][0]} *)"
                    f"_ewrtc_PP.in.p_{p.name} + _ia);")
        vector_loops(src, "long long", "_v0", "_v1", full, tail_step=False)
        # head (chunk 0) and tail (last chunk): lane j takes element j
        src.add("        if (_c == 0)")
        src.add("            for (long long _e = _i0 + _lane; _e < _ia; _e += _G)")
        map_into(src, "            ", "_acc", lambda p, dt: f"ewrtc::ld((const {DTYPES[dt][0]} *)_ewrtc_PP.in.p_{p.name} + _e)")
        src.add("        if (_c == _ewrtc_PP.nchunks - 1)")
        src.add("            for (long long _e = _ta + _lane; _e < _end; _e += _G)")
        map_into(src, "            ", "_acc", lambda p, dt: f"ewrtc::ld((const {DTYPES[dt][0]} *)_ewrtc_PP.in.p_{p.name} + _e)")
        src.add("    }")

        def rows_store(src):
            src.add("    if (_ewrtc_PP.nchunks > 1) {")
            src.add("        ((type_reduce *)_ewrtc_PP.partial)[_task] = _acc;")
            src.add("        return;")
            src.add("    }")
            post(src)
        finish(src, rows_store)
        src.add("}")
    header(src, comb)
    src.add("    const long long _o = _task;")
    src.add("    const bool _live = _o < _ewrtc_PP.nout;")
    src.add("    pdl_wait();")
    src.add("    pdl_launch_dependents();")
    src.init("    ", "_acc", identity, name)
    src.add("    if (_live)")
    src.add("        for (long long _c = _lane; _c < _ewrtc_PP.nchunks; _c += _G)")
    combine(src, "            ", "_acc", "_acc", "((const type_reduce *)_ewrtc_PP.partial)[_o * _ewrtc_PP.nchunks + _c]")
    finish(src, post)
    src.add("}")
    return src.text(), [rows, comb]


# ---- the default path's body for run-time kernels -------------------------------------------

VECTOR_HEADER = "pdl_device.cuh"
VECTOR_FORMS = ((1, "int"), (2, "int"), (4, "int"), (1, "long long"))
# the calls that make a 16-bit or float64 kernel's math a real share of a vector's time (auto's Heavy)
HEAVY_MATH = frozenset({"exp", "expf", "exp2", "exp2f", "expm1", "expm1f", "log", "logf", "log2", "log2f", "log10",
                        "log10f", "log1p", "log1pf", "erf", "erff", "erfc", "erfcf", "tanh", "tanhf", "sin", "sinf",
                        "cos", "cosf", "tan", "tanf", "pow", "powf", "sinh", "cosh", "asin", "acos", "atan",
                        "atan2", "cbrt", "hypot", "fmod"})

VECTOR_PRELUDE = r"""
namespace ewrtc {
/* E elements of one array, loaded and stored as one vector (16 bytes for the widest array) */
template <class S, int E> struct alignas(sizeof(S) * E) Pack { S v[E]; };
/* a streaming store (st.global.cs, as the default path's __stcs) of one Pack (aligned to its size) */
template <class P> __device__ __forceinline__ void stcs(P *dst, const P &x)
{
    if constexpr (sizeof(P) == 16) {
        const uint4 u = *reinterpret_cast<const uint4 *>(&x);
        asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(u.x), "r"(u.y), "r"(u.z),
                     "r"(u.w) : "memory");
    } else if constexpr (sizeof(P) == 8) {
        const uint2 u = *reinterpret_cast<const uint2 *>(&x);
        asm volatile("st.global.cs.v2.b32 [%0], {%1, %2};" ::"l"(dst), "r"(u.x), "r"(u.y) : "memory");
    } else if constexpr (sizeof(P) == 4) {
        const unsigned u = *reinterpret_cast<const unsigned *>(&x);
        asm volatile("st.global.cs.b32 [%0], %1;" ::"l"(dst), "r"(u) : "memory");
    } else if constexpr (sizeof(P) == 2) {
        const unsigned short u = *reinterpret_cast<const unsigned short *>(&x);
        asm volatile("st.global.cs.b16 [%0], %1;" ::"l"(dst), "h"(u) : "memory");
    } else {
        *dst = x;
    }
}
/* a store of one Pack by the launch's store policy: write-back (st.global) where wb (the default
   path's store rule: an output of at least 1/32 of the L2, which the next kernel may read from
   there, or a launch that moves more bytes than the L2 holds), else streaming (as stcs);
   both under complementary predicates of the one address, as the default path's store_vec */
#define EWRTC_STV(V, ...) "{\n\t.reg .pred w;\n\tsetp.ne.s32 w, %0, 0;\n\t@w st.global" V " [%1], " \
    __VA_ARGS__ ";\n\t@!w st.global.cs" V " [%1], " __VA_ARGS__ ";\n\t}"
template <class P> __device__ __forceinline__ void stv(P *dst, const P &x, long long wb)
{
    const int w = wb != 0;
    if constexpr (sizeof(P) == 16) {
        const uint4 u = *reinterpret_cast<const uint4 *>(&x);
        asm volatile(EWRTC_STV(".v4.b32", "{%2, %3, %4, %5}") ::"r"(w), "l"(dst), "r"(u.x), "r"(u.y), "r"(u.z),
                     "r"(u.w) : "memory");
    } else if constexpr (sizeof(P) == 8) {
        const uint2 u = *reinterpret_cast<const uint2 *>(&x);
        asm volatile(EWRTC_STV(".v2.b32", "{%2, %3}") ::"r"(w), "l"(dst), "r"(u.x), "r"(u.y) : "memory");
    } else if constexpr (sizeof(P) == 4) {
        const unsigned u = *reinterpret_cast<const unsigned *>(&x);
        asm volatile(EWRTC_STV(".b32", "%2") ::"r"(w), "l"(dst), "r"(u) : "memory");
    } else if constexpr (sizeof(P) == 2) {
        const unsigned short u = *reinterpret_cast<const unsigned short *>(&x);
        asm volatile(EWRTC_STV(".b16", "%2") ::"r"(w), "l"(dst), "h"(u) : "memory");
    } else {
        *dst = x;
    }
}
#undef EWRTC_STV
/* a lane's E consecutive values of a column sum's partial row (its own columns, loaded and
   stored by that lane only), as 16-byte vectors where they fill whole ones (E x sizeof(C) a
   multiple of 16: the partial rows then start 16-byte aligned, cols being a multiple of E), else
   one by one. One by one, E apart across a warp's lanes, each store used 4 of a sector's 32
   bytes: H200, float16 rmsnorm's backward at 4 MiB (256 partial rows of 4096), Nsight Compute
   put 54% of the kernel's L2 sectors in excess and its warps stalled most on those 16 stores
   and on draining them at exit */
template <class C, int E> __device__ __forceinline__ void ld_part(const C *src, C (&a)[E])
{
    constexpr int n = int(16 / sizeof(C));
    if constexpr (16 % sizeof(C) == 0 && E % n == 0) {
        struct alignas(16) V { C v[n]; };
#pragma unroll
        for (int j = 0; j < E / n; ++j) {
            const V t = reinterpret_cast<const V *>(src)[j];
#pragma unroll
            for (int m = 0; m < n; ++m)
                a[j * n + m] = t.v[m];
        }
    } else {
#pragma unroll
        for (int k = 0; k < E; ++k)
            a[k] = src[k];
    }
}
template <class C, int E> __device__ __forceinline__ void st_part(C *dst, const C (&a)[E])
{
    constexpr int n = int(16 / sizeof(C));
    if constexpr (16 % sizeof(C) == 0 && E % n == 0) {
        struct alignas(16) V { C v[n]; };
#pragma unroll
        for (int j = 0; j < E / n; ++j) {
            V t;
#pragma unroll
            for (int m = 0; m < n; ++m)
                t.v[m] = a[j * n + m];
            reinterpret_cast<V *>(dst)[j] = t;
        }
    } else {
#pragma unroll
        for (int k = 0; k < E; ++k)
            dst[k] = a[k];
    }
}
/* a 16-byte load with an L2 eviction priority (Hopper's createpolicy; sm_80 and later), as
   Triton's eviction_policy: ldkeep (evict_last) for a row that is read again, lddrop
   (evict_first) for its last read; other sizes and older GPUs: a plain load. volatile: kept in
   order with the stores (stcs), as the plain loads they replace */
#define EWRTC_LDPOL(NAME, PRIO) \
template <class P> __device__ __forceinline__ P NAME(const P *p) \
{ \
    if constexpr (sizeof(P) == 16 && __CUDA_ARCH__ >= 800) { \
        uint4 u; \
        asm volatile("{ .reg .b64 pol; createpolicy.fractional.L2::" PRIO ".b64 pol, 1.0; " \
                     "ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], pol; }" \
                     : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p) : "memory"); \
        P r; \
        *reinterpret_cast<uint4 *>(&r) = u; \
        return r; \
    } else { \
        return *p; \
    } \
}
EWRTC_LDPOL(ldkeep, "evict_last")
EWRTC_LDPOL(lddrop, "evict_first")
#undef EWRTC_LDPOL
/* a loaded bfloat16 vector of E (even) elements held as its 32-bit words; element k is its word's
   low half shifted up or its high half masked (one instruction, a float's bits). Held as a Pack
   of 16-bit values, NVVM splits each loaded word into two 16-bit registers, which ptxas keeps
   apart (8 registers a vector where float16's conversions read a word's halves in place), and the
   4-vector forms spilled: o = a * b + c 788 bytes, a + b 80, a / (1 + exp(-b)) 92 (sm_90) */
template <int E> struct alignas(2 * E) BfWords { unsigned w[E / 2]; };
/* Held<S, E>::type: how a loaded vector of E elements of S sits in registers (hold() loads one,
   elem() reads its element k as the compute type) */
template <class S, int E> struct Held { typedef Pack<S, E> type; };
template <> struct Held<bf16_bits, 2> { typedef BfWords<2> type; };
template <> struct Held<bf16_bits, 4> { typedef BfWords<4> type; };
template <> struct Held<bf16_bits, 8> { typedef BfWords<8> type; };
template <class S, int E> __device__ __forceinline__ const typename Held<S, E>::type *held(const Pack<S, E> *p)
{
    return reinterpret_cast<const typename Held<S, E>::type *>(p);
}
template <class S, int E> __device__ __forceinline__ typename Held<S, E>::type hold(const Pack<S, E> *p)
{
    return *held(p);
}
template <class S, int E> __device__ __forceinline__ auto elem(const Pack<S, E> &x, int k) { return ld(&x.v[k]); }
template <int E> __device__ __forceinline__ float elem(const BfWords<E> &x, int k)
{
    const unsigned u = x.w[k >> 1];
    return __uint_as_float((k & 1) ? (u & 0xffff0000u) : (u << 16));
}
} /* namespace ewrtc */
"""


_BRANCHY = re.compile(r"\b(?:if|else|for|while|do|switch|case|return|goto|break|continue)\b")


def writes_only(code: str, name: str) -> bool:
    """Whether `name` is only assigned by code, unconditionally (every use the target of a plain
    assignment `name = ...` that starts a statement, and no branch in the code), so that a
    kernel need not load the output first: CuPy's outputs are references, and an assignment under
    a condition (`if (x > 0) z = x;`) leaves the element as it was where the condition fails.
    Conservative: any other use (a read, a compound assignment, an assignment inside an
    expression such as `c && (z = 1)`, a mention in a comment or string) and any statement that
    branches or loops anywhere count as a read; a conditional operator on the right-hand side
    (`z = c ? a : b`) is an unconditional assignment."""
    if _BRANCHY.search(code):
        return False
    for m in re.finditer(r"\b%s\b" % re.escape(name), code):
        before = code[:m.start()].rstrip()
        if (before and before[-1] not in ";{}") or not re.match(r"\s*=(?!=)", code[m.end():]):
            return False
    return True


_RAW_READS = re.compile(r"\s*\.\s*(?:size|shape|ndim)\s*\(")
_ASSIGNS = re.compile(r"\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)|\s*(?:\+\+|--)")


def may_write_raw(code: str, name: str) -> bool:
    """Whether code may write raw parameter `name`. Conservative: False only where every use is
    `name.size()`, `.shape()`, `.ndim()` or an element `name[...]` that is read (not followed by
    an assignment, `++` or `--`, not preceded by `&`, `++` or `--`); any other use (passed to a
    function, a reference taken, a mention in a comment or string) counts as a write."""
    for m in re.finditer(r"\b%s\b" % re.escape(name), code):
        after = code[m.end():]
        if _RAW_READS.match(after):
            continue
        br = re.match(r"\s*\[", after)
        if not br:
            return True
        depth, j = 0, br.end() - 1
        while j < len(after):   # the element's closing bracket
            depth += {"[": 1, "]": -1}.get(after[j], 0)
            if depth == 0:
                break
            j += 1
        before = code[:m.start()].rstrip()
        if j >= len(after) or _ASSIGNS.match(after[j + 1:]) or before.endswith(("&", "++", "--")):
            return True
    return False

def vector_units(layout: Layout) -> int:
    """Elements per vector: 16 bytes of the widest non-raw array."""
    return 16 // max(DTYPES[dt][2] for p, dt, kind, _ in layout.args if kind in ("array", "bcol"))


def _element(src: Source, indent: str, name: str, operation: str, args, read_outputs, load, store) -> None:
    """One element of a vector kernel: a local per parameter (load(param, dtype, kind): its C++
    value; an output the operation only assigns starts as 0), the operation, then the outputs'
    stores (store(param, dtype): the C++ statement)."""
    for p, dt, kind, _ in args:
        C = DTYPES[dt][1]
        if p.is_output and p.name not in read_outputs:
            src.add(f"{indent}{C} {p.name} = ({C})0;")   # not `C()`: `long long()` does not parse
        else:
            src.add(f"{indent}{'' if p.is_output else 'const '}{C} {p.name} = {load(p, dt, kind)};")
    src.add(f"{indent}{{")
    src.user(operation, name, "operation", ";")
    src.add(f"{indent}}}")
    for p, dt, kind, _ in args:
        if p.is_output:
            src.add(f"{indent}{store(p, dt)};")


def vector_source(name: str, layout: Layout, operation: str, preamble: str, loop_prep: str, after_loop: str,
                  tdefs: str, read_outputs, regs64: bool = False) -> tuple[str, list[str]]:
    """(source, entries) of an elementwise kernel on the default path's body (ew_fast in
    csrc/cuda/elementwise_kernel.cuh): every non-raw array C-contiguous over the loop, each
    pointer advanced by the host to element `head`, where every array's vector of E elements
    (E x itemsize bytes: 16 for the widest) is aligned; block k owns VPT x blockDim vectors, each
    thread loads all of its vectors before it computes and stores any, stores stream
    (st.global.cs) or, where the launch sets wb (the default path's store rule), write back; the head elements (before the pointers) and the tail go to the last block's
    last threads, which the launch rule (auto_plan) leaves without a vector; PDL's wait with the
    first vector's lines prefetched into L2 by the blocks of the first wave. Four forms, as auto
    has: 1, 2 and 4 vectors per thread with a 32-bit index, 1 with a 64-bit index (entries in
    VECTOR_FORMS order). Outputs in read_outputs are loaded too (CuPy's outputs are references).
    Each entry is bounded by __launch_bounds__(1024), or with regs64 by __maxnreg__(64) (the same
    64 registers a thread at most, the host's twin for forms that ptxas spilled under the first:
    the built-in ops' ew_fast_r)."""
    E = vector_units(layout)
    src = Source(f"{name}.cu")
    src.add(f'#include "{VECTOR_HEADER}"')
    src.add(PRELUDE)
    src.add(VECTOR_PRELUDE)
    src.add(tdefs)
    src.add(struct_source("ewrtc_params", layout))
    if preamble:
        src.user(preamble, name, "preamble")
    arrays = [a for a in layout.args if a[2] == "array"]
    ins = [a for a in arrays if not a[0].is_output]
    outs = [a for a in arrays if a[0].is_output]
    cols = [a for a in layout.args if a[2] == "bcol"]
    rows = [a for a in layout.args if a[2] == "brow"]
    ones = [a for a in layout.args if a[2] == "bone"]
    loaded = ins + cols + [a for a in outs if a[0].name in read_outputs]
    src.add("template <class _ewrtc_Idx, int _ewrtc_VPT>")
    src.add(f"__device__ __forceinline__ void ewrtc_{name}_run(const ewrtc_params &_ewrtc_P)")
    src.add("{")
    src.add(f"    enum {{ _ewrtc_E = {E} }};")
    src.add("    const ewrtc::Ind _ind = {_ewrtc_P.size}; (void)_ind;")
    for p, dt, kind, rnd in layout.args:
        S, C = DTYPES[dt][0], DTYPES[dt][1]
        if kind in ("array", "bcol"):
            q = "" if p.is_output else "const "
            src.add(f"    typedef ewrtc::Pack<{S}, _ewrtc_E> _U_{p.name};")
            src.add(f"    {q}_U_{p.name} *const _u_{p.name} = ({q}_U_{p.name} *)_ewrtc_P.p_{p.name};")
    src.add("    const _ewrtc_Idx _n = _ewrtc_Idx(_ewrtc_P.nfast), _head = _ewrtc_Idx(_ewrtc_P.head),"
            " _nvec = _n / _ewrtc_Idx(_ewrtc_E);")
    if cols or rows:
        src.add("    const _ewrtc_Idx _cvec = _ewrtc_Idx(_ewrtc_P.ccols / _ewrtc_E);   /* vectors per row (the host checks"
                " ccols % _ewrtc_E == 0) */")
    src.add("    const _ewrtc_Idx _base = _ewrtc_Idx(blockIdx.x) * _ewrtc_Idx(blockDim.x) * _ewrtc_VPT + _ewrtc_Idx(threadIdx.x);")
    prefetch_then_wait(src, "(long long)blockIdx.x < _ewrtc_P.prefetch && _base < _nvec", ins, "_base", "threadIdx.x == 0")
    # after the wait: the previous kernel may be writing it (a ReductionKernel op's backward reads
    # the reduction's one-element result so; read before the wait, the C++ node's back-to-back
    # launches read it unwritten now and then: NaN gradients on the H200 under load)
    for p, dt, kind, _ in ones:
        src.add(f"    const {DTYPES[dt][1]} _o_{p.name} = ewrtc::ld((const {DTYPES[dt][0]} *)_ewrtc_P.p_{p.name});")
    for p, dt, kind, rnd in layout.args:
        C = DTYPES[dt][1]
        S = DTYPES[dt][0]
        if kind == "scalar":
            src.add(f"    const {C} {p.name} = _ewrtc_P.s_{p.name};")
        elif kind == "raw":
            src.add(f"    const ewrtc::Raw<{S}, {C}> {p.name} = {{({S} *)_ewrtc_P.p_{p.name}, _ewrtc_P.n_{p.name}, {max(rnd, 1)}, "
                    f"_ewrtc_P.shp_{p.name}}};")
    if loop_prep:
        src.add("    {")
        src.user(loop_prep, name, "loop_prep", ";")
    for p, dt, kind, _ in loaded:
        src.add(f"    ewrtc::Held<{DTYPES[dt][0]}, {E}>::type _r_{p.name}[_ewrtc_VPT];")
    for p, dt, kind, _ in rows:
        src.add(f"    {DTYPES[dt][1]} _s_{p.name}[_ewrtc_VPT];")
    src.add("#pragma unroll")
    src.add("    for (int _q = 0; _q < _ewrtc_VPT; ++_q) {")
    src.add("        const _ewrtc_Idx _v = _base + _ewrtc_Idx(_q) * _ewrtc_Idx(blockDim.x);")
    src.add("        if (_v < _nvec) {")
    for p, dt, kind, _ in loaded:
        src.add(f"            _r_{p.name}[_q] = ewrtc::hold(_u_{p.name} + {'_v % _cvec' if kind == 'bcol' else '_v'});")
    for p, dt, kind, _ in rows:
        src.add(f"            _s_{p.name}[_q] = ewrtc::ld((const {DTYPES[dt][0]} *)_ewrtc_P.p_{p.name} + _v / _cvec);")
    src.add("        }")
    src.add("    }")
    src.add("#pragma unroll")
    src.add("    for (int _q = 0; _q < _ewrtc_VPT; ++_q) {")
    src.add("        const _ewrtc_Idx _v = _base + _ewrtc_Idx(_q) * _ewrtc_Idx(blockDim.x);")
    src.add("        if (_v < _nvec) {")
    for p, dt, kind, _ in outs:
        src.add(f"            _U_{p.name} _w_{p.name};")
    src.add("#pragma unroll")
    src.add("            for (int _k = 0; _k < _ewrtc_E; ++_k) {")
    src.add("                const long long i = (long long)_head + (long long)_v * _ewrtc_E + _k; (void)i;")
    _element(src, "                ", name, operation, cols + rows + ones + arrays, read_outputs,
             lambda p, dt, kind: {"brow": f"_s_{p.name}[_q]", "bone": f"_o_{p.name}"}.get(
                 kind, f"ewrtc::elem(_r_{p.name}[_q], _k)"),
             lambda p, dt: f"ewrtc::st(&_w_{p.name}.v[_k], {p.name})")
    src.add("            }")
    for p, dt, kind, _ in outs:
        src.add(f"            ewrtc::stv(_u_{p.name} + _v, _w_{p.name}, _ewrtc_P.wb);")
    src.add("        }")
    src.add("    }")
    src.add("    if (blockIdx.x == gridDim.x - 1) {")
    src.add("        const _ewrtc_Idx _tail0 = _nvec * _ewrtc_Idx(_ewrtc_E), _nedge = _head + (_n - _tail0);")
    src.add("        const _ewrtc_Idx _j = _ewrtc_Idx(blockDim.x) - 1 - _ewrtc_Idx(threadIdx.x);")
    src.add("        if (_j < _nedge) {")
    src.add("            const _ewrtc_Idx _e = _j < _head ? _j - _head : _tail0 + (_j - _head);")
    src.add("            const long long i = (long long)_head + (long long)_e; (void)i;")
    at = {"bcol": "i % _ewrtc_P.ccols", "brow": "i / _ewrtc_P.ccols", "bone": "0", "array": "_e"}
    _element(src, "            ", name, operation, cols + rows + ones + arrays, read_outputs,
             lambda p, dt, kind: f"ewrtc::ld((const {DTYPES[dt][0]} *)_ewrtc_P.p_{p.name} + ({at[kind]}))",
             lambda p, dt: f"ewrtc::st(({DTYPES[dt][0]} *)_ewrtc_P.p_{p.name} + _e, {p.name})")
    src.add("        }")
    src.add("    }")
    if after_loop:
        src.user(after_loop, name, "after_loop", ";")
    if loop_prep:
        src.add("    }")
    src.add("}")
    entries = []
    for vpt, idx in VECTOR_FORMS:
        entry = f"ewrtc_{name}_v{vpt}{'l' if idx != 'int' else ''}"
        entries.append(entry)
        bound = "__maxnreg__(64)" if regs64 else "__launch_bounds__(1024)"
        src.add(f'extern "C" __global__ void {bound} {entry}(const ewrtc_params _ewrtc_P)')
        src.add(f"{{ ewrtc_{name}_run<{idx}, {vpt}>(_ewrtc_P); }}")
    return src.text(), entries


# ---- row kernels: a reduction over each row, then an operation over the same row --------------

# the row kernel's forms: 1, 2, 4 vectors a lane held in registers; 0 and below: the row is read
# twice, the second time mostly from L2 (0: long rows, a step of ROW_TWO_PASS_VECTORS vectors over
# the arrays; -2: the lean form, one step of 2 vectors a lane)
ROW_FORMS = (1, 2, 4, 0, -2)
ROW_TWO_PASS_VECTORS = 2
ROW_MIN_BLOCK = 256        # a row kernel's block: max(ROW_MIN_BLOCK, G) lanes (groups of G)
COLSUM_SLICES = 32         # row slices of a column-sum entry's block (32 columns each)
COLSUM_BLOCK = 512         # a column-sum row kernel's block may hold up to this many lanes
COLSUM_SMEM = 32768        # bytes of shared memory a block's groups combine their column sums in
ROW_STAGE2 = "_ewk_s"      # a row kernel's second reduction, in scope in its operation

_CTYPE_BYTES = {v[0]: v[2] for v in DTYPES.values()}   # a compute type's bytes, by its C name


def colsum_bytes(dtypes) -> list[int]:
    """The bytes of the compute type each column-sum output (of these dtypes) sums in."""
    return [_CTYPE_BYTES[DTYPES[dt][1]] for dt in dtypes]


def colsum_combines(g: int | None, vpl: int, E: int, csizes) -> bool:
    """Whether a row kernel's column sums are combined across a block's groups (one partial row
    a block instead of one a group): the register forms (VPL > 0) at a compile-time G whose
    columns (G x VPL x E of each column-sum output, csizes: their compute types' bytes) fit in
    COLSUM_SMEM. The host sizes the partials by the same rule."""
    return g is not None and g > 0 and vpl > 0 and g * vpl * E * sum(csizes) <= COLSUM_SMEM


SHFL_PRELUDE = r"""
namespace ewrtc {
/* __shfl_xor_sync for any type of 1-8 bytes (the reduce types): through its bits */
template <class T> __device__ __forceinline__ T shfl_xor(T v, int m)
{
    static_assert(sizeof(T) <= 8, "reduce types are at most 8 bytes");
    if constexpr (sizeof(T) <= 4) {
        union { T t; unsigned u; } x;
        x.u = 0u; x.t = v;
        x.u = __shfl_xor_sync(0xffffffffu, x.u, m);
        return x.t;
    } else {
        union { T t; unsigned long long u; } x;
        x.u = 0ull; x.t = v;
        x.u = __shfl_xor_sync(0xffffffffu, x.u, m);
        return x.t;
    }
}
} /* namespace ewrtc */
"""


def _row_at(kind: str, name: str, dt: str, elem: str, col: str, row: str) -> str:
    """The C++ value of element (row, col) of a row kernel's input of kind `kind` (elem: the flat
    index of a dense array's element)."""
    S = DTYPES[dt][0]
    at = {"array": elem, "bcol": col, "brow": row, "bone": "0"}[kind]
    return f"ewrtc::ld((const {S} *)_ewrtc_P.p_{name} + ({at}))"


def row_source(backend: str, name: str, layout: Layout, E: int, map_expr: str, reduce_expr: str, operation: str,
               identity: str, reduce_ctype: str, preamble: str, tdefs: str, read_outputs,
               stage2: tuple[str, str, str] | None = None, g: int | None = None,
               consts: tuple[tuple[str, str], ...] = (), combine_groups: bool = True) -> tuple[str, list[str]]:
    """(source, entries) of a row kernel over rows of `cols` elements (ewkern.RowKernel): for
    each row, map_expr over its elements reduced by reduce_expr from identity into `a`, then
    operation over the same elements with `a` in scope. layout ('contig') holds the parameters:
    'array' inputs and every output dense over [rows, cols], 'bcol' inputs one row, 'brow' one
    element per row, 'bone' one element, scalars.

    CPU: one entry, rows split among OpenMP threads, each row reduced in column order, then
    applied. CUDA: a group of G lanes (a power of two, up to 1024) per row; E elements per vector
    (16 bytes of the widest dense array, or 1 when the arrays cannot be aligned together; the
    host checks cols % E == 0). Forms (ROW_FORMS order): VPL = 1, 2 or 4 vectors per lane kept
    in registers, so the row is read from memory once and the apply reuses the loaded values
    (in place is safe: a group loads its whole row before it stores); VPL = 0 for rows longer
    than 4 x 1024 vectors, read a second time for the apply (mostly from L2, the first read
    evict_last), in steps of TPC vectors a lane loaded together (in place is safe: a lane loads its
    step before it stores it); VPL = -2, the same with one step of 2 vectors a lane (the host's
    lean form for many rows: fewer registers, every lane resident). The lanes combine by
    a butterfly in which the lower lane's value is always `a` and the higher's `b`, then across
    the group's warps in warp order through shared memory, so every lane ends with the same
    value, in an order fixed by the shape and E: results do not change from run to run.

    stage2 (map2_expr, reduce2_expr, identity2), for derived backwards: a second reduction over
    the same row after the first, its map with `a` (the first result) in scope, into
    ROW_STAGE2 (in scope in the operation with `a`); on CUDA over the registers again. A second
    map that reads neither `a` nor the row constants is folded beside the first, in the same pass
    over the row (rmsnorm's derived backward, whose row constant multiplies the sum instead).

    consts ((name, C++ expression), ...): row constants of the type in0_type, computed once a
    row after the first reduction with `a` in scope (and the scalars, _row_size), in scope in the
    second reduction's map and in the operation.

    combine_groups: column-sum outputs of the register forms that colsum_combines admits are added
    across a block's groups in shared memory and written as one partial row a block (launch bound
    COLSUM_BLOCK); False: one partial row a group, no shared memory for it, bound max(256, g).

    g: on CUDA, the lanes per row fixed at compile time (None: read from the parameters at run
    time). The host compiles per G: the lanes' vector indices and load addresses fold into
    constants (sm_90 rmsnorm without a weight, float32 at VPL 4: 46 registers at run-time G, 5
    blocks of 256 an SM; 32 with G = 256, 8 blocks)."""
    src = Source(f"{name}.{'cpp' if backend == 'cpu' else 'cu'}")
    if backend == "cuda":
        src.add(f'#include "{VECTOR_HEADER}"')
    src.add(PRELUDE)
    if backend == "cuda":
        src.add(VECTOR_PRELUDE)
        src.add(SHFL_PRELUDE)
    src.add(tdefs)
    src.add(f"typedef {reduce_ctype} type_reduce;\ntypedef {reduce_ctype} _type_reduce;")
    src.add(struct_source("ewrtc_args", layout))
    src.add("struct ewrtc_params { ewrtc_args a; long long rows, cols, G, prefetch, tiles, wb; };")
    if preamble:
        src.user(preamble, name, "preamble")
    ins = [a for a in layout.args if not a[0].is_output and a[2] != "scalar"]
    outs = [a for a in layout.args if a[0].is_output]
    scalars = [a for a in layout.args if a[2] == "scalar"]
    csum = [a for a in outs if a[2] == "colsum"]
    csum_names = {a[0].name for a in csum}
    # the register forms whose column sums a block's groups combine (colsum_combines)
    csizes = colsum_bytes([a[1] for a in csum])
    cb = [v for v in ROW_FORMS if csum and combine_groups and colsum_combines(g, v, E, csizes)]
    if csum and backend == "cpu":
        src.add("#ifdef _OPENMP\n#include <omp.h>\n#endif")

    def combine(indent, acc, lo, hi, expr=reduce_expr, what="reduce_expr"):
        src.add(f"{indent}{{ const type_reduce a = {lo}, b = {hi}; {acc} = (type_reduce)(")
        src.user(expr, name, what, close=");")
        src.add(f"{indent}}}")

    # the inputs map_expr may read (the preamble's macros included): only these are loaded for the
    # reduction, and on CUDA only these are held in registers until the apply
    in_map = identifiers(map_expr) | identifiers(preamble) | (identifiers(stage2[0]) if stage2 else set())
    # a second map that reads neither `a` nor the row constants (rmsnorm's derived backward: _g * w * x,
    # its row constant applied to the sum) is folded in the first pass over the row, beside the first
    # map: one pass fewer (on CUDA's two-pass form one read of the row fewer from memory)
    fuse2 = stage2 is not None and not identifiers(stage2[0]) & ({"a", ROW_STAGE2} | {n for n, _ in consts})

    def map_into(indent, value, stage=1, fused=False):
        """the element's inputs (value(param, dtype, kind)), the mapped value folded into _acc
        (stage 2: into _acc2, with the first stage's `a` in scope; fused: stage 1 and 2 both)"""
        expr, acc = (map_expr, "_acc") if stage == 1 else (stage2[0], "_acc2")
        src.add(f"{indent}{{")
        if stage == 2:
            src.add(f"{indent}    const type_reduce a = _acc; (void)a;")
        for p, dt, kind, _ in ins:
            if p.name in in_map:
                src.add(f"{indent}    const {DTYPES[dt][1]} {p.name} = {value(p, dt, kind)};")
        src.add(f"{indent}    const type_reduce _m = (type_reduce)(")
        src.user(expr, name, "map_expr" if stage == 1 else "map2_expr", close=");")
        if stage == 1:
            combine(indent + "    ", acc, acc, "_m")
        else:
            combine(indent + "    ", acc, acc, "_m", stage2[1], "reduce2_expr")
        if fused:
            src.add(f"{indent}    {{")
            src.add(f"{indent}        const type_reduce _m2 = (type_reduce)(")
            src.user(stage2[0], name, "map2_expr", close=");")
            combine(indent + "        ", "_acc2", "_acc2", "_m2", stage2[1], "reduce2_expr")
            src.add(f"{indent}    }}")
        src.add(f"{indent}}}")

    def apply(indent, value, store):
        """the element's parameters (outputs the operation reads are loaded), `a`, the operation,
        the stores (store(param, dtype): a statement)"""
        src.add(f"{indent}{{")
        for p, dt, kind, _ in ins:
            src.add(f"{indent}    const {DTYPES[dt][1]} {p.name} = {value(p, dt, kind)};")
        for p, dt, kind, _ in outs:
            # a C-style cast: `long long()` or `unsigned char()` (a type of two words) does not parse
            init = value(p, dt, kind) if p.name in read_outputs else f"({DTYPES[dt][1]})0"
            src.add(f"{indent}    {DTYPES[dt][1]} {p.name} = {init};")
        src.add(f"{indent}    const type_reduce a = _acc;")
        if stage2:
            src.add(f"{indent}    const type_reduce {ROW_STAGE2} = _acc2;")
        src.add(f"{indent}    {{")
        src.user(operation, name, "operation", ";")
        src.add(f"{indent}    }}")
        for p, dt, kind, _ in outs:
            src.add(f"{indent}    {store(p, dt)};")
        src.add(f"{indent}}}")

    def scalars_and_sizes(indent):
        for p, dt, kind, _ in scalars:
            src.add(f"{indent}const {DTYPES[dt][1]} {p.name} = _ewrtc_P.s_{p.name};")
        src.add(f"{indent}const long long _row_size = _ewrtc_PP.cols; (void)_row_size;")
        src.add(f"{indent}const ewrtc::Ind _ind = {{_ewrtc_PP.rows * _ewrtc_PP.cols}}; (void)_ind;")

    def row_consts(indent):
        if not consts:
            return
        src.add(f"{indent}in0_type {', '.join(n for n, _ in consts)};")
        src.add(f"{indent}{{")
        src.add(f"{indent}    const type_reduce a = _acc; (void)a;")
        for n, c in consts:
            src.add(f"{indent}    {n} = {c};")
        src.add(f"{indent}}}")

    # float16 arrays of the CPU form: converted a tile of CPU_HALF_TILE columns at a time by F16C
    # (h2f_n, f2h_n: the same bits as ld and st's integer forms, which gcc does not vectorise;
    # element by element a float16 rmsnorm ran at a third of bfloat16's speed)
    half_in = [a for a in ins if a[1] == "float16" and a[2] in ("array", "bcol")]
    half_out = [a for a in outs if a[1] == "float16" and a[0].name not in csum_names]

    def half_base(p, kind):
        return f"(ewrtc::half_bits *)_ewrtc_P.p_{p.name} + {'_ew_r * _ewrtc_PP.cols + ' if kind != 'bcol' else ''}_c0"

    def rows_phase(phase, used) -> None:
        """one phase of a row (map, map2, apply) over its columns in order; with float16 arrays
        over tiles of columns, the float16 arrays the phase reads (`used`) widened into float tiles
        first and float16 outputs rounded back after each tile"""
        T, tiles = CPU_HALF_TILE, bool(half_in or half_out)
        tiled = {p.name for p, dt, kind, _ in half_in if p.name in used} if tiles else set()
        if phase == "apply":
            tiled |= {p.name for p, dt, kind, _ in half_out}
        ind = "                " if tiles else "            "
        if tiles:
            src.add(f"        for (long long _c0 = 0; _c0 < _ewrtc_PP.cols; _c0 += {T}) {{")
            src.add(f"            const long long _cn = _ewrtc_PP.cols - _c0 < {T} ? _ewrtc_PP.cols - _c0 : {T};")
            for p, dt, kind, _ in half_in + (half_out if phase == "apply" else []):
                if p.name in tiled:
                    src.add(f"            float _f_{p.name}[{T}];")
                    if not p.is_output or p.name in read_outputs:
                        src.add(f"            ewrtc::h2f_n({half_base(p, kind)}, _f_{p.name}, _cn);")
            src.add("            for (long long _ew_c = _c0; _ew_c < _c0 + _cn; ++_ew_c) {")
        else:
            src.add("        for (long long _ew_c = 0; _ew_c < _ewrtc_PP.cols; ++_ew_c) {")
        src.add(f"{ind}const long long i = _ew_r * _ewrtc_PP.cols + _ew_c; (void)i;")

        def val(p, dt, kind):
            return (f"_f_{p.name}[_ew_c - _c0]" if p.name in tiled else
                    _row_at(kind, p.name, dt, "i", "_ew_c", "_ew_r"))
        if phase == "map":
            map_into(ind, val, 1, fuse2)
        elif phase == "map2":
            map_into(ind, val, 2)
        else:
            apply(ind, val, lambda p, dt: (f"_cs_{p.name}[_ew_c] += {p.name}" if p.name in csum_names else
                                           f"_f_{p.name}[_ew_c - _c0] = {p.name}" if p.name in tiled else
                                           f"ewrtc::st(({DTYPES[dt][0]} *)_ewrtc_P.p_{p.name} + i, {p.name})"))
        if tiles:
            src.add("            }")
            for p, dt, kind, _ in (half_out if phase == "apply" else []):
                src.add(f"            ewrtc::f2h_n(_f_{p.name}, {half_base(p, kind)}, _cn);")
        src.add("        }")

    def rows_body() -> None:   # the CPU form's loop over the rows
        src.add("    for (long long _ew_r = 0; _ew_r < _ewrtc_PP.rows; ++_ew_r) {")
        src.init("        ", "_acc", identity, name)
        if stage2:
            src.init("        ", "_acc2", stage2[2], name, "identity2")
        everything = {p.name for p, dt, kind, _ in ins}
        for k, phase in enumerate(("map", "map2", "apply") if stage2 and not fuse2 else ("map", "apply")):
            if k == 1:   # after the first reduction
                row_consts("        ")
            rows_phase(phase, everything if phase == "apply" else in_map)   # what map_into/apply read
        src.add("    }")

    if backend == "cpu":
        entry = f"ewrtc_{name}"
        src.add(f'extern "C" void {entry}(const ewrtc_params *_ewrtc_PP_, int _threads)')
        src.add("{")
        src.add("    const ewrtc_params _ewrtc_PP = *_ewrtc_PP_;")
        src.add("    const ewrtc_args &_ewrtc_P = _ewrtc_PP.a;")
        scalars_and_sizes("    ")

        def rows_loop(team: bool) -> None:
            if csum:   # each thread sums its rows into its own row of the partials (zeroed by the host)
                src.add("    {")
                src.add(f"    const long long _tid = {'omp_get_thread_num()' if team else '0'};")
                for p, dt, kind, _ in csum:
                    src.add(f"    {DTYPES[dt][1]} *const _cs_{p.name} = ({DTYPES[dt][1]} *)_ewrtc_P.p_{p.name} + "
                            "_tid * _ewrtc_PP.cols;")
                if team:
                    src.add("#pragma omp for schedule(static)")
            rows_body()
            if csum:
                src.add("    }")
        _cpu_team_loop(src, "parallel" if csum else "parallel for schedule(static)", None, rows_loop)
        src.add("}")
        return src.text(), [entry]


    vec = [a for a in ins + outs if a[2] in ("array", "bcol")]
    src.add("template <int _ewrtc_VPL>")
    src.add(f"__device__ __forceinline__ void ewrtc_{name}_run(const ewrtc_params &_ewrtc_PP)")
    src.add("{")
    src.add(f"    enum {{ _ewrtc_E = {E} }};")
    src.add("    const ewrtc_args &_ewrtc_P = _ewrtc_PP.a;")
    src.add(f"    const int _G = {g if g else 'int(_ewrtc_PP.G)'}, _lane = int(threadIdx.x) & (_G - 1);")
    src.add("    const int _nv = int(_ewrtc_PP.cols / _ewrtc_E);   /* vectors per row (the host checks cols % _ewrtc_E == 0) */")

    def row_pointers():
        src.add("    const bool _live = _ew_r < _ewrtc_PP.rows;")
        for p, dt, kind, _ in vec:
            q = "" if p.is_output else "const "
            off = f" + _ew_r * _nv" if kind == "array" else ""
            src.add(f"    {q}_U_{p.name} *const _u_{p.name} = ({q}_U_{p.name} *)_ewrtc_P.p_{p.name}{off};")
    for p, dt, kind, _ in vec:
        src.add(f"    typedef ewrtc::Pack<{DTYPES[dt][0]}, _ewrtc_E> _U_{p.name};")
        src.add(f"    typedef ewrtc::Held<{DTYPES[dt][0]}, {E}>::type _H_{p.name};")
    dense_in = [a for a in ins if a[2] == "array"]
    bcols = [a for a in ins if a[2] == "bcol"]
    read_outs = [a for a in outs if a[0].name in read_outputs]
    if csum:
        # column sums (a weight's gradient): each block takes _ewrtc_PP.tiles tiles of blockDim.x / G rows
        # in turn; each group adds its rows' values, in row order, into its own row of the partials
        # (lane-owned elements: no races, the order fixed); the host sums the partials' rows. The
        # register forms (VPL > 0) add in registers (_ca_: the lane's VPL x E columns) and write
        # their partial row once after the last tile; the two-pass form adds into the partial row
        # in memory, row by row
        src.add("    pdl_wait();")
        src.add("    pdl_launch_dependents();")
        scalars_and_sizes("    ")
        src.add("    const int _groups = int(blockDim.x) / _G, _group = int(threadIdx.x) / _G;")
        # the register forms at a compile-time G combine the block's groups (colsum_combines):
        # one partial row a block, which group 0 writes
        src.add(f"    constexpr bool _CB = {' || '.join(f'_ewrtc_VPL == {v}' for v in cb) or 'false'};")
        for p, dt, kind, _ in csum:
            C = DTYPES[dt][1]
            src.add(f"    {C} *const _cs_{p.name} = ({C} *)_ewrtc_P.p_{p.name} + (_CB ? (long long)blockIdx.x"
                    " : (long long)blockIdx.x * _groups + _group) * _ewrtc_PP.cols;")
            src.add(f"    {C} _ca_{p.name}[_ewrtc_VPL > 0 ? _ewrtc_VPL : 1][_ewrtc_E];")
            src.add("#pragma unroll")
            src.add("    for (int _q = 0; _q < (_ewrtc_VPL > 0 ? _ewrtc_VPL : 1); ++_q)")
            src.add("#pragma unroll")
            src.add("        for (int _k = 0; _k < _ewrtc_E; ++_k)")
            src.add(f"            _ca_{p.name}[_q][_k] = {C}(0);")
            src.add("    if constexpr (_ewrtc_VPL <= 0)")
            src.add("        for (int _v = _lane; _v < _nv; _v += _G)")
            src.add(f"            ewrtc::st_part(_cs_{p.name} + _v * _ewrtc_E, _ca_{p.name}[0]);   /* zeros */")
        src.add("    for (long long _t = 0; _t < _ewrtc_PP.tiles; ++_t) {")
        src.add("    if (_t > 0)")
        src.add("        __syncthreads();   /* the combines' shared slots are used again */")
        src.add("    const long long _ew_r = ((long long)blockIdx.x * _ewrtc_PP.tiles + _t) * _groups + _group;")
        row_pointers()
    else:
        src.add("    const long long _ew_r = (long long)blockIdx.x * (blockDim.x / _G) + threadIdx.x / _G;")
        row_pointers()
        prefetch_then_wait(src, "(long long)blockIdx.x < _ewrtc_PP.prefetch && _live && _lane < _nv", dense_in, "_lane",
                           "_lane == 0")
        scalars_and_sizes("    ")
    for p, dt, kind, _ in ins + outs:
        if kind in ("brow", "bone"):
            at = "_ew_r" if kind == "brow" else "0"
            src.add(f"    const {DTYPES[dt][1]} _s_{p.name} = _live ? ewrtc::ld((const {DTYPES[dt][0]} *)_ewrtc_P.p_{p.name}"
                    f" + ({at})) : ({DTYPES[dt][1]})0;")
    src.init("    ", "_acc", identity, name)
    if stage2 is not None:   # with _acc, as the CPU form declares it, folded or not
        src.init("    ", "_acc2", stage2[2], name, "identity2")

    def reg_value(p, dt, kind):
        if kind == "bcol":
            return f"ewrtc::ld(&_u_{p.name}[_v].v[_k])"
        if kind == "array":
            return f"ewrtc::elem(_r_{p.name}[_q], _k)"
        return f"_s_{p.name}"

    def mem_value(p, dt, kind):
        if kind in ("array", "bcol"):
            return f"ewrtc::elem(_c_{p.name}[_q], _k)"
        return f"_s_{p.name}"

    # the two-pass form (VPL 0) steps through the row TPC vectors a lane at a time: each step's
    # loads are issued together before any use (an apply that stores between them would wait on
    # each load in turn: ptxas cannot move a load above a store that may alias it, as in place)
    two_pass_loads = len(dense_in + bcols + read_outs)
    src.add(f"    enum {{ _ewrtc_TPC = _ewrtc_VPL < 0 ? -_ewrtc_VPL : {max(1, ROW_TWO_PASS_VECTORS // max(1, two_pass_loads))} }};")

    def chunk_loop(indent, arrays, how):
        """the two-pass form's loop over a lane's vectors, TPC a step, each array's step loaded
        into _c_<name>[TPC] by ewrtc::<how> for dense inputs (ldkeep: L2 evict_last, the row is read
        again; lddrop: evict_first, its last read), ldkeep for a repeated row (every group reads it)"""
        src.add(f"{indent}for (int _v0 = _lane; _live && _v0 < _nv; _v0 += _ewrtc_TPC * _G) {{")
        for p, dt, kind, _ in arrays:
            src.add(f"{indent}    _H_{p.name} _c_{p.name}[_ewrtc_TPC];")
        src.add("#pragma unroll")
        src.add(f"{indent}    for (int _q = 0; _q < _ewrtc_TPC; ++_q)")
        src.add(f"{indent}        if (_v0 + _q * _G < _nv) {{")
        for p, dt, kind, _ in arrays:
            f = how if kind == "array" and not p.is_output else "ldkeep" if kind == "bcol" else None
            at = f"_u_{p.name} + (_v0 + _q * _G)"
            src.add(f"{indent}            _c_{p.name}[_q] = " + (f"ewrtc::{f}(ewrtc::held({at}));" if f
                                                                else f"ewrtc::hold({at});"))
        src.add(f"{indent}        }}")

    # VPL > 0: the row's dense inputs in registers; a repeated row ('bcol': a weight) is read
    # where it is used, vector by vector (the same row for every group: from L1 or L2), so it
    # holds no registers through the reductions (rmsnorm float32 at VPL 4: 62 registers with the
    # weight held, 46 without, sm_90: 4 -> 5 blocks of 256 lanes an SM; its derived backward in
    # bfloat16 spilled 368 bytes with the weight held). A dense input stays held even when only
    # the apply reads it: loaded there, each vector's load would wait on DRAM between the stores.
    held = dense_in
    late = bcols
    for p, dt, kind, _ in held:
        src.add(f"    _H_{p.name} _r_{p.name}[_ewrtc_VPL > 0 ? _ewrtc_VPL : 1];")

    def map_pass(stage, fused=False):
        """one reduction's map over the row: from the registers (VPL > 0; the first pass loads
        them) or read from memory (VPL = 0); fused (stage 1): the two-pass form maps stage 2 beside
        it; (stage 2) only the register forms' map, the two-pass form's done in the first pass"""
        src.add("    if constexpr (_ewrtc_VPL > 0) {")
        if stage == 1:
            src.add("#pragma unroll")
            src.add("        for (int _q = 0; _q < _ewrtc_VPL; ++_q) {")
            src.add("            const int _v = _lane + _q * _G;")
            src.add("            if (_live && _v < _nv) {")
            for p, dt, kind, _ in held:
                src.add(f"                _r_{p.name}[_q] = ewrtc::hold(_u_{p.name} + _v);")
            src.add("            }")
            src.add("        }")
        src.add("#pragma unroll")
        src.add("        for (int _q = 0; _q < _ewrtc_VPL; ++_q) {")
        src.add("            const int _v = _lane + _q * _G;")
        src.add("            if (_live && _v < _nv) {")
        # a repeated row the map reads: one vector load a lane's vector (unused: the compiler
        # drops it), not E loads of one element (16-bit rmsnorm's derived backward, sm_90: 16
        # LDG.E.U16 a lane in its second pass, where the apply read the same row as 2 LDG.E.128)
        for p, dt, kind, _ in bcols:
            if p.name in in_map:
                src.add(f"                const _H_{p.name} _c_{p.name} = ewrtc::hold(_u_{p.name} + _v);")
        src.add("#pragma unroll")
        src.add("                for (int _k = 0; _k < _ewrtc_E; ++_k) {")
        src.add("                    const long long i = _ew_r * _ewrtc_PP.cols + (long long)_v * _ewrtc_E + _k; (void)i;")
        map_into("                    ", lambda p, dt, kind: (f"ewrtc::elem(_c_{p.name}, _k)" if kind == "bcol"
                                                             else reg_value(p, dt, kind)), stage)
        src.add("                }")
        src.add("            }")
        src.add("        }")
        if fused and stage == 2:
            src.add("    }")
            return
        src.add("    } else {")
        # the two-pass form: TPC vectors a lane loaded together, then mapped in order; the row
        # kept in L2 for the next pass (evict_last)
        chunk_loop("        ", [a for a in dense_in + bcols if a[0].name in in_map], "ldkeep")
        src.add("#pragma unroll")
        src.add("            for (int _q = 0; _q < _ewrtc_TPC; ++_q) {")
        src.add("                const int _v = _v0 + _q * _G;")
        src.add("                if (_v < _nv) {")
        src.add("#pragma unroll")
        src.add("                    for (int _k = 0; _k < _ewrtc_E; ++_k) {")
        src.add("                        const long long i = _ew_r * _ewrtc_PP.cols + (long long)_v * _ewrtc_E + _k; (void)i;")
        map_into("                        ", mem_value, stage, fused)
        src.add("                    }")
        src.add("                }")
        src.add("            }")
        src.add("        }")
        src.add("    }")

    map_pass(1, fuse2)

    def lane_combine(acc, sh, expr, what):
        group_combine(src, acc, sh, lambda indent, a, lo, hi: combine(indent, a, lo, hi, expr, what))

    lane_combine("_acc", "_sh", reduce_expr, "reduce_expr")
    row_consts("    ")
    if stage2:
        # the second reduction: over the registers again (VPL > 0) or the row read again; fused:
        # the two-pass form mapped it in the first pass (over the registers the map's work came
        # before the first combine and float32's rmsnorm backward at 4 MiB lost 4% on the H200)
        map_pass(2, fuse2)
        lane_combine("_acc2", "_sh2", stage2[1], "reduce2_expr")

    def emit_apply(indent, value, have_regs):
        src.add(f"{indent}const int _v = {'_lane' if have_regs else '_v0'} + _q * _G;")
        src.add(f"{indent}if (_live && _v < _nv) {{")
        for p, dt, kind, _ in (late + read_outs if have_regs else []):   # the two-pass form loaded its step
            src.add(f"{indent}    const _H_{p.name} _c_{p.name} = ewrtc::hold(_u_{p.name} + _v);")
        dense_outs = [a for a in outs if a[2] != "colsum"]
        for p, dt, kind, _ in dense_outs:
            src.add(f"{indent}    _U_{p.name} _w_{p.name};")
        if not have_regs:   # the two-pass form adds into the partial row in memory, a vector at a time
            for p, dt, kind, _ in csum:
                src.add(f"{indent}    {DTYPES[dt][1]} _pa_{p.name}[_ewrtc_E];")
                src.add(f"{indent}    ewrtc::ld_part(_cs_{p.name} + _v * _ewrtc_E, _pa_{p.name});")
        src.add("#pragma unroll")
        src.add(f"{indent}    for (int _k = 0; _k < _ewrtc_E; ++_k) {{")
        src.add(f"{indent}        const long long i = _ew_r * _ewrtc_PP.cols + (long long)_v * _ewrtc_E + _k; (void)i;")
        cs_at = "_ca_{}[_q][_k]" if have_regs else "_pa_{}[_k]"
        apply(indent + "        ", value, lambda p, dt: (f"{cs_at.format(p.name)} += {p.name}" if p.name in csum_names
                                                         else f"ewrtc::st(&_w_{p.name}.v[_k], {p.name})"))
        src.add(f"{indent}    }}")
        for p, dt, kind, _ in dense_outs:
            src.add(f"{indent}    ewrtc::stv(_u_{p.name} + _v, _w_{p.name}, _ewrtc_PP.wb);")
        if not have_regs:
            for p, dt, kind, _ in csum:
                src.add(f"{indent}    ewrtc::st_part(_cs_{p.name} + _v * _ewrtc_E, _pa_{p.name});")
        src.add(f"{indent}}}")

    src.add("    if constexpr (_ewrtc_VPL > 0) {")
    src.add("#pragma unroll")
    src.add("        for (int _q = 0; _q < _ewrtc_VPL; ++_q) {")
    late_names = {a[0].name for a in late}
    emit_apply("            ", lambda p, dt, kind: (f"ewrtc::elem(_c_{p.name}, _k)" if p.is_output or p.name in late_names
                                                    else reg_value(p, dt, kind)), True)
    src.add("        }")
    src.add("    } else {")
    # the row's last read: not kept in L2 (evict_first)
    chunk_loop("        ", dense_in + bcols + read_outs, "lddrop")
    src.add("#pragma unroll")
    src.add("            for (int _q = 0; _q < _ewrtc_TPC; ++_q) {")
    emit_apply("                ", mem_value, False)
    src.add("            }")
    src.add("        }")
    src.add("    }")
    if csum:
        src.add("    }")
    if csum and cb:
        src.add("    if constexpr (_CB) {")
        # groups _groups - 1 .. 1 in turn add into shared memory, then group 0 adds the sum: a
        # fixed order (g0 + (g1 + (g2 + ...))), each lane its own columns
        for p, dt, kind, _ in csum:
            src.add(f"        __shared__ {DTYPES[dt][1]} _cb_{p.name}[_ewrtc_VPL > 0 ? _ewrtc_VPL : 1][_ewrtc_E][{g or 1}];")
        src.add("        for (int _s = _groups - 1; _s >= 0; --_s) {")
        src.add("            if (_group == _s && _groups > 1)")
        src.add("#pragma unroll")
        src.add("                for (int _q = 0; _q < _ewrtc_VPL; ++_q)")
        src.add("#pragma unroll")
        src.add("                    for (int _k = 0; _k < _ewrtc_E; ++_k) {")
        for p, dt, kind, _ in csum:
            ca, sh = f"_ca_{p.name}[_q][_k]", f"_cb_{p.name}[_q][_k][_lane]"
            src.add(f"                        if (_s < _groups - 1) {ca} += {sh};")
            src.add(f"                        if (_s > 0) {sh} = {ca};")
        src.add("                    }")
        src.add("            if (_s > 0)")
        src.add("                __syncthreads();")
        src.add("        }")
        src.add("    }")
    if csum:
        src.add("    if constexpr (_ewrtc_VPL > 0) {")
        if cb:
            src.add("        if (_CB && _group != 0)")
            src.add("            return;")
        src.add("#pragma unroll")
        src.add("        for (int _q = 0; _q < _ewrtc_VPL; ++_q) {")
        src.add("            const int _v = _lane + _q * _G;")
        src.add("            if (_v < _nv) {")
        for p, dt, kind, _ in csum:
            src.add(f"                ewrtc::st_part(_cs_{p.name} + _v * _ewrtc_E, _ca_{p.name}[_q]);")
        src.add("            }")
        src.add("        }")
        src.add("    }")
    src.add("}")
    entries = []
    for vpl in ROW_FORMS:
        entry = f"ewrtc_{name}_r{vpl}" if vpl >= 0 else f"ewrtc_{name}_t{-vpl}"
        entries.append(entry)
        # the bound is the block the host launches (ROW_MIN_BLOCK or G lanes): 1024 would cap a
        # lane at 64 registers, and the derived backwards spilled under it
        bound = max(ROW_MIN_BLOCK, g, COLSUM_BLOCK if cb else 0) if g else 1024
        src.add(f'extern "C" __global__ void __launch_bounds__({bound}) {entry}'
                "(const ewrtc_params _ewrtc_PP)")
        src.add(f"{{ ewrtc_{name}_run<{vpl}>(_ewrtc_PP); }}")
    if csum:
        # the partial rows' sum, one entry per column-sum output (after the forms): a block of
        # COLSUM_SLICES x 32 threads per 32 columns, lanes over the columns (coalesced), slice s
        # summing rows s, s + SLICES, ... in order, then the slices in order: the same bits always
        src.add("struct ewrtc_colsum_params { const char *part; char *out; long long P, cols; };")
        for p, dt, kind, _ in csum:
            entry = f"ewrtc_{name}_sum_{p.name}"
            entries.append(entry)
            C = DTYPES[dt][1]
            src.add(f'extern "C" __global__ void __launch_bounds__({32 * COLSUM_SLICES}) {entry}'
                    "(const ewrtc_colsum_params Q)")
            src.add("{")
            src.add("    const long long _c = (long long)blockIdx.x * 32 + (threadIdx.x & 31);")
            src.add("    const int _s = int(threadIdx.x >> 5);")
            src.add("    pdl_wait();")
            src.add("    pdl_launch_dependents();")
            src.add(f"    {C} _t = {C}(0);")
            src.add("    if (_c < Q.cols)")
            src.add("#pragma unroll 8")   # 8 loads in flight a thread (the adds stay in row order)
            src.add(f"        for (long long _r = _s; _r < Q.P; _r += {COLSUM_SLICES})")
            src.add(f"            _t += ((const {C} *)Q.part)[_r * Q.cols + _c];")
            src.add(f"    __shared__ {C} _sl[{COLSUM_SLICES}][32];")
            src.add("    _sl[_s][threadIdx.x & 31] = _t;")
            src.add("    __syncthreads();")
            src.add("    if (_s != 0 || _c >= Q.cols)")
            src.add("        return;")
            src.add(f"    for (int _k = 1; _k < {COLSUM_SLICES}; ++_k)")
            src.add("        _t += _sl[_k][threadIdx.x];")
            src.add(f"    ewrtc::st(({DTYPES[dt][0]} *)Q.out + _c, _t);")
            src.add("}")
    return src.text(), entries
