/* family_olmo2.c — the OLMo 2 block as llama.cpp runs it: no norm before attention or MLP, RMSNorm
 * after each (before the residual add), Q/K RMSNorm over the full projection width, NEOX RoPE,
 * SwiGLU, separate head. Must not read another family's keys or switches. */
#include "backward.h"
#include "model_bind.h"
#include "rows.h"

#include <math.h>
#include <stdio.h>

/* Q (or K) of n rows: RMSNorm over all heads at once (OLMo 2's norm is width-wide, not per head),
 * then NEOX RoPE per head. */
static void norm_rope(const ember_pass *p, float *x, int64_t n_heads, int64_t hd, const float *norm) {
    const ember_model *m = p->host->model;
    ember_rows_rmsnorm(m, x, x, norm, p->n, n_heads * hd, m->norm_eps);
    ember_pass_norm_rope(p, x, n_heads, hd, NULL, m->norm_eps, m->n_rot, m->rope_base, true, NULL);
}

/* Attention of one layer from the raw residual (no pre-norm) up to the post-attention norm. */
static ember_status attention(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                              ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    const int64_t n = p->n;
    const ember_layer *L = &m->layers[l];
    ember_workspace *w = &s->ws;
    ember_trace *tr = s->trace;
    const int64_t d = m->n_embd, q_dim = m->n_head * L->head_dim;
    ember_matmul_multi(m->compute, 3, (const ember_matrix *const[]){&L->wq, &L->wk, &L->wv}, w->x,
                       (float *const[]){w->q, w->k, w->v}, n);
    ember_trace_step(tr, "attn_q", l, EMBER_KOP_PRODUCT, &L->wq, w->q, n, q_dim);
    ember_trace_step(tr, "attn_k", l, EMBER_KOP_PRODUCT, &L->wk, w->k, n, L->kv_dim);
    ember_trace_step(tr, "attn_v", l, EMBER_KOP_PRODUCT, &L->wv, w->v, n, L->kv_dim);
    ember_tape_keep(s, l, EMBER_TAPE_Q, w->q, n, q_dim);
    ember_tape_keep(s, l, EMBER_TAPE_K, w->k, n, L->kv_dim);
    norm_rope(p, w->q, m->n_head, L->head_dim, L->q_norm);
    norm_rope(p, w->k, L->n_head_kv, L->head_dim, L->k_norm);
    ember_trace_step(tr, "q_rope", l, EMBER_KOP_ROPE, NULL, w->q, n, q_dim);
    ember_trace_step(tr, "k_rope", l, EMBER_KOP_ROPE, NULL, w->k, n, L->kv_dim);
    ember_pass_kv_store(p, l, w->k, w->v, L->kv_dim);
    ember_status st = ember_attention_stages(p, hooks, ctx, l, L, m->attn_scale, 0, err);
    if (st) return st;
    ember_matmul(m->compute, &L->wo, w->att, w->attn, n);
    ember_trace_step(tr, "attn_output", l, EMBER_KOP_PRODUCT, &L->wo, w->attn, n, d);
    ember_tape_keep(s, l, EMBER_TAPE_ATTN, w->attn, n, d);
    ember_rows_rmsnorm(m, w->attn, w->attn, L->post_attn_norm, n, d, m->norm_eps);
    ember_trace_step(tr, "attn_post_norm", l, EMBER_KOP_RMSNORM, NULL, w->attn, n, d);
    return EMBER_OK;
}

ember_status ember_olmo2_forward(const ember_pass *p, const ember_hooks *hooks, ember_error *err) {
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
        if ((st = attention(p, hooks, &ctx, l, err))) return st;
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_ATTENTION, &ctx, l, w->attn, n, d, err))) return st;
        ember_add_into(w->x, w->attn, n * d);
        ember_trace_step(tr, "attn_residual", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);

        /* SwiGLU MLP of the raw residual, RMS-normed after the down projection */
        ember_matmul_multi(m->compute, 2, (const ember_matrix *const[]){&L->w_gate, &L->w_up}, w->x,
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
        ember_tape_keep(s, l, EMBER_TAPE_MLP, w->mlp, n, d);
        ember_rows_rmsnorm(m, w->mlp, w->mlp, L->post_ffw_norm, n, d, m->norm_eps);
        ember_trace_step(tr, "ffn_post_norm", l, EMBER_KOP_RMSNORM, NULL, w->mlp, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_MLP, &ctx, l, w->mlp, n, d, err))) return st;
        ember_add_into(w->x, w->mlp, n * d);
        ember_trace_step(tr, "layer_output", l, EMBER_KOP_ENGINE, NULL, w->x, n, d);
        if ((st = ember_hook_call(hooks, EMBER_STAGE_AFTER_LAYER, &ctx, l, w->x, n, d, err))) return st;
    }

    ember_tape_keep(s, -1, EMBER_TAPE_X, w->x, n, d);
    return ember_logits_head(p, hooks, &ctx, err);
}

/* The keys llama.cpp's olmo2 reads besides the llama ones, and what its graph assumes: the head
 * size is width / heads and RoPE turns all of it; OLMo 3's sliding-window layers are refused. */
static ember_status olmo2_hparams(binder *b) {
    ember_model *m = b->m;
    TRY(hp_require(b, "attention.layer_norm_rms_epsilon"));
    TRY(ember_llama_hparams(b));
    if (m->head_dim * m->n_head != m->n_embd || m->n_rot != m->head_dim)
        return bind_fail(b, EMBER_ERR_FORMAT,
                         "metadata keys '%s.attention.key_length' / '%s.rope.dimension_count': head size %lld and "
                         "%lld rotated dims, but olmo2 heads are width %lld / %lld heads and rotate whole",
                         b->arch, b->arch, (long long)m->head_dim, (long long)m->n_rot, (long long)m->n_embd,
                         (long long)m->n_head);
    int64_t window;
    TRY(hp_int(b, "attention.sliding_window", &window, false, 0));
    if (window > 0)
        return bind_fail(b, EMBER_ERR_UNSUPPORTED,
                         "metadata key '%s.attention.sliding_window' = %lld: sliding-window layers (OLMo 3) are not "
                         "supported",
                         b->arch, (long long)window);
    if (!ember_gguf_find_tensor(m->gguf, "output.weight"))
        return bind_fail(b, EMBER_ERR_FORMAT, "tensor 'output.weight' is missing: an %s head is never tied", b->arch);
    return EMBER_OK;
}

/* Hyper-parameters and tensors of olmo2 (llama.cpp's names and layouts). */
ember_status ember_olmo2_bind(binder *b) {
    ember_model *m = b->m;
    TRY(olmo2_hparams(b));
    TRY(bind_common(b));
    const int64_t d = m->n_embd, kv_dim = m->n_head_kv * m->head_dim;
    for (int64_t l = 0; l < m->n_layer; l++) {
        ember_layer *L = &m->layers[l];
        char n[128];
#define NAME(suffix) (snprintf(n, sizeof n, "blk.%lld." suffix, (long long)l), n)
        bind_layer_geometry(L, l, m->n_ff, m->n_head_kv, m->head_dim);
        TRY(bind_mat(b, NAME("attn_q.weight"), d, d, true, &L->wq));
        TRY(bind_mat(b, NAME("attn_k.weight"), d, kv_dim, true, &L->wk));
        TRY(bind_mat(b, NAME("attn_v.weight"), d, kv_dim, true, &L->wv));
        TRY(bind_mat(b, NAME("attn_output.weight"), d, d, true, &L->wo));
        TRY(bind_vec(b, NAME("attn_q_norm.weight"), d, true, &L->q_norm));
        TRY(bind_vec(b, NAME("attn_k_norm.weight"), kv_dim, true, &L->k_norm));
        TRY(bind_vec(b, NAME("post_attention_norm.weight"), d, true, &L->post_attn_norm));
        TRY(bind_mat(b, NAME("ffn_gate.weight"), d, m->n_ff, true, &L->w_gate));
        TRY(bind_mat(b, NAME("ffn_up.weight"), d, m->n_ff, true, &L->w_up));
        TRY(bind_mat(b, NAME("ffn_down.weight"), m->n_ff, d, true, &L->w_down));
        TRY(bind_vec(b, NAME("post_ffw_norm.weight"), d, true, &L->post_ffw_norm));
#undef NAME
    }
    return EMBER_OK;
}
