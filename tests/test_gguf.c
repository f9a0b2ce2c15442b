/* test_gguf.c — the GGUF reader on real llama.cpp files, on writer-made files read back value by
 * value, and on deliberately corrupted copies: every failure must be a clear error, never a crash.
 * Byte offsets below were worked out by hand from the format in gguf.h, not taken from the writer. */
#include "gguf.h"
#include "gguf_writer.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static char missing_fixture[512]; /* first missing fixture, reported as a skip if all else passed */

/* ---- helpers --------------------------------------------------------------------------------- */

static bool str_is(gguf_str s, const char *c) { return gguf_str_eq(s, c); }

static const gguf_value *value_of(const ember_gguf *g, const char *key) {
    const gguf_kv *kv = ember_gguf_find(g, key);
    return kv ? &kv->value : NULL;
}

static bool contains_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++)
        if (strncasecmp(hay, needle, n) == 0) return true;
    return false;
}

static void put_u64(unsigned char *b, size_t off, uint64_t v) { memcpy(b + off, &v, 8); }
static void put_u32(unsigned char *b, size_t off, uint32_t v) { memcpy(b + off, &v, 4); }
static uint64_t get_u64(const unsigned char *b, size_t off) {
    uint64_t v;
    memcpy(&v, b + off, 8);
    return v;
}
static uint32_t get_u32(const unsigned char *b, size_t off) {
    uint32_t v;
    memcpy(&v, b + off, 4);
    return v;
}

static const char *tmp_path(const char *name) {
    static char path[1100];
    snprintf(path, sizeof path, "%s/gguf-%s", ember_test_tmpdir(), name);
    return path;
}

/* Opens `len` bytes written to a scratch file; returns the status, message in err. */
static ember_status open_bytes(const char *name, const unsigned char *b, size_t len, ember_error *err) {
    const char *path = tmp_path(name);
    memset(err, 0, sizeof *err);
    if (!ember_write_file(path, b, len)) {
        snprintf(err->msg, sizeof err->msg, "cannot write %.900s", path);
        return EMBER_ERR_IO;
    }
    ember_gguf *g = NULL;
    ember_status st = ember_gguf_open(path, &g, err);
    if (st == EMBER_OK) ember_gguf_close(g);
    else if (g) st = EMBER_ERR_ARG; /* a failed open must not hand out a file */
    return st;
}

/* The copy must fail with `code`, and the message must name the file and contain each of `subs`. */
static void expect_fail(const char *what, const unsigned char *b, size_t len, ember_status code, const char *sub1,
                        const char *sub2) {
    ember_error err;
    ember_status st = open_bytes("corrupt.gguf", b, len, &err);
    CHECK_MSG(st == code, "%s: status %d, expected %d (%.700s)", what, st, code, err.msg);
    CHECK_MSG(strstr(err.msg, tmp_path("corrupt.gguf")) != NULL, "%s: message does not name the file: %.700s", what,
              err.msg);
    if (sub1) CHECK_MSG(contains_ci(err.msg, sub1), "%s: message lacks '%s': %.700s", what, sub1, err.msg);
    if (sub2) CHECK_MSG(contains_ci(err.msg, sub2), "%s: message lacks '%s': %.700s", what, sub2, err.msg);
}

/* ---- real files written by llama.cpp --------------------------------------------------------- */

static bool open_fixture(const char *rel, ember_gguf **g) {
    char path[1024];
    if (!ember_fixture_path(rel, path, sizeof path)) {
        fprintf(stderr, "note: fixture %s is missing; its checks are skipped\n", path);
        if (!missing_fixture[0]) snprintf(missing_fixture, sizeof missing_fixture, "fixture %.480s is missing", path);
        return false;
    }
    ember_error err = {0};
    ember_status st = ember_gguf_open(path, g, &err);
    CHECK_MSG(st == EMBER_OK, "%.900s", err.msg);
    return st == EMBER_OK;
}

static void test_gpt2_vocab_only(void) {
    ember_gguf *g;
    if (!open_fixture("tokenizers/gpt2/vocab-only.gguf", &g)) return;
    CHECK(g->version == 3);
    CHECK(g->n_kv == 16);
    CHECK(g->n_tensors == 0);
    char *arch = ember_gguf_get_string(g, "general.architecture");
    char *model = ember_gguf_get_string(g, "tokenizer.ggml.model");
    CHECK(arch && strcmp(arch, "gpt2") == 0);
    CHECK(model && strcmp(model, "gpt2") == 0);
    free(arch);
    free(model);
    int64_t i = 0;
    CHECK(ember_gguf_get_int(g, "gpt2.context_length", &i) && i == 1024);
    CHECK(ember_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &i) && i == 50256);
    double eps = 0;
    CHECK(ember_gguf_get_float(g, "gpt2.attention.layer_norm_epsilon", &eps) && fabs(eps - 1e-5) < 1e-9);
    const gguf_value *tokens = value_of(g, "tokenizer.ggml.tokens");
    CHECK(tokens && tokens->type == GGUF_TYPE_ARRAY && tokens->v.arr.elem_type == GGUF_TYPE_STRING);
    if (tokens) {
        CHECK(tokens->v.arr.count == 50257);
        gguf_str s;
        CHECK(ember_gguf_array_string(tokens, 0, &s) && str_is(s, "!"));
        CHECK(ember_gguf_array_string(tokens, 256, &s) && str_is(s, "\xC4\xA0t")); /* "Ġt" */
        CHECK(ember_gguf_array_string(tokens, 50256, &s) && str_is(s, "<|endoftext|>"));
        CHECK(!ember_gguf_array_string(tokens, 50257, &s)); /* one past the end */
    }
    const gguf_value *merges = value_of(g, "tokenizer.ggml.merges");
    gguf_str m;
    CHECK(merges && merges->v.arr.count == 50000 && ember_gguf_array_string(merges, 0, &m) && str_is(m, "\xC4\xA0 t"));
    const gguf_value *types = value_of(g, "tokenizer.ggml.token_type");
    double t = 0;
    CHECK(types && types->v.arr.elem_type == GGUF_TYPE_INT32 && ember_gguf_array_number(types, 0, &t) && t == 1);
    CHECK(!ember_gguf_find(g, "tokenizer.ggml.scores")); /* GPT-2's vocabulary has none */
    ember_gguf_close(g);
}

static void test_llama_spm_vocab_only(void) {
    ember_gguf *g;
    if (!open_fixture("tokenizers/llama-spm/vocab-only.gguf", &g)) return;
    CHECK(g->version == 3);
    CHECK(g->n_kv == 22);
    CHECK(g->n_tensors == 0);
    char *arch = ember_gguf_get_string(g, "general.architecture");
    char *model = ember_gguf_get_string(g, "tokenizer.ggml.model");
    CHECK(arch && strcmp(arch, "llama") == 0);
    CHECK(model && strcmp(model, "llama") == 0);
    free(arch);
    free(model);
    const gguf_value *tokens = value_of(g, "tokenizer.ggml.tokens");
    gguf_str s;
    CHECK(tokens && tokens->v.arr.count == 32000);
    CHECK(tokens && ember_gguf_array_string(tokens, 1, &s) && str_is(s, "<s>"));
    CHECK(tokens && ember_gguf_array_string(tokens, 3, &s) && str_is(s, "<0x00>"));
    CHECK(tokens && ember_gguf_array_string(tokens, 260, &s) && str_is(s, "\xE2\x96\x81t")); /* "▁t" */
    const gguf_value *scores = value_of(g, "tokenizer.ggml.scores");
    CHECK(scores && scores->v.arr.elem_type == GGUF_TYPE_FLOAT32 && scores->v.arr.count == 32000);
    double sc = 0;
    CHECK(scores && ember_gguf_array_number(scores, 260, &sc) && sc == -1.0);
    CHECK(scores && ember_gguf_array_number(scores, 1000, &sc) && sc == -741.0);
    CHECK(scores && ember_gguf_array_number(scores, 259, &sc) && sc == -1e9);
    CHECK(scores && !ember_gguf_array_number(scores, 32000, &sc));
    CHECK(tokens && !ember_gguf_array_number(tokens, 0, &sc)); /* strings are not numbers */
    const gguf_value *types = value_of(g, "tokenizer.ggml.token_type");
    double t = 0;
    CHECK(types && ember_gguf_array_number(types, 0, &t) && t == 2); /* unknown */
    CHECK(types && ember_gguf_array_number(types, 3, &t) && t == 6); /* byte */
    bool b = false;
    CHECK(ember_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) && b);
    CHECK(ember_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) && !b);
    int64_t i = 0;
    CHECK(ember_gguf_get_int(g, "tokenizer.ggml.unknown_token_id", &i) && i == 0);
    CHECK(!ember_gguf_get_int(g, "tokenizer.ggml.model", &i)); /* a string is not an integer */
    CHECK(!ember_gguf_get_int(g, "no.such.key", &i));
    ember_gguf_close(g);
}

/* ---- writer round trip ----------------------------------------------------------------------- */

/* Builds an array of arrays of strings {{"x","yz"},{"w"}} (also used by the corruption base). */
static ember_gguf_wvalue *nested_strings(void) {
    ember_gguf_wvalue *x = ember_gguf_wvalue_string("x", 1), *yz = ember_gguf_wvalue_string("yz", 2),
                      *w = ember_gguf_wvalue_string("w", 1);
    ember_gguf_wvalue *i0[] = {x, yz}, *i1[] = {w};
    ember_gguf_wvalue *a0 = ember_gguf_wvalue_array_of(GGUF_TYPE_STRING, i0, 2);
    ember_gguf_wvalue *a1 = ember_gguf_wvalue_array_of(GGUF_TYPE_STRING, i1, 1);
    ember_gguf_wvalue *outer[] = {a0, a1};
    ember_gguf_wvalue *v = ember_gguf_wvalue_array_of(GGUF_TYPE_ARRAY, outer, 2);
    ember_gguf_wvalue *all[] = {x, yz, w, a0, a1};
    for (size_t i = 0; i < 5; i++) ember_gguf_wvalue_free(all[i]);
    return v;
}

static void set_scalar(ember_gguf_writer *w, const char *key, gguf_value_type t, const void *v) {
    ember_gguf_wvalue *val = ember_gguf_wvalue_scalar(t, v);
    CHECK(ember_gguf_writer_set(w, key, val) == EMBER_OK);
    ember_gguf_wvalue_free(val);
}

static void test_round_trip(uint32_t version, uint32_t alignment) {
    ember_gguf_writer *w = ember_gguf_writer_new();
    ember_gguf_writer_set_version(w, version);
    ember_gguf_writer_set_u32(w, "general.alignment", alignment);
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    uint32_t u32 = 4000000000u;
    int32_t i32 = -2000000000;
    float f32 = 3.25f;
    uint8_t bo = 1;
    uint64_t u64 = ((uint64_t)1 << 63) + 5;
    int64_t i64 = -((int64_t)1 << 62);
    double f64 = -1e300;
    set_scalar(w, "s.u8", GGUF_TYPE_UINT8, &u8);
    set_scalar(w, "s.i8", GGUF_TYPE_INT8, &i8);
    set_scalar(w, "s.u16", GGUF_TYPE_UINT16, &u16);
    set_scalar(w, "s.i16", GGUF_TYPE_INT16, &i16);
    set_scalar(w, "s.u32", GGUF_TYPE_UINT32, &u32);
    set_scalar(w, "s.i32", GGUF_TYPE_INT32, &i32);
    set_scalar(w, "s.f32", GGUF_TYPE_FLOAT32, &f32);
    set_scalar(w, "s.bool", GGUF_TYPE_BOOL, &bo);
    set_scalar(w, "s.u64", GGUF_TYPE_UINT64, &u64);
    set_scalar(w, "s.i64", GGUF_TYPE_INT64, &i64);
    set_scalar(w, "s.f64", GGUF_TYPE_FLOAT64, &f64);
    ember_gguf_writer_set_string(w, "s.str", "h\xC3\xA9llo \xE2\x96\x81 w\xC3\xB6rld");
    ember_gguf_writer_set_string(w, "s.empty", "");
    const uint8_t a_u8[] = {1, 2, 255};
    const int8_t a_i8[] = {-1, 0, 127};
    const uint16_t a_u16[] = {1, 65535};
    const int16_t a_i16[] = {-32768, 7};
    const uint32_t a_u32[] = {0, 1, 4294967295u};
    const int32_t a_i32[] = {-5, 5};
    const float a_f32[] = {0.5f, -2.0f};
    const uint8_t a_bool[] = {1, 0, 1};
    const uint64_t a_u64[] = {UINT64_MAX};
    const int64_t a_i64[] = {INT64_MIN};
    const double a_f64[] = {3.141592653589793, 0.0};
    ember_gguf_writer_set_array(w, "a.u8", GGUF_TYPE_UINT8, a_u8, 3);
    ember_gguf_writer_set_array(w, "a.i8", GGUF_TYPE_INT8, a_i8, 3);
    ember_gguf_writer_set_array(w, "a.u16", GGUF_TYPE_UINT16, a_u16, 2);
    ember_gguf_writer_set_array(w, "a.i16", GGUF_TYPE_INT16, a_i16, 2);
    ember_gguf_writer_set_array(w, "a.u32", GGUF_TYPE_UINT32, a_u32, 3);
    ember_gguf_writer_set_array(w, "a.i32", GGUF_TYPE_INT32, a_i32, 2);
    ember_gguf_writer_set_array(w, "a.f32", GGUF_TYPE_FLOAT32, a_f32, 2);
    ember_gguf_writer_set_array(w, "a.bool", GGUF_TYPE_BOOL, a_bool, 3);
    ember_gguf_writer_set_array(w, "a.u64", GGUF_TYPE_UINT64, a_u64, 1);
    ember_gguf_writer_set_array(w, "a.i64", GGUF_TYPE_INT64, a_i64, 1);
    ember_gguf_writer_set_array(w, "a.f64", GGUF_TYPE_FLOAT64, a_f64, 2);
    ember_gguf_writer_set_array(w, "a.empty", GGUF_TYPE_INT32, NULL, 0);
    const char *strs[] = {"a", "", "\xC3\xBC"};
    ember_gguf_writer_set_strings(w, "a.str", strs, 3);
    ember_gguf_wvalue *ns = nested_strings();
    CHECK(ember_gguf_writer_set(w, "n.strings", ns) == EMBER_OK);
    ember_gguf_wvalue_free(ns);
    /* {{1,2,3} as u8, {} as i32, {-1.5} as f32}: inner arrays of different element types */
    ember_gguf_wvalue *in0 = ember_gguf_wvalue_array(GGUF_TYPE_UINT8, a_u8, 3);
    ember_gguf_wvalue *in1 = ember_gguf_wvalue_array(GGUF_TYPE_INT32, NULL, 0);
    const float m15 = -1.5f;
    ember_gguf_wvalue *in2 = ember_gguf_wvalue_array(GGUF_TYPE_FLOAT32, &m15, 1);
    ember_gguf_wvalue *mixed_items[] = {in0, in1, in2};
    ember_gguf_wvalue *mixed = ember_gguf_wvalue_array_of(GGUF_TYPE_ARRAY, mixed_items, 3);
    CHECK(ember_gguf_writer_set(w, "n.mixed", mixed) == EMBER_OK);
    /* three levels: {{{7}}} */
    const int32_t seven = 7;
    ember_gguf_wvalue *l1 = ember_gguf_wvalue_array(GGUF_TYPE_INT32, &seven, 1);
    ember_gguf_wvalue *l2 = ember_gguf_wvalue_array_of(GGUF_TYPE_ARRAY, &l1, 1);
    ember_gguf_wvalue *l3 = ember_gguf_wvalue_array_of(GGUF_TYPE_ARRAY, &l2, 1);
    CHECK(ember_gguf_writer_set(w, "n.deep", l3) == EMBER_OK);
    ember_gguf_wvalue *frees[] = {in0, in1, in2, mixed, l1, l2, l3};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) ember_gguf_wvalue_free(frees[i]);
    /* An item of the wrong type is refused. */
    ember_gguf_wvalue *s1 = ember_gguf_wvalue_string("s", 1);
    CHECK(ember_gguf_wvalue_array_of(GGUF_TYPE_ARRAY, &s1, 1) == NULL);
    ember_gguf_wvalue_free(s1);

    /* Tensors with hand-known encodings. */
    float t_f32[24];
    for (int i = 0; i < 24; i++) t_f32[i] = (float)i * 0.25f - 3.0f;
    const int64_t ne_f32[3] = {4, 3, 2};
    CHECK(ember_gguf_writer_add_tensor(w, "t.f32", EMBER_TYPE_F32, 3, ne_f32, t_f32) == EMBER_OK);
    const float f16_in[8] = {1.0f, -2.0f, 0.5f, 65504.0f, 0x1p-14f, 0x1p-24f, 0.0f, -0.0f};
    const uint16_t f16_bits[8] = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0400, 0x0001, 0x0000, 0x8000};
    const int64_t ne_f16[2] = {4, 2};
    CHECK(ember_gguf_writer_add_tensor(w, "t.f16", EMBER_TYPE_F16, 2, ne_f16, f16_in) == EMBER_OK);
    const float bf16_in[6] = {1.0f, -2.0f, 0.5f, 3.0f, 1.0f + 0x1p-7f, -0.0f};
    const uint16_t bf16_bits[6] = {0x3F80, 0xC000, 0x3F00, 0x4040, 0x3F81, 0x8000};
    const int64_t ne_bf16[1] = {6};
    CHECK(ember_gguf_writer_add_tensor(w, "t.bf16", EMBER_TYPE_BF16, 1, ne_bf16, bf16_in) == EMBER_OK);
    /* Q8_0, 3 blocks: (j-16)/4 -> d = 4/127; a one-hot 1.0 -> d = 1/127; ties around d = 1. */
    float q_in[96] = {0};
    for (int j = 0; j < 32; j++) q_in[j] = (float)(j - 16) * 0.25f;
    q_in[32 + 5] = 1.0f;
    q_in[64] = 127.0f;
    q_in[65] = 2.5f;
    q_in[66] = -2.5f;
    q_in[67] = -0.5f;
    q_in[68] = 0.49f;
    const int64_t ne_q[2] = {32, 3};
    CHECK(ember_gguf_writer_add_tensor(w, "t.q8_0", EMBER_TYPE_Q8_0, 2, ne_q, q_in) == EMBER_OK);

    char name[64];
    snprintf(name, sizeof name, "round-trip-v%u-a%u.gguf", version, alignment);
    const char *path = tmp_path(name);
    ember_error err = {0};
    CHECK_MSG(ember_gguf_writer_write(w, path, &err) == EMBER_OK, "%.900s", err.msg);
    ember_gguf_writer_free(w);

    ember_gguf *g = NULL;
    CHECK_MSG(ember_gguf_open(path, &g, &err) == EMBER_OK, "%.900s", err.msg);
    if (!g) return;
    CHECK(g->version == version);
    CHECK(g->alignment == alignment);
    CHECK(g->n_kv == 30);
    CHECK(g->n_tensors == 4);
    CHECK(g->data_offset % alignment == 0);
    /* Scalars: type and value. */
    const gguf_value *v;
    CHECK((v = value_of(g, "s.u8")) && v->type == GGUF_TYPE_UINT8 && v->v.u64 == 200);
    CHECK((v = value_of(g, "s.i8")) && v->type == GGUF_TYPE_INT8 && v->v.i64 == -100);
    CHECK((v = value_of(g, "s.u16")) && v->type == GGUF_TYPE_UINT16 && v->v.u64 == 60000);
    CHECK((v = value_of(g, "s.i16")) && v->type == GGUF_TYPE_INT16 && v->v.i64 == -30000);
    CHECK((v = value_of(g, "s.u32")) && v->type == GGUF_TYPE_UINT32 && v->v.u64 == 4000000000u);
    CHECK((v = value_of(g, "s.i32")) && v->type == GGUF_TYPE_INT32 && v->v.i64 == -2000000000);
    CHECK((v = value_of(g, "s.f32")) && v->type == GGUF_TYPE_FLOAT32 && v->v.f64 == 3.25);
    CHECK((v = value_of(g, "s.bool")) && v->type == GGUF_TYPE_BOOL && v->v.b);
    CHECK((v = value_of(g, "s.u64")) && v->type == GGUF_TYPE_UINT64 && v->v.u64 == ((uint64_t)1 << 63) + 5);
    CHECK((v = value_of(g, "s.i64")) && v->type == GGUF_TYPE_INT64 && v->v.i64 == -((int64_t)1 << 62));
    CHECK((v = value_of(g, "s.f64")) && v->type == GGUF_TYPE_FLOAT64 && v->v.f64 == -1e300);
    CHECK((v = value_of(g, "s.str")) && v->type == GGUF_TYPE_STRING &&
          str_is(v->v.str, "h\xC3\xA9llo \xE2\x96\x81 w\xC3\xB6rld"));
    CHECK((v = value_of(g, "s.empty")) && v->type == GGUF_TYPE_STRING && v->v.str.len == 0);
    int64_t iv = 0;
    CHECK(!ember_gguf_get_int(g, "s.u64", &iv)); /* 2^63 + 5 does not fit an int64 */
    CHECK(ember_gguf_get_int(g, "s.u32", &iv) && iv == 4000000000LL);
    /* Arrays of every scalar type, element by element. */
    struct {
        const char *key;
        gguf_value_type et;
        uint64_t n;
        double want[3];
    } arrays[] = {
        {"a.u8", GGUF_TYPE_UINT8, 3, {1, 2, 255}},
        {"a.i8", GGUF_TYPE_INT8, 3, {-1, 0, 127}},
        {"a.u16", GGUF_TYPE_UINT16, 2, {1, 65535}},
        {"a.i16", GGUF_TYPE_INT16, 2, {-32768, 7}},
        {"a.u32", GGUF_TYPE_UINT32, 3, {0, 1, 4294967295.0}},
        {"a.i32", GGUF_TYPE_INT32, 2, {-5, 5}},
        {"a.f32", GGUF_TYPE_FLOAT32, 2, {0.5, -2}},
        {"a.bool", GGUF_TYPE_BOOL, 3, {1, 0, 1}},
        {"a.u64", GGUF_TYPE_UINT64, 1, {18446744073709551615.0}},
        {"a.i64", GGUF_TYPE_INT64, 1, {-9223372036854775808.0}},
        {"a.f64", GGUF_TYPE_FLOAT64, 2, {3.141592653589793, 0}},
        {"a.empty", GGUF_TYPE_INT32, 0, {0}},
    };
    for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
        v = value_of(g, arrays[a].key);
        CHECK_MSG(v && v->type == GGUF_TYPE_ARRAY && v->v.arr.elem_type == arrays[a].et &&
                      v->v.arr.count == arrays[a].n,
                  "%s", arrays[a].key);
        for (uint64_t i = 0; v && i < arrays[a].n; i++) {
            double d = -42;
            CHECK_MSG(ember_gguf_array_number(v, i, &d) && d == arrays[a].want[i], "%s[%llu] = %.17g", arrays[a].key,
                      (unsigned long long)i, d);
        }
    }
    gguf_str s;
    v = value_of(g, "a.str");
    CHECK(v && v->v.arr.count == 3 && ember_gguf_array_string(v, 0, &s) && str_is(s, "a"));
    CHECK(v && ember_gguf_array_string(v, 1, &s) && s.len == 0);
    CHECK(v && ember_gguf_array_string(v, 2, &s) && str_is(s, "\xC3\xBC"));
    /* Nested arrays. */
    v = value_of(g, "n.strings");
    CHECK(v && v->v.arr.elem_type == GGUF_TYPE_ARRAY && v->v.arr.count == 2 && v->v.arr.items);
    if (v && v->v.arr.items && v->v.arr.count == 2) {
        const gguf_value *a0 = &v->v.arr.items[0], *a1 = &v->v.arr.items[1];
        CHECK(a0->type == GGUF_TYPE_ARRAY && a0->v.arr.elem_type == GGUF_TYPE_STRING && a0->v.arr.count == 2);
        CHECK(ember_gguf_array_string(a0, 0, &s) && str_is(s, "x"));
        CHECK(ember_gguf_array_string(a0, 1, &s) && str_is(s, "yz"));
        CHECK(a1->v.arr.count == 1 && ember_gguf_array_string(a1, 0, &s) && str_is(s, "w"));
    }
    v = value_of(g, "n.mixed");
    CHECK(v && v->v.arr.count == 3 && v->v.arr.items);
    if (v && v->v.arr.items && v->v.arr.count == 3) {
        double d = 0;
        CHECK(v->v.arr.items[0].v.arr.elem_type == GGUF_TYPE_UINT8 && v->v.arr.items[0].v.arr.count == 3);
        CHECK(ember_gguf_array_number(&v->v.arr.items[0], 2, &d) && d == 255);
        CHECK(v->v.arr.items[1].v.arr.elem_type == GGUF_TYPE_INT32 && v->v.arr.items[1].v.arr.count == 0);
        CHECK(ember_gguf_array_number(&v->v.arr.items[2], 0, &d) && d == -1.5);
    }
    v = value_of(g, "n.deep");
    CHECK(v && v->v.arr.count == 1 && v->v.arr.items && v->v.arr.items[0].v.arr.items);
    if (v && v->v.arr.items && v->v.arr.items[0].v.arr.items) {
        double d = 0;
        CHECK(ember_gguf_array_number(&v->v.arr.items[0].v.arr.items[0], 0, &d) && d == 7);
    }
    /* Tensors: shape, type, placement and bytes. */
    const gguf_tensor *t = ember_gguf_find_tensor(g, "t.f32");
    CHECK(t && t->type == EMBER_TYPE_F32 && t->n_dims == 3 && t->ne[0] == 4 && t->ne[1] == 3 && t->ne[2] == 2 &&
          t->ne[3] == 1 && t->size == 96 && memcmp(t->data, t_f32, 96) == 0);
    t = ember_gguf_find_tensor(g, "t.f16");
    CHECK(t && t->type == EMBER_TYPE_F16 && t->size == 16 && memcmp(t->data, f16_bits, 16) == 0);
    t = ember_gguf_find_tensor(g, "t.bf16");
    CHECK(t && t->type == EMBER_TYPE_BF16 && t->n_dims == 1 && t->size == 12 && memcmp(t->data, bf16_bits, 12) == 0);
    t = ember_gguf_find_tensor(g, "t.q8_0");
    CHECK(t && t->type == EMBER_TYPE_Q8_0 && t->size == 3 * 34);
    if (t && t->size == 3 * 34) {
        ember_block_q8_0 blk[3];
        memcpy(blk, t->data, sizeof blk);
        /* 4/127 = 1.00787 * 2^-5 -> f16 mantissa 8: 0x2808. q = round((j-16) * 7.9375). */
        CHECK(blk[0].d == 0x2808);
        CHECK(blk[0].qs[0] == -127 && blk[0].qs[1] == -119 && blk[0].qs[2] == -111 && blk[0].qs[15] == -8 &&
              blk[0].qs[16] == 0 && blk[0].qs[17] == 8 && blk[0].qs[31] == 119);
        /* 1/127 = 1.00787 * 2^-7 -> 0x2008; the one value becomes 127, the rest 0. */
        CHECK(blk[1].d == 0x2008 && blk[1].qs[5] == 127 && blk[1].qs[4] == 0 && blk[1].qs[6] == 0);
        /* d = 1 exactly; halves round away from zero, as roundf does. */
        CHECK(blk[2].d == 0x3C00 && blk[2].qs[0] == 127 && blk[2].qs[1] == 3 && blk[2].qs[2] == -3 &&
              blk[2].qs[3] == -1 && blk[2].qs[4] == 0 && blk[2].qs[5] == 0);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        CHECK(g->tensors[i].offset % alignment == 0);
        CHECK((uint64_t)((const uint8_t *)g->tensors[i].data - g->base) % alignment == 0);
    }
    ember_gguf_close(g);
}

static void test_writer_errors(void) {
    ember_error err = {0};
    ember_gguf_writer *w = ember_gguf_writer_new();
    CHECK(ember_gguf_writer_set_u32(w, "general.alignment", 48) == EMBER_ERR_ARG);
    CHECK(ember_gguf_writer_write(w, tmp_path("never.gguf"), &err) == EMBER_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "general.alignment"), "%.900s", err.msg);
    ember_gguf_writer_free(w);

    w = ember_gguf_writer_new();
    ember_gguf_writer_set_u32(w, "k", 1);
    CHECK(ember_gguf_writer_set_u32(w, "k", 2) == EMBER_ERR_ARG);
    CHECK(ember_gguf_writer_status(w, &err) == EMBER_ERR_ARG && strstr(err.msg, "'k'"));
    ember_gguf_writer_free(w);

    w = ember_gguf_writer_new();
    float x[33] = {0};
    const int64_t ne[1] = {33};
    CHECK(ember_gguf_writer_add_tensor(w, "odd", EMBER_TYPE_Q8_0, 1, ne, x) == EMBER_ERR_ARG);
    CHECK(ember_gguf_writer_status(w, &err) != EMBER_OK && strstr(err.msg, "odd") && strstr(err.msg, "q8_0"));
    ember_gguf_writer_free(w);

    /* A failed write leaves neither the target nor a temporary file behind. */
    w = ember_gguf_writer_new();
    ember_gguf_writer_set_u32(w, "k", 1);
    char bad[1200];
    snprintf(bad, sizeof bad, "%s/no-such-dir/x.gguf", ember_test_tmpdir());
    CHECK(ember_gguf_writer_write(w, bad, &err) == EMBER_ERR_IO);
    CHECK_MSG(strstr(err.msg, bad) != NULL, "%.900s", err.msg);
    ember_gguf_writer_free(w);

    /* remove_* edit a builder in place. */
    w = ember_gguf_writer_new();
    ember_gguf_writer_set_u32(w, "a", 1);
    ember_gguf_writer_set_u32(w, "b", 2);
    CHECK(ember_gguf_writer_remove_key(w, "a") && !ember_gguf_writer_remove_key(w, "a"));
    ember_gguf_writer_add_tensor(w, "t", EMBER_TYPE_F32, 1, ne, x);
    CHECK(ember_gguf_writer_remove_tensor(w, "t") && !ember_gguf_writer_remove_tensor(w, "t"));
    ember_gguf *g = NULL;
    CHECK(ember_gguf_writer_write(w, tmp_path("edited.gguf"), &err) == EMBER_OK);
    CHECK(ember_gguf_open(tmp_path("edited.gguf"), &g, &err) == EMBER_OK);
    CHECK(g && g->n_kv == 1 && g->n_tensors == 0 && ember_gguf_find(g, "b") && !ember_gguf_find(g, "a"));
    ember_gguf_close(g);
    ember_gguf_writer_free(w);
}

/* ---- corrupted copies ------------------------------------------------------------------------ */

/* The base file, 448 bytes. Offsets (worked out from the format):
 *   0 magic | 4 version | 8 n_tensors=2 | 16 n_kv=4
 *   24  kv0 key len 17 "general.alignment" @32 | type @49 (u32) | value @53 = 32
 *   57  kv1 key len 5 "a.str" @65 | type @70 (string) | len @74 = 5 | "hello" @82
 *   87  kv2 key len 5 "a.arr" @95 | type @100 (array) | elem @104 (u32) | count @108 = 3 | data @116
 *   128 kv3 key len 8 "a.nested" @136 | type @144 | elem @148 (array) | count @152 = 2
 *       item0: elem @160 (string) count @164 = 2, "x" (len @172), "yz" (len @181)
 *       item1: elem @191 (string) count @195 = 1, "w" (len @203, byte @211)
 *   212 t0: name len @212 "t0" @220 | n_dims @222 = 2 | ne @226 = 8, @234 = 2 | type @242 f32 | offset @246 = 0
 *   254 t1: name len @254 "t1" @262 | n_dims @264 = 2 | ne @268 = 32, @276 = 1 | type @284 q8_0 | offset @288 = 64
 *   296 padding | 320 data: t0 (64 bytes) @320, t1 (34 bytes) @384, padding to 448 */
static unsigned char *make_base(size_t *len) {
    ember_gguf_writer *w = ember_gguf_writer_new();
    ember_gguf_writer_set_u32(w, "general.alignment", 32);
    ember_gguf_writer_set_string(w, "a.str", "hello");
    const uint32_t arr[3] = {1, 2, 3};
    ember_gguf_writer_set_array(w, "a.arr", GGUF_TYPE_UINT32, arr, 3);
    ember_gguf_wvalue *ns = nested_strings();
    ember_gguf_writer_set(w, "a.nested", ns);
    ember_gguf_wvalue_free(ns);
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)i;
    const int64_t ne0[2] = {8, 2}, ne1[2] = {32, 1};
    ember_gguf_writer_add_tensor(w, "t0", EMBER_TYPE_F32, 2, ne0, v);
    ember_gguf_writer_add_tensor(w, "t1", EMBER_TYPE_Q8_0, 2, ne1, v);
    ember_error err = {0};
    const char *path = tmp_path("base.gguf");
    CHECK_MSG(ember_gguf_writer_write(w, path, &err) == EMBER_OK, "%.900s", err.msg);
    ember_gguf_writer_free(w);
    return (unsigned char *)ember_read_file(path, len);
}

static void test_corruptions(void) {
    size_t len = 0;
    unsigned char *base = make_base(&len);
    CHECK(base && len == 448);
    if (!base || len != 448) {
        free(base);
        return;
    }
    /* The layout is what the comment above says. */
    CHECK(memcmp(base, "GGUF", 4) == 0 && get_u32(base, 4) == 3 && get_u64(base, 8) == 2 && get_u64(base, 16) == 4);
    CHECK(get_u64(base, 24) == 17 && get_u32(base, 53) == 32 && get_u64(base, 74) == 5 && get_u64(base, 108) == 3);
    CHECK(get_u64(base, 152) == 2 && get_u64(base, 164) == 2 && get_u64(base, 195) == 1 && base[211] == 'w');
    CHECK(get_u64(base, 212) == 2 && get_u32(base, 222) == 2 && get_u64(base, 226) == 8 && get_u32(base, 284) == 8);
    CHECK(get_u64(base, 288) == 64 && memcmp(base + 262, "t1", 2) == 0);
    float f;
    memcpy(&f, base + 320 + 4 * 5, 4);
    CHECK(f == 5.0f);
    ember_error err;
    CHECK_MSG(open_bytes("corrupt.gguf", base, len, &err) == EMBER_OK, "%.900s", err.msg);

    unsigned char *b = malloc(len);
    /* Truncated at every length short of the last tensor's end: each is an error. */
    int bad_truncations = 0;
    for (size_t cut = 0; cut < 384 + 34; cut++) {
        ember_status st = open_bytes("corrupt.gguf", base, cut, &err);
        bool named = strstr(err.msg, tmp_path("corrupt.gguf")) != NULL;
        bool says = contains_ci(err.msg, "truncated") || contains_ci(err.msg, "past the end") ||
                    contains_ci(err.msg, "more than the file can hold") || contains_ci(err.msg, "too short");
        if (st != EMBER_ERR_FORMAT || !named || !says) {
            if (bad_truncations++ < 5) CHECK_MSG(false, "cut at %zu: status %d: %.700s", cut, st, err.msg);
        }
    }
    CHECK_MSG(bad_truncations == 0, "%d truncations were not reported as truncation", bad_truncations);
    /* Cutting only the trailing padding leaves a valid file. */
    CHECK(open_bytes("corrupt.gguf", base, 384 + 34, &err) == EMBER_OK);

#define PATCH(what, code, s1, s2, stmt)                                                                                \
    do {                                                                                                               \
        memcpy(b, base, len);                                                                                          \
        stmt;                                                                                                          \
        expect_fail(what, b, len, code, s1, s2);                                                                       \
    } while (0)
    PATCH("bad magic", EMBER_ERR_FORMAT, "magic", NULL, b[0] = 'X');
    PATCH("version 1", EMBER_ERR_UNSUPPORTED, "version 1", NULL, put_u32(b, 4, 1));
    PATCH("version 4", EMBER_ERR_UNSUPPORTED, "version 4", NULL, put_u32(b, 4, 4));
    PATCH("absurd n_tensors", EMBER_ERR_FORMAT, "tensors", NULL, put_u64(b, 8, (uint64_t)1 << 62));
    PATCH("absurd n_kv", EMBER_ERR_FORMAT, "metadata", NULL, put_u64(b, 16, UINT64_MAX));
    PATCH("one tensor too many", EMBER_ERR_FORMAT, NULL, NULL, put_u64(b, 8, 3));
    PATCH("absurd key length", EMBER_ERR_FORMAT, "key", NULL, put_u64(b, 24, (uint64_t)1 << 63));
    PATCH("absurd string length", EMBER_ERR_FORMAT, "string", NULL, put_u64(b, 74, UINT64_MAX - 3));
    PATCH("absurd array count", EMBER_ERR_FORMAT, "array count", NULL, put_u64(b, 108, (uint64_t)1 << 61));
    PATCH("absurd outer nested count", EMBER_ERR_FORMAT, "array count", NULL, put_u64(b, 152, (uint64_t)1 << 40));
    PATCH("absurd inner nested count", EMBER_ERR_FORMAT, "array count", NULL, put_u64(b, 164, (uint64_t)1 << 59));
    PATCH("unknown value type", EMBER_ERR_FORMAT, "unknown value type", "a.str", put_u32(b, 70, 13));
    PATCH("unknown array element type", EMBER_ERR_FORMAT, "unknown value type", NULL, put_u32(b, 104, 99));
    PATCH("non-power-of-two alignment", EMBER_ERR_FORMAT, "general.alignment", NULL, put_u32(b, 53, 48));
    PATCH("zero alignment", EMBER_ERR_FORMAT, "general.alignment", NULL, put_u32(b, 53, 0));
    PATCH("alignment not a u32", EMBER_ERR_FORMAT, "general.alignment", NULL, put_u32(b, 49, GGUF_TYPE_INT32));
    PATCH("duplicate key", EMBER_ERR_FORMAT, "a.str", "twice", memcpy(b + 95, "a.str", 5));
    PATCH("duplicate tensor", EMBER_ERR_FORMAT, "t0", "twice", memcpy(b + 262, "t0", 2));
    PATCH("empty tensor name", EMBER_ERR_FORMAT, "tensor name", NULL, put_u64(b, 212, 0));
    PATCH("zero dims", EMBER_ERR_FORMAT, "t0", "dimensions", put_u32(b, 222, 0));
    PATCH("five dims", EMBER_ERR_FORMAT, "t0", "dimensions", put_u32(b, 222, 5));
    PATCH("zero-length dim", EMBER_ERR_FORMAT, "t0", "dimension", put_u64(b, 226, 0));
    PATCH("overflowing dims", EMBER_ERR_FORMAT, "t0", "dimension", put_u64(b, 226, (uint64_t)1 << 62));
    PATCH("dims past the file", EMBER_ERR_FORMAT, "t0", "past the end", put_u64(b, 226, (uint64_t)1 << 40));
    PATCH("q8_0 row not whole blocks", EMBER_ERR_FORMAT, "t1", "q8_0", put_u64(b, 268, 33));
    PATCH("absurd offset", EMBER_ERR_FORMAT, "t1", "past the end", put_u64(b, 288, (uint64_t)1 << 63));
    PATCH("offset near 2^64", EMBER_ERR_FORMAT, "t1", "past the end", put_u64(b, 288, UINT64_MAX - 31));
    PATCH("offset one block late", EMBER_ERR_FORMAT, "t1", "past the end", put_u64(b, 288, 96));
    PATCH("misaligned offset", EMBER_ERR_FORMAT, "t1", "aligned", put_u64(b, 288, 65));
    PATCH("iq4_nl tensor", EMBER_ERR_UNSUPPORTED, "t1", "iq4_nl", put_u32(b, 284, 20));
    PATCH("tq2_0 tensor", EMBER_ERR_UNSUPPORTED, "t1", "tq2_0", put_u32(b, 284, 35));
    PATCH("q8_K tensor (an activation type)", EMBER_ERR_UNSUPPORTED, "t1", "q8_K", put_u32(b, 284, 15));
    PATCH("q4_K row not whole blocks", EMBER_ERR_FORMAT, "t1", "q4_K", put_u32(b, 284, 12));
    PATCH("unknown tensor type", EMBER_ERR_UNSUPPORTED, "t1", "unknown", put_u32(b, 284, 200));
#undef PATCH
    /* Version 2 has the same layout and is accepted. */
    memcpy(b, base, len);
    put_u32(b, 4, 2);
    CHECK_MSG(open_bytes("corrupt.gguf", b, len, &err) == EMBER_OK, "v2: %.700s", err.msg);

    /* Every header byte set to 0xFF, then to 0x00, then bit-flipped: an error or a valid file,
     * never a crash (the sanitizer build checks every read). */
    int unnamed = 0;
    for (size_t pos = 0; pos < 320; pos++)
        for (int variant = 0; variant < 3; variant++) {
            memcpy(b, base, len);
            b[pos] = variant == 0 ? 0xFF : variant == 1 ? 0x00 : (unsigned char)(b[pos] ^ 0x81);
            ember_status st = open_bytes("corrupt.gguf", b, len, &err);
            if (st != EMBER_OK && !strstr(err.msg, tmp_path("corrupt.gguf"))) unnamed++;
        }
    CHECK_MSG(unnamed == 0, "%d corrupted headers gave a message without the file name", unnamed);
    free(b);
    free(base);
}

/* Refused types written as real tensors (not patched), and other small files. */
static void test_small_bad_files(void) {
    ember_error err = {0};
    /* Real tensors of types ember does not read (an IQ type, a ternary type), beside a q4_K one it
     * does: the refusal names the file, the tensor and its type. */
    static const struct {
        uint32_t type;
        const char *name;
        size_t block_bytes;
        int64_t block;
    } refused[] = {{20, "iq4_nl", 18, 32}, {35, "tq2_0", 66, 256}, {16, "iq2_xxs", 66, 256}};
    ember_gguf *g = NULL;
    const char *path = NULL;
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ember_gguf_writer *w = ember_gguf_writer_new();
        unsigned char blocks[2 * 144] = {0};
        const int64_t ne_k[2] = {256, 2}, ne[2] = {refused[i].block, 2};
        ember_gguf_writer_add_tensor_raw(w, "blk.0.attn_k.weight", EMBER_TYPE_Q4_K, 2, ne_k, blocks, 2 * 144);
        ember_gguf_writer_add_tensor_raw(w, "blk.0.attn_q.weight", refused[i].type, 2, ne, blocks,
                                         2 * refused[i].block_bytes);
        path = tmp_path("refused-type.gguf");
        CHECK(ember_gguf_writer_write(w, path, &err) == EMBER_OK);
        ember_gguf_writer_free(w);
        CHECK(ember_gguf_open(path, &g, &err) == EMBER_ERR_UNSUPPORTED && g == NULL);
        CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "blk.0.attn_q.weight") && strstr(err.msg, refused[i].name),
                  "%.900s", err.msg);
    }
    ember_gguf_writer *w;

    /* A bool that is neither 0 nor 1: key "b" @24 (len), @32 "b", type @33, value @37. */
    w = ember_gguf_writer_new();
    ember_gguf_writer_set_bool(w, "b", true);
    path = tmp_path("bool.gguf");
    CHECK(ember_gguf_writer_write(w, path, &err) == EMBER_OK);
    ember_gguf_writer_free(w);
    size_t len;
    unsigned char *b = (unsigned char *)ember_read_file(path, &len);
    CHECK(b && len == 64 && b[37] == 1);
    if (b && len == 64) {
        b[37] = 2;
        expect_fail("bool 2", b, len, EMBER_ERR_FORMAT, "bool", NULL);
    }
    free(b);

    /* Arrays nested 64 deep: refused cleanly (the reader bounds its recursion). */
    const int32_t one = 1;
    ember_gguf_wvalue *v = ember_gguf_wvalue_array(GGUF_TYPE_INT32, &one, 1);
    for (int d = 1; d < 64; d++) {
        ember_gguf_wvalue *outer = ember_gguf_wvalue_array_of(GGUF_TYPE_ARRAY, &v, 1);
        ember_gguf_wvalue_free(v);
        v = outer;
    }
    w = ember_gguf_writer_new();
    ember_gguf_writer_set(w, "deep", v);
    ember_gguf_wvalue_free(v);
    path = tmp_path("deep.gguf");
    CHECK(ember_gguf_writer_write(w, path, &err) == EMBER_OK);
    ember_gguf_writer_free(w);
    CHECK(ember_gguf_open(path, &g, &err) == EMBER_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "nested"), "%.900s", err.msg);

    /* Not a file at all, and an empty file. */
    CHECK(ember_gguf_open(tmp_path("does-not-exist.gguf"), &g, &err) == EMBER_ERR_IO);
    CHECK(strstr(err.msg, "does-not-exist.gguf") != NULL);
    CHECK(ember_gguf_open(ember_test_tmpdir(), &g, &err) == EMBER_ERR_IO);
    expect_fail("empty file", (const unsigned char *)"", 0, EMBER_ERR_FORMAT, "too short", NULL);
}

int main(void) {
    test_gpt2_vocab_only();
    test_llama_spm_vocab_only();
    test_round_trip(3, 32);
    test_round_trip(2, 64);
    test_writer_errors();
    test_corruptions();
    test_small_bad_files();
    if (missing_fixture[0] && ember_test_failed == 0) {
        ember_test_finish();
        return ember_test_skip(missing_fixture);
    }
    return ember_test_finish();
}
