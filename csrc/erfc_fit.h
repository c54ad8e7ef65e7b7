/*
 * erfc_fit.h: floor 0 (see state.h; a contract with csrc/cpu and csrc/cuda: no calls). The fit
 * of erfc that float gelu and its gradient evaluate on the GPU
 * (csrc/cuda/elementwise_ops.cuh, erfc_fit_f32) and on the CPU (csrc/cpu/cpu_math.h,
 * ew_erfc_fit_q_float): for z >= 0, erfc(z) = t 2^(-z^2 log2(e) + s Q(s)), t = 1 / (1 + z / 2),
 * s = 1 - t, with Q of degree 9 (s Q(s) to 6e-9 relative; scripts/gelu_fit.py makes the
 * coefficients). EW_ERFC_FIT_Q_F32(q, s) sets the float q to Q(s) by Horner's rule in fmaf.
 */
#ifndef EWKERN_ERFC_FIT_H
#define EWKERN_ERFC_FIT_H

#define EW_ERFC_FIT_Q_F32(q, s)              \
    do {                                     \
        (q) = -0.20092766f;                  \
        (q) = fmaf((q), (s), 0.6277097f);    \
        (q) = fmaf((q), (s), -0.5815188f);   \
        (q) = fmaf((q), (s), 0.11310536f);   \
        (q) = fmaf((q), (s), -0.12101603f);  \
        (q) = fmaf((q), (s), 0.071952134f);  \
        (q) = fmaf((q), (s), 0.28323686f);   \
        (q) = fmaf((q), (s), 0.23216939f);   \
        (q) = fmaf((q), (s), -0.4374274f);   \
        (q) = fmaf((q), (s), -1.8131202f);   \
    } while (0)

#endif /* EWKERN_ERFC_FIT_H */
