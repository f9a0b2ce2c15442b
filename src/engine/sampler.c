/* sampler.c — next-token choice: greedy at temperature 0, else temperature / top-k / top-p with an
 * explicit seed (xoshiro256** seeded by splitmix64), so a seed reproduces a run exactly. */
#include "ember.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    float prob;
    int32_t id;
} ember_candidate;

struct ember_sampler {
    ember_sampler_params p;
    int64_t n_vocab;
    uint64_t rng[4];
    ember_candidate *cand; /* (n_vocab) */
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 bits. */
static double next_unit(uint64_t s[4]) { return (double)(next_u64(s) >> 11) * 0x1p-53; }

ember_status ember_sampler_new(const ember_sampler_params *p, int64_t n_vocab, ember_sampler **out, ember_error *err) {
    *out = NULL;
    if (n_vocab < 1) return ember_error_set(err, EMBER_ERR_ARG, "sampler: empty vocabulary");
    if (!(p->temperature >= 0) || !(p->top_p > 0) || p->top_k < 0)
        return ember_error_set(err, EMBER_ERR_ARG,
                               "sampler: temperature must be >= 0, top_p > 0 and top_k >= 0 (got %g, %g, %d)",
                               (double)p->temperature, (double)p->top_p, p->top_k);
    ember_sampler *s = calloc(1, sizeof *s);
    if (!s) return ember_error_set(err, EMBER_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (!s->cand) {
        ember_sampler_free(s);
        return ember_error_set(err, EMBER_ERR_NOMEM, "sampler: out of memory");
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return EMBER_OK;
}

void ember_sampler_free(ember_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s);
}

int64_t ember_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Descending by probability, then ascending id: a total order, so sorting is deterministic. */
static int by_prob_desc(const void *a, const void *b) {
    const ember_candidate *x = a, *y = b;
    if (x->prob != y->prob) return x->prob > y->prob ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Sorts in place by by_prob_desc (heapsort: glibc's qsort mallocs a merge buffer for arrays over
 * 1 KiB, and sampling must not allocate per token). The order is total, so the result is the one
 * any correct sort gives. */
static void sift_down(ember_candidate *a, size_t root, size_t n) {
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && by_prob_desc(&a[child], &a[child + 1]) < 0) child++;
        if (by_prob_desc(&a[root], &a[child]) >= 0) return;
        ember_candidate t = a[root];
        a[root] = a[child];
        a[child] = t;
        root = child;
    }
}

static void sort_candidates(ember_candidate *a, size_t n) {
    for (size_t i = n / 2; i-- > 0;) sift_down(a, i, n);
    for (size_t end = n; end > 1; end--) {
        ember_candidate t = a[0];
        a[0] = a[end - 1];
        a[end - 1] = t;
        sift_down(a, 0, end - 1);
    }
}

int32_t ember_sampler_sample(ember_sampler *s, const float *logits) {
    const int64_t n = s->n_vocab;
    if (s->p.temperature <= 0.0f) return (int32_t)ember_argmax(logits, n);
    /* softmax(logits / T), max-subtracted */
    float mx = logits[ember_argmax(logits, n)];
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        s->cand[i] = (ember_candidate){expf((logits[i] - mx) / s->p.temperature), (int32_t)i};
        sum += s->cand[i].prob;
    }
    for (int64_t i = 0; i < n; i++) s->cand[i].prob = (float)(s->cand[i].prob / sum);
    sort_candidates(s->cand, (size_t)n);
    int64_t keep = n;
    if (s->p.top_k > 0 && s->p.top_k < keep) keep = s->p.top_k;
    if (s->p.top_p < 1.0f) {
        double cum = 0.0;
        for (int64_t i = 0; i < keep; i++) {
            cum += s->cand[i].prob;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    double total = 0.0;
    for (int64_t i = 0; i < keep; i++) total += s->cand[i].prob;
    double r = next_unit(s->rng) * total, acc = 0.0;
    for (int64_t i = 0; i < keep; i++) {
        acc += s->cand[i].prob;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[keep - 1].id;
}
