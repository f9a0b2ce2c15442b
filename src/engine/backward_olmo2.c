/* backward_olmo2.c — the backward pass of the OLMo 2 block (family_olmo2.c): the post-norms after
 * attention and after the MLP (RMSNorm, full derivative), Q/K RMSNorm over the whole projection
 * width, NEOX RoPE transposed, GQA attention, SwiGLU; no pre-norm, so each block's input gradient
 * is added to the residual's as it is. */
#include "backward.h"
#include "rows.h"

#include <string.h>

uint32_t ember_olmo2_tape_slots(const ember_model *m) {
    (void)m;
    return 1u << EMBER_TAPE_Q | 1u << EMBER_TAPE_K | 1u << EMBER_TAPE_ATTN | 1u << EMBER_TAPE_GATE |
           1u << EMBER_TAPE_UP | 1u << EMBER_TAPE_MLP | 1u << EMBER_TAPE_X;
}

/* gx: the gradient after layer l's MLP residual -> after its attention residual. */
static void mlp_backward(ember_backward *b, int64_t l) {
    const ember_layer *L = &b->m->layers[l];
    ember_backward_mlp_output(b, l, L->post_ffw_norm);
    ember_silu_mul_backward(b->f1, b->f2, b->f0, ember_tape_get(b->tape, l, EMBER_TAPE_GATE),
                            ember_tape_get(b->tape, l, EMBER_TAPE_UP), b->n * L->n_ff);
    ember_backward_product(b, &L->w_gate, b->f1, b->gx, true);
    ember_backward_product(b, &L->w_up, b->f2, b->gx, true);
}

/* gx: the gradient after layer l's attention residual -> entering the layer. */
static void attention_backward(ember_backward *b, int64_t l) {
    const ember_model *m = b->m;
    const ember_layer *L = &m->layers[l];
    const int64_t d = m->n_embd, n = b->n, hd = L->head_dim, q_dim = m->n_head * hd, kv = L->kv_dim;
    const float *q_raw = ember_tape_get(b->tape, l, EMBER_TAPE_Q), *k_raw = ember_tape_get(b->tape, l, EMBER_TAPE_K);
    ember_backward_keep(b, EMBER_STAGE_AFTER_ATTENTION, l, b->gx, n, d);
    ember_backward_product(b, &L->wo, ember_backward_post_norm(b, l, EMBER_TAPE_ATTN, L->post_attn_norm), b->qa, false);
    ember_backward_keep(b, EMBER_STAGE_ATTENTION_HEADS, l, b->qa, n, q_dim);
    /* Q as attention read it: the kept projection through the forward's width-wide norm and RoPE */
    ember_rows_rmsnorm(m, b->qb, q_raw, L->q_norm, n, q_dim, m->norm_eps);
    ember_rows_norm_rope(m, b->qb, n, m->n_head, hd, NULL, m->norm_eps, m->n_rot, 0, m->rope_base, true, NULL);
    ember_backward_attention(b, l, L, m->attn_scale, 0, b->qb, b->qa, b->qc, b->ka, b->va);
    ember_backward_product(b, &L->wv, b->va, b->gx, true);
    if (!b->freeze_attention) { /* frozen: no gradient reaches Q or K */
        ember_backward_rope(b, b->qc, m->n_head, hd, m->n_rot, m->rope_base, true, NULL);
        ember_backward_rope(b, b->ka, L->n_head_kv, hd, m->n_rot, m->rope_base, true, NULL);
        ember_backward_norm(b, false, b->qb, b->qc, q_raw, L->q_norm, n, q_dim, m->norm_eps, false);
        ember_backward_norm(b, false, b->kb, b->ka, k_raw, L->k_norm, n, kv, m->norm_eps, false);
        ember_backward_product(b, &L->wq, b->qb, b->gx, true);
        ember_backward_product(b, &L->wk, b->kb, b->gx, true);
    }
    ember_backward_keep(b, EMBER_STAGE_BEFORE_LAYER, l, b->gx, n, d);
}

ember_status ember_olmo2_backward(ember_backward *b, ember_error *err) {
    (void)err;
    return ember_backward_layers(b, mlp_backward, attention_backward);
}
