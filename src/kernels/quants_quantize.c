/* quants_quantize.c — the project's quantizers for the 4- to 6-bit GGUF blocks and Q8_K (quants.h).
 * They reproduce ggml's reference quantizers bit for bit (the bytes llama-quantize writes when no
 * importance matrix is given): the same f32 operations in the same order, built with
 * -ffp-contract=off. That is why some expressions keep an order a cleaner formula would change. */
#include "quants.h"

#include "kernels.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

/* Scales below this are treated as an all-zero group (ggml's GROUP_MAX_EPS). */
#define GROUP_EPS 1e-15f

/* Round to nearest, ties to even, the way ggml does it: adding 1.5 * 2^23 leaves the integer in
 * the low mantissa bits. Exact for |v| < 2^22; larger values (only reachable with absurd scales)
 * give the same wrapped result as ggml. */
static int round_nearest(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* C's float -> small-integer truncation for values known to lie in [-128, 255]; anything else (a
 * NaN from non-finite input) gives 0 instead of undefined behaviour. */
static int trunc_small(float v) { return v > -129.0f && v < 256.0f ? (int)v : 0; }

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }
static int clampi(int v, int lo, int hi) { return imax(lo, imin(hi, v)); }

static void store_u32_le(uint8_t out[4], uint32_t v) {
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(v >> (8 * i));
}

/* ---- 32-value blocks: the scale follows from the block's extremes, no search ---- */

/* Q4_0 / Q5_0: d = (the value of largest magnitude, with its sign) / -2^(bits-1), so that value
 * maps to the end of the range that has one more step (-8 of [-8, 7]). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

void ember_quantize_row_q4_0(const float *src, void *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK4_0; b++) {
        const float *x = src + b * EMBER_QK4_0;
        ember_block_q4_0 blk;
        const float d = signed_absmax(x, EMBER_QK4_0) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = ember_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            int q0 = imin(15, trunc_small(x[j] * id + 8.5f)); /* x*id in [-8, 8] -> [0, 15] */
            int q1 = imin(15, trunc_small(x[j + 16] * id + 8.5f));
            blk.qs[j] = (uint8_t)(q0 | q1 << 4);
        }
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}

void ember_quantize_row_q5_0(const float *src, void *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK5_0; b++) {
        const float *x = src + b * EMBER_QK5_0;
        ember_block_q5_0 blk;
        const float d = signed_absmax(x, EMBER_QK5_0) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = ember_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = imin(31, trunc_small(x[j] * id + 16.5f)); /* [-16, 16] -> [0, 31] */
            int q1 = imin(31, trunc_small(x[j + 16] * id + 16.5f));
            blk.qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_u32_le(blk.qh, qh);
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}

/* Q4_1 / Q5_1: m = min, d = (max - min) / (2^bits - 1). */
static void min_max(const float *x, int n, float *lo, float *hi) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    *lo = min;
    *hi = max;
}

void ember_quantize_row_q4_1(const float *src, void *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK4_1; b++) {
        const float *x = src + b * EMBER_QK4_1;
        ember_block_q4_1 blk;
        float min, max;
        min_max(x, EMBER_QK4_1, &min, &max);
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = ember_f32_to_f16(d);
        blk.m = ember_f32_to_f16(min);
        for (int j = 0; j < 16; j++) {
            int q0 = imin(15, trunc_small((x[j] - min) * id + 0.5f));
            int q1 = imin(15, trunc_small((x[j + 16] - min) * id + 0.5f));
            blk.qs[j] = (uint8_t)(q0 | q1 << 4);
        }
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}

void ember_quantize_row_q5_1(const float *src, void *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK5_1; b++) {
        const float *x = src + b * EMBER_QK5_1;
        ember_block_q5_1 blk;
        float min, max;
        min_max(x, EMBER_QK5_1, &min, &max);
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = ember_f32_to_f16(d);
        blk.m = ember_f32_to_f16(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            /* (x - min) * id in [0, 31]: no clamp, as in ggml */
            int q0 = trunc_small((x[j] - min) * id + 0.5f) & 0xFF;
            int q1 = trunc_small((x[j + 16] - min) * id + 0.5f) & 0xFF;
            blk.qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
            qh |= (uint32_t)((q0 >> 4) & 1) << j | (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        store_u32_le(blk.qh, qh);
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}

/* ---- the scale searches of the K-quants ---- */

/* Asymmetric group (Q2_K, Q4_K, Q5_K sub-blocks): levels L in [0, nmax] with x ~ scale * L - min_out
 * (min_out >= 0), minimising the weighted squared (or absolute, use_mad) error. Starts from the
 * range [min(x, 0), max(x)] split into nmax steps, then tries nstep + 1 other step counts
 * nmax + rmin + rdelta * is, each with the weighted least-squares scale and offset for its levels
 * (the offset kept <= 0), and keeps the best. L and the result are ggml's make_qkx2_quants'. */
static float search_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *min_out,
                              uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *min_out = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(round_nearest(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += w[i] * diff;
    }
    if (nstep < 1) {
        *min_out = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(round_nearest(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) { /* an offset above zero is not representable: refit the scale alone */
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += w[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *min_out = -min;
    return scale;
}

/* Symmetric group (Q6_K sub-blocks): levels in [-nmax, nmax-1], stored + nmax, weights x^2
 * (ggml's make_qx_quants with rmse_type 1 and no importance weights). The largest-magnitude value
 * maps to -nmax; then 18 nearby step counts nmax + 0.1 * is are tried, keeping the one whose
 * least-squares scale explains most of the weighted energy (sumlx^2 / suml2). */
static float search_scale_sym(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(round_nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(round_nearest(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(nmax + clampi(round_nearest(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric group for Q3_K (ggml's make_q3_quants with its refinement): levels [-nmax, nmax-1]
 * from the largest magnitude, then up to 5 passes that move single levels when that raises
 * sumlx^2 / suml2 (weights x^2). L comes back offset by + nmax. */
static float search_scale_q3(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(round_nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = clampi(round_nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Q2_K / Q3_K quant bytes: value h*128 + 32k + i goes to bits 2k of byte h*32 + i. */
static void pack_2bit(const uint8_t *L, uint8_t qs[64]) {
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 32; i++) {
            const uint8_t *l = L + 128 * h + i;
            qs[32 * h + i] = (uint8_t)(l[0] | l[32] << 2 | l[64] << 4 | l[96] << 6);
        }
}

/* ---- Q2_K ---- */

void ember_quantize_row_q2_k(const float *src, void *dst, int64_t n) {
    uint8_t L[EMBER_QK_K], Laux[16];
    float w[16], mins[16], scales[16];
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        const float *x = src + b * EMBER_QK_K;
        ember_block_q2_K blk;
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] = search_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        /* the 16 scales and mins are themselves quantized to 4 bits against their maxima */
        if (max_scale > 0) {
            float iscale = 15.f / max_scale;
            for (int j = 0; j < 16; j++) blk.scales[j] = (uint8_t)round_nearest(iscale * scales[j]);
            blk.d = ember_f32_to_f16(max_scale / 15.f);
        } else {
            memset(blk.scales, 0, sizeof blk.scales);
            blk.d = ember_f32_to_f16(0.f);
        }
        if (max_min > 0) {
            float iscale = 15.f / max_min;
            for (int j = 0; j < 16; j++)
                blk.scales[j] = (uint8_t)(blk.scales[j] | round_nearest(iscale * mins[j]) << 4);
            blk.dmin = ember_f32_to_f16(max_min / 15.f);
        } else {
            blk.dmin = ember_f32_to_f16(0.f);
        }
        /* requantize each value against the scales as stored */
        for (int j = 0; j < 16; j++) {
            const float d = ember_f16_to_f32(blk.d) * (blk.scales[j] & 0xF);
            if (!d) continue;
            const float dm = ember_f16_to_f32(blk.dmin) * (blk.scales[j] >> 4);
            for (int i = 0; i < 16; i++) L[16 * j + i] = (uint8_t)clampi(round_nearest((x[16 * j + i] + dm) / d), 0, 3);
        }
        pack_2bit(L, blk.qs);
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}

/* ---- Q3_K ---- */

void ember_quantize_row_q3_k(const float *src, void *dst, int64_t n) {
    int8_t L[EMBER_QK_K];
    float scales[16];
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        const float *x = src + b * EMBER_QK_K;
        ember_block_q3_K blk;
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = search_scale_q3(16, 4, x + 16 * j, L + 16 * j);
            float a = fabsf(scales[j]);
            if (a > amax) {
                amax = a;
                max_scale = scales[j];
            }
        }
        memset(blk.scales, 0, sizeof blk.scales);
        if (max_scale != 0.0f) {
            /* 6-bit signed scales (+32), packed as ember_dequantize_row_q3_k reads them */
            float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; j++) {
                int l = (int8_t)round_nearest(iscale * scales[j]);
                l = clampi(l, -32, 31) + 32;
                if (j < 8) blk.scales[j] = (uint8_t)(l & 0xF);
                else blk.scales[j - 8] = (uint8_t)(blk.scales[j - 8] | (l & 0xF) << 4);
                blk.scales[8 + j % 4] = (uint8_t)(blk.scales[8 + j % 4] | (l >> 4) << (2 * (j / 4)));
            }
            blk.d = ember_f32_to_f16(1 / iscale);
        } else {
            blk.d = ember_f32_to_f16(0.f);
        }
        for (int j = 0; j < 16; j++) {
            int lo = j < 8 ? blk.scales[j] & 0xF : blk.scales[j - 8] >> 4;
            int sc = (lo | ((blk.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
            float d = ember_f16_to_f32(blk.d) * sc;
            if (!d) continue;
            for (int i = 0; i < 16; i++) L[16 * j + i] = (int8_t)(clampi(round_nearest(x[16 * j + i] / d), -4, 3) + 4);
        }
        /* third bit of value v into bit v/32 of hmask[v%32]; the low two bits stay in L */
        uint8_t low[EMBER_QK_K];
        memset(blk.hmask, 0, sizeof blk.hmask);
        for (int v = 0; v < EMBER_QK_K; v++) {
            int l = L[v];
            if (l > 3) {
                blk.hmask[v % 32] = (uint8_t)(blk.hmask[v % 32] | 1u << (v / 32));
                l -= 4;
            }
            low[v] = (uint8_t)l;
        }
        pack_2bit(low, blk.qs);
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}

/* ---- Q4_K / Q5_K: 8 sub-blocks of 32 with a 6-bit scale and min each ---- */

/* Packs the 6-bit scales and mins as ember_dequantize_row_q4_k reads them. */
static void pack_k4_scales(const uint8_t ls[8], const uint8_t lm[8], uint8_t s[12]) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (uint8_t)((ls[j] & 0xF) | (lm[j] & 0xF) << 4);
            s[j - 4] = (uint8_t)(s[j - 4] | (ls[j] >> 4) << 6);
            s[j] = (uint8_t)(s[j] | (lm[j] >> 4) << 6);
        }
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): the per-sub-block search, the 6-bit quantization
 * of scales and mins, then every value requantized against the scales as stored. L: 256 levels. */
static void quantize_k4_block(const float *x, int nmax, float rmin, float rdelta, int nstep, uint16_t *d_out,
                              uint16_t *dmin_out, uint8_t s[12], uint8_t L[EMBER_QK_K]) {
    float w[32], mins[8], scales[8];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        /* weights: the sub-block's rms plus each value's magnitude */
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = search_scale_min(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        /* ggml stores the rounded value in a uint8_t before clamping to 63 */
        ls[j] = (uint8_t)imin(63, (uint8_t)round_nearest(inv_scale * scales[j]));
        lm[j] = (uint8_t)imin(63, (uint8_t)round_nearest(inv_min * mins[j]));
    }
    pack_k4_scales(ls, lm, s);
    *d_out = ember_f32_to_f16(max_scale / 63.f);
    *dmin_out = ember_f32_to_f16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        const float d = ember_f16_to_f32(*d_out) * ls[j];
        if (!d) continue;
        const float dm = ember_f16_to_f32(*dmin_out) * lm[j];
        for (int i = 0; i < 32; i++) L[32 * j + i] = (uint8_t)clampi(round_nearest((x[32 * j + i] + dm) / d), 0, nmax);
    }
}

void ember_quantize_row_q4_k(const float *src, void *dst, int64_t n) {
    uint8_t L[EMBER_QK_K];
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        ember_block_q4_K blk;
        quantize_k4_block(src + b * EMBER_QK_K, 15, -1.f, 0.1f, 20, &blk.d, &blk.dmin, blk.scales, L);
        /* chunk c of 64 values: low nibbles values 64c..64c+31, high nibbles the next 32 */
        for (int c = 0; c < 4; c++)
            for (int i = 0; i < 32; i++) blk.qs[32 * c + i] = (uint8_t)(L[64 * c + i] | L[64 * c + 32 + i] << 4);
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}

void ember_quantize_row_q5_k(const float *src, void *dst, int64_t n) {
    uint8_t L[EMBER_QK_K];
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        ember_block_q5_K blk;
        quantize_k4_block(src + b * EMBER_QK_K, 31, -0.5f, 0.1f, 15, &blk.d, &blk.dmin, blk.scales, L);
        memset(blk.qh, 0, sizeof blk.qh);
        for (int c = 0; c < 4; c++)
            for (int i = 0; i < 32; i++) {
                int l1 = L[64 * c + i], l2 = L[64 * c + 32 + i];
                /* fifth bits: value 32j + i -> bit j of qh[i] (j = 2c, 2c + 1) */
                blk.qh[i] = (uint8_t)(blk.qh[i] | (l1 >> 4) << (2 * c) | (l2 >> 4) << (2 * c + 1));
                blk.qs[32 * c + i] = (uint8_t)((l1 & 0xF) | (l2 & 0xF) << 4);
            }
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}

/* ---- Q6_K: 16 sub-blocks of 16 with an int8 scale each ---- */

void ember_quantize_row_q6_k(const float *src, void *dst, int64_t n) {
    int8_t L[EMBER_QK_K];
    float scales[16];
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        const float *x = src + b * EMBER_QK_K;
        ember_block_q6_K blk;
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = search_scale_sym(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        if (max_abs_scale < GROUP_EPS) { /* an all-zero super-block */
            memset(&blk, 0, sizeof blk);
            memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
            continue;
        }
        float iscale = -128.f / max_scale;
        blk.d = ember_f32_to_f16(1 / iscale);
        for (int j = 0; j < 16; j++) blk.scales[j] = (int8_t)imin(127, round_nearest(iscale * scales[j]));
        for (int j = 0; j < 16; j++) {
            float d = ember_f16_to_f32(blk.d) * blk.scales[j];
            if (!d) continue;
            for (int i = 0; i < 16; i++)
                L[16 * j + i] = (int8_t)(clampi(round_nearest(x[16 * j + i] / d), -32, 31) + 32);
        }
        /* levels in [0, 63]: layout as ember_dequantize_row_q6_k reads it */
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 32; i++) {
                const int8_t *l = L + 128 * h + i;
                blk.ql[64 * h + i] = (uint8_t)((l[0] & 0xF) | (l[64] & 0xF) << 4);
                blk.ql[64 * h + 32 + i] = (uint8_t)((l[32] & 0xF) | (l[96] & 0xF) << 4);
                blk.qh[32 * h + i] = (uint8_t)((l[0] >> 4) | (l[32] >> 4) << 2 | (l[64] >> 4) << 4 | (l[96] >> 4) << 6);
            }
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}

/* ---- Q8_K: the activations of the K-quant products ---- */

/* The largest-magnitude value maps to -127 (so q stays in [-127, 127]), d = 1 / iscale in f32. */
void ember_quantize_row_q8_k(const float *src, void *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        const float *x = src + b * EMBER_QK_K;
        ember_block_q8_K blk;
        memset(&blk, 0, sizeof blk);
        float max = 0, amax = 0;
        for (int j = 0; j < EMBER_QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        if (amax != 0.0f) {
            const float iscale = -127.f / max;
            for (int j = 0; j < EMBER_QK_K; j++) blk.qs[j] = (int8_t)imin(127, round_nearest(iscale * x[j]));
            for (int g = 0; g < EMBER_QK_K / 16; g++) {
                int sum = 0;
                for (int i = 0; i < 16; i++) sum += blk.qs[16 * g + i];
                blk.bsums[g] = (int16_t)sum;
            }
            blk.d = 1 / iscale;
        }
        memcpy((uint8_t *)dst + b * sizeof blk, &blk, sizeof blk);
    }
}
