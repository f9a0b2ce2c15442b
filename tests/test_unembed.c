/* test_unembed.c — ember_model_unembed and ember_model_weight_* on writer-made models of every family:
 * the last layer's residual, unembedded from inside the after_layer hook, equals the pass's own logits
 * bit for bit (every kernel set this CPU runs, 1 and 2 threads); weights come back as stored; bad
 * arguments and unknown names are errors naming them. */
#include "ember.h"
#include "gguf.h"
#include "kernels.h"
#include "tiny_model.h"
#include "test_support.h"

#include <stdlib.h>
#include <string.h>

#define N_TOKENS 7

typedef struct {
    const ember_model *m;
    int64_t last_layer;
    float *lens; /* (N_TOKENS, n_vocab) */
    ember_status st;
    int calls;
} lens_hook;

static ember_status on_after_layer(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *view,
                                   ember_error *err) {
    lens_hook *h = user;
    (void)stage;
    if (ctx->layer_index != h->last_layer) return EMBER_OK;
    h->calls++;
    h->st = ember_model_unembed(h->m, view->data, view->rows, h->lens, err);
    return h->st;
}

static void test_family(const char *family, ember_kernels kernels, int threads) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = family;
    p.dtype = EMBER_TYPE_Q8_0;
    char path[1100];
    snprintf(path, sizeof path, "%s/unembed-%s.gguf", ember_test_tmpdir(), family);
    ember_error err = {0};
    CHECK_MSG(ember_tiny_model_write(&p, path, &err) == EMBER_OK, "%.900s", err.msg);
    ember_model_params mp = {.path = path, .kernels = kernels, .n_threads = threads};
    ember_model *m = NULL;
    if (ember_model_load(&mp, &m, &err) != EMBER_OK) {
        CHECK_MSG(false, "%s: %.900s", family, err.msg);
        return;
    }
    const ember_model_info *in = ember_model_get_info(m);
    const int64_t V = in->n_vocab, d = in->hidden_size;
    ember_session *s = NULL;
    CHECK(ember_session_new(m, 32, &s, &err) == EMBER_OK);
    lens_hook h = {.m = m, .last_layer = in->n_layers - 1, .lens = malloc((size_t)(N_TOKENS * V) * sizeof(float))};
    ember_hooks hooks = {.user = &h};
    hooks.on_tensor[EMBER_STAGE_AFTER_LAYER] = on_after_layer;
    int32_t ids[N_TOKENS] = {1, 17, 33, 5, 250, 9, 101};
    CHECK(ember_session_prefill(s, ids, N_TOKENS, &hooks, &err) == EMBER_OK);
    CHECK_MSG(h.calls == 1 && h.st == EMBER_OK, "%s: %d calls, status %d", family, h.calls, h.st);
    /* the lens of the final residual's last row is the pass's own logits, bit for bit */
    CHECK_MSG(memcmp(h.lens + (N_TOKENS - 1) * V, ember_session_logits(s), (size_t)V * sizeof(float)) == 0,
              "%s (kernels %s, %d threads): unembed of the last residual row differs from the logits", family,
              in->kernels, threads);

    /* weights: shape and values as stored (the f32 norm vector), with or without ".weight" */
    int64_t n_out = 0, n_in = 0;
    CHECK(ember_model_weight_shape(m, "output_norm", &n_out, &n_in, &err) == EMBER_OK && n_out == 1 && n_in == d);
    float *w = malloc((size_t)d * sizeof(float));
    CHECK(ember_model_weight_f32(m, "output_norm.weight", w, &err) == EMBER_OK);
    const gguf_tensor *t = ember_gguf_find_tensor(ember_model_gguf(m), "output_norm.weight");
    CHECK(t && t->type == EMBER_TYPE_F32 && memcmp(w, t->data, (size_t)d * sizeof(float)) == 0);
    free(w);
    CHECK(ember_model_weight_shape(m, "blk.0.attn_output", &n_out, &n_in, &err) == EMBER_OK && n_out == d);
    CHECK(ember_model_weight_shape(m, "blk.0.nope", &n_out, &n_in, &err) == EMBER_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "'blk.0.nope'") && strstr(err.msg, path), "%.900s", err.msg);
    CHECK(ember_model_unembed(m, h.lens, 0, h.lens, &err) == EMBER_ERR_ARG);

    free(h.lens);
    ember_session_free(s);
    ember_model_free(m);
}

int main(void) {
    static const char *families[] = {"llama", "qwen3", "qwen2", "gemma4", "gpt2"};
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        if (!ember_kernels_supported(sets[k])) {
            printf("kernels %s: not supported by this CPU, not tested\n", ember_kernels_name(sets[k]));
            continue;
        }
        for (int threads = 1; threads <= 2; threads++)
            for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
                test_family(families[f], sets[k], threads);
    }
    return ember_test_finish();
}
