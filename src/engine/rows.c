/* rows.c — the row-wise small ops of a forward pass split by token over the compute pool. Each row
 * is computed by the same kernel-table call as on one thread, so results do not change with the
 * thread count; a single token (decode) runs on the caller without a pool job. */
#include "rows.h"

/* Tokens per claimed chunk: enough work per chunk that the pool's hand-off stays negligible. */
#define ROWS_GRAIN 8

typedef struct {
    const ember_kernel_ops *ops;
    float *y;
    const float *x, *w, *b, *norm, *freqs;
    int64_t d, n_heads, hd, n_rot, pos0;
    float eps, base;
    bool neox, gelu;
} rows_job;

static void rmsnorm_part(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const rows_job *j = arg;
    for (int64_t t = begin; t < end; t++) j->ops->rmsnorm(j->y + t * j->d, j->x + t * j->d, j->w, j->d, j->eps);
}

void ember_rows_rmsnorm(const ember_model *m, float *y, const float *x, const float *w, int64_t n, int64_t d,
                        float eps) {
    rows_job j = {.ops = m->ops, .y = y, .x = x, .w = w, .d = d, .eps = eps};
    ember_compute_for(m->compute, n, ROWS_GRAIN, rmsnorm_part, &j);
}

static void layernorm_part(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const rows_job *j = arg;
    for (int64_t t = begin; t < end; t++) j->ops->layernorm(j->y + t * j->d, j->x + t * j->d, j->w, j->b, j->d, j->eps);
}

void ember_rows_layernorm(const ember_model *m, float *y, const float *x, const float *w, const float *b, int64_t n,
                          int64_t d, float eps) {
    rows_job j = {.ops = m->ops, .y = y, .x = x, .w = w, .b = b, .d = d, .eps = eps};
    ember_compute_for(m->compute, n, ROWS_GRAIN, layernorm_part, &j);
}

static void norm_rope_part(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const rows_job *j = arg;
    for (int64_t t = begin; t < end; t++) {
        float *xt = j->y + t * j->n_heads * j->hd;
        if (j->norm)
            for (int64_t h = 0; h < j->n_heads; h++)
                j->ops->rmsnorm(xt + h * j->hd, xt + h * j->hd, j->norm, j->hd, j->eps);
        if (j->n_rot > 0) j->ops->rope_heads(xt, j->n_heads, j->hd, j->n_rot, j->pos0 + t, j->base, j->neox, j->freqs);
    }
}

void ember_rows_norm_rope(const ember_model *m, float *x, int64_t n, int64_t n_heads, int64_t hd, const float *norm,
                          float eps, int64_t n_rot, int64_t pos0, float base, bool neox, const float *freq_factors) {
    rows_job j = {.ops = m->ops,
                  .y = x,
                  .norm = norm,
                  .freqs = freq_factors,
                  .n_heads = n_heads,
                  .hd = hd,
                  .n_rot = n_rot,
                  .pos0 = pos0,
                  .eps = eps,
                  .base = base,
                  .neox = neox};
    ember_compute_for(m->compute, n, ROWS_GRAIN, norm_rope_part, &j);
}

static void gated_part(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const rows_job *j = arg;
    float *g = j->y + begin * j->d;
    const float *u = j->x ? j->x + begin * j->d : NULL;
    if (j->gelu) j->ops->gelu_mul(g, u, (end - begin) * j->d);
    else j->ops->silu_mul(g, u, (end - begin) * j->d);
}

void ember_rows_silu_mul(const ember_model *m, float *g, const float *u, int64_t n, int64_t width) {
    rows_job j = {.ops = m->ops, .y = g, .x = u, .d = width};
    ember_compute_for(m->compute, n, ROWS_GRAIN, gated_part, &j);
}

void ember_rows_gelu_mul(const ember_model *m, float *g, const float *u, int64_t n, int64_t width) {
    rows_job j = {.ops = m->ops, .y = g, .x = u, .d = width, .gelu = true};
    ember_compute_for(m->compute, n, ROWS_GRAIN, gated_part, &j);
}
