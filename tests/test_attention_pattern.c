/* test_attention_pattern.c — the attention_pattern stage's two passes (kernels/compute.c) over
 * f32, f16 and bf16 head-major caches: an untouched pattern mixes to the fused chunked attention
 * within a tight NMSE, and to the same bits on every kernel set and for 1, 2 and 3 threads; the
 * pattern holds exactly 0 on masked keys and rows summing to 1; an edited pattern is mixed as it
 * stands (checked in double over the same cached values). */
#include "kernels.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Pattern path against the fused path: two f32 orders of the same softmax and weighted sum
 * (the fused one chunked with an online fold and the sets' vector exp), pooled over a case. */
#define NMSE_FUSED 1e-11

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void) { /* in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static const ember_type kv_types[] = {EMBER_TYPE_F32, EMBER_TYPE_F16, EMBER_TYPE_BF16};
static const char *type_name(ember_type t) {
    return t == EMBER_TYPE_F32 ? "f32" : t == EMBER_TYPE_F16 ? "f16" : "bf16";
}

typedef struct {
    int64_t n_head, n_head_kv, hd, pos0, n, window;
} shape;

/* A cache of `count` values of type t; *f gets the same values as f32. */
static void *random_cache(ember_type t, int64_t count, float **f) {
    *f = malloc((size_t)count * sizeof(float));
    void *c = malloc((size_t)count * (t == EMBER_TYPE_F32 ? 4 : 2));
    for (int64_t i = 0; i < count; i++) {
        float x = uniform();
        if (t == EMBER_TYPE_F32) ((float *)c)[i] = x;
        else if (t == EMBER_TYPE_F16) x = ember_f16_to_f32(((uint16_t *)c)[i] = ember_f32_to_f16(x));
        else x = ember_bf16_to_f32(((uint16_t *)c)[i] = ember_f32_to_bf16(x));
        (*f)[i] = x;
    }
    return c;
}

static void visible(const shape *s, int64_t t, int64_t *first, int64_t *p) {
    *p = s->pos0 + t;
    *first = s->window > 0 && *p - s->window + 1 > 0 ? *p - s->window + 1 : 0;
}

/* One set and thread count on one case: fused vs pattern path, the pattern's form, an edit.
 * base: the pattern path's output of the first run of this case (NULL: this is the first). */
static void check_run(ember_compute *c, const shape *s, ember_type kt, const float *q, const void *k, const void *v,
                      const float *vf, float *base) {
    const char *set = ember_compute_ops(c)->name;
    const int threads = ember_compute_threads(c);
    const int64_t keys = s->pos0 + s->n, q_dim = s->n_head * s->hd, group = s->n_head / s->n_head_kv;
    const size_t out_bytes = sizeof(float) * (size_t)(s->n * q_dim);
    float *fused = malloc(out_bytes), *split = malloc(out_bytes);
    float *scratch = malloc(sizeof(float) * (size_t)ember_attention_scratch_floats(threads, keys, s->n_head, s->hd));
    float *pattern = malloc(sizeof(float) * (size_t)(s->n_head * s->n * keys));
    ember_attention_args a = {.q = q,
                              .k = k,
                              .v = v,
                              .kv_type = kt,
                              .out = fused,
                              .scratch = scratch,
                              .n_chunks_cap = (keys + EMBER_ATTN_CHUNK - 1) / EMBER_ATTN_CHUNK,
                              .n_head = s->n_head,
                              .n_head_kv = s->n_head_kv,
                              .hd = s->hd,
                              .kv_stride = s->hd,
                              .kv_head_stride = keys * s->hd,
                              .pos0 = s->pos0,
                              .n = s->n,
                              .window = s->window,
                              .scale = 1.0f / sqrtf((float)s->hd)};
    ember_compute_attention(c, &a);
    a.out = split;
    ember_compute_attention_probs(c, &a, pattern);
    ember_compute_attention_mix(c, &a, pattern);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < s->n * q_dim; i++) {
        const double e = (double)split[i] - (double)fused[i];
        num += e * e;
        den += (double)fused[i] * fused[i];
    }
    CHECK_MSG(num <= NMSE_FUSED * den,
              "%s, %d threads, %s, heads %lld/%lld, hd %lld, pos0 %lld, n %lld, window %lld: pattern path vs fused "
              "NMSE %.3g",
              set, threads, type_name(kt), (long long)s->n_head, (long long)s->n_head_kv, (long long)s->hd,
              (long long)s->pos0, (long long)s->n, (long long)s->window, den > 0 ? num / den : num);
    if (base)
        CHECK_MSG(memcmp(base, split, out_bytes) == 0,
                  "%s, %d threads, %s, hd %lld, pos0 %lld, n %lld: pattern path differs from the first run's bits", set,
                  threads, type_name(kt), (long long)s->hd, (long long)s->pos0, (long long)s->n);

    /* the pattern: masked keys exactly 0, visible keys a distribution */
    int bad_mask = 0, bad_sum = 0;
    for (int64_t h = 0; h < s->n_head; h++)
        for (int64_t t = 0; t < s->n; t++) {
            const float *row = pattern + (h * s->n + t) * keys;
            int64_t first, p;
            visible(s, t, &first, &p);
            double sum = 0.0;
            for (int64_t j = 0; j < keys; j++) {
                if (j < first || j > p) bad_mask += row[j] != 0.0f;
                else sum += row[j];
            }
            bad_sum += fabs(sum - 1.0) > 1e-5;
        }
    CHECK_MSG(bad_mask == 0 && bad_sum == 0, "%s: %d masked keys not 0, %d rows not summing to 1", set, bad_mask,
              bad_sum);

    /* Edits: key 0 removed from every row (no renormalisation), and on the last query of head 0 a
     * weight of 0.5 on a key it cannot see (the one before its window, if there is one). */
    for (int64_t r = 0; r < s->n_head * s->n; r++) pattern[r * keys] = 0.0f;
    int64_t first_last, p_last;
    visible(s, s->n - 1, &first_last, &p_last);
    if (first_last > 1) pattern[(s->n - 1) * keys + first_last - 1] = 0.5f;
    ember_compute_attention_mix(c, &a, pattern);
    double worst = 0.0;
    for (int64_t h = 0; h < s->n_head; h++)
        for (int64_t t = 0; t < s->n; t++) {
            const float *row = pattern + (h * s->n + t) * keys;
            const float *vh = vf + (h / group) * keys * s->hd;
            for (int64_t d = 0; d < s->hd; d++) {
                double want = 0.0;
                for (int64_t j = 0; j < keys; j++) want += (double)row[j] * (double)vh[j * s->hd + d];
                const double e = fabs((double)split[(t * s->n_head + h) * s->hd + d] - want);
                if (e > worst) worst = e;
            }
        }
    CHECK_MSG(worst <= 1e-5,
              "%s, %d threads, %s, hd %lld, pos0 %lld, n %lld, window %lld: edited pattern mixed with "
              "error %.3g",
              set, threads, type_name(kt), (long long)s->hd, (long long)s->pos0, (long long)s->n, (long long)s->window,
              worst);
    free(fused);
    free(split);
    free(scratch);
    free(pattern);
}

int main(void) {
    static const shape shapes[] = {
        {4, 2, 32, 0, 1, 0},   {4, 2, 32, 0, 7, 0},    {4, 4, 64, 5, 1, 0},     {3, 1, 17, 3, 20, 0},
        {2, 1, 80, 0, 33, 4},  {4, 2, 136, 9, 1, 4},   {2, 2, 8, 16, 17, 16},   {8, 2, 128, 0, 31, 0},
        {4, 1, 64, 300, 1, 0}, {2, 1, 32, 250, 12, 0}, {4, 2, 16, 500, 3, 100}, /* across chunks of 256 keys */
    };
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    ember_compute *comp[3][3] = {{NULL}};
    for (size_t si = 0; si < 3; si++) {
        if (!ember_kernels_supported(sets[si])) {
            printf("  %s: not supported on this CPU, skipped\n", ember_kernels_name(sets[si]));
            continue;
        }
        for (int threads = 1; threads <= 3; threads++) {
            ember_error err;
            if (ember_compute_new(sets[si], threads, &comp[si][threads - 1], &err) != EMBER_OK)
                CHECK_MSG(false, "%.300s", err.msg);
        }
    }
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const shape *s = &shapes[i];
            const int64_t keys = s->pos0 + s->n, count = s->n_head_kv * keys * s->hd;
            float *q = malloc(sizeof(float) * (size_t)(s->n * s->n_head * s->hd)), *kf, *vf;
            for (int64_t j = 0; j < s->n * s->n_head * s->hd; j++) q[j] = 2.0f * uniform();
            void *k = random_cache(kv_types[ti], count, &kf), *v = random_cache(kv_types[ti], count, &vf);
            float *base = NULL;
            for (size_t si = 0; si < 3; si++)
                for (int th = 0; th < 3; th++) {
                    if (!comp[si][th]) continue;
                    check_run(comp[si][th], s, kv_types[ti], q, k, v, vf, base);
                    if (!base) { /* the first run's pattern-path output, for the bit comparisons */
                        base = malloc(sizeof(float) * (size_t)(s->n * s->n_head * s->hd));
                        const int64_t nc = (keys + EMBER_ATTN_CHUNK - 1) / EMBER_ATTN_CHUNK;
                        float *pat = malloc(sizeof(float) * (size_t)(s->n_head * s->n * keys));
                        ember_attention_args a = {.q = q,
                                                  .k = k,
                                                  .v = v,
                                                  .kv_type = kv_types[ti],
                                                  .out = base,
                                                  .n_chunks_cap = nc,
                                                  .n_head = s->n_head,
                                                  .n_head_kv = s->n_head_kv,
                                                  .hd = s->hd,
                                                  .kv_stride = s->hd,
                                                  .kv_head_stride = keys * s->hd,
                                                  .pos0 = s->pos0,
                                                  .n = s->n,
                                                  .window = s->window,
                                                  .scale = 1.0f / sqrtf((float)s->hd)};
                        ember_compute_attention_probs(comp[si][th], &a, pat);
                        ember_compute_attention_mix(comp[si][th], &a, pat);
                        free(pat);
                    }
                }
            free(base);
            free(q);
            free(k);
            free(v);
            free(kf);
            free(vf);
        }
    for (size_t si = 0; si < 3; si++)
        for (int th = 0; th < 3; th++)
            if (comp[si][th]) ember_compute_free(comp[si][th]);
    return ember_test_finish();
}
