/* family_gpt2.c — GPT-2: learned positions, LayerNorm with bias, fused QKV with bias, GELU MLP,
 * tied head. Its hook boundaries follow SPEC §4.6: projections include their biases. */
#include "backward.h"
#include "model_bind.h"
#include "rows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ember_status ember_gpt2_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const int64_t d = m->n_embd, n = p->n;
    ember_trace *tr = s->trace;
    ember_eval_ctx ctx = ember_forward_ctx(p);
    ember_status st = ember_pass_embed(p, 1.0f, err); /* token rows plus learned position rows */
    if (st) return st;

    for (int64_t l = 0; l < m->n_layer; l++) {
        const ember_layer *L = &m->layers[l];
        if ((st = ember_pass_layer_start(p, hooks, &ctx, l, err))) return st;

        ember_rows_layernorm(m, w->xn, w->x, L->attn_norm, L->attn_norm_b, n, d, m->norm_eps);
        ember_trace_step(tr, "attn_norm", l, EMBER_KOP_LAYERNORM, NULL, w->xn, n, d);
        ember_matmul(m->compute, &L->wqkv, w->xn, w->qkv, n);
        ember_add_bias(w->qkv, L->bqkv, n, 3 * d);
        ember_trace_step(tr, "attn_qkv", l, EMBER_KOP_PRODUCT, &L->wqkv, w->qkv, n, 3 * d);
        for (int64_t t = 0; t < n; t++) /* split the fused rows [q | k | v] */
            memcpy(w->q + t * d, w->qkv + t * 3 * d, (size_t)d * sizeof(float));
        ember_tape_keep(s, l, EMBER_TAPE_Q, w->q, n, d);
        ember_pass_kv_store(p, l, w->qkv + d, w->qkv + 2 * d, 3 * d);
        if ((st = ember_attention_stages(p, hooks, &ctx, l, L, m->attn_scale, 0, err))) return st;
        ember_matmul(m->compute, &L->wo, w->att, w->attn, n);
        ember_add_bias(w->attn, L->bo, n, d);
        ember_trace_step(tr, "attn_output", l, EMBER_KOP_PRODUCT, &L->wo, w->attn, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_ATTENTION, &ctx, l, w->attn, n, d, err))) return st;
        ember_add_into(w->x, w->attn, n * d);
        ember_trace_step(tr, "attn_residual", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
        ember_tape_keep(s, l, EMBER_TAPE_X_MID, w->x, n, d);

        ember_rows_layernorm(m, w->xn, w->x, L->ffn_norm, L->ffn_norm_b, n, d, m->norm_eps);
        ember_trace_step(tr, "ffn_norm", l, EMBER_KOP_LAYERNORM, NULL, w->xn, n, d);
        ember_matmul(m->compute, &L->w_up, w->xn, w->up, n);
        ember_add_bias(w->up, L->b_up, n, L->n_ff);
        ember_trace_step(tr, "ffn_up", l, EMBER_KOP_PRODUCT, &L->w_up, w->up, n, L->n_ff);
        ember_tape_keep(s, l, EMBER_TAPE_UP, w->up, n, L->n_ff);
        ember_rows_gelu_mul(m, w->up, NULL, n, L->n_ff);
        ember_trace_step(tr, "ffn_act", l, EMBER_KOP_GELU_MUL, NULL, w->up, n, L->n_ff);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_MLP_ACTIVATION, &ctx, l, w->up, n, L->n_ff, err))) return st;
        ember_matmul(m->compute, &L->w_down, w->up, w->mlp, n);
        ember_add_bias(w->mlp, L->b_down, n, d);
        ember_trace_step(tr, "ffn_down", l, EMBER_KOP_PRODUCT, &L->w_down, w->mlp, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_MLP, &ctx, l, w->mlp, n, d, err))) return st;
        ember_add_into(w->x, w->mlp, n * d);
        ember_trace_step(tr, "layer_output", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_LAYER, &ctx, l, w->x, n, d, err))) return st;
    }

    ember_tape_keep(s, -1, EMBER_TAPE_X, w->x, n, d);
    return ember_logits_head(p, hooks, &ctx, err);
}

/* Hyper-parameters and tensors of GPT-2 (llama.cpp's names: attn_qkv, position_embd, ...). */
ember_status ember_gpt2_bind(binder *b) {
    ember_model *m = b->m;
    TRY(bind_common_hparams(b));
    TRY(hp_dim(b, "feed_forward_length", &m->n_ff, false, 0));
    TRY(hp_dim(b, "context_length", &m->n_ctx_train, true, 0));
    TRY(hp_float_positive(b, "attention.layer_norm_epsilon", &m->norm_eps, 1e-5f));
    if (m->n_layer < 1 || m->n_embd < 1 || m->n_head < 1 || m->n_embd % m->n_head || m->n_ctx_train < 1)
        return bind_fail(b, EMBER_ERR_FORMAT, "inconsistent hyper-parameters: %lld layers, width %lld, %lld heads",
                         (long long)m->n_layer, (long long)m->n_embd, (long long)m->n_head);
    if (m->n_ff == 0) TRY(hp_mul(b, "default MLP width (4 x width)", 4, m->n_embd, &m->n_ff));
    m->n_head_kv = m->n_head;
    m->head_dim = m->n_embd / m->n_head;
    m->attn_scale = 1.0f / sqrtf((float)m->head_dim);

    TRY(bind_common(b));
    TRY(bind_mat(b, "position_embd.weight", m->n_embd, m->n_ctx_train, true, &m->pos_embd));
    TRY(bind_vec(b, "output_norm.bias", m->n_embd, true, &m->output_norm_b));

    const int64_t d = m->n_embd;
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        char n[128];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
        bind_layer_geometry(L, l, m->n_ff, m->n_head, m->head_dim);
        TRY(bind_vec(b, NAME("attn_norm.weight"), d, true, &L->attn_norm));
        TRY(bind_vec(b, NAME("attn_norm.bias"), d, true, &L->attn_norm_b));
        TRY(bind_mat(b, NAME("attn_qkv.weight"), d, 3 * d, true, &L->wqkv));
        TRY(bind_vec(b, NAME("attn_qkv.bias"), 3 * d, true, &L->bqkv));
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
