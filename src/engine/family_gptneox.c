/* family_gptneox.c — GPT-NeoX (Pythia): LayerNorm with bias, fused QKV with bias, partial NeoX
 * RoPE, GELU MLP, and the parallel residual x + attn(ln1(x)) + mlp(ln2(x)) when the file says so.
 * Its hook boundaries follow SPEC §4.6 (projections include their biases); computes no other family. */
#include "backward.h"
#include "model_bind.h"
#include "rows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Splits the fused rows [q | k | v] of n tokens into q (n x q_dim), k and v (n x kv_dim each). */
static void split_qkv(const float *qkv, float *q, float *k, float *v, int64_t n, int64_t q_dim, int64_t kv_dim) {
    const int64_t row = q_dim + 2 * kv_dim;
    for (int64_t t = 0; t < n; t++) {
        memcpy(q + t * q_dim, qkv + t * row, (size_t)q_dim * sizeof(float));
        memcpy(k + t * kv_dim, qkv + t * row + q_dim, (size_t)kv_dim * sizeof(float));
        memcpy(v + t * kv_dim, qkv + t * row + q_dim + kv_dim, (size_t)kv_dim * sizeof(float));
    }
}

/* The attention block of layer l: LayerNorm, fused QKV, partial RoPE, attention, output
 * projection (with bias) into w->attn. */
static ember_status attention_block(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                                    ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    const ember_layer *L = &m->layers[l];
    ember_workspace *w = &s->ws;
    ember_trace *tr = s->trace;
    const int64_t d = m->n_embd, kv = L->kv_dim, n = p->n;
    ember_rows_layernorm(m, w->xn, w->x, L->attn_norm, L->attn_norm_b, n, d, m->norm_eps);
    ember_trace_step(tr, "attn_norm", l, EMBER_KOP_LAYERNORM, NULL, w->xn, n, d);
    ember_matmul(m->compute, &L->wqkv, w->xn, w->qkv, n);
    ember_add_bias(w->qkv, L->bqkv, n, d + 2 * kv);
    ember_trace_step(tr, "attn_qkv", l, EMBER_KOP_PRODUCT, &L->wqkv, w->qkv, n, d + 2 * kv);
    split_qkv(w->qkv, w->q, w->k, w->v, n, d, kv);
    ember_tape_keep(s, l, EMBER_TAPE_Q, w->q, n, d);
    ember_pass_norm_rope(p, w->q, m->n_head, L->head_dim, NULL, m->norm_eps, m->n_rot, m->rope_base, true, NULL);
    ember_pass_norm_rope(p, w->k, L->n_head_kv, L->head_dim, NULL, m->norm_eps, m->n_rot, m->rope_base, true, NULL);
    ember_trace_step(tr, "q_rope", l, EMBER_KOP_ROPE, NULL, w->q, n, d);
    ember_trace_step(tr, "k_rope", l, EMBER_KOP_ROPE, NULL, w->k, n, kv);
    ember_pass_kv_store(p, l, w->k, w->v, kv);
    ember_status st = ember_attention_stages(p, hooks, ctx, l, L, m->attn_scale, 0, err);
    if (st) return st;
    ember_matmul(m->compute, &L->wo, w->att, w->attn, n);
    ember_add_bias(w->attn, L->bo, n, d);
    ember_trace_step(tr, "attn_output", l, EMBER_KOP_PRODUCT, &L->wo, w->attn, n, d);
    return ember_hook_call(hooks, EMBER_STAGE_AFTER_ATTENTION, ctx, l, w->attn, n, d, err);
}

/* The MLP of layer l over w->x: LayerNorm, up (with bias), GELU, down (with bias) into w->mlp. */
static ember_status mlp_block(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                              ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    const int64_t n = p->n;
    const ember_layer *L = &m->layers[l];
    ember_workspace *w = &s->ws;
    ember_trace *tr = s->trace;
    const int64_t d = m->n_embd;
    ember_status st;
    ember_rows_layernorm(m, w->xn, w->x, L->ffn_norm, L->ffn_norm_b, n, d, m->norm_eps);
    ember_trace_step(tr, "ffn_norm", l, EMBER_KOP_LAYERNORM, NULL, w->xn, n, d);
    ember_matmul(m->compute, &L->w_up, w->xn, w->up, n);
    ember_add_bias(w->up, L->b_up, n, L->n_ff);
    ember_trace_step(tr, "ffn_up", l, EMBER_KOP_PRODUCT, &L->w_up, w->up, n, L->n_ff);
    ember_tape_keep(s, l, EMBER_TAPE_UP, w->up, n, L->n_ff);
    ember_rows_gelu_mul(m, w->up, NULL, n, L->n_ff);
    ember_trace_step(tr, "ffn_act", l, EMBER_KOP_GELU_MUL, NULL, w->up, n, L->n_ff);
    if ((st = ember_hook_call(hooks, EMBER_STAGE_MLP_ACTIVATION, ctx, l, w->up, n, L->n_ff, err))) return st;
    ember_matmul(m->compute, &L->w_down, w->up, w->mlp, n);
    ember_add_bias(w->mlp, L->b_down, n, d);
    ember_trace_step(tr, "ffn_down", l, EMBER_KOP_PRODUCT, &L->w_down, w->mlp, n, d);
    return ember_hook_call(hooks, EMBER_STAGE_AFTER_MLP, ctx, l, w->mlp, n, d, err);
}

ember_status ember_gptneox_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const int64_t d = m->n_embd, n = p->n;
    ember_trace *tr = s->trace;
    ember_eval_ctx ctx = ember_forward_ctx(p);
    ember_status st = ember_pass_embed(p, 1.0f, err);
    if (st) return st;

    for (int64_t l = 0; l < m->n_layer; l++) {
        if ((st = ember_pass_layer_start(p, hooks, &ctx, l, err))) return st;
        ember_tape_keep(s, l, EMBER_TAPE_X, w->x, n, d);
        if ((st = attention_block(p, hooks, &ctx, l, err))) return st;
        if (m->parallel_residual) {
            /* the MLP reads the layer's input too; then x + mlp + attn, in llama.cpp's order */
            if ((st = mlp_block(p, hooks, &ctx, l, err))) return st;
            ember_add_into(w->x, w->mlp, n * d);
            ember_add_into(w->x, w->attn, n * d);
        } else {
            ember_add_into(w->x, w->attn, n * d);
            ember_trace_step(tr, "attn_residual", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
            ember_tape_keep(s, l, EMBER_TAPE_X_MID, w->x, n, d);
            if ((st = mlp_block(p, hooks, &ctx, l, err))) return st;
            ember_add_into(w->x, w->mlp, n * d);
        }
        ember_trace_step(tr, "layer_output", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_LAYER, &ctx, l, w->x, n, d, err))) return st;
    }

    ember_tape_keep(s, -1, EMBER_TAPE_X, w->x, n, d);
    return ember_logits_head(p, hooks, &ctx, err);
}

/* The keys llama.cpp requires of a gptneox file (no default): the LayerNorm epsilon and the
 * residual's form. */
static ember_status required_keys(binder *b) {
    ember_model *m = b->m;
    char key[160];
    snprintf(key, sizeof key, "%s.attention.layer_norm_epsilon", b->arch);
    if (!ember_gguf_find(m->gguf, key)) return bind_fail(b, EMBER_ERR_FORMAT, "missing metadata key '%s'", key);
    TRY(hp_float_positive(b, "attention.layer_norm_epsilon", &m->norm_eps, 1e-5f));
    snprintf(key, sizeof key, "%s.use_parallel_residual", b->arch);
    if (!ember_gguf_find(m->gguf, key)) return bind_fail(b, EMBER_ERR_FORMAT, "missing metadata key '%s'", key);
    if (!ember_gguf_get_bool(m->gguf, key, &m->parallel_residual))
        return bind_fail(b, EMBER_ERR_FORMAT, "metadata key '%s' is not a boolean", key);
    return EMBER_OK;
}

/* Heads, head size and the rotated part of each head, checked before anything is allocated. */
static ember_status heads(binder *b) {
    ember_model *m = b->m;
    TRY(hp_dim(b, "feed_forward_length", &m->n_ff, true, 0));
    TRY(hp_dim(b, "attention.head_count_kv", &m->n_head_kv, false, m->n_head));
    TRY(hp_int(b, "context_length", &m->n_ctx_train, true, 0));
    if (m->n_layer < 1 || m->n_embd < 1 || m->n_head < 1 || m->n_head_kv < 1 || m->n_head % m->n_head_kv ||
        m->n_embd % m->n_head)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "inconsistent hyper-parameters: %lld layers, width %lld, %lld heads, %lld KV heads",
                         (long long)m->n_layer, (long long)m->n_embd, (long long)m->n_head, (long long)m->n_head_kv);
    m->head_dim = m->n_embd / m->n_head; /* the fused QKV's views are n_embd wide (llama.cpp's graph) */
    int64_t k_len, v_len;
    TRY(hp_dim(b, "attention.key_length", &k_len, false, m->head_dim));
    TRY(hp_dim(b, "attention.value_length", &v_len, false, m->head_dim));
    if (k_len != m->head_dim || v_len != m->head_dim || m->head_dim < 2)
        return bind_fail(b, EMBER_ERR_UNSUPPORTED, "head size %lld/%lld (key/value length) is not width / heads = %lld",
                         (long long)k_len, (long long)v_len, (long long)m->head_dim);
    TRY(hp_rope_dims(b, m->head_dim, &m->n_rot));
    TRY(hp_float_positive(b, "rope.freq_base", &m->rope_base, 10000.0f));
    m->rope_neox = true;
    m->attn_scale = 1.0f / sqrtf((float)m->head_dim);
    return required_keys(b);
}

/* Hyper-parameters and tensors of GPT-NeoX (llama.cpp's names: attn_qkv, ffn_up, ... with biases;
 * output.weight required, as llama.cpp requires it). */
ember_status ember_gptneox_bind(binder *b) {
    ember_model *m = b->m;
    TRY(bind_common_hparams(b));
    TRY(heads(b));
    TRY(bind_common(b));
    if (m->output.data == m->tok_embd.data) return bind_fail(b, EMBER_ERR_FORMAT, "missing tensor 'output.weight'");
    TRY(bind_vec(b, "output_norm.bias", m->n_embd, true, &m->output_norm_b));

    const int64_t d = m->n_embd;
    int64_t kv;
    TRY(hp_mul(b, "key/value width (KV heads x head size)", m->n_head_kv, m->head_dim, &kv));
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        char n[128];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
        bind_layer_geometry(L, l, m->n_ff, m->n_head_kv, m->head_dim);
        TRY(bind_vec(b, NAME("attn_norm.weight"), d, true, &L->attn_norm));
        TRY(bind_vec(b, NAME("attn_norm.bias"), d, true, &L->attn_norm_b));
        TRY(bind_mat(b, NAME("attn_qkv.weight"), d, d + 2 * kv, true, &L->wqkv));
        TRY(bind_vec(b, NAME("attn_qkv.bias"), d + 2 * kv, true, &L->bqkv));
        TRY(bind_mat(b, NAME("attn_output.weight"), d, d, true, &L->wo));
        TRY(bind_vec(b, NAME("attn_output.bias"), d, true, &L->bo));
        TRY(bind_vec(b, NAME("ffn_norm.weight"), d, true, &L->ffn_norm));
        TRY(bind_vec(b, NAME("ffn_norm.bias"), d, true, &L->ffn_norm_b));
        TRY(bind_mat(b, NAME("ffn_up.weight"), d, m->n_ff, true, &L->w_up));
        TRY(bind_vec(b, NAME("ffn_up.bias"), m->n_ff, true, &L->b_up));
        TRY(bind_mat(b, NAME("ffn_down.weight"), m->n_ff, d, true, &L->w_down));
        TRY(bind_vec(b, NAME("ffn_down.bias"), d, true, &L->b_down));
#undef NAME
    }
    return EMBER_OK;
}
