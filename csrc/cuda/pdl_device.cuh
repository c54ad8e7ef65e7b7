/*
 * pdl_device.cuh: the device side of programmatic dependent launch (pdl.cuh has the host side and
 * the rules): the wait, the early trigger and the L2 prefetch a kernel issues before its wait.
 * Device code only, so that a run-time compiler (NVRTC) can include it.
 */
#ifndef EWKERN_PDL_DEVICE_CUH
#define EWKERN_PDL_DEVICE_CUH

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
    if (lead || (reinterpret_cast<unsigned long long>(p) & 127u) < unit)
        prefetch_l2(p);
}

#endif /* EWKERN_PDL_DEVICE_CUH */
