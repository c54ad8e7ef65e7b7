/*
 * elementwise_types.cuh: what every elementwise kernel file's device code shares: the 16-bit element
 * types, their pairs, and the bit casts between a pair and a 32-bit word. Device code only (no host
 * API), so that elementwise_kernel.cuh, which includes it, stays compilable on its own.
 */
#ifndef EWKERN_ELEMENTWISE_TYPES_CUH
#define EWKERN_ELEMENTWISE_TYPES_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#ifndef __CUDACC_RTC__
#include <cstdint>
#include <cstring> /* memcpy (NVRTC has it built in) */
#else
/* NVRTC carries no <cstdint>: the fixed-width types the kernels name */
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned int uint32_t;
#endif

namespace ewk {

#define EW_DEV __device__ __forceinline__

typedef __half half_t;
typedef __nv_bfloat16 bf16_t;

template <class T> struct Pair;
template <> struct Pair<half_t> { typedef __half2 type; };
template <> struct Pair<bf16_t> { typedef __nv_bfloat162 type; };

template <class P>
EW_DEV P bits_as(unsigned w)
{
    P p;
    memcpy(&p, &w, sizeof(p));
    return p;
}
template <class P>
EW_DEV unsigned as_bits(P p)
{
    unsigned w;
    memcpy(&w, &p, sizeof(w));
    return w;
}

} /* namespace ewk */

#endif /* EWKERN_ELEMENTWISE_TYPES_CUH */
