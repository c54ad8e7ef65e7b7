/*
 * cuda_api.h: the only CUDA runtime surface the C host code uses, implemented in
 * csrc/cuda/runtime.cu (so the .c files need no CUDA headers and a CPU-only build links
 * without the toolkit). Every function returns 0 or a cudaError_t value.
 * Floor 0 (see state.h): a contract with csrc/cuda, no calls into the C core.
 */
#ifndef EWKERN_CUDA_API_H
#define EWKERN_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ew_device_info {
    char name[256];
    int major, minor;
    int sm_count;
    int l2_bytes;
    int max_threads_per_sm;
    int max_threads_per_block;
    int memory_bus_width_bits;
    int memory_clock_khz;
    int clock_khz;
    size_t total_memory_bytes;
    int driver_version;
    int runtime_version;
    int pci_bus_id;
} ew_device_info;

typedef struct ew_func_attrs {
    int num_regs;
    size_t local_size_bytes;
    size_t shared_size_bytes;
    size_t const_size_bytes;
    int max_threads_per_block;
    int ptx_version;
    int binary_version;
} ew_func_attrs;

enum { EWCUDA_H2D = 1, EWCUDA_D2H = 2, EWCUDA_D2D = 3 };

int ewcuda_device_count(int *count);
/* Make device the calling thread's current device. *prev gets the device that was current when
 * this switched away from it, or -1 when device was current already (nothing to put back): one
 * cudaGetDevice, and a cudaSetDevice only for another device. */
int ewcuda_device_enter(int device, int *prev);
/* Make prev current again (prev from ewcuda_device_enter; nothing for -1). cudaSetDevice creates
 * a device's context (CUDA 12+), so when prev's primary context is not active (nobody in the
 * process has used that device, as a fresh thread's device 0 that only ever touched cuda:1) the
 * switch is left in place instead, the rule of torch's device guard (MaybeExchangeDevice). */
int ewcuda_device_exit(int prev);
/* The calling thread's current device (cudaGetDevice). */
int ewcuda_get_device(int *device);
int ewcuda_malloc_async(void **ptr, size_t nbytes, void *stream);
int ewcuda_free_async(void *ptr, void *stream);
int ewcuda_memset_async(void *ptr, int value, size_t nbytes, void *stream);
/* Copy and wait for it (on stream). */
int ewcuda_memcpy_sync(void *dst, const void *src, size_t nbytes, int kind, void *stream);
int ewcuda_stream_create(void **stream);
int ewcuda_stream_destroy(void *stream);
int ewcuda_stream_synchronize(void *stream);
int ewcuda_device_synchronize(void);
int ewcuda_event_create(void **event);
int ewcuda_event_destroy(void *event);
int ewcuda_event_record(void *event, void *stream);
int ewcuda_event_synchronize(void *event);
int ewcuda_event_elapsed_ms(void *start, void *end, float *ms);
/* Make `waiter` wait for the work queued so far on `producer` (no-op when equal). */
int ewcuda_stream_order(void *producer, void *waiter);
int ewcuda_device_info(int device, ew_device_info *info);
int ewcuda_func_attrs(const void *kernel, ew_func_attrs *attrs);
const char *ewcuda_error_name(int err);
const char *ewcuda_error_string(int err);
int ewcuda_last_error(void);
/* Timing helpers (csrc/timing.c): a flag in pinned host memory the GPU can read, and a
 * kernel that spins on it so queued launches start together (nvbench's blocking kernel). */
int ewcuda_host_flag_alloc(volatile int **flag);
int ewcuda_host_flag_free(volatile int *flag);
int ewcuda_spin_launch(volatile int *flag, double timeout_s, void *stream);
/* Read nbytes (a multiple of 16, 16-byte aligned) of buf on stream: evicts the L2 without
 * leaving dirty lines. */
int ewcuda_flush_read(const void *buf, size_t nbytes, void *stream);
/* CUDA graphs: capture the launches queued on stream between begin and end into an executable
 * graph (the timing core replays K launches as one graph, as the peers are timed). */
int ewcuda_capture_begin(void *stream);
int ewcuda_capture_end(void *stream, void **exec);
int ewcuda_graph_launch(void *exec, void *stream);
int ewcuda_graph_destroy(void *exec);
/* Programmatic dependent launch of the default-path kernels (csrc/cuda/pdl.cuh): the switch
 * (initially on unless the environment has EWKERN_PDL=0), and whether a launch on device dev
 * uses it now (switch on and compute capability 9.0 or newer). set returns the previous value. */
int ewcuda_pdl_set(int on);
int ewcuda_pdl_get(void);
int ewcuda_pdl_active(int device);
/* Around each PDL-aware launch on stream: decide returns whether to launch with PDL given the
 * caller's wish pdl (where stream is being captured, only when the node the launch depends on is
 * one such launch's, see csrc/cuda/runtime.cu) and sets *capture for launched, which records the
 * launch's node after a successful launch. */
int ewcuda_pdl_decide(void *stream, int pdl, unsigned long long *capture);
void ewcuda_pdl_launched(void *stream, unsigned long long capture);

/* Run-time kernels (csrc/rtc.c): load a CUBIN/PTX image (cudaLibraryLoadData) and get its kernel
 * `name` (cudaLibraryGetKernel; the library stays loaded); launch a kernel handle with
 * cudaLaunchKernelExC on stream, as a programmatic dependent launch when pdl, with smem bytes of
 * dynamic shared memory. */
int ewcuda_library_load(const void *image, const char *name, void **library, void **kernel);
int ewcuda_launch_kernel(void *kernel, unsigned grid, unsigned block, void **args, void *stream, int pdl,
                         long long smem);
/* The dynamic shared memory (*smem, bytes; 0 where no cap applies: blocks not below the kernel's
 * own occupancy, or no size that holds it) with which a loaded kernel's launches at `block`
 * threads keep at most `blocks` blocks on an SM of the current device, the kernel's attributes set
 * for it (its largest dynamic size; the smallest shared-memory carveout of 64 KiB or more that
 * holds the cap). 0 or a CUDA error. */
int ewcuda_kernel_cap(void *kernel, int block, int blocks, long long *smem);
/* Resident blocks per SM of a loaded kernel at `block` threads on the current device (the
 * occupancy API; 1 when it cannot say). */
int ewcuda_kernel_occupancy(void *kernel, int block);
/* The default path's launch rule (auto_plan in csrc/cuda/elementwise_launch.cuh) for a run-time
 * kernel compiled in its 1, 2 and 4 vectors-per-thread forms: nvec vectors, nedge head and tail
 * elements, wave1 the threads of one wave of the 1-vector form, wave4 the vectors of one wave of
 * the 4-vector form, heavy: libm-class math, elems: elements per vector (8: 16-bit, 2: float64),
 * wide: the rule's `wide` (given only under PDL), max_vpt: the most vectors a thread of the kernel's
 * forms that do not spill (1, 2 or 4). Gives the vectors per thread, the grid and the PDL prefetch
 * (the prefetch rule is every device's and takes no `wide`). */
void ewcuda_auto_plan(int device, long long nvec, long long nedge, int block, long long wave1, long long wave4,
                      int i32, int pdl, int heavy, int elems, int wide, int max_vpt, int *vpt, long long *grid,
                      int *prefetch);
/* auto_plan with every input given, as the built-in ops' launchers give them (fill: a write-only
 * op; heavy16: 0, 1 for ewkern's 16-bit libm-class ops, 2 for a run-time kernel's; heavy64: the
 * float64 class, H64_*; heavy16_from: heavy16_waves's threshold; wide: a programmatic launch on a
 * device whose memory moves >= 30 GB/s an SM, wide_sm; max_vpt as ewcuda_auto_plan's, 4 for the
 * built-in ops; heavy_math: libm-class math neither heavy16 nor heavy64 names, for the prefetch
 * rule, as the backward ops' float64 gradients give it): the tests' view of the rule. */
void ewcuda_auto_plan_rule(long long nvec, long long nedge, int block, long long wave1, long long wave4, int i32,
                           int pdl, int fill, int heavy16, int heavy64, long long heavy16_from, int wide,
                           int max_vpt, int heavy_math, int *vpt, long long *grid, int *prefetch);
/* The default path's store policy for a launch on device that moves `bytes` (inputs read + outputs
 * written) and writes `out_bytes` of them: 1 write-back stores, 0 streaming stores
 * (elementwise_launch.cuh, store_wb). */
int ewcuda_store_wb(int device, long long bytes, long long out_bytes);

#ifdef __cplusplus
}
#endif
#endif /* EWKERN_CUDA_API_H */
