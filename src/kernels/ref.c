/* ref.c — the reference kernels: the clearest scalar code for every op, f32 accumulation.
 * This is the oracle the fast kernels are tested against; keep it obvious, not fast. */
#include "kernels.h"
#include "quants.h"

#include <math.h>
#include <string.h>

float ember_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = (float)man * 0x1p-24f;
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t ember_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
    if (ax < 0x38800000u) {                                  /* subnormal or zero in f16: round(|f| * 2^24) */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 0x1p24f));
    }
    uint32_t man = ax & 0x7fffff, exp = (ax >> 23) - 112;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* nearest even; carry may bump exp */
    return (uint16_t)(sign | h);
}

float ember_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t ember_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* keep NaN a NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

void ember_f32_to_f16_row(uint16_t *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ember_f32_to_f16(x[i]);
}

void ember_f32_to_bf16_row(uint16_t *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ember_f32_to_bf16(x[i]);
}

void ember_matrix_get_row(const ember_matrix *m, int64_t r, float *out) {
    ember_type_traits_get(m->type)->to_float((const uint8_t *)m->data + (size_t)r * m->row_bytes, out, m->n_in);
}

static float ref_dot_f32(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Values of a weight row dequantized at a time (a multiple of every block size). */
#define REF_CHUNK 256

/* Rows [o0, o1) of y = x W^T for any type with a to_float: the weights are read as f32 exactly
 * (a chunk of a row at a time, shared by the tokens) and multiplied with the f32 activations as
 * they are; each output is s += w_i * x_i in increasing i. */
void ember_rows_reference(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,
                          int64_t n_tok, int64_t o0, int64_t o1) {
    (void)xa;
    (void)xa_stride;
    const ember_type_traits *tr = ember_type_traits_get(w->type);
    float wv[REF_CHUNK], s[EMBER_MATMUL_MAX_TOKENS];
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
        for (int64_t t0 = 0; t0 < n_tok; t0 += EMBER_MATMUL_MAX_TOKENS) {
            const int64_t nt = n_tok - t0 < EMBER_MATMUL_MAX_TOKENS ? n_tok - t0 : EMBER_MATMUL_MAX_TOKENS;
            for (int64_t t = 0; t < nt; t++) s[t] = 0.0f;
            for (int64_t i0 = 0; i0 < w->n_in; i0 += REF_CHUNK) {
                const int64_t len = w->n_in - i0 < REF_CHUNK ? w->n_in - i0 : REF_CHUNK;
                tr->to_float(row + (size_t)(i0 / tr->block_size) * tr->block_bytes, wv, len);
                for (int64_t t = 0; t < nt; t++) {
                    const float *xt = x + (t0 + t) * w->n_in + i0;
                    float acc = s[t];
                    for (int64_t i = 0; i < len; i++) acc += wv[i] * xt[i];
                    s[t] = acc;
                }
            }
            for (int64_t t = 0; t < nt; t++) y[(t0 + t) * w->n_out + o] = s[t];
        }
    }
}

/* Columns [i0, i1) of dx = g W in the order kernels.h gives: per chunk of EMBER_MATMUL_T_CHUNK
 * rows a partial from +0 (product, then add, row by row), folded into dx chunk by chunk. The
 * weights are dequantized a row piece at a time and shared by up to EMBER_MATMUL_MAX_TOKENS tokens. */
void ember_rows_t_reference(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, int64_t i0, int64_t i1) {
    const ember_type_traits *tr = ember_type_traits_get(w->type);
    float wv[REF_CHUNK], part[EMBER_MATMUL_MAX_TOKENS][REF_CHUNK];
    for (int64_t t0 = 0; t0 < n_tok; t0 += EMBER_MATMUL_MAX_TOKENS) {
        const int64_t nt = n_tok - t0 < EMBER_MATMUL_MAX_TOKENS ? n_tok - t0 : EMBER_MATMUL_MAX_TOKENS;
        for (int64_t c0 = i0; c0 < i1; c0 += REF_CHUNK) {
            const int64_t len = i1 - c0 < REF_CHUNK ? i1 - c0 : REF_CHUNK;
            for (int64_t o0 = 0; o0 < w->n_out; o0 += EMBER_MATMUL_T_CHUNK) {
                const int64_t o1 = w->n_out - o0 < EMBER_MATMUL_T_CHUNK ? w->n_out : o0 + EMBER_MATMUL_T_CHUNK;
                for (int64_t t = 0; t < nt; t++)
                    for (int64_t i = 0; i < len; i++) part[t][i] = 0.0f;
                for (int64_t o = o0; o < o1; o++) {
                    const uint8_t *row = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
                    tr->to_float(row + (size_t)(c0 / tr->block_size) * tr->block_bytes, wv, len);
                    for (int64_t t = 0; t < nt; t++) {
                        const float gt = g[(t0 + t) * w->n_out + o];
                        for (int64_t i = 0; i < len; i++) part[t][i] += gt * wv[i];
                    }
                }
                for (int64_t t = 0; t < nt; t++) {
                    float *d = dx + (t0 + t) * w->n_in + c0;
                    for (int64_t i = 0; i < len; i++) d[i] = o0 == 0 ? part[t][i] : d[i] + part[t][i];
                }
            }
        }
    }
}

/* Scaled dot-product attention, as written: the partial of each row over its visible keys of the
 * chunk: scores, their maximum, exp(s - max), the sum of those, and the values weighted by them, all
 * in key order. */
static void ref_attn_chunk(const ember_attn_rows *a, int64_t k0, int64_t k1, float *scores, float *m, float *l,
                           float *acc) {
    const size_t stride = (size_t)a->kv_stride * (a->kv_type == EMBER_TYPE_F32 ? 4 : 2);
    for (int r = 0; r < a->n_rows; r++) {
        const int64_t lo = a->lo[r] > k0 ? a->lo[r] : k0, hi = a->hi[r] < k1 ? a->hi[r] : k1;
        if (lo >= hi) {
            m[r] = -INFINITY;
            continue;
        }
        float *s = scores + (size_t)r * EMBER_ATTN_CHUNK, *out = acc + (size_t)r * a->hd;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t j = lo; j < hi; j++) {
            const uint8_t *kj = (const uint8_t *)a->k + (size_t)j * stride;
            float dot = 0.0f;
            for (int64_t i = 0; i < a->hd; i++) dot += a->q[r][i] * ember_kv_element(a->kv_type, kj, i);
            s[j - lo] = dot * a->scale;
        }
        if (a->softcap > 0.0f) ember_attn_softcap(s, hi - lo, a->softcap);
        for (int64_t j = lo; j < hi; j++)
            if (s[j - lo] > mx) mx = s[j - lo];
        memset(out, 0, (size_t)a->hd * sizeof(float));
        for (int64_t j = lo; j < hi; j++) {
            const uint8_t *vj = (const uint8_t *)a->v + (size_t)j * stride;
            const float e = expf(s[j - lo] - mx);
            sum += e;
            for (int64_t d = 0; d < a->hd; d++) out[d] += e * ember_kv_element(a->kv_type, vj, d);
        }
        m[r] = ember_attn_partial_max(mx, sum);
        l[r] = sum;
    }
}

void ember_attn_softcap(float *s, int64_t n, float cap) {
    for (int64_t i = 0; i < n; i++) s[i] = cap * tanhf(s[i] / cap);
}

static void ref_silu_mul(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = ember_silu(g[i]) * u[i];
}

static void ref_gelu_mul(float *g, const float *u, int64_t n) {
    if (!u) {
        for (int64_t i = 0; i < n; i++) g[i] = ember_gelu_tanh(g[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++) g[i] = ember_gelu_tanh(g[i]) * u[i];
}

void ember_gelu_mul_ref(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = ember_gelu_tanh(g[i]) * u[i];
}

static void ref_rope_heads(float *x, int64_t n_heads, int64_t hd, int64_t n_rot, int64_t pos, float base, bool neox,
                           const float *freq_factors) {
    for (int64_t h = 0; h < n_heads; h++) ember_rope(x + h * hd, n_rot, pos, base, neox, freq_factors);
}

const ember_type_kernels ember_product_reference = {.rows = ember_rows_reference};

/* The products and the transposed products: no table of its own (mm_by_traits), every type whose
 * traits have a to_float. */
const ember_kernel_ops ember_kernels_reference = {
    .name = "reference",
    .mm_by_traits = true,
    .dot_f32 = ref_dot_f32,
    .attn_chunk = ref_attn_chunk,
    .rmsnorm = ember_rmsnorm,
    .layernorm = ember_layernorm,
    .silu_mul = ref_silu_mul,
    .gelu_mul = ref_gelu_mul,
    .gelu_mul_ref = ember_gelu_mul_ref,
    .rope_heads = ref_rope_heads,
    .get_row = ember_matrix_get_row,
    .f32_to_f16_row = ember_f32_to_f16_row,
    .f32_to_bf16_row = ember_f32_to_bf16_row,
};

/* ---- Q8_0 activation quantization and the quantized dot: the oracle for the SIMD sets ---- */

void ember_quantize_row_q8_0(const float *x, ember_block_q8_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK8_0; b++) {
        const float *xb = x + b * EMBER_QK8_0;
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < EMBER_QK8_0; j++) {
            float a = fabsf(xb[j]);
            if (!(a < INFINITY)) finite = false; /* NaN or infinity */
            else if (a > amax) amax = a;
        }
        ember_block_q8_0 *yb = &y[b];
        if (!finite) {
            yb->d = 0x7e00; /* f16 NaN: the products come out NaN */
            memset(yb->qs, 0, sizeof yb->qs);
            continue;
        }
        yb->d = ember_f32_to_f16(amax / 127.0f);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < EMBER_QK8_0; j++) {
            float q = nearbyintf(xb[j] * id); /* round half to even; |q| <= 127 since |x| <= amax */
            yb->qs[j] = (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
        }
    }
}

float ember_dot_q8_0_q8_0(const ember_block_q8_0 *w, const ember_block_q8_0 *x, int64_t n) {
    float s = 0.0f;
    for (int64_t b = 0; b < n / EMBER_QK8_0; b++) {
        int32_t isum = 0; /* exact: |sum| <= 32 * 128 * 127 */
        for (int j = 0; j < EMBER_QK8_0; j++) isum += (int32_t)w[b].qs[j] * (int32_t)x[b].qs[j];
        s += (ember_f16_to_f32(w[b].d) * ember_f16_to_f32(x[b].d)) * (float)isum;
    }
    return s;
}

void ember_quantize_row_q8_1(const float *x, ember_block_q8_1 *y, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK8_1; b++) {
        const float *xb = x + b * EMBER_QK8_1;
        ember_block_q8_0 q; /* the Q8_0 quantization of the block: same d and quants */
        ember_quantize_row_q8_0(xb, &q, EMBER_QK8_1);
        y[b].d = q.d;
        memcpy(y[b].qs, q.qs, sizeof q.qs);
        if (q.d == 0x7e00) { /* NaN or infinity in the block */
            y[b].s = 0x7e00;
            continue;
        }
        float amax = 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < EMBER_QK8_1; j++) {
            if (fabsf(xb[j]) > amax) amax = fabsf(xb[j]);
            sum += q.qs[j];
        }
        y[b].s = ember_f32_to_f16((amax / 127.0f) * (float)sum); /* d unrounded, as llama.cpp's x86 code */
    }
}

void ember_quantize_act_q8_k(const float *x, void *y, int64_t n) {
    ember_quantize_row_q8_k(x, y, n);
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        bool finite = true;
        for (int j = 0; j < EMBER_QK_K; j++) finite &= fabsf(x[b * EMBER_QK_K + j]) < INFINITY;
        if (finite) continue;
        ember_block_q8_K blk;
        memset(&blk, 0, sizeof blk);
        blk.d = NAN; /* the products come out NaN, as with Q8_0 */
        memcpy((uint8_t *)y + (size_t)b * sizeof blk, &blk, sizeof blk);
    }
}

float ember_rmsnorm_scale(const float *x, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)n + eps);
}

void ember_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
    float scale = ember_rmsnorm_scale(x, n, eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

float ember_layernorm_scale(const float *x, int64_t n, float eps, float *mean_out) {
    float mean = 0.0f;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    float var = 0.0f;
    for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)n;
    *mean_out = mean;
    return 1.0f / sqrtf(var + eps);
}

void ember_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps) {
    float mean;
    float scale = ember_layernorm_scale(x, n, eps, &mean);
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * scale * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
}

void ember_rope(float *x, int64_t n_rot, int64_t pos, float base, bool neox, const float *freq_factors) {
    int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; i++) {
        /* theta_i = pos * base^(-2i/n_rot), divided by the pair's factor when given */
        double freq = pow((double)base, -2.0 * (double)i / (double)n_rot);
        if (freq_factors) freq /= freq_factors[i];
        double theta = (double)pos * freq;
        float c = (float)cos(theta), s = (float)sin(theta);
        int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

void ember_softmax(float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    for (int64_t i = 0; i < n; i++) x[i] /= s;
}

float ember_silu(float x) { return x / (1.0f + expf(-x)); }

float ember_gelu_tanh(float x) {
    const float k = 0.79788456080286535588f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
