/* backward_gptneox.c — the backward pass of GPT-NeoX (family_gptneox.c): LayerNorms with their
 * full derivative, the GELU MLP, the fused QKV projection, partial NEOX RoPE transposed, and the
 * parallel residual (x + attn(ln1(x)) + mlp(ln2(x)): both blocks read the layer's output gradient,
 * their input gradients are summed) or the sequential one, as the forward ran. */
#include "backward.h"
#include "rows.h"

#include <string.h>

uint32_t ember_gptneox_tape_slots(const ember_model *m) {
    uint32_t mask = 1u << EMBER_TAPE_X | 1u << EMBER_TAPE_Q | 1u << EMBER_TAPE_UP;
    if (!m->parallel_residual) mask |= 1u << EMBER_TAPE_X_MID; /* the MLP's input */
    return mask;
}

/* gx: after layer l's MLP residual -> after its attention residual (sequential), or, parallel, gx
 * left as it is and the MLP's input gradient held in t2 for the attention block to add. */
static void mlp_backward(ember_backward *b, int64_t l) {
    const ember_model *m = b->m;
    const ember_layer *L = &m->layers[l];
    ember_backward_mlp_output(b, l, NULL);
    ember_gelu_mul_backward(b->f1, NULL, b->f0, ember_tape_get(b->tape, l, EMBER_TAPE_UP), NULL, b->n * L->n_ff);
    ember_backward_product(b, &L->w_up, b->f1, b->t1, false);
    if (!m->parallel_residual) {
        ember_backward_block_input(b, l, true, EMBER_TAPE_X_MID, L->ffn_norm);
        return;
    }
    ember_backward_norm(b, true, b->t2, b->t1, ember_tape_get(b->tape, l, EMBER_TAPE_X), L->ffn_norm, b->n, m->n_embd,
                        m->norm_eps, false);
}

/* The fused row's gradient [dq | dk | dv] of n tokens. */
static void join_qkv(float *qkv, const float *dq, const float *dk, const float *dv, int64_t n, int64_t q_dim,
                     int64_t kv_dim) {
    const int64_t row = q_dim + 2 * kv_dim;
    for (int64_t t = 0; t < n; t++) {
        memcpy(qkv + t * row, dq + t * q_dim, (size_t)q_dim * sizeof(float));
        memcpy(qkv + t * row + q_dim, dk + t * kv_dim, (size_t)kv_dim * sizeof(float));
        memcpy(qkv + t * row + q_dim + kv_dim, dv + t * kv_dim, (size_t)kv_dim * sizeof(float));
    }
}

/* gx: after layer l's attention residual (parallel: after the layer) -> entering the layer. */
static void attention_backward(ember_backward *b, int64_t l) {
    const ember_model *m = b->m;
    const ember_layer *L = &m->layers[l];
    const int64_t d = m->n_embd, n = b->n, hd = L->head_dim, kv = L->kv_dim;
    ember_backward_keep(b, EMBER_STAGE_AFTER_ATTENTION, l, b->gx, n, d);
    ember_backward_product(b, &L->wo, b->gx, b->qa, false);
    ember_backward_keep(b, EMBER_STAGE_ATTENTION_HEADS, l, b->qa, n, d);
    /* Q as attention read it: the kept projection through the forward's partial RoPE */
    memcpy(b->qb, ember_tape_get(b->tape, l, EMBER_TAPE_Q), (size_t)(n * d) * sizeof(float));
    ember_rows_norm_rope(m, b->qb, n, m->n_head, hd, NULL, m->norm_eps, m->n_rot, 0, m->rope_base, true, NULL);
    ember_backward_attention(b, l, L, m->attn_scale, 0, b->qb, b->qa, b->qc, b->ka, b->va);
    ember_backward_rope(b, b->qc, m->n_head, hd, m->n_rot, m->rope_base, true, NULL);
    ember_backward_rope(b, b->ka, L->n_head_kv, hd, m->n_rot, m->rope_base, true, NULL);
    join_qkv(b->fused, b->qc, b->ka, b->va, n, d, kv);
    ember_backward_product(b, &L->wqkv, b->fused, b->t1, false);
    if (m->parallel_residual) ember_backward_add(b->gx, b->t2, n * d);
    ember_backward_block_input(b, l, true, EMBER_TAPE_X, L->attn_norm);
}

ember_status ember_gptneox_backward(ember_backward *b, ember_error *err) {
    (void)err;
    return ember_backward_layers(b, mlp_backward, attention_backward);
}
