/* stages.c — the stage table: one row per hook stage, in execution order (name, order, whether it
 * is per layer, inside a block or only an SAE splice's, its view's rows, width and head layout, the
 * families that have it, its TransformerLens names). Every other copy (engine, bindings, lib/ember)
 * asks this file; it must not compute a view. */
#include "ember.h"

#include <stddef.h>

/* Stages inside a layer's attention block, its MLP block, and on the residual stream. */
#define RESIDUAL(n, o, hook, short_name)                                                                               \
    { .name = n, .order = o, .in_layer = true, .width = EMBER_WIDTH_HIDDEN, .tl_hook = hook, .tl_short = short_name }

static const char *const pattern_aliases[] = {"attn", NULL};
static const char *const post_aliases[] = {"mlp_post", NULL};
static const char *const moe_families[] = {"qwen3moe", NULL};

static const ember_stage_info stages[EMBER_STAGE_COUNT] = {
    [EMBER_STAGE_BEFORE_LAYER] = RESIDUAL("before_layer", 0, "hook_resid_pre", "resid_pre"),
    [EMBER_STAGE_ATTENTION_PATTERN] = {.name = "attention_pattern",
                                       .order = 1,
                                       .in_layer = true,
                                       .inside_block = true,
                                       .rows = EMBER_ROWS_HEADS_X_TOKENS,
                                       .width = EMBER_WIDTH_PATTERN,
                                       .heads = EMBER_HEADS_ROWS,
                                       .tl_hook = "attn.hook_pattern",
                                       .tl_short = "pattern",
                                       .tl_aliases = pattern_aliases},
    [EMBER_STAGE_ATTENTION_HEADS] = {.name = "attention_heads",
                                     .order = 2,
                                     .in_layer = true,
                                     .inside_block = true,
                                     .width = EMBER_WIDTH_HEADS_X_HEAD_DIM,
                                     .heads = EMBER_HEADS_COLUMNS,
                                     .tl_hook = "attn.hook_z",
                                     .tl_short = "z"},
    [EMBER_STAGE_AFTER_ATTENTION] = RESIDUAL("after_attention", 3, "hook_attn_out", "attn_out"),
    /* an MoE layer's router logits, before the softmax and top-k that read them (TransformerLens
     * has no hook there) */
    [EMBER_STAGE_MOE_ROUTER] = {.name = "moe_router",
                                .order = 4,
                                .in_layer = true,
                                .inside_block = true,
                                .width = EMBER_WIDTH_N_EXPERTS,
                                .families = moe_families},
    [EMBER_STAGE_MLP_ACTIVATION] = {.name = "mlp_activation",
                                    .order = 5,
                                    .in_layer = true,
                                    .inside_block = true,
                                    .width = EMBER_WIDTH_N_FF,
                                    .tl_hook = "mlp.hook_post",
                                    .tl_short = "post",
                                    .tl_aliases = post_aliases},
    [EMBER_STAGE_AFTER_MLP] = RESIDUAL("after_mlp", 6, "hook_mlp_out", "mlp_out"),
    [EMBER_STAGE_AFTER_LAYER] = RESIDUAL("after_layer", 7, "hook_resid_post", "resid_post"),
    /* right after the stage its SAE reads, wherever that is: its order is only its place here; no
     * TransformerLens hook (SAELens: <the hook it reads>.hook_sae_acts_post) */
    [EMBER_STAGE_SAE_FEATURES] =
        {.name = "sae_features", .order = 8, .in_layer = true, .width = EMBER_WIDTH_D_SAE, .sae_only = true},
    [EMBER_STAGE_BEFORE_LOGITS] = {.name = "before_logits",
                                   .order = 9,
                                   .rows = EMBER_ROWS_LAST,
                                   .width = EMBER_WIDTH_HIDDEN,
                                   .tl_hook = "ln_final.hook_normalized",
                                   .tl_short = "normalized"},
    /* the model's output logits: TransformerLens has no hook there */
    [EMBER_STAGE_AFTER_LOGITS] = {.name = "after_logits",
                                  .order = 10,
                                  .rows = EMBER_ROWS_LAST,
                                  .width = EMBER_WIDTH_VOCAB},
};

const ember_stage_info *ember_stage_get(ember_stage s) { return (unsigned)s < EMBER_STAGE_COUNT ? &stages[s] : NULL; }

const char *ember_stage_name(ember_stage s) { return (unsigned)s < EMBER_STAGE_COUNT ? stages[s].name : NULL; }

int ember_stage_count(void) { return EMBER_STAGE_COUNT; }

bool ember_stage_inside_block(ember_stage s) { return (unsigned)s < EMBER_STAGE_COUNT && stages[s].inside_block; }

bool ember_stage_sae(ember_stage s) { return (unsigned)s < EMBER_STAGE_COUNT && stages[s].sae_only; }

const char *ember_stage_rows_name(ember_stage_rows r) {
    static const char *const names[] = {"tokens", "last", "heads*tokens"};
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : NULL;
}

const char *ember_stage_width_name(ember_stage_width w) {
    static const char *const names[] = {"hidden", "n_ff", "heads*head_dim", "vocab", "pattern", "d_sae", "n_experts"};
    return (unsigned)w < sizeof names / sizeof names[0] ? names[w] : NULL;
}

const char *ember_stage_heads_name(ember_stage_heads h) {
    static const char *const names[] = {"none", "rows", "columns"};
    return (unsigned)h < sizeof names / sizeof names[0] ? names[h] : NULL;
}
