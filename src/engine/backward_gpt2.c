/* backward_gpt2.c — the backward pass of GPT-2 (family_gpt2.c): LayerNorms with their full
 * derivative, the GELU MLP, the fused QKV projection, attention without RoPE, back to the token
 * embedding rows (the learned positions are added to them, so they share their gradient). */
#include "backward.h"

#include <string.h>

uint32_t ember_gpt2_tape_slots(const ember_model *m) {
    (void)m;
    return 1u << EMBER_TAPE_X | 1u << EMBER_TAPE_Q | 1u << EMBER_TAPE_X_MID | 1u << EMBER_TAPE_UP;
}

/* gx: after layer l's MLP residual -> after its attention residual. */
static void mlp_backward(ember_backward *b, int64_t l) {
    const ember_layer *L = &b->m->layers[l];
    ember_backward_mlp_output(b, l, NULL);
    ember_gelu_mul_backward(b->f1, NULL, b->f0, ember_tape_get(b->tape, l, EMBER_TAPE_UP), NULL, b->n * L->n_ff);
    ember_backward_product(b, &L->w_up, b->f1, b->t1, false);
    ember_backward_block_input(b, l, true, EMBER_TAPE_X_MID, L->ffn_norm);
}

/* gx: after layer l's attention residual -> entering the layer. */
static void attention_backward(ember_backward *b, int64_t l) {
    const ember_model *m = b->m;
    const ember_layer *L = &m->layers[l];
    const int64_t d = m->n_embd, n = b->n;
    ember_backward_keep(b, EMBER_STAGE_AFTER_ATTENTION, l, b->gx, n, d);
    ember_backward_product(b, &L->wo, b->gx, b->qa, false);
    ember_backward_keep(b, EMBER_STAGE_ATTENTION_HEADS, l, b->qa, n, d);
    ember_backward_attention(b, l, L, m->attn_scale, 0, ember_tape_get(b->tape, l, EMBER_TAPE_Q), b->qa, b->qc, b->ka,
                             b->va);
    for (int64_t t = 0; t < n; t++) { /* the fused row [q | k | v] */
        float *row = b->fused + t * 3 * d;
        memcpy(row, b->qc + t * d, (size_t)d * sizeof(float));
        memcpy(row + d, b->ka + t * d, (size_t)d * sizeof(float));
        memcpy(row + 2 * d, b->va + t * d, (size_t)d * sizeof(float));
    }
    ember_backward_product(b, &L->wqkv, b->fused, b->t1, false);
    ember_backward_block_input(b, l, true, EMBER_TAPE_X, L->attn_norm);
}

ember_status ember_gpt2_backward(ember_backward *b, ember_error *err) {
    (void)err;
    return ember_backward_layers(b, mlp_backward, attention_backward);
}
