/*
 * device_cache.cuh: per-device facts the launchers ask on every call, cached (host side, shared
 * by the kernel files): the SM count and threads per SM, the memory's bandwidth per SM, the L2's
 * size, and a kernel's resident blocks per SM.
 */
#ifndef EWKERN_DEVICE_CACHE_CUH
#define EWKERN_DEVICE_CACHE_CUH

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

struct DeviceShape {
    int sms;
    int threads_per_sm;
};

static const int kMaxCachedDevices = 64;
static std::atomic<int> g_sms[kMaxCachedDevices];
static std::atomic<int> g_tps[kMaxCachedDevices];

static inline DeviceShape device_shape(int dev)
{
    if (dev < 0 && cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        dev = 0;
    }
    const bool cached = dev >= 0 && dev < kMaxCachedDevices;
    if (cached) {
        const int s = g_sms[dev].load(std::memory_order_relaxed);
        const int t = g_tps[dev].load(std::memory_order_relaxed);
        if (s > 0 && t > 0)
            return DeviceShape{s, t};
    }
    int s = 0, t = 0;
    if (cudaDeviceGetAttribute(&s, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || s <= 0) {
        cudaGetLastError(); /* leave no error behind for the launcher's cudaGetLastError() */
        s = 132;
    }
    if (cudaDeviceGetAttribute(&t, cudaDevAttrMaxThreadsPerMultiProcessor, dev) != cudaSuccess ||
        t <= 0) {
        cudaGetLastError();
        t = 2048;
    }
    if (cached) {
        g_sms[dev].store(s, std::memory_order_relaxed);
        g_tps[dev].store(t, std::memory_order_relaxed);
    }
    return DeviceShape{s, t};
}

static std::atomic<int> g_sm_gbs[kMaxCachedDevices];

/* The device memory's peak bandwidth per SM in GB/s by the formula (2 x memory clock x bus width
 * / SMs: H100 SXM 25, H200 37), or 0 where the device does not say. */
static inline int sm_bandwidth_gbs(int dev)
{
    const bool cached = dev >= 0 && dev < kMaxCachedDevices;
    if (cached) {
        const int v = g_sm_gbs[dev].load(std::memory_order_relaxed);
        if (v != 0)
            return v > 0 ? v : 0;
    }
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) {
        cudaGetLastError();
        khz = bits = 0;
    }
    const int v = int(2.0 * khz * 1e3 * (bits / 8.0) / device_shape(dev).sms / 1e9);
    if (cached)
        g_sm_gbs[dev].store(v > 0 ? v : -1, std::memory_order_relaxed);
    return v > 0 ? v : 0;
}

static std::atomic<long long> g_l2[kMaxCachedDevices];

/* The device's L2 size in bytes (H100 50 MiB, H200 60 MiB), or 0 where the device does not say. */
static inline long long l2_bytes(int dev)
{
    const bool cached = dev >= 0 && dev < kMaxCachedDevices;
    if (cached) {
        const long long v = g_l2[dev].load(std::memory_order_relaxed);
        if (v != 0)
            return v > 0 ? v : 0;
    }
    int b = 0;
    if (cudaDeviceGetAttribute(&b, cudaDevAttrL2CacheSize, dev) != cudaSuccess || b < 0) {
        cudaGetLastError();
        b = 0;
    }
    if (cached)
        g_l2[dev].store(b > 0 ? b : -1, std::memory_order_relaxed);
    return b;
}

/* Resident blocks per SM of kernel k at `block` threads on device dev (occupancy API; 1 when it
 * fails). slots is the calling launcher's own cache, one word per device holding block << 8 |
 * blocks, so a block size other than the cached one asks again. */
static inline int blocks_per_sm(std::atomic<int> *slots, const void *k, int block, int dev)
{
    const bool cached = dev >= 0 && dev < kMaxCachedDevices;
    if (cached) {
        const int v = slots[dev].load(std::memory_order_relaxed);
        if (v > 0 && (v >> 8) == block)
            return v & 255;
    }
    int nb = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k, block, 0) != cudaSuccess || nb < 1) {
        cudaGetLastError();
        nb = 1;
    }
    nb = nb < 255 ? nb : 255;
    if (cached)
        slots[dev].store(block << 8 | nb, std::memory_order_relaxed);
    return nb;
}

/* Blocks of kernel k at `block` threads that the device holds at once (one wave): SMs x resident
 * blocks per SM, slots as for blocks_per_sm. */
static inline int64_t wave_blocks(std::atomic<int> *slots, const void *k, int block, int dev)
{
    return int64_t(device_shape(dev).sms) * blocks_per_sm(slots, k, block, dev);
}

#endif /* EWKERN_DEVICE_CACHE_CUH */
