/* test_attention.c — attention over f32, f16 and bf16 KV caches on every kernel set: each set's
 * chunk kernel against the reference kernel, the threaded attention against a float64 softmax
 * over the same cached values, identical results for 1, 2 and 3 threads, for a token decoded alone
 * and the same token inside a prefill, and avx2 = avx512 bit for bit. Correctness only. */
#include "kernels.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Budgets. The chunk kernels differ from the reference kernel by f32 rounding order and the vector
 * exp (a few ulp per term); pooled NMSE of the normalised chunk outputs. */
#define NMSE_CHUNK 1e-11
/* Threaded attention against the float64 softmax of the same cached values (f16/bf16 rounding of
 * the cache is part of the input, not of the error): max |err| / max |ref| over a case. */
#define REL_ATTENTION 2e-6

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * 0x1p-24) * 2.0f - 1.0f;
}

static const ember_type kv_types[] = {EMBER_TYPE_F32, EMBER_TYPE_F16, EMBER_TYPE_BF16};
static const char *type_name(ember_type t) {
    return t == EMBER_TYPE_F32 ? "f32" : t == EMBER_TYPE_F16 ? "f16" : "bf16";
}

/* A cache of `count` values of type t with random contents; *f gets the same values as f32. */
static void *random_cache(ember_type t, int64_t count, float spread, float **f) {
    *f = malloc((size_t)count * sizeof(float));
    void *c = malloc((size_t)count * (t == EMBER_TYPE_F32 ? 4 : 2));
    for (int64_t i = 0; i < count; i++) {
        float x = uniform() * spread;
        if (t == EMBER_TYPE_F32) ((float *)c)[i] = x;
        else if (t == EMBER_TYPE_F16) x = ember_f16_to_f32(((uint16_t *)c)[i] = ember_f32_to_f16(x));
        else x = ember_bf16_to_f32(((uint16_t *)c)[i] = ember_f32_to_bf16(x));
        (*f)[i] = x;
    }
    return c;
}

static const ember_kernel_ops *set_ops(ember_kernels k) {
    ember_kernels chosen;
    return ember_kernels_select(k, &chosen);
}

/* ---- the chunk kernel against the reference's ---- */
static void test_chunk(const ember_kernel_ops *ops) {
    static const int64_t hds[] = {1, 2, 8, 15, 16, 17, 24, 64, 72, 100, 128, 256, 512};
    static const int64_t lens[] = {1, 2, 3, 4, 5, 7, 15, 16, 17, 31, 33, 63, 64, 65, 200, 255, 256};
    double worst = 0;
    int bad_m = 0, bad_empty = 0;
    float *scores = malloc(EMBER_ATTN_MAX_ROWS * EMBER_ATTN_CHUNK * sizeof(float));
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
            const int64_t hd = hds[hi], stride = 3 * hd + 1, k0 = 512;
            float *kf, *vf, *q = malloc((size_t)(EMBER_ATTN_MAX_ROWS * hd) * sizeof(float));
            void *k = random_cache(kv_types[ti], (k0 + EMBER_ATTN_CHUNK) * stride, 2.0f, &kf);
            void *v = random_cache(kv_types[ti], (k0 + EMBER_ATTN_CHUNK) * stride, 1.0f, &vf);
            for (int64_t i = 0; i < EMBER_ATTN_MAX_ROWS * hd; i++) q[i] = uniform();
            double num = 0, den = 0;
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                ember_attn_rows a = {.n_rows = EMBER_ATTN_MAX_ROWS,
                                     .k = k,
                                     .v = v,
                                     .kv_stride = stride,
                                     .kv_type = kv_types[ti],
                                     .hd = hd,
                                     .scale = 1.0f / sqrtf((float)hd),
                                     .softcap = li % 2 ? 0.7f : 0.0f}; /* every other length capped (Gemma 2) */
                for (int r = 0; r < a.n_rows; r++) {                   /* rows ending and starting at different keys */
                    a.q[r] = q + r * hd;
                    a.hi[r] = k0 + lens[li] - (r % 3);
                    a.lo[r] = r == 5 ? k0 + lens[li] / 2 : r == 6 ? 0 : k0;
                }
                a.hi[7] = k0; /* sees nothing of this chunk */
                float m1[8], l1[8], m2[8], l2[8];
                float *acc1 = malloc((size_t)(8 * hd) * sizeof(float)),
                      *acc2 = malloc((size_t)(8 * hd) * sizeof(float));
                ember_kernels_reference.attn_chunk(&a, k0, k0 + EMBER_ATTN_CHUNK, scores, m1, l1, acc1);
                ops->attn_chunk(&a, k0, k0 + EMBER_ATTN_CHUNK, scores, m2, l2, acc2);
                for (int r = 0; r < a.n_rows; r++) {
                    const bool empty = (a.hi[r] < k0 + EMBER_ATTN_CHUNK ? a.hi[r] : k0 + EMBER_ATTN_CHUNK) <=
                                       (a.lo[r] > k0 ? a.lo[r] : k0);
                    if (empty) {
                        bad_empty += !(m1[r] == -INFINITY && m2[r] == -INFINITY);
                        continue;
                    }
                    bad_m += fabsf(m1[r] - m2[r]) > 1e-5f * (1.0f + fabsf(m1[r]));
                    /* compare what the fold would produce from these partials: acc / l */
                    for (int64_t d = 0; d < hd; d++) {
                        const double x = (double)acc2[r * hd + d] / l2[r], y = (double)acc1[r * hd + d] / l1[r];
                        num += (x - y) * (x - y);
                        den += y * y;
                    }
                }
                free(acc1);
                free(acc2);
            }
            const double e = den > 0 ? num / den : num;
            if (e > worst) worst = e;
            CHECK_MSG(e <= NMSE_CHUNK, "%s attn_chunk %s hd=%lld: nmse %.3g", ops->name, type_name(kv_types[ti]),
                      (long long)hd, e);
            free(k);
            free(v);
            free(kf);
            free(vf);
            free(q);
        }
    CHECK_MSG(bad_m == 0, "%s attn_chunk: %d row maxima differ from the reference", ops->name, bad_m);
    CHECK_MSG(bad_empty == 0, "%s attn_chunk: %d rows without visible keys not reported as -inf", ops->name, bad_empty);
    printf("  %-9s attn_chunk: worst nmse %.2e (budget %.0e)\n", ops->name, worst, NMSE_CHUNK);
    free(scores);
}

/* ---- the threaded attention ---- */
typedef struct {
    const char *what;
    int64_t n_head, n_head_kv, hd, pos0, n, window;
} shape;

static const shape shapes[] = {
    {"decode, 8 KV heads, 2 chunks", 16, 8, 128, 300, 1, 0},
    {"decode, 1 KV head (split by chunks)", 8, 1, 64, 700, 1, 0},
    {"decode, 2 KV heads, 4 query heads each", 8, 2, 32, 1030, 1, 0},
    {"decode, sliding window across chunks", 4, 1, 40, 600, 1, 100},
    {"prefill from 0", 4, 2, 16, 0, 37, 0},
    {"prefill across a chunk boundary", 8, 4, 64, 240, 40, 0},
    {"prefill, one head, odd size", 1, 1, 17, 0, 300, 0},
    {"prefill with a window", 6, 3, 24, 250, 30, 16},
    {"prefill, 16 query heads per KV head", 16, 1, 8, 5, 9, 0},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* out of every set and thread count for one shape and cache type; NULL where a set does not run */
static float *attend(ember_kernels k, int threads, const shape *sh, ember_type t, const void *kc, const void *vc,
                     const float *q, int64_t n_ctx) {
    ember_compute *c = NULL;
    ember_error err;
    if (ember_compute_new(k, threads, &c, &err) != EMBER_OK) return NULL;
    const int64_t width = sh->n_head * sh->hd;
    float *out = malloc((size_t)(sh->n * width) * sizeof(float));
    const int64_t n_scratch = ember_attention_scratch_floats(threads, n_ctx, sh->n_head, sh->hd);
    float *scratch = malloc((size_t)n_scratch * sizeof(float));
    /* finite stale contents, different per thread count: a read of scratch the kernels did not
     * write would show up as a difference between thread counts or as a finite garbage row */
    for (int64_t i = 0; i < n_scratch; i++) scratch[i] = 1.0f + (float)threads;
    ember_attention_args a = {.q = q,
                              .k = kc,
                              .v = vc,
                              .kv_type = t,
                              .out = out,
                              .scratch = scratch,
                              .n_chunks_cap = (n_ctx + EMBER_ATTN_CHUNK - 1) / EMBER_ATTN_CHUNK,
                              .n_head = sh->n_head,
                              .n_head_kv = sh->n_head_kv,
                              .hd = sh->hd,
                              .kv_stride = sh->n_head_kv * sh->hd,
                              .kv_head_stride = sh->hd,
                              .pos0 = sh->pos0,
                              .n = sh->n,
                              .window = sh->window,
                              .scale = 1.0f / sqrtf((float)sh->hd)};
    ember_compute_attention(c, &a);
    free(scratch);
    ember_compute_free(c);
    return out;
}

/* float64 softmax attention over the cached values as f32 */
static void oracle(const shape *sh, const float *kf, const float *vf, const float *q, double *out) {
    const int64_t kvs = sh->n_head_kv * sh->hd, group = sh->n_head / sh->n_head_kv;
    double *s = malloc((size_t)(sh->pos0 + sh->n) * sizeof(double));
    for (int64_t t = 0; t < sh->n; t++)
        for (int64_t h = 0; h < sh->n_head; h++) {
            const int64_t p = sh->pos0 + t, first = sh->window > 0 && p - sh->window + 1 > 0 ? p - sh->window + 1 : 0;
            const int64_t g = h / group;
            const float *qh = q + (t * sh->n_head + h) * sh->hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = first; j <= p; j++) {
                double d = 0;
                for (int64_t i = 0; i < sh->hd; i++) d += (double)qh[i] * kf[j * kvs + g * sh->hd + i];
                s[j] = d / sqrt((double)sh->hd);
                if (s[j] > mx) mx = s[j];
            }
            for (int64_t j = first; j <= p; j++) sum += (s[j] = exp(s[j] - mx));
            for (int64_t i = 0; i < sh->hd; i++) {
                double o = 0;
                for (int64_t j = first; j <= p; j++) o += s[j] * vf[j * kvs + g * sh->hd + i];
                out[(t * sh->n_head + h) * sh->hd + i] = o / sum;
            }
        }
    free(s);
}

static void test_threaded(void) {
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (size_t ti = 0; ti < 3; ti++) {
            const shape *sh = &shapes[si];
            const ember_type t = kv_types[ti];
            const int64_t n_ctx = sh->pos0 + sh->n + 3, width = sh->n_head * sh->hd, count = sh->n * width;
            float *kf, *vf, *q = malloc((size_t)count * sizeof(float));
            void *kc = random_cache(t, n_ctx * sh->n_head_kv * sh->hd, 3.0f, &kf);
            void *vc = random_cache(t, n_ctx * sh->n_head_kv * sh->hd, 1.0f, &vf);
            for (int64_t i = 0; i < count; i++) q[i] = uniform();
            double *want = malloc((size_t)count * sizeof(double));
            oracle(sh, kf, vf, q, want);
            double ref_max = 0;
            for (int64_t i = 0; i < count; i++) ref_max = fmax(ref_max, fabs(want[i]));
            float *first_simd = NULL;
            for (size_t k = 0; k < 3; k++) {
                float *o[3] = {NULL, NULL, NULL};
                for (int th = 1; th <= 3; th++) o[th - 1] = attend(sets[k], th, sh, t, kc, vc, q, n_ctx);
                if (!o[0]) continue; /* this CPU cannot run the set */
                double err = 0;
                for (int64_t i = 0; i < count; i++) err = fmax(err, fabs(o[0][i] - want[i]));
                CHECK_MSG(err <= REL_ATTENTION * ref_max, "%s, %s cache, %s: max error %.3g (max |ref| %.3g)", sh->what,
                          type_name(t), ember_kernels_name(sets[k]), err, ref_max);
                CHECK_MSG(!memcmp(o[0], o[1], (size_t)count * 4) && !memcmp(o[0], o[2], (size_t)count * 4),
                          "%s, %s cache, %s: 1, 2 and 3 threads differ", sh->what, type_name(t),
                          ember_kernels_name(sets[k]));
                if (sets[k] != EMBER_KERNELS_REFERENCE) {
                    if (first_simd)
                        CHECK_MSG(!memcmp(first_simd, o[0], (size_t)count * 4), "%s, %s cache: avx2 and avx512 differ",
                                  sh->what, type_name(t));
                    else first_simd = o[0], o[0] = NULL;
                }
                for (int i = 0; i < 3; i++) free(o[i]);
            }
            free(first_simd);
            free(want);
            free(q);
            free(kc);
            free(vc);
            free(kf);
            free(vf);
        }
}

/* A token decoded alone (the split-by-chunk path for one KV head) equals the same token as the
 * last row of a prefill (the tiled path), bit for bit, on every set. */
static void test_decode_equals_prefill(void) {
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    const shape pre = {"prefill", 8, 1, 64, 0, 600, 0}, dec = {"decode", 8, 1, 64, 599, 1, 0};
    for (size_t ti = 0; ti < 3; ti++) {
        const int64_t n_ctx = 601, width = 8 * 64;
        float *kf, *vf, *q = malloc((size_t)(600 * width) * sizeof(float));
        void *kc = random_cache(kv_types[ti], n_ctx * 64, 3.0f, &kf),
             *vc = random_cache(kv_types[ti], n_ctx * 64, 1.0f, &vf);
        for (int64_t i = 0; i < 600 * width; i++) q[i] = uniform();
        for (size_t k = 0; k < 3; k++)
            for (int th = 1; th <= 2; th++) {
                float *a = attend(sets[k], th, &pre, kv_types[ti], kc, vc, q, n_ctx);
                if (!a) continue;
                float *b = attend(sets[k], th, &dec, kv_types[ti], kc, vc, q + 599 * width, n_ctx);
                CHECK_MSG(!memcmp(a + 599 * width, b, (size_t)width * 4),
                          "%s, %s cache, %d threads: decoded token "
                          "differs from the prefill's last row",
                          ember_kernels_name(sets[k]), type_name(kv_types[ti]), th);
                free(a);
                free(b);
            }
        free(q);
        free(kc);
        free(vc);
        free(kf);
        free(vf);
    }
}

/* ---- non-finite scores: NaN propagates, it is never skipped ----
 * Each case poisons one query row (token t, head h) or one cached key; the poisoned rows must come
 * out all NaN and every other row bit-identical to the clean run, on every set and thread count.
 * "every score -inf" is the case that used to look like "no visible key" and left the row to
 * whatever the scratch held. */

/* Sets element i of a cache of type t to x (rounded to the cache's type). */
static void cache_set(ember_type t, void *c, int64_t i, float x) {
    if (t == EMBER_TYPE_F32) ((float *)c)[i] = x;
    else if (t == EMBER_TYPE_F16) ((uint16_t *)c)[i] = ember_f32_to_f16(x);
    else ((uint16_t *)c)[i] = ember_f32_to_bf16(x);
}

typedef enum { POISON_Q_NAN, POISON_Q_MINUS_INF, POISON_Q_PLUS_INF, POISON_K_NAN } poison;
static const char *const poison_names[] = {"a NaN query", "scores all -inf", "scores +inf", "a NaN key"};

/* Checks one attention output against the clean one: rows poisoned[t*n_head + h] all NaN, the others
 * bit-identical. */
static void check_poisoned(const char *what, const shape *sh, const float *clean, const float *out,
                           const bool *poisoned) {
    int bad_nan = 0, bad_other = 0;
    for (int64_t r = 0; r < sh->n * sh->n_head; r++) {
        const float *o = out + r * sh->hd, *c = clean + r * sh->hd;
        if (poisoned[r]) {
            for (int64_t d = 0; d < sh->hd; d++) bad_nan += !isnan(o[d]);
        } else {
            bad_other += memcmp(o, c, (size_t)sh->hd * sizeof(float)) != 0;
        }
    }
    CHECK_MSG(bad_nan == 0 && bad_other == 0, "%s: %d values of poisoned rows not NaN, %d clean rows changed", what,
              bad_nan, bad_other);
}

/* Poisons q (and the keys) for case pz; marks the rows that must come out NaN. */
static void poison_inputs(int pz, const shape *sh, ember_type t, float *q, void *kc, bool *poisoned) {
    const int64_t kvs = sh->n_head_kv * sh->hd, group = sh->n_head / sh->n_head_kv, n_ctx = sh->pos0 + sh->n;
    const int64_t t0 = sh->n - 1, h0 = 1, g0 = h0 / group;
    float *qrow = q + (t0 * sh->n_head + h0) * sh->hd;
    if (pz == POISON_Q_NAN) qrow[3] = NAN;
    if (pz == POISON_Q_MINUS_INF) qrow[0] = -INFINITY; /* key element 0 is positive: every score -inf */
    if (pz == POISON_Q_PLUS_INF) qrow[0] = INFINITY;
    if (pz != POISON_K_NAN) {
        poisoned[t0 * sh->n_head + h0] = true;
        return;
    }
    /* the key at the last position: only the last token sees it, with every query head of g0 */
    cache_set(t, kc, (n_ctx - 1) * kvs + g0 * sh->hd + 2, NAN);
    for (int64_t h = g0 * group; h < (g0 + 1) * group; h++) poisoned[t0 * sh->n_head + h] = true;
}

static void test_nonfinite_scores(void) {
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    /* tiled prefill across a chunk boundary, a tiled decode, the split-by-chunk decode (1 KV head) */
    const shape cases[] = {{"prefill", 4, 2, 16, 250, 20, 0},
                           {"decode, tiled", 8, 4, 32, 300, 1, 0},
                           {"decode, split by chunks", 8, 1, 16, 700, 1, 0}};
    int runs = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t ti = 0; ti < 3; ti++)
            for (int pz = POISON_Q_NAN; pz <= POISON_K_NAN; pz++)
                for (size_t k = 0; k < 3; k++) {
                    const shape *sh = &cases[ci];
                    const ember_type t = kv_types[ti];
                    const int64_t n_ctx = sh->pos0 + sh->n, kvs = sh->n_head_kv * sh->hd, rows = sh->n * sh->n_head;
                    const int64_t g0 = 1 / (sh->n_head / sh->n_head_kv);
                    float *kf, *vf, *q = malloc((size_t)(rows * sh->hd) * sizeof(float));
                    void *kc = random_cache(t, n_ctx * kvs, 3.0f, &kf), *vc = random_cache(t, n_ctx * kvs, 1.0f, &vf);
                    for (int64_t i = 0; i < rows * sh->hd; i++) q[i] = uniform();
                    for (int64_t j = 0; j < n_ctx; j++) cache_set(t, kc, j * kvs + g0 * sh->hd, 0.5f);
                    float *clean = attend(sets[k], 1, sh, t, kc, vc, q, n_ctx);
                    bool *poisoned = calloc((size_t)rows, sizeof(bool));
                    poison_inputs(pz, sh, t, q, kc, poisoned);
                    for (int th = 1; clean && th <= 3; th++) {
                        float *o = attend(sets[k], th, sh, t, kc, vc, q, n_ctx);
                        char what[160];
                        snprintf(what, sizeof what, "%s, %s cache, %s, %s, %d threads", sh->what, type_name(t),
                                 poison_names[pz], ember_kernels_name(sets[k]), th);
                        check_poisoned(what, sh, clean, o, poisoned);
                        runs++;
                        free(o);
                    }
                    free(poisoned);
                    free(clean);
                    free(q);
                    free(kc);
                    free(vc);
                    free(kf);
                    free(vf);
                }
    printf("  non-finite scores: %d runs, poisoned rows NaN, the others unchanged\n", runs);
}

int main(void) {
    const ember_kernels sets[] = {EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    for (size_t s = 0; s < 2; s++) {
        const ember_kernel_ops *ops = set_ops(sets[s]);
        if (!ops) {
            printf("%s: not supported on this CPU, skipped\n", ember_kernels_name(sets[s]));
            continue;
        }
        test_chunk(ops);
    }
    test_threaded();
    test_decode_equals_prefill();
    test_nonfinite_scores();
    return ember_test_finish();
}
