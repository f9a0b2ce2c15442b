/* families.c — the family table: one row per model family (its name, the architectures it reads,
 * its bind and forward functions, its switches). Must not bind or compute anything itself. */
#include "backward.h"
#include "model_bind.h"

#include <string.h>

#define ARCHS(...) ((const char *const[]){__VA_ARGS__, NULL})

static const ember_family families[] = {
    {
        .info = {.name = "llama", .architectures = ARCHS("llama")},
        .bind = ember_llama_bind,
        .forward = ember_llama_forward,
        .backward = ember_llama_backward,
        .tape_slots = ember_llama_tape_slots,
    },
    {
        .info = {.name = "qwen3", .architectures = ARCHS("qwen3")},
        .bind = ember_llama_bind,
        .forward = ember_llama_forward,
        .backward = ember_llama_backward,
        .tape_slots = ember_llama_tape_slots,
        .rope_neox = true,
        .qk_norm = true,
    },
    {
        .info = {.name = "qwen2", .architectures = ARCHS("qwen2"), .experimental = true},
        .bind = ember_llama_bind,
        .forward = ember_llama_forward,
        .backward = ember_llama_backward,
        .tape_slots = ember_llama_tape_slots,
        .rope_neox = true,
        .qkv_bias = true,
    },
    {
        .info = {.name = "qwen3moe", .architectures = ARCHS("qwen3moe")},
        .bind = ember_qwen3moe_bind,
        .forward = ember_qwen3moe_forward,
        .backward = ember_qwen3moe_backward,
        .tape_slots = ember_qwen3moe_tape_slots,
        .rope_neox = true,
        .qk_norm = true,
        .moe = true,
    },
    {
        .info = {.name = "gemma4", .architectures = ARCHS("gemma4")},
        .bind = ember_gemma4_bind,
        .forward = ember_gemma4_forward,
        .qk_norm = true,
        .v_norm = true,
    },
    {
        .info = {.name = "gemma2", .architectures = ARCHS("gemma2")},
        .bind = ember_gemma2_bind,
        .forward = ember_gemma4_forward,
        .backward = ember_gemma_backward,
        .tape_slots = ember_gemma_tape_slots,
    },
    {
        .info = {.name = "gemma3", .architectures = ARCHS("gemma3")},
        .bind = ember_gemma3_bind,
        .forward = ember_gemma4_forward,
        .backward = ember_gemma_backward,
        .tape_slots = ember_gemma_tape_slots,
        .qk_norm = true,
    },
    {
        .info = {.name = "olmo2", .architectures = ARCHS("olmo2")},
        .bind = ember_olmo2_bind,
        .forward = ember_olmo2_forward,
        .backward = ember_olmo2_backward,
        .tape_slots = ember_olmo2_tape_slots,
        .rope_neox = true, /* read by ember_llama_hparams */
    },
    {
        .info = {.name = "phi3", .architectures = ARCHS("phi3")},
        .bind = ember_phi3_bind,
        .forward = ember_llama_forward, /* the llama block over phi3's fused tensors' parts */
        .backward = ember_llama_backward,
        .tape_slots = ember_llama_tape_slots,
        .rope_neox = true,
    },
    {
        .info = {.name = "gpt2", .architectures = ARCHS("gpt2")},
        .bind = ember_gpt2_bind,
        .forward = ember_gpt2_forward,
        .backward = ember_gpt2_backward,
        .tape_slots = ember_gpt2_tape_slots,
        .final_norm = EMBER_NORM_LAYER,
    },
    {
        .info = {.name = "gptneox", .architectures = ARCHS("gptneox")},
        .bind = ember_gptneox_bind,
        .forward = ember_gptneox_forward,
        .backward = ember_gptneox_backward,
        .tape_slots = ember_gptneox_tape_slots,
        .final_norm = EMBER_NORM_LAYER,
    },
};

#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

int ember_family_count(void) { return N_FAMILIES; }

const ember_family_info *ember_family_get(int i) { return i >= 0 && i < N_FAMILIES ? &families[i].info : NULL; }

const ember_family *ember_family_for_architecture(const char *architecture) {
    for (int i = 0; architecture && i < N_FAMILIES; i++)
        for (const char *const *a = families[i].info.architectures; *a; a++)
            if (strcmp(architecture, *a) == 0) return &families[i];
    return NULL;
}

void ember_family_architectures(char *buf, size_t cap) {
    if (cap == 0) return;
    buf[0] = '\0';
    for (int i = 0; i < N_FAMILIES; i++)
        for (const char *const *a = families[i].info.architectures; *a; a++) {
            if (buf[0]) strncat(buf, ", ", cap - strlen(buf) - 1);
            strncat(buf, *a, cap - strlen(buf) - 1);
        }
}
