/* test_sae.c — the engine's SAE (src/engine/sae.c) from C: TopK keeps the k largest with ties going
 * to the lower index (hand-made pre-activations); encode and decode give identical bits for 1, 2
 * and 5 threads, and every kernel set this CPU runs agrees with the reference set within a named
 * budget, for every architecture and weight type; SAELens' [d_in, d_sae] layout and the transposed
 * Linear layout give the same SAE; bad parameters are errors naming them. Spliced into a tiny
 * llama's pass (ember_hooks.saes): unedited, every logit is bit-identical to the pass without it;
 * a feature zeroed at sae_features moves the logits, and the hook sees its layer and site;
 * reconstruction and a transcoder change them too; every evaluation is spliced. */
#include "ember.h"
#include "ember_tiny_model.h"
#include "test_rng.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define D_IN 40
#define D_SAE 70
#define ROWS 9

static ember_sae_tensor f32_tensor(const float *v, int64_t rows, int64_t cols) {
    return (ember_sae_tensor){.type = EMBER_TYPE_F32, .data = v, .rows = rows, .cols = cols};
}

/* An identity encoder on d values (W_enc = I), so the pre-activations are the inputs plus b_enc. */
static void topk_ties(void) {
    enum { D = 8 };
    float eye[D * D] = {0}, zeros[D] = {0};
    for (int i = 0; i < D; i++) eye[i * D + i] = 1.0f;
    ember_sae_params p = {.d_in = D,
                          .d_sae = D,
                          .d_out = D,
                          .dtype = EMBER_TYPE_F32,
                          .arch = EMBER_SAE_TOPK,
                          .k = 3,
                          .denormalize_output = true,
                          .kernels = EMBER_KERNELS_REFERENCE,
                          .n_threads = 1};
    p.w_enc = f32_tensor(eye, D, D);
    p.w_dec = f32_tensor(eye, D, D);
    p.b_enc = f32_tensor(zeros, 1, D);
    p.b_dec = f32_tensor(zeros, 1, D);
    ember_sae *s = NULL;
    ember_error err = {0};
    if (!CHECKF(ember_sae_new(NULL, &p, &s, &err) == EMBER_OK, "%s", err.msg)) return;
    /* row 0: 2.0 at 1, 5 and 6 with 1.0 at 0: the three 2.0s; row 1: 3.0 at 7, then 1.5 at 2, 4 and 6
     * (a tie for two places: 2 and 4 win); row 2: every value equal (0, 1, 2 win); row 3: negatives
     * only (kept, then relu'd to 0) */
    const float x[4][D] = {{1, 2, 0, 0, 0, 2, 2, 0},
                           {0, 0, 1.5f, 0, 1.5f, 0, 1.5f, 3},
                           {4, 4, 4, 4, 4, 4, 4, 4},
                           {-1, -2, -3, -4, -5, -6, -7, -8}};
    const float want[4][D] = {
        {0, 2, 0, 0, 0, 2, 2, 0}, {0, 0, 1.5f, 0, 1.5f, 0, 0, 3}, {4, 4, 4, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0}};
    float f[4][D];
    CHECK(ember_sae_encode(s, &x[0][0], 4, &f[0][0], &err) == EMBER_OK);
    CHECK(memcmp(f, want, sizeof want) == 0);
    ember_sae_free(s);
}

typedef struct {
    float w_enc[D_IN * D_SAE], w_enc_t[D_SAE * D_IN], w_dec[D_SAE * D_IN], w_dec_t[D_IN * D_SAE];
    float b_enc[D_SAE], b_dec[D_IN], thr[D_SAE], b_gate[D_SAE], b_mag[D_SAE], r_mag[D_SAE];
    float x[ROWS * D_IN];
} weights;

static void fill(weights *w) {
    ember_test_rng r = {.state = 28};
    for (int i = 0; i < D_IN; i++)
        for (int j = 0; j < D_SAE; j++) {
            w->w_enc[i * D_SAE + j] = w->w_enc_t[j * D_IN + i] = ember_test_rng_gaussian(&r, 3, 0.2f);
            w->w_dec[j * D_IN + i] = w->w_dec_t[i * D_SAE + j] = ember_test_rng_gaussian(&r, 3, 0.2f);
        }
    for (int j = 0; j < D_SAE; j++) {
        w->b_enc[j] = ember_test_rng_uniform(&r) * 0.3f;
        w->thr[j] = fabsf(ember_test_rng_uniform(&r)) * 0.3f;
        w->b_gate[j] = ember_test_rng_uniform(&r) * 0.3f;
        w->b_mag[j] = ember_test_rng_uniform(&r) * 0.3f;
        w->r_mag[j] = ember_test_rng_uniform(&r) * 0.3f;
    }
    for (int i = 0; i < D_IN; i++) w->b_dec[i] = ember_test_rng_uniform(&r) * 0.3f;
    for (int i = 0; i < ROWS * D_IN; i++) w->x[i] = ember_test_rng_gaussian(&r, 3, 1.0f) + 0.25f;
}

static ember_sae_params params_for(const weights *w, ember_sae_arch arch, ember_sae_norm norm, ember_type dtype,
                                   bool transposed) {
    ember_sae_params p = {.d_in = D_IN,
                          .d_sae = D_SAE,
                          .d_out = D_IN,
                          .dtype = dtype,
                          .arch = arch,
                          .k = 11,
                          .apply_b_dec_to_input = true,
                          .denormalize_output = true,
                          .norm = norm,
                          .scale_in = 0.7,
                          .scale_out = 0.8};
    p.w_enc = transposed ? f32_tensor(w->w_enc_t, D_SAE, D_IN) : f32_tensor(w->w_enc, D_IN, D_SAE);
    p.enc_by_feature = transposed;
    p.w_dec = transposed ? f32_tensor(w->w_dec_t, D_IN, D_SAE) : f32_tensor(w->w_dec, D_SAE, D_IN);
    p.dec_by_output = transposed;
    p.b_dec = f32_tensor(w->b_dec, 1, D_IN);
    if (arch == EMBER_SAE_GATED) {
        p.b_gate = f32_tensor(w->b_gate, 1, D_SAE);
        p.b_mag = f32_tensor(w->b_mag, 1, D_SAE);
        p.r_mag = f32_tensor(w->r_mag, 1, D_SAE);
    } else p.b_enc = f32_tensor(w->b_enc, 1, D_SAE);
    if (arch == EMBER_SAE_JUMPRELU) p.threshold = f32_tensor(w->thr, 1, D_SAE);
    return p;
}

static double max_rel(const float *a, const float *b, int64_t rows, int64_t cols) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double m = 1e-30;
        for (int64_t c = 0; c < cols; c++) m = fmax(m, fabs(b[r * cols + c]));
        for (int64_t c = 0; c < cols; c++) worst = fmax(worst, fabs((double)a[r * cols + c] - b[r * cols + c]) / m);
    }
    return worst;
}

/* Encode and decode of one configuration into f (ROWS, D_SAE) and out (ROWS, D_IN). */
static bool encode_decode(const ember_sae_params *p0, ember_kernels k, int threads, const float *x, float *f,
                          float *out) {
    ember_sae_params p = *p0;
    p.kernels = k;
    p.n_threads = threads;
    ember_sae *s = NULL;
    ember_error err = {0};
    bool ok = CHECKF(ember_sae_new(NULL, &p, &s, &err) == EMBER_OK, "%s", err.msg) &&
              CHECKF(ember_sae_encode(s, x, ROWS, f, &err) == EMBER_OK, "%s", err.msg) &&
              CHECKF(ember_sae_decode(s, f, x, ROWS, out, &err) == EMBER_OK, "%s", err.msg);
    ember_sae_free(s);
    return ok;
}

static void agreement(const weights *w) {
    static const ember_sae_arch archs[] = {EMBER_SAE_STANDARD, EMBER_SAE_JUMPRELU, EMBER_SAE_TOPK, EMBER_SAE_GATED};
    static const ember_sae_norm norms[] = {EMBER_SAE_NORM_NONE, EMBER_SAE_NORM_SCALE,
                                           EMBER_SAE_NORM_CONSTANT_NORM_RESCALE, EMBER_SAE_NORM_LAYER_NORM};
    static const ember_type types[] = {EMBER_TYPE_F32, EMBER_TYPE_F16, EMBER_TYPE_BF16};
    static float f0[ROWS * D_SAE], o0[ROWS * D_IN], f1[ROWS * D_SAE], o1[ROWS * D_IN];
    for (int a = 0; a < 4; a++)
        for (int n = 0; n < 4; n++)
            for (int t = 0; t < 3; t++) {
                ember_sae_params p = params_for(w, archs[a], norms[n], types[t], false);
                if (!encode_decode(&p, EMBER_KERNELS_REFERENCE, 1, w->x, f0, o0)) return;
                /* the same SAE from the transposed (Linear) layout: the same bits */
                ember_sae_params q = params_for(w, archs[a], norms[n], types[t], true);
                if (encode_decode(&q, EMBER_KERNELS_REFERENCE, 1, w->x, f1, o1))
                    CHECK_MSG(memcmp(f0, f1, sizeof f0) == 0 && memcmp(o0, o1, sizeof o0) == 0,
                              "arch %d norm %d type %d: layouts differ", a, n, t);
                for (int ks = EMBER_KERNELS_REFERENCE; ks <= EMBER_KERNELS_AVX512; ks++) {
                    if (!ember_kernels_supported((ember_kernels)ks)) continue;
                    float fa[ROWS * D_SAE], oa[ROWS * D_IN];
                    if (!encode_decode(&p, (ember_kernels)ks, 1, w->x, fa, oa)) continue;
                    /* f32 sums in another order: within 2e-6 of each row's largest value */
                    CHECK_MSG(max_rel(fa, f0, ROWS, D_SAE) < 2e-6 && max_rel(oa, o0, ROWS, D_IN) < 2e-6,
                              "set %d arch %d norm %d type %d: %.3g %.3g", ks, a, n, t, max_rel(fa, f0, ROWS, D_SAE),
                              max_rel(oa, o0, ROWS, D_IN));
                    for (int threads = 2; threads <= 5; threads += 3) {
                        if (!encode_decode(&p, (ember_kernels)ks, threads, w->x, f1, o1)) continue;
                        CHECK_MSG(memcmp(fa, f1, sizeof fa) == 0 && memcmp(oa, o1, sizeof oa) == 0,
                                  "set %d arch %d norm %d: %d threads change bits", ks, a, n, threads);
                    }
                }
            }
}

static void refusals(const weights *w) {
    ember_error err = {0};
    ember_sae *s = NULL;
    ember_sae_params p = params_for(w, EMBER_SAE_TOPK, EMBER_SAE_NORM_NONE, EMBER_TYPE_F32, false);
    p.kernels = EMBER_KERNELS_REFERENCE;
    p.n_threads = 1;
    p.k = D_SAE + 1;
    CHECK(ember_sae_new(NULL, &p, &s, &err) == EMBER_ERR_ARG && strstr(err.msg, "k = 71") && !s);
    p.k = 5;
    p.dtype = EMBER_TYPE_Q8_0;
    CHECK(ember_sae_new(NULL, &p, &s, &err) == EMBER_ERR_UNSUPPORTED && strstr(err.msg, "dtype q8_0"));
    p.dtype = EMBER_TYPE_F32;
    p.w_enc.rows = D_IN + 1;
    CHECK(ember_sae_new(NULL, &p, &s, &err) == EMBER_ERR_ARG && strstr(err.msg, "'W_enc' has shape [41, 70]"));
    p.w_enc.rows = D_IN;
    p.b_enc.data = NULL;
    p.arch = EMBER_SAE_JUMPRELU;
    p.threshold = (ember_sae_tensor){0};
    p.threshold_all = 0.1;
    CHECK(ember_sae_new(NULL, &p, &s, &err) == EMBER_OK); /* b_enc absent: zeros; one threshold for all */
    float f[ROWS * D_SAE], out[ROWS * D_IN];
    CHECK(ember_sae_encode(s, w->x, ROWS, f, &err) == EMBER_OK);
    for (int i = 0; i < ROWS * D_SAE; i++) CHECK(f[i] == 0.0f || f[i] > 0.1f);
    ember_sae_free(s);
    p = params_for(w, EMBER_SAE_STANDARD, EMBER_SAE_NORM_LAYER_NORM, EMBER_TYPE_F32, false);
    p.kernels = EMBER_KERNELS_REFERENCE;
    CHECK(ember_sae_new(NULL, &p, &s, &err) == EMBER_OK);
    CHECK(ember_sae_decode(s, f, NULL, ROWS, out, &err) == EMBER_ERR_ARG && strstr(err.msg, "layer_norm needs"));
    CHECK(ember_sae_direction(s, D_SAE, out, &err) == EMBER_ERR_ARG && strstr(err.msg, "feature 70"));
    ember_sae_free(s);
    p.d_out = D_IN - 1; /* a transcoder cannot subtract b_dec from its input */
    CHECK(ember_sae_new(NULL, &p, &s, &err) == EMBER_ERR_ARG && strstr(err.msg, "apply_b_dec_to_input"));
}

/* ---- splicing into a forward pass ---- */

typedef struct {
    int calls, edit_feature; /* edit_feature < 0: read only */
    int64_t layer;
    int site;
} features_hook;

static ember_status on_features(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *v,
                                ember_error *err) {
    (void)err;
    features_hook *h = user;
    h->calls++;
    h->layer = ctx->layer_index;
    h->site = ctx->sae_site;
    if (stage != EMBER_STAGE_SAE_FEATURES || v->cols != 64) return EMBER_ERR_ARG;
    if (h->edit_feature >= 0) {
        for (int64_t r = 0; r < v->rows; r++) v->data[r * v->cols + h->edit_feature] = 0.0f;
        v->written = true;
    }
    return EMBER_OK;
}

/* The logits after a 5-token prefill and one decode, with the given hooks. */
static bool logits_of(ember_model *m, const ember_hooks *h, float *out, int64_t n_vocab) {
    ember_session *s = NULL;
    ember_error err = {0};
    const int32_t ids[5] = {3, 1, 4, 1, 5};
    bool ok = CHECKF(ember_session_new(m, 16, &s, &err) == EMBER_OK, "%s", err.msg) &&
              CHECKF(ember_session_prefill(s, ids, 5, h, &err) == EMBER_OK, "%s", err.msg) &&
              CHECKF(ember_session_decode(s, 9, h, &err) == EMBER_OK, "%s", err.msg);
    if (ok) memcpy(out, ember_session_logits(s), (size_t)n_vocab * sizeof(float));
    ember_session_free(s);
    return ok;
}

static void splice(const weights *w) {
    char path[1100];
    snprintf(path, sizeof path, "%s/sae-llama.gguf", ember_test_tmpdir());
    ember_tiny_model_params tp;
    ember_tiny_model_defaults(&tp);
    ember_error err = {0};
    if (!CHECKF(ember_tiny_model_write(&tp, path, &err) == EMBER_OK, "%s", err.msg)) return;
    ember_model_params mp = {.path = path, .kernels = EMBER_KERNELS_AUTO, .n_threads = 2};
    ember_model *m = NULL;
    if (!CHECKF(ember_model_load(&mp, &m, &err) == EMBER_OK, "%s", err.msg)) return;
    const int64_t V = ember_model_get_info(m)->n_vocab, d = ember_model_get_info(m)->hidden_size;
    float *plain = malloc((size_t)V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    /* an SAE as wide as the model (64): random weights, biases 0 */
    static float enc[64 * 64], dec[64 * 64], zero[64];
    ember_test_rng r = {.state = 2828};
    for (int i = 0; i < 64 * 64; i++) {
        enc[i] = ember_test_rng_gaussian(&r, 3, 0.25f);
        dec[i] = ember_test_rng_gaussian(&r, 3, 0.25f);
    }
    ember_sae_params p = params_for(w, EMBER_SAE_STANDARD, EMBER_SAE_NORM_NONE, EMBER_TYPE_F32, false);
    p.d_in = p.d_out = p.d_sae = d;
    p.w_enc = f32_tensor(enc, 64, 64);
    p.w_dec = f32_tensor(dec, 64, 64);
    p.b_dec = p.b_enc = f32_tensor(zero, 1, 64);
    ember_sae *sae = NULL;
    CHECK(d == 64);
    if (d == 64 && CHECKF(ember_sae_new(m, &p, &sae, &err) == EMBER_OK, "%s", err.msg) &&
        logits_of(m, NULL, plain, V)) {
        ember_sae_site site = {.sae = sae,
                               .stage = EMBER_STAGE_AFTER_LAYER,
                               .layer = 2,
                               .stage_out = EMBER_STAGE_AFTER_LAYER,
                               .layer_out = 2};
        ember_sae_sites *sites = NULL;
        CHECK(ember_sae_sites_new(&site, 1, &sites, &err) == EMBER_OK);
        features_hook fh = {.edit_feature = -1};
        ember_hooks h = {.user = &fh, .saes = sites};
        h.on_tensor[EMBER_STAGE_SAE_FEATURES] = on_features;
        CHECK(logits_of(m, &h, got, V) && memcmp(plain, got, (size_t)V * sizeof(float)) == 0);
        CHECK(fh.calls == 2 && fh.layer == 2 && fh.site == 1);
        CHECK(ember_sae_sites_calls(sites, 0) == 2 && ember_sae_sites_changed_rows(sites, 0) == 0);
        int64_t moved = 0;
        for (int f = 0; f < 64 && moved == 0; f++) { /* the first feature whose ablation shows */
            fh.edit_feature = f;
            if (!logits_of(m, &h, got, V)) break;
            moved = memcmp(plain, got, (size_t)V * sizeof(float)) != 0;
        }
        CHECK(moved && ember_sae_sites_changed_rows(sites, 0) > 0);
        ember_sae_sites_free(sites);
        /* reconstruction and a transcoder (before_layer 1 -> after_mlp 1): the logits move */
        ember_sae_site recon[2] = {{.sae = sae,
                                    .stage = EMBER_STAGE_AFTER_LAYER,
                                    .layer = 0,
                                    .stage_out = EMBER_STAGE_AFTER_LAYER,
                                    .layer_out = 0,
                                    .splice = EMBER_SAE_SPLICE_RECONSTRUCTION},
                                   {.sae = sae,
                                    .stage = EMBER_STAGE_BEFORE_LAYER,
                                    .layer = 1,
                                    .stage_out = EMBER_STAGE_AFTER_MLP,
                                    .layer_out = 1,
                                    .splice = EMBER_SAE_SPLICE_RECONSTRUCTION}};
        for (int i = 0; i < 2; i++) {
            CHECK(ember_sae_sites_new(&recon[i], 1, &sites, &err) == EMBER_OK);
            ember_hooks hr = {.saes = sites};
            CHECK(logits_of(m, &hr, got, V) && memcmp(plain, got, (size_t)V * sizeof(float)) != 0);
            CHECK(ember_sae_sites_changed_rows(sites, 0) == 6); /* 5 prompt rows + 1 decoded */
            ember_sae_sites_free(sites);
        }
        /* a site that writes before it reads, or on the pattern, is refused */
        ember_sae_site bad = recon[1];
        bad.layer_out = 0;
        CHECK(ember_sae_sites_new(&bad, 1, &sites, &err) == EMBER_ERR_ARG && strstr(err.msg, "before it reads"));
        bad = recon[0];
        bad.stage = EMBER_STAGE_ATTENTION_PATTERN;
        CHECK(ember_sae_sites_new(&bad, 1, &sites, &err) == EMBER_ERR_ARG && strstr(err.msg, "cannot read"));
    }
    ember_sae_free(sae);
    free(plain);
    free(got);
    ember_model_free(m);
}

int main(void) {
    static weights w;
    fill(&w);
    topk_ties();
    agreement(&w);
    refusals(&w);
    splice(&w);
    return ember_test_finish();
}
