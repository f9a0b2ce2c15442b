/* attention.c — what every family shares: scaled dot-product attention over a layer's KV cache
 * (causal, optionally sliding-window), the residual adds, and the logits head with its hooks. */
#include "model.h"

#include <math.h>
#include <string.h>

/* The layer's shapes for the kernels' threaded attention (kernels/compute.c splits the heads over
 * the model's threads). */
void ember_attention(const ember_model *m, const ember_layer *L, float scale, int64_t window, float *scores,
                     const float *q, const float *kc, const float *vc, float *att, int64_t pos0, int64_t n) {
    const ember_attention_args a = {.q = q, .k = kc, .v = vc, .out = att, .scores = scores, .scores_stride = pos0 + n,
                                    .n_head = m->n_head, .n_head_kv = L->n_head_kv, .hd = L->head_dim,
                                    .kv_stride = L->kv_dim, .pos0 = pos0, .n = n, .window = window, .scale = scale};
    ember_compute_attention(m->compute, &a);
}

void ember_add_bias(float *y, const float *b, int64_t n, int64_t width) {
    if (!b) return;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < width; i++) y[t * width + i] += b[i];
}

void ember_add_into(float *x, const float *d, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] += d[i];
}

ember_status ember_logits_head(ember_session *s, const ember_hooks *hooks, ember_eval_ctx *ctx, ember_error *err) {
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    ember_status st = ember_hook_call(hooks, EMBER_STAGE_BEFORE_LOGITS, ctx, -1, w->last, 1, m->n_embd, err);
    if (st != EMBER_OK) return st;
    ember_matmul(m->compute, &m->output, w->last, w->logits, 1);
    if (m->softcap > 0.0f) /* cap * tanh(logits / cap) */
        for (int64_t i = 0; i < m->n_vocab; i++) w->logits[i] = m->softcap * tanhf(w->logits[i] / m->softcap);
    return ember_hook_call(hooks, EMBER_STAGE_AFTER_LOGITS, ctx, -1, w->logits, 1, m->n_vocab, err);
}
