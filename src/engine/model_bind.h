/* model_bind.h — helpers the family files use to read hyper-parameters and bind named tensors.
 * Each error names the file and the key or tensor that was missing or misshapen. */
#ifndef EMBER_MODEL_BIND_H
#define EMBER_MODEL_BIND_H

#include "model.h"

typedef struct binder {
    ember_model *m;
    const char *arch; /* metadata key prefix */
    ember_error *err;
} binder;

#define TRY(expr)                                                                                                      \
    do {                                                                                                               \
        ember_status st_ = (expr);                                                                                     \
        if (st_ != EMBER_OK) return st_;                                                                               \
    } while (0)

ember_status bind_fail(binder *b, ember_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "<arch>.<suffix>" as an integer; absence is an error only when `required`. */
ember_status hp_int(binder *b, const char *suffix, int64_t *out, bool required, int64_t def);
/* An error naming "<arch>.<suffix>" unless the file has that key (for keys llama.cpp requires). */
ember_status hp_require(binder *b, const char *suffix);
/* The linear RoPE scaling factor of the file's rope.scaling.* keys as llama.cpp reads them (1: none):
 * positions are divided by it. Any other scaling type is refused, naming the key. */
ember_status hp_rope_scaling(binder *b, float *factor);
ember_status hp_float(binder *b, const char *suffix, float *out, float def);
/* hp_float that must be finite and > 0 (epsilons, RoPE bases): the error names key and value. */
ember_status hp_float_positive(binder *b, const char *suffix, float *out, float def);
/* hp_int for a dimension: at most the largest extent of any tensor in the file. */
ember_status hp_dim(binder *b, const char *suffix, int64_t *out, bool required, int64_t def);
/* "<arch>.rope.dimension_count" (default: the head): an even count from 2 to head_dim, the error
 * naming the key (one rule for every family that rotates part of a head). */
ember_status hp_rope_dims(binder *b, int64_t head_dim, int64_t *n_rot);
/* "<arch>.attention.key_length" (default: width / heads) and .value_length (default: the key
 * length): equal and even, else "head size ... is not supported" (one rule for the llama and Gemma
 * blocks). */
ember_status hp_head_size(binder *b, int64_t *head_dim);
/* The geometry every bind loop sets on layer l: MLP width, KV heads, head size, their product as
 * the K/V row width (the caller has checked it with hp_mul), and its own cache. */
void bind_layer_geometry(ember_layer *L, int64_t l, int64_t n_ff, int64_t n_head_kv, int64_t head_dim);
/* "<arch>.block_count": required, at most the number of blk.N layers the file has tensors for.
 * Families call it first, before anything is allocated per layer. */
ember_status hp_block_count(binder *b, int64_t *out);
/* *out = x * y, an error naming `what` on overflow (or beyond 2^40, no real dimension). */
ember_status hp_mul(binder *b, const char *what, int64_t x, int64_t y, int64_t *out);
/* A 1-D vector of n values as f32 (f16/bf16 converted once into an owned copy). */
ember_status bind_vec(binder *b, const char *name, int64_t n, bool required, const float **out);
/* A vector of n floats the model owns (freed with it), for values the family makes up at load. */
ember_status bind_owned(binder *b, int64_t n, float **out);
/* n_expert matrices of n_out rows of n_in values stacked in one tensor (GGUF dims {n_in, n_out,
 * n_expert}, llama.cpp's *_exps): out[e] is expert e's, over the same bytes. */
ember_status bind_experts(binder *b, const char *name, int64_t n_in, int64_t n_out, int64_t n_expert,
                          ember_matrix *out);
/* A matrix of n_out rows of n_in values (GGUF dims {n_in, n_out}). */
ember_status bind_mat(binder *b, const char *name, int64_t n_in, int64_t n_out, bool required, ember_matrix *out);
/* Rows row0 .. row0+n_rows-1 of a bound matrix as a matrix of its own (a fused tensor's parts:
 * phi3's [q | k | v] and [gate | up]); the same bytes, no copy. */
void bind_mat_rows(const ember_matrix *whole, int64_t row0, int64_t n_rows, ember_matrix *out);

/* The shared preamble of every family's bind, in two halves around the family's own
 * hyper-parameters and checks: block_count, embedding_length, attention.head_count (required) ... */
ember_status bind_common_hparams(binder *b);
/* ... then n_vocab, token_embd, output (tied when absent), output_norm.weight, the layer table. */
ember_status bind_common(binder *b);

/* The llama block's hyper-parameters (sizes, head size, RoPE, norm epsilon, query scale), checked;
 * families over other blocks that read the same keys (olmo2) start from it. */
ember_status ember_llama_hparams(binder *b);
/* Layer l's attention tensors of the llama block (norm, Q/K/V/O, the row's biases and QK-norm) and
 * its ffn_norm, for L's geometry (bind_layer_geometry first); qwen3moe's layers share them. */
ember_status ember_llama_bind_attention(binder *b, int64_t l, ember_layer *L);
ember_status ember_llama_bind(binder *b);
ember_status ember_qwen3moe_bind(binder *b);
ember_status ember_olmo2_bind(binder *b);
ember_status ember_phi3_bind(binder *b);
ember_status ember_gpt2_bind(binder *b);
ember_status ember_gemma2_bind(binder *b);
ember_status ember_gemma3_bind(binder *b);
ember_status ember_gemma4_bind(binder *b);
ember_status ember_gptneox_bind(binder *b);

#endif
