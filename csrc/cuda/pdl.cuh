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
#include "pdl_device.cuh"

/* Whether the next launch into s is a programmatic dependent of the previous work (pdl true and,
 * where s is being captured into a graph, that work is one kernel ewkern launched:
 * ewcuda_pdl_decide), for a launcher whose launch shape depends on it; hand it to pdl_launch_as,
 * with nothing launched into s in between. */
struct PdlDecision {
    bool programmatic;
    unsigned long long capture;
};
static inline PdlDecision pdl_decide(cudaStream_t s, bool pdl)
{
    PdlDecision d;
    d.programmatic = ewcuda_pdl_decide((void *)s, pdl, &d.capture) != 0;
    return d;
}

/* Launch kernel<<<grid, block, smem, s>>>(args) as a programmatic dependent when d says so, else
 * plain<<<...>>>(args): a kernel of the same signature that does not wait for a primary (the launch
 * is ordered after the previous work) and may skip what only a PDL launch needs. Returns the
 * launch's cudaError_t. */
template <typename K, typename K0, typename... A>
static inline cudaError_t pdl_launch_as(K kernel, K0 plain, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                        PdlDecision d, const A &...args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 0;
    if (d.programmatic) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs = 1;
    }
    const cudaError_t err = d.programmatic ? cudaLaunchKernelEx(&cfg, kernel, args...)
                                           : cudaLaunchKernelEx(&cfg, plain, args...);
    if (err == cudaSuccess)
        ewcuda_pdl_launched((void *)s, d.capture);
    return err;
}

/* pdl_launch_as with the decision taken here (a programmatic dependent of the previous work in s
 * when pdl is true and, where s is being captured, that work is one kernel ewkern launched) and
 * one kernel for both kinds of launch (its pdl_wait is a no-op without PDL) */
template <typename K, typename... A>
static inline cudaError_t pdl_launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool pdl,
                                     const A &...args)
{
    return pdl_launch_as(kernel, kernel, grid, block, smem, s, pdl_decide(s, pdl), args...);
}

#endif /* EWKERN_PDL_CUH */
