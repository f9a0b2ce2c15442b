/* test_model_families.c — the gemma4 and gpt2 families on tiny-model-made files, no fixture needed:
 * every dtype loads and runs deterministically; one-shot prefill, chunked prefill and token-by-token
 * decode agree on prompts longer than Gemma's sliding window; the window itself is checked from
 * outside (tokens beyond the receptive field of an all-sliding model cannot change its logits);
 * broken files are refused with errors that name what is wrong. */
#include "ember.h"
#include "gguf.h"
#include "tiny_model.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_VOCAB 512
#define N_CTX 64
#define WINDOW 8      /* the gemma4 default */
#define PROMPT_LEN 20 /* > 2 * WINDOW */
#define N_STEPS 9     /* prefill + 8 greedy decodes */
#define PAIR_TOL 1e-5 /* prefill vs decode on the reference kernels */

static const char *tmp_path(const char *name) {
    static char path[4][1100];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/families-%s", ember_test_tmpdir(), name);
    return p;
}

static void params_for(ember_tiny_model_params *p, const char *family, ember_type dtype) {
    ember_tiny_model_defaults(p);
    p->family = family;
    p->dtype = dtype;
}

/* Writes the model; returns its path, or NULL (after a failed check). */
static const char *write_model(const ember_tiny_model_params *p, const char *name) {
    const char *path = tmp_path(name);
    ember_error err = {0};
    ember_status st = ember_tiny_model_write(p, path, &err);
    CHECK_MSG(st == EMBER_OK, "%s: %.900s", name, err.msg);
    return st == EMBER_OK ? path : NULL;
}

static ember_status load(const char *path, ember_kernels kernels, ember_model **m, ember_error *err) {
    ember_model_params mp = {.path = path, .kernels = kernels, .n_threads = kernels == EMBER_KERNELS_REFERENCE ? 1 : 2};
    memset(err, 0, sizeof *err);
    *m = NULL;
    return ember_model_load(&mp, m, err);
}

static ember_model *load_ref(const char *path) {
    ember_model *m = NULL;
    ember_error err;
    if (!path) return NULL;
    CHECK_MSG(load(path, EMBER_KERNELS_REFERENCE, &m, &err) == EMBER_OK, "%s: %.900s", path, err.msg);
    return m;
}

/* A prompt of varied tokens; gemma4 prompts start with BOS as the tokenizer would put it. */
static void make_prompt(int32_t *ids, int64_t n, bool bos) {
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 97 + 13) % 500);
    if (bos && n > 0) ids[0] = N_VOCAB - 2;
}

static ember_session *new_session(ember_model *m) {
    ember_session *s = NULL;
    ember_error err = {0};
    CHECK_MSG(ember_session_new(m, N_CTX, &s, &err) == EMBER_OK, "%.900s", err.msg);
    return s;
}

/* Logits of the last token after one prefill of ids[0..n). false on error (checked). */
static bool prefill_logits(ember_model *m, const int32_t *ids, int64_t n, float *out) {
    ember_session *s = new_session(m);
    if (!s) return false;
    ember_error err = {0};
    bool ok = ember_session_prefill(s, ids, n, NULL, &err) == EMBER_OK;
    CHECK_MSG(ok, "prefill of %lld: %.900s", (long long)n, err.msg);
    if (ok) memcpy(out, ember_session_logits(s), N_VOCAB * sizeof(float));
    ember_session_free(s);
    return ok;
}

/* Prefill of the prompt, then greedy decodes: logits (N_STEPS, N_VOCAB) and the chosen ids. */
static bool run(ember_model *m, const int32_t *prompt, float *out, int32_t *ids) {
    ember_session *s = new_session(m);
    if (!s) return false;
    ember_error err = {0};
    bool ok = ember_session_prefill(s, prompt, PROMPT_LEN, NULL, &err) == EMBER_OK;
    CHECK_MSG(ok, "prefill: %.900s", err.msg);
    for (int step = 0; ok && step < N_STEPS; step++) {
        memcpy(out + step * N_VOCAB, ember_session_logits(s), N_VOCAB * sizeof(float));
        ids[step] = (int32_t)ember_argmax(out + step * N_VOCAB, N_VOCAB);
        if (step + 1 < N_STEPS) {
            ok = ember_session_decode(s, ids[step], NULL, &err) == EMBER_OK;
            CHECK_MSG(ok, "decode %d: %.900s", step, err.msg);
        }
    }
    ember_session_free(s);
    return ok;
}

/* Distinct tokens among `steps` greedy ones after the prompt. */
static int greedy_distinct(ember_model *m, const int32_t *prompt, int steps) {
    ember_session *s = new_session(m);
    ember_error err = {0};
    if (!s || ember_session_prefill(s, prompt, PROMPT_LEN, NULL, &err) != EMBER_OK) {
        ember_session_free(s);
        return 0;
    }
    bool seen[N_VOCAB] = {0};
    int distinct = 0;
    for (int i = 0; i < steps; i++) {
        int32_t id = (int32_t)ember_argmax(ember_session_logits(s), N_VOCAB);
        distinct += !seen[id];
        seen[id] = true;
        if (ember_session_decode(s, id, NULL, &err) != EMBER_OK) break;
    }
    ember_session_free(s);
    return distinct;
}

/* prefill logits of the f32 model of each family: the other dtypes are compared with them */
static float f32_logits[3][N_VOCAB];

static void test_family_dtype(int fam, const char *family, ember_type dtype, const char *dtype_name) {
    const bool gemma4 = strcmp(family, "gemma4") == 0;
    ember_tiny_model_params p;
    params_for(&p, family, dtype);
    char name[64];
    snprintf(name, sizeof name, "%s-%s.gguf", family, dtype_name);
    ember_model *m = load_ref(write_model(&p, name));
    if (!m) return;

    const ember_model_info *info = ember_model_get_info(m);
    CHECK(strcmp(info->family, family) == 0 && strcmp(info->architecture, family) == 0);
    CHECK_MSG(info->n_layers == 6 && info->hidden_size == 64 && info->n_vocab == N_VOCAB && info->n_heads == 4 &&
                  info->context_length == 256 && !info->experimental,
              "%s %s: %lld layers, hidden %lld, vocab %lld, %lld heads, context %lld", family, dtype_name,
              (long long)info->n_layers, (long long)info->hidden_size, (long long)info->n_vocab,
              (long long)info->n_heads, (long long)info->context_length);
    /* gemma4 reports the full layers' head size and layer 0's KV heads; gpt2 has no GQA */
    CHECK_MSG(gemma4 ? info->head_dim == 32 && info->n_kv_heads == 2 : info->head_dim == 16 && info->n_kv_heads == 4,
              "%s: head_dim %lld, kv heads %lld", family, (long long)info->head_dim, (long long)info->n_kv_heads);
    CHECK_MSG(info->dtype_summary && strstr(info->dtype_summary, dtype_name), "%s", info->dtype_summary);
    const gguf_kv *toks = ember_gguf_find(ember_model_gguf(m), "tokenizer.ggml.tokens");
    CHECK(toks && toks->value.v.arr.count == N_VOCAB);

    int32_t prompt[PROMPT_LEN];
    make_prompt(prompt, PROMPT_LEN, gemma4);
    static float a[N_STEPS * N_VOCAB], b[N_STEPS * N_VOCAB];
    int32_t ids_a[N_STEPS], ids_b[N_STEPS];
    if (!run(m, prompt, a, ids_a) || !run(m, prompt, b, ids_b)) {
        ember_model_free(m);
        return;
    }
    float lo, hi;
    bool finite = ember_test_span(a, N_STEPS * N_VOCAB, &lo, &hi);
    CHECK_MSG(finite, "%s %s: non-finite logits", family, dtype_name);
    CHECK_MSG(hi - lo > 5.0f && hi - lo < 60.0f, "%s %s: logits span [%g, %g]", family, dtype_name, lo, hi);
    if (gemma4) CHECK_MSG(hi < 30.0f && lo > -30.0f, "softcap 30: logits span [%g, %g]", lo, hi);
    CHECK_MSG(memcmp(a, b, sizeof a) == 0 && memcmp(ids_a, ids_b, sizeof ids_a) == 0, "%s %s: two sessions differ",
              family, dtype_name);
    /* the weights are scaled so that greedy output moves on rather than repeating one token */
    int distinct = greedy_distinct(m, prompt, 24);
    CHECK_MSG(distinct >= 6, "%s %s: greedy output has %d distinct tokens in 24", family, dtype_name, distinct);

    if (dtype == EMBER_TYPE_F32) {
        memcpy(f32_logits[fam], a, sizeof f32_logits[fam]);
    } else {
        /* These two families amplify rounding more than llama's (sharper attention, normalised
         * sub-layer outputs): about 2e-3, 1.5e-2 and 4e-2 on the defaults. */
        double tol = dtype == EMBER_TYPE_F16 ? 5e-3 : dtype == EMBER_TYPE_BF16 ? 5e-2 : 8e-2;
        double rel = ember_test_rel_diff(a, f32_logits[fam], N_VOCAB);
        CHECK_MSG(rel < tol, "%s %s vs f32: rel %.3g >= %.3g", family, dtype_name, rel, tol);
    }

    /* Token by token: after each prompt token the logits equal a one-shot prefill of the prompt so
     * far (positions before, at and after the window's edge), and the greedy continuation equals the
     * run's decode steps. */
    ember_session *s = new_session(m);
    ember_error err = {0};
    if (s) {
        static float one_shot[N_VOCAB];
        double worst = 0;
        int64_t worst_at = -1;
        bool ok = true;
        for (int64_t k = 1; k <= PROMPT_LEN && ok; k++) {
            ok = ember_session_decode(s, prompt[k - 1], NULL, &err) == EMBER_OK &&
                 prefill_logits(m, prompt, k, one_shot);
            double rel = ok ? ember_test_rel_diff(ember_session_logits(s), one_shot, N_VOCAB) : 1;
            if (rel > worst) {
                worst = rel;
                worst_at = k;
            }
        }
        CHECK_MSG(ok && worst < PAIR_TOL, "%s %s: token-by-token vs prefill: rel %.3g after %lld tokens (%.900s)",
                  family, dtype_name, worst, (long long)worst_at, err.msg);
        worst = 0;
        for (int step = 1; step < N_STEPS && ok; step++) {
            ok = ember_session_decode(s, ids_a[step - 1], NULL, &err) == EMBER_OK;
            double rel = ok ? ember_test_rel_diff(ember_session_logits(s), a + step * N_VOCAB, N_VOCAB) : 1;
            if (rel > worst) worst = rel;
        }
        CHECK_MSG(ok && worst < PAIR_TOL, "%s %s: decode after token-by-token vs after prefill: rel %.3g", family,
                  dtype_name, worst);

        /* chunked prefill: 5 tokens, then 15 at positions 5..19 (crossing the window's edge) */
        ember_session_reset(s);
        ok = ember_session_prefill(s, prompt, 5, NULL, &err) == EMBER_OK &&
             ember_session_prefill(s, prompt + 5, PROMPT_LEN - 5, NULL, &err) == EMBER_OK;
        CHECK_MSG(ok && ember_test_rel_diff(ember_session_logits(s), a, N_VOCAB) < PAIR_TOL,
                  "%s %s: chunked prefill differs (%.900s)", family, dtype_name, err.msg);
        ember_session_free(s);
    }
    ember_model_free(m);
}

/* ---- the sliding window, from outside ---------------------------------------------------------- */

/* The logits at the last prompt position change when the token at `edge` changes, and stay
 * bit-identical when every token before it changes: in prefill and in token-by-token decode. */
static void check_reach(const char *path, int edge, const char *what) {
    ember_model *m = load_ref(path);
    if (!m) return;
    int32_t prompt[PROMPT_LEN], other[PROMPT_LEN];
    make_prompt(prompt, PROMPT_LEN, true);
    static float a[N_VOCAB], b[N_VOCAB];
    memcpy(other, prompt, sizeof other);
    for (int i = 0; i < edge; i++) other[i] = (other[i] + 1 + i) % 500;
    CHECK(prefill_logits(m, prompt, PROMPT_LEN, a) && prefill_logits(m, other, PROMPT_LEN, b));
    CHECK_MSG(memcmp(a, b, sizeof a) == 0, "%s: tokens 0..%d changed the logits at position %d (rel %.3g)", what,
              edge - 1, PROMPT_LEN - 1, ember_test_rel_diff(a, b, N_VOCAB));
    ember_session *s = new_session(m);
    ember_error err = {0};
    if (s) {
        bool ok = true;
        for (int i = 0; i < PROMPT_LEN && ok; i++) ok = ember_session_decode(s, other[i], NULL, &err) == EMBER_OK;
        CHECK_MSG(ok && memcmp(ember_session_logits(s), b, sizeof b) == 0,
                  "%s: token-by-token decode differs from the prefill (%.900s)", what, err.msg);
        ember_session_free(s);
    }
    memcpy(other, prompt, sizeof other);
    other[edge] = (other[edge] + 1) % 500;
    CHECK(prefill_logits(m, other, PROMPT_LEN, b));
    CHECK_MSG(ember_test_rel_diff(a, b, N_VOCAB) > 0, "%s: token %d did not reach position %d", what, edge,
              PROMPT_LEN - 1);
    ember_model_free(m);
}

static void test_gemma4_window(void) {
    ember_tiny_model_params p;
    params_for(&p, "gemma4", EMBER_TYPE_F32);
    int32_t prompt[PROMPT_LEN], other[PROMPT_LEN];
    make_prompt(prompt, PROMPT_LEN, true);
    static float a[N_VOCAB], b[N_VOCAB];

    /* The same weights with a window wider than the prompt: the same logits while the prompt fits
     * in 8 tokens; from 9 tokens on the last position's sliding layers no longer see position 0. */
    ember_model *narrow = load_ref(write_model(&p, "window8.gguf"));
    p.sliding_window = 64;
    ember_model *wide = load_ref(write_model(&p, "window64.gguf"));
    if (narrow && wide) {
        CHECK(prefill_logits(narrow, prompt, WINDOW, a) && prefill_logits(wide, prompt, WINDOW, b) &&
              memcmp(a, b, sizeof a) == 0);
        CHECK(prefill_logits(narrow, prompt, WINDOW + 1, a) && prefill_logits(wide, prompt, WINDOW + 1, b) &&
              ember_test_rel_diff(a, b, N_VOCAB) > 0);
        CHECK(prefill_logits(narrow, prompt, PROMPT_LEN, a) && prefill_logits(wide, prompt, PROMPT_LEN, b));
        CHECK_MSG(ember_test_rel_diff(a, b, N_VOCAB) > 1e-3,
                  "a window of 8 and of 64 give the same logits for %d tokens: rel %.3g", PROMPT_LEN,
                  ember_test_rel_diff(a, b, N_VOCAB));
        /* the full layers see the whole prompt: the first token after BOS matters at the end */
        memcpy(other, prompt, sizeof other);
        other[1] = (other[1] + 1) % 500;
        CHECK(prefill_logits(narrow, other, PROMPT_LEN, b) && ember_test_rel_diff(a, b, N_VOCAB) > 1e-4);
    }
    ember_model_free(narrow);
    ember_model_free(wide);

    /* Every layer sliding, window 4: each attention reaches 3 positions back. Without shared KV,
     * six hops reach from the last position (19) back to position 1; token 0 cannot matter. */
    params_for(&p, "gemma4", EMBER_TYPE_F32);
    p.swa_pattern = "SSSSSS";
    p.sliding_window = 4;
    p.shared_kv_layers = 0;
    check_reach(write_model(&p, "all-sliding.gguf"), 1, "all sliding, no shared KV");
    /* With the last 2 layers reading layer 2's cache (K/V made from layer 2's input), only layers
     * 0..3 make keys of their own: four hops, back to position 7. A shared layer that computed K/V
     * from its own input would reach further. */
    p.shared_kv_layers = 2;
    check_reach(write_model(&p, "all-sliding-shared.gguf"), 7, "all sliding, 2 shared-KV layers");
}

/* ---- variants the writer can make ----------------------------------------------------------- */

static void test_gemma4_variants(void) {
    /* No per-layer inputs, no softcap, no rope_freqs, no shared KV, untied: still a valid model. */
    ember_tiny_model_params p;
    params_for(&p, "gemma4", EMBER_TYPE_BF16);
    p.ple_dim = 0;
    p.softcap = 0;
    p.rope_freqs = 0;
    p.shared_kv_layers = 0;
    p.tied = 0;
    ember_model *m = load_ref(write_model(&p, "plain.gguf"));
    if (m) {
        const ember_gguf *g = ember_model_gguf(m);
        CHECK(!ember_gguf_find_tensor(g, "per_layer_token_embd.weight") &&
              !ember_gguf_find_tensor(g, "rope_freqs.weight") && ember_gguf_find_tensor(g, "output.weight") &&
              ember_gguf_find_tensor(g, "blk.5.attn_k.weight"));
        int32_t prompt[PROMPT_LEN], ids[N_STEPS];
        make_prompt(prompt, PROMPT_LEN, true);
        static float a[N_STEPS * N_VOCAB];
        if (run(m, prompt, a, ids)) {
            float lo, hi;
            CHECK(ember_test_span(a, N_STEPS * N_VOCAB, &lo, &hi));
        }
        ember_model_free(m);
    }

    /* A deeper model with its own head sizes, KV heads and pattern, from the writer's settings. */
    params_for(&p, "gemma4", EMBER_TYPE_Q8_0);
    p.n_layer = 10;
    p.swa_pattern = "SSSSSFSSSF";
    p.shared_kv_layers = 4; /* kv_from 6: sliding layers read layer 4, full ones layer 5 */
    p.head_dim_swa = 32;
    p.head_dim = 64;
    p.n_head_kv = 4;
    p.n_head_kv_full = 1;
    p.sliding_window = 5;
    m = load_ref(write_model(&p, "deep.gguf"));
    if (m) {
        const ember_model_info *info = ember_model_get_info(m);
        CHECK(info->n_layers == 10 && info->head_dim == 64 && info->n_kv_heads == 4);
        int32_t prompt[PROMPT_LEN], ids[N_STEPS];
        make_prompt(prompt, PROMPT_LEN, true);
        static float a[N_STEPS * N_VOCAB], one[N_VOCAB];
        ember_session *s = new_session(m);
        ember_error err = {0};
        if (s && run(m, prompt, a, ids)) {
            bool ok = true;
            for (int i = 0; i < PROMPT_LEN && ok; i++) ok = ember_session_decode(s, prompt[i], NULL, &err) == EMBER_OK;
            CHECK(ok && prefill_logits(m, prompt, PROMPT_LEN, one));
            CHECK_MSG(ok && ember_test_rel_diff(ember_session_logits(s), one, N_VOCAB) < PAIR_TOL,
                      "deep gemma4: decode vs prefill");
        }
        ember_session_free(s);
        ember_model_free(m);
    }
}

/* ---- refusals --------------------------------------------------------------------------------- */

static void expect_refused(const char *what, const char *path, ember_status code, const char *s1, const char *s2) {
    ember_model *m = NULL;
    ember_error err;
    ember_status st = load(path, EMBER_KERNELS_REFERENCE, &m, &err);
    CHECK_MSG(st == code && m == NULL, "%s: status %d (expected %d): %.700s", what, st, code, err.msg);
    if (m) ember_model_free(m);
    CHECK_MSG(strstr(err.msg, path) != NULL, "%s: message does not name the file: %.700s", what, err.msg);
    if (s1) CHECK_MSG(strstr(err.msg, s1) != NULL, "%s: message lacks '%s': %.700s", what, s1, err.msg);
    if (s2) CHECK_MSG(strstr(err.msg, s2) != NULL, "%s: message lacks '%s': %.700s", what, s2, err.msg);
}

static ember_gguf_writer *build(const char *family) {
    ember_tiny_model_params p;
    params_for(&p, family, EMBER_TYPE_F32);
    ember_gguf_writer *w = ember_gguf_writer_new();
    ember_error err = {0};
    CHECK_MSG(w && ember_tiny_model_build(&p, w, &err) == EMBER_OK, "%.900s", err.msg);
    return w;
}

static const char *finish(ember_gguf_writer *w, const char *name) {
    const char *path = tmp_path(name);
    ember_error err = {0};
    CHECK_MSG(ember_gguf_writer_write(w, path, &err) == EMBER_OK, "%.900s", err.msg);
    ember_gguf_writer_free(w);
    return path;
}

static void add_zeros(ember_gguf_writer *w, const char *name, uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    float *v = calloc((size_t)(ne0 * ne1 * ne2), sizeof *v);
    CHECK(v && ember_gguf_writer_add_tensor(w, name, EMBER_TYPE_F32, n_dims, ne, v) == EMBER_OK);
    free(v);
}

static void test_refusals(void) {
    /* Gemma 4 with experts (the MoE variant): refused, naming the tensor and why. */
    ember_gguf_writer *w = build("gemma4");
    add_zeros(w, "blk.0.ffn_gate_up_exps.weight", 3, 64, 256, 4);
    expect_refused("gemma4 experts", finish(w, "moe.gguf"), EMBER_ERR_UNSUPPORTED, "'blk.0.ffn_gate_up_exps.weight'",
                   "mixture-of-experts");

    w = build("gemma4");
    ember_gguf_writer_remove_tensor(w, "blk.1.attn_k.weight");
    expect_refused("gemma4 without attn_k", finish(w, "nok.gguf"), EMBER_ERR_FORMAT, "'blk.1.attn_k.weight'",
                   "missing");

    w = build("gemma4"); /* a full layer's K has the sliding layers' shape */
    ember_gguf_writer_remove_tensor(w, "blk.3.attn_q.weight");
    add_zeros(w, "blk.3.attn_q.weight", 2, 64, 64, 1);
    expect_refused("gemma4 full layer with a sliding Q", finish(w, "fullq.gguf"), EMBER_ERR_FORMAT,
                   "'blk.3.attn_q.weight'", "expected [64, 128]");

    /* 3 shared layers: kv_from 3, so layer 3 (full) would read layer 2 (sliding). */
    w = build("gemma4");
    ember_gguf_writer_remove_key(w, "gemma4.attention.shared_kv_layers");
    ember_gguf_writer_set_u32(w, "gemma4.attention.shared_kv_layers", 3);
    expect_refused("gemma4 shared KV of the wrong kind", finish(w, "shared.gguf"), EMBER_ERR_FORMAT, "layer 3",
                   "layer 2");

    w = build("gemma4");
    ember_gguf_writer_remove_key(w, "gemma4.attention.sliding_window_pattern");
    const uint8_t five[5] = {1, 1, 1, 0, 1};
    ember_gguf_writer_set_array(w, "gemma4.attention.sliding_window_pattern", GGUF_TYPE_BOOL, five, 5);
    expect_refused("gemma4 pattern of the wrong length", finish(w, "pattern.gguf"), EMBER_ERR_FORMAT,
                   "gemma4.attention.sliding_window_pattern", NULL);

    w = build("gemma4");
    ember_gguf_writer_remove_key(w, "gemma4.feed_forward_length");
    const uint32_t ff[4] = {128, 128, 128, 128};
    ember_gguf_writer_set_array(w, "gemma4.feed_forward_length", GGUF_TYPE_UINT32, ff, 4);
    expect_refused("gemma4 per-layer widths for 4 of 6 layers", finish(w, "ff.gguf"), EMBER_ERR_FORMAT,
                   "gemma4.feed_forward_length", NULL);

    w = build("gemma4");
    ember_gguf_writer_remove_tensor(w, "blk.2.inp_gate.weight");
    expect_refused("gemma4 without a PLE gate", finish(w, "noplegate.gguf"), EMBER_ERR_FORMAT,
                   "'blk.2.inp_gate.weight'", NULL);

    w = build("gpt2");
    ember_gguf_writer_remove_tensor(w, "blk.4.attn_qkv.bias");
    expect_refused("gpt2 without the QKV bias", finish(w, "noqkvb.gguf"), EMBER_ERR_FORMAT, "'blk.4.attn_qkv.bias'",
                   NULL);

    w = build("gpt2");
    ember_gguf_writer_remove_tensor(w, "position_embd.weight");
    expect_refused("gpt2 without positions", finish(w, "nopos.gguf"), EMBER_ERR_FORMAT, "'position_embd.weight'", NULL);

    /* GPT-NeoX: the keys llama.cpp requires, a rotary part larger than the head, no tied head */
    w = build("gptneox");
    ember_gguf_writer_remove_key(w, "gptneox.use_parallel_residual");
    expect_refused("gptneox without use_parallel_residual", finish(w, "neox-nopar.gguf"), EMBER_ERR_FORMAT,
                   "'gptneox.use_parallel_residual'", "missing");
    w = build("gptneox");
    ember_gguf_writer_remove_key(w, "gptneox.attention.layer_norm_epsilon");
    expect_refused("gptneox without its epsilon", finish(w, "neox-noeps.gguf"), EMBER_ERR_FORMAT,
                   "'gptneox.attention.layer_norm_epsilon'", "missing");
    w = build("gptneox");
    ember_gguf_writer_remove_key(w, "gptneox.rope.dimension_count");
    ember_gguf_writer_set_u32(w, "gptneox.rope.dimension_count", 32);
    expect_refused("gptneox rotary larger than the head", finish(w, "neox-rot.gguf"), EMBER_ERR_FORMAT,
                   "gptneox.rope.dimension_count 32", "head size 16");
    w = build("gptneox");
    ember_gguf_writer_remove_tensor(w, "output.weight");
    expect_refused("gptneox without its head", finish(w, "neox-nohead.gguf"), EMBER_ERR_FORMAT, "'output.weight'",
                   NULL);
}

/* GPT-2 has as many positions as it learnt: one more is a clear error. */
static void test_gpt2_positions(void) {
    ember_tiny_model_params p;
    params_for(&p, "gpt2", EMBER_TYPE_F32);
    p.n_ctx = 16;
    ember_model *m = load_ref(write_model(&p, "gpt2-ctx16.gguf"));
    if (!m) return;
    CHECK(ember_model_get_info(m)->context_length == 16);
    ember_session *s = NULL;
    ember_error err = {0};
    CHECK(ember_session_new(m, 32, &s, &err) == EMBER_OK);
    if (s) {
        bool ok = true;
        for (int i = 0; i < 16 && ok; i++) ok = ember_session_decode(s, i, NULL, &err) == EMBER_OK;
        CHECK(ok && ember_session_position(s) == 16);
        ember_status st = ember_session_decode(s, 1, NULL, &err);
        CHECK_MSG(st == EMBER_ERR_CONTEXT && strstr(err.msg, "learned positions"), "%d: %.900s", st, err.msg);
        CHECK(ember_session_position(s) == 16);
        ember_session_free(s);
    }
    ember_model_free(m);
}

/* The kernel set chosen for this CPU: deterministic, and close to the reference path. */
static void test_auto_kernels(void) {
    static const char *names[] = {"gemma4-q8_0.gguf", "gpt2-f16.gguf", "gemma4-bf16.gguf", "gpt2-q8_0.gguf"};
    for (size_t c = 0; c < sizeof names / sizeof names[0]; c++) {
        const char *path = tmp_path(names[c]);
        ember_model *fast = NULL, *ref = NULL;
        ember_error err;
        if (load(path, EMBER_KERNELS_AUTO, &fast, &err) != EMBER_OK || !(ref = load_ref(path))) {
            CHECK_MSG(false, "%s: %.900s", names[c], err.msg);
            ember_model_free(fast);
            continue;
        }
        int32_t prompt[PROMPT_LEN], ids[N_STEPS];
        make_prompt(prompt, PROMPT_LEN, strncmp(names[c], "gemma4", 6) == 0);
        static float a[N_STEPS * N_VOCAB], b[N_STEPS * N_VOCAB], r[N_STEPS * N_VOCAB];
        if (run(fast, prompt, a, ids) && run(fast, prompt, b, ids) && run(ref, prompt, r, ids)) {
            CHECK_MSG(memcmp(a, b, sizeof a) == 0, "%s with %s kernels: two runs differ", names[c],
                      ember_model_get_info(fast)->kernels);
            double rel = ember_test_rel_diff(a, r, N_VOCAB);
            CHECK_MSG(rel < 5e-2, "%s with %s kernels: rel %.3g from the reference", names[c],
                      ember_model_get_info(fast)->kernels, rel);
        }
        ember_model_free(fast);
        ember_model_free(ref);
    }
}

int main(void) {
    static const char *families[] = {"gemma4", "gpt2", "gptneox"};
    static const ember_type dtypes[] = {EMBER_TYPE_F32, EMBER_TYPE_F16, EMBER_TYPE_BF16, EMBER_TYPE_Q8_0};
    for (int f = 0; f < 3; f++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            test_family_dtype(f, families[f], dtypes[d], ember_type_name(dtypes[d]));
    test_gemma4_window();
    test_gemma4_variants();
    test_refusals();
    test_gpt2_positions();
    test_auto_kernels();
    return ember_test_finish();
}
