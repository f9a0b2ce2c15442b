/* test_batch.c — a batch changes no sequence's bits: for every family (its tiny model), every
 * kernel set this CPU runs and 1, 2 and 3 threads, random compositions (1 to 32 sequences of 1 to
 * 200 tokens, duplicates, one long prompt among short ones) are evaluated as one batch, then
 * decoded together, and each sequence's logits, every row's logits
 * and the values two hooked stages showed are compared byte for byte with the same sequence
 * evaluated alone on its own session (1 thread). A write to one sequence's rows reaches that
 * sequence only. Bad input: empty and over-long sequences, a session named twice, the
 * attention_pattern hook, a batch whose KV caches cannot fit. */
#include "ember.h"
#include "test_models.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_CTX 256
#define MAX_SEQ 32
#define LONG_LEN 200
#define CAP_STAGE 2 /* hooked stages: after_layer of layer 1, mlp_activation of the last layer */

typedef struct {
    int64_t n_seq;
    int64_t len[MAX_SEQ];
    int32_t ids[MAX_SEQ][LONG_LEN];
    int32_t next[MAX_SEQ]; /* the decoded token */
} composition;

/* What one evaluation showed: per hooked stage, its rows (rows x cols) as the hook saw them. */
typedef struct {
    float *data[CAP_STAGE];
    int64_t rows[CAP_STAGE], cols[CAP_STAGE];
    int64_t n_layer;
    int64_t add_to; /* -1: read only; else the sequence index whose after_layer rows get a write */
    bool ctx_ok;
} capture;

static uint32_t rng = 2024;
static uint32_t next_rand(void) { return (rng = rng * 1103515245u + 12345u) >> 8; }

static int stage_slot(ember_stage stage, const ember_eval_ctx *ctx, int64_t n_layer) {
    if (stage == EMBER_STAGE_AFTER_LAYER && ctx->layer_index == 1) return 0;
    if (stage == EMBER_STAGE_MLP_ACTIVATION && ctx->layer_index == n_layer - 1) return 1;
    return -1;
}

static ember_status capture_hook(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                                 ember_error *err) {
    (void)err;
    capture *c = user;
    int64_t rows = 0;
    for (int64_t i = 0; i < ctx->n_sequences; i++) {
        c->ctx_ok = c->ctx_ok && ctx->sequences[i].first_row == rows;
        rows += ctx->sequences[i].length;
    }
    c->ctx_ok = c->ctx_ok && rows == v->rows && rows == ctx->input_token_count;
    const int slot = stage_slot(stage, ctx, c->n_layer);
    if (slot < 0) return EMBER_OK;
    if (slot == 0 && c->add_to >= 0)
        for (int64_t i = 0; i < ctx->n_sequences; i++) {
            if (ctx->sequences[i].index != c->add_to) continue;
            float *first = v->data + ctx->sequences[i].first_row * v->cols;
            for (int64_t k = 0; k < ctx->sequences[i].length * v->cols; k++) first[k] += (float)(k % 5) * 0.5f;
            v->written = true;
        }
    free(c->data[slot]);
    c->data[slot] = malloc((size_t)(v->rows * v->cols) * sizeof(float));
    memcpy(c->data[slot], v->data, (size_t)(v->rows * v->cols) * sizeof(float));
    c->rows[slot] = v->rows, c->cols[slot] = v->cols;
    return EMBER_OK;
}

static ember_hooks capture_hooks(capture *c) {
    ember_hooks h = {.user = c};
    h.on_tensor[EMBER_STAGE_AFTER_LAYER] = capture_hook;
    h.on_tensor[EMBER_STAGE_MLP_ACTIVATION] = capture_hook;
    return h;
}

static void capture_free(capture *c) {
    for (int i = 0; i < CAP_STAGE; i++) free(c->data[i]), c->data[i] = NULL;
}

/* One sequence alone: its prefill logits and all rows' logits, the hooked stages, its decode logits. */
typedef struct {
    float *logits, *all, *decode;
    capture cap;
} solo_result;

static void solo_free(solo_result *r) {
    free(r->logits), free(r->all), free(r->decode);
    capture_free(&r->cap);
}

static bool run_solo(ember_model *m, const int32_t *ids, int64_t n, int32_t next, bool add, solo_result *r) {
    const ember_model_info *info = ember_model_get_info(m);
    const size_t v = (size_t)info->n_vocab;
    ember_session *s = NULL;
    ember_error err = {0};
    memset(r, 0, sizeof *r);
    r->cap = (capture){.n_layer = info->n_layers, .add_to = add ? 0 : -1, .ctx_ok = true};
    ember_hooks h = capture_hooks(&r->cap);
    if (!CHECKF(ember_session_new(m, N_CTX, &s, &err) == EMBER_OK, "session: %s", err.msg)) return false;
    ember_session_set_all_logits(s, true);
    bool ok = CHECKF(ember_session_prefill(s, ids, n, &h, &err) == EMBER_OK, "solo prefill: %s", err.msg);
    int64_t rows = 0;
    const float *all = ok ? ember_session_all_logits(s, &rows) : NULL;
    if (ok) {
        r->logits = malloc(v * sizeof(float));
        memcpy(r->logits, ember_session_logits(s), v * sizeof(float));
        r->all = malloc((size_t)rows * v * sizeof(float));
        memcpy(r->all, all, (size_t)rows * v * sizeof(float));
        ember_session_set_all_logits(s, false);
        ok = CHECKF(ember_session_decode(s, next, NULL, &err) == EMBER_OK, "solo decode: %s", err.msg);
    }
    if (ok) {
        r->decode = malloc(v * sizeof(float));
        memcpy(r->decode, ember_session_logits(s), v * sizeof(float));
    }
    ember_session_free(s);
    return ok;
}

/* A random composition: sizes 1..32, short prompts, one long one, some duplicates. */
static void compose(composition *c, int64_t n_seq, int64_t n_vocab) {
    c->n_seq = n_seq;
    const int64_t long_one = (int64_t)(next_rand() % (uint32_t)n_seq);
    for (int64_t i = 0; i < n_seq; i++) {
        if (i > 0 && next_rand() % 5 == 0) { /* a duplicate of an earlier sequence */
            const int64_t j = (int64_t)(next_rand() % (uint32_t)i);
            c->len[i] = c->len[j];
            memcpy(c->ids[i], c->ids[j], sizeof c->ids[i]);
            c->next[i] = c->next[j];
            continue;
        }
        c->len[i] = i == long_one ? LONG_LEN : 1 + (int64_t)(next_rand() % 24);
        for (int64_t t = 0; t < c->len[i]; t++) c->ids[i][t] = (int32_t)(next_rand() % (uint32_t)n_vocab);
        c->next[i] = (int32_t)(next_rand() % (uint32_t)n_vocab);
    }
}

/* Sequence i's rows of a batch capture equal the solo capture. */
static bool same_capture(const capture *batch, const ember_sequence *seq, const capture *solo) {
    for (int k = 0; k < CAP_STAGE; k++) {
        if (!batch->data[k] || !solo->data[k] || batch->cols[k] != solo->cols[k] || solo->rows[k] != seq->length)
            return false;
        const size_t bytes = (size_t)(seq->length * solo->cols[k]) * sizeof(float);
        if (memcmp(batch->data[k] + seq->first_row * batch->cols[k], solo->data[k], bytes) != 0) return false;
    }
    return true;
}

/* The composition as one batch, its items in a shuffled order of sessions (prefill hooked, every
 * session keeping all logits), then one decode step of all, compared with the solo results. */
static void run_batch(ember_model *m, const composition *c, solo_result *solo, const char *what) {
    const ember_model_info *info = ember_model_get_info(m);
    const size_t v = (size_t)info->n_vocab;
    ember_batch *b = NULL;
    ember_error err = {0};
    if (!CHECKF(ember_batch_new(m, c->n_seq, N_CTX, &b, &err) == EMBER_OK, "%s: batch: %s", what, err.msg)) return;
    ember_batch_item items[MAX_SEQ];
    int64_t order[MAX_SEQ]; /* items in a shuffled order of sessions */
    for (int64_t i = 0; i < c->n_seq; i++) order[i] = i;
    for (int64_t i = c->n_seq - 1; i > 0; i--) {
        const int64_t j = (int64_t)(next_rand() % (uint32_t)(i + 1)), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    for (int64_t i = 0; i < c->n_seq; i++) {
        const int64_t q = order[i];
        items[i] = (ember_batch_item){.index = q, .ids = c->ids[q], .n = c->len[q]};
        ember_session_set_all_logits(ember_batch_session(b, q), true);
    }
    capture cap = {.n_layer = info->n_layers, .add_to = -1, .ctx_ok = true};
    ember_hooks h = capture_hooks(&cap);
    if (CHECKF(ember_batch_eval(b, EMBER_PHASE_PREFILL, items, c->n_seq, &h, &err) == EMBER_OK, "%s: eval: %s", what,
               err.msg)) {
        CHECK_MSG(cap.ctx_ok, "%s: ctx->sequences do not tile the views' rows", what);
        int64_t row = 0;
        for (int64_t i = 0; i < c->n_seq; i++) {
            const int64_t q = order[i];
            ember_session *s = ember_batch_session(b, q);
            const ember_sequence seq = {.index = q, .first_row = row, .length = c->len[q]};
            row += c->len[q];
            int64_t rows = 0;
            const float *all = ember_session_all_logits(s, &rows);
            CHECK_MSG(memcmp(ember_session_logits(s), solo[q].logits, v * sizeof(float)) == 0,
                      "%s: sequence %lld (%lld tokens): logits differ from the solo run", what, (long long)q,
                      (long long)c->len[q]);
            CHECK_MSG(rows == c->len[q] && memcmp(all, solo[q].all, (size_t)rows * v * sizeof(float)) == 0,
                      "%s: sequence %lld: all-rows logits differ from the solo run", what, (long long)q);
            CHECK_MSG(same_capture(&cap, &seq, &solo[q].cap), "%s: sequence %lld: hooked stage values differ", what,
                      (long long)q);
            CHECK_MSG(ember_session_position(s) == c->len[q], "%s: sequence %lld at position %lld", what, (long long)q,
                      (long long)ember_session_position(s));
            ember_session_set_all_logits(s, false);
            items[i] = (ember_batch_item){.index = q, .ids = &c->next[q], .n = 1};
        }
        if (CHECKF(ember_batch_eval(b, EMBER_PHASE_DECODE, items, c->n_seq, NULL, &err) == EMBER_OK, "%s: decode: %s",
                   what, err.msg))
            for (int64_t q = 0; q < c->n_seq; q++)
                CHECK_MSG(memcmp(ember_session_logits(ember_batch_session(b, q)), solo[q].decode, v * sizeof(float)) ==
                              0,
                          "%s: sequence %lld: decode logits differ from the solo run", what, (long long)q);
    }
    capture_free(&cap);
    ember_batch_free(b);
}

/* Of two sequences, a write (not a uniform shift, which a LayerNorm would undo) to the second
 * one's after_layer rows reaches it (as the same write alone does) and leaves the first exactly as
 * it is alone. */
static void test_write_one(ember_model *m, const composition *c, const solo_result *plain, const char *what) {
    if (c->n_seq < 2) return;
    const size_t v = (size_t)ember_model_get_info(m)->n_vocab;
    solo_result written;
    if (!run_solo(m, c->ids[1], c->len[1], c->next[1], true, &written)) return;
    ember_batch *b = NULL;
    ember_error err = {0};
    CHECK(ember_batch_new(m, 2, N_CTX, &b, &err) == EMBER_OK);
    capture cap = {.n_layer = ember_model_get_info(m)->n_layers, .add_to = 1, .ctx_ok = true};
    ember_hooks h = capture_hooks(&cap);
    const ember_batch_item items[2] = {{0, c->ids[0], c->len[0]}, {1, c->ids[1], c->len[1]}};
    if (b && CHECKF(ember_batch_eval(b, EMBER_PHASE_PREFILL, items, 2, &h, &err) == EMBER_OK, "%s", err.msg)) {
        CHECK_MSG(memcmp(ember_session_logits(ember_batch_session(b, 0)), plain[0].logits, v * sizeof(float)) == 0,
                  "%s: a write to sequence 1 changed sequence 0", what);
        CHECK_MSG(memcmp(ember_session_logits(ember_batch_session(b, 1)), written.logits, v * sizeof(float)) == 0,
                  "%s: the write to sequence 1 is not what the same write does alone", what);
        CHECK_MSG(memcmp(written.logits, plain[1].logits, v * sizeof(float)) != 0, "%s: the write changed nothing",
                  what);
    }
    capture_free(&cap);
    solo_free(&written);
    ember_batch_free(b);
}

/* A NaN written into sequence 0 at layer 0 (which allows non-finite logits) and into sequence 1's last
 * row at layer 1: the error names sequence 2 (1-based) and its own NaN, the row counted within it. */
static ember_status nan_hook(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                             ember_error *err) {
    (void)user, (void)stage, (void)err;
    const ember_sequence *q = ctx->sequences;
    if (ctx->layer_index == 0) v->data[q[0].first_row * v->cols + 3] = NAN;
    if (ctx->layer_index == 1) v->data[(q[1].first_row + q[1].length - 1) * v->cols + 6] = NAN;
    return EMBER_OK;
}

static void test_nonfinite_located(ember_model *m) {
    ember_batch *b = NULL;
    ember_error err = {0};
    if (!CHECK(ember_batch_new(m, 2, 16, &b, &err) == EMBER_OK)) return;
    ember_session_set_allow_nonfinite(ember_batch_session(b, 0), true);
    const int32_t ids[5] = {1, 2, 3, 4, 5};
    const ember_batch_item items[2] = {{0, ids, 4}, {1, ids, 3}};
    ember_hooks h = {0};
    h.on_tensor[EMBER_STAGE_AFTER_ATTENTION] = nan_hook;
    CHECK(ember_batch_eval(b, EMBER_PHASE_PREFILL, items, 2, &h, &err) == EMBER_ERR_NONFINITE);
    CHECK_MSG(
        strstr(err.msg, "batch: sequence 2: ") &&
            strstr(err.msg, "first non-finite value at after_attention of layer 1 (0-based token row 2, column 6"),
        "%s", err.msg);
    ember_batch_free(b);
}

static void test_errors(ember_model *m) {
    ember_batch *b = NULL;
    ember_error err = {0};
    if (!CHECK(ember_batch_new(m, 2, 16, &b, &err) == EMBER_OK)) return;
    const int32_t ids[20] = {1, 2, 3};
    ember_batch_item items[2] = {{0, ids, 3}, {1, ids, 0}};
    CHECK(ember_batch_eval(b, EMBER_PHASE_PREFILL, items, 2, NULL, &err) == EMBER_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "sequence 2 is empty") != NULL, "%s", err.msg);
    items[1] = (ember_batch_item){1, ids, 20};
    CHECK(ember_batch_eval(b, EMBER_PHASE_PREFILL, items, 2, NULL, &err) == EMBER_ERR_CONTEXT);
    CHECK_MSG(strstr(err.msg, "sequence 2: context is full") != NULL, "%s", err.msg);
    items[1] = (ember_batch_item){0, ids, 2};
    CHECK(ember_batch_eval(b, EMBER_PHASE_PREFILL, items, 2, NULL, &err) == EMBER_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "named twice") != NULL, "%s", err.msg);
    items[1] = (ember_batch_item){1, ids, 2};
    capture cap = {.add_to = -1};
    ember_hooks h = {.user = &cap};
    h.on_tensor[EMBER_STAGE_ATTENTION_PATTERN] = capture_hook;
    CHECK(ember_batch_eval(b, EMBER_PHASE_PREFILL, items, 2, &h, &err) == EMBER_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "attention_pattern") != NULL, "%s", err.msg);
    CHECK(ember_session_position(ember_batch_session(b, 0)) == 0); /* nothing moved */
    ember_batch_free(b);
    b = NULL;
    CHECK(ember_batch_new(m, 4096, (int64_t)1 << 24, &b, &err) == EMBER_ERR_NOMEM && b == NULL);
    CHECK_MSG(strstr(err.msg, "4096 sequences of 16777216 positions need") && strstr(err.msg, "available"), "%s",
              err.msg);
}

/* Every kernel set and thread count of one family over the same compositions. */
static void test_family(const char *family) {
    char path[1100];
    snprintf(path, sizeof path, "%s/batch-%s.gguf", ember_test_tmpdir(), family);
    ember_test_write_model(ember_test_tiny_writer(family, EMBER_TYPE_Q8_0), path);
    static const int64_t sizes[] = {1, 5, 32};
    for (size_t k = 0; k < EMBER_TEST_N_SETS; k++) {
        if (!ember_test_set_runs(k)) continue;
        composition c;
        const int64_t n_seq = sizes[k % 3] + (int64_t)(next_rand() % 3);
        compose(&c, n_seq < MAX_SEQ ? n_seq : MAX_SEQ, 512);
        solo_result solo[MAX_SEQ];
        memset(solo, 0, sizeof solo);
        ember_model_params mp = {.path = path, .kernels = ember_test_sets[k], .n_threads = 1};
        ember_model *m = NULL;
        ember_error err = {0};
        if (!CHECKF(ember_model_load(&mp, &m, &err) == EMBER_OK, "%s: %s", family, err.msg)) return;
        bool ok = true;
        for (int64_t i = 0; ok && i < c.n_seq; i++) ok = run_solo(m, c.ids[i], c.len[i], c.next[i], false, &solo[i]);
        if (k == 0) test_errors(m), test_nonfinite_located(m);
        for (int threads = 1; ok && threads <= 3; threads++) {
            ember_model *mt = NULL;
            mp.n_threads = threads;
            if (!CHECKF(ember_model_load(&mp, &mt, &err) == EMBER_OK, "%s", err.msg)) break;
            char what[128];
            snprintf(what, sizeof what, "%s %s %d threads, %lld sequences", family, ember_test_set_names[k], threads,
                     (long long)c.n_seq);
            run_batch(mt, &c, solo, what);
            if (threads == 2) test_write_one(mt, &c, solo, what);
            ember_model_free(mt);
        }
        for (int64_t i = 0; i < c.n_seq; i++) solo_free(&solo[i]);
        ember_model_free(m);
    }
}

int main(void) {
    for (int i = 0; i < ember_family_count(); i++) test_family(ember_family_get(i)->name);
    printf("%d families: batches of 1 to 32 sequences against each sequence alone\n", ember_family_count());
    return ember_test_finish();
}
