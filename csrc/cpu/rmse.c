/*
 * rmse.c: batched RMSE on the CPU, one "auto" variant per dtype.
 *
 * Inputs a, b are viewed as [outer][n][inner]; batch (o, j) is the n elements at
 * (o * n + i) * inner + j, and out[o * inner + j] = sqrt(sum_i (a - b)^2 / n), float32 for
 * float32/float16/bfloat16 inputs and float64 for float64. n == 0 gives NaN for every batch;
 * outer * inner == 0 writes nothing.
 *
 * Versions:
 *   auto  float64 accumulation (float16/bfloat16 widened through half.h's converters), every
 *         layout. The work is cut into units whose bounds depend on the shape alone:
 *         inner == 1: (batch, chunk of RM_CHUNK elements along n);
 *         inner > 1: (slab o, block of up to RM_COLS columns j, chunk of rows i), each unit
 *         streaming whole rows so that reads stay sequential.
 *         Units run on the OpenMP team (one thread below RM_PAR_MIN elements); each unit's sum
 *         has a fixed order (the compiler's vectorised reduction, fixed for a build), and a
 *         batch's chunk partials are added in chunk order, so results are bitwise the same for
 *         any thread count and any schedule. Timing: ewkern's bench package, device "cpu".
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../ewkern_kernels.h"
#include "cpu_math.h"
#include "half.h"
#include "team.h"

#define RM_CHUNK ((int64_t)1 << 16)     /* elements per unit along n (inner == 1) */
#define RM_COLS ((int64_t)256)          /* columns per unit (inner > 1) */
#define RM_PAR_MIN ((int64_t)1 << 15)   /* below this many elements, stay on the calling thread */

#define RM_SIMD_SUM _Pragma("omp simd reduction(+ : s)")
#define RM_SIMD _Pragma("omp simd")

/* ---- per-dtype inner loops --------------------------------------------------------------- */

/* Sum of squared differences of a[off .. off + len) and b[...], in double. */
typedef double (*rm_rows_fn)(const void *a, const void *b, int64_t off, int64_t len);
/* acc[j] += sum over rows r < nrows of (a - b)^2 at off + r * inner + j, for j < ncols. */
typedef void (*rm_cols_fn)(const void *a, const void *b, int64_t off, int64_t nrows, int64_t inner,
                           int64_t ncols, double *acc);

#define RM_LD_F32(p, i) ((double)(p)[i])
#define RM_LD_F64(p, i) ((p)[i])
#define RM_LD_BF16(p, i) ((double)ew_bf16_to_float((p)[i]))

#define RM_DEFINE(name, ST, LD)                                                                   \
    static double rm_rows_##name(const void *a_, const void *b_, int64_t off, int64_t len)         \
    {                                                                                             \
        const ST *a = (const ST *)a_ + off, *b = (const ST *)b_ + off;                             \
        double s = 0.0;                                                                           \
        RM_SIMD_SUM                                                                               \
        for (int64_t i = 0; i < len; i++) {                                                       \
            const double d = LD(a, i) - LD(b, i);                                                 \
            s += d * d;                                                                           \
        }                                                                                         \
        return s;                                                                                 \
    }                                                                                             \
    static void rm_cols_##name(const void *a_, const void *b_, int64_t off, int64_t nrows,         \
                               int64_t inner, int64_t ncols, double *acc)                         \
    {                                                                                             \
        const ST *a = (const ST *)a_ + off, *b = (const ST *)b_ + off;                             \
        for (int64_t r = 0; r < nrows; r++) {                                                     \
            const ST *ar = a + r * inner, *br = b + r * inner;                                    \
            RM_SIMD                                                                               \
            for (int64_t j = 0; j < ncols; j++) {                                                 \
                const double d = LD(ar, j) - LD(br, j);                                           \
                acc[j] += d * d;                                                                  \
            }                                                                                     \
        }                                                                                         \
    }

RM_DEFINE(f32, float, RM_LD_F32)
RM_DEFINE(f64, double, RM_LD_F64)
RM_DEFINE(bf16, uint16_t, RM_LD_BF16)

/* float16: half.h's per-element converter does not vectorise (a branchy bit-level decode), so
 * the loops take tiles of RM_TILE elements through the block converter (F16C where the CPU has
 * it, elementwise.c) and then run the float loop over the tiles. The columns loop adds each
 * column's rows in the same order as before (the same bits); the rows loop's vectorised sum runs a
 * tile at a time (a fixed order for a build, as before). CI host (AMD EPYC), 2 threads, us:
 * [256, 2048] over axis 1 314 -> 156-196, 2^22 elements 3207 -> 859-1461 (CPU_NOTES.md). */
#define RM_TILE 256
static double rm_rows_f16(const void *a_, const void *b_, int64_t off, int64_t len)
{
    const uint16_t *a = (const uint16_t *)a_ + off, *b = (const uint16_t *)b_ + off;
    float fa[RM_TILE], fb[RM_TILE];
    double s = 0.0;
    for (int64_t t = 0; t < len; t += RM_TILE) {
        const int m = (int)(len - t < RM_TILE ? len - t : RM_TILE);
        ew_f16_to_f32_block(a + t, fa, m);
        ew_f16_to_f32_block(b + t, fb, m);
        RM_SIMD_SUM
        for (int i = 0; i < m; i++) {
            const double d = (double)fa[i] - (double)fb[i];
            s += d * d;
        }
    }
    return s;
}

static void rm_cols_f16(const void *a_, const void *b_, int64_t off, int64_t nrows, int64_t inner,
                        int64_t ncols, double *acc)
{
    const uint16_t *a = (const uint16_t *)a_ + off, *b = (const uint16_t *)b_ + off;
    float fa[RM_TILE], fb[RM_TILE];
    for (int64_t r = 0; r < nrows; r++) {
        const uint16_t *ar = a + r * inner, *br = b + r * inner;
        for (int64_t j0 = 0; j0 < ncols; j0 += RM_TILE) {
            const int m = (int)(ncols - j0 < RM_TILE ? ncols - j0 : RM_TILE);
            ew_f16_to_f32_block(ar + j0, fa, m);
            ew_f16_to_f32_block(br + j0, fb, m);
            double *acc_t = acc + j0;
            RM_SIMD
            for (int j = 0; j < m; j++) {
                const double d = (double)fa[j] - (double)fb[j];
                acc_t[j] += d * d;
            }
        }
    }
}

/* ---- the shared driver ------------------------------------------------------------------- */

static inline void rm_store(void *out, int is_f64, int64_t k, double sum, int64_t n)
{
    const double v = sqrt(sum / (double)n);
    if (is_f64)
        ((double *)out)[k] = v;
    else
        ((float *)out)[k] = (float)v;
}

/* out[k] = sqrt(sum_c partial[k * chunks + c] / n), the chunks added in order. */
static void rm_combine(const double *partial, int64_t chunks, void *out, int is_f64, int64_t batches,
                       int64_t n)
{
    EW_TEAM_FOR(batches * chunks >= RM_PAR_MIN, k, batches,
        const double *p = partial + k * chunks;
        double s = 0.0;
        for (int64_t c = 0; c < chunks; c++)
            s += p[c];
        rm_store(out, is_f64, k, s, n);
    );
}

static int rm_run(const ew_rmse_args *x, int is_f64, rm_rows_fn rows, rm_cols_fn cols)
{
    const int64_t outer = x->outer, n = x->n, inner = x->inner;
    const int64_t batches = outer * inner;
    const void *a = x->a, *b = x->b;
    void *out = x->out;
    if (batches == 0)
        return 0;
    if (n == 0) {
        for (int64_t k = 0; k < batches; k++) {
            if (is_f64)
                ((double *)out)[k] = (double)NAN;
            else
                ((float *)out)[k] = NAN;
        }
        return 0;
    }
    const int par = batches * n >= RM_PAR_MIN;

    if (inner == 1) {
        const int64_t chunks = (n + RM_CHUNK - 1) / RM_CHUNK;
        if (chunks == 1) {
            EW_TEAM_FOR(par, k, batches, rm_store(out, is_f64, k, rows(a, b, k * n, n), n););
            return 0;
        }
        double *partial = (double *)malloc((size_t)(batches * chunks) * sizeof(double));
        if (partial == NULL)
            return ENOMEM;
        const int64_t units = batches * chunks;
        EW_TEAM_FOR(par, u, units,
            const int64_t k = u / chunks, c = u - k * chunks;
            const int64_t i0 = c * RM_CHUNK;
            const int64_t len = n - i0 < RM_CHUNK ? n - i0 : RM_CHUNK;
            partial[u] = rows(a, b, k * n + i0, len);
        );
        rm_combine(partial, chunks, out, is_f64, batches, n);
        free(partial);
        return 0;
    }

    /* inner > 1: unit = (slab o, column block jb, row chunk c); a unit reads rows of its block
     * sequentially and keeps one double per column. */
    const int64_t width = inner < RM_COLS ? inner : RM_COLS;
    const int64_t blocks = (inner + RM_COLS - 1) / RM_COLS;
    int64_t rows_per_chunk = RM_CHUNK / width;
    if (rows_per_chunk < 1)
        rows_per_chunk = 1;
    const int64_t chunks = (n + rows_per_chunk - 1) / rows_per_chunk;
    const int64_t units = outer * blocks * chunks;
    double *partial = NULL;
    if (chunks > 1) {
        partial = (double *)malloc((size_t)(batches * chunks) * sizeof(double));
        if (partial == NULL)
            return ENOMEM;
    }
    EW_TEAM_FOR(par, u, units,
        const int64_t c = u % chunks, ob = u / chunks;
        const int64_t jb = ob % blocks, o = ob / blocks;
        const int64_t j0 = jb * RM_COLS;
        const int64_t ncols = inner - j0 < RM_COLS ? inner - j0 : RM_COLS;
        const int64_t r0 = c * rows_per_chunk;
        const int64_t nrows = n - r0 < rows_per_chunk ? n - r0 : rows_per_chunk;
        double acc[RM_COLS];
        for (int64_t j = 0; j < ncols; j++)
            acc[j] = 0.0;
        cols(a, b, (o * n + r0) * inner + j0, nrows, inner, ncols, acc);
        for (int64_t j = 0; j < ncols; j++) {
            const int64_t k = o * inner + j0 + j;
            if (chunks == 1)
                rm_store(out, is_f64, k, acc[j], n);
            else
                partial[k * chunks + c] = acc[j];
        }
    );
    if (chunks > 1) {
        rm_combine(partial, chunks, out, is_f64, batches, n);
        free(partial);
    }
    return 0;
}

/* ---- launchers and the table -------------------------------------------------------------- */

static int rm_launch_f32(const void *p) { return rm_run((const ew_rmse_args *)p, 0, rm_rows_f32, rm_cols_f32); }
static int rm_launch_f16(const void *p) { return rm_run((const ew_rmse_args *)p, 0, rm_rows_f16, rm_cols_f16); }
static int rm_launch_bf16(const void *p) { return rm_run((const ew_rmse_args *)p, 0, rm_rows_bf16, rm_cols_bf16); }
static int rm_launch_f64(const void *p) { return rm_run((const ew_rmse_args *)p, 1, rm_rows_f64, rm_cols_f64); }

#define RM_ABOUT "OpenMP over (batch, chunk) units fixed by the shape, float64 sums added in a fixed order"

static const ew_kernel rm_table[] = {
    {"rmse", "auto", EW_FLOAT32, rm_launch_f32, NULL, 0u, RM_ABOUT},
    {"rmse", "auto", EW_FLOAT16, rm_launch_f16, NULL, 0u, RM_ABOUT},
    {"rmse", "auto", EW_BFLOAT16, rm_launch_bf16, NULL, 0u, RM_ABOUT},
    {"rmse", "auto", EW_FLOAT64, rm_launch_f64, NULL, 0u, RM_ABOUT},
};

const ew_kernel *ew_cpu_rmse_table(int *count)
{
    *count = (int)(sizeof rm_table / sizeof rm_table[0]);
    return rm_table;
}
