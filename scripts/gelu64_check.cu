/* gelu64_check.cu: the float64 gelu of the default path (gelu_f64 in csrc/cuda/elementwise_ops.cuh,
 * compiled here for the host; its reciprocal seed is a float reciprocal instead of MUFU.RCP64H)
 * against 0.5 x erfc(-x / sqrt 2) in long double, on N inputs: a quarter each on [-40, -5], [-5, 6],
 * tiny |x| (2^-1000..2^-10) and random bit patterns, plus the special values. Prints the largest
 * error in ulp (eps x |ref|), the largest ratio to the ops.def bound 4 + 2 a^2, and the largest
 * absolute error of results below the smallest normal. With "grad" after N: gelu_grad_f64 (grad
 * 1.25) against Phi(x) + x phi(x), the error in ulp of |Phi| + |x phi| (grads.def's bound, 4 + 2 a^2).
 * Without it, also the kernels' batched core (phi_f64_n, 8 inputs at a time) against one at a time:
 * the same bits for every input. No GPU needed:
 *
 *     nvcc -O2 -std=c++17 -I csrc -I csrc/cuda -o /tmp/gelu64_check scripts/gelu64_check.cu && /tmp/gelu64_check 8000000 [grad]
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "elementwise_ops.cuh"

static const double kP[] = {EWK_GELU64_P(EWK_COEF_ITEM)};
static const double kQ[] = {EWK_EXP64_Q(EWK_COEF_ITEM)};

static bool grad_mode = false;
static const double kG = 1.25; /* the incoming gradient in grad mode (exact) */

/* gelu, or in grad mode kG (Phi + x phi); *scale: the size the bound is relative to */
static long double ref(double x, long double *scale = nullptr)
{
    const long double X = x;
    if (!grad_mode) {
        const long double w = 0.5L * X * erfcl(-X / sqrtl(2.0L));
        if (scale)
            *scale = fabsl(w);
        return w;
    }
    const long double cdf = 0.5L * erfcl(-X / sqrtl(2.0L));
    const long double xpdf = X * expl(-0.5L * X * X) / sqrtl(2.0L * 3.14159265358979323846264338327950288L);
    if (scale)
        *scale = kG * (fabsl(cdf) + fabsl(xpdf));
    return kG * (cdf + xpdf);
}

static double ours(double x)
{
    return grad_mode ? ewk::gelu_grad_f64(kG, x, kP, kQ) : ewk::gelu_f64(x, kP, kQ);
}

int main(int argc, char **argv)
{
    const long n = argc > 1 ? atol(argv[1]) : 4000000;
    grad_mode = argc > 2 && !strcmp(argv[2], "grad");
    const long double eps = 2.220446049250313e-16L, tiny = 2.2250738585072014e-308L;
    double max_ulp = 0, max_ulp_x = 0, max_ratio = 0, max_ratio_ulp = 0, max_ratio_x = 0, sub_abs = 0, sub_x = 0;
    double max_ulp_small = 0, max_ulp_small_x = 0; /* |x| <= 5 */
    uint64_t st = 88172645463325252ull;
    double batch_x[8], batch_g[8];
    int nb = 0;
    long batch_diff = 0;
    for (long i = 0; i < n; ++i) {
        st ^= st << 13; st ^= st >> 7; st ^= st << 17;
        const double u = double(st >> 11) * (1.0 / 9007199254740992.0);
        double x;
        switch (i % 4) {
        case 0: x = -40.0 + 35.0 * u; break;
        case 1: x = -5.0 + 11.0 * u; break;
        case 2: x = (u - 0.5) * std::ldexp(1.0, -int(st % 990) - 10); break;
        default: memcpy(&x, &st, 8); if (!std::isfinite(x)) continue;
        }
        const double g = ours(x);
        if (!grad_mode) { /* the kernels' batched core (phi_f64_n, 8 at a time) gives the same bits */
            batch_x[nb] = x;
            batch_g[nb++] = g;
            if (nb == 8) {
                ewk::Phi64 f[8];
                ewk::phi_f64_n<8>(batch_x, f, kP, kQ);
                for (int j = 0; j < 8; ++j) {
                    const double b = ewk::gelu_of_phi64(batch_x[j], f[j]);
                    if (memcmp(&b, &batch_g[j], 8) && !(b != b && batch_g[j] != batch_g[j]))
                        ++batch_diff;
                }
                nb = 0;
            }
        }
        long double size;
        const long double w = ref(x, &size);
        const long double err = fabsl((long double)g - w);
        if (size < tiny) {
            if (double(err) > sub_abs) { sub_abs = double(err); sub_x = x; }
            continue;
        }
        const double ulp = double(err / (size * eps));
        const double ratio = ulp / (4.0 + 2.0 * x * x);
        if (ulp > max_ulp) { max_ulp = ulp; max_ulp_x = x; }
        if (fabs(x) <= 5 && ulp > max_ulp_small) { max_ulp_small = ulp; max_ulp_small_x = x; }
        if (ratio > max_ratio) { max_ratio = ratio; max_ratio_ulp = ulp; max_ratio_x = x; }
    }
    printf("%s: ", grad_mode ? "gelu_grad_f64" : "gelu_f64");
    printf("%ld inputs: max error %.3f ulp at x = %.17g; |x| <= 5: %.3f ulp at x = %.17g\n", n, max_ulp, max_ulp_x,
           max_ulp_small, max_ulp_small_x);
    printf("max error / (4 + 2 a^2) = %.4f (%.3f ulp at x = %.17g)\n", max_ratio, max_ratio_ulp, max_ratio_x);
    printf("results below 2^-1022: max |error| %.3g = %.1f x 2^-1074 at x = %.17g\n", sub_abs,
           sub_abs / 4.9406564584124654e-324, sub_x);
    if (!grad_mode)
        printf("batched core (8 at a time): %ld results differ from one at a time\n", batch_diff);
    const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 4.9406564584124654e-324, -1e-310, 1e-300,
                              -1.7976931348623157e308, 1.7976931348623157e308, -37.5, -38.5, -40.0, -1e6};
    for (double x : special)
        printf("%s(%.17g) = %.17g   (long double: %.17Lg)\n", grad_mode ? "gelu'" : "gelu", x, ours(x), ref(x));
    return max_ratio <= 1.0 && batch_diff == 0 ? 0 : 1;
}
