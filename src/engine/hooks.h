/* hooks.h — how a forward pass reaches the hook points and the trace. The types (stages, the
 * evaluation context, views, the callback table) are public in include/ember.h so the bindings can
 * fill them; these are the call site helpers, kept inline so a NULL table or a NULL trace (the
 * disabled paths) costs a branch. */
#ifndef EMBER_HOOKS_H
#define EMBER_HOOKS_H

#include "ember.h"
#include "trace.h"

/* Whether a hook is set for `stage` (the disabled path: a NULL table). */
static inline bool ember_hook_wants(const ember_hooks *h, ember_stage stage) { return h && h->on_tensor[stage]; }

/* sae.c: the SAEs of h->saes that read or write at (stage, layer), over the view v the stage's
 * hook has just seen. */
ember_status ember_sae_sites_run(const ember_hooks *h, ember_stage stage, ember_eval_ctx *ctx, int64_t layer,
                                 ember_view *v, ember_error *err);

/* Calls the hook for `stage` if one is set over the caller's view v (so the caller can read
 * v->written afterwards), then the SAEs spliced in there; the disabled path is a pointer test. */
static inline ember_status ember_hook_call_view(const ember_hooks *h, ember_stage stage, ember_eval_ctx *ctx,
                                                int64_t layer, ember_view *v, ember_error *err) {
    if (!h) return EMBER_OK;
    ctx->layer_index = layer;
    ember_status st = h->on_tensor[stage] ? h->on_tensor[stage](h->user, stage, ctx, v, err) : EMBER_OK;
    if (st == EMBER_OK && h->saes) st = ember_sae_sites_run(h, stage, ctx, layer, v, err);
    return st;
}

/* The same over a view made here, holding n_heads attention heads (0: not a per-head stage). */
static inline ember_status ember_hook_call_heads(const ember_hooks *h, ember_stage stage, ember_eval_ctx *ctx,
                                                 int64_t layer, float *data, int64_t rows, int64_t cols,
                                                 int64_t n_heads, ember_error *err) {
    ember_view v = {.data = data, .rows = rows, .cols = cols, .n_heads = n_heads};
    return ember_hook_call_view(h, stage, ctx, layer, &v, err);
}

static inline ember_status ember_hook_call(const ember_hooks *h, ember_stage stage, ember_eval_ctx *ctx, int64_t layer,
                                           float *data, int64_t rows, int64_t cols, ember_error *err) {
    return ember_hook_call_heads(h, stage, ctx, layer, data, rows, cols, 0, err);
}

/* Records one executed op in the trace, if the session traces (t = s->trace): its output (rows,
 * cols) at data, the kernel kind that computed it (a product passes its weights w, else NULL).
 * Called after the op and before the stage's hook, so it records what the op computed. The
 * disabled path is a pointer test. */
static inline void ember_trace_step(ember_trace *t, const char *op, int64_t layer, ember_kop kop, const ember_matrix *w,
                                    const float *data, int64_t rows, int64_t cols) {
    if (t) ember_trace_emit(t, op, layer, kop, w, data, rows, cols);
}

#endif
