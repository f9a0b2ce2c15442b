/* backward.h — the backward pass's engine side: the tape a forward pass keeps for it (what each
 * family's backward needs of the forward's intermediates, one copy per token and layer) and the
 * helpers the families' backward files share (transposed products, rows of norm derivatives, RoPE
 * transposed, attention backward, keeping a gradient). Nothing here runs a forward op. */
#ifndef EMBER_BACKWARD_H
#define EMBER_BACKWARD_H

#include "model.h"

/* What a forward pass keeps for the backward, per layer (and once per model: `layer` -1), each
 * (n, width) for the n tokens of the prompt. The family's backward says which it needs
 * (ember_family.tape_slots, a mask of 1 << slot); the forward offers every one it has at the point
 * named, and the tape copies only those asked for. */
typedef enum {
    EMBER_TAPE_X = 0,     /* the residual entering the layer; layer -1: after the last layer */
    EMBER_TAPE_Q,         /* Q after its bias, before QK-norm and RoPE; gpt2: the fused row's Q */
    EMBER_TAPE_K,         /* K likewise (before its norm and RoPE) */
    EMBER_TAPE_V,         /* V before its norm (gemma4) */
    EMBER_TAPE_ATTN,      /* the O projection's output before a post-norm (gemma4) */
    EMBER_TAPE_X_MID,     /* the residual after the attention block */
    EMBER_TAPE_GATE,      /* the MLP gate before its activation */
    EMBER_TAPE_UP,        /* the MLP up projection (gpt2: before its GELU) */
    EMBER_TAPE_MLP,       /* the down projection's output before a post-norm (gemma4) */
    EMBER_TAPE_X_MLP,     /* the residual after the MLP (gemma4: the per-layer gate's input) */
    EMBER_TAPE_PLE_GATE,  /* gemma4: the per-layer gate before its GELU */
    EMBER_TAPE_PLE_PROJ,  /* gemma4: the per-layer projection before its post-norm */
    EMBER_TAPE_PLE_INPUT, /* gemma4, layer -1: the per-layer inputs (n, n_layer * ple) */
    EMBER_TAPE_PLE_MODEL, /* gemma4, layer -1: per_layer_model_proj's output scaled, before its norms */
    EMBER_TAPE_ROUTER,    /* qwen3moe: the router's logits as the routing read them (n, n_expert) */
    EMBER_TAPE_SLOTS
} ember_tape_slot;

typedef struct ember_tape {
    int64_t n_layer, n; /* layers, tokens of the prompt */
    uint32_t mask;      /* the slots kept (1 << slot) */
    float **buf;        /* ((n_layer + 1) * EMBER_TAPE_SLOTS): (n, width) each, NULL until kept */
    int64_t *width;     /* their widths */
    size_t bytes;       /* held */
    bool failed;        /* an allocation failed while the forward kept a slot */
} ember_tape;

ember_status ember_tape_new(const ember_model *m, int64_t n, uint32_t mask, ember_tape **out, ember_error *err);
void ember_tape_free(ember_tape *t);
/* Copies rows pos .. pos+rows-1 of slot (layer, slot) from data (rows, width), pos being the
 * session's position (a sliced prefill keeps each slice where it lies). */
void ember_tape_put(ember_tape *t, int64_t pos, int64_t layer, ember_tape_slot slot, const float *data, int64_t rows,
                    int64_t width);
/* Copies cols values from data into row `row` (the session's position counted) of slot (layer, slot),
 * of width values a row, from column col0: the parts of a row kept where they are computed (an MoE
 * layer's slots, expert by expert). */
void ember_tape_put_cols(ember_tape *t, int64_t row, int64_t layer, ember_tape_slot slot, int64_t col0,
                         const float *data, int64_t cols, int64_t width);
/* (n, width) of a kept slot, NULL if it was not kept. */
const float *ember_tape_get(const ember_tape *t, int64_t layer, ember_tape_slot slot);

/* The call a forward pass makes: nothing (a pointer test) unless the session keeps a tape. */
static inline void ember_tape_keep(const ember_session *s, int64_t layer, ember_tape_slot slot, const float *data,
                                   int64_t rows, int64_t width) {
    if (s->tape && (s->tape->mask >> slot & 1u)) ember_tape_put(s->tape, s->pos, layer, slot, data, rows, width);
}

/* ember_tape_keep for a part of one row (ember_tape_put_cols). */
static inline void ember_tape_keep_cols(const ember_session *s, int64_t layer, ember_tape_slot slot, int64_t row,
                                        int64_t col0, const float *data, int64_t cols, int64_t width) {
    if (s->tape && (s->tape->mask >> slot & 1u))
        ember_tape_put_cols(s->tape, s->pos + row, layer, slot, col0, data, cols, width);
}

/* ---- the backward of one evaluation -------------------------------------------------------------
 * The driver (gradients.c) has run the forward with a tape, seeded the logits' gradient and gone
 * back through the LM head and the final norm; a family's backward (ember_family.backward) then
 * takes gx, the gradient of the residual stream after the last layer (n, n_embd; only the last row
 * is non-zero), back through every layer to the embeddings, keeping what the request asks for. */
typedef struct ember_gradients ember_gradients;

typedef struct ember_backward {
    ember_session *s;
    const ember_model *m;
    const ember_tape *tape;
    ember_gradients *out;
    bool freeze_attention, freeze_norm;
    int64_t n; /* tokens */
    /* scratch, (n, width) each; widths the largest of any layer */
    float *gx;            /* (n, d) the gradient of the residual stream where the walk is */
    float *t0, *t1, *t2;  /* (n, d) */
    float *f0, *f1, *f2;  /* (n, n_ff) */
    float *qa, *qb, *qc;  /* (n, q_dim) */
    float *ka, *kb, *kc;  /* (n, kv_dim) */
    float *va, *vb;       /* (n, kv_dim) */
    float **dk_acc;       /* (n_layer): (n, kv_dim) the key / value gradients shared-KV layers send to */
    float **dv_acc;       /*   the layer whose cache they read (gemma4), NULL where none do */
    float *pattern;       /* (n_head * n, n) the pattern's gradient, when asked */
    float *stats, *rows;  /* the attention backward's scratch */
    float *ple_a, *ple_b; /* (n, n_layer * ple) gemma4 */
    float *fused;         /* (n, the fused QKV width) gpt2 */
    float *prod;          /* (n, the widest row above) what a product or norm adds, before it is added */
    int missing;          /* a weight type the kernel set has no transposed product for, or -1 */
} ember_backward;

/* Whether the request keeps the gradient at (stage, layer): the caller may skip computing it. */
bool ember_backward_wants(const ember_backward *b, ember_stage stage, int64_t layer);
/* Keeps a copy of the gradient at (stage, layer) (rows, cols) if the request asks for it. */
void ember_backward_keep(ember_backward *b, ember_stage stage, int64_t layer, const float *data, int64_t rows,
                         int64_t cols);
/* Keeps the gradient of the embedding rows (n, n_embd) if asked for. */
void ember_backward_keep_embeddings(ember_backward *b, const float *data);
/* dx (n, n_in) = g W, or dx += g W when add (the sum elementwise after the product). */
void ember_backward_product(ember_backward *b, const ember_matrix *w, const float *g, float *dx, bool add);
/* dx[t] (+)= the norm's backward of dy[t] at input x[t], for n rows of width values: RMSNorm (or
 * LayerNorm with layer), weight w (NULL: none), the request's frozen norm applied. */
void ember_backward_norm(ember_backward *b, bool layer, float *dx, const float *dy, const float *x, const float *w,
                         int64_t rows, int64_t width, float eps, bool add);
/* x (n rows of n_heads heads of hd) rotated back: RoPE's transpose at each row's position. */
void ember_backward_rope(ember_backward *b, float *x, int64_t n_heads, int64_t hd, int64_t n_rot, float base, bool neox,
                         const float *freq_factors);
/* Layer l's attention backward over the cache it read: q (n, n_head * hd) as attention used it,
 * d_att the gradient of its output; dq, dk, dv out (dq, dk left as zeros when attention is
 * frozen). Keeps attention_pattern's gradient if asked. */
void ember_backward_attention(ember_backward *b, int64_t l, const ember_layer *L, float scale, int64_t window,
                              const float *q, const float *d_att, float *dq, float *dk, float *dv);
/* x[i] += d[i] */
void ember_backward_add(float *x, const float *d, int64_t count);

/* What every family's block backward shares. A block's backward moves b->gx from its output
 * residual to its input residual. */
typedef void (*ember_backward_block)(ember_backward *b, int64_t l);
/* The gradient before a post-norm (RMSNorm, weight w) whose output's gradient is b->gx, the norm's
 * input kept in tape slot (layer l): into b->t0, which is returned; w NULL (no post-norm): b->gx. */
const float *ember_backward_post_norm(ember_backward *b, int64_t l, ember_tape_slot slot, const float *w);
/* Layer l's MLP output: keeps after_layer and after_mlp (both b->gx), f0 = g W_down (kept as
 * mlp_activation), g the gradient before the post-norm post_norm (EMBER_TAPE_MLP; NULL: none). */
void ember_backward_mlp_output(ember_backward *b, int64_t l, const float *post_norm);
/* b->gx += the norm's backward (RMSNorm, or LayerNorm with layer) of b->t1 at the residual the
 * tape keeps in slot (EMBER_TAPE_X: entering layer l, then kept as before_layer; EMBER_TAPE_X_MID:
 * after its attention), weight w. */
void ember_backward_block_input(ember_backward *b, int64_t l, bool layer, ember_tape_slot slot, const float *w);
/* The RoPE a layer's Q and K went through (its rotated dims, base, pair order, frequency factors). */
typedef struct {
    int64_t n_rot;
    float base;
    bool neox;
    const float *freqs;
} ember_backward_rope_args;
/* Layer l's attention block of the llama kind (the Gemma one with post_norm, its output's RMSNorm;
 * NULL: none): gx after the attention residual -> entering the layer, through the O projection, the
 * attention over its cache (the layer's window), V, RoPE and the per-head QK-norm where the layer
 * has one, Q/K/V's products and the pre-norm; every gradient of those stages kept as asked. */
void ember_backward_attention_block(ember_backward *b, int64_t l, const ember_backward_rope_args *r,
                                    const float *post_norm);
/* From the last layer to the first: mlp(l), then attention(l); then keeps the embeddings' gradient. */
ember_status ember_backward_layers(ember_backward *b, ember_backward_block mlp, ember_backward_block attention);

/* The families' backward passes (ember_family.backward) and the tape slots each needs. */
ember_status ember_llama_backward(ember_backward *b, ember_error *err);
uint32_t ember_llama_tape_slots(const ember_model *m);
ember_status ember_gpt2_backward(ember_backward *b, ember_error *err);
uint32_t ember_gpt2_tape_slots(const ember_model *m);
ember_status ember_olmo2_backward(ember_backward *b, ember_error *err);
uint32_t ember_olmo2_tape_slots(const ember_model *m);
ember_status ember_gptneox_backward(ember_backward *b, ember_error *err);
uint32_t ember_gptneox_tape_slots(const ember_model *m);
ember_status ember_gemma_backward(ember_backward *b, ember_error *err); /* gemma2, gemma3 */
ember_status ember_qwen3moe_backward(ember_backward *b, ember_error *err);
uint32_t ember_qwen3moe_tape_slots(const ember_model *m);
/* The llama block's attention backward of layer l (backward_llama.c): gx after the attention
 * residual -> entering the layer. Shared by qwen3moe. */
void ember_llama_attention_backward(ember_backward *b, int64_t l);
uint32_t ember_gemma_tape_slots(const ember_model *m);

#endif
