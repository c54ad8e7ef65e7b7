"""Fit the polynomials of the CUDA gelu (csrc/cuda/elementwise_ops.cuh, erfc_fit_f32 and erfc_fit_h16, used by gelu and its backward).

gelu(x) = x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2. The kernels evaluate one erfc(z), z = |x| / sqrt 2,
for both signs of x as

    erfc(z) = t * 2^(-z^2 log2(e) + s Q(s)),   t = 1 / (1 + z / 2),   s = 1 - t in [0, 1),

so that the polynomial s Q(s) approximates log2(erfc(z) / t) + z^2 log2(e), a smooth function of s that
is 0 at z = 0 (so Horner's rounding errors stay relative near x = 0). This script fits Q by iteratively
reweighted least squares on Chebyshev nodes of s over z in [0, 10] (erfc(10) = 2e-45: below every dtype's
smallest subnormal once multiplied by |x| / 2) and prints the coefficients as C float literals, highest
degree first. Needs numpy and mpmath (not a dependency of ewkern; the coefficients are committed).

    python scripts/gelu_fit.py            # degree 10 (float results) and 5 (float16/bfloat16 results)
"""
import sys

import mpmath as mp
import numpy as np

P = 0.5          # t = 1 / (1 + P z)
ZMAX = 10.0


def target(z):
    return float(mp.log(mp.erfc(mp.mpf(z)), 2) + mp.mpf(z) ** 2 / mp.log(2) - mp.log(1 / (1 + P * mp.mpf(z)), 2))


def fit(deg, npts=1500, rounds=30):
    smax = P * ZMAX / (1 + P * ZMAX)
    k = np.arange(npts)
    s = (np.cos(np.pi * (k + 0.5) / npts) + 1) / 2 * smax
    z = s / (P * (1 - s))
    y = np.array([target(v) for v in z])
    V = np.vander(s, deg + 1, increasing=True)[:, 1:]      # s^1 .. s^deg: the fit is 0 at s = 0
    w = np.ones_like(s)
    for _ in range(rounds):                                  # Lawson-style reweighting towards minimax
        c, *_ = np.linalg.lstsq(V * w[:, None], y * w, rcond=None)
        e = V @ c - y
        w = w * np.sqrt(np.abs(e) / np.abs(e).max() + 1e-3)
        w /= w.max()
    return c, float(np.abs(V @ c - y).max())


def main(argv):
    mp.mp.dps = 40
    for deg in [int(a) for a in argv] or [10, 5]:
        c, err = fit(deg)
        print(f"/* degree {deg}: max |error| {err:.2e} in log2 units ({err * np.log(2):.2e} relative) */")
        print(", ".join(f"{np.float32(v)!r}f".replace("np.float32(", "").replace(")", "") for v in c[::-1]))


if __name__ == "__main__":
    main(sys.argv[1:])
