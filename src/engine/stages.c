/* stages.c — the one list of hook stage names, in execution order within an evaluation (sae_features
 * runs right after the stage its SAE reads), which of them sit inside a layer's blocks and which
 * exist only where an SAE is spliced in. Every other copy (the bindings, lib/ember) asks this file;
 * it must not know what a stage carries. */
#include "ember.h"

#include <stddef.h>

static const char *const stage_names[EMBER_STAGE_COUNT] = {
    [EMBER_STAGE_BEFORE_LAYER] = "before_layer",       [EMBER_STAGE_ATTENTION_PATTERN] = "attention_pattern",
    [EMBER_STAGE_ATTENTION_HEADS] = "attention_heads", [EMBER_STAGE_AFTER_ATTENTION] = "after_attention",
    [EMBER_STAGE_MLP_ACTIVATION] = "mlp_activation",   [EMBER_STAGE_AFTER_MLP] = "after_mlp",
    [EMBER_STAGE_AFTER_LAYER] = "after_layer",         [EMBER_STAGE_SAE_FEATURES] = "sae_features",
    [EMBER_STAGE_BEFORE_LOGITS] = "before_logits",     [EMBER_STAGE_AFTER_LOGITS] = "after_logits",
};

const char *ember_stage_name(ember_stage s) { return (unsigned)s < EMBER_STAGE_COUNT ? stage_names[s] : NULL; }

int ember_stage_count(void) { return EMBER_STAGE_COUNT; }

bool ember_stage_sae(ember_stage s) { return s == EMBER_STAGE_SAE_FEATURES; }

bool ember_stage_inside_block(ember_stage s) {
    return s == EMBER_STAGE_ATTENTION_PATTERN || s == EMBER_STAGE_ATTENTION_HEADS || s == EMBER_STAGE_MLP_ACTIVATION;
}
