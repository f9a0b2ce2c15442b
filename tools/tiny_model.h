/* tiny_model.h — deterministic random-weight llama / qwen3 / qwen2 models in llama.cpp's GGUF layout,
 * small enough to run in tests in milliseconds. The project's default model comes from here.
 *
 * Weights: each tensor has its own generator, seeded from (seed, tensor name), so a tensor's values
 * do not depend on the other tensors. Values are approximately normal (sum of 12 uniforms - 6:
 * integer arithmetic and one multiply, the same bits on every machine):
 *   2-D projections   std 1/sqrt(fan_in)  (each projection keeps the activation scale)
 *   token_embd/output std 0.35            (logits of std ~0.35*sqrt(hidden): peaked, not one-hot)
 *   norm weights      1 + 0.1 * N         (around 1.0)
 *   qwen2 QKV biases  0.1 * N
 *   rope_freqs        LLaMA-3's factors (factor 8, low 1, high 4, original context 8192)
 * Norm vectors, biases and rope_freqs are always f32; 2-D weights are in the chosen dtype.
 */
#ifndef EMBER_TINY_MODEL_H
#define EMBER_TINY_MODEL_H

#include "gguf_writer.h"

typedef struct {
    const char *family; /* "llama" | "qwen3" | "qwen2" */
    ember_type dtype;   /* of the 2-D weights */
    uint64_t seed;
    int64_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    int64_t head_dim;   /* 0: n_embd / n_head */
    float rope_base;    /* 0: the family's usual (llama 10000, qwen 1000000) */
    int tied;           /* -1: the family's usual (llama separate head, qwen tied); 0 separate; 1 tied */
    bool rope_freqs;    /* llama: add rope_freqs.weight */
    bool tokenizer;     /* embed the tiny tokenizer (n_vocab >= 258) */
} ember_tiny_model_params;

/* llama, f32, seed 1, 6 layers, hidden 64, 4 heads, 2 KV heads, ff 128, vocab 512, context 256,
 * with the tokenizer. */
void ember_tiny_model_defaults(ember_tiny_model_params *p);

/* Adds the model's metadata, tokenizer and tensors to w (callers may then edit it). */
ember_status ember_tiny_model_build(const ember_tiny_model_params *p, ember_gguf_writer *w, ember_error *err);
/* build + write. */
ember_status ember_tiny_model_write(const ember_tiny_model_params *p, const char *path, ember_error *err);

/* "f32" | "f16" | "bf16" | "q8_0" */
bool ember_tiny_model_parse_dtype(const char *s, ember_type *out);

#endif
