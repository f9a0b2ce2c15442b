/* attention.c — what every family shares: scaled dot-product attention over a layer's KV cache
 * (causal, optionally sliding-window), the residual adds, and the logits head with its hooks. */
#include "model.h"

#include <math.h>
#include <string.h>

typedef struct {
    const ember_model *m;
    const ember_layer *L;
    float scale;
    int64_t window, pos0, n;
    float *scores; /* (n_threads, pos0 + n) */
    const float *q, *kc, *vc;
    float *att;
} attention_job;

/* Items are (head, token) pairs in head-major order, so a thread's contiguous share is whole heads
 * over every token: equal causal work per thread. Each head runs ops->attn_head on its own. */
static void attention_items(void *arg, int64_t begin, int64_t end, int tid) {
    const attention_job *j = arg;
    const ember_model *m = j->m;
    const ember_layer *L = j->L;
    const int64_t hd = L->head_dim, group = m->n_head / L->n_head_kv;
    float *scores = j->scores + tid * (j->pos0 + j->n);
    for (int64_t it = begin; it < end; it++) {
        const int64_t h = it / j->n, t = it % j->n, p = j->pos0 + t;
        const int64_t first = j->window > 0 && p - j->window + 1 > 0 ? p - j->window + 1 : 0;
        const int64_t kvh = h / group; /* grouped-query attention: query heads share a KV head */
        m->ops->attn_head(j->q + (t * m->n_head + h) * hd, j->kc + first * L->kv_dim + kvh * hd,
                          j->vc + first * L->kv_dim + kvh * hd, L->kv_dim, p + 1 - first, hd, j->scale, scores,
                          j->att + (t * m->n_head + h) * hd);
    }
}

void ember_attention(const ember_model *m, const ember_layer *L, float scale, int64_t window, float *scores,
                     const float *q, const float *kc, const float *vc, float *att, int64_t pos0, int64_t n) {
    attention_job j = {.m = m, .L = L, .scale = scale, .window = window, .pos0 = pos0, .n = n, .scores = scores,
                       .q = q, .kc = kc, .vc = vc, .att = att};
    ember_pool_for(ember_compute_pool(m->compute), n * m->n_head, 1, attention_items, &j);
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
