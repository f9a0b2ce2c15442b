/* attention.c — scaled dot-product attention over a session's KV cache, and the residual adds
 * every family shares. Causal always; an optional sliding window for Gemma's local layers. */
#include "model.h"

#include <string.h>

void ember_attention(const ember_model *m, const ember_layer *L, float scale, int64_t window, float *scores,
                     const float *q, const float *kc, const float *vc, float *att, int64_t pos0, int64_t n) {
    const int64_t hd = L->head_dim, group = m->n_head / L->n_head_kv;
    for (int64_t t = 0; t < n; t++) {
        const int64_t p = pos0 + t;
        const int64_t first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        const int64_t n_keys = p + 1 - first;
        for (int64_t h = 0; h < m->n_head; h++) {
            const float *qh = q + (t * m->n_head + h) * hd;
            const int64_t kvh = h / group; /* grouped-query attention: query heads share a KV head */
            for (int64_t j = 0; j < n_keys; j++)
                scores[j] = m->ops->dot_f32(qh, kc + (first + j) * L->kv_dim + kvh * hd, hd) * scale;
            ember_softmax(scores, n_keys);
            float *out = att + (t * m->n_head + h) * hd;
            memset(out, 0, (size_t)hd * sizeof(float));
            for (int64_t j = 0; j < n_keys; j++) {
                const float *vj = vc + (first + j) * L->kv_dim + kvh * hd;
                for (int64_t d = 0; d < hd; d++) out[d] += scores[j] * vj[d];
            }
        }
    }
}

void ember_add_bias(float *y, const float *b, int64_t n, int64_t width) {
    if (!b) return;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < width; i++) y[t * width + i] += b[i];
}

void ember_add_into(float *x, const float *d, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] += d[i];
}
