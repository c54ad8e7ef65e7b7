"""Fit and check the polynomial of the CUDA erf for float16/bfloat16 results (csrc/cuda/elementwise_ops.cuh,
Op_erf_sfu).

For |x| >= 2^-7 the kernel evaluates, in float32,

    erf(x) = sign(x) (1 - 2^(-t S(t))),   t = |x|,   S of degree 4 (Horner, fmaf),

with 2^(...) from ex2.approx.ftz.f32, and x 2/sqrt(pi) below 2^-7 (where 1 - 2^(...) would cancel). S is a
weighted minimax fit (a linear program) of f(t) = -log2(erfc(t)) on t in (0, 3]: an error df in the exponent
moves erf by ln 2 erfc(t) df, so the weight ln 2 erfc / erf makes the fit's error relative to erf. Beyond 3
the fit is held to t S(t) >= 14 up to t = 40 (1 - 2^-14 and above round to 1 in both 16-bit types; beyond 40
the positive leading term only grows).

The check emulates the kernel's float32 operations (each fmaf rounded once) on every finite 16-bit input,
with ex2.approx's relative error (2^-22) taken at -2^-22, 0 and +2^-22, rounds to the 16-bit type, and
prints the largest error in ulp of the result against erf in float64. Needs numpy, scipy and ml_dtypes (not
dependencies of ewkern; the coefficients are committed).

    python scripts/erf16_fit.py
"""
import ml_dtypes
import numpy as np
from scipy.optimize import linprog
from scipy.special import erf, erfc

T_FIT, T_BIG, F_MIN = 3.0, 40.0, 14.0
SMALL = 2.0 ** -7
EX2_ERR = 2.0 ** -22


def fit(deg):
    """S's coefficients, lowest degree first (float64), and the fit's weighted error."""
    t = np.unique(np.concatenate([np.linspace(1e-4, T_FIT, 4000), T_FIT * np.cos(np.linspace(0, np.pi / 2, 600))]))
    t = t[t >= 1e-4]
    w = np.log(2) * erfc(t) / erf(t)
    u = t / T_FIT                                   # powers of t / T_FIT keep the program well scaled
    A = t[:, None] * u[:, None] ** np.arange(deg + 1)
    f = -np.log2(erfc(t))
    ones = np.ones((len(t), 1))
    tb = np.geomspace(T_FIT, T_BIG, 3000)
    B = tb[:, None] * (tb / T_FIT)[:, None] ** np.arange(deg + 1)
    a_ub = np.vstack([np.hstack([w[:, None] * A, -ones]), np.hstack([-w[:, None] * A, -ones]),
                      np.hstack([-B, np.zeros((len(tb), 1))])])
    b_ub = np.concatenate([w * f, -w * f, -F_MIN * np.ones(len(tb))])
    cost = np.zeros(deg + 2)
    cost[-1] = 1.0                                  # minimise the largest weighted error
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(None, None)] * (deg + 2), method="highs")
    assert res.status == 0, res.message
    return res.x[:-1] / T_FIT ** np.arange(deg + 1), res.x[-1]


def f32(v):
    return np.asarray(v, dtype=np.float64).astype(np.float32)


def ftz(v):
    return np.where(np.abs(v) < np.float32(2.0 ** -126), np.float32(0), v).astype(np.float32)


def kernel(x, c, d):
    """Op_erf_sfu on float32 x with float32 coefficients c (lowest first), ex2's error d."""
    t = np.abs(x)
    r = np.full_like(x, c[-1])
    for ck in c[-2::-1]:
        r = f32(r.astype(np.float64) * t + np.float64(ck))     # fmaf: exact product, one rounding
    e = ftz(f32(np.exp2(ftz(f32(-(t.astype(np.float64) * r))).astype(np.float64)) * (1 + d)))
    big = np.copysign(f32(1.0 - e.astype(np.float64)), x)
    return np.where(t < np.float32(SMALL), f32(x.astype(np.float64) * np.float32(2 / np.sqrt(np.pi))), big)


def check(c):
    for name, dt, mant in (("float16", np.float16, 10), ("bfloat16", ml_dtypes.bfloat16, 7)):
        x16 = np.arange(65536, dtype=np.uint16).view(dt)
        x = x16.astype(np.float32)
        fin = np.isfinite(x)
        with np.errstate(all="ignore"):
            ref = erf(x.astype(np.float64))
        worst = 0.0
        for d in (-EX2_ERR, 0.0, EX2_ERR):
            with np.errstate(all="ignore"):
                got = kernel(x, c, d).astype(dt).astype(np.float64)
            assert np.isnan(got[np.isnan(x)]).all() and (got[np.isinf(x)] == np.sign(x[np.isinf(x)])).all()
            emin = -14 if name == "float16" else -126
            ulp = 2.0 ** (np.maximum(np.floor(np.log2(np.abs(ref[fin]) + 1e-300)), emin) - mant)
            worst = max(worst, float(np.max(np.abs(got[fin] - ref[fin]) / ulp)))
        print(f"{name}: at most {worst:.3f} ulp of erf on every finite input (ex2 error -2^-22, 0, +2^-22)")


def main():
    coef, err = fit(4)
    c = [np.float32(v) for v in coef]
    print(f"degree 4 on (0, {T_FIT}]: largest weighted error 2^{np.log2(err):.2f} (relative to erf)")
    print("S, highest degree first (Horner from the top):")
    for v in c[::-1]:
        m, e = float(v).hex().split("p")
        print(f"    {m.rstrip('0')}p{e}f   /* {float(v)!r} */")
    check(c)


if __name__ == "__main__":
    main()
