/* backward_llama.c — the backward pass of the llama block (llama, qwen3, qwen2, phi3; family_llama.c):
 * SwiGLU, the RMSNorms, RoPE and QK-norm transposed, GQA attention, back to the embeddings. Its
 * switches are the forward's (QK-norm, QKV bias, RoPE order and factors, sliding window); biases
 * add nothing to a gradient. */
#include "backward.h"

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
    const ember_backward_rope_args r = {m->n_rot, m->rope_base, m->rope_neox, ember_llama_rope_factors(b->s)};
    ember_backward_attention_block(b, l, &r, NULL);
}

ember_status ember_llama_backward(ember_backward *b, ember_error *err) {
    (void)err;
    return ember_backward_layers(b, mlp_backward, ember_llama_attention_backward);
}
