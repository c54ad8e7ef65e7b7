/*
 * elementwise_common.cuh: the host helpers of every elementwise kernel file (grids from the device
 * shape, alignment heads, chunking of 32-bit-index launches, the argument pointers) and, through
 * elementwise_types.cuh, the 16-bit element types, their pairs and bit casts.
 */
#ifndef EWKERN_ELEMENTWISE_COMMON_CUH
#define EWKERN_ELEMENTWISE_COMMON_CUH

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ewkern_kernels.h"
#include "device_cache.cuh"
#include "elementwise_types.cuh"

namespace ewk {

/* Launches of the 32-bit-index families cover at most this many elements (a multiple of 16, so
 * every chunk starts at the same alignment offset as the array). */
static const int64_t kChunk32 = int64_t(1) << 30;

/* ---------------------------------------------------------------------------------------------
 * Host helpers: grids from the device shape (device_cache.cuh), alignment, chunking.
 * ------------------------------------------------------------------------------------------- */

/* Blocks that fill the device `waves` times over: SMs x resident blocks per SM x waves. */
static inline int64_t wave_grid(const ew_args *a, int block, int waves)
{
    const DeviceShape d = device_shape(a->device);
    const int per_sm = d.threads_per_sm / block > 0 ? d.threads_per_sm / block : 1;
    return int64_t(d.sms) * per_sm * waves;
}

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t clamp_grid(int64_t g) { return g < 1 ? 1 : (g > INT_MAX ? INT_MAX : g); }

/* Elements before the first `align`-byte boundary when every pointer has the same offset modulo
 * `align` (capped at n); -1 when the offsets differ (vector accesses impossible for all of them). */
static inline int64_t common_head(const void *const *ptrs, int np, int align, int esize, int64_t n)
{
    const uintptr_t off = reinterpret_cast<uintptr_t>(ptrs[0]) % uintptr_t(align);
    for (int i = 1; i < np; ++i)
        if (reinterpret_cast<uintptr_t>(ptrs[i]) % uintptr_t(align) != off)
            return -1;
    const int64_t head = int64_t((uintptr_t(align) - off) % uintptr_t(align)) / esize;
    return head < n ? head : n;
}

static inline cudaStream_t stream_of(const ew_args *a) { return static_cast<cudaStream_t>(a->stream); }

/* Calls f(offset, count) for consecutive pieces of at most `chunk` elements; stops at the first
 * launch error and returns it (cudaGetLastError after each launch). */
template <class F>
static inline int for_chunks(int64_t n, int64_t chunk, F f)
{
    for (int64_t off = 0; off < n; off += chunk) {
        f(off, n - off < chunk ? n - off : chunk);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return int(e);
    }
    return 0;
}

template <class T>
static inline const T *in_at(const ew_args *a, int k, int64_t off)
{
    return a->in[k] ? static_cast<const T *>(a->in[k]) + off : nullptr;
}
template <class T>
static inline T *out_at(const ew_args *a, int64_t off)
{
    return static_cast<T *>(a->out) + off;
}

} /* namespace ewk */

#endif /* EWKERN_ELEMENTWISE_COMMON_CUH */
