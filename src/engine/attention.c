/* attention.c — what every family shares: scaled dot-product attention over a layer's KV cache
 * (causal, optionally sliding-window), the residual adds, and the logits head with its hooks. */
#include "model.h"

#include <math.h>
#include <string.h>

/* The cache of a layer is head-major, (n_head_kv, n_ctx, head_dim): the keys of one KV head are
 * contiguous, so attention streams them in order instead of taking head_dim values from every
 * position's row of all heads. An f16 / bf16 cache is converted by the kernel set's row function
 * (SIMD on avx2/avx512, the same bits as the scalar conversion on every set). */
void ember_kv_store(ember_session *s, int64_t l, int64_t pos, int64_t n, const float *k, const float *v,
                    int64_t row_stride) {
    const ember_model *m = s->model;
    const ember_layer *L = &m->layers[l];
    const int64_t hd = L->head_dim;
    void (*to_half)(uint16_t *, const float *, int64_t) =
        m->kv_type == EMBER_TYPE_F16 ? m->ops->f32_to_f16_row : m->ops->f32_to_bf16_row;
    for (int64_t t = 0; t < n; t++)
        for (int64_t g = 0; g < L->n_head_kv; g++) {
            const float *kt = k + t * row_stride + g * hd, *vt = v + t * row_stride + g * hd;
            const int64_t at = (g * s->n_ctx + pos + t) * hd;
            if (m->kv_type == EMBER_TYPE_F32) {
                memcpy((float *)s->k_cache[l] + at, kt, (size_t)hd * sizeof(float));
                memcpy((float *)s->v_cache[l] + at, vt, (size_t)hd * sizeof(float));
                continue;
            }
            to_half((uint16_t *)s->k_cache[l] + at, kt, hd);
            to_half((uint16_t *)s->v_cache[l] + at, vt, hd);
        }
}

ember_attention_args ember_attention_layer_args(const ember_session *s, const ember_layer *L, float scale,
                                                int64_t window, const float *q, float *att, int64_t pos0, int64_t n) {
    const ember_model *m = s->model;
    return (ember_attention_args){.q = q,
                                  .k = s->k_cache[L->kv_source],
                                  .v = s->v_cache[L->kv_source],
                                  .kv_type = m->kv_type,
                                  .out = att,
                                  .scratch = s->ws.scores,
                                  .n_chunks_cap = (s->n_ctx + EMBER_ATTN_CHUNK - 1) / EMBER_ATTN_CHUNK,
                                  .n_head = m->n_head,
                                  .n_head_kv = L->n_head_kv,
                                  .hd = L->head_dim,
                                  .kv_stride = L->head_dim,
                                  .kv_head_stride = s->n_ctx * L->head_dim,
                                  .pos0 = pos0,
                                  .n = n,
                                  .window = window,
                                  .scale = scale,
                                  .softcap = m->attn_softcap};
}

/* The layer's shapes for the kernels' threaded attention (kernels/compute.c). */
void ember_attention(ember_session *s, const ember_layer *L, float scale, int64_t window, const float *q, float *att,
                     int64_t pos0, int64_t n) {
    const ember_attention_args a = ember_attention_layer_args(s, L, scale, window, q, att, pos0, n);
    ember_compute_attention(s->model->compute, &a);
}

/* The layer's attention with its attention_pattern and attention_heads stages (model.h). */
ember_status ember_attention_stages(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                                    const ember_layer *L, float scale, int64_t window, ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const int64_t pos0 = s->pos, n = p->n, q_dim = m->n_head * L->head_dim;
    ember_status st;
    ember_kop kop = EMBER_KOP_ATTENTION;
    if (!ember_hook_wants(hooks, EMBER_STAGE_ATTENTION_PATTERN)) {
        for (int64_t i = 0; i < p->n_seq; i++) { /* each sequence over its own cache, at its positions */
            const ember_pass_seq *q = &p->seq[i];
            ember_attention(q->s, L, scale, window, w->q + q->row * q_dim, w->att + q->row * q_dim, q->s->pos, q->n);
        }
    } else { /* a single-sequence pass (batches refuse the stage: ember_batch_eval) */
        /* The pattern of this layer only (ember_session_reserve_pattern sized it before the pass). */
        const ember_attention_args a = ember_attention_layer_args(s, L, scale, window, w->q, w->att, pos0, n);
        ember_compute_attention_probs(m->compute, &a, w->pattern);
        ember_view v = {.data = w->pattern, .rows = m->n_head * n, .cols = pos0 + n, .n_heads = m->n_head};
        if ((st = ember_hook_call_view(hooks, EMBER_STAGE_ATTENTION_PATTERN, ctx, l, &v, err))) return st;
        /* A pattern the hook only read is left to the fused chunked kernel, so observing it changes
         * no bit (the pattern path has its own order of operations). A written one is mixed as is. */
        if (v.written) {
            ember_compute_attention_mix(m->compute, &a, w->pattern);
            kop = EMBER_KOP_ATTENTION_PATTERN;
        } else {
            ember_attention(s, L, scale, window, w->q, w->att, pos0, n);
        }
    }
    ember_trace_step(s->trace, "attention", l, kop, NULL, w->att, n, m->n_head * L->head_dim);
    return ember_hook_call_heads(hooks, EMBER_STAGE_ATTENTION_HEADS, ctx, l, w->att, n, m->n_head * L->head_dim,
                                 m->n_head, err);
}

void ember_add_bias(float *y, const float *b, int64_t n, int64_t width) {
    if (!b) return;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < width; i++) y[t * width + i] += b[i];
}

void ember_add_into(float *x, const float *d, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] += d[i];
}

/* output_norm of row x into y: the family's final norm */
static void final_norm(const ember_model *m, float *y, const float *x) {
    if (m->family->final_norm == EMBER_NORM_LAYER)
        m->ops->layernorm(y, x, m->output_norm, m->output_norm_b, m->n_embd, m->norm_eps);
    else m->ops->rmsnorm(y, x, m->output_norm, m->n_embd, m->norm_eps);
}

/* Every row's logits into ws.all_logits when the session asks: the rows other than the sequences'
 * last through the head without hooks (their final norm is in ws.xn), the last ones copied from
 * ws.logits, so they are bit for bit what the default path (and after_logits) produced. */
static void all_rows_head(const ember_pass *p) {
    const ember_model *m = p->host->model;
    ember_workspace *w = &p->host->ws;
    const int64_t v = m->n_vocab, n = p->n;
    const int64_t rows = p->n_seq == 1 ? n - 1 : n; /* one sequence: its last row is the last */
    if (rows > 0) {
        ember_matmul(m->compute, &m->output, w->xn, w->all_logits, rows);
        if (m->softcap > 0.0f)
            for (int64_t i = 0; i < rows * v; i++) w->all_logits[i] = m->softcap * tanhf(w->all_logits[i] / m->softcap);
    }
    for (int64_t i = 0; i < p->n_seq; i++) {
        const int64_t last = p->seq[i].row + p->seq[i].n - 1;
        memcpy(w->all_logits + last * v, w->logits + i * v, (size_t)v * sizeof(float));
    }
}

/* The final norm of every sequence's last row into ws.last (one row each), and of the other rows
 * into ws.xn when the session asks for all logits. */
static void final_norms(const ember_pass *p) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const int64_t d = m->n_embd;
    for (int64_t i = 0, t = 0; s->all_logits && i < p->n_seq; i++)
        for (const int64_t last = p->seq[i].row + p->seq[i].n - 1; t < last + 1; t++)
            if (t != last) final_norm(m, w->xn + t * d, w->x + t * d);
    for (int64_t i = 0; i < p->n_seq; i++) final_norm(m, w->last + i * d, w->x + (p->seq[i].row + p->seq[i].n - 1) * d);
    const ember_kop norm_kop = m->family->final_norm == EMBER_NORM_LAYER ? EMBER_KOP_LAYERNORM : EMBER_KOP_RMSNORM;
    ember_trace_step(s->trace, "output_norm", -1, norm_kop, NULL, w->last, p->n_seq, d);
}

ember_status ember_logits_head(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, ember_error *err) {
    ember_session *s = p->host;
    if (s->head_off) return EMBER_OK; /* only the prompt's last slice needs logits (session.c) */
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const int64_t r = p->n_seq, v = m->n_vocab;
    final_norms(p);
    ember_status st = ember_hook_call(hooks, EMBER_STAGE_BEFORE_LOGITS, ctx, -1, w->last, r, m->n_embd, err);
    if (st != EMBER_OK) return st;
    ember_matmul(m->compute, &m->output, w->last, w->logits, r);
    ember_trace_step(s->trace, "output", -1, EMBER_KOP_PRODUCT, &m->output, w->logits, r, v);
    /* Every logit the head computes must be finite: the softcap would turn an infinity into +-cap
     * and a -inf would pass for a banned token (only after_logits hooks ban). This is the one pass
     * over the rows of the check (session.c, batch.c), unless an after_logits hook may write them. */
    for (int64_t i = 0; i < r && s->head_bad < 0; i++) /* each row as its own session asks */
        for (int64_t j = 0; !p->seq[i].s->allow_nonfinite && s->head_bad < 0 && j < v; j++)
            if (!isfinite(w->logits[i * v + j])) s->head_bad = i * v + j, s->head_bad_value = w->logits[i * v + j];
    if (m->softcap > 0.0f) { /* cap * tanh(logits / cap) */
        for (int64_t i = 0; i < r * v; i++) w->logits[i] = m->softcap * tanhf(w->logits[i] / m->softcap);
        ember_trace_step(s->trace, "softcap", -1, EMBER_KOP_ENGINE, NULL, w->logits, r, v);
    }
    st = ember_hook_call(hooks, EMBER_STAGE_AFTER_LOGITS, ctx, -1, w->logits, r, v, err);
    if (st == EMBER_OK && s->all_logits) all_rows_head(p);
    return st;
}
