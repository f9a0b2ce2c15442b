/* test_trace.c — the engine's trace stream (src/engine/trace.c) from the public API: the event
 * sequence of a tiny llama, ctx.tracing, the op fingerprints against what an after_layer hook sees,
 * the normalized fingerprint recomputed from the file, and identical runs giving identical traces. */
#include "ember.h"
#include "ember_tiny_model.h"
#include "test_support.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* after_layer: the fingerprint of every layer's output (in call order), and whether tracing was on. */
typedef struct {
    uint64_t fp[64];
    int n, tracing, calls;
} layer_seen;

static ember_status on_layer(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                             ember_error *err) {
    (void)stage, (void)err;
    layer_seen *s = user;
    s->calls++;
    s->tracing += ctx->tracing;
    if (s->n < 64) s->fp[s->n++] = ember_fingerprint_f32(v->data, v->rows * v->cols);
    return EMBER_OK;
}

/* FNV-1a 64 written out independently of the engine's. */
static uint64_t fnv(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* One traced run (prefill of 3 tokens, one decode) into path; returns the normalized fingerprint. */
static uint64_t traced_run(ember_model *m, const char *path, layer_seen *seen, int64_t *events) {
    ember_error err = {0};
    ember_session *s = NULL;
    ember_trace *t = NULL;
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f || ember_session_new(m, 16, &s, &err) != EMBER_OK || ember_trace_new(f, &t, &err) != EMBER_OK) {
        CHECK_MSG(false, "%.900s", err.msg);
        if (f) fclose(f);
        ember_session_free(s);
        return 0;
    }
    ember_session_set_trace(s, t);
    ember_hooks h = {.user = seen};
    h.on_tensor[EMBER_STAGE_AFTER_LAYER] = on_layer;
    const int32_t ids[3] = {5, 6, 7};
    CHECK(ember_session_prefill(s, ids, 3, &h, &err) == EMBER_OK);
    CHECK(ember_session_decode(s, 8, &h, &err) == EMBER_OK);
    CHECK(ember_trace_status(t, &err) == EMBER_OK);
    CHECK(ember_trace_eval_count(t) == 2);
    uint64_t fp = ember_trace_fingerprint(t);
    *events = ember_trace_event_count(t);
    ember_session_free(s);
    ember_trace_free(t);
    fclose(f);
    return fp;
}

int main(void) {
    char model_path[512], a[512], b[512];
    snprintf(model_path, sizeof model_path, "%s/trace-llama.gguf", ember_test_tmpdir());
    snprintf(a, sizeof a, "%s/trace-a.jsonl", ember_test_tmpdir());
    snprintf(b, sizeof b, "%s/trace-b.jsonl", ember_test_tmpdir());
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    ember_error err = {0};
    CHECK_MSG(ember_tiny_model_write(&p, model_path, &err) == EMBER_OK, "%.900s", err.msg);
    ember_model_params mp = {.path = model_path, .n_threads = 2};
    ember_model *m = NULL;
    if (ember_model_load(&mp, &m, &err) != EMBER_OK) {
        CHECK_MSG(false, "%.900s", err.msg);
        return ember_test_finish();
    }
    const int64_t L = ember_model_get_info(m)->n_layers;

    layer_seen sa = {0}, sb = {0};
    int64_t ea = 0, eb = 0;
    const uint64_t fa = traced_run(m, a, &sa, &ea), fb = traced_run(m, b, &sb, &eb);
    CHECK_MSG(fa == fb && ea == eb, "identical runs: %016" PRIx64 " / %016" PRIx64, fa, fb);
    CHECK_MSG(sa.tracing == sa.calls && sa.calls == 2 * L, "%d of %d hook calls saw tracing", sa.tracing, sa.calls);
    /* per evaluation: start, embed, 15 ops per layer, output_norm, output, end */
    CHECK_MSG(ea == 2 * (1 + 1 + 15 * L + 2 + 1), "%lld events for %lld layers", (long long)ea, (long long)L);

    /* Read trace a back: the normalized fingerprint from its lines, and each layer_output's
     * fingerprint against the hook's view of the same layer (nothing runs between them). */
    size_t len = 0;
    char *text = ember_read_file(a, &len);
    CHECK(text != NULL);
    uint64_t h = 0xcbf29ce484222325ull;
    int64_t lines = 0, outputs = 0;
    for (char *line = text; text && line < text + len;) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        if (!end) break;
        char *ms = strstr(line, ",\"ms\":");
        if (ms && ms < end) { /* the timing is left out: hash up to it, then the closing brace */
            h = fnv(h, line, (size_t)(ms - line));
            h = fnv(h, "}\n", 2);
        } else {
            h = fnv(h, line, (size_t)(end - line + 1));
        }
        char *op = strstr(line, "\"op\":\"layer_output\"");
        if (op && op < end) {
            char *fp = strstr(line, "\"fingerprint\":\"");
            CHECK(fp && fp < end);
            if (fp && outputs < sa.n) {
                uint64_t v = strtoull(fp + 15, NULL, 16);
                CHECK_MSG(v == sa.fp[outputs], "layer_output %lld: trace %016" PRIx64 ", hook %016" PRIx64,
                          (long long)outputs, v, sa.fp[outputs]);
            }
            outputs++;
        }
        lines++;
        line = end + 1;
    }
    CHECK_MSG(lines == ea, "%lld lines, %lld events", (long long)lines, (long long)ea);
    CHECK_MSG(outputs == 2 * L, "%lld layer_output lines", (long long)outputs);
    CHECK_MSG(h == fa, "normalized fingerprint recomputed %016" PRIx64 ", engine %016" PRIx64, h, fa);
    free(text);

    /* a NULL stream is refused, naming the function */
    ember_trace *t = NULL;
    CHECK(ember_trace_new(NULL, &t, &err) == EMBER_ERR_ARG && t == NULL && strstr(err.msg, "trace") != NULL);
    remove(a);
    remove(b);
    ember_model_free(m);
    return ember_test_finish();
}
