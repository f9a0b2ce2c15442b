/* rope.c — RoPE over all heads of one token with the rotation angles computed once per call.
 * Must stay bit-identical to ember_rope applied head by head: same double-precision angles rounded
 * to f32, same f32 rotation; only the pow/cos/sin work is shared between heads. */
#include "kernels.h"

#include <math.h>

/* Pairs handled with the shared table; wider rotations fall back to ember_rope per head. */
#define EMBER_ROPE_MAX_PAIRS 512

void ember_rope_heads_fast(float *x, int64_t n_heads, int64_t hd, int64_t n_rot, int64_t pos, float base, bool neox,
                           const float *freq_factors) {
    const int64_t half = n_rot / 2;
    if (half > EMBER_ROPE_MAX_PAIRS) {
        for (int64_t h = 0; h < n_heads; h++) ember_rope(x + h * hd, n_rot, pos, base, neox, freq_factors);
        return;
    }
    float cs[EMBER_ROPE_MAX_PAIRS], sn[EMBER_ROPE_MAX_PAIRS];
    for (int64_t i = 0; i < half; i++) { /* the same expressions as ember_rope */
        double freq = pow((double)base, -2.0 * (double)i / (double)n_rot);
        if (freq_factors) freq /= freq_factors[i];
        double theta = (double)pos * freq;
        cs[i] = (float)cos(theta);
        sn[i] = (float)sin(theta);
    }
    for (int64_t h = 0; h < n_heads; h++) {
        float *xh = x + h * hd;
        for (int64_t i = 0; i < half; i++) {
            int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float x0 = xh[a], x1 = xh[b];
            xh[a] = x0 * cs[i] - x1 * sn[i];
            xh[b] = x0 * sn[i] + x1 * cs[i];
        }
    }
}
