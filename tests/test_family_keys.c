/* test_family_keys.c — the metadata of the gemma2, gemma3, olmo2, phi3 and qwen3moe families as llama.cpp reads it,
 * on tiny-model-made files: each key llama.cpp requires or bounds, removed or contradicted, is
 * refused at load naming the file and the key or tensor. */
#include "ember.h"
#include "test_models.h"
#include "test_support.h"

#include <stdio.h>
#include <string.h>

typedef enum {
    EDIT_REMOVE_KEY,
    EDIT_SET_F32,
    EDIT_SET_U32,
    EDIT_SET_I32,
    EDIT_SET_STRING,
    EDIT_ADD_MATRIX,
    EDIT_REMOVE_TENSOR
} edit_kind;

typedef struct {
    const char *family;
    const char *what;
    edit_kind kind;
    const char *key; /* key or tensor edited */
    double value;
    const char *text;   /* EDIT_SET_STRING */
    ember_status code;  /* the load's status */
    const char *expect; /* in the message, besides the file's path */
} key_case;

/* Writes the family's tiny model with one edit and checks that loading it is refused as expected. */
static void run_case(const key_case *c, int i) {
    ember_gguf_writer *w = ember_test_tiny_writer(c->family, EMBER_TYPE_F32);
    if (c->kind == EDIT_REMOVE_TENSOR) ember_gguf_writer_remove_tensor(w, c->key);
    else if (c->kind != EDIT_ADD_MATRIX) ember_gguf_writer_remove_key(w, c->key);
    if (c->kind == EDIT_SET_F32) ember_gguf_writer_set_f32(w, c->key, (float)c->value);
    if (c->kind == EDIT_SET_U32) ember_gguf_writer_set_u32(w, c->key, (uint32_t)c->value);
    if (c->kind == EDIT_SET_I32) ember_gguf_writer_set_i32(w, c->key, (int32_t)c->value);
    if (c->kind == EDIT_SET_STRING) ember_gguf_writer_set_string(w, c->key, c->text);
    if (c->kind == EDIT_ADD_MATRIX) {
        static float zeros[64 * 512];
        const int64_t ne[2] = {64, 512};
        ember_gguf_writer_add_tensor(w, c->key, EMBER_TYPE_F32, 2, ne, zeros);
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/family-keys-%d.gguf", ember_test_tmpdir(), i);
    ember_test_write_model(w, path);
    ember_model_params mp = {.path = path, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
    ember_model *m = NULL;
    ember_error err = {0};
    ember_status st = ember_model_load(&mp, &m, &err);
    CHECK_MSG(st == c->code && m == NULL, "%s %s: status %d (expected %d): %.700s", c->family, c->what, st, c->code,
              err.msg);
    ember_model_free(m);
    CHECK_MSG(strstr(err.msg, path) != NULL, "%s %s: the message does not name the file: %.700s", c->family, c->what,
              err.msg);
    CHECK_MSG(strstr(err.msg, c->expect) != NULL, "%s %s: the message lacks '%s': %.700s", c->family, c->what,
              c->expect, err.msg);
}

int main(void) {
    static const key_case cases[] = {
        {"gemma2", "without its norm epsilon", EDIT_REMOVE_KEY, "gemma2.attention.layer_norm_rms_epsilon", 0, NULL,
         EMBER_ERR_FORMAT, "'gemma2.attention.layer_norm_rms_epsilon'"},
        {"gemma2", "without its context length", EDIT_REMOVE_KEY, "gemma2.context_length", 0, NULL, EMBER_ERR_FORMAT,
         "'gemma2.context_length'"},
        {"gemma2", "without its MLP width", EDIT_REMOVE_KEY, "gemma2.feed_forward_length", 0, NULL, EMBER_ERR_FORMAT,
         "'gemma2.feed_forward_length'"},
        {"gemma2", "with an attention softcap of 0", EDIT_SET_F32, "gemma2.attn_logit_softcapping", 0, NULL,
         EMBER_ERR_FORMAT, "gemma2.attn_logit_softcapping"},
        {"gemma2", "with a negative final softcap", EDIT_SET_F32, "gemma2.final_logit_softcapping", -30, NULL,
         EMBER_ERR_FORMAT, "gemma2.final_logit_softcapping"},
        {"gemma2", "with a window of 0", EDIT_SET_U32, "gemma2.attention.sliding_window", 0, NULL, EMBER_ERR_FORMAT,
         "gemma2.attention.sliding_window"},
        {"gemma2", "with YaRN RoPE scaling", EDIT_SET_STRING, "gemma2.rope.scaling.type", 0, "yarn",
         EMBER_ERR_UNSUPPORTED, "'gemma2.rope.scaling.type' = 'yarn'"},
        {"gemma2", "with a negative RoPE scaling factor", EDIT_SET_F32, "gemma2.rope.scaling.factor", -8, NULL,
         EMBER_ERR_FORMAT, "gemma2.rope.scaling.factor"},
        {"gemma2", "with rotated dims beyond the head", EDIT_SET_U32, "gemma2.rope.dimension_count", 18, NULL,
         EMBER_ERR_FORMAT, "gemma2.rope.dimension_count"},
        {"llama", "with an odd count of rotated dims", EDIT_SET_U32, "llama.rope.dimension_count", 7, NULL,
         EMBER_ERR_FORMAT, "llama.rope.dimension_count 7 does not fit head size"},
        {"llama", "with no rotated dims", EDIT_SET_U32, "llama.rope.dimension_count", 0, NULL, EMBER_ERR_FORMAT,
         "llama.rope.dimension_count 0 does not fit head size"},
        {"gemma2", "with a separate head", EDIT_ADD_MATRIX, "output.weight", 0, NULL, EMBER_ERR_FORMAT,
         "'output.weight'"},
        {"gemma2", "with 3 KV heads for 4 heads", EDIT_SET_U32, "gemma2.attention.head_count_kv", 3, NULL,
         EMBER_ERR_FORMAT, "3 KV heads"},
        {"gemma3", "without its norm epsilon", EDIT_REMOVE_KEY, "gemma3.attention.layer_norm_rms_epsilon", 0, NULL,
         EMBER_ERR_FORMAT, "'gemma3.attention.layer_norm_rms_epsilon'"},
        {"gemma3", "with a negative final softcap", EDIT_SET_F32, "gemma3.final_logit_softcapping", -1, NULL,
         EMBER_ERR_FORMAT, "gemma3.final_logit_softcapping"},
        {"gemma3", "with a negative sliding RoPE base", EDIT_SET_F32, "gemma3.rope.freq_base_swa", -1, NULL,
         EMBER_ERR_FORMAT, "gemma3.rope.freq_base_swa"},
        {"gemma3", "with a sliding-window pattern that is not a period", EDIT_SET_STRING,
         "gemma3.attention.sliding_window_pattern", 0, "SSSSSF", EMBER_ERR_FORMAT,
         "'gemma3.attention.sliding_window_pattern' is not an integer"},
        {"gemma3", "with a negative sliding-window period", EDIT_SET_I32, "gemma3.attention.sliding_window_pattern", -6,
         NULL, EMBER_ERR_FORMAT, "'gemma3.attention.sliding_window_pattern' has an absurd value -6"},
        {"gemma3", "without a K norm", EDIT_REMOVE_TENSOR, "blk.2.attn_k_norm.weight", 0, NULL, EMBER_ERR_FORMAT,
         "'blk.2.attn_k_norm.weight'"},
        {"gemma3", "with longrope scaling", EDIT_SET_STRING, "gemma3.rope.scaling.type", 0, "longrope",
         EMBER_ERR_UNSUPPORTED, "'gemma3.rope.scaling.type' = 'longrope'"},
        {"olmo2", "without its norm epsilon", EDIT_REMOVE_KEY, "olmo2.attention.layer_norm_rms_epsilon", 0, NULL,
         EMBER_ERR_FORMAT, "'olmo2.attention.layer_norm_rms_epsilon'"},
        {"olmo2", "with a partial rotary count", EDIT_SET_U32, "olmo2.rope.dimension_count", 8, NULL, EMBER_ERR_FORMAT,
         "8 rotated dims, but olmo2 heads are width 64 / 4 heads and rotate whole"},
        {"olmo2", "with OLMo 3's sliding window", EDIT_SET_U32, "olmo2.attention.sliding_window", 16, NULL,
         EMBER_ERR_UNSUPPORTED, "'olmo2.attention.sliding_window' = 16"},
        {"olmo2", "without an output head", EDIT_REMOVE_TENSOR, "output.weight", 0, NULL, EMBER_ERR_FORMAT,
         "'output.weight' is missing"},
        {"olmo2", "without a post-FFN norm", EDIT_REMOVE_TENSOR, "blk.1.post_ffw_norm.weight", 0, NULL,
         EMBER_ERR_FORMAT, "'blk.1.post_ffw_norm.weight'"},
        {"olmo2", "with a per-head Q norm", EDIT_REMOVE_TENSOR, "blk.0.attn_q_norm.weight", 0, NULL, EMBER_ERR_FORMAT,
         "'blk.0.attn_q_norm.weight'"},
        {"phi3", "without its norm epsilon", EDIT_REMOVE_KEY, "phi3.attention.layer_norm_rms_epsilon", 0, NULL,
         EMBER_ERR_FORMAT, "'phi3.attention.layer_norm_rms_epsilon'"},
        {"phi3", "without its fused QKV", EDIT_REMOVE_TENSOR, "blk.1.attn_qkv.weight", 0, NULL, EMBER_ERR_FORMAT,
         "missing tensor 'blk.1.attn_qkv.weight'"},
        {"phi3", "without an output head", EDIT_REMOVE_TENSOR, "output.weight", 0, NULL, EMBER_ERR_FORMAT,
         "'output.weight' is missing"},
        {"phi3", "with linear RoPE scaling", EDIT_SET_F32, "phi3.rope.scaling.factor", 2, NULL, EMBER_ERR_UNSUPPORTED,
         "'phi3.rope.scaling.factor' = 2"},
        {"phi3", "with a LongRoPE attention factor of 0", EDIT_SET_F32, "phi3.rope.scaling.attn_factor", 0, NULL,
         EMBER_ERR_FORMAT, "'phi3.rope.scaling.attn_factor' = 0 must be positive"},
        {"phi3", "with a negative sliding window", EDIT_SET_I32, "phi3.attention.sliding_window", -1, NULL,
         EMBER_ERR_FORMAT, "'phi3.attention.sliding_window' has an absurd value -1"},
        {"qwen3moe", "without its expert count", EDIT_REMOVE_KEY, "qwen3moe.expert_count", 0, NULL, EMBER_ERR_FORMAT,
         "missing metadata key 'qwen3moe.expert_count'"},
        {"qwen3moe", "without its experts used", EDIT_REMOVE_KEY, "qwen3moe.expert_used_count", 0, NULL,
         EMBER_ERR_FORMAT, "missing metadata key 'qwen3moe.expert_used_count'"},
        {"qwen3moe", "using more experts than it has", EDIT_SET_U32, "qwen3moe.expert_used_count", 5, NULL,
         EMBER_ERR_FORMAT, "'qwen3moe.expert_used_count' = 5: the experts used per token must be from 1 to"},
        {"qwen3moe", "with an expert count its router contradicts", EDIT_SET_U32, "qwen3moe.expert_count", 8, NULL,
         EMBER_ERR_FORMAT,
         "'qwen3moe.expert_count' = 8 contradicts tensor 'blk.0.ffn_gate_inp.weight' ([64, 4, 1]: 4 experts)"},
        {"qwen3moe", "with unnormalised expert weights", EDIT_SET_U32, "qwen3moe.expert_weights_norm", 0, NULL,
         EMBER_ERR_UNSUPPORTED, "'qwen3moe.expert_weights_norm' = 0"},
        {"qwen3moe", "with sigmoid gating", EDIT_SET_U32, "qwen3moe.expert_gating_func", 2, NULL, EMBER_ERR_UNSUPPORTED,
         "'qwen3moe.expert_gating_func' = 2"},
        {"qwen3moe", "without a layer's down experts", EDIT_REMOVE_TENSOR, "blk.1.ffn_down_exps.weight", 0, NULL,
         EMBER_ERR_FORMAT, "missing tensor 'blk.1.ffn_down_exps.weight'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], (int)i);
    return ember_test_finish();
}
