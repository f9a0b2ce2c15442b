/* test_quant_models.c — models whose weights are in the 4- to 6-bit types: a model in type T must
 * compute exactly what the f32 model holding T's dequantized weights computes (the reference
 * product is "dequantize, then the exact f32 product"), on every kernel set, for single-type and
 * mixed-type files (as llama.cpp's Q4_K_M mixes types per tensor). */
#include "ember.h"
#include "gguf.h"
#include "kernels.h"
#include "quants.h"
#include "tiny_model.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *tmp_path(const char *name) {
    static char path[4][1100];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/qmodel-%s", ember_test_tmpdir(), name);
    return p;
}

/* Dimensions that hold whole 256-value blocks in every matrix. */
static void params(ember_tiny_model_params *p, const char *family) {
    ember_tiny_model_defaults(p);
    p->family = family;
    p->n_layer = 2;
    p->n_embd = 256;
    p->n_head = 4;
    p->head_dim = 64;
    p->n_ff = 768;
    p->n_vocab = 512;
}

/* Rewrites `src` as a file where every tensor is f32: the quantized ones as their traits'
 * to_float gives them (exact). Tensor data is copied; metadata comes from `meta` (the same
 * model built in f32, so keys and the tokenizer are the same). */
static bool write_dequantized(const ember_gguf *src, const ember_tiny_model_params *meta, const char *out) {
    ember_tiny_model_params p = *meta;
    p.dtype = EMBER_TYPE_F32;
    ember_gguf_writer *w = ember_gguf_writer_new();
    ember_error err = {0};
    bool ok = w && ember_tiny_model_build(&p, w, &err) == EMBER_OK;
    for (uint64_t i = 0; ok && i < src->n_tensors; i++) {
        const gguf_tensor *t = &src->tensors[i];
        if (t->type == EMBER_TYPE_F32) continue;
        int64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= t->ne[d];
        float *x = malloc(sizeof(float) * (size_t)n);
        ember_type_traits_get(t->type)->to_float(t->data, x, n);
        ok = ember_gguf_writer_remove_tensor(w, t->name) &&
             ember_gguf_writer_add_tensor(w, t->name, EMBER_TYPE_F32, t->n_dims, t->ne, x) == EMBER_OK;
        free(x);
    }
    ok = ok && ember_gguf_writer_write(w, out, &err) == EMBER_OK;
    CHECK_MSG(ok, "writing %.100s: %.900s", out, err.msg);
    ember_gguf_writer_free(w);
    return ok;
}

#define N_PROMPT 7
#define N_DECODE 3

/* Logits after each of N_PROMPT prefill tokens' end and N_DECODE decode steps: (1 + N_DECODE) rows. */
static bool run(const char *path, ember_kernels k, float *out, int64_t n_vocab, const char **kernels_used) {
    ember_model *m = NULL;
    ember_session *s = NULL;
    ember_error err = {0};
    ember_model_params mp = {.path = path, .kernels = k, .n_threads = 2};
    bool ok = ember_model_load(&mp, &m, &err) == EMBER_OK;
    CHECK_MSG(ok, "load %s: %.900s", path, err.msg);
    if (!ok) return false;
    if (kernels_used) *kernels_used = ember_model_get_info(m)->kernels;
    ok = ember_session_new(m, 32, &s, &err) == EMBER_OK;
    int32_t ids[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) ids[i] = (int32_t)((i * 37 + 11) % n_vocab);
    ok = ok && ember_session_prefill(s, ids, N_PROMPT, NULL, &err) == EMBER_OK;
    if (ok) memcpy(out, ember_session_logits(s), sizeof(float) * (size_t)n_vocab);
    for (int d = 0; ok && d < N_DECODE; d++) {
        ok = ember_session_decode(s, (int32_t)((d * 101 + 3) % n_vocab), NULL, &err) == EMBER_OK;
        if (ok) memcpy(out + (d + 1) * n_vocab, ember_session_logits(s), sizeof(float) * (size_t)n_vocab);
    }
    CHECK_MSG(ok, "evaluate %s: %.900s", path, err.msg);
    ember_session_free(s);
    ember_model_free(m);
    return ok;
}

/* The quantized file against its dequantized twin: bit-identical logits on the reference set.
 * The SIMD sets quantize the activations for their integer products (Q8_K / Q8_0 / Q8_1, as
 * llama.cpp; Q2_K and Q3_K: the reference product, bit for bit, test_products), so their logits
 * are within simd_rel of the reference's: 1e-4 where only the other ops differ (attention, norms,
 * activations in SIMD order, as on the f32 parity fixtures), a few 1e-2 where the activations are
 * rounded to 8 bits (as the Q8_0 tiny model). */
static void compare_with_twin(const char *label, const char *qpath, const ember_tiny_model_params *p, double simd_rel) {
    ember_gguf *g = NULL;
    ember_error err = {0};
    if (!CHECKF(ember_gguf_open(qpath, &g, &err) == EMBER_OK, "%s: %.900s", label, err.msg)) return;
    char twin[1200];
    snprintf(twin, sizeof twin, "%s", tmp_path("twin.gguf"));
    bool ok = write_dequantized(g, p, twin);
    ember_gguf_close(g);
    if (!ok) return;
    const int64_t nv = p->n_vocab, rows = 1 + N_DECODE;
    float *a = malloc(sizeof(float) * (size_t)(nv * rows)), *b = malloc(sizeof(float) * (size_t)(nv * rows));
    if (run(qpath, EMBER_KERNELS_REFERENCE, a, nv, NULL) && run(twin, EMBER_KERNELS_REFERENCE, b, nv, NULL)) {
        CHECK_MSG(memcmp(a, b, sizeof(float) * (size_t)(nv * rows)) == 0,
                  "%s: logits differ from the dequantized f32 twin's on the reference set", label);
        float lo, hi;
        CHECK_MSG(ember_test_span(a, (size_t)(nv * rows), &lo, &hi) && hi - lo > 0.1f, "%s: logits %g..%g", label, lo,
                  hi);
        const ember_kernels sets[] = {EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512, EMBER_KERNELS_AUTO};
        for (int s = 0; s < 3; s++) {
            if (!ember_kernels_supported(sets[s])) continue;
            const char *used = "";
            if (run(qpath, sets[s], b, nv, &used)) {
                double rel = ember_test_rel_diff(b, a, nv * rows);
                CHECK_MSG(rel <= simd_rel, "%s: kernels %s: rel %.3g from the reference", label, used, rel);
            }
        }
    }
    free(a);
    free(b);
}

static void test_single_types(void) {
    static const ember_type types[] = {EMBER_TYPE_Q4_0, EMBER_TYPE_Q4_1, EMBER_TYPE_Q5_0,
                                       EMBER_TYPE_Q5_1, EMBER_TYPE_Q2_K, EMBER_TYPE_Q3_K,
                                       EMBER_TYPE_Q4_K, EMBER_TYPE_Q5_K, EMBER_TYPE_Q6_K};
    static const char *families[] = {"llama", "qwen3"}; /* separate head; tied head (embedding in T) */
    for (size_t f = 0; f < 2; f++)
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            ember_tiny_model_params p;
            params(&p, families[f]);
            p.dtype = types[t];
            char label[64];
            snprintf(label, sizeof label, "%s %s", families[f], ember_type_name(types[t]));
            const char *path = tmp_path("single.gguf");
            ember_error err = {0};
            if (!CHECKF(ember_tiny_model_write(&p, path, &err) == EMBER_OK, "%s: %.900s", label, err.msg)) continue;
            /* the SIMD sets quantize the activations for every type with kernels of its own (all but
             * Q2_K/Q3_K, which run the reference product there too) */
            const bool quantized_act = ember_type_traits_get(types[t])->vec_dot_type != EMBER_TYPE_F32;
            compare_with_twin(label, path, &p, quantized_act ? 3e-2 : 1e-4);
        }
}

/* A llama file mixing seven weight types, one per kind of tensor, as the K-quant mixes do. */
static void test_mixed_types(void) {
    static const struct {
        const char *suffix;
        ember_type type;
    } mix[] = {
        {"attn_q.weight", EMBER_TYPE_Q4_K},   {"attn_k.weight", EMBER_TYPE_Q5_K},
        {"attn_v.weight", EMBER_TYPE_Q6_K},   {"attn_output.weight", EMBER_TYPE_Q4_0},
        {"ffn_gate.weight", EMBER_TYPE_Q5_0}, {"ffn_up.weight", EMBER_TYPE_Q4_1},
        {"ffn_down.weight", EMBER_TYPE_Q8_0},
    };
    ember_tiny_model_params p;
    params(&p, "llama");
    p.dtype = EMBER_TYPE_F32;
    ember_gguf_writer *w = ember_gguf_writer_new();
    ember_error err = {0};
    const char *src = tmp_path("mixed-src.gguf"), *path = tmp_path("mixed.gguf");
    if (!CHECKF(ember_tiny_model_write(&p, src, &err) == EMBER_OK, "%.900s", err.msg)) return;
    ember_gguf *g = NULL;
    if (!CHECKF(ember_gguf_open(src, &g, &err) == EMBER_OK, "%.900s", err.msg)) return;
    bool ok = ember_tiny_model_build(&p, w, &err) == EMBER_OK;
    int replaced = 0;
    for (uint64_t i = 0; ok && i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        ember_type type = EMBER_TYPE_F32;
        if (strcmp(t->name, "output.weight") == 0) type = EMBER_TYPE_Q6_K;
        if (strcmp(t->name, "token_embd.weight") == 0) type = EMBER_TYPE_Q5_1;
        for (size_t k = 0; k < sizeof mix / sizeof mix[0]; k++) {
            size_t ln = strlen(t->name), ls = strlen(mix[k].suffix);
            if (ln > ls && strcmp(t->name + ln - ls, mix[k].suffix) == 0) type = mix[k].type;
        }
        if (type == EMBER_TYPE_F32) continue;
        float *x = malloc(t->size);
        memcpy(x, t->data, t->size);
        ok = ember_gguf_writer_remove_tensor(w, t->name) &&
             ember_gguf_writer_add_tensor(w, t->name, type, t->n_dims, t->ne, x) == EMBER_OK;
        free(x);
        replaced++;
    }
    ember_gguf_close(g);
    ok = ok && ember_gguf_writer_write(w, path, &err) == EMBER_OK;
    ember_gguf_writer_free(w);
    if (!CHECKF(ok && replaced == 2 + 7 * 2, "mixed file (%d tensors replaced): %.900s", replaced, err.msg)) return;
    ember_model *m = NULL;
    ember_model_params mp = {.path = path, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
    if (CHECKF(ember_model_load(&mp, &m, &err) == EMBER_OK, "%.900s", err.msg)) {
        const char *ds = ember_model_get_info(m)->dtype_summary;
        CHECK_MSG(strcmp(ds, "q4_0+q4_1+q5_0+q5_1+q8_0+q4_K+q5_K+q6_K") == 0, "dtype_summary %s", ds);
        ember_model_free(m);
    }
    compare_with_twin("mixed", path, &p, 3e-2); /* its ffn_down is Q8_0 (llama-tiny-q8_0: ~2e-2) */
}

/* One product per type and set through ember_matmul (threaded as the engine does): the reference
 * product equals the f32 product of the dequantized weights bit for bit, within f32 rounding of a
 * double-precision dot; a SIMD set gives the reference set's result bit for bit where it runs the
 * reference product (Q2_K, Q3_K) and is within the activation-rounding budget of it elsewhere
 * (its integer kernels: tests/test_simd_quants.c). */
static void test_products(void) {
    static const struct {
        ember_type type;
        void (*quantize)(const float *, void *, int64_t);
    } types[] = {
        {EMBER_TYPE_Q4_0, ember_quantize_row_q4_0}, {EMBER_TYPE_Q4_1, ember_quantize_row_q4_1},
        {EMBER_TYPE_Q5_0, ember_quantize_row_q5_0}, {EMBER_TYPE_Q5_1, ember_quantize_row_q5_1},
        {EMBER_TYPE_Q2_K, ember_quantize_row_q2_k}, {EMBER_TYPE_Q3_K, ember_quantize_row_q3_k},
        {EMBER_TYPE_Q4_K, ember_quantize_row_q4_k}, {EMBER_TYPE_Q5_K, ember_quantize_row_q5_k},
        {EMBER_TYPE_Q6_K, ember_quantize_row_q6_k},
    };
    const int64_t n_in = 512, n_out = 37, max_tok = 70;
    float *wf = malloc(sizeof(float) * (size_t)(n_in * n_out)), *wd = malloc(sizeof(float) * (size_t)(n_in * n_out));
    float *x = malloc(sizeof(float) * (size_t)(n_in * max_tok));
    float *y_ref = malloc(sizeof(float) * (size_t)(n_out * max_tok)),
          *y = malloc(sizeof(float) * (size_t)(n_out * max_tok));
    uint64_t st = 12345;
    for (int64_t i = 0; i < n_in * n_out; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        wf[i] = (float)((double)(st >> 11) * 0x1p-53 - 0.5);
    }
    for (int64_t i = 0; i < n_in * max_tok; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(st >> 11) * 0x1p-53 - 0.5) * 2.0f;
    }
    const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    ember_compute *c[3] = {NULL, NULL, NULL};
    ember_error err = {0};
    for (int s = 0; s < 3; s++)
        if (ember_kernels_supported(sets[s])) CHECK(ember_compute_new(sets[s], 2, &c[s], &err) == EMBER_OK);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const ember_type_traits *tr = ember_type_traits_get(types[t].type);
        const size_t row = ember_type_row_size(types[t].type, n_in);
        uint8_t *q = malloc(row * (size_t)n_out);
        for (int64_t o = 0; o < n_out; o++) types[t].quantize(wf + o * n_in, q + (size_t)o * row, n_in);
        for (int64_t o = 0; o < n_out; o++) tr->to_float(q + (size_t)o * row, wd + o * n_in, n_in);
        ember_matrix wq = {.type = types[t].type, .data = q, .n_in = n_in, .n_out = n_out, .row_bytes = row};
        ember_matrix w32 = {.type = EMBER_TYPE_F32,
                            .data = wd,
                            .n_in = n_in,
                            .n_out = n_out,
                            .row_bytes = sizeof(float) * (size_t)n_in};
        static const int64_t toks[] = {1, 3, 70};
        for (int k = 0; k < 3; k++) {
            const int64_t nt = toks[k];
            CHECK(ember_compute_reserve(c[0], types[t].type, n_in, &err) == EMBER_OK);
            ember_matmul(c[0], &wq, x, y_ref, nt);
            ember_matmul(c[0], &w32, x, y, nt);
            CHECK_MSG(memcmp(y, y_ref, sizeof(float) * (size_t)(nt * n_out)) == 0,
                      "%s, %lld tokens: the reference product is not the f32 product of the dequantized weights",
                      tr->name, (long long)nt);
            double worst = 0;
            for (int64_t tk = 0; tk < nt; tk++)
                for (int64_t o = 0; o < n_out; o++) {
                    double e = 0, mag = 0;
                    for (int64_t i = 0; i < n_in; i++) {
                        e += (double)wd[o * n_in + i] * x[tk * n_in + i];
                        mag += fabs((double)wd[o * n_in + i] * x[tk * n_in + i]);
                    }
                    double r = fabs(y_ref[tk * n_out + o] - e) / mag;
                    if (r > worst) worst = r;
                }
            CHECK_MSG(worst < 1e-5, "%s: reference product off the double dot by %.3g (relative to sum |w x|)",
                      tr->name, worst);
            for (int s = 1; s < 3; s++) {
                if (!c[s]) continue;
                if (!CHECKF(ember_compute_reserve(c[s], types[t].type, n_in, &err) == EMBER_OK, "%s: %.900s", tr->name,
                            err.msg))
                    continue;
                ember_matmul(c[s], &wq, x, y, nt);
                if (tr->vec_dot_type == EMBER_TYPE_F32) {
                    CHECK_MSG(memcmp(y, y_ref, sizeof(float) * (size_t)(nt * n_out)) == 0,
                              "%s, %lld tokens: kernels %s differ from the reference product", tr->name, (long long)nt,
                              ember_kernels_name(sets[s]));
                } else {
                    double num = 0, den = 0;
                    for (int64_t i = 0; i < nt * n_out; i++) {
                        num += ((double)y[i] - y_ref[i]) * ((double)y[i] - y_ref[i]);
                        den += (double)y_ref[i] * y_ref[i];
                    }
                    CHECK_MSG(num / den <= 2e-4, "%s, %lld tokens: kernels %s: nmse %.3g from the reference product",
                              tr->name, (long long)nt, ember_kernels_name(sets[s]), num / den);
                }
            }
        }
        free(q);
    }
    for (int s = 0; s < 3; s++) ember_compute_free(c[s]);
    free(wf);
    free(wd);
    free(x);
    free(y_ref);
    free(y);
}

int main(void) {
    test_products();
    test_single_types();
    test_mixed_types();
    return ember_test_finish();
}
