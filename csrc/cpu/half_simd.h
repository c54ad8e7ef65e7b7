/*
 * half_simd.h: float16/bfloat16 <-> float in vector registers, for the CPU kernels' one-pass
 * 16-bit loops (elementwise.c's arithmetic ops, backward.c's cheap gradients):
 *
 *     __m512 ew_w16_f16(p), ew_w16_bf16(p)     16 elements at p widened (AVX-512F)
 *     void   ew_n16_f16(p, r), ew_n16_bf16(p, r) 16 floats rounded into p
 *     __m256 ew_w8_f16(p), ew_w8_bf16(p)       8 elements (AVX2; float16 with F16C)
 *     void   ew_n8_f16(p, r), ew_n8_bf16(p, r)
 *
 * The same bits as half.h's scalar converters, lane by lane: vcvtph2ps/vcvtps2ph round to nearest
 * even (F16C quiets a signalling float16 NaN on the way in; half.h on the way out, which no
 * result can tell apart), and the bfloat16 narrowing is ew_float_to_bf16's arithmetic. Unaligned
 * loads and stores. Only with EW_X86_DISPATCH (cpu_math.h): each function carries its target.
 */
#ifndef EWKERN_CPU_HALF_SIMD_H
#define EWKERN_CPU_HALF_SIMD_H

#include <stdint.h>

#include "cpu_math.h"

#if EW_X86_DISPATCH
#include <immintrin.h>

#define EW_ISA_AVX2_F16C __attribute__((target("avx2,fma,f16c")))
/* __builtin_cpu_supports reads a table libgcc fills before constructors run; "avx" includes
 * the check that the OS saves the YMM registers. */
#define EW_HAVE_F16C() (ew_cpu_isa_cap() >= 1 && __builtin_cpu_supports("avx") \
                        && __builtin_cpu_supports("f16c"))

/* W = 16 (AVX-512F): widen 16 elements at p, narrow 16 floats into p. The bfloat16 narrowing is
 * written per width in intrinsics: the same arithmetic once, on GCC vectors of uint32_t for both
 * widths, compiled to a zero-masked move and two ternary logic ops where this takes one masked
 * blend, and ran bfloat16 add at 1 MiB 10% slower (CI host, 2 threads: 23.5 against 21.3 us). */
EW_ISA_AVX512 static inline __m512 ew_w16_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
EW_ISA_AVX512 static inline void ew_n16_f16(uint16_t *p, __m512 r)
{
    _mm256_storeu_si256((__m256i *)(void *)p, _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
}
EW_ISA_AVX512 static inline __m512 ew_w16_bf16(const uint16_t *p)
{
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
EW_ISA_AVX512 static inline void ew_n16_bf16(uint16_t *p, __m512 r)
{
    const __m512i u = _mm512_castps_si512(r);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 isnan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                    _mm512_set1_epi32(0x7f800000));
    _mm256_storeu_si256((__m256i *)(void *)p, _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(isnan, rounded, nan)));
}

/* W = 8 (AVX2; float16 also F16C) */
EW_ISA_AVX2_F16C static inline __m256 ew_w8_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
EW_ISA_AVX2_F16C static inline void ew_n8_f16(uint16_t *p, __m256 r)
{
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
}
EW_ISA_AVX2 static inline __m256 ew_w8_bf16(const uint16_t *p)
{
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
EW_ISA_AVX2 static inline void ew_n8_bf16(uint16_t *p, __m256 r)
{
    const __m256i u = _mm256_castps_si256(r);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    /* |u| > inf's bits as signed 32-bit integers: both sides are below 2^31 */
    const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                             _mm256_set1_epi32(0x7f800000));
    const __m256i r16 = _mm256_blendv_epi8(rounded, nan, isnan);   /* each lane below 2^16 */
    /* packus works within 128-bit halves: lanes 0-3 and 4-7 land in 64-bit words 0 and 2 */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r16, r16), 0x08);
    _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(packed));
}


/* the widest form of a one-pass loop fn (fn_avx512, fn_avx2) this CPU runs, or NULL (the float
 * tiles); f16c: the AVX2 form needs F16C (float16) */
#define EW_PICK16(fn, f16c) (EW_HAVE_AVX512() ? fn##_avx512                                      \
                             : EW_HAVE_AVX2_FMA() && (!(f16c) || EW_HAVE_F16C()) ? fn##_avx2 : NULL)
#else
#define EW_HAVE_F16C() 0
#endif /* EW_X86_DISPATCH */

#endif /* EWKERN_CPU_HALF_SIMD_H */
