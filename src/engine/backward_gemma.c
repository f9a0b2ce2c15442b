/* backward_gemma.c — the backward pass of the Gemma 2 and Gemma 3 blocks (family_gemma4.c without
 * per-layer inputs, shared KV or V norm): the pre- and post-norms around attention and the MLP
 * (RMSNorm, full derivative), Gemma 3's per-head QK-norm, NEOX RoPE transposed with each layer's
 * own base and factors, attention with its scale, sliding window and (Gemma 2) logit softcap, the
 * tanh-GELU gate, and the input embedding's sqrt(hidden) scale. Gemma 4 has no backward yet. */
#include "backward.h"

#include <math.h>

uint32_t ember_gemma_tape_slots(const ember_model *m) {
    (void)m;
    return 1u << EMBER_TAPE_X | 1u << EMBER_TAPE_Q | 1u << EMBER_TAPE_K | 1u << EMBER_TAPE_ATTN |
           1u << EMBER_TAPE_X_MID | 1u << EMBER_TAPE_GATE | 1u << EMBER_TAPE_UP | 1u << EMBER_TAPE_MLP;
}

/* gx: the gradient after layer l's MLP residual -> after its attention residual. */
static void mlp_backward(ember_backward *b, int64_t l) {
    const ember_layer *L = &b->m->layers[l];
    ember_backward_mlp_output(b, l, L->post_ffw_norm);
    ember_gelu_mul_backward(b->f1, b->f2, b->f0, ember_tape_get(b->tape, l, EMBER_TAPE_GATE),
                            ember_tape_get(b->tape, l, EMBER_TAPE_UP), b->n * L->n_ff);
    ember_backward_product(b, &L->w_gate, b->f1, b->t1, false);
    ember_backward_product(b, &L->w_up, b->f2, b->t1, true);
    ember_backward_block_input(b, l, false, EMBER_TAPE_X_MID, L->ffn_norm);
}

/* gx: the gradient after layer l's attention residual -> entering the layer: each layer's own RoPE,
 * the post-norm of its output. */
static void attention_backward(ember_backward *b, int64_t l) {
    const ember_layer *L = &b->m->layers[l];
    const ember_backward_rope_args r = {L->n_rot, L->rope_base, true, L->rope_freqs};
    ember_backward_attention_block(b, l, &r, L->post_attn_norm);
}

ember_status ember_gemma_backward(ember_backward *b, ember_error *err) {
    (void)err;
    for (int64_t l = b->m->n_layer - 1; l >= 0; l--) {
        mlp_backward(b, l);
        attention_backward(b, l);
    }
    /* the embedding rows were scaled by sqrt(hidden) as they entered (ember_pass_embed) */
    const float scale = sqrtf((float)b->m->n_embd);
    for (int64_t i = 0; i < b->n * b->m->n_embd; i++) b->gx[i] *= scale;
    ember_backward_keep_embeddings(b, b->gx);
    return EMBER_OK;
}
