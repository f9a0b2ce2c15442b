/* backward_ops.c — the derivatives of the forward pass's small ops (RMSNorm, LayerNorm, the SiLU and
 * GELU gates) for the backward pass: scalar C with double sums, the same on every kernel set. Must
 * not compute anything of the forward pass itself (that is the kernel sets' ops). */
#include "kernels.h"

#include <math.h>

/* y_i = x_i r w_i with r = 1 / sqrt(mean(x^2) + eps):
 * dx_i = r w_i dy_i - x_i r^3 / n * sum_j w_j dy_j x_j (the second term dropped when frozen). */
void ember_rmsnorm_backward(float *dx, const float *dy, const float *x, const float *w, int64_t n, float eps,
                            bool frozen) {
    double ss = 0.0, dot = 0.0;
    for (int64_t i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
        dot += (double)dy[i] * (w ? w[i] : 1.0f) * x[i];
    }
    const double r = 1.0 / sqrt(ss / (double)n + (double)eps), c = frozen ? 0.0 : r * r * r * dot / (double)n;
    for (int64_t i = 0; i < n; i++) dx[i] = (float)(r * dy[i] * (w ? w[i] : 1.0f) - c * x[i]);
}

/* y_i = xhat_i w_i + b_i, xhat = (x - mean) r, r = 1 / sqrt(var + eps); with gy = dy w:
 * dx = r (gy - mean(gy) - xhat mean(gy xhat)) (the last term dropped when frozen). */
void ember_layernorm_backward(float *dx, const float *dy, const float *x, const float *w, int64_t n, float eps,
                              bool frozen) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (double)n;
    const double r = 1.0 / sqrt(var + (double)eps);
    double mg = 0.0, mgx = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double gy = (double)dy[i] * (w ? w[i] : 1.0f);
        mg += gy;
        mgx += gy * (x[i] - mean) * r;
    }
    mg /= (double)n;
    mgx = frozen ? 0.0 : mgx / (double)n;
    for (int64_t i = 0; i < n; i++) {
        const double gy = (double)dy[i] * (w ? w[i] : 1.0f);
        dx[i] = (float)(r * (gy - mg - (x[i] - mean) * r * mgx));
    }
}

/* silu(g) = g s, s = 1 / (1 + e^-g); silu'(g) = s (1 + g (1 - s)). */
void ember_silu_mul_backward(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const double s = 1.0 / (1.0 + exp(-(double)g[i]));
        dg[i] = (float)((double)dh[i] * u[i] * s * (1.0 + g[i] * (1.0 - s)));
        du[i] = (float)((double)dh[i] * g[i] * s);
    }
}

/* gelu_tanh(g) = g (1 + tanh z) / 2, z = k (g + a g^3):
 * gelu'(g) = (1 + tanh z) / 2 + g (1 - tanh^2 z) k (1 + 3 a g^2) / 2. */
void ember_gelu_mul_backward(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n) {
    const double k = 0.79788456080286535588, a = 0.044715;
    for (int64_t i = 0; i < n; i++) {
        const double x = g[i], th = tanh(k * (x + a * x * x * x));
        const double gelu = 0.5 * x * (1.0 + th),
                     d = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1 + 3 * a * x * x);
        dg[i] = (float)((double)dh[i] * (u ? u[i] : 1.0f) * d);
        if (u) du[i] = (float)((double)dh[i] * gelu);
    }
}
