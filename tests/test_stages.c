/* test_stages.c — the one list of hook stage names (engine/stages.c): pipeline order, count and
 * out-of-range values, against the names the Lua API documents (docs/lua-api.md); and that a
 * forward pass hands every hook a context with tracing disabled (and never calls sae_features
 * without an SAE). */
#include "ember.h"
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

int main(void) {
    static const char *const expected[] = {"before_layer",   "attention_pattern", "attention_heads", "after_attention",
                                           "mlp_activation", "after_mlp",         "after_layer",     "sae_features",
                                           "before_logits",  "after_logits"};
    CHECK(ember_stage_count() == EMBER_STAGE_COUNT && EMBER_STAGE_COUNT == 10);
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) /* only an SAE splice calls sae_features */
        CHECK(ember_stage_sae((ember_stage)i) == (i == EMBER_STAGE_SAE_FEATURES));
    for (int i = 0; i < EMBER_STAGE_COUNT; i++) {
        const char *name = ember_stage_name((ember_stage)i);
        CHECK_MSG(name && strcmp(name, expected[i]) == 0, "stage %d is '%s', expected '%s'", i, name ? name : "(null)",
                  expected[i]);
    }
    CHECK(ember_stage_name(EMBER_STAGE_COUNT) == NULL && ember_stage_name((ember_stage)-1) == NULL);
    test_tracing_disabled();
    return ember_test_finish();
}
