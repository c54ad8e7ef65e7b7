/*
 * half.h: float16 (IEEE binary16) and bfloat16 <-> float32 conversions for the CPU kernels.
 *
 *     float    ew_half_to_float(uint16_t h)   exact; subnormals, inf and NaN (payload kept)
 *     uint16_t ew_float_to_half(float f)      round to nearest even; overflow -> inf;
 *                                              NaN -> quiet NaN, sign and top payload bits kept
 *     float    ew_bf16_to_float(uint16_t h)   exact (the top half of a float)
 *     uint16_t ew_float_to_bf16(float f)      round to nearest even; NaN -> quiet NaN
 *
 * Portable C11 bit manipulation, written without branches (every case is computed and one is
 * picked with a bit mask) so that gcc vectorises loops that call them, SSE2 included. The masks
 * matter: with a ?: gcc sinks the one float operation of each converter into a branch and then,
 * under the default -ftrapping-math, refuses to if-convert the loop. No dependence on F16C or
 * _Float16. Integer arithmetic is done in uint32_t; type punning goes through memcpy.
 * The helpers assume IEEE float32 and the default rounding mode (round to nearest even).
 */
#ifndef EWKERN_CPU_HALF_H
#define EWKERN_CPU_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t ew_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ew_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* cond ? a : b for cond in {0, 1}, without a branch the compiler could sink work into */
static inline uint32_t ew_pick_u32(uint32_t cond, uint32_t a, uint32_t b)
{
    const uint32_t mask = 0u - cond;
    return (a & mask) | (b & ~mask);
}

static inline float ew_half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = (uint32_t)(h & 0x7fffu);  /* exponent and mantissa */
    const uint32_t shifted = em << 13;             /* mantissa in float position */
    /* Normal: rebias the exponent from 15 to 127. */
    const uint32_t normal = shifted + ((127u - 15u) << 23);
    /* Inf/NaN: all exponent bits set, mantissa (NaN payload) kept. */
    const uint32_t infnan = shifted | 0x7f800000u;
    /* Zero/subnormal: m * 2^-24, formed as (2^-14 * (1 + m / 2^10)) - 2^-14, which is exact
     * and touches no subnormal float. */
    const uint32_t sub = ew_float_bits(ew_bits_float(shifted | (113u << 23))
                                       - ew_bits_float(113u << 23));
    uint32_t r = ew_pick_u32(em >= 0x7c00u, infnan, normal);
    r = ew_pick_u32(em < 0x0400u, sub, r);
    return ew_bits_float(r | sign);
}

static inline uint16_t ew_float_to_half(float f)
{
    const uint32_t u = ew_float_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;            /* |f| */
    /* NaN: quiet, top 9 payload bits kept. */
    const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    /* |f| < 2^-14 (half subnormal or zero): adding 0.5f leaves the result's ulp at 2^-24,
     * the half subnormal spacing, so the float addition rounds (to nearest even) exactly
     * where half would; the mantissa bits are then the half bits. A carry to 0x400 gives the
     * smallest normal half, as it should. */
    const uint32_t sub = ew_float_bits(ew_bits_float(a) + 0.5f) - 0x3f000000u;
    /* Normal: rebias, then round to nearest even on the 13 dropped bits. A carry out of the
     * mantissa bumps the exponent, which is right, and past 65504 gives 0x7c00 (inf). */
    const uint32_t normal = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    uint32_t r = ew_pick_u32(a < (113u << 23), sub, normal);  /* 113 << 23 is 2^-14 */
    r = ew_pick_u32(a >= (143u << 23), 0x7c00u, r);             /* |f| >= 65536, inf too */
    r = ew_pick_u32(a > 0x7f800000u, nan, r);
    return (uint16_t)(r | sign);
}

static inline float ew_bf16_to_float(uint16_t h)
{
    return ew_bits_float((uint32_t)h << 16);
}

static inline uint16_t ew_float_to_bf16(float f)
{
    const uint32_t u = ew_float_bits(f);
    /* Round to nearest even on the low 16 bits; cannot wrap for non-NaN input (the largest,
     * -inf = 0xff800000, gives 0xff807fff). Overflow past the largest bfloat16 gives inf. */
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x0040u;      /* quiet NaN, sign and top payload kept */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#endif /* EWKERN_CPU_HALF_H */
