/*
 * elementwise_launch.cuh: the default path's launch rule, host code shared by the kernel files that
 * launch auto's kernels (elementwise_auto.cu for ops.def's ops, elementwise_backward.cu for
 * grads.def's): the block size, the kernel parameters of a launch (op_args), and auto_plan, which
 * picks the vectors per thread, the grid and the PDL prefetch from the device's waves. Each file
 * instantiates its own kernels; the rule is written once, here.
 */
#ifndef EWKERN_ELEMENTWISE_LAUNCH_CUH
#define EWKERN_ELEMENTWISE_LAUNCH_CUH

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ewkern_kernels.h"
#include "elementwise_common.cuh"
#include "elementwise_kernel.cuh"
#include "pdl.cuh"

namespace ewk {

static const int kAutoBlock = 256;

/* EWKERN_AUTO_BLOCK=32..1024 (a multiple of 32, read once) replaces kAutoBlock where the caller
 * names no block: a knob for measuring the launch rules, not for users. */
static int auto_block()
{
    static const int b = [] {
        const char *e = getenv("EWKERN_AUTO_BLOCK");
        const int x = e ? atoi(e) : 0;
        return (x >= 32 && x <= 1024 && x % 32 == 0) ? x : kAutoBlock;
    }();
    return b;
}

template <class T> static T host_round(double x);
template <> inline float host_round<float>(double x) { return float(x); }
template <> inline double host_round<double>(double x) { return x; }
template <> inline half_t host_round<half_t>(double x) { return __double2half(x); }
template <> inline bf16_t host_round<bf16_t>(double x) { return __double2bfloat16(x); }

template <class T>
static OpArgs<T> op_args(const ew_args *a)
{
    typedef typename Compute<T>::type C;
    OpArgs<T> p;
    p.prefetch = 0;
    p.wb = 0;
    p.s0 = C(a->scalar[0]);
    p.s1 = C(a->scalar[1]);
    p.v = host_round<T>(a->scalar[0]);
    unsigned char bytes[16];
    for (int k = 0; k < 16; k += int(sizeof(T)))
        memcpy(bytes + k, &p.v, sizeof(T));
    memcpy(&p.pattern, bytes, 16);
    return p;
}

/* auto: VPT, the vectors per thread, from the waves W = vectors / (SMs x resident threads) of the
 * one-vector kernel (the SM count and the kernel's occupancy at this block size come from the
 * device): W <= 1: 1; 1 < W <= 2: 2 (one wave of blocks, each thread issuing 2 + 2 loads before
 * its stores); 2 < W <= 4: 4 when that grid fills at least 85% of one wave of the 4-vector kernel
 * and PDL is off, or the launch is a programmatic dependent on a device whose memory moves at least
 * 30 GB/s an SM (wide_sm; then without the prefetch, and also where the grid is two waves of the
 * 4-vector kernel, the second at least 85% full; not for div: wide_launch), else 1; W > 4: 1 (many
 * waves). A grid much below one wave leaves SMs with a block more than others (measured slower).
 * Under PDL each thread of the first wave prefetches its first vector before the wait (on a wide
 * device a light op only where the grid is at most half a wave), and there 1 vector per thread
 * beat 4 on the H100 (copy 16 MiB: 2815 against 2665 GB/s back-to-back). On the H200 a cold launch
 * at 16 MiB (3.9 waves) ran at 0.98 of torch's with 1 and the prefetch, 1.00-1.04 with 4 and none,
 * back-to-back 1.09-1.15 -> 1.02-1.08; a plain launch there (behind a foreign kernel in a graph)
 * keeps 1: 4 lost 3-5% after torch.mul.
 * Heavy ops (libm-class math, not the SFU log) in 16-bit types: 1, and 2 beyond 32 waves (beyond 6
 * where the memory moves at least 30 GB/s an SM: heavy16_waves); in float64
 * (heavy64, Heavy64's class): exp and sigmoid 1 at any size, silu 4 beyond 8 waves, erf, log
 * and tanh 1 up to 4 waves and 2 beyond, gelu 4 past 4 waves and from 2 where the 4-vector grid's
 * last wave is at least half full, else 1. The run-time kernels' 16-bit math (heavy16 == 2): 1 at
 * any size. fill (write-only): 2 past half a wave, else 1.
 * Measurements: ELEMENTWISE_NOTES.md. */
/* EWKERN_AUTO_VPT=1|2|4 in the environment (read once) fixes auto's vectors per thread: a knob
 * for measuring the rule above, not for users. */
static int forced_vpt()
{
    static const int v = [] {
        const char *e = getenv("EWKERN_AUTO_VPT");
        const int x = e ? atoi(e) : 0;
        return (x == 1 || x == 2 || x == 4) ? x : 0;
    }();
    return v;
}

/* EWKERN_PDL_PREFETCH=none|wave|all (read once): which blocks of a PDL launch prefetch their first
 * vector's lines before the wait (none, the first wave, all) in place of the rule (PREFETCH_RULE,
 * auto_plan's end); a knob for measuring the rule in run_fast, not for users. */
enum PrefetchRule { PREFETCH_RULE, PREFETCH_NONE, PREFETCH_WAVE, PREFETCH_ALL };
static PrefetchRule prefetch_rule()
{
    static const PrefetchRule r = [] {
        const char *e = getenv("EWKERN_PDL_PREFETCH");
        if (e && !strcmp(e, "none"))
            return PREFETCH_NONE;
        if (e && !strcmp(e, "wave"))
            return PREFETCH_WAVE;
        if (e && !strcmp(e, "all"))
            return PREFETCH_ALL;
        return PREFETCH_RULE;
    }();
    return r;
}

/* The default path's store policy for a launch that moves `bytes` (inputs read + output written)
 * and writes `out_bytes` of them: write-back stores (1) where the output is at least 1/32 of the
 * L2 (the H100 1.6 MiB, the H200 1.9 MiB) or the launch moves more than the L2 holds; streaming
 * stores (st.global.cs, 0) for smaller outputs. EWKERN_AUTO_STORES=cs|wb (read once) forces one
 * policy: a knob for measuring the rule.
 * Past the L2 (speed_probe variants auto against auto_wb, the same plan and kernel form, two rounds
 * a GPU, 59f37f6, ewkern / torch): single launches at 64 MiB a buffer, where the written lines
 * outnumber what the L2 keeps: H200 copy float32 0.979 -> 0.996-1.007, add_const bfloat16 0.979-0.980
 * -> 0.997-1.008, log float32 0.971 -> 0.980, erf float32 0.981-0.987 -> 0.984-0.993; H100 copy
 * 0.969-0.986 -> 0.981-1.005, add_const 0.989-0.993 -> 0.989-1.005, erf 0.973-0.981 -> 0.982-1.018;
 * back-to-back at 64 MiB the same or up to 1% better; 256 MiB-1 GiB within 0.01.
 * Below the L2 the output's lines are what the next kernel reads. Eager calls each reading the one
 * before's output (scripts/eager_probe.py, chain; a54cc30, K = 32 behind a sleep kernel, us a call,
 * streaming -> write-back, torch's in brackets): H100 copy float32 16 MiB 10.46 -> 8.30 (9.82),
 * exp float32 16 MiB 10.33 -> 8.18 (9.52), copy 4 MiB 2.92 -> 2.54 (3.84), copy 2 MiB 2.09 -> 1.79
 * (3.01); H200 exp float32 16 MiB 8.34 -> 6.41 (8.18-8.25), copy 16 MiB 8.08 -> 6.71 (8.27-8.34),
 * copy 4 MiB 2.78 -> 2.24. At 1 MiB (latency-bound) nothing to gain: 1.02-1.33 -> 1.03-1.35 us (H100
 * copy), and behind a foreign kernel (eager_probe's after) write-back is 0.05-0.15 us slower there.
 * The matrix's methods at 2-32 MiB, streaming / write-back (speed_probe variants, the same call):
 * back-to-back within 0.01 on both GPUs (H200 exp float32 16 MiB 1.019 -> 1.039, copy 1.033 ->
 * 1.042); single launches within their spread (H100 copy 16 MiB 0.996 / 0.988, H200 0.984-0.988 /
 * 1.008-1.024). At 1 MiB streaming stores lead back-to-back by 0.2-1.5% on both GPUs (H100 add_const
 * bfloat16 1.488 against 1.466, copy float32 1.449 against 1.438). */
enum StoreRule { STORES_RULE, STORES_CS, STORES_WB };
static StoreRule store_rule()
{
    static const StoreRule r = [] {
        const char *e = getenv("EWKERN_AUTO_STORES");
        if (e && !strcmp(e, "cs"))
            return STORES_CS;
        if (e && !strcmp(e, "wb"))
            return STORES_WB;
        return STORES_RULE;
    }();
    return r;
}

enum { WB_OUT_SHARE = 32 }; /* write-back from outputs of 1/WB_OUT_SHARE of the L2 */
static int store_wb(int dev, int64_t bytes, int64_t out_bytes)
{
    const StoreRule r = store_rule();
    if (r != STORES_RULE)
        return r == STORES_WB;
    const long long l2 = l2_bytes(dev);
    return l2 > 0 && (bytes > l2 || out_bytes * WB_OUT_SHARE >= l2);
}

/* The vectors per thread (1, 2 or 4), the grid and the prefetch of one auto launch. */
struct AutoPlan {
    int vpt;
    int64_t grid;
    int prefetch;
};

/* The waves past which ewkern's heavy 16-bit ops (heavy16 == 1) take 2 vectors a thread: 6 where
 * the device's memory moves at least 30 GB/s an SM by the formula (the H200: 37), else 32 (the
 * H100: 25). More bytes a second per SM need more bytes in flight per SM, and a thread busy with 8
 * evaluations of libm-class math keeps only its one vector in flight. EWKERN_AUTO_VPT=2 against
 * 1 at 32-128 MiB (7.8-31 waves), ewkern / torch back-to-back and single launch (b7171f1, 02551d4):
 * H200 silu 0.96-1.00 -> 1.00-1.06, erf 0.98-1.04 -> 1.04-1.11, sigmoid and gelu 1-5% up, in every
 * cell; H100 within 0.03 either way (silu 64 MiB single 1.00 -> 0.98, erf single 1.00 -> 1.03-1.05),
 * and at 16 MiB (3.9 waves) single launch 0.93-0.97 against 0.99-1.02 with 1. The backward kernels
 * keep 32 (not measured). float32 libm-class ops (no heavy16) keep the plain ops' rule: 2 a thread
 * on the H200 at 64-256 MiB left single launches where they were and lost 2-4% back-to-back and
 * after a torch kernel (8208174; notes, "Three leads refuted"). */
static bool wide_sm(int dev)
{
    return sm_bandwidth_gbs(dev) >= 30;
}

/* auto_plan's `wide` for a launch of Op that pdl_decide decided as d: a programmatic dependent on a
 * wide device (wide_sm), for every op but those that keep the narrow rule (NarrowRule: div and its
 * backward, whose 4-vector kernels take 54-61 registers and, in 16-bit types, 32 divisions a thread;
 * at two waves they lost on the H200 at 16 MiB, 72f9d89, ewkern / torch back-to-back and single
 * launch: float16 1.08 -> 0.98, 0.99 -> 0.96; bfloat16 1.08 -> 0.97, 0.99 -> 0.95; float32 1.10 ->
 * 1.03, 0.985 both, where add, mul, axpby gained single launches, 0.98 -> 1.00). */
template <class Op> struct NarrowRule { enum { value = 0 }; };
template <> struct NarrowRule<Op_div> { enum { value = 1 }; };
template <class Op>
static bool wide_launch(int dev, const PdlDecision &d)
{
    return d.programmatic && !NarrowRule<Op>::value && wide_sm(dev);
}

static int64_t heavy16_waves(int dev)
{
    return wide_sm(dev) ? 6 : 32;
}

/* nvec 16-byte vectors and nedge head/tail elements; wave1: the threads of one wave of the 1-vector
 * kernel; wave4(): the vectors of one wave of the 4-vector kernel (asked only when it matters);
 * fill: a write-only op; heavy16: libm-class math on 16-bit elements (1: ewkern's ops, 2: a run-time
 * kernel's); heavy64: Heavy64's class of float64 math; heavy16_from: the waves past which heavy16 ==
 * 1 takes 2 vectors a thread (heavy16_waves); wide: the launch is a programmatic dependent on a device
 * whose memory moves at least 30 GB/s an SM (wide_sm: 4 vectors a thread, no prefetch, at 2-4 waves
 * under PDL too; given by ewkern's own ops and the backward ops, not yet by the run-time kernels,
 * which were not measured with it); heavy_math: libm-class math that neither heavy16 nor heavy64
 * names (the backward ops' float64 gradients of gelu, silu and erf), for the prefetch rule only
 * (heavy math keeps the first wave's prefetch); max_vpt: the most vectors a thread the caller's kernel takes
 * without spilling (1, 2 or 4; a run-time kernel's forms by their resource report: a bfloat16
 * `o = a * b + c` at 4 vectors a thread spilled 788 bytes under __launch_bounds__(1024) and 404
 * under __maxnreg__(64) while its vectors were held as 16-bit values, and ran 2.3-2.4x slower than
 * at 1 on the H200 where the plan took it). */
template <class Wave4>
static AutoPlan auto_plan(int64_t nvec, int64_t nedge, int block, int64_t wave1, bool i32, bool pdl, bool fill,
                          int heavy16, Wave4 wave4, int heavy64 = 0, int64_t heavy16_from = 32, bool wide = false,
                          int max_vpt = 4, bool heavy_math = false)
{
    int vpt = 1;
    bool lean = false; /* under PDL, no prefetch */
    if (!i32) {
        vpt = 1; /* the 64-bit instance takes 1 vector per thread */
    } else if (const int forced = forced_vpt()) {
        vpt = forced;
    } else if (heavy64) {
        /* float64 libm-class math (exp, log, erf, tanh, sigmoid, silu, gelu): past 2 waves 4 vectors
         * per thread, torch's shape (4 x 16-byte loads, 8 elements), else 1. With 1, each thread's one
         * 16-byte load waits behind 2 elements of 15-75 dependent DP instructions; 4 keeps 64 bytes per
         * thread in flight and 8 independent chains, at 32-46 registers. H200, ewkern / torch, forced
         * 1 / 2 / 4 per thread, back-to-back (single launch): sigmoid 16 MiB 0.84 / 0.80 / 1.07 (0.76 /
         * 0.72 / 0.98), 64 MiB 0.78 / 0.72 / 1.01 (0.71 / 0.66 / 0.96); exp 64 MiB 0.94 / 0.87 / 1.04
         * (0.86 / 0.79 / 1.00); but at 4 MiB (about one wave) 1 beats 4: sigmoid 1.10 against 0.87,
         * gelu 1.52 against 0.94.
         * But not every float64 function alike (H200, forced 1 / 2 / 4, back-to-back and single
         * launch against torch): erf, log, tanh, gelu at 16 MiB (4 waves) 1.12-1.21 / 0.97-1.07 with
         * 1, 0.95-1.09 / 0.90-0.96 with 4; at 64 MiB erf, log, tanh run best with 2 (1.06-1.10 /
         * 0.96-1.01), gelu with 4 (1.01 against 0.99 with 2, 256 MiB-1 GiB 1.01 against 0.97). silu at
         * 4 MiB (one wave): 4 gives 1.00 / 0.98, 1 gives 0.95 / 0.85 (the H100: 1.03 / 0.96 against
         * 0.94 / 0.83); exp and sigmoid keep the first rule (1 at 4 MiB: 1.10-1.21 back-to-back).
         * Those measurements of exp, sigmoid and silu were of kernels that ptxas had spilled at 1 and
         * 2 a thread (32 registers under __launch_bounds__(1024)); ew_fast_r (5cd9c75) keeps their
         * registers, and forced 1 / 2 / 4 again (the rule before in brackets), back-to-back then
         * single launch, H200 / H100: exp 16 MiB 1.12 / 1.05, 0.95 / 1.02 with 1 (1.08 / 1.05, 0.94 /
         * 0.96 with 4), 256 MiB 1.05 / 1.02, 1.04 / 1.01 (1.01, 1.00-1.01); sigmoid 16 MiB 1.14 /
         * 1.13, 0.98 / 1.03 (1.09 / 1.11, 0.97 / 0.97), 4 MiB 1 already; so exp and sigmoid take 1
         * at any size. silu (46 registers at 1, 58 at 4) with 1: 4 MiB 1.27 / 1.30, 1.02 / 1.05 (1.01
         * / 1.04, 0.99 / 0.99 with 4); but 16 MiB 0.96 back-to-back on the H200, 64 MiB 0.85-0.97:
         * silu 4 past 2 waves of its 1-vector kernel.
         * silu again once one exponential served both its forms (283e2cb: 36 registers at 1, 62 at
         * 4, 95 instructions an element where it had 144), H200, forced 1 / 4, back-to-back, single
         * launch, after a torch kernel: 16 MiB (4.4 waves of the 1-vector kernel) 1.089 / 1.061,
         * 1.005 / 0.972, 0.985 / 0.959; 64 MiB (17.7 waves) 0.991 / 1.036, 0.954 / 0.970, 0.951 /
         * 0.997; 256 MiB 0.960 / 1.009: silu 4 past 8 waves.
         * gelu once both forms evaluated a thread's vectors together (3fe0810), H200, 16 MiB (3.9
         * waves), forced 4 against the rule's 1, back-to-back, single launch, after a torch kernel:
         * 1.054 / 1.119, 1.039 / 0.971, 0.999 / 0.939; Nsight Compute, cold: 12.0 us (PDL form) and
         * 11.7 (plain) against 13.1 and 12.6, torch's 12.2 (torch's shape: 8 elements a thread,
         * 1.55 waves of its blocks, as 4 vectors here). The H100 (18c2907, 4 past 2 waves), 4 / 1:
         * 16 MiB 1.000 / 1.149, 1.021 / 0.978, 0.972 / 0.952; but 12 MiB (2.9 waves of the 1-vector
         * kernel, 1.16 of the 4-vector kernel's: its second wave 16% full) 0.981 / 1.214, 0.997 /
         * 1.015, 0.904 / 0.976. So gelu takes 4 past 4 waves, and from 2 where the 4-vector grid's
         * last wave is at least half full. */
        if (heavy64 == H64_POLY) {
            vpt = nvec <= 4 * wave1 ? 1 : 2;
        } else if (heavy64 == H64_GELU) {
            vpt = nvec > 4 * wave1 ? 4 : 1;
            if (vpt == 1 && nvec > 2 * wave1) {
                const int64_t w4 = wave4();
                vpt = w4 > 0 && 2 * (nvec % w4) >= w4 ? 4 : 1;
            }
        } else if (heavy64 == H64_SILU) {
            vpt = nvec > 8 * wave1 ? 4 : 1;
        } else {
            vpt = 1;
        }
    } else if (fill) {
        /* write-only: past half a wave, 2 stores per thread. With 1 the H200 wrote at 0.73 of torch's
         * fill (3350 against 4550 GB/s at 64 MiB-1 GiB); with 2 at 1.00; the H100 the same either way.
         * At 4 MiB (0.97 waves) single launch, ewkern / torch with 1 -> 2 (b5c9590): H200 float64
         * 0.905 -> 0.984 (back-to-back 1.29 -> 1.35); H100 float64 1.02 -> 1.00, float32 0.98 -> 0.99
         * (back-to-back 1.29 -> 1.31-1.32). 1 MiB and 2 MiB (0.24, 0.48 waves) keep 1. */
        vpt = 2 * nvec > wave1 ? 2 : 1;
    } else if (heavy16) {
        /* 8 transcendental evaluations per vector: more threads beat more loads in flight up to
         * tens of waves (log float16 at 16 MiB: 2590 GB/s with 1, 2396 with 4); 2 per thread past 32.
         * Not for the run-time kernels (heavy16 == 2), whose 16-bit math in float32 takes more
         * registers: on the H200 at 256 MiB (62 waves), 1 / 2 / 4 per thread against the better of
         * torch.compile and CuPy, back-to-back: a * sigmoid(b) bfloat16 1.01 / 0.84 / 0.64, float16
         * 1.01 / 0.99 / 0.99; gelu(a) * b bfloat16 1.05 / 0.98 / 1.04, float16 1.06 / 1.12 / 1.14 */
        vpt = heavy16 == 1 && nvec > heavy16_from * wave1 ? 2 : 1;
    } else if (nvec > wave1 && nvec <= 2 * wave1) {
        vpt = 2;
    } else if (nvec > 2 * wave1 && nvec <= 4 * wave1) {
        const int64_t w4 = wave4();
        /* one wave of the 4-vector kernel at least 85% full; on a wide programmatic launch also two
         * waves, the second at least 85% full (the binary ops: their 4-vector kernel takes 54
         * registers, 4 blocks of 256 an SM, so 16 MiB is 1.94 of its waves) */
        const bool one = nvec <= w4 && 100 * nvec >= 85 * w4;
        const bool two = wide && pdl && nvec > w4 && nvec <= 2 * w4 && 100 * nvec >= 185 * w4;
        if ((one && (!pdl || wide)) || two) {
            /* H200 (wide), 16 MiB, ewkern / torch single launch (back-to-back) with 1 vector a thread
             * and the prefetch -> 4 and none (f91d7f0, EWKERN_AUTO_VPT=4 EWKERN_PDL_PREFETCH=none):
             * copy float32 0.981 -> 1.029 (1.104 -> 1.017), neg float16 0.996 -> 1.036 (1.111 ->
             * 1.023), exp float32 0.980 -> 1.036, add float32 0.976 -> 1.004 (1.101 -> 1.044), add
             * float64 0.994 -> 1.004 (1.147 -> 1.082), mul bfloat16 0.986 -> 0.998 (1.092 -> 1.027).
             * With 4 and the prefetch: 0.963-1.018 single. Nsight Compute, cold copy: 4 a thread
             * 9.0-9.3 us without the prefetch, 9.7-10.5 with it, 1 a thread 9.7-10.1. The two-wave
             * case (67db6ff; 72f9d89's `peers`): add, mul float32 16 MiB single 0.98 -> 1.00. */
            vpt = 4;
            lean = pdl;
        }
    }
    if (vpt > max_vpt) {
        vpt = max_vpt; /* lean (no prefetch) belongs to the 4-vector case: the capped form prefetches */
        lean = false;
    }
    const int64_t per_block = int64_t(vpt) * block;
    int64_t grid = ceil_div(nvec, per_block);
    if (grid < 1)
        grid = 1;
    /* the last block's last nedge threads must own no vector */
    if ((grid - 1) * per_block + (block - nedge) < nvec)
        grid += 1;
    int prefetch = 0;
    if (pdl && !lean) {
        /* only blocks that can be resident before the previous kernel ends have a wait to hide a
         * prefetch behind: the first wave (later blocks would issue it and load at once). A light op
         * (neither heavy16 nor heavy64 nor heavy_math) prefetches only where its grid is at most half
         * a wave, on every device: there a cold launch of about a wave or more paid for the
         * prefetch (until 2026-12-07 the H200's rule alone, `wide`; the H100 then measured it too,
         * below). H200, `peers` single launch and back-to-back against torch, d256524 (the first
         * wave at any size) and 23f4206 (none past half a wave), the light ops' 77 cells a size:
         * single 4 MiB 33 -> 14 below 0.99, 16 MiB 17 -> 6, 64 MiB 8 -> 4 (the PDL-off series, the
         * same kernels in both runs, within 0.2%); back-to-back medians 1.29 -> 1.20, 1.08 -> 1.05,
         * 1.04 -> 1.02, none below. The heavy ops gained nothing single (16-bit erf, sigmoid, gelu,
         * silu at 4 / 16 MiB: medians 1.056 / 1.004 -> 1.053 / 1.002; float64 math 1.093 / 1.028
         * -> 1.066 / 1.020) and lost back-to-back (16-bit silu at 16 MiB 1.03 -> 0.98): they keep
         * the first wave. H100, the same 16 light ops x 4 dtypes, `peers` single launch and
         * back-to-back, beff5a9 as built (the first wave at every size there) against
         * EWKERN_PDL_PREFETCH=none, two runs each (ELEMENTWISE_NOTES.md, fifty-fifth session): single
         * 4 MiB cells below 0.99 16 / 22 -> 11 / 10 (below in both runs 14 -> 4), 16 MiB 5 / 7 -> 2 /
         * 0, 64 MiB 9 / 6 -> 1 / 5 (both 2 -> 0); back-to-back medians 1.285 -> 1.160 (4 MiB), 1.106
         * -> 1.049 (16 MiB), 1.030 -> 1.015 (64 MiB), none below 0.99 (lowest cell 0.993). Div, whose
         * vector rule stays narrow (NarrowRule), takes this prefetch rule too (H100 4 MiB single
         * 0.991 -> 1.003). The run-time kernels (their 16-bit math, heavy16 == 2, counts as light): H200, `fused` 4 and 16
         * MiB, ewkern / the better of CuPy and torch.compile, first wave -> none (one run each):
         * single launch 0.92-0.98 -> 0.97-1.03 for fma, add, swish_gate, mixed, float32 gelu_mul
         * (each of those 24 cells' time 2-9% lower), 16-bit gelu_mul 1.06-1.11 either way; back-to-back
         * 4 MiB 1.07-1.43 -> 1.12-1.37, 16 MiB 1.03-1.15 -> 1.03-1.15 (16-bit gelu_mul 1.03 ->
         * 1.09, add, swish_gate, mixed 3-5% slower, all >= 1.03). */
        const PrefetchRule r = prefetch_rule();
        const int64_t wave_blocks = wave1 / block;
        const bool light = heavy16 != 1 && !heavy64 && !heavy_math;
        const bool none = r == PREFETCH_NONE ||
                          (r == PREFETCH_RULE && light && 2 * grid > wave_blocks);
        prefetch = none ? 0 : r == PREFETCH_ALL ? INT_MAX : int(wave_blocks < INT_MAX ? wave_blocks : INT_MAX);
    }
    return AutoPlan{vpt, grid, prefetch};
}

} /* namespace ewk */

#endif /* EWKERN_ELEMENTWISE_LAUNCH_CUH */
