/* test_layer_stages.c — the three stages inside a layer on every family's tiny model: call order
 * within each layer, view shapes and head counts (gemma4: per-layer head size and MLP width), the
 * pattern's masks, and the cost rule: unless attention_pattern is hooked the session never
 * allocates a pattern buffer, and read-only hooks on the three stages leave the logits
 * bit-identical (reference and the best kernel set, 1 and 2 threads); a written pattern is mixed. */
#include "ember.h"
#include "model.h"
#include "test_support.h"
#include "tiny_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CALLS 512

typedef struct {
    const ember_model *m;
    int n;
    ember_stage stage[MAX_CALLS];
    int64_t layer[MAX_CALLS];
    int bad; /* shape, head-count or mask violations */
    char why[256];
} recorder;

static void bad(recorder *r, const char *what, ember_stage st, int64_t l) {
    if (!r->bad++) snprintf(r->why, sizeof r->why, "%s at %s layer %lld", what, ember_stage_name(st), (long long)l);
}

static ember_status on_tensor(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                              ember_error *err) {
    (void)err;
    recorder *r = user;
    if (r->n < MAX_CALLS) {
        r->stage[r->n] = stage;
        r->layer[r->n] = ctx->layer_index;
        r->n++;
    }
    const ember_model *m = r->m;
    const int64_t n = ctx->input_token_count, l = ctx->layer_index;
    if (stage == EMBER_STAGE_ATTENTION_PATTERN) {
        if (v->rows != m->n_head * n || v->cols != ctx->sequence_length || v->n_heads != m->n_head)
            bad(r, "pattern shape", stage, l);
        const ember_layer *L = &m->layers[l];
        const int64_t window = L->sliding ? m->window : 0; /* only gemma4 has sliding layers */
        for (int64_t row = 0; row < v->rows; row++) {
            const int64_t p = ctx->start_position + row % n;
            const int64_t first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            double sum = 0.0;
            for (int64_t j = 0; j < v->cols; j++) {
                const float x = v->data[row * v->cols + j];
                if ((j < first || j > p) && x != 0.0f) bad(r, "masked key not 0", stage, l);
                sum += x;
            }
            if (fabs(sum - 1.0) > 1e-5) bad(r, "row does not sum to 1", stage, l);
        }
    } else if (stage == EMBER_STAGE_ATTENTION_HEADS) {
        if (v->rows != n || v->cols != m->n_head * m->layers[l].head_dim || v->n_heads != m->n_head)
            bad(r, "heads shape", stage, l);
    } else if (stage == EMBER_STAGE_MLP_ACTIVATION) {
        if (v->rows != n || v->cols != m->layers[l].n_ff || v->n_heads != 0) bad(r, "mlp shape", stage, l);
    } else if (v->n_heads != 0) {
        bad(r, "n_heads on a residual view", stage, l);
    }
    return EMBER_OK;
}

/* prefill of 20 tokens (crossing gemma4's window of 8) and two decode steps; logits of each. */
static bool run(ember_session *s, const ember_hooks *h, float *logits, int64_t n_vocab) {
    ember_error err = {0};
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = (int32_t)((i * 29 + 3) % 250);
    ember_session_reset(s);
    if (ember_session_prefill(s, ids, 20, h, &err) != EMBER_OK) return false;
    memcpy(logits, ember_session_logits(s), (size_t)n_vocab * sizeof(float));
    for (int k = 0; k < 2; k++) {
        if (ember_session_decode(s, (int32_t)(7 + k), h, &err) != EMBER_OK) return false;
        memcpy(logits + (k + 1) * n_vocab, ember_session_logits(s), (size_t)n_vocab * sizeof(float));
    }
    return true;
}

/* Zeroes key 0 of every pattern row at layer 0; `user` says whether it reports the write. */
static ember_status knock_key0(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                               ember_error *err) {
    (void)stage;
    (void)err;
    if (ctx->layer_index != 0) return EMBER_OK;
    for (int64_t r = 0; r < v->rows; r++) v->data[r * v->cols] = 0.0f;
    v->written = *(const bool *)user;
    return EMBER_OK;
}

/* Writes a NaN into the view of `*(ember_stage *)user` at layer 1 (reporting the write). */
static ember_status poison(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v, ember_error *err) {
    (void)err;
    if (stage != *(const ember_stage *)user || ctx->layer_index != 1) return EMBER_OK;
    v->data[0] = NAN;
    v->written = true;
    return EMBER_OK;
}

/* A NaN written at an inside stage fails the evaluation, and the locating pass names that stage. */
static void check_nonfinite(ember_session *s, const char *family) {
    const ember_stage stages[] = {EMBER_STAGE_ATTENTION_PATTERN, EMBER_STAGE_ATTENTION_HEADS,
                                  EMBER_STAGE_MLP_ACTIVATION};
    for (size_t i = 0; i < 3; i++) {
        ember_stage target = stages[i];
        ember_hooks h = {.user = &target};
        h.on_tensor[target] = poison;
        int32_t ids[4] = {5, 6, 7, 8};
        ember_error err = {0};
        ember_session_reset(s);
        ember_status st = ember_session_prefill(s, ids, 4, &h, &err);
        char want[96];
        snprintf(want, sizeof want, "at %s of layer 1", ember_stage_name(target));
        CHECK_MSG(st == EMBER_ERR_NONFINITE && strstr(err.msg, want), "%s, NaN at %s: status %d, '%.600s'", family,
                  ember_stage_name(target), (int)st, err.msg);
    }
}

static void check_family(const char *family, ember_kernels kernels, int threads) {
    char path[512];
    snprintf(path, sizeof path, "%s/layer-stages-%s.gguf", ember_test_tmpdir(), family);
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = family;
    ember_error err = {0};
    if (ember_tiny_model_write(&p, path, &err) != EMBER_OK) {
        CHECK_MSG(false, "%s: %.900s", family, err.msg);
        return;
    }
    ember_model_params mp = {.path = path, .kernels = kernels, .n_threads = threads};
    ember_model *m = NULL;
    ember_session *s = NULL;
    if (ember_model_load(&mp, &m, &err) != EMBER_OK || ember_session_new(m, 64, &s, &err) != EMBER_OK) {
        CHECK_MSG(false, "%s: %.900s", family, err.msg);
        ember_model_free(m);
        return;
    }
    const int64_t n_vocab = m->n_vocab, layers = m->n_layer;
    float *plain = malloc(3 * (size_t)n_vocab * sizeof(float)), *seen = malloc(3 * (size_t)n_vocab * sizeof(float));
    recorder rec = {.m = m};
    ember_hooks h = {.user = &rec};
    const char *set = ember_kernels_name(ember_compute_kernels(m->compute));

    /* no experiment, then every stage but the pattern: no pattern buffer either way */
    CHECK(run(s, NULL, plain, n_vocab));
    for (int st = 0; st < EMBER_STAGE_COUNT; st++)
        if (st != EMBER_STAGE_ATTENTION_PATTERN) h.on_tensor[st] = on_tensor;
    CHECK(run(s, &h, seen, n_vocab));
    CHECK_MSG(s->ws.pattern == NULL && s->ws.cap_pattern == 0, "%s/%s: a pattern buffer without a pattern hook", family,
              set);
    CHECK_MSG(memcmp(plain, seen, 3 * (size_t)n_vocab * sizeof(float)) == 0, "%s/%s x%d: read-only hooks moved logits",
              family, set, threads);

    /* every stage: the order within a layer, the pattern's buffer, and still the same logits */
    h.on_tensor[EMBER_STAGE_ATTENTION_PATTERN] = on_tensor;
    rec.n = 0;
    CHECK(run(s, &h, seen, n_vocab));
    CHECK_MSG(memcmp(plain, seen, 3 * (size_t)n_vocab * sizeof(float)) == 0,
              "%s/%s x%d: a read-only pattern hook moved logits", family, set, threads);
    CHECK_MSG(s->ws.pattern != NULL && s->ws.cap_pattern >= m->n_head * 20 * 20 && s->ws.cap_pattern >= m->n_head * 64,
              "%s: pattern buffer of %lld floats", family, (long long)s->ws.cap_pattern);
    CHECK_MSG(rec.bad == 0, "%s/%s: %d violations, first: %s", family, set, rec.bad, rec.why);
    const ember_stage order[7] = {EMBER_STAGE_BEFORE_LAYER,    EMBER_STAGE_ATTENTION_PATTERN,
                                  EMBER_STAGE_ATTENTION_HEADS, EMBER_STAGE_AFTER_ATTENTION,
                                  EMBER_STAGE_MLP_ACTIVATION,  EMBER_STAGE_AFTER_MLP,
                                  EMBER_STAGE_AFTER_LAYER};
    const int per_eval = (int)(7 * layers + 2);
    CHECK_MSG(rec.n == 3 * per_eval, "%s: %d calls, expected %d", family, rec.n, 3 * per_eval);
    int wrong = 0;
    for (int e = 0; e < 3 && rec.n == 3 * per_eval; e++)
        for (int64_t l = 0; l < layers; l++)
            for (int k = 0; k < 7; k++) {
                const int i = e * per_eval + (int)(l * 7) + k;
                wrong += rec.stage[i] != order[k] || rec.layer[i] != l;
            }
    CHECK_MSG(wrong == 0, "%s: %d calls out of order", family, wrong);

    /* A written pattern is mixed as it stands; one whose write is not reported is left to the
     * fused kernel (the contract of ember_view.written). */
    bool report = true;
    ember_hooks knock = {.user = &report};
    knock.on_tensor[EMBER_STAGE_ATTENTION_PATTERN] = knock_key0;
    CHECK(run(s, &knock, seen, n_vocab));
    CHECK_MSG(memcmp(plain, seen, (size_t)n_vocab * sizeof(float)) != 0, "%s/%s: the knockout changed nothing", family,
              set);
    report = false;
    CHECK(run(s, &knock, seen, n_vocab));
    CHECK_MSG(memcmp(plain, seen, 3 * (size_t)n_vocab * sizeof(float)) == 0, "%s/%s: an unreported write was mixed",
              family, set);
    if (kernels == EMBER_KERNELS_REFERENCE && threads == 1) check_nonfinite(s, family);
    free(plain);
    free(seen);
    ember_session_free(s);
    ember_model_free(m);
}

int main(void) {
    static const char *const families[] = {"llama", "qwen3", "qwen2", "gemma4", "gpt2"};
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AUTO};
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (size_t k = 0; k < 2; k++)
            for (int threads = 1; threads <= 2; threads++) check_family(families[f], sets[k], threads);
    return ember_test_finish();
}
