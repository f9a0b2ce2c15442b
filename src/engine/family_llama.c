/* family_llama.c — the forward pass of the llama, qwen3 and qwen2 families on the kernel table.
 * Their differences are explicit flags (QK-norm, QKV bias, RoPE pair order), never hidden branches. */
#include "model.h"

#include <math.h>
#include <string.h>

/* Causal attention of n new tokens (positions pos0..pos0+n-1) over the cache of one layer.
 * q: (n, n_head*hd), kc/vc: (n_ctx, kv_dim), att: (n, n_head*hd) */
static void attention(const ember_model *m, const ember_layer *L, float *scores, const float *q,
                      const float *kc, const float *vc, float *att, int64_t pos0, int64_t n) {
    const int64_t hd = L->head_dim, group = m->n_head / L->n_head_kv;
    for (int64_t t = 0; t < n; t++) {
        int64_t n_keys = pos0 + t + 1;
        for (int64_t h = 0; h < m->n_head; h++) {
            const float *qh = q + t * m->n_head * hd + h * hd;
            int64_t kvh = h / group; /* grouped-query attention: query heads share a KV head */
            for (int64_t j = 0; j < n_keys; j++)
                scores[j] = m->ops->dot_f32(qh, kc + j * L->kv_dim + kvh * hd, hd) * m->attn_scale;
            ember_softmax(scores, n_keys);
            float *out = att + t * m->n_head * hd + h * hd;
            memset(out, 0, (size_t)hd * sizeof(float));
            for (int64_t j = 0; j < n_keys; j++) {
                const float *vj = vc + j * L->kv_dim + kvh * hd;
                for (int64_t d = 0; d < hd; d++) out[d] += scores[j] * vj[d];
            }
        }
    }
}

static void add_bias(float *y, const float *b, int64_t n, int64_t width) {
    if (!b) return;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < width; i++) y[t * width + i] += b[i];
}

static void add_into(float *x, const float *d, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] += d[i];
}

/* Per-head RMSNorm (Qwen3's QK-norm) then RoPE on every head of n rows. */
static void norm_and_rope(const ember_model *m, float *x, int64_t n, int64_t n_heads, int64_t hd,
                          const float *norm, int64_t pos0) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < n_heads; h++) {
            float *xh = x + (t * n_heads + h) * hd;
            if (norm) ember_rmsnorm(xh, xh, norm, hd, m->norm_eps);
            ember_rope(xh, m->n_rot, pos0 + t, m->rope_base, m->rope_neox, m->rope_freqs);
        }
}

ember_status ember_llama_forward(ember_session *s, const int32_t *ids, int64_t n, const ember_hooks *hooks,
                                 ember_error *err) {
    const ember_model *m = s->model;
    const ember_kernel_ops *ops = m->ops;
    ember_workspace *w = &s->ws;
    const int64_t d = m->n_embd, pos0 = s->pos;
    ember_status st;
    ember_eval_ctx ctx = {.phase = s->phase, .start_position = pos0, .input_token_count = n,
                          .sequence_length = pos0 + n, .layer_index = -1};

    for (int64_t t = 0; t < n; t++) ember_matrix_row_f32(&m->tok_embd, ids[t], w->x + t * d);

    for (int64_t l = 0; l < m->n_layer; l++) {
        const ember_layer *L = &m->layers[l];
        const int64_t q_dim = m->n_head * L->head_dim;
        if ((st = ember_hook_call(hooks, EMBER_STAGE_BEFORE_LAYER, &ctx, l, w->x, n, d, err))) return st;

        /* attention block */
        for (int64_t t = 0; t < n; t++) ember_rmsnorm(w->xn + t * d, w->x + t * d, L->attn_norm, d, m->norm_eps);
        ops->matmul(&L->wq, w->xn, w->q, n);
        ops->matmul(&L->wk, w->xn, w->k, n);
        ops->matmul(&L->wv, w->xn, w->v, n);
        add_bias(w->q, L->bq, n, q_dim);
        add_bias(w->k, L->bk, n, L->kv_dim);
        add_bias(w->v, L->bv, n, L->kv_dim);
        norm_and_rope(m, w->q, n, m->n_head, L->head_dim, L->q_norm, pos0);
        norm_and_rope(m, w->k, n, L->n_head_kv, L->head_dim, L->k_norm, pos0);
        float *kc = s->k_cache[l], *vc = s->v_cache[l];
        memcpy(kc + pos0 * L->kv_dim, w->k, (size_t)(n * L->kv_dim) * sizeof(float));
        memcpy(vc + pos0 * L->kv_dim, w->v, (size_t)(n * L->kv_dim) * sizeof(float));
        attention(m, L, w->scores, w->q, kc, vc, w->att, pos0, n);
        ops->matmul(&L->wo, w->att, w->attn, n);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_ATTENTION, &ctx, l, w->attn, n, d, err))) return st;
        add_into(w->x, w->attn, n * d);

        /* SwiGLU MLP */
        for (int64_t t = 0; t < n; t++) ember_rmsnorm(w->xn + t * d, w->x + t * d, L->ffn_norm, d, m->norm_eps);
        ops->matmul(&L->w_gate, w->xn, w->gate, n);
        ops->matmul(&L->w_up, w->xn, w->up, n);
        for (int64_t i = 0; i < n * L->n_ff; i++) w->gate[i] = ember_silu(w->gate[i]) * w->up[i];
        ops->matmul(&L->w_down, w->gate, w->mlp, n);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_MLP, &ctx, l, w->mlp, n, d, err))) return st;
        add_into(w->x, w->mlp, n * d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_LAYER, &ctx, l, w->x, n, d, err))) return st;
    }

    /* Only the last position's logits are produced. */
    ember_rmsnorm(w->last, w->x + (n - 1) * d, m->output_norm, d, m->norm_eps);
    if ((st = ember_hook_call(hooks, EMBER_STAGE_BEFORE_LOGITS, &ctx, -1, w->last, 1, d, err))) return st;
    ops->matmul(&m->output, w->last, w->logits, 1);
    if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_LOGITS, &ctx, -1, w->logits, 1, m->n_vocab, err))) return st;
    return EMBER_OK;
}
