/* test_quants_llamacpp.c — ember's quantizers and dequantizers against llama.cpp's own: the same f32
 * weights quantized by `llama-quantize --pure` must be the bytes ember's quantizer writes, and
 * dequantize (llama.cpp's F32 conversion) to exactly what ember's dequantizer gives, for every
 * type; the parity-quant fixtures dequantize as llama.cpp does. Skipped, with a message, when
 * ../shared/bench/llama.cpp/llama-quantize (or $EMBER_LLAMA_QUANTIZE) is absent. */
#include "gguf.h"
#include "quants.h"
#include "tiny_model.h"
#include "test_support.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char quantize_bin[1200];

static bool find_llama_quantize(void) {
    const char *env = getenv("EMBER_LLAMA_QUANTIZE");
    if (env && *env) snprintf(quantize_bin, sizeof quantize_bin, "%s", env);
    else snprintf(quantize_bin, sizeof quantize_bin, "%s/../bench/llama.cpp/llama-quantize", ember_fixtures_dir());
    return access(quantize_bin, X_OK) == 0;
}

/* Runs llama-quantize with args (NULL-terminated), its output into a log beside the files. */
static bool run_llama_quantize(const char *const args[]) {
    char log[1200];
    snprintf(log, sizeof log, "%s/llama-quantize.log", ember_test_tmpdir());
    const char *argv[16] = {quantize_bin};
    int n = 1;
    for (; args[n - 1] && n < 15; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(quantize_bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return false;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) fprintf(stderr, "llama-quantize failed (status %d); see %s\n", status, log);
    return ok;
}

typedef struct {
    const char *llama_name; /* llama-quantize's type argument */
    ember_type type;
    int64_t block, bytes;
    void (*quantize)(const float *, void *, int64_t);
    void (*dequantize)(const void *, float *, int64_t);
} qtype;

static const qtype TYPES[] = {
    {"Q4_0", EMBER_TYPE_Q4_0, 32, 18, ember_quantize_row_q4_0, ember_dequantize_row_q4_0},
    {"Q4_1", EMBER_TYPE_Q4_1, 32, 20, ember_quantize_row_q4_1, ember_dequantize_row_q4_1},
    {"Q5_0", EMBER_TYPE_Q5_0, 32, 22, ember_quantize_row_q5_0, ember_dequantize_row_q5_0},
    {"Q5_1", EMBER_TYPE_Q5_1, 32, 24, ember_quantize_row_q5_1, ember_dequantize_row_q5_1},
    {"Q2_K", EMBER_TYPE_Q2_K, 256, 84, ember_quantize_row_q2_k, ember_dequantize_row_q2_k},
    {"Q3_K", EMBER_TYPE_Q3_K, 256, 110, ember_quantize_row_q3_k, ember_dequantize_row_q3_k},
    {"Q4_K", EMBER_TYPE_Q4_K, 256, 144, ember_quantize_row_q4_k, ember_dequantize_row_q4_k},
    {"Q5_K", EMBER_TYPE_Q5_K, 256, 176, ember_quantize_row_q5_k, ember_dequantize_row_q5_k},
    {"Q6_K", EMBER_TYPE_Q6_K, 256, 210, ember_quantize_row_q6_k, ember_dequantize_row_q6_k},
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

static const char *tmp_path(const char *name) {
    static char path[4][1100];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/quants-%s", ember_test_tmpdir(), name);
    return p;
}

/* Rows that reach the corners of the quantizers: zeros, constants, values too small for an f16
 * scale, subnormal f16 scales, one outlier, one sign only, exact ties. Row r of 256 values. */
static void edge_row(int64_t r, float *x, int64_t n) {
    uint64_t s = 0x243F6A8885A308D3ull + (uint64_t)r * 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float u = (float)((double)(s >> 11) * 0x1p-53) - 0.5f; /* in [-0.5, 0.5) */
        switch (r % 12) {
        case 0: x[i] = 0.0f; break;
        case 1: x[i] = 0.75f; break;                            /* one constant */
        case 2: x[i] = u * 1e-20f; break;                       /* far below any f16 scale */
        case 3: x[i] = u * 1e-6f; break;                        /* subnormal f16 scales */
        case 4: x[i] = i == 77 ? 40.0f : u * 0.05f; break;      /* one outlier */
        case 5: x[i] = fabsf(u) + 0.01f; break;                 /* all positive */
        case 6: x[i] = -fabsf(u) * 3.0f; break;                 /* all negative */
        case 7: x[i] = i % 2 ? 0.0f : u; break;                 /* half zeros */
        case 8: x[i] = (float)((int)(u * 16.0f)) / 8.0f; break; /* few distinct values, ties */
        case 9: x[i] = i % 32 == 5 ? -1.0f : 0.0f; break;       /* one value per block */
        default: x[i] = u * 0.2f; break;
        }
    }
}

/* The f32 source: a tiny llama whose rows hold whole 256-value blocks, with blk.0.attn_q replaced by
 * the edge rows above (llama-quantize only reads names and shapes). */
static bool write_source(const char *path) {
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.dtype = EMBER_TYPE_F32;
    p.n_layer = 1;
    p.n_embd = 256;
    p.n_head = 4;
    p.head_dim = 64;
    p.n_ff = 768;
    p.n_vocab = 512;
    ember_error err = {0};
    ember_gguf_writer *w = ember_gguf_writer_new();
    bool ok = w && ember_tiny_model_build(&p, w, &err) == EMBER_OK;
    if (ok) {
        const int64_t ne[2] = {256, 256};
        float *x = malloc(sizeof(float) * 256 * 256);
        for (int64_t r = 0; r < 256; r++) edge_row(r, x + r * 256, 256);
        ok = ember_gguf_writer_remove_tensor(w, "blk.0.attn_q.weight") &&
             ember_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", EMBER_TYPE_F32, 2, ne, x) == EMBER_OK &&
             ember_gguf_writer_write(w, path, &err) == EMBER_OK;
        free(x);
    }
    CHECK_MSG(ok, "writing the f32 source: %.900s", err.msg);
    ember_gguf_writer_free(w);
    return ok;
}

/* llama-quantize's output OUT holds every 2-D tensor of SRC in type T, byte for byte what ember's
 * quantizer makes of the same f32 values. */
static void test_type_bytes(const qtype *T, const ember_gguf *src, const char *out) {
    ember_gguf *g = NULL;
    ember_error err = {0};
    if (!CHECKF(ember_gguf_open(out, &g, &err) == EMBER_OK, "%.900s", err.msg)) return;
    int tensors = 0, bad_tensors = 0;
    for (uint64_t t = 0; t < src->n_tensors; t++) {
        const gguf_tensor *s = &src->tensors[t];
        if (s->n_dims != 2) continue;
        const gguf_tensor *q = ember_gguf_find_tensor(g, s->name);
        if (!CHECKF(q && q->type == T->type, "%s: %s is %s in llama-quantize's output", T->llama_name, s->name,
                    q ? ember_type_name(q->type) : "missing"))
            continue;
        int64_t n = (int64_t)(s->size / sizeof(float));
        float *x = malloc(s->size);
        memcpy(x, s->data, s->size);
        uint8_t *mine = malloc(q->size);
        if (!CHECKF((size_t)(n / T->block * T->bytes) == q->size, "%s %s: %zu bytes", T->llama_name, s->name, q->size))
            goto next;
        T->quantize(x, mine, n);
        size_t first = 0, bad = 0;
        for (size_t i = 0; i < q->size; i++)
            if (mine[i] != ((const uint8_t *)q->data)[i]) {
                if (!bad) first = i;
                bad++;
            }
        tensors++;
        if (bad) bad_tensors++;
        CHECK_MSG(bad == 0, "%s %s: %zu of %zu bytes differ from llama-quantize's, first in block %zu (byte %zu)",
                  T->llama_name, s->name, bad, q->size, first / (size_t)T->bytes, first % (size_t)T->bytes);
    next:
        free(x);
        free(mine);
    }
    printf("  %-5s %d tensors: %d differ from llama-quantize's bytes\n", T->llama_name, tensors, bad_tensors);
    ember_gguf_close(g);
}

/* For one type: llama-quantize --pure SRC -> OUT, then llama-quantize's F32 conversion OUT -> BACK.
 * Every 2-D tensor of BACK must equal ember's quantize -> dequantize of SRC, bit for bit. */
static void test_type_round_trip(const qtype *T, const ember_gguf *src) {
    char out[1200], back[1300];
    snprintf(out, sizeof out, "%s", tmp_path(T->llama_name));
    snprintf(back, sizeof back, "%s.f32", out);
    const char *q_args[] = {"--pure", src->path, out, T->llama_name, NULL};
    const char *f_args[] = {"--allow-requantize", out, back, "F32", NULL};
    if (!CHECKF(run_llama_quantize(q_args) && run_llama_quantize(f_args), "%s: llama-quantize", T->llama_name)) return;
    test_type_bytes(T, src, out);
    ember_gguf *g = NULL;
    ember_error err = {0};
    if (!CHECKF(ember_gguf_open(back, &g, &err) == EMBER_OK, "%.900s", err.msg)) return;
    int tensors = 0, bad_tensors = 0;
    for (uint64_t t = 0; t < src->n_tensors; t++) {
        const gguf_tensor *s = &src->tensors[t];
        if (s->n_dims != 2) continue;
        const gguf_tensor *b = ember_gguf_find_tensor(g, s->name);
        if (!CHECKF(b && b->type == EMBER_TYPE_F32 && b->size == s->size, "%s: %s missing from the F32 copy",
                    T->llama_name, s->name))
            continue;
        int64_t n = (int64_t)(s->size / sizeof(float));
        float *x = malloc(s->size), *y = malloc(s->size), *want = malloc(s->size);
        void *q = malloc((size_t)(n / T->block * T->bytes));
        memcpy(x, s->data, s->size);
        memcpy(want, b->data, b->size);
        T->quantize(x, q, n);
        T->dequantize(q, y, n);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&y[i], &want[i], sizeof(float)) != 0) {
                if (first < 0) first = i;
                bad++;
            }
        tensors++;
        if (bad) bad_tensors++;
        CHECK_MSG(bad == 0,
                  "%s %s: %lld of %lld values differ from llama.cpp's, first at row %lld col %lld (%.9g vs %.9g)",
                  T->llama_name, s->name, (long long)bad, (long long)n, (long long)(first / s->ne[0]),
                  (long long)(first % s->ne[0]), first >= 0 ? y[first] : 0.0, first >= 0 ? want[first] : 0.0);
        free(x);
        free(y);
        free(want);
        free(q);
    }
    printf("  %-5s %d tensors quantized by llama-quantize, %d differ from ember's quantize -> dequantize\n",
           T->llama_name, tensors, bad_tensors);
    CHECK(tensors >= 7);
    ember_gguf_close(g);
}

/* The parity-quant fixtures (files llama-quantize made): every quantized tensor, dequantized by
 * ember (its traits' to_float), equals llama.cpp's own F32 conversion of the file bit for bit. */
static void test_fixture_dequantization(void) {
    static const char *cases[] = {"llama-small-q4_k_m", "llama-small-q6_k", "qwen3-small-q4_0", "qwen3-small-q5_k_m"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char rel[256], model[1200], twin[1300];
        snprintf(rel, sizeof rel, "parity-quant/%s/model.gguf", cases[c]);
        if (!ember_fixture_path(rel, model, sizeof model)) {
            printf("  %s: fixture missing (%s), not checked\n", cases[c], model);
            continue;
        }
        snprintf(twin, sizeof twin, "%s", tmp_path(cases[c]));
        const char *args[] = {"--allow-requantize", model, twin, "F32", NULL};
        if (!CHECKF(run_llama_quantize(args), "%s: llama-quantize F32", cases[c])) continue;
        ember_gguf *q = NULL, *f = NULL;
        ember_error err = {0};
        if (CHECKF(ember_gguf_open(model, &q, &err) == EMBER_OK, "%.900s", err.msg) &&
            CHECKF(ember_gguf_open(twin, &f, &err) == EMBER_OK, "%.900s", err.msg)) {
            int quantized = 0, bad_tensors = 0;
            for (uint64_t t = 0; t < q->n_tensors; t++) {
                const gguf_tensor *a = &q->tensors[t];
                const gguf_tensor *b = ember_gguf_find_tensor(f, a->name);
                if (!CHECKF(b && b->type == EMBER_TYPE_F32, "%s: %s missing from the F32 twin", cases[c], a->name))
                    continue;
                if (a->type == EMBER_TYPE_F32) continue;
                int64_t n = (int64_t)(b->size / sizeof(float));
                float *y = malloc(b->size);
                ember_type_traits_get(a->type)->to_float(a->data, y, n);
                int64_t bad = 0;
                for (int64_t i = 0; i < n; i++) bad += memcmp(&y[i], (const float *)b->data + i, sizeof(float)) != 0;
                quantized++;
                if (bad) bad_tensors++;
                CHECK_MSG(bad == 0, "%s %s (%s): %lld of %lld values differ from llama.cpp's dequantization", cases[c],
                          a->name, ember_type_name(a->type), (long long)bad, (long long)n);
                free(y);
            }
            printf("  %s: %d quantized tensors, %d differ from llama.cpp's F32 conversion\n", cases[c], quantized,
                   bad_tensors);
            CHECK(quantized >= 29);
        }
        ember_gguf_close(q);
        ember_gguf_close(f);
    }
}

int main(void) {
    if (!find_llama_quantize()) {
        char why[1400];
        snprintf(why, sizeof why, "llama-quantize not found at %s (set EMBER_LLAMA_QUANTIZE)", quantize_bin);
        return ember_test_skip(why);
    }
    const char *src_path = tmp_path("src-f32.gguf");
    if (!write_source(src_path)) return ember_test_finish();
    ember_gguf *src = NULL;
    ember_error err = {0};
    if (!CHECKF(ember_gguf_open(src_path, &src, &err) == EMBER_OK, "%.900s", err.msg)) return ember_test_finish();
    for (size_t t = 0; t < N_TYPES; t++) test_type_round_trip(&TYPES[t], src);
    ember_gguf_close(src);
    test_fixture_dequantization();
    return ember_test_finish();
}
