"""Fit the polynomials of the float64 CUDA gelu (gelu_f64 in csrc/cuda/elementwise_ops.cuh).

    gelu(x) = x Phi(x),   Phi(-y) = erfc(y / sqrt 2) / 2 = e^(-y^2/2) R(y),   y = |x| in [0, 40],
    R(y) = (1 - s) P(s),  s = y / (5 + y),
    e^(-y^2/2) = 2^k e^(v/2),  v = -y^2 - 2 k ln 2 in [-ln 2, ln 2],  e^(v/2) = 1 + v (1/2 + v Q(v)).

P (degree 19) is fitted by iteratively reweighted least squares (Lawson, towards weighted minimax)
on Chebyshev nodes of s, in mpmath, with the relative error of P weighted by 1 / (1 + y^2/2): the
op's bound is 4 + 2 a^2 ulp, so the fit may grow with y^2 where x << 0. Q (degree 9) is
mpmath.chebyfit of q(r) = (e^r - 1 - r) / r^2 on |r| <= ln 2 / 2, its i-th coefficient scaled by
2^-(i+2) (exact) for the variable v = 2r. Prints both as the C macros of elementwise_ops.cuh. Needs
mpmath (not a dependency of ewkern; the coefficients are committed). About 10 s.

    python scripts/gelu64_fit.py
"""
import mpmath as mp

C = 5          # s = y / (C + y)
YMAX = 40      # y is clamped here in the kernel (e^-800 underflows)
DEG_P = 19
DEG_Q = 9


def R(y):
    return mp.erfc(y / mp.sqrt(2)) * mp.exp(y * y / 2) / 2


def fit_p(deg=DEG_P, npts=200, rounds=20):
    c = mp.mpf(C)
    smax = YMAX / (c + YMAX)
    ss = [(mp.cos(mp.pi * (k + mp.mpf(1) / 2) / npts) + 1) / 2 * smax for k in range(npts)]
    ys = [c * s / (1 - s) for s in ss]
    ps = [R(y) / (1 - s) for s, y in zip(ss, ys)]
    bud = [1 + y * y / 2 for y in ys]
    ws = [2 * s / smax - 1 for s in ss]

    def cheb(w):
        t = [mp.mpf(1), w]
        for _ in range(2, deg + 1):
            t.append(2 * w * t[-1] - t[-2])
        return t[:deg + 1]

    basis = [cheb(w) for w in ws]
    lw = [mp.mpf(1)] * npts
    for _ in range(rounds):
        a = mp.matrix(npts, deg + 1)
        b = mp.matrix(npts, 1)
        for i in range(npts):
            sc = lw[i] / (ps[i] * bud[i])
            for j in range(deg + 1):
                a[i, j] = basis[i][j] * sc
            b[i] = ps[i] * sc
        coef = mp.qr_solve(a, b)[0]
        errs = [(mp.fsum(coef[j] * basis[i][j] for j in range(deg + 1)) - ps[i]) / (ps[i] * bud[i])
                for i in range(npts)]
        emax = max(abs(e) for e in errs)
        lw = [lw[i] * mp.sqrt(abs(errs[i]) / emax + mp.mpf("1e-3")) for i in range(npts)]
        top = max(lw)
        lw = [x / top for x in lw]
    # Chebyshev in w = (2 / smax) s - 1 -> monomials in s
    k = 2 / smax
    polys = [[mp.mpf(1)], [mp.mpf(-1), k]]
    for j in range(2, deg + 1):
        nxt = [mp.mpf(0)] * (j + 1)
        for i, v in enumerate(polys[-1]):
            nxt[i + 1] += 2 * k * v
            nxt[i] -= 2 * v
        for i, v in enumerate(polys[-2]):
            nxt[i] -= v
        polys.append(nxt)
    mono = [mp.mpf(0)] * (deg + 1)
    for j in range(deg + 1):
        for i, v in enumerate(polys[j]):
            mono[i] += coef[j] * v
    return mono[::-1], emax   # highest degree first


def fit_q(deg=DEG_Q):
    h = mp.log(2) / 2

    def q(r):
        return mp.mpf(1) / 2 if abs(r) < mp.mpf("1e-30") else (mp.exp(r) - 1 - r) / r ** 2

    poly, err = mp.chebyfit(q, [-h, h], deg + 1, error=True)   # highest degree first
    return [poly[j] / mp.mpf(2) ** ((deg - j) + 2) for j in range(deg + 1)], err * h * h


def macro(name, coefs):
    items = " ".join(f"X({float(c)!r})" for c in coefs)
    return f"#define {name}(X) {items}"


def main():
    mp.mp.dps = 40
    p, ep = fit_p()
    q, eq = fit_q()
    print(f"/* P: relative error / (1 + y^2/2) <= {float(ep):.2e}; Q: e^(v/2) within {float(eq):.2e} */")
    print(macro("EWK_GELU64_P", p))
    print(macro("EWK_EXP64_Q", q))


if __name__ == "__main__":
    main()
