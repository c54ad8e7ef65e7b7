/*
 * cpu_math.h: which vector math library the CPU kernels call, for the kernels and for
 * ewkern.build_info().
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

#include <math.h>

const char *ew_cpu_math_library(void);

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

#endif /* EWKERN_CPU_MATH_H */
