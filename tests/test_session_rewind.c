/* test_session_rewind.c — a session rewound to position p continues bit for bit as a run that
 * evaluated those p positions and then the new ones: every family of the parity fixtures, every
 * kernel set this CPU runs, 1, 2 and 3 threads with an f32 KV cache and 1 thread with f16. Byte for byte:
 *   - prefill(0..n) against prefill(0..p) + prefill(p..n) (p = 1, and p = the slice size);
 *   - prefill(A) rewound to p and continued with B[p..n] against a fresh prefill of A[0..p] ++ B[p..n],
 *     then decode steps from both (the cache rows p.. of A must be overwritten, those before kept);
 *   - a rewind past the position, or below 0, is refused and leaves the session as it was. */
#include "ember.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#define N_PROMPT 80 /* > the 50-token slice set below: the whole prompts are evaluated in slices */
#define N_DECODE 2

static const int64_t cut_points[] = {0, 1, 37, 50, N_PROMPT - 1};
#define N_CUTS (sizeof cut_points / sizeof cut_points[0])

typedef struct {
    ember_session *s;
    int64_t nv;
} ctx;

/* Logits of the last evaluation, then of N_DECODE decodes of fixed ids, into out
 * ((1 + N_DECODE) x nv). */
static bool finish(ctx *c, const int32_t *feed, float *out, ember_error *err) {
    memcpy(out, ember_session_logits(c->s), (size_t)c->nv * sizeof *out);
    for (int d = 0; d < N_DECODE; d++) {
        if (ember_session_decode(c->s, feed[d], NULL, err) != EMBER_OK) return false;
        memcpy(out + (size_t)(d + 1) * (size_t)c->nv, ember_session_logits(c->s), (size_t)c->nv * sizeof *out);
    }
    return true;
}

/* prefill(ids[0..n)) from a reset session, then the decodes */
static bool whole(ctx *c, const int32_t *ids, const int32_t *feed, float *out, ember_error *err) {
    ember_session_reset(c->s);
    return ember_session_prefill(c->s, ids, N_PROMPT, NULL, err) == EMBER_OK && finish(c, feed, out, err);
}

/* prefill(a[0..n)), rewind to p, prefill(b[p..n)), then the decodes */
static bool rewound(ctx *c, const int32_t *a, const int32_t *b, int64_t p, const int32_t *feed, float *out,
                    ember_error *err) {
    ember_session_reset(c->s);
    if (ember_session_prefill(c->s, a, N_PROMPT, NULL, err) != EMBER_OK) return false;
    if (ember_session_rewind(c->s, p, err) != EMBER_OK) return false;
    CHECK_MSG(ember_session_position(c->s) == p && ember_session_logits(c->s) == NULL,
              "after rewind(%lld): position %lld, logits %s", (long long)p, (long long)ember_session_position(c->s),
              ember_session_logits(c->s) ? "still current" : "void");
    return ember_session_prefill(c->s, b + p, N_PROMPT - p, NULL, err) == EMBER_OK && finish(c, feed, out, err);
}

/* prefill(ids[0..p)) + prefill(ids[p..n)), then the decodes (p > 0) */
static bool two_parts(ctx *c, const int32_t *ids, int64_t p, const int32_t *feed, float *out, ember_error *err) {
    ember_session_reset(c->s);
    return ember_session_prefill(c->s, ids, p, NULL, err) == EMBER_OK &&
           ember_session_prefill(c->s, ids + p, N_PROMPT - p, NULL, err) == EMBER_OK && finish(c, feed, out, err);
}

static void check_refusals(ctx *c, const int32_t *ids) {
    ember_error err = {0};
    ember_session_reset(c->s);
    CHECK(ember_session_prefill(c->s, ids, 5, NULL, &err) == EMBER_OK);
    CHECK(ember_session_rewind(c->s, 6, &err) == EMBER_ERR_ARG && strstr(err.msg, "rewind to position 6"));
    CHECK(ember_session_rewind(c->s, -1, &err) == EMBER_ERR_ARG);
    CHECK(ember_session_position(c->s) == 5 && ember_session_logits(c->s) != NULL);
    CHECK(ember_session_rewind(c->s, 5, &err) == EMBER_OK && ember_session_position(c->s) == 5);
}

/* One (model, set, KV, threads): every identity above; returns false when the case cannot run. */
static bool run_case(const char *path, ember_kernels k, ember_kv_type kv, int threads, const int32_t *raw_a,
                     const int32_t *raw_b, const char *label) {
    ember_model_params mp = {.path = path, .kernels = k, .n_threads = threads, .kv_cache = kv};
    ember_model *m = NULL;
    ember_error err = {0};
    ctx c = {0};
    if (ember_model_load(&mp, &m, &err) != EMBER_OK ||
        ember_session_new(m, N_PROMPT + N_DECODE + 1, &c.s, &err) != EMBER_OK) {
        CHECK_MSG(false, "%.300s: %.300s", path, err.msg);
        ember_model_free(m);
        return false;
    }
    c.nv = ember_model_get_info(m)->n_vocab;
    const size_t nout = (size_t)(1 + N_DECODE) * (size_t)c.nv;
    int32_t a[N_PROMPT], b[N_PROMPT], mixed[N_PROMPT], feed[N_DECODE] = {3, 5};
    for (int i = 0; i < N_PROMPT; i++) a[i] = (int32_t)(raw_a[i] % c.nv), b[i] = (int32_t)(raw_b[i] % c.nv);
    float *want = malloc(nout * sizeof *want), *got = malloc(nout * sizeof *got);
    CHECKF(whole(&c, a, feed, want, &err), "%s: prefill: %s", label, err.msg);
    for (size_t i = 0; i < N_CUTS; i++) {
        const int64_t p = cut_points[i];
        if ((p == 1 || p == 50) &&
            CHECKF(two_parts(&c, a, p, feed, got, &err), "%s: two parts at %lld: %s", label, (long long)p, err.msg))
            CHECK_MSG(memcmp(want, got, nout * sizeof *got) == 0,
                      "%s: prefill(0..%lld) + prefill(%lld..%d) differs from prefill(0..%d)", label, (long long)p,
                      (long long)p, N_PROMPT, N_PROMPT);
        memcpy(mixed, a, (size_t)p * sizeof *a);
        memcpy(mixed + p, b + p, (size_t)(N_PROMPT - p) * sizeof *b);
        float *fresh = malloc(nout * sizeof *fresh);
        if (CHECKF(whole(&c, mixed, feed, fresh, &err), "%s: mixed prefill: %s", label, err.msg) &&
            CHECKF(rewound(&c, a, b, p, feed, got, &err), "%s: rewind to %lld: %s", label, (long long)p, err.msg))
            CHECK_MSG(memcmp(fresh, got, nout * sizeof *got) == 0,
                      "%s: A rewound to %lld then B[%lld..] differs from a fresh A[0..%lld) ++ B[%lld..]", label,
                      (long long)p, (long long)p, (long long)p, (long long)p);
        free(fresh);
    }
    check_refusals(&c, a);
    free(want);
    free(got);
    ember_session_free(c.s);
    ember_model_free(m);
    return true;
}

int main(void) {
    setenv("EMBER_PREFILL_SLICE", "50", 1);
    static const char *cases[] = {"parity/llama-tiny-q8_0",  "parity/qwen3-tiny-q8_0", "parity/qwen2-tiny-q8_0",
                                  "parity/gemma4-tiny-q8_0", "parity/gpt2-tiny-q8_0",  "parity/llama-tiny-f16"};
    int32_t raw_a[N_PROMPT], raw_b[N_PROMPT];
    uint32_t r = 424242;
    for (int i = 0; i < N_PROMPT; i++) raw_a[i] = (int32_t)((r = r * 1103515245u + 12345u) >> 8);
    for (int i = 0; i < N_PROMPT; i++) raw_b[i] = (int32_t)((r = r * 1103515245u + 12345u) >> 8);
    int ran = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char path[2048];
        if (!ember_test_case_model(cases[c], path, sizeof path)) continue;
        for (size_t k = 0; k < EMBER_TEST_N_SETS; k++) {
            if (!ember_test_set_runs(k)) continue;
            for (int kv = 0; kv < 2; kv++)
                for (int threads = 1; threads <= (kv ? 1 : 3); threads++) { /* f16: the KV type, 1 thread */
                    char label[512];
                    snprintf(label, sizeof label, "%s %s %s KV %d threads", cases[c], ember_test_set_names[k],
                             kv ? "f16" : "f32", threads);
                    ran += run_case(path, ember_test_sets[k], kv ? EMBER_KV_F16 : EMBER_KV_F32, threads, raw_a, raw_b,
                                    label);
                }
        }
    }
    if (ran == 0) return ember_test_skip("no parity fixture found (set EMBER_FIXTURES)");
    printf("%d (case, set, KV, threads) combinations checked at %zu cut points\n", ran, N_CUTS);
    return ember_test_finish();
}
