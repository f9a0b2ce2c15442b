/* attention_backward.c — the backward of causal (optionally sliding-window) attention over a KV
 * cache: the gradients of the queries, of the pass's own keys and values, and of the pattern, in
 * two threaded passes of plain scalar C shared by every kernel set (kernels.h gives the maths and
 * the orders). Must not compute the forward attention itself, nor depend on the thread count. */
#include "kernels.h"

#include <math.h>
#include <string.h>

typedef struct {
    const ember_attention_backward_args *b;
    size_t esize;   /* bytes of one cache element */
    int64_t n_keys; /* pos0 + n */
} bwd_job;

static const uint8_t *kv_row(const bwd_job *j, const void *base, int64_t g, int64_t key) {
    const ember_attention_args *a = j->b->fwd;
    return (const uint8_t *)base + (size_t)(g * a->kv_head_stride + key * a->kv_stride) * j->esize;
}

/* (x . cache row) in f32, element by element: the score q . k (then scaled) and dp = d_out . v. */
static float dot_row(const bwd_job *j, const float *x, const uint8_t *row) {
    const ember_attention_args *a = j->b->fwd;
    float dot = 0.0f;
    for (int64_t i = 0; i < a->hd; i++) dot += x[i] * ember_kv_element(a->kv_type, row, i);
    return dot;
}

/* The keys query t sees: first..p. */
static void visible(const ember_attention_args *a, int64_t t, int64_t *first, int64_t *p) {
    *p = a->pos0 + t;
    *first = a->window > 0 && *p - a->window + 1 > 0 ? *p - a->window + 1 : 0;
}

/* Pass 1, items (head, token): the row's probabilities (kept as max and sum), dp, D, the pattern's
 * gradient and dq. rows: this thread's 2 * n_keys floats. */
static void rows_items(void *arg, int64_t begin, int64_t end, int tid) {
    const bwd_job *j = arg;
    const ember_attention_backward_args *b = j->b;
    const ember_attention_args *a = b->fwd;
    const int64_t hd = a->hd, group = a->n_head / a->n_head_kv;
    float *s = b->rows + (int64_t)tid * 2 * j->n_keys, *dp = s + j->n_keys;
    for (int64_t it = begin; it < end; it++) {
        const int64_t h = it / a->n, t = it % a->n, g = h / group;
        int64_t first, p;
        visible(a, t, &first, &p);
        const float *q = a->q + (t * a->n_head + h) * hd, *dout = b->d_out + (t * a->n_head + h) * hd;
        float mx = -INFINITY, sum = 0.0f, D = 0.0f;
        for (int64_t k = first; k <= p; k++) {
            s[k] = dot_row(j, q, kv_row(j, a->k, g, k)) * a->scale;
            if (s[k] > mx) mx = s[k];
        }
        for (int64_t k = first; k <= p; k++) {
            s[k] = expf(s[k] - mx);
            sum += s[k];
        }
        for (int64_t k = first; k <= p; k++) {
            s[k] = s[k] / sum; /* p_k */
            dp[k] = dot_row(j, dout, kv_row(j, a->v, g, k));
            D += s[k] * dp[k];
        }
        float *st = b->stats + (h * a->n + t) * 3;
        st[0] = mx;
        st[1] = sum;
        st[2] = D;
        if (b->d_pattern) {
            float *row = b->d_pattern + (h * a->n + t) * j->n_keys;
            for (int64_t k = 0; k < j->n_keys; k++)
                row[k] = k >= first && k <= p ? dp[k] : dot_row(j, dout, kv_row(j, a->v, g, k));
        }
        if (b->frozen) continue;
        float *dq = b->dq + (t * a->n_head + h) * hd;
        memset(dq, 0, (size_t)hd * sizeof(float));
        for (int64_t k = first; k <= p; k++) {
            const float ds = s[k] * (dp[k] - D) * a->scale;
            const uint8_t *kr = kv_row(j, a->k, g, k);
            for (int64_t i = 0; i < hd; i++) dq[i] += ds * ember_kv_element(a->kv_type, kr, i);
        }
    }
}

/* Pass 2, items (KV head, key of the pass): dk and dv of that key over every query head of its KV
 * head and every query that sees it, the probabilities recomputed as pass 1 computed them. */
static void keys_items(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    const bwd_job *j = arg;
    const ember_attention_backward_args *b = j->b;
    const ember_attention_args *a = b->fwd;
    const int64_t hd = a->hd, group = a->n_head / a->n_head_kv, kv_dim = a->n_head_kv * hd;
    for (int64_t it = begin; it < end; it++) {
        const int64_t g = it / a->n, key = a->pos0 + it % a->n;
        const uint8_t *kr = kv_row(j, a->k, g, key), *vr = kv_row(j, a->v, g, key);
        float *dk = b->frozen ? NULL : b->dk + (it % a->n) * kv_dim + g * hd,
              *dv = b->dv + (it % a->n) * kv_dim + g * hd;
        if (dk) memset(dk, 0, (size_t)hd * sizeof(float));
        memset(dv, 0, (size_t)hd * sizeof(float));
        for (int64_t h = g * group; h < (g + 1) * group; h++)
            for (int64_t t = key - a->pos0; t < a->n; t++) {
                int64_t first, p;
                visible(a, t, &first, &p);
                if (key < first) continue; /* outside this query's window */
                const float *q = a->q + (t * a->n_head + h) * hd, *dout = b->d_out + (t * a->n_head + h) * hd;
                const float *st = b->stats + (h * a->n + t) * 3;
                const float pk = expf(dot_row(j, q, kr) * a->scale - st[0]) / st[1];
                for (int64_t i = 0; i < hd; i++) dv[i] += pk * dout[i];
                if (!dk) continue;
                const float ds = pk * (dot_row(j, dout, vr) - st[2]) * a->scale;
                for (int64_t i = 0; i < hd; i++) dk[i] += ds * q[i];
            }
    }
}

int64_t ember_attention_backward_scratch(int n_threads, int64_t n_keys) { return (int64_t)n_threads * 2 * n_keys; }

void ember_compute_attention_backward(ember_compute *c, const ember_attention_backward_args *b) {
    const ember_attention_args *a = b->fwd;
    bwd_job j = {.b = b, .esize = ember_type_row_size(a->kv_type, 1), .n_keys = a->pos0 + a->n};
    ember_compute_for(c, a->n_head * a->n, 1, rows_items, &j);
    ember_compute_for(c, a->n_head_kv * a->n, 1, keys_items, &j);
}
