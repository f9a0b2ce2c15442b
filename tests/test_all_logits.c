/* test_all_logits.c — ember_session_set_all_logits: a prefill then keeps every row's logits; on
 * each family the last row is bit for bit the default path's logits (hooks included), row t is
 * bit for bit the logits of a prefill of the first t+1 tokens (reference kernels, one thread),
 * the logits hooks still see one row, and with the switch off nothing is kept. */
#include "ember.h"
#include "tiny_model.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#define N_CTX 64
#define P 12

static const char *const FAMILIES[] = {"llama", "qwen3", "qwen2", "gemma4", "gpt2"};

/* after_logits: counts calls, checks the view is one row, and adds 1 to element 0 of it, so the
 * hooked value must be what the last row of all_logits holds. */
typedef struct {
    int calls;
    int64_t rows_seen;
} hook_state;

static ember_status bump_logits(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                                ember_error *err) {
    (void)stage;
    (void)ctx;
    (void)err;
    hook_state *h = user;
    h->calls++;
    h->rows_seen = v->rows;
    v->data[0] += 1.0f;
    return EMBER_OK;
}

static ember_session *new_session(ember_model *m) {
    ember_session *s = NULL;
    ember_error err = {0};
    CHECK_MSG(ember_session_new(m, N_CTX, &s, &err) == EMBER_OK, "%.900s", err.msg);
    return s;
}

static bool prefill(ember_session *s, const int32_t *ids, int64_t n, const ember_hooks *hooks) {
    ember_error err = {0};
    ember_status st = ember_session_prefill(s, ids, n, hooks, &err);
    CHECK_MSG(st == EMBER_OK, "%.900s", err.msg);
    return st == EMBER_OK;
}

static void check_family(const char *family) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = family;
    p.n_layer = 3;
    char path[1100];
    snprintf(path, sizeof path, "%s/all-logits-%s.gguf", ember_test_tmpdir(), family);
    ember_error err = {0};
    bool ok = ember_tiny_model_write(&p, path, &err) == EMBER_OK;
    CHECK_MSG(ok, "%s: %.900s", family, err.msg);
    if (!ok) return;
    ember_model *m = NULL;
    ember_model_params mp = {.path = path, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
    ok = ember_model_load(&mp, &m, &err) == EMBER_OK;
    CHECK_MSG(ok, "%s: %.900s", family, err.msg);
    if (!ok) return;
    const int64_t v = ember_model_get_info(m)->n_vocab;
    int32_t ids[P];
    for (int64_t i = 0; i < P; i++) ids[i] = (int32_t)((i * 89 + 7) % 500);

    /* every row, with the hook bumping the last row's first logit */
    hook_state h = {0};
    ember_hooks hooks = {.user = &h};
    hooks.on_tensor[EMBER_STAGE_AFTER_LOGITS] = bump_logits;
    ember_session *s = new_session(m);
    int64_t rows = -1;
    CHECK(ember_session_all_logits(s, &rows) == NULL && rows == 0); /* nothing before an evaluation */
    ember_session_set_all_logits(s, true);
    float *all = malloc((size_t)P * (size_t)v * sizeof(float));
    if (s && all && prefill(s, ids, P, &hooks)) {
        const float *a = ember_session_all_logits(s, &rows);
        CHECK_MSG(a != NULL && rows == P, "%s: %lld rows", family, (long long)rows);
        CHECK_MSG(h.calls == 1 && h.rows_seen == 1, "%s: after_logits ran %d times on %lld rows", family, h.calls,
                  (long long)h.rows_seen);
        if (a && rows == P) {
            memcpy(all, a, (size_t)P * (size_t)v * sizeof(float));
            CHECK_MSG(memcmp(all + (P - 1) * v, ember_session_logits(s), (size_t)v * sizeof(float)) == 0,
                      "%s: the last row is not the current logits", family);
        }
    }
    /* the default path, same hook: the last row bit for bit */
    ember_session *d = new_session(m);
    hook_state h2 = {0};
    hooks.user = &h2;
    if (d && prefill(d, ids, P, &hooks)) {
        CHECK_MSG(memcmp(all + (P - 1) * v, ember_session_logits(d), (size_t)v * sizeof(float)) == 0,
                  "%s: the last row differs from the default path", family);
        CHECK(ember_session_all_logits(d, &rows) == NULL && rows == 0); /* off: nothing kept */
    }
    /* row t against a prefill of the first t+1 tokens (no hooks: rows before the last never see one) */
    for (int64_t t = 0; t + 1 < P; t++) {
        ember_session *q = new_session(m);
        if (q && prefill(q, ids, t + 1, NULL))
            CHECK_MSG(memcmp(all + t * v, ember_session_logits(q), (size_t)v * sizeof(float)) == 0,
                      "%s: row %lld differs from a %lld-token prefill", family, (long long)t, (long long)t + 1);
        ember_session_free(q);
    }
    /* a decode with the switch on keeps its one row; turned off, the next evaluation keeps none */
    if (s) {
        ember_error e2 = {0};
        CHECK(ember_session_decode(s, ids[0], NULL, &e2) == EMBER_OK);
        const float *a = ember_session_all_logits(s, &rows);
        CHECK(a != NULL && rows == 1 && memcmp(a, ember_session_logits(s), (size_t)v * sizeof(float)) == 0);
        ember_session_set_all_logits(s, false);
        CHECK(ember_session_decode(s, ids[1], NULL, &e2) == EMBER_OK);
        CHECK(ember_session_all_logits(s, &rows) == NULL && rows == 0);
    }
    free(all);
    ember_session_free(s);
    ember_session_free(d);
    ember_model_free(m);
    remove(path);
}

int main(void) {
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++) check_family(FAMILIES[i]);
    return ember_test_finish();
}
