/*
 * pdl.cuh: programmatic dependent launch (PDL, compute capability 9.0+), shared by the kernel files.
 *
 * A kernel launched with PDL may be scheduled while the kernel before it in the stream is still
 * running; it must execute pdl_wait() before touching global memory, which blocks until that
 * kernel has finished and its writes are visible. A kernel calls pdl_launch_dependents() to let
 * the next PDL launch be scheduled early. Both are no-ops when the kernel was launched normally,
 * so every default-path kernel calls both, and the host decides per launch (pdl_launch's `pdl`)
 * whether to ask for the overlap: ewcuda_pdl_active(device) says where the device supports it and
 * ewkern's switch is on (EWKERN_PDL=0 in the environment, or ewkern.set_pdl(False), turns it off).
 */
#ifndef EWKERN_PDL_CUH
#define EWKERN_PDL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_api.h"

__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Ask the L2 for the 128-byte line holding p (prefetch.global.L2, CCTL.E.PF2 in SASS: a hint
 * that returns no data). The auto kernels issue it before pdl_wait() for the first lines they
 * will load. That is safe although the previous kernel may still be writing those lines: the L2
 * is where global memory is coherent, so its stores update a prefetched line, and the loads come
 * after pdl_wait(); the L1 is not filled. Under PDL this overlaps the first DRAM round trip with
 * the previous kernel's last blocks. Measured on the H100 (ELEMENTWISE_NOTES.md, RMSE_NOTES.md):
 * prefetching about one step of loads per thread helps (1-16 MiB elementwise +5-25%, rmse at
 * 32 MiB +4-11%); prefetching everything a block will load at once slows it down. */
__device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* prefetch_l2 from a run of consecutive `unit`-byte loads, one request per 128-byte line: from the
 * load that starts a line, and from the run's first load (lead), whose line may start before it. */
__device__ __forceinline__ void prefetch_l2_line(const void *p, unsigned unit, bool lead)
{
    if (lead || (reinterpret_cast<uintptr_t>(p) & 127u) < unit)
        prefetch_l2(p);
}

/* Launch kernel<<<grid, block, smem, s>>>(args), as a programmatic dependent of the previous
 * work in s when pdl is true. Returns the launch's cudaError_t. */
template <typename K, typename... A>
static inline cudaError_t pdl_launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool pdl,
                                     const A &...args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 0;
    if (pdl) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

#endif /* EWKERN_PDL_CUH */
