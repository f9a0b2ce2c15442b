/* ember_tiny_model.h — the tools' public interface: deterministic random-weight models of every family
 * (llama, qwen3, qwen2, gemma4, gemma2, gemma3, olmo2, phi3, gpt2, ...) in llama.cpp's GGUF layout,
 * small enough to run in tests in milliseconds (the project's default model comes from here), and the
 * control-vector writer.
 * Includes only ember.h, so the bindings (ember.make_tiny_model, core.write_control_vector) and any
 * user of the tools see no engine-internal header; tools/tiny_model.h adds the GGUF-writer entry.
 *
 * Weights: each tensor has its own generator, seeded from (seed, tensor name), so a tensor's values
 * do not depend on the other tensors. Values are approximately normal (sum of 12 uniforms - 6:
 * integer arithmetic and one multiply, the same bits on every machine):
 *   2-D projections   std 1/sqrt(fan_in)  (each projection keeps the activation scale)
 *   token_embd/output std 0.35            (logits of std ~0.35*sqrt(hidden): peaked, not one-hot)
 *   norm weights      1 + 0.1 * N         (around 1.0)
 *   biases            0.1 * N             (qwen2 QKV; gpt2 every projection and LayerNorm)
 *   rope_freqs        llama: LLaMA-3's factors (factor 8, low 1, high 4, original context 8192)
 *                     gemma4: proportional RoPE of the full layers: the first quarter of the pairs
 *                     rotate (factor 1), the others do not (factor 1e30)
 *   gemma4            per_layer_token_embd std 1/sqrt(per-layer width) (unit rows once scaled by
 *                     sqrt(width)); attn_q_norm/attn_k_norm 0.5 + 0.05 * N (the attention scale is
 *                     1, so this gives scores of std ~sqrt(head size)/4); layer_output_scale
 *                     0.5 + 0.1 * N (the scaled input embedding fades, so that with the tied head a
 *                     token does not simply predict itself)
 *   gpt2              position_embd std 0.1; the Q and K rows of attn_qkv std 2/sqrt(hidden) (sharp
 *                     enough attention that the context's average does not swamp the current
 *                     token); ffn_down.bias = -rowsum(ffn_down) / (2 sqrt(pi)), cancelling GELU's
 *                     mean output (otherwise every token gets the same offset)
 * Norm vectors, biases, rope_freqs and layer_output_scale are always f32; 2-D weights are in the
 * chosen dtype.
 *
 * Gemma 4 layout (SPEC §2.1), with the defaults below: 6 layers, pattern SSSFSF (S sliding, F full;
 * by default every 4th layer and the last are full), window 8, head size 16 on sliding layers and 32
 * on full ones, 2 KV heads on sliding layers and 1 on full ones, the last 2 layers share the KV cache
 * of layers 2 (sliding) and 3 (full) and have a double-width MLP, full layers have no attn_v (V is
 * the K projection), per-layer inputs of width 32, final logit softcap 30, tied head.
 *
 * Gemma 2 and 3 layouts (llama.cpp's gemma2 / gemma3), with the defaults below: one head size, KV
 * width and MLP width for all layers, window 8; gemma2: every other layer sliding (0, 2, 4, ...),
 * attention softcap 50 and final softcap 30; gemma3: five sliding layers to one global, per-head
 * Q/K norms, no final softcap unless given. Tied heads as the real models (gemma2 can have no other);
 * so that a token does not simply predict itself through the embedding scaled by sqrt(hidden),
 * their embedding has std 0.08 and the post-norms weights around 2.
 *
 * OLMo 2 layout (llama.cpp's olmo2): the llama tensors without attn_norm / ffn_norm, with
 * post_attention_norm / post_ffw_norm after each sub-block and attn_q_norm / attn_k_norm as wide as
 * the Q and K projections; head size hidden / heads, RoPE base 500000, separate head.
 *
 * Phi-3 layout (llama.cpp's phi3): attn_qkv ([q | k | v] rows), attn_output, ffn_up ([gate | up] rows,
 * 2 x ff) and ffn_down, RMSNorms before attention and MLP, head size hidden / heads, separate head;
 * --rope-freqs: LongRoPE's rope_factors_short (1 .. 1.5) and rope_factors_long (1 .. 16) with an
 * original context of context / 16; --window: phi3.attention.sliding_window; --rope-attn-factor:
 * phi3.rope.scaling.attn_factor. general.name says
 * "tiny-phi-..." (llama.cpp gives a model named "phi3" the real vocabulary's special-token attributes).
 *
 * Qwen3-MoE layout (llama.cpp's qwen3moe): the qwen3 attention (per-head Q/K norms, head size
 * written) and, in place of the MLP, ffn_gate_inp (the router, always f32, std 3/sqrt(hidden): decisive routing)
 * and ffn_{gate,up,down}_exps stacked [hidden, expert ff, experts] / [expert ff, hidden, experts];
 * 4 experts, 2 used, expert ff = ff / 2 by default; separate head.
 */
#ifndef EMBER_TINY_MODEL_PUBLIC_H
#define EMBER_TINY_MODEL_PUBLIC_H

#include "ember.h"

typedef struct {
    const char *family; /* one of ember_tiny_model_family(0 ..): "llama", "qwen3", ... */
    ember_type dtype;   /* of the 2-D weights */
    uint64_t seed;
    int64_t n_layer, n_embd, n_head, n_ff, n_vocab, n_ctx;
    int64_t n_head_kv; /* 0: the family's usual (2; gpt2 has no GQA: n_head); gemma4: sliding layers' */
    int64_t head_dim;  /* 0: n_embd / n_head (gemma4: the full layers' head size, 0: 2 * n_embd / n_head) */
    float rope_base;   /* 0: the family's usual (llama 10000, qwen 1000000, gemma4 full layers 1000000) */
    int tied;          /* -1: the family's usual (llama separate head, others tied); 0 separate; 1 tied */
    int rope_freqs;    /* -1: the family's usual (gemma4 yes, others no); 0 no; 1 yes (llama, gemma4 only) */
    bool tokenizer;    /* embed the tiny tokenizer (n_vocab >= 258) */

    /* gemma4 only (others refuse values other than these defaults) */
    int64_t head_dim_swa;     /* 0: n_embd / n_head */
    int64_t n_head_kv_full;   /* 0: half of n_head_kv when even, else n_head_kv */
    float rope_base_swa;      /* 0: 10000 */
    int64_t sliding_window;   /* 0: 8 */
    const char *swa_pattern;  /* one 'S' (sliding) or 'F' (full) per layer; NULL: every 4th and the last full */
    int64_t shared_kv_layers; /* -1: 2 when the pattern allows it, else 0 */
    int64_t ple_dim;          /* per-layer input width; -1: 32; 0: no per-layer inputs */
    float softcap;            /* final logit softcap; < 0: 30 (gemma3: none); 0: none (gemma2 needs one) */

    /* gemma2 / gemma3 (with sliding_window, rope_base_swa (gemma3) and softcap above) */
    float attn_softcap; /* gemma2: attention logit softcap; < 0: 50 */
    float rope_scale;   /* gemma3: linear RoPE scaling factor of the global layers; 0: none */

    /* phi3 with LongRoPE factors only */
    float rope_attn_factor; /* rope.scaling.attn_factor (multiplies RoPE's cosines and sines); 0: none */

    /* gptneox only */
    bool sequential_residual; /* use_parallel_residual = false: x += attn(ln1(x)), then x += mlp(ln2(x)) */

    /* NULL-terminated "NAME=TYPE" entries (llama-quantize's --tensor-type): the 2-D weight NAME is
     * written in TYPE (a --dtype spelling) instead of dtype, from the same generated values. An entry
     * naming no 2-D weight of the model, or an unknown type, is an error. NULL: none. */
    const char *const *tensor_types;

    /* qwen3moe only (others refuse values other than 0) */
    int64_t n_expert;      /* 0: 4 */
    int64_t n_expert_used; /* 0: 2 */
    int64_t n_ff_exp;      /* each expert's MLP width; 0: n_ff / 2 */
} ember_tiny_model_params;

/* The families the generator writes, in its table's order: family i (NULL past the last), and
 * all of them as "a, b, c" into buf (cut at cap). The one list of them (make-tiny-model --family,
 * ember.make_tiny_model); every family of the engine's table (ember_family_get) is among them. */
const char *ember_tiny_model_family(int i);
void ember_tiny_model_family_list(char *buf, size_t cap);

/* llama, f32, seed 1, 6 layers, hidden 64, 4 heads, 2 KV heads, ff 128, vocab 512, context 256,
 * with the tokenizer; every family-dependent field at "the family's usual". */
void ember_tiny_model_defaults(ember_tiny_model_params *p);

/* Writes the model to path (build + write; the file appears whole or not at all). */
ember_status ember_tiny_model_write(const ember_tiny_model_params *p, const char *path, ember_error *err);

/* Real-shape presets, for benchmarks without a download: the defaults, then the hyper-parameters of
 * "qwen3-0.6b", "llama3.2-1b", "gemma4-e2b", "gemma2-2b", "gemma3-1b", "pythia-160m", "pythia-1b",
 * "olmo2-1b", "phi3-mini" or "qwen3-30b-a3b-12l" (random weights, seed 1, Q8_0, no tokenizer, context 4096 unless the
 * model's own is longer). Returns false for another name.
 * ember_tiny_model_shapes lists the names, NULL-terminated. */
bool ember_tiny_model_shape(const char *name, ember_tiny_model_params *p);
extern const char *const ember_tiny_model_shapes[];

/* The dtypes the tool writes: every weight type of the traits table (one with a to_float), spelled
 * as its traits name in lower case: "f32", "f16", "bf16", "q8_0", "q4_0", ..., "q4_k", ..., "q6_k".
 * parse_dtype reads one spelling; dtype_list joins them all as "a, b, c" into buf (cut at cap). */
bool ember_tiny_model_parse_dtype(const char *s, ember_type *out);
void ember_tiny_model_dtype_list(char *buf, size_t cap);

/* ---- control vectors (tools/control_vector_write.c) ---- */

/* Writes a control vector in llama.cpp's cvector-generator layout: general.architecture
 * "controlvector", controlvector.model_hint, controlvector.layer_count (= n_dirs), and one f32
 * tensor direction.<layers[i]> of n_embd values per direction (values: n_dirs x n_embd, row-major).
 * layers[] must start at 1 or later and increase; every value must be finite. The file appears
 * whole or not at all. */
ember_status ember_control_vector_write(const char *path, const char *model_hint, int64_t n_embd, int64_t n_dirs,
                                        const int64_t *layers, const float *values, ember_error *err);

#endif
