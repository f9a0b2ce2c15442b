/* backward.c — what every family's backward pass shares: the tape the forward keeps, the
 * transposed products, norm derivatives over rows, RoPE transposed, the attention backward over a
 * layer's cache. Must not know a family's block (the family's backward file does). */
#include "backward.h"
#include "rows.h"

#include <stdlib.h>
#include <string.h>

ember_status ember_tape_new(const ember_model *m, int64_t n, uint32_t mask, ember_tape **out, ember_error *err) {
    *out = NULL;
    ember_tape *t = calloc(1, sizeof *t);
    const size_t slots = (size_t)(m->n_layer + 1) * EMBER_TAPE_SLOTS;
    if (t) t->buf = calloc(slots, sizeof *t->buf);
    if (t && t->buf) t->width = calloc(slots, sizeof *t->width);
    if (!t || !t->buf || !t->width) {
        ember_tape_free(t);
        return ember_error_set(err, EMBER_ERR_NOMEM, "gradients: out of memory for the tape");
    }
    t->n_layer = m->n_layer;
    t->n = n;
    t->mask = mask;
    *out = t;
    return EMBER_OK;
}

void ember_tape_free(ember_tape *t) {
    if (!t) return;
    for (int64_t i = 0; t->buf && i < (t->n_layer + 1) * EMBER_TAPE_SLOTS; i++) free(t->buf[i]);
    free(t->buf);
    free(t->width);
    free(t);
}

static int64_t tape_index(const ember_tape *t, int64_t layer, ember_tape_slot slot) {
    return (layer < 0 ? t->n_layer : layer) * EMBER_TAPE_SLOTS + slot;
}

/* Slot (layer, slot)'s buffer of width values a row for rows pos .. pos + rows - 1, allocated for
 * the whole prompt at its first use; NULL (and the tape failed) when that cannot be. */
static float *tape_rows(ember_tape *t, int64_t pos, int64_t rows, int64_t layer, ember_tape_slot slot, int64_t width) {
    const int64_t i = tape_index(t, layer, slot);
    if (t->failed || pos + rows > t->n) {
        t->failed = true;
        return NULL;
    }
    if (!t->buf[i]) { /* the first slice of the prompt: room for all of it */
        t->buf[i] = malloc((size_t)(t->n * width) * sizeof(float));
        if (!t->buf[i]) {
            t->failed = true;
            return NULL;
        }
        t->width[i] = width;
        t->bytes += (size_t)(t->n * width) * sizeof(float);
    }
    if (t->width[i] != width) { /* a family keeping one slot at two widths: its bug */
        t->failed = true;
        return NULL;
    }
    return t->buf[i];
}

void ember_tape_put(ember_tape *t, int64_t pos, int64_t layer, ember_tape_slot slot, const float *data, int64_t rows,
                    int64_t width) {
    float *buf = tape_rows(t, pos, rows, layer, slot, width);
    if (buf) memcpy(buf + pos * width, data, (size_t)(rows * width) * sizeof(float));
}

void ember_tape_put_cols(ember_tape *t, int64_t row, int64_t layer, ember_tape_slot slot, int64_t col0,
                         const float *data, int64_t cols, int64_t width) {
    float *buf = tape_rows(t, row, 1, layer, slot, width);
    if (buf) memcpy(buf + row * width + col0, data, (size_t)cols * sizeof(float));
}

const float *ember_tape_get(const ember_tape *t, int64_t layer, ember_tape_slot slot) {
    return t->buf[tape_index(t, layer, slot)];
}

void ember_backward_add(float *x, const float *d, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] += d[i];
}

void ember_backward_product(ember_backward *b, const ember_matrix *w, const float *g, float *dx, bool add) {
    float *into = add ? b->prod : dx;
    if (!ember_matmul_t(b->m->compute, w, g, into, b->n)) {
        b->missing = w->type; /* reported by the driver; every set has them all today */
        memset(into, 0, (size_t)(b->n * w->n_in) * sizeof(float));
    }
    if (add) ember_backward_add(dx, into, b->n * w->n_in);
}

typedef struct {
    const ember_backward *b;
    bool layer, add;
    float *dx;
    const float *dy, *x, *w;
    int64_t width;
    float eps;
} norm_job;

static void norm_rows(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const norm_job *j = arg;
    const bool frozen = j->b->freeze_norm;
    for (int64_t r = begin; r < end; r++) {
        float *dx = j->dx + r * j->width, *tmp = j->b->prod + r * j->width;
        const float *dy = j->dy + r * j->width, *x = j->x + r * j->width;
        float *into = j->add ? tmp : dx;
        if (j->layer) ember_layernorm_backward(into, dy, x, j->w, j->width, j->eps, frozen);
        else ember_rmsnorm_backward(into, dy, x, j->w, j->width, j->eps, frozen);
        if (j->add) ember_backward_add(dx, tmp, j->width);
    }
}

void ember_backward_norm(ember_backward *b, bool layer, float *dx, const float *dy, const float *x, const float *w,
                         int64_t rows, int64_t width, float eps, bool add) {
    norm_job j = {.b = b, .layer = layer, .add = add, .dx = dx, .dy = dy, .x = x, .w = w, .width = width, .eps = eps};
    ember_compute_for(b->m->compute, rows, 8, norm_rows, &j);
}

/* RoPE rotates each pair by theta = position * frequency; its transpose rotates by -theta, which
 * the same kernel computes at the negated position (cos is even, sin odd, in libm exactly). */
void ember_backward_rope(ember_backward *b, float *x, int64_t n_heads, int64_t hd, int64_t n_rot, float base, bool neox,
                         const float *freq_factors) {
    if (n_rot <= 0) return;
    for (int64_t t = 0; t < b->n; t++)
        b->m->ops->rope_heads(x + t * n_heads * hd, n_heads, hd, n_rot, -t, base, neox, freq_factors);
}

void ember_backward_attention(ember_backward *b, int64_t l, const ember_layer *L, float scale, int64_t window,
                              const float *q, const float *d_att, float *dq, float *dk, float *dv) {
    const ember_model *m = b->m;
    const ember_attention_args fwd = ember_attention_layer_args(b->s, L, scale, window, q, NULL, 0, b->n);
    const bool pattern = ember_backward_wants(b, EMBER_STAGE_ATTENTION_PATTERN, l);
    const ember_attention_backward_args a = {.fwd = &fwd,
                                             .d_out = d_att,
                                             .dq = dq,
                                             .dk = dk,
                                             .dv = dv,
                                             .d_pattern = pattern ? b->pattern : NULL,
                                             .stats = b->stats,
                                             .rows = b->rows,
                                             .frozen = b->freeze_attention};
    if (b->freeze_attention) { /* nothing flows through the softmax */
        memset(dq, 0, (size_t)(b->n * m->n_head * L->head_dim) * sizeof(float));
        memset(dk, 0, (size_t)(b->n * L->kv_dim) * sizeof(float));
    }
    ember_compute_attention_backward(m->compute, &a);
    if (pattern) ember_backward_keep(b, EMBER_STAGE_ATTENTION_PATTERN, l, b->pattern, m->n_head * b->n, b->n);
}

void ember_backward_attention_block(ember_backward *b, int64_t l, const ember_backward_rope_args *r,
                                    const float *post_norm) {
    const ember_model *m = b->m;
    const ember_layer *L = &m->layers[l];
    const int64_t d = m->n_embd, n = b->n, hd = L->head_dim, q_dim = m->n_head * hd;
    const float *q_raw = ember_tape_get(b->tape, l, EMBER_TAPE_Q);
    ember_backward_keep(b, EMBER_STAGE_AFTER_ATTENTION, l, b->gx, n, d);
    ember_backward_product(b, &L->wo, ember_backward_post_norm(b, l, EMBER_TAPE_ATTN, post_norm), b->qa, false);
    ember_backward_keep(b, EMBER_STAGE_ATTENTION_HEADS, l, b->qa, n, q_dim);
    /* Q as attention read it: the kept projection through the forward's own norm and RoPE */
    memcpy(b->qb, q_raw, (size_t)(n * q_dim) * sizeof(float));
    ember_rows_norm_rope(m, b->qb, n, m->n_head, hd, L->q_norm, m->norm_eps, r->n_rot, 0, r->base, r->neox, r->freqs);
    ember_backward_attention(b, l, L, m->attn_scale, L->sliding ? m->window : 0, b->qb, b->qa, b->qc, b->ka, b->va);
    ember_backward_product(b, &L->wv, b->va, b->t1, false);
    if (!b->freeze_attention) { /* frozen: no gradient reaches Q or K */
        ember_backward_rope(b, b->qc, m->n_head, hd, r->n_rot, r->base, r->neox, r->freqs);
        ember_backward_rope(b, b->ka, L->n_head_kv, hd, r->n_rot, r->base, r->neox, r->freqs);
        float *dq = b->qc, *dk = b->ka;
        if (L->q_norm) { /* per-head RMSNorm of each head's hd values */
            ember_backward_norm(b, false, b->qb, b->qc, q_raw, L->q_norm, n * m->n_head, hd, m->norm_eps, false);
            ember_backward_norm(b, false, b->kb, b->ka, ember_tape_get(b->tape, l, EMBER_TAPE_K), L->k_norm,
                                n * L->n_head_kv, hd, m->norm_eps, false);
            dq = b->qb;
            dk = b->kb;
        }
        ember_backward_product(b, &L->wq, dq, b->t1, true);
        ember_backward_product(b, &L->wk, dk, b->t1, true);
    }
    ember_backward_block_input(b, l, false, EMBER_TAPE_X, L->attn_norm);
}

const float *ember_backward_post_norm(ember_backward *b, int64_t l, ember_tape_slot slot, const float *w) {
    if (!w) return b->gx;
    const int64_t d = b->m->n_embd;
    ember_backward_norm(b, false, b->t0, b->gx, ember_tape_get(b->tape, l, slot), w, b->n, d, b->m->norm_eps, false);
    return b->t0;
}

void ember_backward_mlp_output(ember_backward *b, int64_t l, const float *post_norm) {
    const ember_layer *L = &b->m->layers[l];
    const int64_t d = b->m->n_embd, n = b->n;
    ember_backward_keep(b, EMBER_STAGE_AFTER_LAYER, l, b->gx, n, d);
    ember_backward_keep(b, EMBER_STAGE_AFTER_MLP, l, b->gx, n, d);
    ember_backward_product(b, &L->w_down, ember_backward_post_norm(b, l, EMBER_TAPE_MLP, post_norm), b->f0, false);
    ember_backward_keep(b, EMBER_STAGE_MLP_ACTIVATION, l, b->f0, n, L->n_ff);
}

void ember_backward_block_input(ember_backward *b, int64_t l, bool layer, ember_tape_slot slot, const float *w) {
    const int64_t d = b->m->n_embd;
    ember_backward_norm(b, layer, b->gx, b->t1, ember_tape_get(b->tape, l, slot), w, b->n, d, b->m->norm_eps, true);
    if (slot == EMBER_TAPE_X) ember_backward_keep(b, EMBER_STAGE_BEFORE_LAYER, l, b->gx, b->n, d);
}

ember_status ember_backward_layers(ember_backward *b, ember_backward_block mlp, ember_backward_block attention) {
    for (int64_t l = b->m->n_layer - 1; l >= 0; l--) {
        mlp(b, l);
        attention(b, l);
    }
    ember_backward_keep_embeddings(b, b->gx);
    return EMBER_OK;
}
