/* test_tiny_model.c — the tiny-model tool: determinism, llama.cpp's layout per family, weight scales,
 * a valid embedded tokenizer (its byte symbols checked against GPT-2's real vocabulary), and the CLI. */
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
    CHECK_MSG(t && t->type == type && t->ne[0] == ne0 && t->ne[1] == ne1 && t->n_dims == (ne1 > 1 ? 2u : 1u),
              "%s: %s", name, t ? ember_type_name(t->type) : "missing");
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
        struct { const char *suffix; int64_t want; } ints[] = {
            {"block_count", 6}, {"context_length", 256}, {"embedding_length", 64}, {"feed_forward_length", 128},
            {"attention.head_count", 4}, {"attention.head_count_kv", 2}, {"rope.dimension_count", 16},
            {"vocab_size", 512},
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
    char *model = ember_gguf_get_string(g, "tokenizer.ggml.model"), *pre = ember_gguf_get_string(g, "tokenizer.ggml.pre");
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
        if (!sp || sp == ms.ptr || sp == ms.ptr + ms.len - 1 || memchr(sp + 1, ' ', ms.len - (size_t)(sp - ms.ptr) - 1)) {
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
        const bool llama = strcmp(family, "llama") == 0;
        CHECK(ember_tokenizer_vocab_size(t) == 512 && ember_tokenizer_bos(t) == 510 && ember_tokenizer_eos(t) == 511);
        CHECK(ember_tokenizer_adds_bos(t) == llama);
        const char *text = "The quick brown fox jumps over the lazy dog.\nHello world, 2024! \xC3\xA9t\xC3\xA9 \xF0\x9F\x94\xA5";
        int32_t *ids = NULL;
        size_t n = 0;
        /* with the family's BOS default: LLaMA adds one, Qwen does not */
        CHECK_MSG(ember_tokenizer_encode(t, text, strlen(text), llama, false, &ids, &n, &err) == EMBER_OK, "%.900s",
                  err.msg);
        bool in_range = n > 0;
        for (size_t i = 0; i < n; i++) in_range &= ids[i] >= 0 && ids[i] < 512;
        CHECK(in_range);
        CHECK(n > 0 && (ids[0] == 510) == llama);
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
        "--family llama --dtype q4_0 --out x.gguf",           /* unknown dtype */
        "--family llama --dtype f32 --out x.gguf --layers 0", /* out of range */
        "--family llama --dtype f32 --out x.gguf --hidden 6x",
        "--family llama --dtype f32 --out x.gguf --bogus",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s %s", ember_test_tmpdir(), tool, bad[i], quiet);
        CHECK_MSG(run_cmd(cmd) == 2, "%s", bad[i]);
    }
    /* Valid arguments, impossible model: exit 1 with the reason. */
    snprintf(cmd, sizeof cmd, "'%s' --family gpt2 --dtype f32 --out '%s' %s", tool, tmp_path("x.gguf"), quiet);
    CHECK(run_cmd(cmd) == 1);
    snprintf(cmd, sizeof cmd, "'%s' --family llama --dtype q8_0 --hidden 48 --heads 4 --out '%s' 2>&1 | grep -q 'multiples of 32'",
             tool, tmp_path("x.gguf"));
    CHECK(run_cmd(cmd) == 0);
}

int main(void) {
    test_determinism();
    test_layout();
    test_values();
    test_tokenizer();
    test_tokenizer_in_engine("llama");
    test_tokenizer_in_engine("qwen3");
    test_cli();
    return ember_test_finish();
}
