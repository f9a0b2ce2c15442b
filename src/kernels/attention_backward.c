/* attention_backward.c — the backward of causal (optionally sliding-window) attention over a KV
 * cache: the gradients of the queries, of the pass's own keys and values, and of the pattern, in
 * two threaded passes of plain scalar C shared by every kernel set (kernels.h gives the maths and
 * the orders). Must not compute the forward attention itself, nor depend on the thread count. */
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
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
    if (a->kv_type == EMBER_TYPE_F32) { /* the f32 copy (below): the same products and sums */
        const float *r = (const float *)(const void *)row;
        for (int64_t i = 0; i < a->hd; i++) dot += x[i] * r[i];
        return dot;
    }
    for (int64_t i = 0; i < a->hd; i++) dot += x[i] * ember_kv_element(a->kv_type, row, i);
    return dot;
}

/* out[k - k0] = x . cache row k of KV head g for keys [k0, k1): dot_row's sums, four of them in
 * flight at a time over an f32 cache (each its own sequence: the same bits). */
static void dot_keys(const bwd_job *j, const float *x, const void *base, int64_t g, int64_t k0, int64_t k1,
                     float *out) {
    const ember_attention_args *a = j->b->fwd;
    int64_t k = k0;
    for (; a->kv_type == EMBER_TYPE_F32 && k + 4 <= k1; k += 4) {
        const float *r = (const float *)(const void *)kv_row(j, base, g, k);
        const int64_t st = a->kv_stride;
        float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
        for (int64_t i = 0; i < a->hd; i++) {
            d0 += x[i] * r[i];
            d1 += x[i] * r[st + i];
            d2 += x[i] * r[2 * st + i];
            d3 += x[i] * r[3 * st + i];
        }
        out[k - k0] = d0;
        out[k - k0 + 1] = d1;
        out[k - k0 + 2] = d2;
        out[k - k0 + 3] = d3;
    }
    for (; k < k1; k++) out[k - k0] = dot_row(j, x, kv_row(j, base, g, k));
}

/* out[u] = x_u . row for the queries t0 .. t0 + nt - 1 (nt <= 4) of head h, x_u the row of xs for
 * query t0 + u: dot_row's sums, four in flight over an f32 cache (the same bits). */
static void dot_queries(const bwd_job *j, const float *xs, int64_t h, int64_t t0, int nt, const uint8_t *row,
                        float *out) {
    const ember_attention_args *a = j->b->fwd;
    const int64_t hd = a->hd, xst = a->n_head * hd;
    const float *x = xs + (t0 * a->n_head + h) * hd;
    if (a->kv_type != EMBER_TYPE_F32 || nt < 4) {
        for (int u = 0; u < nt; u++) out[u] = dot_row(j, x + u * xst, row);
        return;
    }
    const float *r = (const float *)(const void *)row;
    float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
    for (int64_t i = 0; i < hd; i++) {
        d0 += x[i] * r[i];
        d1 += x[xst + i] * r[i];
        d2 += x[2 * xst + i] * r[i];
        d3 += x[3 * xst + i] * r[i];
    }
    out[0] = d0;
    out[1] = d1;
    out[2] = d2;
    out[3] = d3;
}

/* A scaled score as the softmax read it: capped (Gemma 2's softcap, the forward's own expression) or
 * as it is; *slope gets d capped / d score, 1 - (capped / cap)^2, or 1. */
static inline float score_capped(const ember_attention_args *a, float x, float *slope) {
    if (a->softcap <= 0.0f) {
        *slope = 1.0f;
        return x;
    }
    const float c = a->softcap * tanhf(x / a->softcap), r = c / a->softcap;
    *slope = 1.0f - r * r;
    return c;
}

/* The keys query t sees: first..p. */
static void visible(const ember_attention_args *a, int64_t t, int64_t *first, int64_t *p) {
    *p = a->pos0 + t;
    *first = a->window > 0 && *p - a->window + 1 > 0 ? *p - a->window + 1 : 0;
}

/* Pass 1, items (head, token): the row's probabilities (kept as max and sum), dp, D, the pattern's
 * gradient and dq. rows: this thread's 3 * n_keys floats (scores, dp, the softcap's slopes). */
static void rows_items(void *arg, int64_t begin, int64_t end, int tid) {
    const bwd_job *j = arg;
    const ember_attention_backward_args *b = j->b;
    const ember_attention_args *a = b->fwd;
    const int64_t hd = a->hd, group = a->n_head / a->n_head_kv;
    float *s = b->rows + (int64_t)tid * 3 * j->n_keys, *dp = s + j->n_keys, *slope = dp + j->n_keys;
    for (int64_t it = begin; it < end; it++) {
        const int64_t h = it / a->n, t = it % a->n, g = h / group;
        int64_t first, p;
        visible(a, t, &first, &p);
        const float *q = a->q + (t * a->n_head + h) * hd, *dout = b->d_out + (t * a->n_head + h) * hd;
        float mx = -INFINITY, sum = 0.0f, D = 0.0f;
        dot_keys(j, q, a->k, g, first, p + 1, s + first);
        for (int64_t k = first; k <= p; k++) {
            s[k] = score_capped(a, s[k] * a->scale, &slope[k]);
            if (s[k] > mx) mx = s[k];
        }
        for (int64_t k = first; k <= p; k++) {
            s[k] = expf(s[k] - mx);
            sum += s[k];
        }
        dot_keys(j, dout, a->v, g, first, p + 1, dp + first);
        for (int64_t k = first; k <= p; k++) {
            s[k] = s[k] / sum; /* p_k */
            D += s[k] * dp[k];
        }
        float *st = b->stats + (h * a->n + t) * 3;
        st[0] = mx;
        st[1] = sum;
        st[2] = D;
        if (b->d_pattern) {
            float *row = b->d_pattern + (h * a->n + t) * j->n_keys;
            dot_keys(j, dout, a->v, g, 0, first, row);
            memcpy(row + first, dp + first, (size_t)(p + 1 - first) * sizeof(float));
            dot_keys(j, dout, a->v, g, p + 1, j->n_keys, row + p + 1);
        }
        if (b->frozen) continue;
        float *dq = b->dq + (t * a->n_head + h) * hd;
        memset(dq, 0, (size_t)hd * sizeof(float));
        for (int64_t k = first; k <= p; k++) {
            const float ds = s[k] * (dp[k] - D) * slope[k] * a->scale;
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
        /* the queries that see the key: from its own position to the window's end */
        const int64_t t_end = a->window > 0 && key - a->pos0 + a->window < a->n ? key - a->pos0 + a->window : a->n;
        for (int64_t h = g * group; h < (g + 1) * group; h++)
            for (int64_t t0 = key - a->pos0; t0 < t_end; t0 += 4) {
                const int nt = t_end - t0 < 4 ? (int)(t_end - t0) : 4;
                float sk[4], sv[4];
                dot_queries(j, a->q, h, t0, nt, kr, sk);
                if (dk) dot_queries(j, b->d_out, h, t0, nt, vr, sv);
                for (int u = 0; u < nt; u++) {
                    const int64_t t = t0 + u;
                    int64_t first, p;
                    visible(a, t, &first, &p);
                    if (key < first) continue; /* outside this query's window */
                    const float *q = a->q + (t * a->n_head + h) * hd, *dout = b->d_out + (t * a->n_head + h) * hd;
                    const float *st = b->stats + (h * a->n + t) * 3;
                    float slope;
                    const float pk = expf(score_capped(a, sk[u] * a->scale, &slope) - st[0]) / st[1];
                    for (int64_t i = 0; i < hd; i++) dv[i] += pk * dout[i];
                    if (!dk) continue;
                    const float ds = pk * (sv[u] - st[2]) * slope * a->scale;
                    for (int64_t i = 0; i < hd; i++) dk[i] += ds * q[i];
                }
            }
    }
}

int64_t ember_attention_backward_scratch(int n_threads, int64_t n_keys) { return (int64_t)n_threads * 3 * n_keys; }

/* An f32 copy of keys [0, n_keys) of every KV head of the cache at base (exact: every element is
 * read as f32 anyway), laid out (KV head, key, hd); NULL when out of memory. */
static float *kv_f32(const ember_attention_args *a, const void *base, int64_t n_keys) {
    float *out = malloc((size_t)(a->n_head_kv * n_keys * a->hd) * sizeof(float));
    if (!out) return NULL;
    const size_t esize = ember_type_row_size(a->kv_type, 1);
    for (int64_t g = 0; g < a->n_head_kv; g++)
        for (int64_t k = 0; k < n_keys; k++) {
            const uint8_t *row = (const uint8_t *)base + (size_t)(g * a->kv_head_stride + k * a->kv_stride) * esize;
            float *o = out + (g * n_keys + k) * a->hd;
            for (int64_t i = 0; i < a->hd; i++) o[i] = ember_kv_element(a->kv_type, row, i);
        }
    return out;
}

/* An f16/bf16 cache is converted to f32 once per call rather than element by element at every use
 * (the results are the same bits); without memory for the copy it is read in place. */
void ember_compute_attention_backward(ember_compute *c, const ember_attention_backward_args *b) {
    const ember_attention_args *a = b->fwd;
    const int64_t n_keys = a->pos0 + a->n;
    ember_attention_args f = *a;
    ember_attention_backward_args bf = *b;
    float *kf = NULL, *vf = NULL;
    if (a->kv_type != EMBER_TYPE_F32 && (kf = kv_f32(a, a->k, n_keys)) && (vf = kv_f32(a, a->v, n_keys))) {
        f.k = kf;
        f.v = vf;
        f.kv_type = EMBER_TYPE_F32;
        f.kv_stride = a->hd;
        f.kv_head_stride = n_keys * a->hd;
        bf.fwd = &f;
    }
    bwd_job j = {.b = &bf, .esize = ember_type_row_size(bf.fwd->kv_type, 1), .n_keys = n_keys};
    ember_compute_for(c, a->n_head * a->n, 1, rows_items, &j);
    ember_compute_for(c, a->n_head_kv * a->n, 1, keys_items, &j);
    free(kf);
    free(vf);
}
