/*
 * runtime.cu: the C-callable wrappers over the CUDA runtime that the host code uses
 * (declared in csrc/cuda_api.h), and the blocking kernel of the timing core.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>

#include "../cuda_api.h"

static cudaStream_t S(void *stream) { return (cudaStream_t)stream; }

extern "C" {

int ewcuda_device_count(int *count)
{
    *count = 0;
    cudaError_t err = cudaGetDeviceCount(count);
    if (err != cudaSuccess) {
        *count = 0;
        (void)cudaGetLastError();
    }
    return (int)err;
}

/* The first time a device is used, keep freed pool memory in the pool: the default
 * release threshold of 0 hands memory back to the driver at every synchronisation, which
 * makes the next cudaMallocAsync a driver allocation. */
static int pool_ready[64];

int ewcuda_device_enter(int device, int *prev)
{
    int cur = -1;
    *prev = -1;
    cudaError_t err = cudaGetDevice(&cur);
    if (err != cudaSuccess)
        return (int)err;
    if (cur != device) {
        if ((err = cudaSetDevice(device)) != cudaSuccess)
            return (int)err;
        *prev = cur;
    }
    if (device >= 0 && device < 64 && !pool_ready[device]) {
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
            uint64_t threshold = UINT64_MAX;
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
        }
        (void)cudaGetLastError();
        pool_ready[device] = 1;
    }
    return 0;
}

/* Whether device's primary context is active (1), or not (0): cuDevicePrimaryCtxGetState through
 * the runtime's driver entry points (no link against libcuda). 1 when that cannot be asked. */
typedef int (*pctx_state_fn)(int dev, unsigned int *flags, int *active);
typedef int (*device_get_fn)(int *dev, int ordinal);
struct DriverFns {
    pctx_state_fn state;
    device_get_fn get;
};

static DriverFns driver_fns()
{
    DriverFns f = {NULL, NULL};
    cudaDriverEntryPointQueryResult q;
    void *p = NULL;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &p, 12000, cudaEnableDefault, &q) ==
            cudaSuccess && q == cudaDriverEntryPointSuccess)
        f.state = (pctx_state_fn)p;
    p = NULL;
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        f.get = (device_get_fn)p;
    (void)cudaGetLastError();
    return f;
}

static int context_active(int device)
{
    static const DriverFns f = driver_fns();
    int dev = 0, active = 0;
    unsigned int flags = 0;
    if (!f.state || !f.get || f.get(&dev, device) != 0 || f.state(dev, &flags, &active) != 0)
        return 1;
    return active != 0;
}

int ewcuda_device_exit(int prev)
{
    if (prev < 0)
        return 0;
    /* a device nobody has used has no context; switching back would create one (hundreds of MB
     * of its memory) for a caller who never asked for it: leave the switch, as torch's device
     * guard does (c10::cuda::MaybeExchangeDevice) */
    if (!context_active(prev))
        return 0;
    cudaError_t err = cudaSetDevice(prev);
    if (err != cudaSuccess)
        (void)cudaGetLastError(); /* leave nothing behind for the caller's next error check */
    return (int)err;
}

int ewcuda_get_device(int *device)
{
    *device = -1;
    cudaError_t err = cudaGetDevice(device);
    if (err != cudaSuccess)
        (void)cudaGetLastError();
    return (int)err;
}

int ewcuda_malloc_async(void **ptr, size_t nbytes, void *stream)
{
    *ptr = NULL;
    if (nbytes == 0)
        nbytes = 1;   /* a valid, unique pointer for empty arrays */
    cudaError_t err = cudaMallocAsync(ptr, nbytes, S(stream));
    if (err != cudaSuccess)
        (void)cudaGetLastError();
    return (int)err;
}

int ewcuda_free_async(void *ptr, void *stream) { return (int)cudaFreeAsync(ptr, S(stream)); }

int ewcuda_memset_async(void *ptr, int value, size_t nbytes, void *stream)
{
    return (int)cudaMemsetAsync(ptr, value, nbytes, S(stream));
}

int ewcuda_memcpy_sync(void *dst, const void *src, size_t nbytes, int kind, void *stream)
{
    cudaMemcpyKind k = kind == EWCUDA_H2D ? cudaMemcpyHostToDevice
                     : kind == EWCUDA_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    if (nbytes == 0)
        return 0;
    cudaError_t err = cudaMemcpyAsync(dst, src, nbytes, k, S(stream));
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(S(stream));
    return (int)err;
}

int ewcuda_stream_create(void **stream)
{
    cudaStream_t s = NULL;
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    *stream = (void *)s;
    return (int)err;
}

int ewcuda_stream_destroy(void *stream) { return (int)cudaStreamDestroy(S(stream)); }
int ewcuda_stream_synchronize(void *stream) { return (int)cudaStreamSynchronize(S(stream)); }
int ewcuda_device_synchronize(void) { return (int)cudaDeviceSynchronize(); }

int ewcuda_event_create(void **event)
{
    cudaEvent_t e = NULL;
    cudaError_t err = cudaEventCreate(&e);
    *event = (void *)e;
    return (int)err;
}

int ewcuda_event_destroy(void *event) { return (int)cudaEventDestroy((cudaEvent_t)event); }
int ewcuda_event_record(void *event, void *stream)
{
    return (int)cudaEventRecord((cudaEvent_t)event, S(stream));
}
int ewcuda_event_synchronize(void *event) { return (int)cudaEventSynchronize((cudaEvent_t)event); }
int ewcuda_event_elapsed_ms(void *start, void *end, float *ms)
{
    return (int)cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end);
}

int ewcuda_stream_order(void *producer, void *waiter)
{
    if (producer == waiter)
        return 0;
    cudaEvent_t e;
    cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess)
        return (int)err;
    err = cudaEventRecord(e, S(producer));
    if (err == cudaSuccess)
        err = cudaStreamWaitEvent(S(waiter), e, 0);
    cudaEventDestroy(e);
    return (int)err;
}

int ewcuda_device_info(int device, ew_device_info *info)
{
    memset(info, 0, sizeof *info);
    cudaError_t err;
    cudaDeviceProp p;
    if ((err = cudaGetDeviceProperties(&p, device)) != cudaSuccess)
        return (int)err;
    strncpy(info->name, p.name, sizeof info->name - 1);
    info->major = p.major;
    info->minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->l2_bytes = p.l2CacheSize;
    info->max_threads_per_sm = p.maxThreadsPerMultiProcessor;
    info->max_threads_per_block = p.maxThreadsPerBlock;
    info->memory_bus_width_bits = p.memoryBusWidth;
    info->total_memory_bytes = p.totalGlobalMem;
    info->pci_bus_id = p.pciBusID;
    cudaDeviceGetAttribute(&info->memory_clock_khz, cudaDevAttrMemoryClockRate, device);
    cudaDeviceGetAttribute(&info->clock_khz, cudaDevAttrClockRate, device);
    cudaDriverGetVersion(&info->driver_version);
    cudaRuntimeGetVersion(&info->runtime_version);
    (void)cudaGetLastError();
    return 0;
}

int ewcuda_func_attrs(const void *kernel, ew_func_attrs *out)
{
    cudaFuncAttributes a;
    memset(out, 0, sizeof *out);
    cudaError_t err = cudaFuncGetAttributes(&a, kernel);
    if (err != cudaSuccess)
        return (int)err;
    out->num_regs = a.numRegs;
    out->local_size_bytes = a.localSizeBytes;
    out->shared_size_bytes = a.sharedSizeBytes;
    out->const_size_bytes = a.constSizeBytes;
    out->max_threads_per_block = a.maxThreadsPerBlock;
    out->ptx_version = a.ptxVersion;
    out->binary_version = a.binaryVersion;
    return 0;
}

const char *ewcuda_error_name(int err) { return cudaGetErrorName((cudaError_t)err); }
const char *ewcuda_error_string(int err) { return cudaGetErrorString((cudaError_t)err); }
int ewcuda_last_error(void) { return (int)cudaGetLastError(); }

int ewcuda_host_flag_alloc(volatile int **flag)
{
    void *p = NULL;
    cudaError_t err = cudaHostAlloc(&p, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable);
    if (err == cudaSuccess)
        *(volatile int *)p = 0;
    *flag = (volatile int *)p;
    return (int)err;
}

int ewcuda_host_flag_free(volatile int *flag) { return (int)cudaFreeHost((void *)flag); }

/* Spins until the host sets *flag or the timeout passes (so a host that dies, or a queue
 * that fills up before the flag is set, cannot hang the GPU). */
__global__ void ew_spin_kernel(const volatile int *flag, unsigned long long timeout_ns)
{
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (;;) {
        if (*flag)
            return;
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > timeout_ns)
            return;
        __nanosleep(1000);
    }
}

int ewcuda_spin_launch(volatile int *flag, double timeout_s, void *stream)
{
    int *dflag = NULL;
    cudaError_t err = cudaHostGetDevicePointer((void **)&dflag, (void *)flag, 0);
    if (err != cudaSuccess)
        return (int)err;
    ew_spin_kernel<<<1, 1, 0, S(stream)>>>(dflag, (unsigned long long)(timeout_s * 1e9));
    return (int)cudaGetLastError();
}

/* Evicts the L2 by reading a buffer larger than it. Reading, not writing: a written flush buffer
 * leaves dirty lines whose write-back then runs inside the timed kernel (about 10 us on an
 * H100), which a read leaves clean. The conditional store keeps the loads alive. */
__global__ void ew_flush_read_kernel(const int4 *buf, size_t n16, int *sink)
{
    int acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
        int4 v = buf[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x5eed1e55)
        *sink = acc;
}

int ewcuda_flush_read(const void *buf, size_t nbytes, void *stream)
{
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    ew_flush_read_kernel<<<sms * 4, 512, 0, S(stream)>>>((const int4 *)buf, nbytes / 16, (int *)buf);
    return (int)cudaGetLastError();
}

int ewcuda_capture_begin(void *stream)
{
    return (int)cudaStreamBeginCapture(S(stream), cudaStreamCaptureModeThreadLocal);
}

int ewcuda_capture_end(void *stream, void **exec)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t ge = NULL;
    *exec = NULL;
    cudaError_t err = cudaStreamEndCapture(S(stream), &graph);
    if (err == cudaSuccess)
        err = cudaGraphInstantiate(&ge, graph, 0);
    if (graph)
        cudaGraphDestroy(graph);
    *exec = (void *)ge;
    if (err != cudaSuccess)
        (void)cudaGetLastError();
    return (int)err;
}

int ewcuda_graph_launch(void *exec, void *stream) { return (int)cudaGraphLaunch((cudaGraphExec_t)exec, S(stream)); }
int ewcuda_graph_destroy(void *exec) { return (int)cudaGraphExecDestroy((cudaGraphExec_t)exec); }

/* PDL switch: -1 = not read from the environment yet */
static std::atomic<int> g_pdl(-1);
enum { PDL_DEVICES = 64 };
static std::atomic<int> g_pdl_cc[PDL_DEVICES]; /* 0 unknown, 1 cc >= 9.0, 2 older */

int ewcuda_pdl_get(void)
{
    int v = g_pdl.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv("EWKERN_PDL");
        v = (env && strcmp(env, "0") == 0) ? 0 : 1;
        int expected = -1;
        if (!g_pdl.compare_exchange_strong(expected, v)) v = expected;
    }
    return v;
}

int ewcuda_pdl_set(int on)
{
    const int prev = ewcuda_pdl_get();
    g_pdl.store(on ? 1 : 0, std::memory_order_relaxed);
    return prev;
}

int ewcuda_pdl_active(int device)
{
    if (!ewcuda_pdl_get()) return 0;
    if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (device >= PDL_DEVICES) return 0;
    int k = g_pdl_cc[device].load(std::memory_order_relaxed);
    if (k == 0) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
            (void)cudaGetLastError(); /* leave nothing behind for the launcher's cudaGetLastError() */
            return 0;
        }
        k = major >= 9 ? 1 : 2;
        g_pdl_cc[device].store(k, std::memory_order_relaxed);
    }
    return k == 1;
}

/* PDL in stream capture. A programmatic edge gains only behind a kernel that triggers its
 * dependents early: every kernel ewkern launches through pdl_launch or ewcuda_launch_kernel does;
 * torch's, CuPy's, copies and memsets never do. Behind one that does not, it costs: peers'
 * after_torch method (pairs of torch.mul and the op in one graph) put copy float32 at 1 MiB at 0.75
 * of torch's with PDL and 0.92 without on the H100, 0.74 and 0.90 on the H200 (about 0.5 us a
 * launch). Eagerly the kernel before a launch cannot be known, and the caller's choice stands. In
 * capture it can: PDL is asked for only when the one node the launch will depend on is the node a
 * PDL-aware launch of ewkern's added to that capture. The process keeps the last OWN_NODES (capture
 * id, node) pairs such launches made, from any thread: autograd runs a backward on its own device
 * thread, and a table per thread lost the forward -> backward and step -> step edges of a captured
 * training step (H200, train back-to-back at 1 MiB: exp 2.80 -> 4.42 us a step). A missing or stale
 * entry can cost time, never correctness (the kernel's pdl_wait waits for the whole previous grid
 * when it never triggered). The lock is taken only while a stream is being captured. */
namespace {
enum { OWN_NODES = 64 };
struct OwnNode {
    unsigned long long id;
    cudaGraphNode_t node;
};
std::mutex g_own_lock;
OwnNode g_own[OWN_NODES];
unsigned g_own_next;

/* The capture id of s (0 when s is not capturing) and in *dep the one node the next work in s will
 * depend on (NULL unless exactly one). */
unsigned long long capture_dep(cudaStream_t s, cudaGraphNode_t *dep)
{
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    const cudaGraphNode_t *deps = NULL;
    const cudaGraphEdgeData *edges = NULL; /* asked for, so that no edge data makes the query lossy */
    size_t n = 0;
    *dep = NULL;
    if (cudaStreamGetCaptureInfo(s, &st, &id, NULL, &deps, &edges, &n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (st != cudaStreamCaptureStatusActive)
        return 0;
    if (n == 1)
        *dep = deps[0];
    return id;
}
} /* namespace */

int ewcuda_pdl_decide(void *stream, int pdl, unsigned long long *capture)
{
    *capture = 0;
    if (!ewcuda_pdl_get())
        return pdl;
    cudaGraphNode_t dep;
    const unsigned long long id = capture_dep(S(stream), &dep);
    if (!id)
        return pdl;
    *capture = id;
    if (!pdl || !dep)
        return 0;
    const std::lock_guard<std::mutex> hold(g_own_lock);
    for (const OwnNode &o : g_own)
        if (o.id == id && o.node == dep)
            return 1;
    return 0;
}

void ewcuda_pdl_launched(void *stream, unsigned long long capture)
{
    if (!capture)
        return;
    cudaGraphNode_t dep;
    if (capture_dep(S(stream), &dep) != capture || !dep)
        return;
    const std::lock_guard<std::mutex> hold(g_own_lock);
    g_own[g_own_next++ % OWN_NODES] = OwnNode{capture, dep};
}

int ewcuda_library_load(const void *image, const char *name, void **library, void **kernel)
{
    cudaLibrary_t lib = NULL;
    cudaKernel_t k = NULL;
    *library = NULL;
    *kernel = NULL;
    cudaError_t err = cudaLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
    if (err == cudaSuccess && (err = cudaLibraryGetKernel(&k, lib, name)) != cudaSuccess)
        cudaLibraryUnload(lib);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)err;
    }
    *library = (void *)lib;
    *kernel = (void *)k;
    return 0;
}

int ewcuda_launch_kernel(void *kernel, unsigned grid, unsigned block, void **args, void *stream, int pdl,
                         long long smem)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = S(stream);
    cfg.attrs = attr;
    cfg.numAttrs = 0;
    unsigned long long capture;
    if (ewcuda_pdl_decide(stream, pdl, &capture)) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs = 1;
    }
    cudaError_t err = cudaLaunchKernelExC(&cfg, (const void *)kernel, args);
    if (err != cudaSuccess)
        (void)cudaGetLastError();
    else
        ewcuda_pdl_launched(stream, capture);
    return (int)err;
}

/* ewcuda_kernel_cap (cuda_api.h). The cap is a shared-memory carveout (the part of an SM's
 * unified L1/shared array given to shared memory) and a block size in it such that `blocks` blocks
 * fit and one more does not: a block's shared memory, dynamic + static + the reservation, half way
 * between pool / (blocks + 1) and pool / blocks (rounded down to 128 bytes), then checked by the
 * occupancy API. The pool is the smallest of 64 KiB, doubled, up to the SM's whole shared memory,
 * that holds the kernel's static memory: a small carveout leaves most of the L1 to the kernel. H200
 * (mse over rows of 4096, 1-8 MiB float32/float16, scripts/speed_probe.py rows, a block's exact
 * share of the pool): with the largest carveout single launches moved -0.065 to +0.014 (mean -0.019)
 * against the uncapped kernel, with 64 KiB none (-0.013 to +0.013); with 8-32 KiB the caps of 4
 * blocks an SM (8 MiB float32, 4 MiB float16) did not take (refused by the check below, or a larger
 * split chosen by the driver: not known).
 * The kernel may take any dynamic size up to the device's opt-in limit (set once, never lowered:
 * a captured graph may hold an earlier launch). */
int ewcuda_kernel_cap(void *kernel, int block, int blocks, long long *smem)
{
    *smem = 0;
    int dev = 0, per_sm = 0, reserved = 0, optin = 0, uncapped = 0, got = 0;
    cudaFuncAttributes fa;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err == cudaSuccess)
        err = cudaFuncGetAttributes(&fa, kernel);
    if (err == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&uncapped, kernel, block, 0);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)err;
    }
    if (blocks < 1 || blocks >= uncapped || per_sm <= 0)
        return 0;
    const long long stat = (long long)fa.sharedSizeBytes;
    long long pool = 64 * 1024, d = -1;
    for (;;) {
        if (pool > per_sm)
            pool = per_sm;
        d = (pool / blocks + pool / (blocks + 1)) / 2 / 128 * 128 - reserved - stat;
        if (d > 0 || pool == per_sm)
            break;
        pool *= 2;
    }
    if (d <= 0 || d + stat > optin)
        return 0;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(optin - stat));
    /* a percentage of the largest carveout: the driver rounds it up to a configuration */
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   (int)(pool * 100 / per_sm));
    if (err == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, kernel, block, (size_t)d);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return (int)err;
    }
    if (got == blocks)
        *smem = d;
    return 0;
}

int ewcuda_kernel_occupancy(void *kernel, int block)
{
    int nb = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, (const void *)kernel, block, 0) != cudaSuccess || nb < 1) {
        (void)cudaGetLastError();
        nb = 1;
    }
    return nb;
}

} /* extern "C" */
