/* pass.c — what every family forward does the same way over the sequences of a pass: the
 * embedding prologue, the start of a layer, and the per-sequence steps (RoPE at each sequence's
 * positions, each sequence's keys and values into its own cache). */
#include "backward.h"
#include "rows.h"

#include <string.h>

ember_status ember_pass_embed(const ember_pass *p, float scale, ember_error *err) {
    ember_session *s = p->host;
    const ember_model *m = s->model;
    ember_workspace *w = &s->ws;
    const int64_t d = m->n_embd;
    for (int64_t t = 0; t < p->n; t++) {
        ember_embedding_row(m, &m->tok_embd, p->ids[t], w->x + t * d);
        if (scale != 1.0f)
            for (int64_t i = 0; i < d; i++) w->x[t * d + i] *= scale;
    }
    for (int64_t i = 0; m->pos_embd.data && i < p->n_seq; i++) { /* learned positions (gpt2) */
        const ember_pass_seq *q = &p->seq[i];
        if (q->s->pos + q->n > m->n_ctx_train)
            return ember_error_set(err, EMBER_ERR_CONTEXT, "%s: position %lld is beyond the %lld learned positions",
                                   m->architecture, (long long)(q->s->pos + q->n - 1), (long long)m->n_ctx_train);
        for (int64_t t = 0; t < q->n; t++) {
            ember_embedding_row(m, &m->pos_embd, q->s->pos + t, w->xn);
            ember_add_into(w->x + (q->row + t) * d, w->xn, d);
        }
    }
    ember_trace_step(s->trace, "embed", -1, EMBER_KOP_GET_ROW, NULL, w->x, p->n, d);
    return EMBER_OK;
}

ember_status ember_pass_layer_start(const ember_pass *p, const ember_hooks *hooks, ember_eval_ctx *ctx, int64_t l,
                                    ember_error *err) {
    ember_session *s = p->host;
    const int64_t d = s->model->n_embd;
    ember_status st = ember_hook_call(hooks, EMBER_STAGE_BEFORE_LAYER, ctx, l, s->ws.x, p->n, d, err);
    if (st == EMBER_OK) ember_tape_keep(s, l, EMBER_TAPE_X, s->ws.x, p->n, d);
    return st;
}

void ember_pass_norm_rope(const ember_pass *p, float *x, int64_t n_heads, int64_t hd, const float *norm, float eps,
                          int64_t n_rot, float base, bool neox, const float *freq_factors) {
    const ember_model *m = p->host->model;
    for (int64_t i = 0; i < p->n_seq; i++) {
        const ember_pass_seq *q = &p->seq[i];
        ember_rows_norm_rope(m, x + q->row * n_heads * hd, q->n, n_heads, hd, norm, eps, n_rot, q->s->pos, base, neox,
                             freq_factors);
    }
}

void ember_pass_kv_store(const ember_pass *p, int64_t l, const float *k, const float *v, int64_t row_stride) {
    for (int64_t i = 0; i < p->n_seq; i++) {
        const ember_pass_seq *q = &p->seq[i];
        ember_kv_store(q->s, l, q->s->pos, q->n, k + q->row * row_stride, v + q->row * row_stride, row_stride);
    }
}
