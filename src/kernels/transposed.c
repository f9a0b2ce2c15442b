/* transposed.c — the threaded transposed product dx = g W of the backward pass: items of (tile of
 * tokens, panel of columns) over the compute pool. Must not change what the set's kernel computes:
 * it only decides which thread computes which elements, each element whole. */
#include "kernels.h"

#include <string.h>

/* Tokens per item: a panel's weights are dequantized once per item and shared by its tokens. */
#define EMBER_MATMUL_T_TOKENS 64

typedef struct {
    ember_rows_t_fn rows_t;
    const ember_matrix *w;
    const float *g; /* (n_tok, n_out) */
    float *dx;      /* (n_tok, n_in) */
    int64_t n_tok, panel, n_panels;
} transposed_job;

int64_t ember_matmul_t_panel(ember_type t) {
    const ember_type_traits *tr = ember_type_traits_get((uint32_t)t);
    return tr && tr->block_size > 1 ? 256 : 64; /* 256: a multiple of every block size */
}

static void transposed_items(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const transposed_job *j = arg;
    for (int64_t it = begin; it < end; it++) {
        const int64_t t0 = it / j->n_panels * EMBER_MATMUL_T_TOKENS, c0 = it % j->n_panels * j->panel;
        const int64_t nt = j->n_tok - t0 < EMBER_MATMUL_T_TOKENS ? j->n_tok - t0 : EMBER_MATMUL_T_TOKENS;
        const int64_t c1 = j->w->n_in - c0 < j->panel ? j->w->n_in : c0 + j->panel;
        j->rows_t(j->w, j->g + t0 * j->w->n_out, j->dx + t0 * j->w->n_in, nt, c0, c1);
    }
}

bool ember_matmul_t(ember_compute *c, const ember_matrix *w, const float *g, float *dx, int64_t n_tok) {
    const ember_kernel_ops *ops = ember_compute_ops(c);
    const ember_rows_t_fn rows_t = ember_kernels_mm_t(ops, w->type);
    if (!rows_t) return false;
    if (n_tok <= 0 || w->n_in <= 0) return true;
    if (w->n_out <= 0) { /* an empty sum */
        memset(dx, 0, (size_t)(n_tok * w->n_in) * sizeof(float));
        return true;
    }
    transposed_job j = {.rows_t = rows_t, .w = w, .g = g, .dx = dx, .n_tok = n_tok};
    j.panel = ember_matmul_t_panel(w->type);
    j.n_panels = (w->n_in + j.panel - 1) / j.panel;
    const int64_t tiles = (n_tok + EMBER_MATMUL_T_TOKENS - 1) / EMBER_MATMUL_T_TOKENS;
    ember_compute_for(c, tiles * j.n_panels, 1, transposed_items, &j);
    return true;
}
