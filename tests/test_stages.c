/* test_stages.c — the stage table (engine/stages.c): names in pipeline order, count and
 * out-of-range values, against the names the Lua API documents (docs/lua-api.md); every row's
 * order, in_layer, rows, width and heads against what each family's forward pass hands its hooks
 * (which never call sae_features without an SAE); and that a forward pass hands every hook a
 * context with tracing disabled. */
#include "ember.h"
#include "model.h"
#include "test_support.h"
#include "ember_tiny_model.h"

#include <string.h>

typedef struct {
    int calls, tracing;
} seen;

static ember_status record(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *view,
                           ember_error *err) {
    seen *s = user;
    s->calls++;
    s->tracing += ctx->tracing;
    return EMBER_OK;
}

/* The hooks of a prefill and a decode on a tiny llama see ctx->tracing == false every time. */
static void test_tracing_disabled(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/stages-llama.gguf", ember_test_tmpdir());
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    ember_error err = {0};
    CHECK_MSG(ember_tiny_model_write(&p, path, &err) == EMBER_OK, "%.900s", err.msg);
    ember_model_params mp = {.path = path, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
    ember_model *m = NULL;
    ember_session *s = NULL;
    if (ember_model_load(&mp, &m, &err) != EMBER_OK || ember_session_new(m, 32, &s, &err) != EMBER_OK) {
        CHECK_MSG(false, "%.900s", err.msg);
        ember_model_free(m);
        return;
    }
    seen rec = {0};
    ember_hooks h = {.user = &rec};
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) h.on_tensor[i] = record;
    const int32_t ids[3] = {1, 2, 3};
    CHECK(ember_session_prefill(s, ids, 3, &h, &err) == EMBER_OK);
    CHECK(ember_session_decode(s, 4, &h, &err) == EMBER_OK);
    const int64_t layers = ember_model_get_info(m)->n_layers;
    CHECK_MSG(rec.calls == 2 * (7 * layers + 2), "%d hook calls for %lld layers", rec.calls, (long long)layers);
    CHECK_MSG(rec.tracing == 0, "%d of %d hook calls saw tracing set", rec.tracing, rec.calls);
    ember_session_free(s);
    ember_model_free(m);
}

/* Rows are well formed: a name, every enum spelled, order strictly increasing in table order. */
static void test_rows(void) {
    CHECK(ember_stage_get(EMBER_STAGE_COUNT) == NULL && ember_stage_get((ember_stage)-1) == NULL);
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) {
        const ember_stage_info *d = ember_stage_get((ember_stage)i);
        CHECK_MSG(d && d->name && d->name[0], "stage %d has no name", i);
        if (!d) continue;
        CHECK_MSG(ember_stage_rows_name(d->rows) && ember_stage_width_name(d->width) &&
                      ember_stage_heads_name(d->heads),
                  "%s: a field outside its enum", d->name);
        CHECK_MSG(d->inside_block == ember_stage_inside_block((ember_stage)i), "%s", d->name);
        if (i > 0)
            CHECK_MSG(ember_stage_get((ember_stage)(i - 1))->order < d->order, "%s: order not increasing", d->name);
        /* the layer stages all come before the others */
        if (i > 0 && d->in_layer) CHECK_MSG(ember_stage_get((ember_stage)(i - 1))->in_layer, "%s", d->name);
    }
}

/* What each hook call shows against its stage's row: layer_index, rows, columns, heads, and the
 * order of the calls within an evaluation. */
typedef struct {
    const ember_model *m;
    int calls, bad;
    int last_order;
    int64_t last_layer;
    char why[300];
} table_check;

static void table_bad(table_check *t, const char *what, ember_stage st, int64_t l) {
    if (!t->bad++)
        snprintf(t->why, sizeof t->why, "%s: %s at %s, layer %lld", t->m->family->info.name, what, ember_stage_name(st),
                 (long long)l);
}

static int64_t expected_width(const ember_model *m, const ember_stage_info *d, const ember_eval_ctx *ctx) {
    const ember_layer *L = ctx->layer_index >= 0 ? &m->layers[ctx->layer_index] : NULL;
    switch (d->width) {
    case EMBER_WIDTH_HIDDEN: return m->n_embd;
    case EMBER_WIDTH_N_FF: return L ? L->n_ff : -1;
    case EMBER_WIDTH_HEADS_X_HEAD_DIM: return L ? m->n_head * L->head_dim : -1;
    case EMBER_WIDTH_VOCAB: return m->n_vocab;
    case EMBER_WIDTH_PATTERN: return ctx->sequence_length;
    case EMBER_WIDTH_D_SAE: return -1; /* an SAE splice's: a pass alone never calls it */
    case EMBER_WIDTH_N_EXPERTS: return m->n_expert;
    }
    return -1;
}

static ember_status check_call(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                               ember_error *err) {
    (void)err;
    table_check *t = user;
    const ember_stage_info *d = ember_stage_get(stage);
    const int64_t n = ctx->input_token_count, l = ctx->layer_index;
    t->calls++;
    if (d->in_layer != (l >= 0)) table_bad(t, "in_layer", stage, l);
    /* within a layer (or after the last) each call is of a higher order than the one before */
    if (l == t->last_layer && d->order <= t->last_order) table_bad(t, "order", stage, l);
    if (l >= 0 && l < t->last_layer) table_bad(t, "layer order", stage, l);
    if (l < 0 && t->last_layer >= 0 && t->last_layer != t->m->n_layer - 1) table_bad(t, "layers skipped", stage, l);
    t->last_layer = l;
    t->last_order = d->order;
    const int64_t rows = d->rows == EMBER_ROWS_TOKENS ? n : d->rows == EMBER_ROWS_LAST ? 1 : t->m->n_head * n;
    if (v->rows != rows) table_bad(t, "rows", stage, l);
    if (v->cols != expected_width(t->m, d, ctx)) table_bad(t, "columns", stage, l);
    if (v->n_heads != (d->heads == EMBER_HEADS_NONE ? 0 : t->m->n_head)) table_bad(t, "heads", stage, l);
    return EMBER_OK;
}

/* The hook calls of one evaluation by the table: n_layer for each layer stage of the family, one for
 * each other stage. */
static int calls_per_evaluation(const char *family, int64_t n_layer) {
    int calls = 0;
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) {
        const ember_stage_info *d = ember_stage_get((ember_stage)i);
        bool has = d->families == NULL && !d->sae_only; /* sae_features: only where an SAE is spliced */
        for (const char *const *f = d->families; f && *f; f++) has = has || strcmp(*f, family) == 0;
        if (has) calls += d->in_layer ? (int)n_layer : 1;
    }
    return calls;
}

/* Every family's prefill and decode, every stage hooked, checked call by call against the table. */
static void test_table_matches_engine(void) {
    for (int f = 0; f < ember_family_count(); f++) {
        const char *family = ember_family_get(f)->name;
        char path[1100];
        snprintf(path, sizeof path, "%s/stages-table-%s.gguf", ember_test_tmpdir(), family);
        ember_tiny_model_params p;
        ember_tiny_model_defaults(&p);
        p.family = family;
        ember_error err = {0};
        CHECK_MSG(ember_tiny_model_write(&p, path, &err) == EMBER_OK, "%.900s", err.msg);
        ember_model_params mp = {.path = path, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
        ember_model *m = NULL;
        ember_session *s = NULL;
        if (ember_model_load(&mp, &m, &err) != EMBER_OK || ember_session_new(m, 32, &s, &err) != EMBER_OK) {
            CHECK_MSG(false, "%s: %.900s", family, err.msg);
            ember_model_free(m);
            continue;
        }
        table_check t = {.m = m, .last_layer = -2};
        ember_hooks h = {.user = &t};
        for (int i = 0; i < EMBER_STAGE_COUNT; i++) h.on_tensor[i] = check_call;
        const int32_t ids[3] = {1, 2, 3};
        CHECK(ember_session_prefill(s, ids, 3, &h, &err) == EMBER_OK);
        t.last_layer = -2;
        CHECK(ember_session_decode(s, 4, &h, &err) == EMBER_OK);
        CHECK_MSG(t.bad == 0, "%d disagreements, the first %s", t.bad, t.why);
        CHECK_MSG(t.calls == 2 * calls_per_evaluation(family, m->n_layer), "%s: %d hook calls", family, t.calls);
        ember_session_free(s);
        ember_model_free(m);
    }
}

int main(void) {
    static const char *const expected[] = {"before_layer", "attention_pattern", "attention_heads", "after_attention",
                                           "moe_router",   "mlp_activation",    "after_mlp",       "after_layer",
                                           "sae_features", "before_logits",     "after_logits"};
    CHECK(ember_stage_count() == EMBER_STAGE_COUNT && EMBER_STAGE_COUNT == 11);
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) /* only an SAE splice calls sae_features */
        CHECK(ember_stage_sae((ember_stage)i) == (i == EMBER_STAGE_SAE_FEATURES));
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) {
        const char *name = ember_stage_name((ember_stage)i);
        CHECK_MSG(name && strcmp(name, expected[i]) == 0, "stage %d is '%s', expected '%s'", i, name ? name : "(null)",
                  expected[i]);
    }
    CHECK(ember_stage_name(EMBER_STAGE_COUNT) == NULL && ember_stage_name((ember_stage)-1) == NULL);
    test_rows();
    test_table_matches_engine();
    test_tracing_disabled();
    return ember_test_finish();
}
