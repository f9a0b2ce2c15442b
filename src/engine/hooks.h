/* hooks.h — how a forward pass reaches the hook points. The types (stages, the evaluation
 * context, views, the callback table) are public in include/ember.h so the bindings can fill them;
 * this is the one call site helper, kept inline so a NULL table (the disabled path) costs a branch. */
#ifndef EMBER_HOOKS_H
#define EMBER_HOOKS_H

#include "ember.h"

/* Calls the hook for `stage` if one is set; the disabled path is a pointer test. */
static inline ember_status ember_hook_call(const ember_hooks *h, ember_stage stage, ember_eval_ctx *ctx,
                                           int64_t layer, float *data, int64_t rows, int64_t cols,
                                           ember_error *err) {
    if (!h || !h->on_tensor[stage]) return EMBER_OK;
    ctx->layer_index = layer;
    ember_view v = {.data = data, .rows = rows, .cols = cols};
    return h->on_tensor[stage](h->user, stage, ctx, &v, err);
}

#endif
