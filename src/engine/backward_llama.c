/* backward_llama.c — the backward pass of the llama block (llama, qwen3, qwen2, phi3; family_llama.c):
 * SwiGLU, the RMSNorms, RoPE and QK-norm transposed, GQA attention, back to the embeddings. Its
 * switches are the forward's (QK-norm, QKV bias, RoPE order and factors, sliding window); biases
 * add nothing to a gradient. */
#include "backward.h"
#include "rows.h"

#include <string.h>

uint32_t ember_llama_tape_slots(const ember_model *m) {
    uint32_t mask =
        1u << EMBER_TAPE_X | 1u << EMBER_TAPE_Q | 1u << EMBER_TAPE_X_MID | 1u << EMBER_TAPE_GATE | 1u << EMBER_TAPE_UP;
    if (m->family->qk_norm) mask |= 1u << EMBER_TAPE_K; /* the norm's input; RoPE alone needs none */
    return mask;
}

/* gx: the gradient after layer l's MLP residual -> after its attention residual. */
static void mlp_backward(ember_backward *b, int64_t l) {
    const ember_layer *L = &b->m->layers[l];
    ember_backward_mlp_output(b, l, NULL);
    ember_silu_mul_backward(b->f1, b->f2, b->f0, ember_tape_get(b->tape, l, EMBER_TAPE_GATE),
                            ember_tape_get(b->tape, l, EMBER_TAPE_UP), b->n * L->n_ff);
    ember_backward_product(b, &L->w_gate, b->f1, b->t1, false);
    ember_backward_product(b, &L->w_up, b->f2, b->t1, true);
    ember_backward_block_input(b, l, false, EMBER_TAPE_X_MID, L->ffn_norm);
}

/* gx: the gradient after layer l's attention residual -> entering the layer. */
void ember_llama_attention_backward(ember_backward *b, int64_t l) {
    const ember_model *m = b->m;
    const ember_layer *L = &m->layers[l];
    const int64_t d = m->n_embd, n = b->n, hd = L->head_dim, q_dim = m->n_head * hd;
    const float *q_raw = ember_tape_get(b->tape, l, EMBER_TAPE_Q);
    const float *freqs = ember_llama_rope_factors(b->s);
    ember_backward_keep(b, EMBER_STAGE_AFTER_ATTENTION, l, b->gx, n, d);
    ember_backward_product(b, &L->wo, b->gx, b->qa, false);
    ember_backward_keep(b, EMBER_STAGE_ATTENTION_HEADS, l, b->qa, n, q_dim);
    /* Q as attention read it: the kept projection through the forward's own norm and RoPE */
    memcpy(b->qb, q_raw, (size_t)(n * q_dim) * sizeof(float));
    ember_rows_norm_rope(m, b->qb, n, m->n_head, hd, L->q_norm, m->norm_eps, m->n_rot, 0, m->rope_base, m->rope_neox,
                         freqs);
    ember_backward_attention(b, l, L, m->attn_scale, L->sliding ? m->window : 0, b->qb, b->qa, b->qc, b->ka, b->va);
    ember_backward_product(b, &L->wv, b->va, b->t1, false);
    if (!b->freeze_attention) { /* frozen: no gradient reaches Q or K */
        ember_backward_rope(b, b->qc, m->n_head, hd, m->n_rot, m->rope_base, m->rope_neox, freqs);
        ember_backward_rope(b, b->ka, L->n_head_kv, hd, m->n_rot, m->rope_base, m->rope_neox, freqs);
        float *dq = b->qc, *dk = b->ka;
        if (L->q_norm) { /* per-head RMSNorm of each head's hd values */
            ember_backward_norm(b, false, b->qb, b->qc, q_raw, L->q_norm, n * m->n_head, hd, m->norm_eps, false);
            ember_backward_norm(b, false, b->kb, b->ka, ember_tape_get(b->tape, l, EMBER_TAPE_K), L->k_norm,
                                n * L->n_head_kv, hd, m->norm_eps, false);
            dq = b->qb;
            dk = b->kb;
        }
        ember_backward_product(b, &L->wq, dq, b->t1, true);
        ember_backward_product(b, &L->wk, dk, b->t1, true);
    }
    ember_backward_block_input(b, l, false, EMBER_TAPE_X, L->attn_norm);
}

ember_status ember_llama_backward(ember_backward *b, ember_error *err) {
    (void)err;
    return ember_backward_layers(b, mlp_backward, ember_llama_attention_backward);
}
