/*
 * team.h: a loop on the OpenMP team, or on the calling thread, without opening a region there.
 *
 * `#pragma omp parallel for if (0)` still opens a parallel region, of one thread: libgomp's
 * GOMP_parallel allocates, starts and ends a team on every call, about 0.6 us on the CI host (gcc
 * 12, libgomp), where a kernel of 16 elements takes 0.01-0.1 us (2026-11-28: exp_backward on 16
 * float32 elements 0.72 us a call against exp's 0.25, whose loops test the size first; 0.27 after).
 * EW_TEAM_FOR writes the loop twice, once under the pragma and once plain, and takes one at run
 * time, as elementwise.c's EW_FOR (the same with omp simd) and EW_BLOCKS do for theirs.
 */
#ifndef EWKERN_CPU_TEAM_H
#define EWKERN_CPU_TEAM_H

#include <stdint.h>

/* for (int64_t I = 0; I < N; I++) { the body } on the OpenMP team (schedule(static)) where par,
 * else on the calling thread. The body is the macro's last arguments (commas and _Pragma("omp
 * simd") inside it are fine: gcc and clang keep a _Pragma of a macro argument where it stands). */
#ifdef _OPENMP
#define EW_TEAM_FOR(par, I, N, ...)                                                          \
    do {                                                                                     \
        if (par) {                                                                           \
            _Pragma("omp parallel for schedule(static)")                                     \
            for (int64_t I = 0; I < (N); I++) { __VA_ARGS__ }                                \
        } else {                                                                             \
            for (int64_t I = 0; I < (N); I++) { __VA_ARGS__ }                                \
        }                                                                                    \
    } while (0)
#else
#define EW_TEAM_FOR(par, I, N, ...)                                                          \
    do {                                                                                     \
        (void)(par);                                                                         \
        for (int64_t I = 0; I < (N); I++) { __VA_ARGS__ }                                    \
    } while (0)
#endif

#endif /* EWKERN_CPU_TEAM_H */
