/*
 * elementwise_ops_on_gpus.cu: the elementwise-ops-on-gpus.md study: its copy loop over vector width,
 * index width and grid rule, and the same two grid rules on the default path's body for three ops.
 *
 * Each row of the table at the bottom is one (op, variant, dtype) with its launcher and __global__
 * function. Time them with `python -m ewkern.bench e5` (grid1 against grid2), `e6` (vec1/vec2/vec4
 * against size), `e7` (one SM), `e8` (instructions per loop iteration, from the SASS), or any row with
 * ewkern.bench (op, dtype, variant); notes and measurements are in ELEMENTWISE_NOTES.md.
 *
 *  4. copy     the study's copy loop (float32, bfloat16): "vec{1,2,4}_i{32,64}_grid{1,2}":
 *              elements per load, 32- or 64-bit loop index, grid1 = ceil(n / vec / block) or
 *              grid2 = min(grid1, SMs * threads_per_SM / block * 32 waves), grid-stride either way.
 *  6. grid1/grid2  log, erf, add_const (float32, bfloat16): "grid1", "grid2": a grid-stride body with
 *              one vector per thread under the study's two grid rules: grid1 = ceil(vectors / block),
 *              grid2 = min(grid1, SMs x threads_per_SM / block x 32 waves) from the device. The body and
 *              its launch (run_gs) are auto's (elementwise_auto.cuh), made once in elementwise_auto.cu.
 *
 * Every version is correct for any n >= 0 and any element-aligned pointers (out may equal an input):
 * the vectors follow a scalar head up to the alignment boundary when all pointers share one offset, a
 * scalar tail ends them, and the element loop (copy: the vec1 kernel) takes pointers whose offsets
 * differ. The i32 copies cut arrays of 2^30 elements or more into launches of 2^30 elements.
 */
#include <cuda_runtime.h>

#include <cstdint>

#include "ewkern_kernels.h"
#include "elementwise_common.cuh"
#include "elementwise_auto.cuh"

namespace ewk {

/* ---------------------------------------------------------------------------------------------
 * 4. elementwise-ops-on-gpus.md: the copy loop, vec1/vec2/vec4 x 32/64-bit index x grid1/grid2.
 * ------------------------------------------------------------------------------------------- */

template <int BYTES> struct Bytes;
template <> struct Bytes<2> { typedef unsigned short type; };
template <> struct Bytes<4> { typedef unsigned int type; };
template <> struct Bytes<8> { typedef uint2 type; };
template <> struct Bytes<16> { typedef uint4 type; };

/* Grid-stride copy of V-element vectors. in and out point at the array's first element on a
 * V-element boundary (the host adds the head), n counts the elements from there on, and the head
 * elements before in/out and the tail after the last whole vector go one by one. The vector loop
 * comes first and addresses the kernel's own pointer parameters, so it is the first loop in the
 * SASS and reads like the study's (base + i * vector size). */
template <class T, int V, class Idx>
EW_DEV void copy_body(const T *__restrict__ in, T *__restrict__ out, Idx n, Idx head)
{
    typedef typename Bytes<sizeof(T)>::type E;
    typedef typename Bytes<V * sizeof(T)>::type VT;
    const Idx tid = Idx(blockIdx.x) * Idx(blockDim.x) + Idx(threadIdx.x);
    const Idx stride = Idx(blockDim.x) * Idx(gridDim.x);
    const VT *iv = reinterpret_cast<const VT *>(in);
    VT *ov = reinterpret_cast<VT *>(out);
    const Idx nv = n / Idx(V);
    for (Idx i = tid; i < nv; i += stride)
        ov[i] = iv[i];
    const E *ie = reinterpret_cast<const E *>(in);
    E *oe = reinterpret_cast<E *>(out);
#pragma unroll 1
    for (Idx i = nv * Idx(V) + tid; i < n; i += stride)
        oe[i] = ie[i];
#pragma unroll 1
    for (Idx i = tid; i < head; i += stride)
        (oe - head)[i] = (ie - head)[i];
}

#define EWK_COPY_KERNEL(V, IB, IDX) \
    template <class T> \
    __global__ void copy_vec##V##_i##IB(const T *__restrict__ in, T *__restrict__ out, IDX n, IDX head) \
    { \
        copy_body<T, V, IDX>(in, out, n, head); \
    }
EWK_COPY_KERNEL(1, 32, uint32_t)
EWK_COPY_KERNEL(2, 32, uint32_t)
EWK_COPY_KERNEL(4, 32, uint32_t)
EWK_COPY_KERNEL(1, 64, uint64_t)
EWK_COPY_KERNEL(2, 64, uint64_t)
EWK_COPY_KERNEL(4, 64, uint64_t)

template <class T, int V, class Idx> struct CopyKernel;
#define EWK_COPY_PICK(V, IB, IDX) \
    template <class T> struct CopyKernel<T, V, IDX> { \
        static void (*get())(const T *, T *, IDX, IDX) { return copy_vec##V##_i##IB<T>; } \
    };
EWK_COPY_PICK(1, 32, uint32_t)
EWK_COPY_PICK(2, 32, uint32_t)
EWK_COPY_PICK(4, 32, uint32_t)
EWK_COPY_PICK(1, 64, uint64_t)
EWK_COPY_PICK(2, 64, uint64_t)
EWK_COPY_PICK(4, 64, uint64_t)

/* grid1 = ceil(n / vec / block); grid2 = min(grid1, SMs * threads_per_SM / block * 32). */
template <class T, int V, class Idx, int GRID>
static int launch_copy(const void *args)
{
    const ew_args *a = static_cast<const ew_args *>(args);
    if (a->n <= 0)
        return 0;
    const int block = a->block > 0 ? a->block : 256;
    const int64_t chunk = sizeof(Idx) == 4 ? kChunk32 : a->n;
    return for_chunks(a->n, chunk, [&](int64_t off, int64_t cnt) {
        const T *x = in_at<T>(a, 0, off);
        T *z = out_at<T>(a, off);
        const void *ptrs[2] = {z, x};
        const int64_t head = common_head(ptrs, 2, int(V * sizeof(T)), int(sizeof(T)), cnt);
        const int v = head >= 0 ? V : 1; /* differing offsets: the vec1 loop */
        int64_t grid = ceil_div((head >= 0 ? cnt - head : cnt) / v, block);
        if (GRID == 2) {
            const int64_t g2 = wave_grid(a, block, 32);
            grid = grid < g2 ? grid : g2;
        }
        void (*kern)(const T *, T *, Idx, Idx) =
            head >= 0 ? CopyKernel<T, V, Idx>::get() : CopyKernel<T, 1, Idx>::get();
        const int64_t h = head >= 0 ? head : 0;
        kern<<<unsigned(clamp_grid(grid)), block, 0, stream_of(a)>>>(x + h, z + h, Idx(cnt - h), Idx(h));
    });
}

/* ---------------------------------------------------------------------------------------------
 * 6. the study's grid rules on auto's grid-stride body (run_gs: elementwise_auto.cuh).
 * ------------------------------------------------------------------------------------------- */

template <class Op, class T>
static int launch_grid1(const void *args) { return run_gs<Op, T>(static_cast<const ew_args *>(args), GRID_1); }
template <class Op, class T>
static int launch_grid2(const void *args) { return run_gs<Op, T>(static_cast<const ew_args *>(args), GRID_2); }

/* ---------------------------------------------------------------------------------------------
 * The table.
 * ------------------------------------------------------------------------------------------- */

#define EWK_B EW_USES_BLOCK

#define EWK_COPY_ROWS(T, DT, V, IB, IDX) \
    {"copy", "vec" #V "_i" #IB "_grid1", DT, launch_copy<T, V, IDX, 1>, (const void *)copy_vec##V##_i##IB<T>, EWK_B, \
     "copy study: " #V " elements per load, " #IB "-bit loop index, grid1 = ceil(n / " #V " / block)"}, \
    {"copy", "vec" #V "_i" #IB "_grid2", DT, launch_copy<T, V, IDX, 2>, (const void *)copy_vec##V##_i##IB<T>, EWK_B, \
     "copy study: " #V " elements per load, " #IB "-bit loop index, grid2 = min(grid1, SMs x threads/SM / block x 32)"},
#define EWK_COPY_DTYPE(T, DT) \
    EWK_COPY_ROWS(T, DT, 1, 32, uint32_t) \
    EWK_COPY_ROWS(T, DT, 2, 32, uint32_t) \
    EWK_COPY_ROWS(T, DT, 4, 32, uint32_t) \
    EWK_COPY_ROWS(T, DT, 1, 64, uint64_t) \
    EWK_COPY_ROWS(T, DT, 2, 64, uint64_t) \
    EWK_COPY_ROWS(T, DT, 4, 64, uint64_t)

#define EWK_GRID_ROWS(NAME, T, DT) \
    {#NAME, "grid1", DT, launch_grid1<Op_##NAME, T>, gs_kernel<Op_##NAME, T>(), EWK_B, \
     "grid-stride body, one 16-byte vector per thread: grid1 = ceil(vectors / block)"}, \
    {#NAME, "grid2", DT, launch_grid2<Op_##NAME, T>, gs_kernel<Op_##NAME, T>(), EWK_B, \
     "grid-stride body with grid2 = min(grid1, SMs x threads/SM / block x 32)"},
/* The grid rows' kernel addresses come from elementwise_auto.cu (gs_kernel), so this table is filled
 * when the library loads (dynamic initialisation), before the registry reads it. */
static const ew_kernel kTable[] = {
    /* 4. copy study */
    EWK_COPY_DTYPE(float, EW_FLOAT32)
    EWK_COPY_DTYPE(bf16_t, EW_BFLOAT16)
    /* 6. the grid rules on auto's body */
    EWK_GS_LIST(EWK_GRID_ROWS)
};

} /* namespace ewk */

extern "C" const ew_kernel *ew_cuda_elementwise_ops_on_gpus_table(int *count)
{
    if (count)
        *count = int(sizeof(ewk::kTable) / sizeof(ewk::kTable[0]));
    return ewk::kTable;
}
