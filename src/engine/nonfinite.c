/* nonfinite.c — the locating pass's hooks and their report (nonfinite.h). In the logits and the
 * router's logits, -inf is a value, not a failure: it is how a hook bans a token or an expert; NaN,
 * +inf, or every logit of a row at -inf leave nothing to sample. */
#include "nonfinite.h"

#include <math.h>
#include <stdio.h>

/* The stages where -inf is a value a hook writes to ban a choice: a token (after_logits) or an expert
 * (moe_router, where the engine itself refuses a row that bans every expert). */
static bool bans_with_minus_inf(ember_stage stage) {
    return stage == EMBER_STAGE_AFTER_LOGITS || stage == EMBER_STAGE_MOE_ROUTER;
}

/* Whether x is unusable at this point: any non-finite activation, or NaN/+inf where -inf bans. */
static bool bad_value(float x, bool bans) { return bans ? (isnan(x) || x == INFINITY) : !isfinite(x); }

/* The first NaN or +inf logit (or 0 when every logit is -inf), else -1: the one check on the hot
 * path. */
int64_t ember_logits_first_nonfinite(const float *x, int64_t n) {
    bool all_minus_inf = true;
    for (int64_t i = 0; i < n; i++) {
        if (bad_value(x[i], true)) return i;
        all_minus_inf = all_minus_inf && x[i] == -INFINITY;
    }
    return all_minus_inf ? 0 : -1;
}

/* The rows of view v the locator checks: a batch's sequence, its row of a logits stage, or all. */
static void checked_rows(const ember_nonfinite_locator *lc, ember_stage stage, const ember_view *v, int64_t *r0,
                         int64_t *r1) {
    const bool logits = stage == EMBER_STAGE_AFTER_LOGITS || stage == EMBER_STAGE_BEFORE_LOGITS;
    *r0 = 0, *r1 = v->rows;
    if (logits && lc->logits_row >= 0) {
        if (lc->logits_row < v->rows) *r0 = lc->logits_row, *r1 = lc->logits_row + 1;
    } else if (stage != EMBER_STAGE_ATTENTION_PATTERN && lc->rows >= 0 && lc->row0 + lc->rows <= v->rows)
        *r0 = lc->row0, *r1 = lc->row0 + lc->rows; /* token rows (the logits of every row too) */
}

static ember_status locate_hook(void *u, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                                ember_error *err) {
    ember_nonfinite_locator *lc = u;
    if (lc->user && lc->user->on_tensor[stage]) {
        ember_status st = lc->user->on_tensor[stage](lc->user->user, stage, ctx, v, err);
        if (st != EMBER_OK) return st;
    }
    int64_t r0, r1;
    checked_rows(lc, stage, v, &r0, &r1);
    const int64_t first = r0 * v->cols, end = r1 * v->cols;
    int64_t bad = -1;
    for (int64_t i = first; i < end && bad < 0; i++)
        if (bad_value(v->data[i], bans_with_minus_inf(stage))) bad = i;
    if (bad < 0 && stage == EMBER_STAGE_AFTER_LOGITS) { /* every logit at -inf is as bad as a NaN */
        bool all = end > first;
        for (int64_t i = first; i < end && all; i++) all = v->data[i] == -INFINITY;
        if (all) bad = first;
    }
    if (bad < 0) return EMBER_OK;
    lc->found = true;
    lc->stage = stage;
    lc->layer = ctx->layer_index;
    lc->row = bad / v->cols - r0;
    lc->col = bad % v->cols;
    lc->head = -1; /* attention_pattern: rows in n_heads blocks; attention_heads: columns */
    if (v->n_heads > 0 && stage == EMBER_STAGE_ATTENTION_PATTERN) {
        lc->head = lc->row / (v->rows / v->n_heads);
        lc->row %= v->rows / v->n_heads; /* the query's token row within its head's block */
    }
    if (v->n_heads > 0 && stage == EMBER_STAGE_ATTENTION_HEADS) lc->head = lc->col / (v->cols / v->n_heads);
    lc->value = v->data[bad];
    return EMBER_ERR_NONFINITE; /* stops the pass here */
}

ember_hooks ember_nonfinite_hooks(ember_nonfinite_locator *lc) {
    const ember_hooks *user = lc->user;
    ember_hooks all = {.user = lc, .saes = user ? user->saes : NULL}; /* the same splices */
    /* Every stage but attention_pattern, which only where the experiment hooks it (its buffer
     * exists only then): the per-head attention_heads view names the head a NaN query or key
     * poisoned, mlp_activation the MLP's inside. These views are the engine's own buffers, so
     * checking them changes nothing the pass computes. */
    for (int i = 0; i < EMBER_STAGE_COUNT; i++)
        if (i != EMBER_STAGE_ATTENTION_PATTERN || (user && user->on_tensor[i])) all.on_tensor[i] = locate_hook;
    return all;
}

void ember_nonfinite_where(const ember_nonfinite_locator *lc, int64_t head_col, float head_value, char *out,
                           size_t cap) {
    /* from a finite final hidden state, the head's own product made it (before softcap and hooks) */
    if (head_col >= 0 && (!lc->found || lc->stage == EMBER_STAGE_AFTER_LOGITS))
        snprintf(out, cap, "first non-finite value at the LM head's product, before after_logits (column %lld = %g)",
                 (long long)head_col, (double)head_value);
    else if (!lc->found) snprintf(out, cap, "a second pass did not reproduce it");
    else if (lc->layer >= 0) {
        char head[32] = "";
        if (lc->head >= 0) snprintf(head, sizeof head, ", head %lld", (long long)lc->head);
        snprintf(out, cap, "first non-finite value at %s of layer %lld%s (0-based token row %lld, column %lld = %g)",
                 ember_stage_name(lc->stage), (long long)lc->layer, head, (long long)lc->row, (long long)lc->col,
                 (double)lc->value);
    } else
        snprintf(out, cap, "first non-finite value at %s (column %lld = %g)", ember_stage_name(lc->stage),
                 (long long)lc->col, (double)lc->value);
}
