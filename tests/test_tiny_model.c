/* test_tiny_model.c — the tiny-model tool: determinism, llama.cpp's layout per family (llama, qwen3,
 * qwen2, gemma4, gpt2, gptneox), weight scales, settings it refuses,
 * a valid embedded tokenizer (its byte symbols checked against GPT-2's real vocabulary), the CLI and
 * the real-shape presets (--shape). */
#include "ember.h"
#include "gguf.h"
#include "tiny_model.h"
#include "tiny_tokenizer.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* The engine's tokenizer, when the tree has it: the embedded vocabulary must work for text. */
#if defined(__has_include)
#if __has_include("tokenizer.h")
#include "tokenizer.h"
#define HAVE_TOKENIZER 1
#endif
#endif

static const char *tmp_path(const char *name) {
    static char path[4][1100];
    static int next;
    char *p = path[next++ % 4]; /* a few live at once */
    snprintf(p, sizeof path[0], "%s/tiny-%s", ember_test_tmpdir(), name);
    return p;
}

static ember_gguf *write_and_open(const ember_tiny_model_params *p, const char *name) {
    const char *path = tmp_path(name);
    ember_error err = {0};
    ember_gguf *g = NULL;
    CHECK_MSG(ember_tiny_model_write(p, path, &err) == EMBER_OK, "%.900s", err.msg);
    CHECK_MSG(ember_gguf_open(path, &g, &err) == EMBER_OK, "%.900s", err.msg);
    return g;
}

static bool same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = ember_read_file(a, &na), *y = ember_read_file(b, &nb);
    bool same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static void test_determinism(void) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.dtype = EMBER_TYPE_Q8_0;
    ember_error err = {0};
    const char *a = tmp_path("det-a.gguf"), *b = tmp_path("det-b.gguf"), *c = tmp_path("det-c.gguf");
    CHECK(ember_tiny_model_write(&p, a, &err) == EMBER_OK);
    CHECK(ember_tiny_model_write(&p, b, &err) == EMBER_OK);
    p.seed = 2;
    CHECK(ember_tiny_model_write(&p, c, &err) == EMBER_OK);
    CHECK(same_file(a, b));
    CHECK(!same_file(a, c));

    /* Each tensor has its own stream: fewer layers leave the shared tensors' bytes unchanged. */
    ember_tiny_model_defaults(&p);
    ember_gguf *six = write_and_open(&p, "six.gguf");
    p.n_layer = 2;
    ember_gguf *two = write_and_open(&p, "two.gguf");
    if (six && two) {
        const char *names[] = {"token_embd.weight", "blk.1.ffn_down.weight", "output.weight"};
        for (int i = 0; i < 3; i++) {
            const gguf_tensor *x = ember_gguf_find_tensor(six, names[i]), *y = ember_gguf_find_tensor(two, names[i]);
            CHECK_MSG(x && y && x->size == y->size && memcmp(x->data, y->data, x->size) == 0, "%s", names[i]);
        }
        CHECK(ember_gguf_find_tensor(two, "blk.2.attn_q.weight") == NULL);
    }
    ember_gguf_close(six);
    ember_gguf_close(two);
}

/* Mean and standard deviation of an f32 tensor. */
static void stats(const gguf_tensor *t, double *mean, double *sd) {
    int64_t n = (int64_t)(t->size / 4);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, (const char *)t->data + 4 * i, 4);
        s += f;
        s2 += (double)f * f;
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
}

static int64_t meta_int(const ember_gguf *g, const char *key) {
    int64_t v = -1;
    ember_gguf_get_int(g, key, &v);
    return v;
}

static void check_tensor(const ember_gguf *g, const char *name, ember_type type, int64_t ne0, int64_t ne1) {
    const gguf_tensor *t = ember_gguf_find_tensor(g, name);
    CHECK_MSG(t && t->type == type && t->ne[0] == ne0 && t->ne[1] == ne1 && t->n_dims == (ne1 > 1 ? 2u : 1u), "%s: %s",
              name, t ? ember_type_name(t->type) : "missing");
}

static void test_layout(void) {
    static const char *families[] = {"llama", "qwen3", "qwen2"};
    for (int f = 0; f < 3; f++) {
        ember_tiny_model_params p;
        ember_tiny_model_defaults(&p);
        p.family = families[f];
        p.dtype = EMBER_TYPE_BF16;
        char name[64], key[128];
        snprintf(name, sizeof name, "layout-%s.gguf", families[f]);
        ember_gguf *g = write_and_open(&p, name);
        if (!g) continue;
        const bool llama = f == 0, qwen3 = f == 1, qwen2 = f == 2;
        char *arch = ember_gguf_get_string(g, "general.architecture");
        CHECK(arch && strcmp(arch, families[f]) == 0);
        free(arch);
        CHECK(meta_int(g, "general.file_type") == 32); /* llama.cpp's MOSTLY_BF16 */
        char *pre = ember_gguf_get_string(g, "tokenizer.ggml.pre");
        CHECK(pre && strcmp(pre, llama ? "llama-bpe" : "qwen2") == 0);
        free(pre);
        struct {
            const char *suffix;
            int64_t want;
        } ints[] = {
            {"block_count", 6},           {"context_length", 256},     {"embedding_length", 64},
            {"feed_forward_length", 128}, {"attention.head_count", 4}, {"attention.head_count_kv", 2},
            {"rope.dimension_count", 16}, {"vocab_size", 512},
        };
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
            snprintf(key, sizeof key, "%s.%s", families[f], ints[i].suffix);
            CHECK_MSG(meta_int(g, key) == ints[i].want, "%s = %lld", key, (long long)meta_int(g, key));
        }
        snprintf(key, sizeof key, "%s.attention.key_length", families[f]);
        CHECK(qwen3 ? meta_int(g, key) == 16 : ember_gguf_find(g, key) == NULL);
        double base = 0, eps = 0;
        snprintf(key, sizeof key, "%s.rope.freq_base", families[f]);
        CHECK(ember_gguf_get_float(g, key, &base) && base == (llama ? 10000.0 : 1000000.0));
        snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", families[f]);
        CHECK(ember_gguf_get_float(g, key, &eps) && fabs(eps - (llama ? 1e-5 : 1e-6)) < 1e-12);

        check_tensor(g, "token_embd.weight", EMBER_TYPE_BF16, 64, 512);
        check_tensor(g, "output_norm.weight", EMBER_TYPE_F32, 64, 1);
        CHECK((ember_gguf_find_tensor(g, "output.weight") != NULL) == llama); /* qwen: tied head */
        CHECK(ember_gguf_find_tensor(g, "rope_freqs.weight") == NULL);
        for (int l = 0; l < 6; l++) {
            char t[64];
#define T(s) (snprintf(t, sizeof t, "blk.%d." s, l), t)
            check_tensor(g, T("attn_norm.weight"), EMBER_TYPE_F32, 64, 1);
            check_tensor(g, T("attn_q.weight"), EMBER_TYPE_BF16, 64, 64);
            check_tensor(g, T("attn_k.weight"), EMBER_TYPE_BF16, 64, 32);
            check_tensor(g, T("attn_v.weight"), EMBER_TYPE_BF16, 64, 32);
            check_tensor(g, T("attn_output.weight"), EMBER_TYPE_BF16, 64, 64);
            check_tensor(g, T("ffn_norm.weight"), EMBER_TYPE_F32, 64, 1);
            check_tensor(g, T("ffn_gate.weight"), EMBER_TYPE_BF16, 64, 128);
            check_tensor(g, T("ffn_up.weight"), EMBER_TYPE_BF16, 64, 128);
            check_tensor(g, T("ffn_down.weight"), EMBER_TYPE_BF16, 128, 64);
            CHECK((ember_gguf_find_tensor(g, T("attn_q_norm.weight")) != NULL) == qwen3);
            CHECK((ember_gguf_find_tensor(g, T("attn_k_norm.weight")) != NULL) == qwen3);
            if (qwen3) check_tensor(g, T("attn_k_norm.weight"), EMBER_TYPE_F32, 16, 1);
            CHECK((ember_gguf_find_tensor(g, T("attn_q.bias")) != NULL) == qwen2);
            if (qwen2) check_tensor(g, T("attn_v.bias"), EMBER_TYPE_F32, 32, 1);
#undef T
        }
        /* 2 + 9 per layer (+2 qwen3 norms, +3 qwen2 biases) + llama's separate head */
        CHECK(g->n_tensors == (uint64_t)(2 + 6 * (9 + (qwen3 ? 2 : 0) + (qwen2 ? 3 : 0)) + (llama ? 1 : 0)));
        ember_gguf_close(g);
    }
}

static void test_values(void) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.rope_freqs = true;
    ember_gguf *g = write_and_open(&p, "values.gguf");
    if (!g) return;
    double mean, sd;
    stats(ember_gguf_find_tensor(g, "token_embd.weight"), &mean, &sd);
    CHECK_MSG(fabs(mean) < 0.01 && fabs(sd - 0.35) < 0.01, "token_embd mean %g sd %g", mean, sd);
    stats(ember_gguf_find_tensor(g, "blk.0.attn_q.weight"), &mean, &sd);
    CHECK_MSG(fabs(mean) < 0.01 && fabs(sd - 0.125) < 0.006, "attn_q mean %g sd %g", mean, sd); /* 1/sqrt(64) */
    stats(ember_gguf_find_tensor(g, "blk.0.ffn_down.weight"), &mean, &sd);
    CHECK_MSG(fabs(sd - 1 / sqrt(128.0)) < 0.005, "ffn_down sd %g", sd);
    stats(ember_gguf_find_tensor(g, "blk.5.ffn_norm.weight"), &mean, &sd);
    CHECK_MSG(fabs(mean - 1) < 0.05 && fabs(sd - 0.1) < 0.04, "ffn_norm mean %g sd %g", mean, sd);
    /* LLaMA-3 factors for 8 pairs at base 10000: wavelengths 2*pi*10000^(i/8). Pairs 0..5 are under
     * 8192/4 (factor 1), pair 7 (19869) over 8192 (factor 8); pair 6 (6283.19) is smoothed:
     * s = (8192/6283.19 - 1)/3 = 0.101266, factor = 1/((1-s)/8 + s) = 4.68148. */
    const gguf_tensor *rf = ember_gguf_find_tensor(g, "rope_freqs.weight");
    CHECK(rf && rf->type == EMBER_TYPE_F32 && rf->ne[0] == 8);
    if (rf && rf->ne[0] == 8) {
        float f[8];
        memcpy(f, rf->data, sizeof f);
        for (int i = 0; i < 6; i++) CHECK(f[i] == 1.0f);
        CHECK_NEAR(f[6], 4.68148, 1e-4);
        CHECK(f[7] == 8.0f);
    }
    ember_gguf_close(g);
}

static void test_tokenizer(void) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.n_vocab = 700;
    p.family = "qwen3";
    ember_gguf *g = write_and_open(&p, "tok.gguf");
    if (!g) return;
    char *model = ember_gguf_get_string(g, "tokenizer.ggml.model"),
         *pre = ember_gguf_get_string(g, "tokenizer.ggml.pre");
    CHECK(model && strcmp(model, "gpt2") == 0);
    CHECK(pre && strcmp(pre, "qwen2") == 0);
    free(model);
    free(pre);
    bool add_bos = true;
    CHECK(ember_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) && !add_bos);
    CHECK(meta_int(g, "tokenizer.ggml.bos_token_id") == 698 && meta_int(g, "tokenizer.ggml.eos_token_id") == 699);
    const gguf_kv *tk = ember_gguf_find(g, "tokenizer.ggml.tokens"), *mk = ember_gguf_find(g, "tokenizer.ggml.merges"),
                  *yk = ember_gguf_find(g, "tokenizer.ggml.token_type");
    CHECK(tk && mk && yk && tk->value.v.arr.count == 700 && yk->value.v.arr.count == 700);
    if (!tk || !mk || !yk || tk->value.v.arr.count != 700) {
        ember_gguf_close(g);
        return;
    }
    const gguf_value *toks = &tk->value, *merges = &mk->value;
    gguf_str s;
    CHECK(ember_gguf_array_string(toks, 698, &s) && gguf_str_eq(s, "<|begin_of_text|>"));
    CHECK(ember_gguf_array_string(toks, 699, &s) && gguf_str_eq(s, "<|end_of_text|>"));
    double type = 0;
    CHECK(ember_gguf_array_number(&yk->value, 0, &type) && type == 1);
    CHECK(ember_gguf_array_number(&yk->value, 699, &type) && type == 3);
    /* Tokens are unique (quadratic, but 700 tokens). */
    int dups = 0;
    for (uint64_t i = 0; i < 700; i++)
        for (uint64_t j = i + 1; j < 700; j++) {
            gguf_str a, b;
            ember_gguf_array_string(toks, i, &a);
            ember_gguf_array_string(toks, j, &b);
            dups += a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0;
        }
    CHECK_MSG(dups == 0, "%d duplicate tokens", dups);
    /* Every merge is "left right" with both parts and their concatenation in the vocabulary. */
    int bad = 0;
    CHECK(merges->v.arr.count >= 100);
    for (uint64_t m = 0; m < merges->v.arr.count; m++) {
        gguf_str ms;
        ember_gguf_array_string(merges, m, &ms);
        const char *sp = memchr(ms.ptr, ' ', ms.len);
        if (!sp || sp == ms.ptr || sp == ms.ptr + ms.len - 1 ||
            memchr(sp + 1, ' ', ms.len - (size_t)(sp - ms.ptr) - 1)) {
            bad++;
            continue;
        }
        size_t nl = (size_t)(sp - ms.ptr), nr = ms.len - nl - 1;
        bool l = false, r = false, whole = false;
        for (uint64_t i = 0; i < 700; i++) {
            gguf_str t;
            ember_gguf_array_string(toks, i, &t);
            l |= t.len == nl && memcmp(t.ptr, ms.ptr, nl) == 0;
            r |= t.len == nr && memcmp(t.ptr, sp + 1, nr) == 0;
            whole |= t.len == nl + nr && memcmp(t.ptr, ms.ptr, nl) == 0 && memcmp(t.ptr + nl, sp + 1, nr) == 0;
        }
        bad += !(l && r && whole);
    }
    CHECK_MSG(bad == 0, "%d merges are not made of tokens", bad);
    /* The first merge is of the most frequent pair in English text: a space and 't'. */
    CHECK(ember_gguf_array_string(merges, 0, &s) && gguf_str_eq(s, "\xC4\xA0 t"));

    /* The 256 byte symbols are GPT-2's own, in GPT-2's order: compare with the real vocabulary. */
    char path[1024];
    ember_gguf *gpt2 = NULL;
    ember_error err = {0};
    if (!ember_fixture_path("tokenizers/gpt2/vocab-only.gguf", path, sizeof path)) {
        fprintf(stderr, "note: fixture %s is missing; byte symbols checked by hand only\n", path);
    } else if (ember_gguf_open(path, &gpt2, &err) == EMBER_OK) {
        const gguf_value *ref = &ember_gguf_find(gpt2, "tokenizer.ggml.tokens")->value;
        int diff = 0;
        for (uint64_t i = 0; i < 256; i++) {
            gguf_str a, b;
            ember_gguf_array_string(toks, i, &a);
            ember_gguf_array_string(ref, i, &b);
            diff += !(a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0);
        }
        CHECK_MSG(diff == 0, "%d byte symbols differ from GPT-2's", diff);
        ember_gguf_close(gpt2);
    }
    /* By hand: '!' is 0, 'Ġ' (space) 220, 'Ċ' (newline) 198, 'Ā' (byte 0) 188, '¡' (0xA1) 94. */
    char sym[3];
    ember_tiny_tokenizer_byte_symbol(' ', sym);
    CHECK(strcmp(sym, "\xC4\xA0") == 0 && ember_tiny_tokenizer_byte_id(' ') == 220);
    CHECK(ember_tiny_tokenizer_byte_id('!') == 0 && ember_tiny_tokenizer_byte_id('\n') == 198);
    CHECK(ember_tiny_tokenizer_byte_id(0) == 188 && ember_tiny_tokenizer_byte_id(0xA1) == 94);
    ember_tiny_tokenizer_byte_symbol(0xAD, sym); /* soft hyphen: the last remapped byte, U+0143 */
    CHECK(strcmp(sym, "\xC5\x83") == 0 && ember_tiny_tokenizer_byte_id(0xAD) == 255);
    ember_gguf_close(g);

    /* Without the tokenizer a small vocabulary is fine; with it, too small is an error. */
    ember_tiny_model_defaults(&p);
    p.n_vocab = 100;
    CHECK(ember_tiny_model_write(&p, tmp_path("small.gguf"), &err) == EMBER_ERR_ARG && strstr(err.msg, "258"));
    p.tokenizer = false;
    g = write_and_open(&p, "small.gguf");
    CHECK(g && !ember_gguf_find(g, "tokenizer.ggml.tokens"));
    ember_gguf_close(g);
}

/* Numbers of a per-layer array key as int64 (count must match); false when absent or of another length. */
static bool meta_array(const ember_gguf *g, const char *key, int64_t *out, uint64_t count) {
    const gguf_kv *kv = ember_gguf_find(g, key);
    if (!kv || kv->value.type != GGUF_TYPE_ARRAY || kv->value.v.arr.count != count) return false;
    for (uint64_t i = 0; i < count; i++) {
        double v;
        if (!ember_gguf_array_number(&kv->value, i, &v)) return false;
        out[i] = (int64_t)v;
    }
    return true;
}

static float f32_at(const gguf_tensor *t, int64_t i) {
    float f;
    memcpy(&f, (const char *)t->data + 4 * i, 4);
    return f;
}

static void test_layout_gemma4(void) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = "gemma4";
    p.dtype = EMBER_TYPE_Q8_0;
    ember_gguf *g = write_and_open(&p, "layout-gemma4.gguf");
    if (!g) return;
    char *arch = ember_gguf_get_string(g, "general.architecture"),
         *pre = ember_gguf_get_string(g, "tokenizer.ggml.pre");
    CHECK(arch && strcmp(arch, "gemma4") == 0);
    CHECK(pre && strcmp(pre, "gpt-2") == 0);
    free(arch);
    free(pre);
    bool add_bos = false;
    CHECK(ember_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) && add_bos); /* Gemma adds BOS */
    CHECK(meta_int(g, "general.file_type") == 7);
    struct {
        const char *key;
        int64_t want;
    } ints[] = {
        {"gemma4.block_count", 6},
        {"gemma4.context_length", 256},
        {"gemma4.embedding_length", 64},
        {"gemma4.attention.head_count", 4},
        {"gemma4.attention.key_length", 32},
        {"gemma4.attention.value_length", 32},
        {"gemma4.attention.key_length_swa", 16},
        {"gemma4.attention.value_length_swa", 16},
        {"gemma4.rope.dimension_count", 32},
        {"gemma4.rope.dimension_count_swa", 16},
        {"gemma4.attention.sliding_window", 8},
        {"gemma4.attention.shared_kv_layers", 2},
        {"gemma4.embedding_length_per_layer_input", 32},
        {"gemma4.vocab_size", 512},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        CHECK_MSG(meta_int(g, ints[i].key) == ints[i].want, "%s = %lld", ints[i].key,
                  (long long)meta_int(g, ints[i].key));
    double v = 0;
    CHECK(ember_gguf_get_float(g, "gemma4.rope.freq_base", &v) && v == 1000000.0);
    CHECK(ember_gguf_get_float(g, "gemma4.rope.freq_base_swa", &v) && v == 10000.0);
    CHECK(ember_gguf_get_float(g, "gemma4.final_logit_softcapping", &v) && v == 30.0);
    CHECK(ember_gguf_get_float(g, "gemma4.attention.layer_norm_rms_epsilon", &v) && fabs(v - 1e-6) < 1e-12);
    /* pattern SSSFSF; kv_from = 6 - 2 = 4: layer 4 (sliding) reads layer 2, layer 5 (full) layer 3 */
    int64_t pattern[6], ff[6], kv[6];
    const int64_t want_pattern[6] = {1, 1, 1, 0, 1, 0}, want_ff[6] = {128, 128, 128, 128, 256, 256},
                  want_kv[6] = {2, 2, 2, 1, 2, 1};
    const gguf_kv *pk = ember_gguf_find(g, "gemma4.attention.sliding_window_pattern");
    CHECK(pk && pk->value.type == GGUF_TYPE_ARRAY && pk->value.v.arr.elem_type == GGUF_TYPE_BOOL);
    CHECK(meta_array(g, "gemma4.attention.sliding_window_pattern", pattern, 6) &&
          memcmp(pattern, want_pattern, sizeof pattern) == 0);
    CHECK(meta_array(g, "gemma4.feed_forward_length", ff, 6) && memcmp(ff, want_ff, sizeof ff) == 0);
    CHECK(meta_array(g, "gemma4.attention.head_count_kv", kv, 6) && memcmp(kv, want_kv, sizeof kv) == 0);

    check_tensor(g, "token_embd.weight", EMBER_TYPE_Q8_0, 64, 512);
    check_tensor(g, "per_layer_token_embd.weight", EMBER_TYPE_Q8_0, 6 * 32, 512);
    check_tensor(g, "per_layer_model_proj.weight", EMBER_TYPE_Q8_0, 64, 6 * 32);
    check_tensor(g, "per_layer_proj_norm.weight", EMBER_TYPE_F32, 32, 1);
    check_tensor(g, "output_norm.weight", EMBER_TYPE_F32, 64, 1);
    CHECK(ember_gguf_find_tensor(g, "output.weight") == NULL); /* tied head */
    /* proportional RoPE of the full layers: 16 pairs, the first 4 rotate */
    const gguf_tensor *rf = ember_gguf_find_tensor(g, "rope_freqs.weight");
    check_tensor(g, "rope_freqs.weight", EMBER_TYPE_F32, 16, 1);
    if (rf && rf->ne[0] == 16)
        for (int i = 0; i < 16; i++)
            CHECK_MSG(f32_at(rf, i) == (i < 4 ? 1.0f : 1e30f), "rope_freqs[%d] = %g", i, f32_at(rf, i));
    int n_expected = 5 + 1; /* token_embd, 3 PLE, rope_freqs; output_norm */
    for (int l = 0; l < 6; l++) {
        char t[64];
        const bool sliding = want_pattern[l], shared = l >= 4;
        const int64_t hd = sliding ? 16 : 32, kv_dim = want_kv[l] * hd;
#define T(s) (snprintf(t, sizeof t, "blk.%d." s, l), t)
        check_tensor(g, T("attn_norm.weight"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("attn_q.weight"), EMBER_TYPE_Q8_0, 64, 4 * hd);
        check_tensor(g, T("attn_q_norm.weight"), EMBER_TYPE_F32, hd, 1);
        CHECK_MSG((ember_gguf_find_tensor(g, T("attn_k.weight")) != NULL) == !shared, "blk.%d.attn_k", l);
        CHECK_MSG((ember_gguf_find_tensor(g, T("attn_k_norm.weight")) != NULL) == !shared, "blk.%d.attn_k_norm", l);
        CHECK_MSG((ember_gguf_find_tensor(g, T("attn_v.weight")) != NULL) == (!shared && sliding), "blk.%d.attn_v", l);
        if (!shared) {
            check_tensor(g, T("attn_k.weight"), EMBER_TYPE_Q8_0, 64, kv_dim);
            check_tensor(g, T("attn_k_norm.weight"), EMBER_TYPE_F32, hd, 1);
        }
        if (!shared && sliding) check_tensor(g, T("attn_v.weight"), EMBER_TYPE_Q8_0, 64, kv_dim);
        check_tensor(g, T("attn_output.weight"), EMBER_TYPE_Q8_0, 4 * hd, 64);
        check_tensor(g, T("post_attention_norm.weight"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("ffn_norm.weight"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("ffn_gate.weight"), EMBER_TYPE_Q8_0, 64, want_ff[l]);
        check_tensor(g, T("ffn_up.weight"), EMBER_TYPE_Q8_0, 64, want_ff[l]);
        check_tensor(g, T("ffn_down.weight"), EMBER_TYPE_Q8_0, want_ff[l], 64);
        check_tensor(g, T("post_ffw_norm.weight"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("inp_gate.weight"), EMBER_TYPE_Q8_0, 64, 32);
        check_tensor(g, T("proj.weight"), EMBER_TYPE_Q8_0, 32, 64);
        check_tensor(g, T("post_norm.weight"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("layer_output_scale.weight"), EMBER_TYPE_F32, 1, 1);
        const gguf_tensor *sc = ember_gguf_find_tensor(g, T("layer_output_scale.weight"));
        if (sc) CHECK_MSG(f32_at(sc, 0) > 0.1f && f32_at(sc, 0) < 0.9f, "layer %d output scale %g", l, f32_at(sc, 0));
#undef T
        n_expected += 14 + (shared ? 0 : 2 + sliding);
    }
    CHECK_MSG(g->n_tensors == (uint64_t)n_expected, "%llu tensors, expected %d", (unsigned long long)g->n_tensors,
              n_expected);
    ember_gguf_close(g);
}

static void test_layout_gpt2(void) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = "gpt2";
    ember_gguf *g = write_and_open(&p, "layout-gpt2.gguf");
    if (!g) return;
    char *pre = ember_gguf_get_string(g, "tokenizer.ggml.pre");
    CHECK(pre && strcmp(pre, "gpt-2") == 0);
    free(pre);
    bool add_bos = true;
    CHECK(ember_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) && !add_bos);
    CHECK(meta_int(g, "gpt2.block_count") == 6 && meta_int(g, "gpt2.embedding_length") == 64 &&
          meta_int(g, "gpt2.feed_forward_length") == 128 && meta_int(g, "gpt2.attention.head_count") == 4 &&
          meta_int(g, "gpt2.context_length") == 256);
    CHECK(!ember_gguf_find(g, "gpt2.attention.head_count_kv") && !ember_gguf_find(g, "gpt2.rope.freq_base"));
    double eps = 0;
    CHECK(ember_gguf_get_float(g, "gpt2.attention.layer_norm_epsilon", &eps) && fabs(eps - 1e-5) < 1e-12);
    check_tensor(g, "token_embd.weight", EMBER_TYPE_F32, 64, 512);
    check_tensor(g, "position_embd.weight", EMBER_TYPE_F32, 64, 256);
    check_tensor(g, "output_norm.weight", EMBER_TYPE_F32, 64, 1);
    check_tensor(g, "output_norm.bias", EMBER_TYPE_F32, 64, 1);
    CHECK(ember_gguf_find_tensor(g, "output.weight") == NULL);
    for (int l = 0; l < 6; l++) {
        char t[64];
#define T(s) (snprintf(t, sizeof t, "blk.%d." s, l), t)
        check_tensor(g, T("attn_norm.weight"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("attn_norm.bias"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("attn_qkv.weight"), EMBER_TYPE_F32, 64, 192);
        check_tensor(g, T("attn_qkv.bias"), EMBER_TYPE_F32, 192, 1);
        check_tensor(g, T("attn_output.weight"), EMBER_TYPE_F32, 64, 64);
        check_tensor(g, T("attn_output.bias"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("ffn_norm.weight"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("ffn_norm.bias"), EMBER_TYPE_F32, 64, 1);
        check_tensor(g, T("ffn_up.weight"), EMBER_TYPE_F32, 64, 128);
        check_tensor(g, T("ffn_up.bias"), EMBER_TYPE_F32, 128, 1);
        check_tensor(g, T("ffn_down.weight"), EMBER_TYPE_F32, 128, 64);
        check_tensor(g, T("ffn_down.bias"), EMBER_TYPE_F32, 64, 1);
#undef T
    }
    CHECK(g->n_tensors == 2 + 6 * 12 + 2);
    /* Q and K rows of the fused projection at 2/sqrt(64), V rows at 1/sqrt(64) */
    const gguf_tensor *qkv = ember_gguf_find_tensor(g, "blk.2.attn_qkv.weight");
    if (qkv) {
        double s2[3] = {0};
        for (int part = 0; part < 3; part++)
            for (int64_t i = part * 64 * 64; i < (part + 1) * 64 * 64; i++)
                s2[part] += (double)f32_at(qkv, i) * f32_at(qkv, i);
        for (int part = 0; part < 3; part++) {
            double sd = sqrt(s2[part] / (64 * 64)), want = part < 2 ? 0.25 : 0.125;
            CHECK_MSG(fabs(sd - want) < 0.1 * want, "attn_qkv part %d: sd %g, want %g", part, sd, want);
        }
    }
    /* ffn_down.bias cancels the mean GELU output: b[i] = -sum_j W[i][j] / (2 sqrt(pi)) */
    const gguf_tensor *down = ember_gguf_find_tensor(g, "blk.0.ffn_down.weight"),
                      *bias = ember_gguf_find_tensor(g, "blk.0.ffn_down.bias");
    if (down && bias) {
        double worst = 0;
        for (int64_t i = 0; i < 64; i++) {
            double sum = 0;
            for (int64_t j = 0; j < 128; j++) sum += f32_at(down, i * 128 + j);
            worst = fmax(worst, fabs(f32_at(bias, i) + sum / (2 * sqrt(3.14159265358979323846))));
        }
        CHECK_MSG(worst < 1e-5, "ffn_down.bias is off by %g", worst);
    }
    ember_gguf_close(g);
}

/* GPT-NeoX: GPT-2's tensors without position_embd and with output.weight, Pythia's partial RoPE
 * (a quarter of the 16-wide heads) and the parallel residual; no tied head. */
static void test_layout_gptneox(void) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = "gptneox";
    ember_gguf *g = write_and_open(&p, "layout-gptneox.gguf");
    if (!g) return;
    CHECK(meta_int(g, "gptneox.block_count") == 6 && meta_int(g, "gptneox.embedding_length") == 64 &&
          meta_int(g, "gptneox.feed_forward_length") == 128 && meta_int(g, "gptneox.attention.head_count") == 4 &&
          meta_int(g, "gptneox.context_length") == 256 && meta_int(g, "gptneox.rope.dimension_count") == 4);
    bool par = false;
    CHECK(ember_gguf_get_bool(g, "gptneox.use_parallel_residual", &par) && par);
    double eps = 0, base = 0;
    CHECK(ember_gguf_get_float(g, "gptneox.attention.layer_norm_epsilon", &eps) && fabs(eps - 1e-5) < 1e-12);
    CHECK(ember_gguf_get_float(g, "gptneox.rope.freq_base", &base) && base == 10000.0);
    CHECK(ember_gguf_find_tensor(g, "position_embd.weight") == NULL);
    check_tensor(g, "output.weight", EMBER_TYPE_F32, 64, 512);
    check_tensor(g, "output_norm.bias", EMBER_TYPE_F32, 64, 1);
    check_tensor(g, "blk.5.attn_qkv.weight", EMBER_TYPE_F32, 64, 192);
    check_tensor(g, "blk.5.ffn_down.bias", EMBER_TYPE_F32, 64, 1);
    CHECK(g->n_tensors == 1 + 6 * 12 + 3);
    ember_gguf_close(g);
    ember_error err = {0};
    p.tied = 1;
    CHECK(ember_tiny_model_write(&p, tmp_path("x.gguf"), &err) != EMBER_OK && strstr(err.msg, "own output head"));
}

/* Settings the writer refuses, each with a reason; and the defaults adapting to short models. */
static void test_param_errors(void) {
    struct {
        const char *what, *family, *pattern, *want;
        int64_t layers, shared, ple, kv_heads, window;
        ember_type dtype;
    } bad[] = {
        {"gemma4 setting on llama", "llama", NULL, "gemma4 settings", 6, -1, -1, 0, 4, EMBER_TYPE_F32},
        {"pattern on qwen3", "qwen3", "SSSFSF", "gemma4 settings", 6, -1, -1, 0, 0, EMBER_TYPE_F32},
        {"gpt2 with GQA", "gpt2", NULL, "grouped-query", 6, -1, -1, 2, 0, EMBER_TYPE_F32},
        {"pattern too short", "gemma4", "SSF", "3 entries for 6 layers", 6, -1, -1, 0, 0, EMBER_TYPE_F32},
        {"pattern letter", "gemma4", "SSSXSF", "only S (sliding) and F (full)", 6, -1, -1, 0, 0, EMBER_TYPE_F32},
        /* kv_from 4: layer 4 (full) would read layer 3, which is sliding */
        {"shared KV of the wrong kind", "gemma4", "SSSSFF",
         "full layer 4 would read the cache of layer 3, a sliding one", 6, 2, -1, 0, 0, EMBER_TYPE_F32},
        {"all layers shared", "gemma4", NULL, "leave none of the 6 layers", 6, 6, -1, 0, 0, EMBER_TYPE_F32},
        {"q8_0 PLE width", "gemma4", NULL, "per-layer input width", 6, -1, 16, 0, 0, EMBER_TYPE_Q8_0},
        {"family", "mamba", NULL, "'mamba'", 6, -1, -1, 0, 0, EMBER_TYPE_F32},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ember_tiny_model_params p;
        ember_tiny_model_defaults(&p);
        p.family = bad[i].family;
        p.swa_pattern = bad[i].pattern;
        p.n_layer = bad[i].layers;
        p.shared_kv_layers = bad[i].shared;
        p.ple_dim = bad[i].ple;
        p.n_head_kv = bad[i].kv_heads;
        p.sliding_window = bad[i].window;
        p.dtype = bad[i].dtype;
        ember_error err = {0};
        ember_status st = ember_tiny_model_write(&p, tmp_path("bad.gguf"), &err);
        CHECK_MSG(st == EMBER_ERR_ARG && strstr(err.msg, bad[i].want), "%s: %d %.900s", bad[i].what, st, err.msg);
    }
    /* Too few layers for the default 2 shared-KV layers: none, and the file says so. */
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = "gemma4";
    p.n_layer = 2;
    ember_gguf *g = write_and_open(&p, "gemma4-2.gguf");
    if (g) {
        int64_t pattern[2];
        CHECK(meta_int(g, "gemma4.attention.shared_kv_layers") == 0);
        CHECK(meta_array(g, "gemma4.attention.sliding_window_pattern", pattern, 2) && pattern[0] == 1 &&
              pattern[1] == 0);
        CHECK(ember_gguf_find_tensor(g, "blk.1.attn_k.weight") != NULL);
        ember_gguf_close(g);
    }
    /* gemma4's optional parts can be left out */
    ember_tiny_model_defaults(&p);
    p.family = "gemma4";
    p.ple_dim = 0;
    p.softcap = 0;
    p.rope_freqs = 0;
    g = write_and_open(&p, "gemma4-plain.gguf");
    if (g) {
        CHECK(!ember_gguf_find(g, "gemma4.embedding_length_per_layer_input") &&
              !ember_gguf_find(g, "gemma4.final_logit_softcapping"));
        CHECK(!ember_gguf_find_tensor(g, "per_layer_token_embd.weight") &&
              !ember_gguf_find_tensor(g, "blk.0.inp_gate.weight") && !ember_gguf_find_tensor(g, "rope_freqs.weight"));
        ember_gguf_close(g);
    }
}

/* Text through the embedded vocabulary with the engine's own tokenizer: lossless, and common
 * words are single tokens. */
static void test_tokenizer_in_engine(const char *family) {
#ifdef HAVE_TOKENIZER
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.family = family;
    char name[64];
    snprintf(name, sizeof name, "text-%s.gguf", family);
    ember_gguf *g = write_and_open(&p, name);
    if (!g) return;
    ember_tokenizer *t = NULL;
    ember_error err = {0};
    CHECK_MSG(ember_tokenizer_from_gguf(g, &t, &err) == EMBER_OK, "%s: %.900s", family, err.msg);
    if (t) {
        const bool bos = strcmp(family, "llama") == 0 || strcmp(family, "gemma4") == 0;
        CHECK(ember_tokenizer_vocab_size(t) == 512 && ember_tokenizer_bos(t) == 510 && ember_tokenizer_eos(t) == 511);
        CHECK(ember_tokenizer_adds_bos(t) == bos);
        const char *text =
            "The quick brown fox jumps over the lazy dog.\nHello world, 2024! \xC3\xA9t\xC3\xA9 \xF0\x9F\x94\xA5";
        int32_t *ids = NULL;
        size_t n = 0;
        /* with the family's BOS default: LLaMA and Gemma add one, Qwen and GPT-2 do not */
        CHECK_MSG(ember_tokenizer_encode(t, text, strlen(text), bos, false, &ids, &n, &err) == EMBER_OK, "%.900s",
                  err.msg);
        bool in_range = n > 0;
        for (size_t i = 0; i < n; i++) in_range &= ids[i] >= 0 && ids[i] < 512;
        CHECK(in_range);
        CHECK(n > 0 && (ids[0] == 510) == bos);
        CHECK_MSG(n < strlen(text), "%zu tokens for %zu bytes: merges were not used", n, strlen(text));
        char *back = NULL;
        size_t blen = 0;
        CHECK(ember_tokenizer_decode(t, ids, n, &back, &blen, &err) == EMBER_OK);
        CHECK_MSG(back && blen == strlen(text) && memcmp(back, text, blen) == 0, "decoded: %.600s", back ? back : "");
        free(back);
        free(ids);
        /* " the" is one token, the one the vocabulary spells "\xC4\xA0the" */
        CHECK(ember_tokenizer_encode(t, " the", 4, false, false, &ids, &n, &err) == EMBER_OK);
        CHECK(n == 1 && ids[0] == ember_tokenizer_find(t, "\xC4\xA0the", 5) && ids[0] >= 256);
        free(ids);
        ember_tokenizer_free(t);
    }
    ember_gguf_close(g);
#else
    (void)family;
    fprintf(stderr, "note: the engine has no tokenizer.h yet; text checks skipped\n");
#endif
}

/* Runs the command; returns its exit code (-1 if it did not exit normally). */
static int run_cmd(const char *cmd) {
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void) {
    char tool[1024], cmd[4096];
    snprintf(tool, sizeof tool, "%s/make-tiny-model", EMBER_BUILD_DIR);
    FILE *f = fopen(tool, "rb");
    if (!f) {
        fprintf(stderr, "note: %s not built; CLI checks skipped\n", tool);
        return;
    }
    fclose(f);
    const char *out = tmp_path("cli.gguf"), *quiet = "2>/dev/null";
    snprintf(cmd, sizeof cmd,
             "'%s' --family qwen3 --dtype q8_0 --out '%s' --layers 2 --hidden 32 --heads 2 --kv-heads 1 --ff 64 "
             "--vocab 300 --context 64 --seed 9",
             tool, out);
    CHECK(run_cmd(cmd) == 0);
    ember_gguf *g = NULL;
    ember_error err = {0};
    CHECK_MSG(ember_gguf_open(out, &g, &err) == EMBER_OK, "%.900s", err.msg);
    if (g) {
        CHECK(meta_int(g, "qwen3.block_count") == 2 && meta_int(g, "qwen3.embedding_length") == 32 &&
              meta_int(g, "qwen3.attention.head_count_kv") == 1 && meta_int(g, "qwen3.context_length") == 64);
        check_tensor(g, "token_embd.weight", EMBER_TYPE_Q8_0, 32, 300);
        char *name = ember_gguf_get_string(g, "general.name");
        CHECK(name && strstr(name, "seed9"));
        free(name);
        ember_gguf_close(g);
    }
    /* The library and the command make the same file from the same settings. */
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    CHECK(ember_tiny_model_write(&p, tmp_path("lib-default.gguf"), &err) == EMBER_OK);
    snprintf(cmd, sizeof cmd, "'%s' --family llama --dtype f32 --out '%s'", tool, tmp_path("cli-default.gguf"));
    CHECK(run_cmd(cmd) == 0);
    CHECK(same_file(tmp_path("lib-default.gguf"), tmp_path("cli-default.gguf")));

    const char *bad[] = {
        "--family llama --dtype f32",                         /* no --out */
        "--family llama --dtype iq4_nl --out x.gguf",         /* unknown dtype */
        "--family llama --dtype f32 --out x.gguf --layers 0", /* out of range */
        "--family llama --dtype f32 --out x.gguf --hidden 6x",
        "--family llama --dtype f32 --out x.gguf --bogus",
        "--family gemma4 --dtype f32 --out x.gguf --softcap -1",
        "--family gemma4 --dtype f32 --out x.gguf --window 0",
        "--family gemma4 --dtype f32 --out x.gguf --rope-base-swa 1",
        "--family gemma4 --dtype f32 --out x.gguf --swa-pattern",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s %s", ember_test_tmpdir(), tool, bad[i], quiet);
        CHECK_MSG(run_cmd(cmd) == 2, "%s", bad[i]);
    }
    /* Valid arguments, impossible model: exit 1 with the reason. */
    snprintf(cmd, sizeof cmd, "'%s' --family mamba --dtype f32 --out '%s' %s", tool, tmp_path("x.gguf"), quiet);
    CHECK(run_cmd(cmd) == 1);
    snprintf(cmd, sizeof cmd, "'%s' --family llama --dtype f32 --window 4 --out '%s' 2>&1 | grep -q 'gemma4 settings'",
             tool, tmp_path("x.gguf"));
    CHECK(run_cmd(cmd) == 0);
    snprintf(cmd, sizeof cmd, "'%s' --family gemma4 --dtype f32 --swa-pattern SSSSFF --shared-kv 2 --out '%s' %s", tool,
             tmp_path("x.gguf"), quiet);
    CHECK(run_cmd(cmd) == 1);

    /* The gemma4 settings reach the file. */
    out = tmp_path("cli-gemma4.gguf");
    snprintf(cmd, sizeof cmd,
             "'%s' --family gemma4 --dtype bf16 --out '%s' --layers 5 --swa-pattern SSFSF --shared-kv 2 --window 3 "
             "--ple 16 --head-dim-swa 8 --head-dim 24 --kv-heads 4 --kv-heads-full 2 --rope-base-swa 500 "
             "--rope-base 20000 --softcap 0 --no-rope-freqs --untied",
             tool, out);
    CHECK(run_cmd(cmd) == 0);
    g = NULL;
    CHECK_MSG(ember_gguf_open(out, &g, &err) == EMBER_OK, "%.900s", err.msg);
    if (g) {
        int64_t pattern[5], kv[5], ff[5];
        const int64_t want_pattern[5] = {1, 1, 0, 1, 0}, want_kv[5] = {4, 4, 2, 4, 2},
                      want_ff[5] = {128, 128, 128, 256, 256};
        CHECK(meta_array(g, "gemma4.attention.sliding_window_pattern", pattern, 5) &&
              memcmp(pattern, want_pattern, sizeof pattern) == 0);
        CHECK(meta_array(g, "gemma4.attention.head_count_kv", kv, 5) && memcmp(kv, want_kv, sizeof kv) == 0);
        CHECK(meta_array(g, "gemma4.feed_forward_length", ff, 5) && memcmp(ff, want_ff, sizeof ff) == 0);
        CHECK(meta_int(g, "gemma4.attention.shared_kv_layers") == 2 &&
              meta_int(g, "gemma4.attention.sliding_window") == 3 &&
              meta_int(g, "gemma4.embedding_length_per_layer_input") == 16 &&
              meta_int(g, "gemma4.attention.key_length") == 24 && meta_int(g, "gemma4.attention.key_length_swa") == 8);
        double b = 0;
        CHECK(ember_gguf_get_float(g, "gemma4.rope.freq_base_swa", &b) && b == 500.0);
        CHECK(ember_gguf_get_float(g, "gemma4.rope.freq_base", &b) && b == 20000.0);
        CHECK(!ember_gguf_find(g, "gemma4.final_logit_softcapping") && !ember_gguf_find_tensor(g, "rope_freqs.weight"));
        check_tensor(g, "output.weight", EMBER_TYPE_BF16, 64, 512);
        check_tensor(g, "blk.2.attn_q.weight", EMBER_TYPE_BF16, 64, 4 * 24);
        check_tensor(g, "blk.2.attn_k.weight", EMBER_TYPE_BF16, 64, 2 * 24);
        check_tensor(g, "blk.1.attn_v.weight", EMBER_TYPE_BF16, 64, 4 * 8);
        CHECK(!ember_gguf_find_tensor(g, "blk.3.attn_k.weight")); /* kv_from 3: layers 3, 4 read 1, 2 */
        ember_gguf_close(g);
        /* and the engine runs it */
        ember_model_params mp = {.path = out, .kernels = EMBER_KERNELS_REFERENCE, .n_threads = 1};
        ember_model *m = NULL;
        CHECK_MSG(ember_model_load(&mp, &m, &err) == EMBER_OK, "%.900s", err.msg);
        ember_session *sess = NULL;
        if (m && ember_session_new(m, 16, &sess, &err) == EMBER_OK) {
            const int32_t ids[6] = {510, 1, 2, 3, 4, 5};
            CHECK_MSG(ember_session_prefill(sess, ids, 6, NULL, &err) == EMBER_OK, "%.900s", err.msg);
            ember_session_free(sess);
        }
        ember_model_free(m);
    }
    out = tmp_path("cli-gpt2.gguf");
    snprintf(cmd, sizeof cmd, "'%s' --family gpt2 --dtype f16 --out '%s' --heads 8 --context 32", tool, out);
    CHECK(run_cmd(cmd) == 0);
    g = NULL;
    CHECK_MSG(ember_gguf_open(out, &g, &err) == EMBER_OK, "%.900s", err.msg);
    if (g) {
        CHECK(meta_int(g, "gpt2.attention.head_count") == 8 && meta_int(g, "gpt2.context_length") == 32);
        check_tensor(g, "position_embd.weight", EMBER_TYPE_F16, 64, 32);
        ember_gguf_close(g);
    }
    snprintf(cmd, sizeof cmd,
             "'%s' --family llama --dtype q8_0 --hidden 48 --heads 4 --out '%s' 2>&1 | grep -q 'multiples of 32'", tool,
             tmp_path("x.gguf"));
    CHECK(run_cmd(cmd) == 0);
}

/* The real-shape presets: their hyper-parameters (the published shapes of Qwen3-0.6B, LLaMA-3.2-1B,
 * Gemma-4-E2B, Gemma-2-2B, Gemma-3-1B, OLMo-2-1B, Phi-3-mini and 12 layers of Qwen3-30B-A3B) checked
 * on the resolved settings (the full files are 0.6-8 GB), and a reduced qwen3-0.6b written through
 * the command with its metadata checked. */
static void test_shapes(void) {
    ember_tiny_model_params p;
    CHECK(!ember_tiny_model_shape("qwen3-7b", &p) && !ember_tiny_model_shape(NULL, &p));
    int n = 0;
    for (; ember_tiny_model_shapes[n]; n++) CHECK(ember_tiny_model_shape(ember_tiny_model_shapes[n], &p));
    CHECK(n == 10);

    CHECK(ember_tiny_model_shape("qwen3-0.6b", &p));
    CHECK(strcmp(p.family, "qwen3") == 0 && p.dtype == EMBER_TYPE_Q8_0 && p.seed == 1 && !p.tokenizer);
    CHECK(p.n_layer == 28 && p.n_embd == 1024 && p.n_head == 16 && p.n_head_kv == 8 && p.head_dim == 128 &&
          p.n_ff == 3072 && p.n_vocab == 151936 && p.n_ctx == 4096);
    CHECK(p.rope_base == 0 && p.tied == -1 && p.rope_freqs == -1); /* qwen3's usual: 1e6, tied, no rope_freqs */

    CHECK(ember_tiny_model_shape("llama3.2-1b", &p));
    CHECK(strcmp(p.family, "llama") == 0 && p.dtype == EMBER_TYPE_Q8_0 && !p.tokenizer);
    CHECK(p.n_layer == 16 && p.n_embd == 2048 && p.n_head == 32 && p.n_head_kv == 8 && p.head_dim == 64 &&
          p.n_ff == 8192 && p.n_vocab == 128256 && p.n_ctx == 4096);
    CHECK(p.rope_base == 500000.0f && p.rope_freqs == 1 && p.tied == 1);

    CHECK(ember_tiny_model_shape("gemma4-e2b", &p));
    CHECK(strcmp(p.family, "gemma4") == 0 && p.dtype == EMBER_TYPE_Q8_0 && !p.tokenizer);
    CHECK(p.n_layer == 35 && p.n_embd == 1536 && p.n_head == 8 && p.n_head_kv == 1 && p.n_head_kv_full == 1 &&
          p.head_dim == 512 && p.head_dim_swa == 256 && p.n_ff == 6144 && p.n_vocab == 262144 && p.n_ctx == 4096);
    CHECK(p.sliding_window == 512 && p.shared_kv_layers == 20 && p.ple_dim == 256 && p.swa_pattern &&
          strlen(p.swa_pattern) == 35 && strcmp(p.swa_pattern, "SSSSFSSSSFSSSSFSSSSFSSSSFSSSSFSSSSF") == 0);

    CHECK(ember_tiny_model_shape("gemma2-2b", &p)); /* google/gemma-2-2b's config.json */
    CHECK(strcmp(p.family, "gemma2") == 0 && p.dtype == EMBER_TYPE_Q8_0 && !p.tokenizer);
    CHECK(p.n_layer == 26 && p.n_embd == 2304 && p.n_head == 8 && p.n_head_kv == 4 && p.head_dim == 256 &&
          p.n_ff == 9216 && p.n_vocab == 256000 && p.n_ctx == 8192 && p.sliding_window == 4096 && p.tied == 1);

    CHECK(ember_tiny_model_shape("gemma3-1b", &p)); /* google/gemma-3-1b-pt's config.json */
    CHECK(strcmp(p.family, "gemma3") == 0 && p.dtype == EMBER_TYPE_Q8_0 && !p.tokenizer);
    CHECK(p.n_layer == 26 && p.n_embd == 1152 && p.n_head == 4 && p.n_head_kv == 1 && p.head_dim == 256 &&
          p.n_ff == 6912 && p.n_vocab == 262144 && p.n_ctx == 32768 && p.sliding_window == 512 && p.tied == 1);

    /* Pythia-160M and -1B (EleutherAI's configs: rotary_pct 0.25, parallel residual, untied head) */
    CHECK(ember_tiny_model_shape("pythia-160m", &p));
    CHECK(strcmp(p.family, "gptneox") == 0 && p.n_layer == 12 && p.n_embd == 768 && p.n_head == 12 && p.n_ff == 3072 &&
          p.n_vocab == 50304 && p.n_ctx == 2048 && p.tied == -1);
    CHECK(ember_tiny_model_shape("pythia-1b", &p));
    CHECK(strcmp(p.family, "gptneox") == 0 && p.n_layer == 16 && p.n_embd == 2048 && p.n_head == 8 && p.n_ff == 8192 &&
          p.n_vocab == 50304 && p.n_ctx == 2048);

    CHECK(ember_tiny_model_shape("olmo2-1b", &p)); /* allenai/OLMo-2-0425-1B's config.json */
    CHECK(strcmp(p.family, "olmo2") == 0 && p.dtype == EMBER_TYPE_Q8_0 && !p.tokenizer);
    CHECK(p.n_layer == 16 && p.n_embd == 2048 && p.n_head == 16 && p.n_head_kv == 16 && p.n_ff == 8192 &&
          p.n_vocab == 100352 && p.n_ctx == 4096 && p.tied == -1 && p.rope_base == 0);

    CHECK(ember_tiny_model_shape("phi3-mini", &p)); /* microsoft/Phi-3-mini-4k-instruct's config.json */
    CHECK(strcmp(p.family, "phi3") == 0 && p.dtype == EMBER_TYPE_Q8_0 && !p.tokenizer);
    CHECK(p.n_layer == 32 && p.n_embd == 3072 && p.n_head == 32 && p.n_head_kv == 32 && p.n_ff == 8192 &&
          p.n_vocab == 32064 && p.n_ctx == 4096 && p.sliding_window == 2047 && p.rope_freqs == -1);

    CHECK(ember_tiny_model_shape("qwen3-30b-a3b-12l", &p)); /* Qwen/Qwen3-30B-A3B's config.json, 12 of 48 layers */
    CHECK(strcmp(p.family, "qwen3moe") == 0 && p.dtype == EMBER_TYPE_Q8_0 && !p.tokenizer);
    CHECK(p.n_layer == 12 && p.n_embd == 2048 && p.n_head == 32 && p.n_head_kv == 4 && p.head_dim == 128 &&
          p.n_vocab == 151936 && p.n_expert == 128 && p.n_expert_used == 8 && p.n_ff_exp == 768);

    char tool[1024], cmd[4096];
    snprintf(tool, sizeof tool, "%s/make-tiny-model", EMBER_BUILD_DIR);
    FILE *f = fopen(tool, "rb");
    if (!f) {
        fprintf(stderr, "note: %s not built; --shape CLI checks skipped\n", tool);
        return;
    }
    fclose(f);
    /* the preset through the command, with options after it overriding (one layer, a small vocabulary) */
    const char *out = tmp_path("shape-qwen3.gguf");
    snprintf(cmd, sizeof cmd, "'%s' --layers 1 --shape qwen3-0.6b --vocab 512 --out '%s'", tool, out);
    CHECK(run_cmd(cmd) == 0);
    ember_gguf *g = NULL;
    ember_error err = {0};
    CHECK_MSG(ember_gguf_open(out, &g, &err) == EMBER_OK, "%.900s", err.msg);
    if (g) {
        struct {
            const char *key;
            int64_t want;
        } ints[] = {
            {"qwen3.block_count", 1},
            {"qwen3.embedding_length", 1024},
            {"qwen3.attention.head_count", 16},
            {"qwen3.attention.head_count_kv", 8},
            {"qwen3.attention.key_length", 128},
            {"qwen3.feed_forward_length", 3072},
            {"qwen3.context_length", 4096},
            {"qwen3.vocab_size", 512},
            {"general.file_type", 7},
        };
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
            CHECK_MSG(meta_int(g, ints[i].key) == ints[i].want, "%s = %lld", ints[i].key,
                      (long long)meta_int(g, ints[i].key));
        double base = 0;
        CHECK(ember_gguf_get_float(g, "qwen3.rope.freq_base", &base) && base == 1000000.0);
        CHECK(!ember_gguf_find(g, "tokenizer.ggml.model"));
        check_tensor(g, "blk.0.attn_q.weight", EMBER_TYPE_Q8_0, 1024, 16 * 128);
        check_tensor(g, "blk.0.attn_k.weight", EMBER_TYPE_Q8_0, 1024, 8 * 128);
        ember_gguf_close(g);
    }
    /* --dtype overrides the preset's q8_0 */
    snprintf(cmd, sizeof cmd, "'%s' --shape qwen3-0.6b --layers 1 --vocab 512 --dtype bf16 --out '%s'", tool, out);
    CHECK(run_cmd(cmd) == 0);
    g = NULL;
    CHECK_MSG(ember_gguf_open(out, &g, &err) == EMBER_OK, "%.900s", err.msg);
    if (g) {
        CHECK(meta_int(g, "general.file_type") == 32);
        ember_gguf_close(g);
    }
    const char *bad[] = {
        "--shape qwen3-7b --out x.gguf",                       /* unknown shape */
        "--shape --out x.gguf",                                /* no value */
        "--shape qwen3-0.6b --family llama --out x.gguf",      /* conflicting family */
        "--shape qwen3-0.6b --shape llama3.2-1b --out x.gguf", /* twice */
        "--shape qwen3-0.6b",                                  /* no --out */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s 2>/dev/null", ember_test_tmpdir(), tool, bad[i]);
        CHECK_MSG(run_cmd(cmd) == 2, "%s", bad[i]);
    }
    snprintf(cmd, sizeof cmd,
             "'%s' --shape qwen3-7b --out x.gguf 2>&1 | grep -q -- '--shape must be one of qwen3-0.6b'", tool);
    CHECK(run_cmd(cmd) == 0);
}

/* The dtypes are the traits' weight types, spelled in lower case: the 13 of docs/models.md, each
 * parsed back to its own type; other spellings and the activation-only types are refused. */
static void test_dtypes(void) {
    static const struct {
        const char *name;
        ember_type t;
    } want[] = {{"f32", EMBER_TYPE_F32},   {"f16", EMBER_TYPE_F16},   {"q4_0", EMBER_TYPE_Q4_0},
                {"q4_1", EMBER_TYPE_Q4_1}, {"q5_0", EMBER_TYPE_Q5_0}, {"q5_1", EMBER_TYPE_Q5_1},
                {"q8_0", EMBER_TYPE_Q8_0}, {"q2_k", EMBER_TYPE_Q2_K}, {"q3_k", EMBER_TYPE_Q3_K},
                {"q4_k", EMBER_TYPE_Q4_K}, {"q5_k", EMBER_TYPE_Q5_K}, {"q6_k", EMBER_TYPE_Q6_K},
                {"bf16", EMBER_TYPE_BF16}};
    char list[256] = "", joined[256] = "";
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ember_type t = (ember_type)-1;
        CHECK_MSG(ember_tiny_model_parse_dtype(want[i].name, &t) && t == want[i].t, "dtype %s", want[i].name);
        snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", i ? ", " : "", want[i].name);
    }
    ember_tiny_model_dtype_list(list, sizeof list);
    CHECK_MSG(strcmp(list, joined) == 0, "dtype list '%s'", list);
    ember_type t;
    const char *refused[] = {"q4_K", "Q8_0", "q8_1", "q8_k", "f64", "", NULL};
    for (int i = 0; refused[i]; i++) CHECK_MSG(!ember_tiny_model_parse_dtype(refused[i], &t), "'%s'", refused[i]);
    CHECK(!ember_tiny_model_parse_dtype(NULL, &t));
}

int main(void) {
    test_dtypes();
    test_determinism();
    test_layout();
    test_values();
    test_layout_gemma4();
    test_layout_gpt2();
    test_layout_gptneox();
    test_param_errors();
    test_tokenizer();
    test_tokenizer_in_engine("llama");
    test_tokenizer_in_engine("qwen3");
    test_tokenizer_in_engine("gemma4");
    test_tokenizer_in_engine("gpt2");
    test_cli();
    test_shapes();
    return ember_test_finish();
}
