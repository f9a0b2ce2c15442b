/* family_llama.c — the forward pass of the llama, qwen3, qwen2 and phi3 families on the kernel table
 * (and the attention block qwen3moe shares).
 * Their differences are explicit flags (QK-norm, QKV bias, RoPE pair order) and bound values (phi3's
 * LongRoPE factors and sliding window), never hidden branches. */
#include "backward.h"
#include "model_bind.h"
#include "rows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-head RMSNorm (Qwen3's QK-norm) then RoPE on every head of the pass's rows (rows.c). */
static void norm_and_rope(const ember_pass *p, float *x, int64_t n_heads, int64_t hd, const float *norm,
                          const float *freqs) {
    const ember_model *m = p->host->model;
    ember_pass_norm_rope(p, x, n_heads, hd, norm, m->norm_eps, m->n_rot, m->rope_base, m->rope_neox, freqs);
}

const float *ember_llama_rope_factors(const ember_session *s) {
    const ember_model *m = s->model;
    return m->rope_freqs_long && s->n_ctx > m->rope_ctx_orig ? m->rope_freqs_long : m->rope_freqs;
}

ember_status ember_llama_attention(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                                   ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    const ember_layer *L = &m->layers[l];
    ember_workspace *w = &s->ws;
    ember_trace *tr = s->trace;
    const int64_t d = m->n_embd, n = p->n, q_dim = m->n_head * L->head_dim;
    const float *freqs = ember_llama_rope_factors(p->seq[0].s); /* a batch's sequences share one context length */
    ember_rows_rmsnorm(m, w->xn, w->x, L->attn_norm, n, d, m->norm_eps);
    ember_trace_step(tr, "attn_norm", l, EMBER_KOP_RMSNORM, NULL, w->xn, n, d);
    ember_matmul_multi(m->compute, 3, (const ember_matrix *const[]){&L->wq, &L->wk, &L->wv}, w->xn,
                       (float *const[]){w->q, w->k, w->v}, n);
    /* the projections' events include their biases (qwen2), as their hooks would (SPEC §4.6) */
    ember_add_bias(w->q, L->bq, n, q_dim);
    ember_add_bias(w->k, L->bk, n, L->kv_dim);
    ember_add_bias(w->v, L->bv, n, L->kv_dim);
    ember_trace_step(tr, "attn_q", l, EMBER_KOP_PRODUCT, &L->wq, w->q, n, q_dim);
    ember_trace_step(tr, "attn_k", l, EMBER_KOP_PRODUCT, &L->wk, w->k, n, L->kv_dim);
    ember_trace_step(tr, "attn_v", l, EMBER_KOP_PRODUCT, &L->wv, w->v, n, L->kv_dim);
    ember_tape_keep(s, l, EMBER_TAPE_Q, w->q, n, q_dim);
    ember_tape_keep(s, l, EMBER_TAPE_K, w->k, n, L->kv_dim);
    norm_and_rope(p, w->q, m->n_head, L->head_dim, L->q_norm, freqs);
    norm_and_rope(p, w->k, L->n_head_kv, L->head_dim, L->k_norm, freqs);
    ember_trace_step(tr, "q_rope", l, EMBER_KOP_ROPE, NULL, w->q, n, q_dim);
    ember_trace_step(tr, "k_rope", l, EMBER_KOP_ROPE, NULL, w->k, n, L->kv_dim);
    ember_pass_kv_store(p, l, w->k, w->v, L->kv_dim);
    ember_status st = ember_attention_stages(p, hooks, ctx, l, L, m->attn_scale, L->sliding ? m->window : 0, err);
    if (st) return st;
    ember_matmul(m->compute, &L->wo, w->att, w->attn, n);
    ember_trace_step(tr, "attn_output", l, EMBER_KOP_PRODUCT, &L->wo, w->attn, n, d);
    if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_ATTENTION, ctx, l, w->attn, n, d, err))) return st;
    ember_add_into(w->x, w->attn, n * d);
    ember_trace_step(tr, "attn_residual", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
    ember_tape_keep(s, l, EMBER_TAPE_X_MID, w->x, n, d);
    return EMBER_OK;
}

ember_status ember_llama_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const int64_t d = m->n_embd, n = p->n;
    ember_trace *tr = s->trace;
    ember_eval_ctx ctx = ember_forward_ctx(p);
    ember_status st = ember_pass_embed(p, 1.0f, err);
    if (st) return st;

    for (int64_t l = 0; l < m->n_layer; l++) {
        const ember_layer *L = &m->layers[l];
        if ((st = ember_pass_layer_start(p, hooks, &ctx, l, err))) return st;
        if ((st = ember_llama_attention(p, hooks, &ctx, l, err))) return st;

        /* SwiGLU MLP */
        ember_rows_rmsnorm(m, w->xn, w->x, L->ffn_norm, n, d, m->norm_eps);
        ember_trace_step(tr, "ffn_norm", l, EMBER_KOP_RMSNORM, NULL, w->xn, n, d);
        ember_matmul_multi(m->compute, 2, (const ember_matrix *const[]){&L->w_gate, &L->w_up}, w->xn,
                           (float *const[]){w->gate, w->up}, n);
        ember_trace_step(tr, "ffn_gate", l, EMBER_KOP_PRODUCT, &L->w_gate, w->gate, n, L->n_ff);
        ember_trace_step(tr, "ffn_up", l, EMBER_KOP_PRODUCT, &L->w_up, w->up, n, L->n_ff);
        ember_tape_keep(s, l, EMBER_TAPE_GATE, w->gate, n, L->n_ff);
        ember_tape_keep(s, l, EMBER_TAPE_UP, w->up, n, L->n_ff);
        ember_rows_silu_mul(m, w->gate, w->up, n, L->n_ff);
        ember_trace_step(tr, "ffn_act", l, EMBER_KOP_SILU_MUL, NULL, w->gate, n, L->n_ff);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_MLP_ACTIVATION, &ctx, l, w->gate, n, L->n_ff, err))) return st;
        ember_matmul(m->compute, &L->w_down, w->gate, w->mlp, n);
        ember_trace_step(tr, "ffn_down", l, EMBER_KOP_PRODUCT, &L->w_down, w->mlp, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_MLP, &ctx, l, w->mlp, n, d, err))) return st;
        ember_add_into(w->x, w->mlp, n * d);
        ember_trace_step(tr, "layer_output", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_LAYER, &ctx, l, w->x, n, d, err))) return st;
    }

    ember_tape_keep(s, -1, EMBER_TAPE_X, w->x, n, d);
    return ember_logits_head(p, hooks, &ctx, err);
}

ember_status ember_llama_hparams(binder *b) {
    ember_model *m = b->m;
    TRY(bind_common_hparams(b));
    TRY(hp_dim(b, "feed_forward_length", &m->n_ff, true, 0));
    TRY(hp_dim(b, "attention.head_count_kv", &m->n_head_kv, false, m->n_head));
    TRY(hp_int(b, "context_length", &m->n_ctx_train, false, 2048));
    if (m->n_layer < 1 || m->n_embd < 1 || m->n_head < 1 || m->n_head_kv < 1 || m->n_head % m->n_head_kv)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "inconsistent hyper-parameters: %lld layers, width %lld, %lld heads, %lld KV heads",
                         (long long)m->n_layer, (long long)m->n_embd, (long long)m->n_head, (long long)m->n_head_kv);
    TRY(hp_head_size(b, &m->head_dim));
    TRY(hp_rope_dims(b, m->head_dim, &m->n_rot));
    TRY(hp_float_positive(b, "rope.freq_base", &m->rope_base, 10000.0f));
    TRY(hp_float_positive(b, "attention.layer_norm_rms_epsilon", &m->norm_eps, 1e-5f));
    m->rope_neox = m->family->rope_neox;
    m->attn_scale = 1.0f / sqrtf((float)m->head_dim);
    return EMBER_OK;
}

ember_status ember_llama_bind_attention(binder *b, int64_t l, ember_layer *L) {
    const ember_model *m = b->m;
    const int64_t q_dim = m->n_head * L->head_dim, kv_dim = L->kv_dim;
    char n[128];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
    TRY(bind_vec(b, NAME("attn_norm.weight"), m->n_embd, true, &L->attn_norm));
    TRY(bind_mat(b, NAME("attn_q.weight"), m->n_embd, q_dim, true, &L->wq));
    TRY(bind_mat(b, NAME("attn_k.weight"), m->n_embd, kv_dim, true, &L->wk));
    TRY(bind_mat(b, NAME("attn_v.weight"), m->n_embd, kv_dim, true, &L->wv));
    TRY(bind_mat(b, NAME("attn_output.weight"), q_dim, m->n_embd, true, &L->wo));
    const bool qkv_bias = m->family->qkv_bias;
    TRY(bind_vec(b, NAME("attn_q.bias"), q_dim, qkv_bias, &L->bq));
    TRY(bind_vec(b, NAME("attn_k.bias"), kv_dim, qkv_bias, &L->bk));
    TRY(bind_vec(b, NAME("attn_v.bias"), kv_dim, qkv_bias, &L->bv));
    const bool qk_norm = m->family->qk_norm;
    TRY(bind_vec(b, NAME("attn_q_norm.weight"), L->head_dim, qk_norm, &L->q_norm));
    TRY(bind_vec(b, NAME("attn_k_norm.weight"), L->head_dim, qk_norm, &L->k_norm));
    TRY(bind_vec(b, NAME("ffn_norm.weight"), m->n_embd, true, &L->ffn_norm));
#undef NAME
    return EMBER_OK;
}

/* Hyper-parameters and tensors of llama / qwen3 / qwen2 (llama.cpp's names and layouts). */
ember_status ember_llama_bind(binder *b) {
    ember_model *m = b->m;
    TRY(ember_llama_hparams(b));
    TRY(bind_common(b));
    TRY(bind_vec(b, "rope_freqs.weight", m->n_rot / 2, false, &m->rope_freqs));

    int64_t q_dim, kv_dim;
    TRY(hp_mul(b, "query width (heads x head size)", m->n_head, m->head_dim, &q_dim));
    TRY(hp_mul(b, "key/value width (KV heads x head size)", m->n_head_kv, m->head_dim, &kv_dim));
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        char n[128];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
        bind_layer_geometry(L, l, m->n_ff, m->n_head_kv, m->head_dim);
        TRY(ember_llama_bind_attention(b, l, L));
        TRY(bind_mat(b, NAME("ffn_gate.weight"), m->n_embd, m->n_ff, true, &L->w_gate));
        TRY(bind_mat(b, NAME("ffn_up.weight"), m->n_embd, m->n_ff, true, &L->w_up));
        TRY(bind_mat(b, NAME("ffn_down.weight"), m->n_ff, m->n_embd, true, &L->w_down));
#undef NAME
    }
    return EMBER_OK;
}
